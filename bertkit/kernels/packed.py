"""fp32 inference Linears with their weights packed once for the GEMM library
(`KernelOptions.packed_weights`).

A GEMM library rearranges the weight matrix into its own blocked layout on every call; a model
whose weights do not change between calls can have that done once:

* "mkl": MKL's packed sgemm (cblas_sgemm_pack, then cblas_sgemm_compute per call), which torch
  exposes as `mkl._mkl_reorder_linear_weight` / `mkl._mkl_linear` (inductor's freezing uses them).
  torch's op takes the packed route only when the call's row count equals the `batch_size` it is
  given; MKL's packed B matrix does not depend on the row count (bitwise the same pack for every
  count tried: tests/test_inference_levers.py checks it), so one pack serves every call, each naming
  its own row count.
* "onednn": oneDNN's blocked weight layout (`mkldnn._reorder_linear_weight`), run by the oneDNN
  Linear's `_linear_pointwise`, with the exact GELU as its post-op where `fused_gelu` is on.

The pack belongs to the module that owns the weight (kept beside it, freed with it) and is remade
when the weight changes (an in-place update bumps its version): a second copy of the weights in
memory. It applies without gradients to fp32 CPU tensors outside tracing and autocast; everywhere
else the usual route runs.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .options import KernelOptions, exporting


_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {mode: (key, pack, weight, bias)}


def has_pack(module: torch.nn.Module) -> bool:
    """Whether `module` holds a weight pack (it has run the packed route)."""
    return bool(_PACKS.get(module))


def packing_applies(x: torch.Tensor, options: KernelOptions) -> bool:
    return (options.packed_weights != "none" and not torch.is_grad_enabled() and not exporting()
            and x.device.type == "cpu" and x.dtype == torch.float32 and x.numel() > 0
            and not torch.is_autocast_enabled("cpu"))


def _pack(mode: str, weight: torch.Tensor) -> torch.Tensor:
    if mode == "mkl":
        # The batch size only sizes the pack; any row count may use it (see the module doc).
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, 64)
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def packed_weights(holder: torch.nn.Module, mode: str, weights: tuple[torch.Tensor, ...],
                   biases: tuple[torch.Tensor | None, ...]):
    """(pack, weight, bias) for these weights (concatenated when several: query, key and value),
    made once per mode and kept on `holder` until a weight changes."""
    key = (tuple((w.data_ptr(), w._version) for w in weights),
           tuple(None if b is None else (b.data_ptr(), b._version) for b in biases))
    # One pack per mode (a model switched between modes keeps both), held beside the module rather
    # than on it: never in a state dict, and copy.deepcopy / pickling of a model that has run never
    # meet oneDNN's opaque tensors (which have no storage to copy); a copy packs its own on first use.
    packs = _PACKS.setdefault(holder, {})
    cached = packs.get(mode)
    if cached is None or cached[0] != key:
        cached = None  # a stale pack goes before the new one is made (one copy at a time)
        packs.pop(mode, None)
        weight = (weights[0] if len(weights) == 1 else torch.cat(weights)).detach().float().contiguous()
        bias = None if biases[0] is None else (biases[0] if len(biases) == 1 else torch.cat(biases)).detach()
        packs[mode] = cached = (key, _pack(mode, weight), weight, bias)
    return cached[1:]


def packed_linear(holder: torch.nn.Module, x: torch.Tensor, weights: tuple[torch.Tensor, ...],
                  biases: tuple[torch.Tensor | None, ...], options: KernelOptions, gelu: bool = False) -> torch.Tensor:
    """x @ W.T + b (then the exact GELU with `gelu`) through the pack of `options.packed_weights`."""
    pack, weight, bias = packed_weights(holder, options.packed_weights, weights, biases)
    if options.packed_weights == "mkl":
        x = x.contiguous()
        y = torch.ops.mkl._mkl_linear(x, pack, weight, bias, x.numel() // x.shape[-1])
        return F.gelu(y) if gelu else y
    if gelu and options.fused_gelu:
        return torch.ops.mkldnn._linear_pointwise(x, pack, bias, "gelu", [], "none")
    y = torch.ops.mkldnn._linear_pointwise(x, pack, bias, "none", [], "")
    return F.gelu(y) if gelu else y
