"""The encoder's GEMMs at the row counts of one request, in each precision, through each kernel
library torch offers on this CPU and through ONNX Runtime's (issue 39: which kernel a class should
take for a lone input, and how far it stands from the fastest engine's).

Each kernel runs alone in its own child process (2 threads, as the engines run): ONNX Runtime's
worker spins ~50 ms after every run, and a torch kernel timed beside it in one process shares the
cores with it and measures up to 2x slow (docs/speed.md, "One request at a time"). The children run
one after the other, `--rounds` times round-robin; a kernel's figure is the lower of its rounds'
medians (the machine's noise only ever adds time).

`--weights cold` (the default) cycles every call through copies of the weights totalling at least
64 MiB of fp32, more than the CPU's caches: one request through a real model streams each layer's
weights from memory once, and a GEMM timed on one weight kept in cache (`--weights warm`) flatters
the kernel that reads the most bytes (and ONNX Runtime's columns then carry one `session.run` per
GEMM, which cold spreads over the copies). `--weights model` runs every layer's four GEMMs in
order, each with its own weights, as one forward pass does (the shapes interleaved, 6 layers for
MiniLM and 12 for base), and gives the time for all of them. Median microseconds per GEMM over `--calls` calls, per shape
of all-MiniLM-L6-v2 (H 384) and BERT-base (H 768): the fused query/key/value projection, the
attention output, the feed-forward in and out; and per row count (8, 40, 64: one input of 8, 36
and 64 tokens, padded to a multiple of 8 as bertkit's engine runs it). "one layer" sums the four.

* fp32: torch's F.linear (MKL), MKL's packed sgemm (the pack bertkit's calls of a few rows take
  where `mkl_rows` is on), oneDNN with the weight packed once (bertkit's `packed_weights=
  "onednn"`, kernels/packed.py), ONNX Runtime's MatMul + Add (MLAS);
* bf16 (CPUs with native bf16): oneDNN with the bf16 weight packed once (bertkit under autocast);
* int8, activations quantised per call: torch's dynamic quantised Linear with its per-channel
  weights prepacked by the "x86" engine (fbgemm at these shapes: bertkit's Int8Linear) and by the
  "onednn" engine (oneDNN's int8 kernels: VNNI, AMX where the CPU has it); ONNX Runtime's
  DynamicQuantizeMatMul (what its dynamic int8 model runs); per token, as the compiled int8 graph
  computes (kernels/int8.RowInt8Linear, its quantisation here as three eager ops): oneDNN's
  `torch._int_mm` with the scales and bias after it, and, on CPUs with AMX, bertkit's AMX op
  (kernels/graph_gemm.py, which applies them itself).

    python benchmarks/small_gemm.py                    # ~5 min; results/<cpu class>/small_gemm.{md,json}
    python benchmarks/small_gemm.py --weights model    # results/<cpu class>/small_gemm_model.{md,json}
    python benchmarks/small_gemm.py --weights warm --output runs/gemm
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SHAPES = {"minilm": [(384, 1152), (384, 384), (384, 1536), (1536, 384)],
          "base": [(768, 2304), (768, 768), (768, 3072), (3072, 768)]}
ROWS = (8, 40, 64)
COLD_BYTES = 64 << 20
KERNELS = ["fp32 F.linear (MKL)", "fp32 MKL packed", "fp32 oneDNN packed", "fp32 bertkit AVX2 op", "fp32 ONNX Runtime MatMul",
           "bf16 oneDNN packed",
           "int8 x86 engine (fbgemm)", "int8 onednn engine", "int8 ONNX Runtime DynamicQuantizeMatMul",
           "int8 per token (torch._int_mm)", "int8 per token (bertkit AMX op)"]


def available_kernels() -> list[str]:
    import torch
    from bertkit.device import cpu_features
    engines = torch.backends.quantized.supported_engines
    try:
        import onnxruntime  # noqa: F401
        ort = True
    except ImportError:
        ort = False
    usable = {"fp32 F.linear (MKL)": True, "fp32 oneDNN packed": torch.backends.mkldnn.is_available(),
              "fp32 MKL packed": bool(torch._C.has_mkl) and hasattr(torch.ops.mkl, "_mkl_linear"),
              "fp32 ONNX Runtime MatMul": ort, "fp32 bertkit AVX2 op": _fma_op(),
              "bf16 oneDNN packed": torch.backends.mkldnn.is_available() and cpu_features().bf16,
              "int8 x86 engine (fbgemm)": "x86" in engines, "int8 onednn engine": "onednn" in engines,
              "int8 ONNX Runtime DynamicQuantizeMatMul": ort,
              "int8 per token (torch._int_mm)": cpu_features().vnni, "int8 per token (bertkit AMX op)": _amx_op()}
    return [name for name in KERNELS if usable[name]]


def _amx_op() -> bool:
    from bertkit.device import cpu_features
    from bertkit.inference.compiled import cache_dir
    from bertkit.kernels import graph_gemm
    try:
        return cpu_features().amx and graph_gemm.amx_int8(cache_dir())
    except RuntimeError as e:  # no compiler
        print(f"no AMX int8 op: {e}", file=sys.stderr)
        return False


def _fma_op() -> bool:
    from bertkit.inference.compiled import cache_dir
    from bertkit.kernels import graph_gemm
    try:
        return graph_gemm.fma_usable(cache_dir()) and graph_gemm.team_graphs(cache_dir())  # avx2 class, Zen 4
    except RuntimeError as e:  # no compiler
        print(f"no AVX2 / FMA op: {e}", file=sys.stderr)
        return False


def _per_token_int8(weights, biases, amx: bool):
    """The compiled int8 graph's Linears: each row of x quantised with its own scale, the weights'
    int8 values per output channel, int32 sums by `_int_mm` or bertkit's AMX op."""
    import torch
    from bertkit.inference.compiled import cache_dir
    from bertkit.kernels import graph_gemm
    if amx:
        graph_gemm.load(cache_dir())  # built by available_kernels() in the parent
    layers = []
    for weight, bias in zip(weights, biases):
        scale, q = _per_channel_int8(weight)
        layers.append((weight.shape[1], q.to(torch.int8).t(), scale, bias))  # (in, out) view, as the graph holds it

    def project(x, q_t, scale, bias):
        row_scale = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127.0
        rows = torch.round(x / row_scale).to(torch.int8)
        if amx:
            return graph_gemm.graph_int8_linear(rows, row_scale, q_t, scale, bias)
        return torch._int_mm(rows, q_t).to(torch.float32) * row_scale * scale + bias

    return lambda xs: [project(xs[k], q_t, scale, bias) for k, q_t, scale, bias in layers]


def _per_channel_int8(weight):
    """Symmetric per-output-channel int8 weights, as bertkit's Int8Linear quantises them."""
    scale = weight.abs().amax(1).clamp(min=1e-8) / 127.0
    return scale, (weight / scale[:, None]).round().clamp(-127, 127)


def _torch_int8(weights, biases, engine: str):
    import torch
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    packs = []
    try:
        for weight, bias in zip(weights, biases):
            scale, _ = _per_channel_int8(weight)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                q = torch.quantize_per_channel(weight, scale.double(), torch.zeros(len(scale), dtype=torch.long),
                                               0, torch.qint8)
                packs.append(torch.ops.quantized.linear_prepack(q, bias))
    finally:
        torch.backends.quantized.engine = before
    dynamic = torch.ops.quantized.linear_dynamic
    widths = [w.shape[1] for w in weights]
    return lambda xs: [dynamic(xs[k], p, False) for k, p in zip(widths, packs)]


def _onnxruntime(weights, biases, threads: int, int8: bool):
    """One session holding every weight's GEMM (run one after the other by the sequential executor), so
    the per-run overhead spreads over them, as over a model's layers; one input per width."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper
    nodes, initializers, outputs = [], [], []
    for i, (weight, bias) in enumerate(zip(weights, biases)):
        n, k = weight.shape
        if int8:
            scale, q = _per_channel_int8(weight)
            nodes.append(helper.make_node("DynamicQuantizeMatMul", [f"x{k}", f"w{i}", f"s{i}", "", f"b{i}"], [f"y{i}"],
                                          domain="com.microsoft"))
            initializers += [numpy_helper.from_array(q.T.contiguous().to(torch.int8).numpy(), f"w{i}"),
                             numpy_helper.from_array(scale.numpy(), f"s{i}")]
        else:
            nodes += [helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"m{i}"]),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
            initializers.append(numpy_helper.from_array(weight.T.contiguous().numpy(), f"w{i}"))
        initializers.append(numpy_helper.from_array(bias.numpy(), f"b{i}"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
    widths = sorted({w.shape[1] for w in weights})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["m", k]) for k in widths]
    graph = helper.make_graph(nodes, "gemms", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda xs: session.run(None, {f"x{k}": xs[k].numpy() for k in widths})


def kernel(name: str, weights, biases, threads: int):
    """xs ({in_features: input}) -> [one output per weight, in order] through kernel `name`."""
    import torch
    import torch.nn.functional as F
    linear = torch.ops.mkldnn._linear_pointwise
    widths = [w.shape[1] for w in weights]
    if name == "fp32 F.linear (MKL)":
        return lambda xs: [F.linear(xs[k], w, b) for k, w, b in zip(widths, weights, biases)]
    if name == "fp32 MKL packed":  # bertkit's packs for calls of few rows (KernelOptions.mkl_rows)
        packs = [torch.ops.mkl._mkl_reorder_linear_weight(w, 64) for w in weights]
        mkl = torch.ops.mkl._mkl_linear
        return lambda xs: [mkl(xs[k], p, w, b, xs[k].shape[0]) for k, p, w, b in zip(widths, packs, weights, biases)]
    if name == "fp32 oneDNN packed":
        packs = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
        return lambda xs: [linear(xs[k], p, b, "none", [], "") for k, p, b in zip(widths, packs, biases)]
    if name == "fp32 bertkit AVX2 op":  # the compiled fp32 graph's GEMMs on the avx2 class and Zen 4 (graph_gemm.py)
        from bertkit.inference.compiled import cache_dir
        from bertkit.kernels import graph_gemm
        graph_gemm.load(cache_dir())  # built by available_kernels() in the parent
        fma = torch.ops.bertkit.bertkit_fma_linear
        return lambda xs: [fma(xs[k], w, b) for k, w, b in zip(widths, weights, biases)]
    if name == "bf16 oneDNN packed":
        packs = [torch.ops.mkldnn._reorder_linear_weight(w.bfloat16()) for w in weights]
        b16 = [b.bfloat16() for b in biases]
        return lambda xs: [linear(xs[k].bfloat16(), p, b, "none", [], "") for k, p, b in zip(widths, packs, b16)]
    if name == "int8 x86 engine (fbgemm)":
        return _torch_int8(weights, biases, "x86")
    if name == "int8 onednn engine":
        return _torch_int8(weights, biases, "onednn")
    if name.startswith("int8 per token"):
        return _per_token_int8(weights, biases, amx="AMX" in name)
    return _onnxruntime(weights, biases, threads, int8="int8" in name)


LAYERS = {"minilm": 6, "base": 12}
DESCRIPTION = {
    "cold": "Every call cycles through weight copies totalling at least 64 MiB (one request streams its "
            "weights from memory); µs per GEMM; \"one layer\": the four GEMMs of a layer summed. ",
    "warm": "One weight, kept in cache (ONNX Runtime's figures then carry a whole `session.run` per GEMM); "
            "µs per GEMM; \"one layer\": the four GEMMs of a layer summed. ",
    "model": "Every layer's four GEMMs in order, each with its own weights (MiniLM 6 layers, base 12), "
             "as one forward pass runs them (ONNX Runtime: one session holding them all); µs for them all. ",
}


def _timed(fn, xs, reference, calls: int, per: int) -> tuple[float, float]:
    """(median µs per call / per, max abs difference of the first output from `reference`)."""
    import torch
    with torch.inference_mode():
        error = float((torch.as_tensor(fn(xs)[0]).float() - reference).abs().max())
        for _ in range(3):  # code generation, first touch
            fn(xs)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn(xs)
            times.append((time.perf_counter() - start) / per)
    return statistics.median(times) * 1e6, error


def child(name: str, weights_mode: str, calls: int, threads: int) -> list[dict]:
    """Time kernel `name` over every shape (or every model, `weights_mode` "model") and row count;
    runs in its own process."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    rows = []
    for size, shapes in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        if weights_mode == "model":  # every layer's four GEMMs in order, each with its own weights
            layout = [(k, n) for _ in range(LAYERS[size]) for k, n in shapes]
            weights = [torch.randn(n, k, generator=g) * 0.05 for k, n in layout]
            biases = [torch.randn(n, generator=g) * 0.1 for k, n in layout]
            fn = kernel(name, weights, biases, threads)
            for m in ROWS:
                xs = {k: torch.randn(m, k, generator=g) for k in {k for k, _ in layout}}
                us, error = _timed(fn, xs, F.linear(xs[layout[0][0]], weights[0], biases[0]), calls, 1)
                rows.append({"size": size, "k": "model", "n": LAYERS[size], "rows": m, "kernel": name,
                             "copies": 1, "median_us": us, "max_abs_diff": error})
            continue
        for k, n in shapes:
            copies = max(1, math.ceil(COLD_BYTES / (4 * k * n))) if weights_mode == "cold" else 1
            weights = [torch.randn(n, k, generator=g) * 0.05 for _ in range(copies)]
            biases = [torch.randn(n, generator=g) * 0.1 for _ in range(copies)]
            fn = kernel(name, weights, biases, threads)
            for m in ROWS:
                x = torch.randn(m, k, generator=g)
                us, error = _timed(fn, {k: x}, F.linear(x, weights[0], biases[0]), calls, copies)
                rows.append({"size": size, "k": k, "n": n, "rows": m, "kernel": name, "copies": copies,
                             "median_us": us, "max_abs_diff": error})
    return rows


def run_children(kernels: list[str], args) -> list[dict]:
    best = {}
    for round_ in range(args.rounds):
        for name in kernels:
            command = [sys.executable, __file__, "--child", name, "--weights", args.weights,
                       "--calls", str(args.calls), "--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"small_gemm: {name} failed: {done.stderr.strip().splitlines()[-1:]}")
            for row in json.loads(done.stdout.strip().splitlines()[-1]):
                key = (row["size"], row["k"], row["n"], row["rows"], name)
                if key not in best or row["median_us"] < best[key]["median_us"]:
                    best[key] = row
            print(f"round {round_ + 1}: {name} done", file=sys.stderr)
    return list(best.values())


def render(rows: list[dict], meta: dict) -> str:
    kernels = [k for k in KERNELS if any(r["kernel"] == k for r in rows)]
    lines = [f"# The encoder's GEMMs at one request's row counts ({meta['cpu_class']}, {meta['weights']} weights)", "",
             f"`python benchmarks/small_gemm.py {meta.get('command', '--weights ' + meta['weights'])}` on {meta['date']} "
             f"({meta['minutes']:.1f} min). Machine: {meta['machine']}; {meta['threads']} threads, torch "
             f"{meta['torch']}, onnxruntime {meta['onnxruntime']}. Each kernel alone in its own process, "
             f"{meta['rounds']} rounds round-robin, {meta['calls']} calls each. "
             + DESCRIPTION[meta["weights"]]
             + "The lower of the rounds' medians (fastest of each precision in bold; int8 quantises its input "
             "per call, as bertkit's Int8Linear and ONNX Runtime's dynamic int8 do).", "",
             "| model | K -> N | rows | " + " | ".join(kernels) + " |",
             "|---|---|---:|" + "---:|" * len(kernels)]
    groups = {}
    for r in rows:
        groups.setdefault((r["size"], r["rows"]), {}).setdefault((r["k"], r["n"]), {})[r["kernel"]] = r["median_us"]

    def cells(by_kernel):
        out = []
        for name in kernels:
            if name not in by_kernel:
                out.append("")
                continue
            peers = [v for kk, v in by_kernel.items() if kk.split()[0] == name.split()[0]]
            value = by_kernel[name]
            out.append(f"**{value:.0f}**" if value == min(peers) else f"{value:.0f}")
        return out

    for size in SHAPES:
        for m in ROWS:
            shapes = groups.get((size, m), {})
            if meta["weights"] == "model":
                for (_, layers), by_kernel in shapes.items():
                    lines.append(f"| {size} | all {layers} layers' GEMMs | {m} | " + " | ".join(cells(by_kernel)) + " |")
                continue
            for (k, n), by_kernel in shapes.items():
                lines.append(f"| {size} | {k} -> {n} | {m} | " + " | ".join(cells(by_kernel)) + " |")
            total = {name: sum(s[name] for s in shapes.values()) for name in kernels
                     if all(name in s for s in shapes.values())}
            lines.append(f"| {size} | **one layer** | {m} | " + " | ".join(cells(total)) + " |")
    lines += ["", "Largest difference from fp32 F.linear over all shapes (int8 includes its quantisation error):", ""]
    for name in kernels:
        worst = max(r["max_abs_diff"] for r in rows if r["kernel"] == name)
        lines.append(f"- {name}: {worst:.2e}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", choices=tuple(DESCRIPTION), default="cold",
                        help="cold: cycle through >= 64 MiB of weight copies (default); warm: one weight in cache; "
                        "model: every layer's GEMMs in order, each with its own weights, as a forward pass runs them")
    parser.add_argument("--calls", type=int, default=40, help="timed calls per kernel, shape and row count (default 40)")
    parser.add_argument("--rounds", type=int, default=2, help="round-robin passes over the kernels (default 2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", default=None, help="comma-separated subset of: " + ", ".join(KERNELS))
    parser.add_argument("--output", default=None, help="results folder (default benchmarks/results/<cpu class>)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.weights, args.calls, args.threads)))
        return
    import torch
    import bench_common as C
    kernels = available_kernels()
    if args.kernels:
        wanted = [k.strip() for k in args.kernels.split(",")]
        unknown = [k for k in wanted if k not in KERNELS]
        if unknown:
            raise SystemExit(f"small_gemm: --kernels: unknown kernel {unknown[0]!r}; choose from {', '.join(KERNELS)}")
        kernels = [k for k in kernels if k in wanted]
    started = time.time()
    rows = run_children(kernels, args)
    info = C.machine_description()
    try:
        import onnxruntime
        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "not installed"
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "minutes": (time.time() - started) / 60,
            "command": shlex.join(sys.argv[1:]),
            "calls": args.calls, "rounds": args.rounds, "weights": args.weights, "threads": args.threads,
            "torch": torch.__version__, "onnxruntime": ort_version, "cpu_class": info["cpu_class"],
            "machine": f"{info['cpu']}, {info['logical_cpus']} CPUs ({', '.join(info.get('isa', []))})", "info": info}
    out = Path(args.output) if args.output else HERE / "results" / info["cpu_class"]
    out.mkdir(parents=True, exist_ok=True)
    stem = "small_gemm" if args.weights == "cold" else f"small_gemm_{args.weights}"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    text = render(rows, meta)
    (out / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
