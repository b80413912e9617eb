"""How the model computes: the fast paths behind model.py's one seam, chosen by the model's options.

model.py says what BERT computes; this package supplies, through things chosen once,

* a layout (`layout_for`, called once per forward by BertModel): the batch as padded (B, T)
  rows with a key mask (`Padded`), or only its real tokens packed (N, H) row after row
  (`Packed`); the layout also runs attention (SDPA, the written-out formula, or per-sequence
  attention on the packed rows: `attention.KERNELS`);
* `Linear` (an nn.Linear whose fp32 CPU matmuls go through oneDNN where that pays),
  `project_qkv` (query, key and value as one GEMM) and `linear_act` (the exact GELU as the
  GEMM's post-op in inference);
* `Dropout` (an nn.Dropout drawing CPU masks from half as many random draws);
* `add_norm` (a post-LN block's residual and LayerNorm; one op of bertkit's in a graph recorded with
  its AVX2 ops).
* `packed.py`: fp32 inference Linears from weights packed once for MKL or oneDNN (`packed_weights`,
  on by default where it measured faster: oneDNN on the AVX2 class); `attention_bucket`, packed
  attention by groups of similar length, is a lever under measurement, off by default.
* `graph_gemm.py`: GEMMs as C++ ops of bertkit's, which a graph compiled ahead
  (inference/compiled.py) records: MKL's packed GEMM for its fp32 Linears where the options take
  MKL for few rows, an AMX int8 GEMM for its per-token int8 Linears on CPUs with AMX, and, in
  the fp32 and int8 graphs on AVX-512 CPUs, an attention kernel for inputs of up to 64 tokens.

Which of them run is a `KernelOptions` value the model holds from its construction
(`BertModel(config, kernels=...)`, `from_pretrained(..., kernels=...)`; the default per CPU class:
options.py; what each was measured to buy: docs/speed.md). Whatever a model holds, while it is
traced, exported or compiled it runs the plain path: F.linear and SDPA on the padded batch with
its mask, so one trace serves every padding pattern.
"""

from .attention import KERNELS as ATTENTION_KERNELS, attention, packed_attention
from .dropout import Dropout, drop_mask, dropout
from .layout import Packed, Padded, Unpadded, layout_for, padding_mask, unpadding_for
from .linear import Linear, _onednn_matmul, linear, linear_act, linear_gelu, onednn_available, project_qkv
from .norm import add_norm
from .options import PROCESS_DEFAULT, HoldsKernelOptions, KernelOptions, default_options, exporting, speed_options

__all__ = ["KernelOptions", "HoldsKernelOptions", "PROCESS_DEFAULT",
           "default_options", "speed_options", "exporting", "linear", "linear_gelu", "linear_act", "Linear",
           "project_qkv", "add_norm", "onednn_available", "drop_mask", "dropout", "Dropout", "attention", "packed_attention",
           "ATTENTION_KERNELS", "Padded", "Packed", "Unpadded", "padding_mask", "layout_for", "unpadding_for",
           "_onednn_matmul"]  # the last for benchmarks/bench_common.py
