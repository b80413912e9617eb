"""Dropout with CPU masks from half as many random draws as torch's `bernoulli_`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .options import HoldsKernelOptions



def drop_mask(shape, p: float, device=None) -> tuple[torch.Tensor, float]:
    """A bool mask dropping each element (True) with probability p' (p rounded to 1/32768), and the
    scale 1 / (1 - p') for the kept ones. Each int32 draw of torch's generator is uniform on
    [0, 2^31): its bits 0-14 and 16-30 are two independent 15-bit uniforms."""
    n = math.prod(shape)
    threshold = min(32768, max(0, round(p * 32768)))
    bits = torch.empty((n + 1) // 2, dtype=torch.int32, device=device).random_()
    drop = torch.empty((n + 1) // 2, 2, dtype=torch.bool, device=device)
    torch.lt(bits & 0x7FFF, threshold, out=drop[:, 0])
    torch.lt(bits >> 16, threshold, out=drop[:, 1])
    scale = 1.0 / (1.0 - threshold / 32768) if threshold < 32768 else 0.0
    return drop.view(-1)[:n].view(shape), scale


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        drop, scale = drop_mask(x.shape, p, x.device)
        ctx.save_for_backward(drop)
        ctx.scale = scale
        # Scale, then zero in place: masked_fill_ reads the bool mask as it is, where mul_ by a bool
        # mask converts it to a float copy first (a full extra pass: ~40% of this function on the
        # (B, A, T, T) attention probabilities).
        return x.mul(scale).masked_fill_(drop, 0.0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (drop,) = ctx.saved_tensors
        return grad.mul(ctx.scale).masked_fill_(drop, 0.0), None


def dropout(x: torch.Tensor, p: float, training: bool = True, fast: bool = True) -> torch.Tensor:
    """F.dropout, with `drop_mask` masks on the CPU when `fast` (the option `fast_dropout`)."""
    if not training or p == 0.0:
        return x
    if fast and x.device.type == "cpu" and 0.0 < p < 1.0:
        return _Dropout.apply(x, p)
    return F.dropout(x, p, training)


class Dropout(HoldsKernelOptions, nn.Dropout):
    """nn.Dropout computed by `dropout` above; setting `p = 0` turns it off like any nn.Dropout."""

    def forward(self, x):
        return dropout(x, self.p, self.training, self.kernels.fast_dropout)
