"""The encoder's layers for inference as one flat loop over their packed weights (issue 39).

A lone request to a small model spends a fifth of its time outside the kernels: every layer is a
dozen module calls, each Linear asks again whether its pack applies and re-keys its pack, and on
2 cores that Python runs slower still between GEMMs that have just evicted its caches. The
engine's own model does not change between requests, so `freeze_encoders` swaps its encoder for a
`FrozenEncoder`: the same module (same layers, parameters and names), whose forward in inference
runs the same kernels on the same operands in the same order — the fused query/key/value GEMM,
the layout's attention, the output GEMM, the residual and LayerNorm, the GEMM with its GELU post-op,
the last GEMM, residual and LayerNorm — from a flat list made once and remade when any weight
changes. Bitwise the same numbers as the module path (tests/kernels/test_frozen_encoder.py); with
gradients, in training mode, when hidden states or attention maps are asked for, or wherever the
packs do not apply (a GPU, export, int8 layers, an unusual layer), the module path runs.
"""

from __future__ import annotations

import operator
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import ATTENTION_KERNELS, Linear, Padded, packed
from ..kernels.packed import packed_dtype, packed_weights
from ..model import BertEncoder, BertIntermediate, BertLayer

# Per FrozenEncoder, held beside it (as kernels/packed.py holds its packs): its flat loop per dtype
# and the dicts its key reads; never in a state dict, and a deep copy meets no oneDNN pack.
_STATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_data_ptr = torch.Tensor.data_ptr
_version = operator.attrgetter("_version")


def _standard(layer: nn.Module) -> bool:
    """A post-LN BERT layer of bertkit Linear modules, nn.LayerNorm and the exact GELU: the layer the
    flat loop computes (adapters, int8 projections or another activation keep the module path)."""
    if type(layer) is not BertLayer:
        return False
    sa, ao, im, out = layer.attention.self, layer.attention.output, layer.intermediate, layer.output
    linears = (sa.query, sa.key, sa.value, ao.dense, im.dense, out.dense)
    return (all(type(m) is Linear for m in linears) and im.act is F.gelu
            and type(ao.LayerNorm) is nn.LayerNorm and type(out.LayerNorm) is nn.LayerNorm)


class FrozenEncoder(BertEncoder):
    """A BertEncoder (the same `layer` list) whose inference forward is the flat loop."""

    def __init__(self, encoder: BertEncoder):
        nn.Module.__init__(self)
        self.layer = encoder.layer
        self.gradient_checkpointing = encoder.gradient_checkpointing
        self.training = encoder.training

    def _key(self) -> tuple:
        """What the flat loop was made from: the module in every slot of the layers (a module
        swapped in, e.g. by quantize_int8, changes it), each weight's identity, storage and version
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
        return (packed._optimizer_steps, tuple(map(id, modules)), tuple(d.get("act") for d in intermediates),
                tuple(map(id, params)), tuple(map(_data_ptr, params)), tuple(map(_version, params)))

    def _steps(self, dtype: torch.dtype) -> list[tuple] | None:
        """Per layer: heads, the (pack, bias) of each GEMM and the LayerNorms' (shape, weight, bias,
        eps), from the packs the Linear modules hold (kernels/packed.py), remade when the key
        changed; None when a layer is not one the loop computes."""
        key = self._key()
        state = _STATE[self]
        cached = state.get(dtype)
        if cached is not None and cached[0] == key:
            return cached[1]
        state.clear()  # the modules may have changed: read the tree again (and no stale plan stays)
        key = self._key()
        steps = None
        if all(_standard(layer) for layer in self.layer):
            options = self.layer[0].attention.self.kernels
            steps = []
            for layer in self.layer:
                sa, ao, im, out = layer.attention.self, layer.attention.output, layer.intermediate.dense, layer.output
                qkv = (sa.query, sa.key, sa.value)
                gemms = [packed_weights(sa.query, options.packed_weights, tuple(m.weight for m in qkv),
                                        tuple(m.bias for m in qkv), dtype)]
                gemms += [packed_weights(m, options.packed_weights, (m.weight,), (m.bias,), dtype)
                          for m in (ao.dense, im, out.dense)]
                norms = [(n.normalized_shape, n.weight, n.bias, n.eps) for n in (ao.LayerNorm, out.LayerNorm)]
                steps.append((sa.num_heads, [(pack, bias) for pack, _, bias in gemms], norms))
        state[dtype] = (key, steps)
        return steps

    def _flat_dtype(self, x: torch.Tensor, output_hidden_states: bool, output_attentions: bool):
        """The dtype the flat loop computes this call in, or None: the module path."""
        if self.training or output_hidden_states or output_attentions or torch.is_grad_enabled():
            return None
        options = self.layer[0].attention.self.kernels
        if options.packed_weights != "onednn" or not options.fused_qkv or options.attention not in ATTENTION_KERNELS:
            return None
        return packed_dtype(x, options)

    def forward(self, x, layout: Padded, output_hidden_states=False, output_attentions=False):
        dtype = self._flat_dtype(x, output_hidden_states, output_attentions)
        steps = None if dtype is None else self._steps(dtype)
        if steps is None:
            return super().forward(x, layout, output_hidden_states, output_attentions)
        fused_gelu = self.layer[0].attention.self.kernels.fused_gelu
        gelu, algorithm = ("gelu", "none") if fused_gelu else ("none", "")
        linear = torch.ops.mkldnn._linear_pointwise
        x = layout.enter(x)  # (N, H) or (B, T, H), as the layers see it
        for heads, ((qkv, qkv_b), (o, o_b), (i, i_b), (f, f_b)), (norm1, norm2) in steps:
            q, k, v = linear(x.to(dtype), qkv, qkv_b, "none", [], "").chunk(3, -1)
            context = layout.attention(q, k, v, heads, 0.0)
            x = F.layer_norm(linear(context.to(dtype), o, o_b, "none", [], "") + x, *norm1)
            h = linear(x.to(dtype), i, i_b, gelu, [], algorithm)
            h = h if fused_gelu else F.gelu(h)
            x = F.layer_norm(linear(h.to(dtype), f, f_b, "none", [], "") + x, *norm2)
        return layout.leave(x), None, None


def freeze_encoders(model: nn.Module) -> int:
    """Swap every BertEncoder of `model` whose layers are all standard for a FrozenEncoder; the
    number swapped. Only for a model nobody else holds (the engine's own): its state dict, names
    and training behaviour stay as they were."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is BertEncoder and all(_standard(layer) for layer in child.layer):
                setattr(parent, name, FrozenEncoder(child))
                swapped += 1
    return swapped


__all__ = ["FrozenEncoder", "freeze_encoders"]
