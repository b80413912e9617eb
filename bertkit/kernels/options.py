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

from ..device import cpu_features
from ..errors import BertkitError

log = logging.getLogger("bertkit")

UNPAD_MODES = ("auto", "always", "never")
ONEDNN_MODES = ("training", "always", "never")
ATTENTION_MODES = ("auto", "sdpa", "explicit")
# Options removed after measuring ~1.0x (fused_residual) and ~1.05x (grouped_attention) end to
# end: still accepted, and ignored, until the next release.
REMOVED_OPTIONS = ("fused_residual", "grouped_attention")


def default_onednn_linear() -> str:
    """oneDNN's fp32 Linear where the CPU has AVX-512, torch's own (MKL) elsewhere.

    On AVX-512 (Zen 5) oneDNN's kernels ran the fp32 GEMMs ~2x faster than MKL's AVX2 path; on
    an AVX2-only CPU (Zen 3) the oneDNN Linear made the BERT-BASE training step slower (1.00x
    of transformers' speed with it, 1.23x without). See docs/speed.md.
    """
    return "always" if cpu_features().avx512 else "never"


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
