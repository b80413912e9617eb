"""Dropout with CPU masks from half as many random draws as torch's `bernoulli_`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .options import options


def keep_mask(shape, p: float, device=None) -> tuple[torch.Tensor, float]:
    """A bool mask keeping each element with probability 1 - p' (p' = p rounded to 1/32768), and
    the scale 1 / (1 - p'). Each int32 draw of torch's generator is uniform on [0, 2^31): its
    bits 0-14 and 16-30 are two independent 15-bit uniforms."""
    n = math.prod(shape)
    threshold = min(32768, max(0, round(p * 32768)))
    bits = torch.empty((n + 1) // 2, dtype=torch.int32, device=device).random_()
    keep = torch.empty((n + 1) // 2, 2, dtype=torch.bool, device=device)
    torch.ge(bits & 0x7FFF, threshold, out=keep[:, 0])
    torch.ge(bits >> 16, threshold, out=keep[:, 1])
    scale = 1.0 / (1.0 - threshold / 32768) if threshold < 32768 else 0.0
    return keep.view(-1)[:n].view(shape), scale


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        keep, scale = keep_mask(x.shape, p, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        # Scale, then zero in place with the bool mask: no float copy of the mask (x * keep makes one).
        return x.mul(scale).mul_(keep)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.mul(ctx.scale).mul_(keep), None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout, with `keep_mask` masks on the CPU when `options.fast_dropout` is on."""
    if not training or p == 0.0:
        return x
    if options.fast_dropout and x.device.type == "cpu" and 0.0 < p < 1.0:
        return _Dropout.apply(x, p)
    return F.dropout(x, p, training)


class Dropout(nn.Dropout):
    """nn.Dropout computed by `dropout` above; setting `p = 0` turns it off like any nn.Dropout."""

    def forward(self, x):
        return dropout(x, self.p, self.training)
