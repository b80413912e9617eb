"""fp32 inference Linears with their weights packed once for the GEMM library
(`KernelOptions.packed_weights`).

A GEMM library rearranges the weight matrix into its own blocked layout on every call; a model
whose weights do not change between calls can have that done once:

* "mkl": MKL's packed sgemm (cblas_sgemm_pack, then cblas_sgemm_compute per call), which torch
  exposes as `mkl._mkl_reorder_linear_weight` / `mkl._mkl_linear` (inductor's freezing uses them).
  torch's op takes the packed route only when the call's row count equals the `batch_size` it is
  given; one pack (made for 64 rows) serves every call, each naming its own row count. MKL's
  compute reads a pack made for another row count correctly, but the pack is not always the same
  bits: on some CPUs MKL blocks a one-row pack differently, so a lone row can differ from a pack
  made for it in the last bit (tests/kernels/test_inference_levers.py checks F.linear's numbers at
  every count).
* "onednn": oneDNN's blocked weight layout (`mkldnn._reorder_linear_weight`), run by the oneDNN
  Linear's `_linear_pointwise`, with the exact GELU as its post-op where `fused_gelu` is on. An fp32
  call of a few rows (`mkl_rows`, scaled with the width) takes MKL's pack instead (held beside the oneDNN one): where MKL
  has its best kernels (Intel), oneDNN's fixed cost per call outweighs its GEMM at a few rows. Under
  bf16 autocast on a CPU with native bf16 the pack is of the bf16 weights: autocast would otherwise
  cast every weight to bf16 and oneDNN reorder it again on every call, which at a few rows (one
  request) costs more than the GEMM itself. Same numbers as autocast's F.linear: the same bf16
  operands, fp32 accumulation.

* "bertkit": bertkit's own AVX2 / FMA GEMM (kernels/graph_gemm.py, the avx2 class's default): the
  weight in panels of 16 columns (`graph_gemm.fma_pack`), the GELU applied as its sums are stored;
  its items on torch's threads. Where the op cannot be built (no C++ compiler) or run (no AVX2 / FMA),
  the "onednn" packs instead (`packing_mode`). fp32 only.

The pack belongs to the module that owns the weight (kept beside it, freed with it) and is remade
when the weight changes: an in-place update bumps its version, and every optimizer step counts as a
change (torch's fused AdamW updates the weights without bumping their versions, so a model scored on
dev mid-training would otherwise keep scoring its first evaluation's weights). A second copy of the
weights in memory. It applies without gradients to fp32 CPU tensors outside tracing and autocast, and ("onednn")
under CPU bf16 autocast where the CPU has bf16; everywhere else the usual route runs.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..device import cpu_features
from . import graph_gemm
from .options import KernelOptions, exporting


_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {mode: (key, pack, weight, bias)}
_optimizer_steps = 0  # every torch optimizer's steps in this process: a pack made before one is stale


def _count_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_step)


def has_pack(module: torch.nn.Module) -> bool:
    """Whether `module` holds a weight pack (it has run the packed route)."""
    return bool(_PACKS.get(module))


def bf16_autocast_inference(x: torch.Tensor) -> bool:
    """Inference under CPU bf16 autocast on a CPU with native bf16 dot products. Elsewhere
    oneDNN has no bf16 inner product (on AVX2 it fails to create one): torch's own route then."""
    return (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and not torch.is_grad_enabled() and cpu_features().bf16)


def packed_dtype(x: torch.Tensor, options: KernelOptions) -> torch.dtype | None:
    """The dtype this call computes in from a pack: float32 (fp32 inference), bfloat16 (oneDNN packs
    under bf16 autocast inference), or None: the usual route."""
    if (options.packed_weights == "none" or torch.is_grad_enabled() or exporting() or x.device.type != "cpu"
            or x.numel() == 0):
        return None
    mode = packing_mode(options)  # (after the checks above: training never builds bertkit's op)
    if mode == "none":
        return None
    if not torch.is_autocast_enabled("cpu"):
        return torch.float32 if x.dtype == torch.float32 else None
    if mode == "onednn" and x.dtype in (torch.float32, torch.bfloat16) \
            and bf16_autocast_inference(x):
        return torch.bfloat16
    return None


def packing_mode(options: KernelOptions) -> str:
    """`options.packed_weights`, but "bertkit" where its op cannot be built here (graph_gemm.eager_ops:
    no C++ compiler, no AVX2): oneDNN's packs (or none) instead."""
    mode = options.packed_weights
    if mode == "bertkit" and not graph_gemm.eager_ops():
        return "onednn" if torch.backends.mkldnn.is_available() else "none"
    return mode


def packing_applies(x: torch.Tensor, options: KernelOptions) -> bool:
    return packed_dtype(x, options) is not None


def _pack(mode: str, weight: torch.Tensor) -> torch.Tensor:  # weight: fp32, or bf16 for "onednn"
    if mode == "bertkit":  # bertkit's AVX2 op's panels of 16 columns (kernels/graph_gemm.py)
        return graph_gemm.fma_pack(weight)
    if mode == "mkl":
        # The batch size only sizes the pack; any row count may use it (see the module doc).
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, 64)
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def packed_weights(holder: torch.nn.Module, mode: str, weights: tuple[torch.Tensor, ...],
                   biases: tuple[torch.Tensor | None, ...], dtype: torch.dtype = torch.float32):
    """(pack, weight, bias) for these weights (concatenated when several: query, key and value) in
    `dtype`, made once per mode and dtype and kept on `holder` until a weight changes."""
    key = (_optimizer_steps, tuple((w.data_ptr(), w._version) for w in weights),
           tuple(None if b is None else (b.data_ptr(), b._version) for b in biases))
    # One pack per mode (a model switched between modes keeps both), held beside the module rather
    # than on it: never in a state dict, and copy.deepcopy / pickling of a model that has run never
    # meet oneDNN's opaque tensors (which have no storage to copy); a copy packs its own on first use.
    packs = _PACKS.setdefault(holder, {})
    cached = packs.get((mode, dtype))
    if cached is None or cached[0] != key:
        cached = None  # a stale pack goes before the new one is made (one copy at a time)
        packs.pop((mode, dtype), None)
        weight = (weights[0] if len(weights) == 1 else torch.cat(weights)).detach().to(dtype).contiguous()
        bias = None if biases[0] is None else (biases[0] if len(biases) == 1 else torch.cat(biases)).detach()
        bias = None if bias is None else bias.to(dtype)
        packs[(mode, dtype)] = cached = (key, _pack(mode, weight), weight, bias)
    return cached[1:]


def packed_linear(holder: torch.nn.Module, x: torch.Tensor, weights: tuple[torch.Tensor, ...],
                  biases: tuple[torch.Tensor | None, ...], options: KernelOptions, gelu: bool = False) -> torch.Tensor:
    """x @ W.T + b (then the exact GELU with `gelu`) through the pack of `options.packed_weights`
    (in bf16 under bf16 autocast: `packed_dtype`)."""
    dtype = packed_dtype(x, options) or torch.float32
    mode = packing_mode(options)
    if mode == "onednn" and dtype == torch.float32 and options.mkl_rows and x.numel() // x.shape[-1] \
            <= options.mkl_row_limit(min(x.shape[-1], sum(w.shape[0] for w in weights))):
        mode = "mkl"  # a few rows: MKL's pack (options.MKL_ROWS_BY_CLASS)
    pack, weight, bias = packed_weights(holder, mode, weights, biases, dtype)
    x = x.to(dtype)
    if mode == "bertkit":
        return graph_gemm.eager_linear(x, pack, weight.shape[0], bias, gelu)
    if mode == "mkl":
        x = x.contiguous()
        y = torch.ops.mkl._mkl_linear(x, pack, weight, bias, x.numel() // x.shape[-1])
        return torch.ops.aten.gelu_(y) if gelu else y  # in place: y is this call's own (no gradients here)
    if gelu and options.fused_gelu:
        return torch.ops.mkldnn._linear_pointwise(x, pack, bias, "gelu", [], "none")
    y = torch.ops.mkldnn._linear_pointwise(x, pack, bias, "none", [], "")
    return F.gelu(y) if gelu else y
