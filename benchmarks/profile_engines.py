"""Where the time goes, per op class, in bertkit and CTranslate2 on the same batches (issue 28: the
profile that explains the gap before any lever).

    python benchmarks/profile_engines.py                  # all-MiniLM-L6-v2, fp32, 4 batches (~1 min)
    python benchmarks/profile_engines.py --size base --precision int8 --batches 2
    python benchmarks/profile_engines.py --batch 1 --lengths 36,36 --against onnxruntime --batches 40

Two views, on the same variable-length batches of 32 (lengths 16-128), 2 threads:

1. bertkit under torch.profiler: each op's self CPU time, summed per class (GEMM, attention,
   LayerNorm, GELU, layout: unpadding / padding / copies, other ops), and what the wall time has
   beyond all ops (Python and dispatch: framework overhead).
2. Both engines under `perf` (Linux, sampling this process while the batches run; the CTranslate2
   wheels are built without its own profiler, `init_profiling` is not in their Python API): the
   samples per class, read off the symbol and library they land in (MKL / oneDNN / JIT-generated
   GEMM code, softmax / attention, layer norm, GELU, OpenMP threading, Python, other). Without
   `perf` this view is left out, said so. perf samples threads while they are on a CPU: OpenMP
   threads spinning at a barrier count (as "threading"), threads blocked in the kernel do not, so
   this view shows where CPU time goes, the torch.profiler view where bertkit's wall time goes.

3. With `--against onnxruntime`: ONNX Runtime's own profiler (SessionOptions.enable_profiling), each
   graph node's time summed per class by its operator (MatMul / Gemm / quantised matmuls: GEMM;
   Attention; the (Skip / Embed) LayerNormalizations; (Bias / Fast) Gelu; the rest), beside
   bertkit's torch.profiler view, and the wall time per call of each (so ORT's framework share is
   its wall time beyond its nodes). `--batch 1 --lengths 36,36`: one request of 36 tokens.

Results: runs/profile/profile_<size>_<precision>[_batchN].{md,json}, or --output.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_common as C  # noqa: E402
import bench_engines as E  # noqa: E402

CLASSES = ("GEMM", "attention", "LayerNorm", "GELU", "layout / copies", "other ops", "threading (OpenMP)",
           "Python / framework")

# torch op names (self time) -> class; matched by substring, first match wins
TORCH_OPS = (
    ("GEMM", ("addmm", "aten::mm", "aten::linear", "_linear_pointwise", "_mkl_linear", "linear_dynamic", "bertkit_fma_linear",
              "quantized::", "aten::matmul", "aten::bmm")),
    ("attention", ("scaled_dot_product", "softmax", "flash_attention", "bertkit_attention")),
    ("LayerNorm", ("layer_norm",)),
    ("GELU", ("gelu",)),
    ("layout / copies", ("index_select", "index_copy", "aten::cat", "copy_", "contiguous", "clone", "new_zeros",
                         "zero_", "fill_", "aten::empty", "nonzero", "reshape", "view", "transpose", "select",
                         "slice", "narrow", "split", "chunk", "unbind", "as_strided", "expand")),
)

# perf symbols / libraries -> class; matched on lower-cased "library symbol", first match wins
PERF_SYMBOLS = (
    ("attention", ("softmax", "attention", "flash", "attend_head", "query_rows")),
    ("LayerNorm", ("layer_norm", "layernorm")),
    ("GELU", ("gelu", "vec_erf<", "erff")),  # CTranslate2's GELU calls its vectorised erf
    ("GEMM", ("gemm", "fma_rows", "mkl_blas", "dnnl", "brgemm", "inner_product", "[jit]", "fbgemm", "linear", "matmul",
              "sgemm", "libmkl")),
    ("threading (OpenMP)", ("libgomp", "libiomp", "omp", "sched_yield")),
    # Python, pybind11 and torch's dispatch / autograd / tensor bookkeeping (not its kernels, at::native::*)
    ("Python / framework", ("libpython", "libtorch_python", "pybind", "_pyeval", "torch::autograd", "torch::jit",
                            "torch::profiler", "c10::dispatcher", "c10::impl::", "c10::operatorhandle", "dispatchkey",
                            "c10::tensorimpl", "at::tensorbase", "c10::intrusive_ptr", "c10::ivalue", "malloc",
                            "free")),
    ("layout / copies", ("memcpy", "memmove", "memset", "index_select", "index_copy", "copy", "cat")),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--size", default="minilm", choices=list(E.PLAN))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"))
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=E.BATCH_SIZE, help="inputs per call (default 32)")
    parser.add_argument("--lengths", default="16,128", help="LO,HI input lengths (default 16,128)")
    parser.add_argument("--against", default="ctranslate2", choices=("ctranslate2", "onnxruntime"),
                        help="the engine profiled beside bertkit (bf16: bertkit alone)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    args.lengths = tuple(int(x) for x in args.lengths.split(","))
    return args


# ONNX Runtime node operators -> class (its profiler names each node's op_type)
ORT_OPS = (
    ("GEMM", ("MatMul", "Gemm", "MatMulInteger", "DynamicQuantizeMatMul", "QGemm", "QAttention")),
    ("attention", ("Attention", "Softmax")),
    ("LayerNorm", ("LayerNormalization",)),
    ("GELU", ("Gelu",)),
    ("layout / copies", ("Reshape", "Transpose", "Concat", "Slice", "Gather", "Unsqueeze", "Squeeze", "Cast",
                         "Shape", "Expand")),
)


def onnxruntime_profile(onnx_file: Path, threads: int, batches, folder: Path) -> dict:
    """ORT's per-node times (its own profiler) per class, ms per call, and the wall time per call."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "ort_profile")
    session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    session.run(None, batches[0].numpy)  # warm
    start = time.perf_counter()
    for batch in batches:
        session.run(None, batch.numpy)
    wall = time.perf_counter() - start
    trace = json.loads(Path(session.end_profiling()).read_text())
    runs = len(batches) + 1
    per_class, per_op = defaultdict(float), defaultdict(float)
    for event in trace:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        op = event.get("args", {}).get("op_name", "?")
        ms = event["dur"] / 1e3 / runs
        per_class[classify(op, ORT_OPS)] += ms
        per_op[op] += ms
    wall_ms = wall * 1e3 / len(batches)
    per_class["Python / framework"] += max(0.0, wall_ms - sum(per_class.values()))
    return {"wall_ms_per_batch": wall_ms, "classes_ms_per_batch": dict(per_class),
            "top_ops": dict(sorted(per_op.items(), key=lambda kv: -kv[1])[:10])}


def classify(name: str, table) -> str:
    lowered = name.lower()
    for cls, needles in table:
        if any(n.lower() in lowered for n in needles):
            return cls
    return "other ops"


def torch_profile(run, batches) -> dict:
    """bertkit's op self times per class (ms per batch) and the wall time beyond them."""
    from torch.profiler import ProfilerActivity, profile

    run(batches[0])  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for batch in batches:
            run(batch)
        wall = time.perf_counter() - start
    per_class, per_op = defaultdict(float), {}
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3 / len(batches)
        if ms <= 0:
            continue
        cls = classify(event.key, TORCH_OPS)
        per_class[cls] += ms
        per_op[event.key] = {"class": cls, "self_ms_per_batch": ms, "calls_per_batch": event.count / len(batches)}
    wall_ms = wall * 1e3 / len(batches)
    ops_ms = sum(per_class.values())
    # With 2 threads an op's self time is its wall time on the calling thread: the rest of the wall
    # time is Python, module calls and dispatch between ops (and the profiler's own cost).
    per_class["Python / framework"] += max(0.0, wall_ms - ops_ms)
    top = sorted(per_op.items(), key=lambda kv: -kv[1]["self_ms_per_batch"])[:15]
    return {"wall_ms_per_batch": wall_ms, "classes_ms_per_batch": dict(per_class), "top_ops": dict(top)}


def perf_profile(run, batches, label: str, folder: Path) -> dict | None:
    """Samples of this process while `run` takes the batches, per class (share of samples)."""
    if shutil.which("perf") is None:
        return None
    run(batches[0])  # warm
    data = folder / f"{label}.perf"
    recorder = subprocess.Popen(["perf", "record", "-F", "999", "-g", "--call-graph", "fp", "-p", str(os.getpid()),
                                 "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # perf attaches
    start = time.perf_counter()
    for batch in batches:
        run(batch)
    wall = time.perf_counter() - start
    recorder.send_signal(signal.SIGINT)
    recorder.wait(timeout=60)
    report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "-g", "none",
                             "--sort", "dso,sym", "-t", ";"], capture_output=True, text=True, timeout=300).stdout
    shares, top = defaultdict(float), []
    for line in report.splitlines():
        if line.startswith("#") or ";" not in line:
            continue
        percent, dso, symbol = (part.strip() for part in line.split(";", 2))
        try:
            share = float(percent.rstrip("%"))
        except ValueError:
            continue
        cls = classify(f"{dso} {symbol}", PERF_SYMBOLS)
        shares[cls] += share
        if len(top) < 15:
            top.append({"share": share, "library": dso, "symbol": symbol[:120], "class": cls})
    if not shares:
        return None
    total = sum(shares.values())
    wall_ms = wall * 1e3 / len(batches)
    # The samples include the 1 s before the first batch (idle threads): shares of the busy samples.
    return {"wall_ms_per_batch": wall_ms,
            "classes_ms_per_batch": {c: wall_ms * s / total for c, s in shares.items()},
            "classes_share": {c: s / total for c, s in shares.items()}, "top_symbols": top}


def table(title: str, profiles: dict[str, dict]) -> list[str]:
    names = list(profiles)
    lines = [f"### {title}", "", "| op class | " + " | ".join(f"{n} ms/batch (share)" for n in names) + " |",
             "|---|" + "---:|" * len(names)]
    for cls in CLASSES:
        cells = []
        for n in names:
            ms = profiles[n]["classes_ms_per_batch"].get(cls, 0.0)
            cells.append(f"{ms:.1f} ({100 * ms / profiles[n]['wall_ms_per_batch']:.0f}%)")
        lines.append(f"| {cls} | " + " | ".join(cells) + " |")
    lines.append("| **wall** | " + " | ".join(f"**{profiles[n]['wall_ms_per_batch']:.1f}**" for n in names) + " |")
    return lines + [""]


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    ours = E.bertkit_model(args.size)
    low, high = args.lengths
    batches = [E.Batch(b) for b in C.variable_length_batches(ours.config, args.batch, count=args.batches + 1,
                                                             low=low, high=high)]
    other = {"ctranslate2": "CTranslate2", "onnxruntime": "ONNX Runtime"}[args.against]
    alone = args.precision == "bf16"  # neither engine has a CPU bf16 path to profile beside it
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = Path(tmp)
        bertkit = E.bertkit_runners(ours)[f"bertkit_{args.precision}"]
        results = {"size": args.size, "precision": args.precision, "batches": args.batches, "threads": args.threads,
                   "batch_size": args.batch, "lengths": list(args.lengths), "against": None if alone else args.against,
                   "machine": C.machine_description(), "versions": E.engine_versions(),
                   "bertkit_torch_profiler": torch_profile(bertkit, batches[1:])}
        perf = {"bertkit": perf_profile(bertkit, batches[1:], "bertkit", folder)}
        if not alone and args.against == "ctranslate2":
            ct2 = E.ctranslate2_runners(copy.deepcopy(ours), folder, args.threads, [args.precision])
            perf[other] = perf_profile(ct2[f"ctranslate2_{args.precision}"], batches[1:], "ctranslate2", folder)
        elif not alone:
            from bench_onnx import onnx_sessions

            sessions, _ = onnx_sessions(ours, folder, args.threads)  # also writes model.opt(.int8).onnx
            graph = folder / ("model.opt.int8.onnx" if args.precision == "int8" else "model.opt.onnx")
            results["onnxruntime_profiler"] = onnxruntime_profile(graph, args.threads, batches[1:], folder)
            session = sessions[args.precision]
            perf[other] = perf_profile(lambda batch: session.run(None, batch.numpy), batches[1:], "onnxruntime", folder)
    results["perf"] = perf
    shape = (f"{args.batches} calls of one input of {low} tokens" if args.batch == 1 and low == high else
             f"{args.batches} variable-length batches of {args.batch} (lengths {low}-{high})")
    lines = [f"# Per-op profile: bertkit" + ("" if alone else f" and {other}") + f", {args.size} {args.precision}", "",
             f"{shape}, {args.threads} threads, "
             f"{results['machine']['cpu']} ({results['machine']['cpu_class']}), load "
             f"{results['machine']['load_average_at_start']}. `benchmarks/profile_engines.py` has the method.", ""]
    own = {"bertkit (torch.profiler)": results["bertkit_torch_profiler"]}
    if "onnxruntime_profiler" in results:
        own["ONNX Runtime (its profiler)"] = results["onnxruntime_profiler"]
    lines += table("Under each engine's own profiler (op self times; the rest of the wall time is Python / framework)",
                   own)
    lines += ["Top ops (self ms per batch): " + ", ".join(
        f"{k} {v['self_ms_per_batch']:.1f}" for k, v in list(results["bertkit_torch_profiler"]["top_ops"].items())[:8]), ""]
    if "onnxruntime_profiler" in results:
        lines += ["ONNX Runtime's top nodes (ms per call): " + ", ".join(
            f"{k} {v:.2f}" for k, v in results["onnxruntime_profiler"]["top_ops"].items()), ""]
    if all(perf.values()):
        lines += table("Under perf (samples per class, scaled to the wall time)", perf)
        for name, p in perf.items():
            lines.append(f"{name} top symbols: " + "; ".join(
                f"{s['share']:.1f}% {s['symbol']} ({Path(s['library']).name})" for s in p["top_symbols"][:6]))
        lines.append("")
    else:
        lines += ["perf is not available here (or recorded nothing): the sampling view of both engines is left out.", ""]
    out = Path(args.output) if args.output else HERE.parent / "runs" / "profile"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"profile_{args.size}_{args.precision}" + ("" if args.batch == E.BATCH_SIZE else f"_batch{args.batch}")
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out / (stem + '.md')} and {out / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
