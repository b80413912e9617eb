"""The speed options: which fast paths run (docs/speed.md has what each was measured to buy).

Set them for a block with ``with speed_options(unpad="never"): ...`` or for a process with the
environment variable ``BERTKIT_SPEED_OPTIONS="onednn_linear=never,unpad=never"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import torch

from ..device import CpuFeatures, cpu_features
from ..errors import BertkitError

log = logging.getLogger("bertkit")

UNPAD_MODES = ("auto", "always", "never")
ONEDNN_MODES = ("training", "inference", "always", "never")
ATTENTION_MODES = ("auto", "sdpa", "explicit")
# Options removed after measuring ~1.0x (fused_residual) and ~1.05x (grouped_attention) end to
# end: still accepted, and ignored, until the next release.
REMOVED_OPTIONS = ("fused_residual", "grouped_attention")


# The fp32 Linear per CPU class (`CpuFeatures.cpu_class`), read off alternated measurements of the
# pre-training step and variable-length inference against the stock path on each class
# (benchmarks/kernel_choice.py; the numbers and how they were taken: docs/speed.md). A class gets
# oneDNN only where it measured at least as fast as torch's own Linear (MKL) in every case.
FP32_LINEAR_BY_CLASS = {
    # Zen 3 (and Intel capped to AVX2): the oneDNN Linear made the BERT-BASE training step slower
    # (1.00x transformers' speed with it, 1.23x without); elsewhere it was even.
    "avx2": "never",
    # Intel Xeon, AVX-512 without bf16: inference 1.08x (base) / 1.25x (mini) with it, but the
    # BERT-BASE training step 1.16x faster without it (MKL has AVX-512 kernels on Intel).
    "avx512": "inference",
    # Zen 4 / Zen 5 (MKL takes its AVX2 path on AMD): training 1.05-1.13x, inference 1.06-1.09x.
    "avx512-bf16": "always",
}


def default_onednn_linear(features: CpuFeatures | None = None) -> str:
    """The fp32 Linear this CPU runs by default: "always" (oneDNN), "inference" (oneDNN only without
    gradients), or "never" (torch's). See FP32_LINEAR_BY_CLASS; a class not in it gets the stock path."""
    features = features or cpu_features()
    return FP32_LINEAR_BY_CLASS.get(features.cpu_class, "never")


@dataclasses.dataclass
class SpeedOptions:
    onednn_linear: str = dataclasses.field(default_factory=default_onednn_linear)
    fused_qkv: bool = True
    attention: str = "auto"
    fast_dropout: bool = True
    unpad: str = "auto"
    unpad_min_saved_tokens: int = 128
    # The unpadded token count is rounded up to a multiple of this (with a few padding rows), so
    # that varying batches reuse a few GEMM shapes: oneDNN generates code for every new shape.
    unpad_multiple: int = 64
    packed_attention: bool = True
    fused_gelu: bool = True


def _from_environment() -> SpeedOptions:
    options = SpeedOptions()
    text = os.environ.get("BERTKIT_SPEED_OPTIONS", "").strip()
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        _set(options, name.strip(), value.strip(), source="BERTKIT_SPEED_OPTIONS")
    return options


def _set(options: SpeedOptions, name: str, value, source: str | None = None) -> None:
    fields = {f.name: f.type for f in dataclasses.fields(SpeedOptions)}
    where = f" (in {source})" if source else ""
    if name in REMOVED_OPTIONS:
        log.warning("speed option %s%s was removed (it bought ~1.0x); it is ignored", name, where)
        return
    if name not in fields:
        raise BertkitError(f"unknown speed option {name!r}{where}; choose from {', '.join(fields)}")
    if isinstance(value, str):
        if fields[name] == "bool":
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise BertkitError(f"speed option {name} must be 0 or 1, not {value!r}{where}")
            value = value.lower() in ("1", "true", "yes", "on")
        elif fields[name] == "int":
            try:
                value = int(value)
            except ValueError:
                raise BertkitError(f"speed option {name} must be an integer, not {value!r}{where}") from None
    for option, modes in (("unpad", UNPAD_MODES), ("onednn_linear", ONEDNN_MODES), ("attention", ATTENTION_MODES)):
        if name == option and value not in modes:
            raise BertkitError(f"speed option {option} must be one of {', '.join(modes)}, not {value!r}{where}")
    setattr(options, name, value)


options = _from_environment()


@contextlib.contextmanager
def speed_options(**changes):
    """Change speed options inside a block: `with speed_options(onednn_linear="never"): ...`."""
    saved = dataclasses.replace(options)
    try:
        for name, value in changes.items():
            _set(options, name, value)
        yield options
    finally:
        for field in dataclasses.fields(SpeedOptions):
            setattr(options, field.name, getattr(saved, field.name))


def exporting() -> bool:
    """True while the model is recorded rather than run: torch.jit.trace (and the TorchScript ONNX
    exporter), torch.export / torch.onnx.export(dynamo=True) and torch.compile. The plain path
    then runs. (torch.onnx.is_in_onnx_export would say it too, at ~10x the cost per call.)"""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()
