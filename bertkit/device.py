"""Run-time choice of device and precision: CUDA when present, bf16 where the hardware has it."""

from __future__ import annotations

import contextlib
import os

import torch

from .errors import BertkitError

PRECISIONS = ("auto", "fp32", "bf16")


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        if torch.cuda.is_available():
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
            return torch.device("cuda", local_rank)
        return torch.device("cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise BertkitError(f"device {requested!r} requested but CUDA is not available")
    return torch.device(requested)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        # Native bf16 dot products (AVX512-BF16 / AMX); elsewhere bf16 is emulated and slower than fp32.
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise BertkitError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto":
        return "bf16" if bf16_supported(device) else "fp32"
    return precision


def autocast(device: torch.device, precision: str):
    """bf16 autocast for matmuls; parameters, optimizer state and losses stay fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
