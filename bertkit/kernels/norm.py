"""The residual and LayerNorm that end each post-LN block: LayerNorm(y + residual)."""

from __future__ import annotations

import torch
from torch import nn

from . import graph_gemm


def add_norm(norm: nn.Module, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """norm(y + residual). In a graph recorded with bertkit's AVX2 ops (`graph_gemm.recording(norm=True)`:
    the avx2 class, inference/compiled.py) an nn.LayerNorm over fp32 rows is bertkit's residual +
    LayerNorm op, its rows on the ops' threads; inductor's loop for it ran on the calling thread alone
    at ~8x the arithmetic's time (graph_gemm.cpp). In the bf16 graph (`recording(bf16=True)`) `y` is a
    Linear's bf16 output and the residual fp32, as under autocast: the sum and the norm in fp32, as
    autocast computes them. Any other norm (an adapter's) runs as it is."""
    y_dtypes = (torch.float32, torch.bfloat16) if graph_gemm.is_recording_bf16() else (torch.float32,)
    if graph_gemm.is_recording_norm() and type(norm) is nn.LayerNorm and len(norm.normalized_shape) == 1 \
            and norm.weight is not None and norm.bias is not None and y.dtype in y_dtypes \
            and residual.dtype == torch.float32:
        return graph_gemm.graph_add_norm(y.float(), residual, norm.weight, norm.bias, norm.eps)
    return norm(y + residual)
