"""How a model computes: `KernelOptions`, a frozen value chosen when the model is built and held by
it (docs/speed.md has what each option was measured to buy).

    model = BertModel(config, kernels=KernelOptions(unpad="never"))
    model = load_model(folder, kernels=kernels.default_options().replace(onednn_linear="never"))

A model built without `kernels=` takes the process default: the per-CPU-class choice below, changed
by the environment variable ``BERTKIT_SPEED_OPTIONS="onednn_linear=never,unpad=never"`` (read once,
at import). Nothing is read from module state while a model runs: two models with different
options run side by side, in threads too.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os

import torch

from ..device import CpuFeatures, cpu_features
from ..errors import BertkitError


UNPAD_MODES = ("auto", "always", "never")
ONEDNN_MODES = ("training", "inference", "always", "never")
# The attention implementations (model.ATTENTION_IMPLEMENTATIONS, the one registry): "auto" is SDPA,
# or the written-out formula where torch's CPU SDPA is slow (kernels/attention.py).
ATTENTION_MODES = ("auto", "sdpa", "explicit", "eager")
# fp32 inference Linears with their weights packed once for a GEMM library (kernels/packed.py):
# "mkl" (MKL's packed sgemm), "onednn" (oneDNN's blocked layout, the GELU as a post-op), "bertkit"
# (bertkit's AVX2 / FMA GEMM op, kernels/graph_gemm.py, from its panels of 16 columns), "none".
PACKED_WEIGHTS_MODES = ("none", "mkl", "onednn", "bertkit")


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


# Inference weights packed once for oneDNN (kernels/packed.py), per class, from
# `benchmarks/bench_engines.py --levers` (alternated against the stock path): on the AVX2 EPYC 1.06x
# on all-MiniLM-L6-v2 and on BERT-base alike (batches of 32). On a Zen 5 (avx512-bf16) batches of 32
# were even (two runs: MiniLM 1.07x then 0.86x, base 0.98x then 1.09x), but one request gains:
# every call would otherwise reorder (and under bf16 autocast first cast) every weight, which at a
# few rows costs more than the GEMM (docs/speed.md, "One request"). avx512 not yet measured. On the
# avx2 class bertkit's own AVX2 GEMM ("bertkit") since: on an AMD EPYC Zen 3 1.22-1.30x the oneDNN
# packs on all-MiniLM-L6-v2 batches of 32, 1.35-1.40x on lone inputs (`--levers --engine-options`).
PACKED_WEIGHTS_BY_CLASS = {"avx2": "bertkit", "avx512-bf16": "onednn"}

# Up to this many rows (tokens in one call) at width 768, an fp32 call of the "onednn" packs runs
# MKL's packed sgemm instead, from a pack of its own (made on the first such call); a narrower Linear's
# limit scales up (MKL_REFERENCE_WIDTH / its width: all-MiniLM-L6-v2's 384 doubles it). Per class and
# vendor, because MKL takes its AVX-512 kernels on Intel only (its AVX2 path on AMD). On an Intel
# Xeon with AMX, one input of 8-64 tokens after 0.1 s of rest: 1.16-1.23x (MiniLM) / 1.08-1.10x (base) against
# oneDNN's packs; two inputs with MKL up to 128 rows: MiniLM 1.06-1.09x, base 0.92-0.96x, hence the
# scaling with width; MKL for every call was 0.95-0.98x from eight inputs on. oneDNN's fixed cost per
# call is what loses at few rows (docs/speed.md, the options table).
MKL_REFERENCE_WIDTH = 768
MKL_ROWS_BY_CLASS = {("avx512-bf16", "intel"): 64}


def default_mkl_rows(features: CpuFeatures | None = None) -> int:
    """The row count (at width 768) up to which this CPU's fp32 packed calls take MKL's pack
    (MKL_ROWS_BY_CLASS; 0, never, where a class and vendor are not in it or this torch has no MKL)."""
    features = features or cpu_features()
    rows = MKL_ROWS_BY_CLASS.get((features.cpu_class, features.vendor), 0)
    return rows if rows and mkl_available() else 0


def mkl_available() -> bool:
    return bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear")


# Per class, whether fp32 inference attention runs bertkit's attention op (`attention_op`): on the
# AMD EPYC Zen 3 with the "bertkit" packs, all-MiniLM-L6-v2 batches of 32 1.02-1.06x, lone inputs
# 1.06-1.12x more; not measured against torch's attention on the AVX-512 classes.
ATTENTION_OP_BY_CLASS: dict[str, bool] = {"avx2": True}


def default_attention_op(features: CpuFeatures | None = None) -> bool:
    return ATTENTION_OP_BY_CLASS.get((features or cpu_features()).cpu_class, False)


def default_packed_weights(features: CpuFeatures | None = None) -> str:
    """The weight packing this CPU's fp32 inference uses by default (PACKED_WEIGHTS_BY_CLASS; "none"
    where a class is not in it, or where this torch has no oneDNN)."""
    mode = PACKED_WEIGHTS_BY_CLASS.get((features or cpu_features()).cpu_class, "none")
    return mode if mode != "onednn" or torch.backends.mkldnn.is_available() else "none"


def default_onednn_linear(features: CpuFeatures | None = None) -> str:
    """The fp32 Linear this CPU runs by default: "always" (oneDNN), "inference" (oneDNN only without
    gradients), or "never" (torch's). See FP32_LINEAR_BY_CLASS; a class not in it gets the stock path."""
    features = features or cpu_features()
    return FP32_LINEAR_BY_CLASS.get(features.cpu_class, "never")


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """Which kernels a model runs. Immutable: `replace(...)` gives a changed copy (validated)."""

    onednn_linear: str = dataclasses.field(default_factory=default_onednn_linear)
    fused_qkv: bool = True
    attention: str = "auto"
    fast_dropout: bool = True
    unpad: str = "auto"
    unpad_min_saved_tokens: int = 128
    # The unpadded token count is rounded up to a multiple of this (with a few padding rows), so
    # that varying batches reuse a few GEMM shapes: oneDNN generates code for every new shape.
    unpad_multiple: int = 64
    # ... except a count of at most this many tokens, rounded up to a multiple of 8 only
    # (UNPAD_FINE_MULTIPLE): the engine sets it to the longest lone input it warms up (128), whose
    # padded row counts (multiples of 8) every library has met already, so no new shape arises.
    unpad_fine_rows: int = 0
    packed_attention: bool = True
    fused_gelu: bool = True
    # Weights packed once for the GEMM library in fp32 inference: per class (PACKED_WEIGHTS_BY_CLASS),
    # a second copy of the encoder's Linear weights held while the model runs without gradients.
    packed_weights: str = dataclasses.field(default_factory=default_packed_weights)
    # With packed_weights="onednn": fp32 calls of at most this many rows (at width 768; scaled by
    # 768 / the Linear's width, its smaller side: `mkl_row_limit`) run MKL's packed sgemm instead (a
    # third copy of those weights, made on the first such call); 0: never. Per class and vendor
    # (MKL_ROWS_BY_CLASS).
    mkl_rows: int = dataclasses.field(default_factory=default_mkl_rows)
    # fp32 inference attention on the CPU through bertkit's attention op (kernels/graph_gemm.py: its
    # AVX2 kernels, any sequence up to 512 tokens; on the packed rows, or a batch with no padding),
    # per class (ATTENTION_OP_BY_CLASS); torch's attention wherever the op is not built or applies.
    attention_op: bool = dataclasses.field(default_factory=default_attention_op)
    # With packed attention, sequences grouped by length rounded up to a multiple of this and each
    # group run as one masked attention call (0: one call per sequence; causal models always are).
    attention_bucket: int = 0

    def __post_init__(self):
        for option, modes in (("unpad", UNPAD_MODES), ("onednn_linear", ONEDNN_MODES),
                              ("attention", ATTENTION_MODES), ("packed_weights", PACKED_WEIGHTS_MODES)):
            if getattr(self, option) not in modes:
                raise BertkitError(f"speed option {option} must be one of {', '.join(modes)}, "
                                   f"not {getattr(self, option)!r}")
        if self.unpad_fine_rows < 0:
            raise BertkitError(f"speed option unpad_fine_rows must be 0 (off) or a token count, not {self.unpad_fine_rows}")
        if self.mkl_rows < 0:
            raise BertkitError(f"speed option mkl_rows must be 0 (never) or a row count, not {self.mkl_rows}")
        if self.mkl_rows and not mkl_available():
            raise BertkitError("speed option mkl_rows needs torch built with MKL (this one is not); set mkl_rows=0")
        if self.attention_bucket < 0:
            raise BertkitError(f"speed option attention_bucket must be 0 (off) or a positive length, "
                               f"not {self.attention_bucket}")
        if self.packed_weights == "mkl" and not mkl_available():
            raise BertkitError("speed option packed_weights=mkl needs torch built with MKL (this one is not)")
        if self.packed_weights == "onednn" and not torch.backends.mkldnn.is_available():
            raise BertkitError("speed option packed_weights=onednn needs torch built with oneDNN (this one is not)")

    def mkl_row_limit(self, width: int) -> int:
        """The most rows a call of a Linear this wide (the smaller of its in and out features) takes
        MKL's pack for: `mkl_rows` scaled from width 768."""
        return self.mkl_rows * MKL_REFERENCE_WIDTH // width

    def replace(self, source: str | None = None, **changes) -> KernelOptions:
        """A copy with `changes` (values may be strings, as in BERTKIT_SPEED_OPTIONS); an unknown
        option or value is a BertkitError naming `source`."""
        values = {name: _parse(name, value, source) for name, value in changes.items()}
        try:
            return dataclasses.replace(self, **values)
        except BertkitError as err:
            where = f" (in {source})" if source else ""
            raise BertkitError(f"{err}{where}") from None

    @classmethod
    def plain(cls) -> KernelOptions:
        """What a graph can hold (ONNX export, tracing): F.linear, SDPA on the padded batch, no
        unpadding, no fused post-ops; the same numbers at every real position."""
        return cls(onednn_linear="never", unpad="never", fused_gelu=False, packed_attention=False,
                   attention="sdpa", fast_dropout=False, packed_weights="none", mkl_rows=0, attention_op=False)


def _parse(name: str, value, source: str | None):
    fields = {f.name: f.type for f in dataclasses.fields(KernelOptions)}
    where = f" (in {source})" if source else ""
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
    return value


def _from_environment() -> KernelOptions:
    """The defaults for this CPU, changed by BERTKIT_SPEED_OPTIONS ("name=value,name=value")."""
    text = os.environ.get("BERTKIT_SPEED_OPTIONS", "").strip()
    changes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        changes[name.strip()] = value.strip()
    return KernelOptions().replace(source="BERTKIT_SPEED_OPTIONS", **changes)


# The process default, fixed at import (a frozen value: nothing can change it while models run).
PROCESS_DEFAULT = _from_environment()

# Only model construction reads this (a `speed_options` block's options for the models built in
# it); a running model never does.
_construction_default: contextvars.ContextVar[KernelOptions | None] = contextvars.ContextVar(
    "bertkit_kernel_options", default=None)


class HoldsKernelOptions:
    """A module that computes through the kernels: it holds its model's options in `kernels`, set when
    the model is built (`BertPreTrainedModel.hold_kernels`); alone, it has the process default."""

    kernels: KernelOptions = PROCESS_DEFAULT


def default_options() -> KernelOptions:
    """The options a model built here and now gets without `kernels=`: those of the enclosing
    `speed_options` block, else the process default."""
    return _construction_default.get() or PROCESS_DEFAULT


@contextlib.contextmanager
def speed_options(**changes):
    """`with speed_options(unpad="never") as chosen:` the default options with these changes, for
    the models *built* inside the block (a model keeps the options it was built with; pass
    `kernels=` to choose them without a block)."""
    chosen = default_options().replace(**changes)
    token = _construction_default.set(chosen)
    try:
        yield chosen
    finally:
        _construction_default.reset(token)


def exporting() -> bool:
    """True while the model is recorded rather than run: torch.jit.trace (and the TorchScript ONNX
    exporter), torch.export / torch.onnx.export(dynamo=True) and torch.compile. The plain path
    then runs. (torch.onnx.is_in_onnx_export would say it too, at ~10x the cost per call.)"""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()
