"""The encoder's layers for inference as one flat loop over their packed weights (issue 39).

A lone request to a small model spends a fifth of its time outside the kernels: every layer is a
dozen module calls, each Linear asks again whether its pack applies and re-keys its pack, and on
2 cores that Python runs slower still between GEMMs that have just evicted its caches. The
engine's own model does not change between requests, so `freeze_encoders` swaps its encoder for a
`FrozenEncoder`: the same module (same layers, parameters and names), whose forward in inference
runs the same kernels on the same operands in the same order — the fused query/key/value GEMM,
the layout's attention, the output GEMM, the residual and LayerNorm, the GEMM with its GELU post-op,
the last GEMM, residual and LayerNorm — from a flat list made once and remade when any weight or
module changes: fp32 / bf16 from the oneDNN packs (fp32 calls of a few rows from MKL's, as the
module path) or bertkit's AVX2 op's (packed_weights "bertkit"), int8 through the int8 modules' own
forwards.
Bitwise the same numbers as the module path (tests/kernels/test_frozen_encoder.py); with
gradients, in training mode, when hidden states or attention maps are asked for, or wherever the
packs do not apply (a GPU, export, an unusual or mixed layer), the module path runs.
"""

from __future__ import annotations

import operator
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import ATTENTION_KERNELS, Linear, Padded, packed
from ..kernels.int8 import Int8Linear, Int8QKV
from ..kernels.options import exporting
from ..kernels.packed import packed_dtype, packed_weights, packing_mode
from ..model import BertEncoder, BertIntermediate, BertLayer

# Per FrozenEncoder, held beside it (as kernels/packed.py holds its packs): its flat loop per dtype
# and the dicts its key reads; never in a state dict, and a deep copy meets no oneDNN pack.
_STATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_data_ptr = torch.Tensor.data_ptr
_version = operator.attrgetter("_version")


def _kind(layer: nn.Module) -> str | None:
    """"fp32": a post-LN BERT layer of bertkit Linear modules, nn.LayerNorm and the exact GELU;
    "int8": the same after quantize_int8 (Int8QKV, Int8Linear); None: a layer the flat loop does not
    compute (an adapter, another activation, a mix), which keeps the module path."""
    if type(layer) is not BertLayer:
        return None
    sa, ao, im, out = layer.attention.self, layer.attention.output, layer.intermediate, layer.output
    if not (im.act is F.gelu and type(ao.LayerNorm) is nn.LayerNorm and type(out.LayerNorm) is nn.LayerNorm):
        return None
    if all(type(m) is Linear for m in (sa.query, sa.key, sa.value, ao.dense, im.dense, out.dense)):
        return "fp32"
    if type(sa.query) is Int8QKV and all(type(m) is Int8Linear for m in (ao.dense, im.dense, out.dense)):
        return "int8"
    return None


def _packed_gemm(pack: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, gelu: str | None = None):
    """x -> x @ W.T + b from a oneDNN pack, as kernels/packed.py's packed_linear computes it (`gelu`:
    "post-op", the exact GELU fused into the GEMM, or "after", F.gelu on its output)."""
    linear = torch.ops.mkldnn._linear_pointwise
    if dtype == torch.float32:  # the fp32 loop's inputs are fp32 throughout: no cast to dispatch per GEMM
        if gelu == "post-op":
            return lambda x: linear(x, pack, bias, "gelu", [], "none")
        if gelu == "after":
            return lambda x: F.gelu(linear(x, pack, bias, "none", [], ""))
        return lambda x: linear(x, pack, bias, "none", [], "")
    if gelu == "post-op":
        return lambda x: linear(x.to(dtype), pack, bias, "gelu", [], "none")
    if gelu == "after":
        return lambda x: F.gelu(linear(x.to(dtype), pack, bias, "none", [], ""))
    return lambda x: linear(x.to(dtype), pack, bias, "none", [], "")


def _bertkit_gemm(pack: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: bool = False):
    """x -> x @ W.T + b through bertkit's AVX2 op from W's pack (packed_weights "bertkit":
    kernels/packed.py), the exact GELU applied by the op with `gelu`."""
    gemm, n = torch.ops.bertkit.bertkit_fma_linear_packed, weight.shape[0]  # graph_gemm.eager_linear
    return lambda x: gemm(x, pack, n, bias, gelu)


def _few_rows_gemm(holder: nn.Module, weights: tuple, biases: tuple, gelu: bool, rows: int, otherwise):
    """`otherwise` (the oneDNN pack's GEMM), but calls of at most `rows` rows through MKL's pack, as
    kernels/packed.py's packed_linear does (KernelOptions.mkl_rows, scaled to the layer's width);
    the MKL pack is made on the first such call and kept by `holder` beside the oneDNN one."""
    mkl_linear = torch.ops.mkl._mkl_linear
    made = []  # the pack, once made: these steps are remade whenever a weight changes

    def gemm(x):
        m = x.numel() // x.shape[-1]
        if m > rows:
            return otherwise(x)
        if not made:
            made.append(packed_weights(holder, "mkl", weights, biases))
        pack, weight, bias = made[0]
        y = mkl_linear(x if x.is_contiguous() else x.contiguous(), pack, weight, bias, m)
        return torch.ops.aten.gelu_(y) if gelu else y  # in place: y is this call's own
    return gemm


def _fp32_step(layer: BertLayer, dtype: torch.dtype) -> tuple:
    sa, ao, im, out = layer.attention.self, layer.attention.output, layer.intermediate.dense, layer.output
    options = sa.kernels
    qkv = (sa.query, sa.key, sa.value)
    mode = packing_mode(options)
    pack, weight, bias = packed_weights(sa.query, mode, tuple(m.weight for m in qkv), tuple(m.bias for m in qkv), dtype)
    gemms = [packed_weights(m, mode, (m.weight,), (m.bias,), dtype) for m in (ao.dense, im, out.dense)]
    if mode == "bertkit":
        (o, o_w, o_b), (i, i_w, i_b), (f, f_w, f_b) = gemms
        fused, output, intermediate, last = (_bertkit_gemm(pack, weight, bias), _bertkit_gemm(o, o_w, o_b),
                                             _bertkit_gemm(i, i_w, i_b, gelu=True), _bertkit_gemm(f, f_w, f_b))
        return lambda x: fused(x).chunk(3, -1), output, intermediate, last
    (o, _, o_b), (i, _, i_b), (f, _, f_b) = gemms
    steps = [_packed_gemm(pack, bias, dtype), _packed_gemm(o, o_b, dtype),
             _packed_gemm(i, i_b, dtype, "post-op" if options.fused_gelu else "after"), _packed_gemm(f, f_b, dtype)]
    if dtype == torch.float32 and options.mkl_rows:
        holders = ((sa.query, qkv), (ao.dense, (ao.dense,)), (im, (im,)), (out.dense, (out.dense,)))
        rows = options.mkl_row_limit(sa.query.in_features)  # the layer's width: each GEMM's smaller side
        steps = [_few_rows_gemm(holder, tuple(m.weight for m in ms), tuple(m.bias for m in ms), holder is im,
                                rows, step) for (holder, ms), step in zip(holders, steps)]
    fused, output, intermediate, last = steps
    return lambda x: fused(x).chunk(3, -1), output, intermediate, last


def _int8_step(layer: BertLayer) -> tuple:
    """The Int8 modules' own GEMMs (`Int8Linear.gemm`), called directly: the flat loop's inputs are
    fp32, outside autograd and contiguous (a layer's input is a LayerNorm's output; the attention's
    is made contiguous here if a layout ever hands back a strided view)."""
    qkv, up, down = layer.attention.self.query, layer.intermediate.dense.gemm, layer.output.dense.gemm
    projection, sizes, output = qkv.projection.gemm, qkv.sizes, layer.attention.output.dense.gemm
    # The GELU's output feeds the last projection only: its outlier split need not restore it.
    return (lambda x: projection(x).split(sizes, -1), lambda x: output(x if x.is_contiguous() else x.contiguous()),
            lambda x: up(x, gelu=True), lambda x: down(x, overwrite_input=True))


class FrozenEncoder(BertEncoder):
    """A BertEncoder (the same `layer` list) whose inference forward is the flat loop."""

    def __init__(self, encoder: BertEncoder):
        nn.Module.__init__(self)
        self.layer = encoder.layer
        self.gradient_checkpointing = encoder.gradient_checkpointing
        self.training = encoder.training

    def _key(self) -> tuple:
        """What the flat loop was made from: the options the layers hold, the module in every slot of
        the layers (a module swapped in, e.g. by quantize_int8, changes it), each weight's identity, storage and version
        (an in-place update bumps it) and the process's optimizer steps (kernels/packed.py). Read
        from the modules' own dicts, in C where it can be: it runs before every forward."""
        state = _STATE.setdefault(self, {})
        if "dicts" not in state:
            modules = [m for layer in self.layer for m in layer.modules()]
            state["dicts"] = ([m._modules for m in modules], [m._parameters for m in modules],
                              [m.__dict__ for m in modules if type(m) is BertIntermediate])
        module_dicts, parameter_dicts, intermediates = state["dicts"]
        modules = [m for d in module_dicts for m in d.values()]
        params = [p for d in parameter_dicts for p in d.values()]
        # The options too: the steps bake in the ones held when they were made (mkl_rows, fused_gelu).
        return (packed._optimizer_steps, self.layer[0].attention.self.kernels, tuple(map(id, modules)),
                tuple(d.get("act") for d in intermediates),
                tuple(map(id, params)), tuple(map(_data_ptr, params)), tuple(map(_version, params)))

    def _steps(self, mode) -> list[tuple] | None:
        """Per layer: heads, the query/key/value, output, intermediate (with its GELU) and last
        projections as functions, and the two LayerNorms' (shape, weight, bias, eps); `mode` the
        dtype of the oneDNN packs the Linear modules hold (kernels/packed.py) or "int8" (the int8
        modules' own forwards). Remade when the key changed; None when the layers are not all of
        the kind `mode` computes."""
        key = self._key()
        state = _STATE[self]
        cached = state.get(mode)
        if cached is not None and cached[0] == key:
            return cached[1]
        state.clear()  # the modules may have changed: read the tree again (and no stale plan stays)
        key = self._key()
        steps = None
        if all(_kind(layer) == ("int8" if mode == "int8" else "fp32") for layer in self.layer):
            steps = []
            for layer in self.layer:
                projections = _int8_step(layer) if mode == "int8" else _fp32_step(layer, mode)
                norms = [(n.normalized_shape, n.weight, n.bias, n.eps)
                         for n in (layer.attention.output.LayerNorm, layer.output.LayerNorm)]
                steps.append((layer.attention.self.num_heads, *projections, *norms))
        state[mode] = (key, steps)
        return steps

    def _flat_mode(self, x: torch.Tensor, output_hidden_states: bool, output_attentions: bool):
        """What the flat loop computes this call with (a pack dtype, or "int8"), or None: the module path."""
        if self.training or output_hidden_states or output_attentions or torch.is_grad_enabled():
            return None
        options = self.layer[0].attention.self.kernels
        if options.attention not in ATTENTION_KERNELS:
            return None
        if type(self.layer[0].attention.self.query) is Int8QKV:
            cpu_fp32 = x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
            return "int8" if cpu_fp32 and not exporting() else None
        if options.packed_weights not in ("onednn", "bertkit") or not options.fused_qkv:
            return None
        return packed_dtype(x, options)  # ("bertkit" where its op is not built: the oneDNN packs, packing_mode)

    def forward(self, x, layout: Padded, output_hidden_states=False, output_attentions=False):
        mode = self._flat_mode(x, output_hidden_states, output_attentions)
        steps = None if mode is None else self._steps(mode)
        if steps is None:
            return super().forward(x, layout, output_hidden_states, output_attentions)
        x = layout.enter(x)  # (N, H) or (B, T, H), as the layers see it
        for heads, qkv, output, intermediate, last, norm1, norm2 in steps:
            q, k, v = qkv(x)
            x = F.layer_norm(output(layout.attention(q, k, v, heads, 0.0)) + x, *norm1)
            x = F.layer_norm(last(intermediate(x)) + x, *norm2)
        return layout.leave(x), None, None


def freeze_encoders(model: nn.Module) -> int:
    """Swap every BertEncoder of `model` whose layers are all standard for a FrozenEncoder; the
    number swapped (all fp32 or all int8 layers). Only for a model nobody else holds (the engine's own): its state dict, names
    and training behaviour stay as they were."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            kinds = {_kind(layer) for layer in child.layer} if type(child) is BertEncoder else {None}
            if len(kinds) == 1 and None not in kinds:  # every layer fp32, or every layer int8
                setattr(parent, name, FrozenEncoder(child))
                swapped += 1
    return swapped


__all__ = ["FrozenEncoder", "freeze_encoders"]
