"""Run-time choice of device and precision: CUDA when present, fp32 unless bf16 is asked for,
and what the CPU can run (`cpu_features`), which decides the CPU kernels (see bertkit/kernels/)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from pathlib import Path

import torch

from .errors import BertkitError

PRECISIONS = ("auto", "fp32", "bf16")
# Inference and fine-tuning (predict, serve, pipeline, finetune): fp32 on every door and device, so one
# model and input give one answer (transformers' numbers); bf16 is asked for. Pre-training from
# scratch (pretrain, reproduce) keeps "auto": its budget recipes were measured with bf16 where native.
DEFAULT_PRECISION = "fp32"
PRECISION_MEANINGS = {
    "fp32": "the same numbers from predict, serve, pipeline and transformers",
    "bf16": "bf16 autocast: faster where the CPU or GPU has native bf16; scores move in the 3rd decimal",
    "auto": "bf16 where native, else fp32",
}

# oneDNN's ONEDNN_MAX_CPU_ISA values that allow AVX-512, bf16 dot products, AMX ("ALL": no cap).
_ISA_WITH_AVX512 = ("AVX512", "AVX10", "ALL")
_ISA_WITH_BF16 = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10", "AMX", "ALL")


@dataclasses.dataclass(frozen=True)
class CpuFeatures:
    avx512: bool  # AVX-512 (F + BW + VL)
    bf16: bool  # native bf16 dot products (AVX512_BF16 or AMX): oneDNN's bf16 inner product exists
    amx: bool  # AMX tiles (bf16)
    vnni: bool = False  # int8 dot products without int16 saturation (AVX512_VNNI or AVX_VNNI)
    vendor: str = "unknown"  # "intel" | "amd" | "unknown": MKL takes its AVX-512 kernels only on Intel
    capped: bool = False  # ONEDNN_MAX_CPU_ISA hides instructions the CPU has (an emulated class)

    @property
    def cpu_class(self) -> str:
        """The class the speed tables and the kernel rule are kept for: "avx2", "avx512",
        "avx512-bf16" (AVX512_BF16 or AMX)."""
        return "avx512-bf16" if self.bf16 else "avx512" if self.avx512 else "avx2"


def _cpu_info() -> tuple[set[str], str]:
    """The CPU's flags and vendor ("intel", "amd", "unknown") from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set(), "unknown"
    flags, vendor = set(), "unknown"
    vendors = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id" and vendor == "unknown":
            vendor = vendors.get(value.strip(), "unknown")
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
        if flags and vendor != "unknown":
            break
    return flags, vendor


@functools.cache
def cpu_features() -> CpuFeatures:
    """What this CPU can run, as oneDNN will see it: the CPU's flags, capped by the environment
    variable ONEDNN_MAX_CPU_ISA (e.g. ONEDNN_MAX_CPU_ISA=AVX2 makes an AVX-512 machine behave as
    an AVX2-only one, which is how the tests check the fallbacks). Cached: read once per process.

    The kernel rule that follows (kernels/linear.py, docs/speed.md): the oneDNN fp32 Linear by default
    only with `avx512`; direct oneDNN bf16 matmuls (and the fused bf16 GELU) only with `bf16`,
    torch's own bf16 route elsewhere.
    """
    flags, vendor = _cpu_info()
    if flags:
        avx512 = {"avx512f", "avx512bw", "avx512vl"} <= flags
        amx = "amx_bf16" in flags
        bf16 = avx512 and ("avx512_bf16" in flags or amx)
        vnni = bool({"avx512_vnni", "avx_vnni"} & flags)
    else:  # no /proc/cpuinfo (not Linux): ask torch
        avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        amx = False
        bf16 = False
        vnni = False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).strip().upper() or "ALL"
    has = (avx512, bf16, amx)
    avx512 = avx512 and cap.startswith(_ISA_WITH_AVX512)
    bf16 = bf16 and any(part in cap for part in _ISA_WITH_BF16)
    amx = amx and ("AMX" in cap or cap == "ALL")
    capped = has != (avx512, bf16, amx)
    try:  # oneDNN's own answer (it honours the cap too); absent from some builds
        bf16 = bf16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        pass
    # fbgemm (int8) reads the CPU itself and ignores the cap: vnni stays what the CPU has.
    return CpuFeatures(avx512=avx512, bf16=bf16, amx=amx, vnni=vnni, vendor=vendor, capped=capped)


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        if torch.cuda.is_available():
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
            return torch.device("cuda", local_rank)
        return torch.device("cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise BertkitError(f"device {requested!r} requested but CUDA is not available")
    if requested == "cuda":  # as "auto": under torchrun each rank its own GPU, always with an index
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    try:
        return torch.device(requested)
    except RuntimeError:
        raise BertkitError(f"unknown device {requested!r} (auto, cpu, cuda, cuda:N)") from None


def bf16_supported(device: torch.device) -> bool:
    """Native bf16 matmuls: elsewhere bf16 is emulated, slower than fp32 (it still runs)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_features().bf16
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" is bf16 where the hardware has it, else fp32. An explicit "bf16" runs everywhere:
    on a CPU without bf16 the bf16 matmuls take torch's (emulated, slower) route."""
    if precision not in PRECISIONS:
        raise BertkitError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto":
        return "bf16" if bf16_supported(device) else "fp32"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"  # a GPU without bf16 (before Ampere) refuses bf16 autocast: fp16, with a GradScaler in training
    return precision


def add_precision_argument(parser, default: str = DEFAULT_PRECISION) -> None:
    """--precision, spelt and defaulted the same by every command that runs a model."""
    help_text = " | ".join(f"{name} ({'default: ' if name == default else ''}{meaning})"
                           for name, meaning in PRECISION_MEANINGS.items())
    parser.add_argument("--precision", default=default, choices=PRECISIONS, help=help_text)


def precision_label(device: torch.device, precision: str, quantize: str = "none") -> str:
    """What a model runs in, as the first log line and serve's /info say it: "cpu, fp32",
    "cuda:0, bf16", "cpu, int8"."""
    return f"{device}, {'int8' if quantize == 'int8' else precision}"


def autocast(device: torch.device, precision: str):
    """bf16 (or on a GPU without bf16, fp16: resolve_precision) autocast for matmuls; parameters,
    optimizer state and losses stay fp32."""
    if precision in ("bf16", "fp16"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
    return contextlib.nullcontext()


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(dtype) -> torch.dtype | None:
    """transformers' `dtype=` / `torch_dtype=`: None or "auto" (keep the checkpoint's, fp32 in
    bertkit's files), a torch dtype or its name."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise BertkitError(f"dtype must be torch.float32, torch.float16, torch.bfloat16 or \"auto\", not {dtype!r}")
