"""bertkit's own GEMMs (and attention) inside a graph compiled ahead (inference/compiled.py), where
they beat what inductor emits: C++ ops (graph_gemm.cpp), built once per torch version with the compiler
`--compile` needs anyway, kept in the compile cache and called by AOTInductor directly through
their C functions (`aot_inductor.custom_ops_to_c_shims`; through its proxy executor they measured
slower than the GEMMs they would replace). On the avx2 class eager fp32 inference calls the AVX2 GEMM
and the attention op too (`KernelOptions.packed_weights` "bertkit", `attention_op`; `eager_ops`,
`eager_linear`, `eager_attention`), from packs its Linears hold and on torch's threads.

* `bertkit::bertkit_mkl_linear(x, weight, bias)`, fp32, for the Linears of a lone input where the
  eager engine takes MKL's pack (KernelOptions.mkl_rows: Intel CPUs with AMX / AVX512_BF16).
  Inductor cannot put MKL's pack in a package: its `mkl._mkl_linear` takes the row count as a plain
  int, which torch.export fixes to the example's, and the pack is an opaque tensor with no storage
  to save. The op packs each weight on its first call (cblas_sgemm_pack) and runs
  cblas_sgemm_compute for any row count.
* `bertkit::bertkit_fma_linear(x, weight, bias)`, fp32, for the Linears of the fp32 graph on CPUs
  whose vector units are 256 bits wide (the avx2 class, and AMD's Zen 4, which runs AVX-512 as two
  halves: `team_graphs`): bertkit's own kernel. The weight
  is packed once in panels of 16 output columns (K rows of 16 floats each); six input rows at a time
  keep a panel's 6 x 16 sums in twelve AVX registers, the bias their start. At one request's row
  counts oneDNN's AVX2 GEMM ran at ~55% of the FMA peak of an AMD EPYC Zen 3 and MKL (its AVX2 path
  on AMD) slower; every layer's GEMMs of all-MiniLM-L6-v2 in order, 8 / 40 / 64 rows: 2.9 / 6.7 /
  10.6 ms against oneDNN's packed 3.5 / 8.5 / 12.0 and ONNX Runtime's MLAS 2.8 / 6.6 / 9.6; BERT-base
  19.5 / 48.1 / 72.1 against 26.2 / 58.4 / 85.4 and 19.2 / 47.4 / 68.1 (benchmarks/small_gemm.py
  --weights model). On a Zen 4 the fp32 graph with it took one all-MiniLM-L6-v2 input of 8-64 tokens
  in 9.6 ms against 15.1 with oneDNN's AVX-512 GEMMs (ONNX Runtime 9.7; benchmarks/bench_engines.py,
  docs/speed.md). Without AVX2 and FMA it is F.linear.
* `bertkit::bertkit_bf16_linear(x, weight, bias)` (and `_gelu`), the Linears of the bf16 graph (recorded
  under autocast: bf16 rows and weights, a bf16 output) on a Zen 4 with AVX512_BF16 (`bf16_graphs`):
  the same panels of 16 columns in bf16, each step a pair of K values broadcast from a row and one
  VDPBF16PS per 8 columns (16 products into fp32 sums, twice an FMA's), plus the bias, through the
  exact GELU where asked, rounded to bf16 once, as autocast's Linear and oneDNN's GELU post-op give.
  There the bf16 graph's attention and residual + LayerNorm are the fp32 ops below (on its bf16
  projections, as autocast computes the LayerNorm in fp32). oneDNN's bf16 GEMMs at one request's row
  counts were no faster there than the fp32 graph's.
* `bertkit::bertkit_int8_linear(q, row_scale, weight, weight_scale, bias)`, the per-token int8
  Linears of the int8 graph (kernels/int8.RowInt8Linear) on CPUs with AMX: the int8 products summed
  on AMX tiles (TDPBSSD, exact int32 sums as oneDNN's `_int_mm` gives), the row's and the column's
  scale and the bias applied as the sums leave the tiles. torch's `_int_mm` has no AMX kernel on the
  CPU (oneDNN's VNNI one, with its per-call set-up); the op is 1.2-3.4x faster on the encoder's
  shapes (8-2048 rows, scales and bias included). On AVX2 CPUs without VNNI (or AMX), where oneDNN's
  int8 GEMM would saturate its int16 pair sums, an AVX2 kernel (VPMADDUBSW with the activation's
  sign moved onto the weight: the same exact int32 sums) on the ops' own threads (`avx2_int8`).
* `bertkit::bertkit_int8_linear_seven(x, weight, weight_scale, bias)`, what the int8 graph records
  there instead: the op quantises each fp32 row itself to 7-bit unsigned values (its range over 127
  steps, a zero point), which VPMADDUBSW multiplies as they are (fbgemm's `reduce_range` on such
  CPUs, per token here): three instructions per 32 products rather than five, 1.2-1.5x the exact
  kernel's speed on all-MiniLM-L6-v2's shapes (AMD EPYC Zen 3). On a Zen 4 (`vnni_int8`) the same op
  quantises each row to 8 bits (255 steps, `row_steps`) and sums with AVX512_VNNI's VPDPBUSD (unsigned
  8-bit values times signed ones, four products into an int32, exact): one instruction per 32
  products, on the ops' threads, where oneDNN's `_int_mm` took the int8 graph's GEMMs before.

* `bertkit::bertkit_attention(q, k, v, mask, heads)`, the fp32 attention of the fp32 and int8 graphs
  on CPUs with AVX-512 or AVX2 (recorded by kernels/layout.Padded): for up to 64 keys a head's scores stay
  in registers, four query rows at a time; torch's CPU flash attention spends ~70 µs per layer on one
  input of 40 tokens (all-MiniLM-L6-v2) in its blocks, buffers and a GEMM call per block, the op ~30.
  On AVX2 (8 keys per vector, 2-4 query rows at a time, K^T made by 8 x 8 transposes), on an AMD EPYC
  Zen 3: 37-60 µs per layer for one input of 36 tokens (78-103 with one row at a time, K^T element by
  element and the context's sums in memory) where torch's SDPA inside the op took 255. Longer sequences, other head sizes and CPUs go to torch's SDPA inside the op. The mask's values
  are segment ids: several inputs packed one after another in one row each attend within itself,
  so the graphs take a few inputs as one row of their real tokens (`graph_attention`). On AVX2 a
  sequence of 65-512 tokens runs a second kernel (a head's K^T and four rows' scores in a buffer):
  an eager all-MiniLM-L6-v2 batch of 32 inputs (16-128 tokens) spent 15% of its time in torch's
  flash attention.
* `bertkit::bertkit_add_norm(y, residual, weight, bias, eps)`, LayerNorm(y + residual): the end of each
  post-LN block in the graphs with the AVX2 ops (kernels/norm.add_norm), rows on the ops' threads, the
  row's 1 / sqrt(variance + eps) once per row. Inductor's loop recomputed it for every 8 values (a scalar
  division and square root, kept in the loop by errno's branch) on the calling thread alone: ~14 µs per
  all-MiniLM-L6-v2 LayerNorm of 36 rows, twelve a request (AMD EPYC Zen 3); the graphs 1.02-1.05x
  (benchmarks/compiled_gemm_ab.py --op norm).

The AVX2 GEMM op, and the attention op where it runs its AVX2 kernel or the graphs' kernels are these
(`team_graphs`), share their work on threads of their own (`Team` in graph_gemm.cpp), not torch's
OpenMP team, and the graph that records them keeps inductor's own loops on the calling thread
(compiled.py). libgomp splits a region evenly and waits
at its end for every thread, so the first regions of a lone request after a rest wait for a worker
that went to sleep; on the Team the caller and the workers claim items one at a time and the caller
waits only for items already claimed. On an AMD EPYC Zen 3, one all-MiniLM-L6-v2 input alternated
with the other engines (0.1 s of rest before each call): 14.5-15.2 ms against 20.0-20.6 on
libgomp, eight inputs packed 58.8 against 87.5 (benchmarks/bench_engines.py, docs/speed.md).

Each GEMM op packs a weight on its first call, kept by the weight's address (a graph's constants keep
theirs) and checked against a sample of its values; the packs stay for the process's life (a
server's one model; a process loading many compiled models keeps each one's) and hold a second copy
of the weights they pack (all-MiniLM-L6-v2's encoder Linears: ~11 MB at int8, ~42 MB at fp32). Building
takes a C++ compiler with AMX intrinsics (GCC 11 or clang 12 on): where it fails, the graphs keep
inductor's GEMMs, with one warning.

Measured (2-vCPU Xeon, Emerald Rapids; benchmarks/compiled_gemm_ab.py), each graph against the
same graph with inductor's GEMMs, one input of 8-64 tokens alternated, paired: fp32
all-MiniLM-L6-v2 1.13x after 0.1 s of rest and 1.11x back to back, BERT-base 1.09x (0.98-0.99x at
128-512 tokens, where the MKL op has no oneDNN fallback); int8 all-MiniLM-L6-v2 1.28x after 0.1 s
of rest and 1.45x back to back, BERT-base 1.39x (docs/speed.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import BertkitError

OP = "bertkit::bertkit_mkl_linear"
FMA_OP = "bertkit::bertkit_fma_linear"
INT8_OP = "bertkit::bertkit_int8_linear"
SEVEN_OP = "bertkit::bertkit_int8_linear_seven"
FMA_GELU_OP = "bertkit::bertkit_fma_linear_gelu"
SEVEN_GELU_OP = "bertkit::bertkit_int8_linear_seven_gelu"
# inductor names an op's C function aoti_torch_cpu_<op name>: the op's name keeps it clear of torch's own
SHIM = "aoti_torch_cpu_bertkit_mkl_linear"
SHIM_DECLARATION = f"AOTITorchError {SHIM}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle*, AtenTensorHandle*)"
FMA_SHIM = "aoti_torch_cpu_bertkit_fma_linear"
FMA_SHIM_DECLARATION = f"AOTITorchError {FMA_SHIM}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle*, AtenTensorHandle*)"
INT8_SHIM = "aoti_torch_cpu_bertkit_int8_linear"
INT8_SHIM_DECLARATION = (f"AOTITorchError {INT8_SHIM}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle, "
                         "AtenTensorHandle, AtenTensorHandle*, AtenTensorHandle*)")
SEVEN_SHIM = "aoti_torch_cpu_bertkit_int8_linear_seven"
SEVEN_SHIM_DECLARATION = (f"AOTITorchError {SEVEN_SHIM}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle, "
                          "AtenTensorHandle*, AtenTensorHandle*)")
# the same two through the exact GELU, for the feed-forward intermediate (its GELU on the ops' threads)
FMA_GELU_SHIM = "aoti_torch_cpu_bertkit_fma_linear_gelu"
FMA_GELU_SHIM_DECLARATION = FMA_SHIM_DECLARATION.replace(FMA_SHIM, FMA_GELU_SHIM)
SEVEN_GELU_SHIM = "aoti_torch_cpu_bertkit_int8_linear_seven_gelu"
SEVEN_GELU_SHIM_DECLARATION = SEVEN_SHIM_DECLARATION.replace(SEVEN_SHIM, SEVEN_GELU_SHIM)
# the bf16 graph's Linears (under autocast: bf16 rows and weights, bf16 outputs), plain and through the GELU
BF16_OP = "bertkit::bertkit_bf16_linear"
BF16_GELU_OP = "bertkit::bertkit_bf16_linear_gelu"
BF16_SHIM = "aoti_torch_cpu_bertkit_bf16_linear"
BF16_SHIM_DECLARATION = FMA_SHIM_DECLARATION.replace(FMA_SHIM, BF16_SHIM)
BF16_GELU_SHIM = "aoti_torch_cpu_bertkit_bf16_linear_gelu"
BF16_GELU_SHIM_DECLARATION = FMA_SHIM_DECLARATION.replace(FMA_SHIM, BF16_GELU_SHIM)
ATTENTION_OP = "bertkit::bertkit_attention"
ATTENTION_SHIM = "aoti_torch_cpu_bertkit_attention"
ATTENTION_SHIM_DECLARATION = (f"AOTITorchError {ATTENTION_SHIM}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle, "
                              "AtenTensorHandle*, int64_t, AtenTensorHandle*)")
ADD_NORM_OP = "bertkit::bertkit_add_norm"
ADD_NORM_SHIM = "aoti_torch_cpu_bertkit_add_norm"
ADD_NORM_SHIM_DECLARATION = (f"AOTITorchError {ADD_NORM_SHIM}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle, "
                             "AtenTensorHandle, double, AtenTensorHandle*)")

SOURCE_FILE = Path(__file__).with_name("graph_gemm.cpp")
CACHE_ENV = "BERTKIT_COMPILE_CACHE"
# How long the ops' own threads (a compiled graph's: graph_gemm.cpp, Team) spin after a call before
# they sleep, in ms; the library's default where unset (30: docs/speed.md)
SPIN_ENV = "BERTKIT_SPIN_MS"

log = logging.getLogger("bertkit")


def cache_dir() -> Path:
    """The compile cache folder, where the ops' library is built (and inference/compiled.py keeps its
    packages): `BERTKIT_COMPILE_CACHE`, default `$XDG_CACHE_HOME/bertkit/compiled`."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "bertkit" / "compiled"


def source_text() -> str:
    text = SOURCE_FILE.read_text(encoding="utf-8")
    text = text.replace("SHIM_FMA_GELU", FMA_GELU_SHIM).replace("SHIM_SEVEN_GELU", SEVEN_GELU_SHIM)  # before their prefixes
    text = text.replace("SHIM_BF16_LINEAR", BF16_SHIM).replace("SHIM_BF16_GELU", BF16_GELU_SHIM)
    return text.replace("SHIM_MKL", SHIM).replace("SHIM_FMA", FMA_SHIM).replace("SHIM_INT8", INT8_SHIM) \
        .replace("SHIM_SEVEN", SEVEN_SHIM).replace("SHIM_ATTENTION", ATTENTION_SHIM).replace("SHIM_ADD_NORM", ADD_NORM_SHIM)


_lock = threading.Lock()
_loaded: list[Path] = []
_recording = threading.local()


def applies(model: torch.nn.Module) -> bool:
    """Whether a compiled fp32 graph of `model` records its Linears as this op: torch has MKL, and
    the model's options take MKL's pack for few rows (`mkl_rows`, per CPU class)."""
    from .options import mkl_available

    held = [getattr(m, "kernels", None) for m in model.modules()]
    return mkl_available() and any(options is not None and options.mkl_rows > 0 for options in held)


def team_graphs(folder: Path) -> bool:
    """Whether the compiled graphs' GEMMs are bertkit's 256-bit ops on the ops' own threads here (fp32,
    and int8 without AMX), their attention and their residual + LayerNorm too: CPUs whose vector units
    are 256 bits wide, AVX2 without AVX-512 (the avx2 class) or AMD's Zen 4, which runs an AVX-512
    instruction as two halves; there oneDNN's GEMMs ran at about half the FMA peak at one request's row
    counts (graph_gemm.cpp, `team_graphs`). Builds and loads the ops first. Raises RuntimeError as
    load() does."""
    load(folder)
    return bool(torch.ops.bertkit.bertkit_team_graphs())


def load(folder: Path) -> Path:
    """Build the op's library into `folder` unless it is there, and load it (once per process).
    Raises RuntimeError (no compiler, a failed build)."""
    with _lock:
        if _loaded:
            return _loaded[0]
        # torch's folder too: the library is linked to that installation's libraries (their paths)
        facts = f"{source_text()}{torch.__version__}{torch._C._GLIBCXX_USE_CXX11_ABI}{Path(torch.__file__).parent}"
        path = folder / f"bertkit_graph_gemm-{hashlib.sha256(facts.encode()).hexdigest()[:16]}.so"
        spin = spin_ms()  # a bad value refused before the build (~20 s) and the load
        if not path.is_file():
            _build(path)
        # Global, so that a compiled package finds the C function when it is loaded.
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        _register_fake()
        if spin is not None:
            torch.ops.bertkit.bertkit_set_team_spin(spin)
        _loaded.append(path)
        return path


def spin_ms() -> int | None:
    """`BERTKIT_SPIN_MS`: how long the ops' threads spin after a call before they sleep (whole ms, 0
    to 60000); None where it is unset."""
    text = os.environ.get(SPIN_ENV, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > 60000:  # ascii: int() refuses '²'
        raise BertkitError(f"{SPIN_ENV} must be a whole number of milliseconds from 0 to 60000, not {text!r}")
    return int(text)


_eager: list[bool] = []


def eager_ops() -> bool:
    """Whether eager fp32 inference may call the AVX2 GEMM op and the attention op here
    (`KernelOptions.packed_weights` "bertkit", `attention_op`): the CPU has AVX2 and FMA and the ops
    are built (once per torch installation, into the compile cache folder; ~20 s) and loaded. Decided once
    per process; False, with one warning, where they cannot be built (no C++ compiler): the oneDNN
    packs and torch's attention run instead."""
    if not _eager:
        try:
            usable = fma_usable(cache_dir()) and short_attention(cache_dir())
        except (RuntimeError, OSError) as e:
            text = str(e).strip().splitlines()
            log.warning(f"bertkit's AVX2 ops unavailable ({text[0][:200] if text else type(e).__name__}); "
                        "inference uses oneDNN's GEMMs and torch's attention")
            usable = False
        _eager.append(usable)
    return _eager[0]


def eager_seven() -> bool:
    """Whether eager int8 inference may run its Linears on the 7-bit AVX2 int8 op here
    (kernels/int8.py, `seven_bit`): the AVX2 ops are usable (`eager_ops`) and the CPU has neither VNNI
    nor AMX (`avx2_int8`). Decided once per process."""
    return eager_ops() and bool(torch.ops.bertkit.bertkit_avx2_int8())


def loaded_name() -> str | None:
    """The file name of the library this process loaded (its source's hash), if any."""
    return _loaded[0].name if _loaded else None


def _build(path: Path) -> None:
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++ or g++, or $CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # ".compiling-": the compile cache deletes such folders left by a killed process (compiled.prune_cache)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".compiling-") as work:
        source, objects, library = Path(work) / "graph_gemm.cpp", Path(work) / "graph_gemm.o", Path(work) / path.name
        source.write_text(source_text(), encoding="utf-8")
        # OpenMP for at::parallel_for (its threads are torch's own: see _openmp_library)
        compile_ = [compiler, "-O2", "-fPIC", "-std=c++17", "-w", "-fopenmp", "-c",
                    f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
        compile_ += [f"-I{folder}" for folder in cpp_extension.include_paths()]
        link = [compiler, "-shared", str(objects), "-o", str(library)]
        for folder in cpp_extension.library_paths():
            link += [f"-L{folder}", f"-Wl,-rpath,{folder}"]
        link += ["-lc10", "-ltorch_cpu", "-ltorch", _openmp_library()]
        for command in (compile_ + [str(source), "-o", str(objects)], link):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise RuntimeError(f"building the GEMM ops failed: {last[:300]}")
        os.replace(library, path)  # whole or not at all


def _openmp_library() -> str:
    """The OpenMP runtime torch itself loads: a wheel's own copy in torch/lib (by path, so the
    library names that copy however the wheel renamed it), else the system's. A second runtime
    would bring a second team of threads competing for the same cores."""
    from torch.utils import cpp_extension

    for folder in cpp_extension.library_paths():
        found = sorted(Path(folder).glob("libgomp*.so*"))
        if found:
            return str(found[0])
    return "-lgomp"


def _register_fake() -> None:
    @torch.library.register_fake(OP)
    def _(x, weight, bias):
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    @torch.library.register_fake(FMA_OP)
    def _(x, weight, bias):
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    @torch.library.register_fake(INT8_OP)
    def _(q, row_scale, weight, weight_scale, bias):
        return q.new_empty(q.shape[0], weight.shape[1], dtype=torch.float32)

    @torch.library.register_fake(SEVEN_OP)
    def _(x, weight, weight_scale, bias):
        return x.new_empty(x.shape[0], weight.shape[1])

    @torch.library.register_fake(FMA_GELU_OP)
    def _(x, weight, bias):
        return x.new_empty(*x.shape[:-1], weight.shape[0])

    @torch.library.register_fake(SEVEN_GELU_OP)
    def _(x, weight, weight_scale, bias):
        return x.new_empty(x.shape[0], weight.shape[1])

    @torch.library.register_fake(BF16_OP)
    def _(x, weight, bias):
        return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=torch.bfloat16)

    @torch.library.register_fake(BF16_GELU_OP)
    def _(x, weight, bias):
        return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=torch.bfloat16)

    @torch.library.register_fake(ATTENTION_OP)
    def _(q, k, v, mask, heads):
        return q.new_empty(q.shape)

    @torch.library.register_fake(ADD_NORM_OP)
    def _(y, residual, weight, bias, eps):
        return y.new_empty(y.shape)


@contextlib.contextmanager
def recording(mkl: bool = True, int8: bool = False, attention: bool = False, fma: bool = False, seven: bool = False,
              gelu: bool = True, norm: bool = False, bf16: bool = False):
    """While a model is exported inside this block, its fp32 Linears (kernels.linear) record the MKL
    op when `mkl`, the AVX2 / FMA op when `fma`, its per-token int8 Linears (kernels/int8.RowInt8Linear) the int8 op when `int8`,
    the 7-bit int8 op (their rows quantised by the op) when `seven` (with `gelu`, a feed-forward
    intermediate the AVX2 / FMA or 7-bit op that applies the GELU itself, else inductor's GELU after it),
    its fp32 padded attention (kernels/layout.Padded) the attention op when `attention`, its residual +
    LayerNorm blocks (kernels/norm.add_norm) the residual + LayerNorm op when `norm`, and under bf16
    autocast its Linears the bf16 op when `bf16` (load() first); inductor is told to call them through
    their C functions."""
    import torch._inductor.config as inductor_config

    ops = torch.ops.bertkit
    shims = {op.default: [declaration] for op, declaration, used in (
        (ops.bertkit_mkl_linear, SHIM_DECLARATION, mkl), (ops.bertkit_fma_linear, FMA_SHIM_DECLARATION, fma),
        (ops.bertkit_fma_linear_gelu, FMA_GELU_SHIM_DECLARATION, fma and gelu),
        (ops.bertkit_bf16_linear, BF16_SHIM_DECLARATION, bf16),
        (ops.bertkit_bf16_linear_gelu, BF16_GELU_SHIM_DECLARATION, bf16 and gelu),
        (ops.bertkit_int8_linear, INT8_SHIM_DECLARATION, int8),
        (ops.bertkit_int8_linear_seven, SEVEN_SHIM_DECLARATION, seven),
        (ops.bertkit_int8_linear_seven_gelu, SEVEN_GELU_SHIM_DECLARATION, seven and gelu),
        (ops.bertkit_attention, ATTENTION_SHIM_DECLARATION, attention),
        (ops.bertkit_add_norm, ADD_NORM_SHIM_DECLARATION, norm)) if used}
    _recording.mkl, _recording.fma, _recording.int8, _recording.attention = mkl, fma, int8, attention
    _recording.seven, _recording.gelu, _recording.norm, _recording.bf16 = seven, gelu, norm, bf16
    try:
        with inductor_config.patch({"aot_inductor.custom_ops_to_c_shims": shims}):
            yield
    finally:
        _recording.mkl = _recording.fma = _recording.int8 = _recording.attention = _recording.seven = False
        _recording.norm = _recording.bf16 = False
        _recording.gelu = True


def is_recording() -> bool:
    """Inside `recording(mkl=True)` or `recording(fma=True)`: fp32 Linears record a GEMM op of bertkit's."""
    return getattr(_recording, "mkl", False) or getattr(_recording, "fma", False)


def is_recording_bf16() -> bool:
    """Inside `recording(bf16=True)`: Linears under bf16 autocast record the bf16 op."""
    return getattr(_recording, "bf16", False)


def is_recording_int8() -> bool:
    """Inside `recording(int8=True)`: per-token int8 Linears record the int8 op."""
    return getattr(_recording, "int8", False)


def is_recording_seven() -> bool:
    """Inside `recording(seven=True)`: per-token int8 Linears record the 7-bit int8 op."""
    return getattr(_recording, "seven", False)


def is_recording_attention() -> bool:
    """Inside `recording(attention=True)`: fp32 padded attention records the attention op."""
    return getattr(_recording, "attention", False)


def is_recording_norm() -> bool:
    """Inside `recording(norm=True)`: residual + LayerNorm blocks record the residual + LayerNorm op."""
    return getattr(_recording, "norm", False)


def amx_int8(folder: Path) -> bool:
    """Whether the int8 op runs on AMX tiles here (the CPU has AMX-INT8 and Linux lets this process
    use them); builds and loads the ops first. Raises RuntimeError as load() does."""
    load(folder)
    return bool(torch.ops.bertkit.bertkit_amx_int8())


def avx2_int8(folder: Path) -> bool:
    """Whether the int8 op runs its AVX2 kernel here (AVX2 without VNNI or AMX, where oneDNN's int8
    GEMM would saturate its int16 pair sums); builds and loads the ops first. Raises RuntimeError as
    load() does."""
    load(folder)
    return bool(torch.ops.bertkit.bertkit_avx2_int8())


def vnni_int8(folder: Path) -> bool:
    """Whether the row-quantising int8 op (`bertkit_int8_linear_seven`) sums with AVX512_VNNI here: the
    graphs' kernels are the ops' own (`team_graphs`) on a CPU with AVX512_VNNI (a Zen 4), its rows
    quantised to 8 bits rather than 7 (`row_steps`); builds and loads the ops first. Raises
    RuntimeError as load() does."""
    load(folder)
    return bool(torch.ops.bertkit.bertkit_vnni_int8())


def row_steps(folder: Path) -> int:
    """The steps of a row quantised by the row-quantising int8 op here: 255 with VNNI (`vnni_int8`),
    else 127; builds and loads the ops first."""
    load(folder)
    return int(torch.ops.bertkit.bertkit_int8_row_steps())


def own_int8(folder: Path) -> bool:
    """Whether the int8 graph's GEMMs run a kernel of bertkit's here (AMX tiles, AVX512_VNNI on the
    ops' threads, or AVX2 without VNNI) rather than oneDNN's `_int_mm`; builds and loads the ops first.
    Raises RuntimeError as load() does."""
    return amx_int8(folder) or vnni_int8(folder) or avx2_int8(folder)


def short_attention(folder: Path) -> bool:
    """Whether the attention op runs its own kernel here (AVX-512, else AVX2 + FMA) rather than torch's SDPA; builds
    and loads the ops first. Raises RuntimeError as load() does."""
    load(folder)
    return bool(torch.ops.bertkit.bertkit_short_attention())


def fma_usable(folder: Path) -> bool:
    """Whether the AVX2 / FMA op runs its own kernel here (the CPU has AVX2 and FMA); builds and
    loads the ops first. Raises RuntimeError as load() does."""
    load(folder)
    return bool(torch.ops.bertkit.bertkit_fma_usable())


def graph_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The fp32 GEMM op being recorded (`recording()`: MKL's or the AVX2 / FMA one), for an fp32 Linear."""
    if getattr(_recording, "fma", False):
        return torch.ops.bertkit.bertkit_fma_linear(x, weight, bias)
    return torch.ops.bertkit.bertkit_mkl_linear(x, weight, bias)


def graph_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GELU(`graph_linear`): with the AVX2 / FMA op the GELU is applied as its sums are stored, on the
    ops' threads (inductor's GELU loop ran on the calling thread alone between two GEMMs)."""
    if getattr(_recording, "fma", False) and getattr(_recording, "gelu", True):
        return torch.ops.bertkit.bertkit_fma_linear_gelu(x, weight, bias)
    return F.gelu(graph_linear(x, weight, bias))


def graph_linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      gelu: bool = False) -> torch.Tensor:
    """The bf16 op being recorded (`recording(bf16=True)`), for a Linear under bf16 autocast: bf16
    operands as autocast makes them, a bf16 output; with `gelu` (and the recording's `gelu`) the exact
    GELU applied to the sums before rounding, as oneDNN's GELU post-op does in the eager bf16 path."""
    operands = (x.to(torch.bfloat16), weight.to(torch.bfloat16), None if bias is None else bias.to(torch.bfloat16))
    if gelu and getattr(_recording, "gelu", True):
        return torch.ops.bertkit.bertkit_bf16_linear_gelu(*operands)
    out = torch.ops.bertkit.bertkit_bf16_linear(*operands)
    return F.gelu(out) if gelu else out


def bf16_graphs(folder: Path) -> bool:
    """Whether the bf16 graph's Linears are bertkit's bf16 op here: its kernels are the Team's
    (`team_graphs`: a Zen 4) and the CPU has AVX512_BF16; builds and loads the ops first. Raises
    RuntimeError as load() does."""
    load(folder)
    return bool(torch.ops.bertkit.bertkit_bf16_usable())


def fma_pack(weight: torch.Tensor) -> torch.Tensor:
    """An (N, K) fp32 weight packed for `eager_linear` (`eager_ops()` first): held by the caller."""
    return torch.ops.bertkit.bertkit_fma_pack(weight)


def eager_linear(x: torch.Tensor, pack: torch.Tensor, n: int, bias: torch.Tensor | None,
                 gelu: bool = False) -> torch.Tensor:
    """x @ W.T + b from W's `fma_pack` (N outputs), then the exact GELU with `gelu` (applied as the
    sums are stored), for an eager model: the AVX2 / FMA GEMM op with its items on torch's threads,
    as the model's other ops (graph_gemm.cpp, run_items)."""
    return torch.ops.bertkit.bertkit_fma_linear_packed(x, pack, n, bias, gelu)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    heads: int) -> torch.Tensor:
    """`graph_attention` for an eager model (`eager_ops()` first): its items on torch's threads."""
    return torch.ops.bertkit.bertkit_attention_eager(q, k, v, mask, heads)


def graph_int8_linear(quantised: torch.Tensor, row_scale: torch.Tensor, weight: torch.Tensor,
                      weight_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The int8 op, for a per-token int8 Linear recorded inside `recording(int8=True)`: (N, in) int8
    rows, their (N, 1) scales, the (in, out) int8 weight, its (out,) scales -> (N, out) fp32."""
    return torch.ops.bertkit.bertkit_int8_linear(quantised, row_scale, weight, weight_scale, bias)


def graph_int8_linear_seven(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                            bias: torch.Tensor | None, gelu: bool = False) -> torch.Tensor:
    """The 7-bit int8 op, for a per-token int8 Linear recorded inside `recording(seven=True)`: (N, in)
    fp32 rows, each quantised by the op to 7 bits (unsigned, with a zero point), the (in, out) int8
    weight, its (out,) scales -> (N, out) fp32; through the exact GELU with `gelu` (applied by the op
    as it stores its outputs, on its own threads)."""
    if gelu and getattr(_recording, "gelu", True):
        return torch.ops.bertkit.bertkit_int8_linear_seven_gelu(x, weight, weight_scale, bias)
    y = torch.ops.bertkit.bertkit_int8_linear_seven(x, weight, weight_scale, bias)
    return F.gelu(y) if gelu else y


def seven_pack(weight: torch.Tensor) -> torch.Tensor:
    """An (in, out) int8 weight (any strides) packed for `eager_int8_seven` (`eager_seven()` first),
    with its columns' sums: held by the caller."""
    return torch.ops.bertkit.bertkit_seven_pack(weight)


def eager_int8_seven(x: torch.Tensor, pack: torch.Tensor, n: int, weight_scale: torch.Tensor,
                     bias: torch.Tensor | None, gelu: bool = False) -> torch.Tensor:
    """`graph_int8_linear_seven` for an eager model: (..., in) fp32 -> (..., n), from the weight's
    `seven_pack`, its items on torch's threads; through the exact GELU with `gelu`, as the graph's op."""
    return torch.ops.bertkit.bertkit_int8_linear_seven_packed(x, pack, n, weight_scale, bias, gelu)


def graph_add_norm(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """The residual + LayerNorm op, recorded inside `recording(norm=True)`: LayerNorm(y + residual) over
    the last dimension with `weight`, `bias` and `eps`, each row on the ops' threads."""
    return torch.ops.bertkit.bertkit_add_norm(y, residual, weight, bias, eps)


def graph_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    heads: int) -> torch.Tensor:
    """The attention op, for fp32 attention recorded inside `recording(attention=True)`: (B, T, H)
    query, key and value and `mask`, (B, T) segment ids -> (B, T, H). Each run of one nonzero id in a
    row is a sequence attending only to itself (inputs packed one after another); 0 is padding,
    whose rows come out zero. A 1 / 0 attention mask is one sequence per row; None, no padding."""
    return torch.ops.bertkit.bertkit_attention(q, k, v, mask, heads)
