"""How the model computes: the fast paths behind model.py's one seam, and the speed options.

model.py says what BERT computes; this module supplies, through three things chosen once,

* a `Layout` (`layout_for`, called once per forward by BertModel): the batch as padded (B, T)
  rows with a key mask (`Padded`), or only its real tokens packed (N, H) row after row
  (`Packed`); the layout also runs attention (`Layout.attention`: SDPA, the written-out
  formula, or per-sequence attention on the packed rows);
* `Linear` (an nn.Linear whose fp32 CPU matmuls go through oneDNN where that pays),
  `project_qkv` (query, key and value as one GEMM) and `linear_act` (the exact GELU as the
  GEMM's post-op in inference);
* `Dropout` (an nn.Dropout drawing CPU masks from half as many random numbers).

Which of them run is set by the speed options (`options.py`; what each was measured to buy:
docs/speed.md). Whatever they say, a traced, exported or compiled model runs the plain path:
F.linear and SDPA on the padded batch with its mask, so one trace serves every padding pattern.
"""

from .attention import attention, packed_attention
from .dropout import Dropout, drop_mask, dropout, keep_mask
from .layout import Packed, Padded, Unpadded, layout_for, padding_mask, unpadding_for
from .linear import Linear, _onednn_matmul, linear, linear_act, linear_gelu, onednn_available, project_qkv
from .options import REMOVED_OPTIONS, SpeedOptions, exporting, options, speed_options

__all__ = ["SpeedOptions", "REMOVED_OPTIONS", "options", "speed_options", "exporting", "linear", "linear_gelu",
           "linear_act", "Linear", "project_qkv", "onednn_available", "keep_mask", "drop_mask", "dropout", "Dropout", "attention",
           "packed_attention", "Padded", "Packed", "Unpadded", "padding_mask", "layout_for", "unpadding_for",
           "_onednn_matmul"]  # the last for benchmarks/bench_common.py
