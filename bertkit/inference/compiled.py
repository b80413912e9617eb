"""A lone input (at bf16 and int8 up to four, at int8 on AMX up to eight; 2-8 packed in one row where
the graph packs) through a graph compiled ahead for this model on this CPU (issue 39, opt-in:
`InferenceEngine(..., compile=True)`, `bertkit serve --compile`, `pipeline(..., compile=True)`; not
`predict`, whose files run in batches).

One request to a small encoder spends a good part of its time between kernels: a dozen dispatched
ops per layer, each a few microseconds of Python and framework, and elementwise work (the
residual adds, LayerNorms, the embeddings' sums) as separate passes. The eager engine cannot shed
that; a compiled graph does. torch.export records the model (its plain path: F.linear, SDPA with
the padding mask, `kernels.exporting()`) with the batch size (1-4) and the length (2 to the
model's limit) dynamic, one graph for all of them, and AOTInductor compiles it with freezing
(weights folded in as constants, packed for oneDNN, elementwise ops fused) into a shared library,
packaged as a `.pt2` file. At fp32, where the model's options take MKL for calls of a few rows
(`mkl_rows`, Intel CPUs with AMX / AVX512_BF16), the encoder's Linears are recorded as bertkit's
MKL op instead (kernels/graph_gemm.py: 1.07-1.16x on all-MiniLM-L6-v2's lone inputs); on CPUs
whose widest vector unit is AVX2, bertkit's AVX2 / FMA GEMM op (`fma_gemm`: 1.2-1.3x oneDNN's GEMMs
at 8-64 rows), which with the attention op runs on the ops' own threads, inductor's loops on the
calling thread (no OpenMP region waits for a sleeping worker: graph_gemm.cpp, Team); at fp32 and
int8 on CPUs with AVX-512 or AVX2, the attention of up to 64 tokens is bertkit's attention op rather than torch's flash attention (the same module; `attention_op`). At bf16 the
model is recorded under bf16 autocast, so the graph holds the eager bf16 path's casts (weights
folded to bf16, AMX / AVX512_BF16 GEMMs). The engine pads
inputs to its length buckets (a lone one to a multiple of 8), as the eager path, so the GEMMs meet
a bounded set of row counts, whose oneDNN kernels `warm_up` makes (a new row count costs a few ms
the first time). Padded, the graph computes the padding where the eager engine unpads, so it takes
a padded batch only while that pays (`batch_limit`). Where its attention and its GEMMs are
bertkit's own ops (`packs`), 2-8 inputs instead go in one row of their real tokens, the mask numbering
them and the positions restarting at each (batching.pack_rows): the attention op attends within
each, and the GEMMs make nothing per row count; a classifier's graph also takes where each input
starts, for its pooler (`pools`). Measured on a 2-vCPU Xeon (AVX-512, AMX),
all-MiniLM-L6-v2, one input of 8-64 tokens alternated against the eager engine: fp32 1.17-1.27x,
bf16 1.49-1.66x; 2-8 packed inputs at fp32 1.2-1.4x (docs/speed.md).

Compiling takes tens of seconds (MiniLM 20-40 s on 2 cores) and a C++ compiler, so it is done once
per model, CPU and thread count and kept in a cache folder (`BERTKIT_COMPILE_CACHE`, default
`$XDG_CACHE_HOME/bertkit/compiled`); later processes load the package in a fraction of a second.
The folder is kept under `BERTKIT_COMPILE_CACHE_GB` (default 5): making a package deletes the least
recently used ones past that size.
The key is a hash of the weights' bytes, the config, the outputs asked for, the length limit, the
precision, torch's version, the CPU's instruction sets and the thread count (the generated kernels
are built for those), and bertkit's own source (what the graph records). fp32 or bf16 on the CPU:
the numbers are the eager model's within float rounding at fp32 (tested within 1e-4), within
bf16's rounding at bf16.

At int8 (`--quantize int8 --compile`, a CPU with VNNI, or AVX2 for bertkit's AVX2 int8 op) the
graph is made from the engine's int8
model: the same int8 weights, but the packed fbgemm layers and their per-call outlier split cannot
be exported, so the graph quantises each token's activations with its own scale
(kernels/int8.RowInt8Linear) and runs oneDNN's int8 GEMM (`torch._int_mm`) between fused loops; on
a CPU with AMX, bertkit's AMX int8 op instead (kernels/graph_gemm.py: the same int32 sums, 1.3-1.5x
on all-MiniLM-L6-v2's lone inputs); on AVX2 without VNNI, where oneDNN's int8 pair sums would
saturate, bertkit's AVX2 int8 op on the ops' own threads, whose activations are 7-bit (the op
quantises each token's row over its own range, with a zero point: fbgemm's `reduce_range` on such
CPUs, per token), 1.15x paired the exact 8-bit AVX2 op it keeps for `seven_bit=False`. Its numbers are that per-token scheme's, not the eager int8
engine's per-tensor ones; its accuracy on fine-tuned MRPC and SST-2 is in docs/speed.md
(benchmarks/int8_accuracy.py --compiled).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ..device import cpu_features
from ..errors import BertkitError
from ..kernels import graph_gemm
from ..kernels.graph_gemm import CACHE_ENV, cache_dir
from ..kernels.int8 import Int8Linear, int8_for_graph
from ..version import __version__
from .export import _Exported

log = logging.getLogger("bertkit")

CACHE_LIMIT_ENV = "BERTKIT_COMPILE_CACHE_GB"
# Packages hold their model's weights (all-MiniLM-L6-v2 ~60-90 MB, BERT-base ~0.45 GB) and every new
# model, precision, thread count or bertkit version adds one: past this size the least recently
# used go when a new one is made.
CACHE_LIMIT_GB = 5.0
STALE_WORK_SECONDS = 24 * 3600
PRECISIONS = ("fp32", "bf16", "int8")
# The most inputs a call sends through the graph, per precision. It computes on the padded batch
# (the eager engine unpads): past these sizes the padding costs more than the per-op work saved
# (MiniLM, paired against eager: fp32 1.05x at 2 inputs, 0.86x at 4; bf16 1.35x at 2, 1.14x at 4,
# 0.91x at 8; int8 1.47x at 2, 1.22x at 4, BERT-base 1.38x, 1.13x; docs/speed.md).
BATCH_LIMIT = {"fp32": 1, "bf16": 4, "int8": 4}
# int8 with bertkit's AMX GEMM (kernels/graph_gemm.py) pays longer: all-MiniLM-L6-v2 1.70x the eager
# int8 engine at 4 inputs, 1.40x at 8, 1.12x at 16, 0.93x at 32; BERT-base 0.97x at 8, 0.81x at 16
# (paired, 0.1 s of rest). So 8 inputs at MiniLM's width (384), scaled down with the width, never
# below BATCH_LIMIT's 4.
AMX_INT8_BATCH_LIMIT, AMX_INT8_WIDTH = 8, 384
MIN_BATCH_DIM = 4  # the graph's batch dimension spans at least 1-4: as fast at one input as a graph for one
MIN_LENGTH = 2  # [CLS] and [SEP]: export specialises lengths 0 and 1, which no tokenized input has
PACKED_INPUTS = 8  # the most inputs the engine packs in one row (more run its unpadded eager path)


def cache_limit_bytes() -> int:
    text = os.environ.get(CACHE_LIMIT_ENV, "").strip()
    if not text:
        return int(CACHE_LIMIT_GB * 1e9)
    try:
        limit = float(text)
    except ValueError:
        limit = -1.0
    if not limit >= 0 or limit == float("inf"):
        raise BertkitError(f"{CACHE_LIMIT_ENV} must be a size in GB (a number, 0 or more), not {text!r}")
    return int(limit * 1e9)


def prune_cache(folder: Path, keep: Path, limit: int) -> list[Path]:
    """Delete the least recently used packages in `folder` (by modification time: a load touches
    its package) until the rest total at most `limit` bytes; `keep`, the package just made, stays
    whatever its size. Also deletes the work folders of compiles killed over a day ago. Returns the
    packages deleted; a file that cannot be deleted is left, and said."""
    packages = []
    for path in folder.glob("*.pt2"):
        try:
            stat = path.stat()
        except OSError:  # deleted meanwhile by another process
            continue
        packages.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in packages)
    removed = []
    for _, size, path in sorted(packages, key=lambda item: item[0]):
        if total <= limit:
            break
        if path == keep:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning(f"compile cache: cannot delete {path} ({e.strerror})")
            continue
        total -= size
        removed.append(path)
    for work in folder.glob(".compiling-*"):  # left by a compile that was killed (a live one is minutes old)
        try:
            if time.time() - work.stat().st_mtime > STALE_WORK_SECONDS:
                shutil.rmtree(work)
        except OSError:
            pass
    if removed:
        log.warning(f"compile cache over {limit / 1e9:g} GB ({CACHE_LIMIT_ENV}): deleted {len(removed)} least recently "
                    f"used package(s) from {folder}")
    return removed


def _mark_used(path: Path) -> None:
    """A loaded package is the most recently used one (prune_cache deletes the least recent)."""
    try:
        os.utime(path)
    except OSError:  # a read-only cache folder: nothing will be pruned there either
        pass


def batch_limit(precision: str, hidden_size: int, amx_int8_gemm: bool = False) -> int:
    """The most inputs one call sends through the graph (`BATCH_LIMIT`; int8 with the AMX GEMM op:
    `AMX_INT8_BATCH_LIMIT` at width 384, fewer for wider models, never under BATCH_LIMIT's)."""
    if precision == "int8" and amx_int8_gemm:
        scaled = AMX_INT8_BATCH_LIMIT * AMX_INT8_WIDTH // hidden_size
        return min(AMX_INT8_BATCH_LIMIT, max(BATCH_LIMIT["int8"], scaled))
    return BATCH_LIMIT[precision]


@dataclasses.dataclass(frozen=True)
class GraphOps:
    """Which of bertkit's ops (kernels/graph_gemm.py) a compiled graph records: MKL's fp32 GEMM, the
    AVX2 / FMA fp32 GEMM, the int8 GEMM (its form that quantises the rows itself where `seven`: 7 bits,
    8 with VNNI), the attention op, the GEMM op's GELU, the residual + LayerNorm op, the bf16 GEMM;
    `avx2_ops`: its GEMMs are the Team's 256-bit ones (on the ops' threads)."""

    mkl_gemm: bool = False
    fma_gemm: bool = False
    int8_gemm: bool = False
    seven: bool = False
    avx2_ops: bool = False
    attention_op: bool = False
    gelu_op: bool = False
    norm_op: bool = False
    bf16_gemm: bool = False


def cache_key(model: torch.nn.Module, output_names: tuple[str, ...], max_length: int, precision: str = "fp32",
              ops: GraphOps = GraphOps(), batch_dim: int = MIN_BATCH_DIM) -> str:
    """What the compiled package depends on, hashed: change any of it and a new one is made. (At
    int8, `model` is the graph's copy, `int8_for_graph`: its state dict holds the int8 weights.)"""
    features = cpu_features()
    mkl_gemm, fma_gemm, int8_gemm, seven, attention_op = ops.mkl_gemm, ops.fma_gemm, ops.int8_gemm, ops.seven, ops.attention_op
    facts = {"bertkit": __version__, "torch": torch.__version__, "machine": platform.machine(),
             "cpu": [features.cpu_class, features.avx512, features.bf16, features.amx, features.vnni, features.vendor],
             "threads": torch.get_num_threads(), "model": type(model).__name__,
             "config": model.config.to_dict() if hasattr(model.config, "to_dict") else repr(model.config),
             "outputs": list(output_names), "max_length": max_length, "precision": precision,
             "gemm": "mkl op" if mkl_gemm else "fma op" if fma_gemm else "bf16 op" if ops.bf16_gemm
             else "row int8 op" if seven else "int8 op" if int8_gemm else "inductor's",
             # the ops' library (its name holds its source's hash): a package calls its C functions
             "ops": graph_gemm.loaded_name() if mkl_gemm or fma_gemm or int8_gemm or attention_op or ops.bf16_gemm
             else None,
             "attention": "bertkit op" if attention_op else "sdpa",
             "loops": "calling thread" if (fma_gemm or ops.avx2_ops) and attention_op else "openmp",
             "gelu": "gemm op" if ops.gelu_op else "inductor's",
             "residual + layernorm": "bertkit op" if ops.norm_op else "inductor's",
             # what each module computes (the state dict names the tensors, not the code around them)
             "modules": [f"{name}:{type(module).__qualname__}" for name, module in model.named_modules()],
             # ... and the code they run: a change to bertkit's source within a version is another graph
             "source": _source_digest(),
             "batch": [1, batch_dim]}
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}:{tensor.stride()}".encode())  # the layout is compiled in
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """A hash of bertkit's own source (its .py files and the ops' C++): what a graph records."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".cpp") and path.is_file():
            digest.update(path.relative_to(package).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class CompiledLoneInput:
    """`(input_ids, attention_mask, token_type_ids)` of a few inputs, each (B, T) with B at most
    `max_batch` (1 at fp32, 4 at bf16 and int8, up to 8 at int8 on AMX: `batch_limit`) -> the head's outputs
    (a tuple, in `output_names` order), from the cached package, compiled first if there is none;
    where `packs`, several inputs in one row (`__call__`).
    `precision` "bf16": recorded and compiled under bf16 autocast (the outputs come back as the
    eager bf16 path gives them); "int8": `model` is a quantize_int8 model, recorded per token
    (kernels/int8.int8_for_graph). `gemm_ops` False: inductor's GEMMs even where bertkit's own
    (kernels/graph_gemm.py) apply; `attention_op` False: torch's SDPA rather than bertkit's
    attention for short inputs (fp32 and int8 graphs on AVX-512 and AVX2 CPUs); `seven_bit` False: on
    AVX2 without VNNI the exact 8-bit int8 op rather than the 7-bit one; `gelu_op` / `norm_op` False:
    with the AVX2 ops, inductor's GELU / residual + LayerNorm loops rather than bertkit's; the A/Bs in
    benchmarks/compiled_gemm_ab.py."""

    def __init__(self, model: torch.nn.Module, output_names: tuple[str, ...], max_length: int,
                 precision: str = "fp32", gemm_ops: bool = True, attention_op: bool = True, seven_bit: bool = True,
                 gelu_op: bool = True, norm_op: bool = True):
        _check_can_compile(model, precision)
        if max_length < MIN_LENGTH + 1:
            raise BertkitError(f"compile needs a length limit above {MIN_LENGTH}, not {max_length}")
        self.precision = precision
        if precision == "int8":  # the int8 layers as exportable ops; the copy goes once compiled
            model = int8_for_graph(model)
        self.output_names, self.max_length = tuple(output_names), max_length
        folder = cache_dir()
        self.mkl_gemm = gemm_ops and precision == "fp32" and graph_gemm.applies(model) and _mkl_op_loaded(folder)
        # bertkit's own AVX2 / FMA GEMM where the CPU's vector units are 256 bits wide (AVX2 only, or a
        # Zen 4: graph_gemm.team_graphs; oneDNN's is slower there)
        self.fma_gemm = gemm_ops and precision == "fp32" and not self.mkl_gemm and _fma_op_loaded(folder)
        self.int8_gemm = gemm_ops and precision == "int8" and _own_int8_op(folder)
        # At bf16 on a Zen 4 with AVX512_BF16: bertkit's bf16 GEMM on the ops' threads (VDPBF16PS), where
        # oneDNN's bf16 GEMMs were no faster than the fp32 graph at one request's rows
        self.bf16_gemm = gemm_ops and precision == "bf16" and _bf16_op_loaded(folder)
        # On AVX2 without VNNI, activations of 7 bits (the op quantises each row): 1.4-1.5x the exact
        # 8-bit kernel's speed (kernels/graph_gemm.cpp); `seven_bit` False keeps the 8-bit op there.
        # With AVX512_VNNI on the ops' threads (a Zen 4) the same op quantises each row to 8 bits.
        self.vnni = self.int8_gemm and graph_gemm.vnni_int8(folder)
        self.seven = self.int8_gemm and not cpu_features().amx and (seven_bit or self.vnni)
        # The AVX2 GEMMs (fp32, and int8 without VNNI) run on the ops' own threads (graph_gemm.cpp, Team)
        self.avx2_ops = self.fma_gemm or (self.int8_gemm and not cpu_features().amx) or self.bf16_gemm
        # Their feed-forward intermediate applies the exact GELU as it stores its outputs, on the ops'
        # threads (inductor's GELU loop ran on the calling thread alone; `gelu_op` False keeps it)
        self.gelu_op = gelu_op and (self.fma_gemm or self.seven or self.bf16_gemm)
        # ... and each block's residual + LayerNorm is an op of bertkit's on those threads too (inductor's
        # loop recomputed the row's 1 / sqrt(variance + eps) for every 8 values, on the calling thread alone)
        self.norm_op = norm_op and self.avx2_ops
        # With bertkit's AVX2 GEMMs nothing in the graph is made per row count (inductor's loops take
        # any length): a lone input goes at its own length rather than padded to a multiple of 8
        self.shapes_free = self.avx2_ops
        self.attention_op = attention_op and uses_attention_op(precision, folder, self.bf16_gemm)
        # The attention op reads the mask as segment ids, so the graph may take inputs packed in one
        # row; only where the GEMMs are bertkit's own too, which make nothing per row count (oneDNN's
        # would meet a new shape at almost every packed length)
        self.packs = self.attention_op and (self.mkl_gemm or self.fma_gemm or self.int8_gemm or self.bf16_gemm) \
            and _keeps_inputs_apart(model)
        self.max_packed = PACKED_INPUTS
        # A classifier's logits come from pooled tokens: the graph takes their positions (one per
        # input; a packed row holds several inputs' first tokens), so it may pack too. Not a
        # left-to-right one (it pools each input's last real token) nor one with a BiLSTM on top.
        self.pools = type(model).__name__ == "BertForSequenceClassification" and _keeps_inputs_apart(model)
        self.max_batch = batch_limit(precision, model.config.hidden_size, self.int8_gemm)
        self.batch_dim = max(MIN_BATCH_DIM, self.max_batch)
        self.ops = GraphOps(self.mkl_gemm, self.fma_gemm, self.int8_gemm, self.seven, self.avx2_ops, self.attention_op,
                            self.gelu_op, self.norm_op, self.bf16_gemm)
        key = cache_key(model, self.output_names, max_length, precision, self.ops, self.batch_dim)
        self.path = folder / f"{type(model).__name__}-{precision}-{key}.pt2"
        self.compiled_now = False
        limit = cache_limit_bytes()  # a bad value is refused before tens of seconds of compiling
        if self.path.is_file():
            _mark_used(self.path)
        else:
            self._compile(model, folder)
            self.compiled_now = True
            prune_cache(folder, self.path, limit)
        try:
            # The package's own C++ loader, not torch._inductor.aoti_load_package: that one imports
            # inductor and dynamo (1.6 s on 2 cores), probes the CPU's vector ISA in subprocesses
            # (the cache key holds the CPU's instruction sets already) and parses the call's input
            # and output specs on every call (~0.1 ms); this loads MiniLM in 0.07 s instead of 2.4.
            loader = _package_loader()(str(self.path), "model", False, 1, -1)
        except Exception as e:  # a damaged or foreign file: say which, the user can delete it
            raise BertkitError(f"cannot load the compiled model ({type(e).__name__}: {_first_line(e, 200)}); "
                               "delete the file to compile it again", path=str(self.path)) from None
        self._run = lambda *inputs: loader.run(list(inputs))  # the graph's flat inputs -> its flat outputs

    def _compile(self, model: torch.nn.Module, folder: Path) -> None:
        import torch._inductor  # a submodule `import torch` does not load
        import torch._inductor.config as inductor_config

        if not hasattr(torch._inductor, "aoti_compile_and_package"):
            raise BertkitError(f"compile needs AOTInductor's packages (torch 2.6 or later), torch is {torch.__version__}")

        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BertkitError(f"cannot make the compile cache folder ({e.strerror}); set {CACHE_ENV}",
                               path=str(folder)) from None
        log.warning(f"compiling {type(model).__name__} ({self.precision}) for this CPU and {torch.get_num_threads()} threads "
                    f"(once; tens of seconds) into {self.path}")
        started = time.perf_counter()
        length = torch.export.Dim("length", min=MIN_LENGTH, max=self.max_length)
        batch = torch.export.Dim("batch", min=1, max=self.batch_dim)
        example = torch.full((2, min(16, self.max_length)), 100, dtype=torch.long)
        positions = torch.arange(example.shape[1]).repeat(example.shape[0], 1)
        inputs = (example, torch.ones_like(example), torch.zeros_like(example), positions)
        dynamic = ({0: batch, 1: length},) * 4
        if self.pools:  # each row's first token, as positions in the flattened rows
            inputs += (torch.arange(example.shape[0]) * example.shape[1],)
            dynamic += ({0: torch.export.Dim("inputs", min=1, max=max(self.batch_dim, PACKED_INPUTS))},)
        wrapped = _Exported(model, self.output_names).eval()
        try:
            recording = contextlib.ExitStack()
            if self.precision == "bf16":
                recording.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            if self.bf16_gemm:
                recording.enter_context(graph_gemm.recording(mkl=False, bf16=True, attention=self.attention_op,
                                                             gelu=self.gelu_op, norm=self.norm_op))
            elif self.precision != "bf16" and (self.mkl_gemm or self.fma_gemm or self.int8_gemm or self.attention_op):
                recording.enter_context(graph_gemm.recording(
                    mkl=self.mkl_gemm, int8=self.int8_gemm and not self.seven, attention=self.attention_op,
                    fma=self.fma_gemm, seven=self.seven, gelu=self.gelu_op, norm=self.norm_op))
            # With the AVX2 ops every GEMM and attention runs on the ops' own threads, which never wait
            # for a sleeping one (graph_gemm.cpp, Team); inductor's loops stay on the calling thread
            # rather than wake libgomp's team (whose first region after a rest waits for its worker).
            loops = {"cpp.threads": 1} if self.avx2_ops and self.attention_op else {}
            with torch.no_grad(), inductor_config.patch(freezing=True, **loops), recording:
                program = torch.export.export(wrapped, inputs, dynamic_shapes=dynamic)
                with tempfile.TemporaryDirectory(dir=folder, prefix=".compiling-") as work:
                    package = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(work) / "model.pt2"))
                    os.replace(package, self.path)  # whole or not at all: a killed compile leaves no package
        except BertkitError:
            raise
        except Exception as e:  # no C++ compiler, an op inductor cannot lower, a full disk
            raise BertkitError(f"compiling the model failed ({type(e).__name__}: {_first_line(e, 300)}); "
                               "run without --compile") from None
        log.warning(f"compiled in {time.perf_counter() - started:.0f} s")

    def accepts(self, inputs: int, length: int) -> bool:
        return 1 <= inputs <= self.max_batch and MIN_LENGTH <= length <= self.max_length

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                 position_ids: torch.Tensor | None = None, first_tokens: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, ...]:
        """(B, T) inputs -> the outputs. Where `packs`, several inputs may share a row: their tokens one
        after another, `attention_mask` numbering them (1, 2, ...; 0 for padding), `position_ids`
        restarting at each (batching.pack_rows) and, where the graph `pools` (a classifier),
        `first_tokens` saying where each input starts in the flattened rows (default: each row's first)."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T).repeat(B, 1)
        inputs = [input_ids, attention_mask, token_type_ids, position_ids]
        if self.pools:
            inputs.append(torch.arange(B) * T if first_tokens is None else first_tokens)
        return tuple(self._run(*inputs))


def _keeps_inputs_apart(model: torch.nn.Module) -> bool:
    """Whether inputs packed in one row stay apart through the model: its only layers that mix
    positions are the attention op's. Not a left-to-right model (its causal attention is SDPA's) nor
    one with a BiLSTM on top (it would run over the whole row)."""
    return not model.config.is_decoder and not model.config.bilstm_hidden_size


def _mkl_op_loaded(folder: Path) -> bool:
    """The fp32 graph's MKL GEMM op (kernels/graph_gemm.py) built into the cache folder and loaded."""
    return _graph_op("MKL's GEMM op", lambda: graph_gemm.load(folder) is not None)


def _fma_op_loaded(folder: Path) -> bool:
    """The fp32 graph's AVX2 / FMA GEMM op (kernels/graph_gemm.py) built, loaded, able to run its kernel
    and the graphs' kernel here (`team_graphs`: AVX2 only, or a Zen 4)."""
    return _graph_op("the AVX2 GEMM op", lambda: graph_gemm.fma_usable(folder) and graph_gemm.team_graphs(folder))


def _bf16_op_loaded(folder: Path) -> bool:
    """The bf16 graph's GEMM op (kernels/graph_gemm.py) built, loaded and running its own kernel here
    (`bf16_graphs`: a Zen 4 with AVX512_BF16)."""
    return _graph_op("the bf16 GEMM op", lambda: graph_gemm.bf16_graphs(folder))


def _amx_int8_op(folder: Path) -> bool:
    """The int8 graph's AMX GEMM op (kernels/graph_gemm.py) built, loaded and able to use the tiles."""
    return _graph_op("the AMX int8 GEMM op", lambda: graph_gemm.amx_int8(folder))


def _own_int8_op(folder: Path) -> bool:
    """The int8 graph's GEMM op running a kernel of bertkit's here: AMX tiles where the CPU has them
    (and Linux lends them), AVX512_VNNI on the ops' threads on a Zen 4, AVX2 where it has neither VNNI
    nor AMX (kernels/graph_gemm.py)."""
    if cpu_features().amx:
        return _amx_int8_op(folder)
    if cpu_features().vnni:
        return _graph_op("the VNNI int8 GEMM op", lambda: graph_gemm.vnni_int8(folder))
    return _graph_op("the AVX2 int8 GEMM op", lambda: graph_gemm.avx2_int8(folder), instead="no int8 graph")


def uses_attention_op(precision: str, folder: Path, bf16_gemm: bool = False) -> bool:
    """Whether a graph of this precision records bertkit's attention op for short inputs
    (kernels/graph_gemm.py): fp32 and int8 (whose attention is fp32), and bf16 where its GEMMs are
    bertkit's (`bf16_gemm`; its attention computed in fp32), on CPUs with AVX-512 or AVX2 (its kernel
    for each), the op built and loaded into the cache folder `folder`."""
    return (precision in ("fp32", "int8") or bf16_gemm) and \
        _graph_op("the attention op", lambda: graph_gemm.short_attention(folder), instead="torch's SDPA")


def _graph_op(name: str, available, instead: str = "oneDNN's") -> bool:
    """`available()`; False, with one warning, where the ops cannot be built or loaded: the graph then
    keeps inductor's oneDNN GEMMs (`_int_mm` at int8), or torch's SDPA for the attention op."""
    try:
        return available()
    except (RuntimeError, OSError) as e:
        log.warning(f"compile: {name} unavailable ({_first_line(e, 200)}); the graph uses {instead}")
        return False


def _first_line(error: Exception, limit: int) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else ""


def check_int8_cpu() -> None:
    """Compiling at int8 needs VNNI (oneDNN's int8 GEMM would saturate its int16 pair sums without
    it) or, on an AVX2 CPU, bertkit's AVX2 int8 op (built into the compile cache folder: ~20 s once)."""
    if cpu_features().vnni:
        return
    try:
        avx2 = graph_gemm.avx2_int8(cache_dir())
    except (RuntimeError, OSError) as e:
        raise BertkitError(f"compile at int8 on a CPU without VNNI needs bertkit's AVX2 int8 op, which could not be "
                           f"built ({_first_line(e, 200)}); run int8 without --compile") from None
    if not avx2:
        raise BertkitError("compile at int8 needs a CPU with VNNI (AVX512_VNNI or AVX_VNNI) or AVX2, which this one "
                           "lacks; run int8 without --compile")


def _package_loader():
    return getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)


def _check_can_compile(model: torch.nn.Module, precision: str) -> None:
    if _package_loader() is None:
        raise BertkitError(f"compile needs AOTInductor's packages (torch 2.6 or later), torch is {torch.__version__}")
    parameter = next(model.parameters(), None)
    if parameter is not None and (parameter.device.type != "cpu" or parameter.dtype != torch.float32):
        raise BertkitError("compile runs fp32 weights on the CPU: drop --device or the dtype")
    if precision not in PRECISIONS:
        raise BertkitError(f"compile runs at {', '.join(PRECISIONS)}, not {precision}")
    if precision == "int8":
        check_int8_cpu()
        if not any(isinstance(m, Int8Linear) for m in model.modules()):
            raise BertkitError("compile at int8 takes a model quantised by quantize_int8 (--quantize int8)")
