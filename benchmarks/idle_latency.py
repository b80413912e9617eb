"""One input after a rest, each engine alone in its own process (issue 39): how a lone request's
latency grows with the idle time before it.

    python benchmarks/idle_latency.py            # ~2 min on 2 cores: MiniLM, bertkit and ONNX Runtime
    python benchmarks/idle_latency.py --all-engines --sizes minilm,base   # every engine (~12 min)
    python benchmarks/idle_latency.py --engines bertkit-compiled_fp32,onnxruntime_fp32 --sizes minilm,base

bench_engines.py --batch 1 alternates nine engines in one process, so each engine has rested a few
hundred milliseconds before its call (the other eight ran meanwhile): the regime where bertkit's
OpenMP team suffers most. Here every engine runs alone (a fresh process each, as one server
runs one engine), on the same 40 inputs of 8-64 tokens (bench_engines' lone batches, bertkit as its
engine runs a model; `bertkit_engine_fp32`: the InferenceEngine itself, warmed up as `serve` starts
it, rows in and tensors out), with 0, 20 and 200 ms of rest before each call; bertkit also with
GOMP_SPINCOUNT raised, which keeps libgomp's worker threads spinning ~0.7 s after a call (one core
busy meanwhile) instead of ~10 ms. A last column streams FLUSH_MB of memory through the caches
before each call (untimed, numpy on the calling thread, so no engine's pool is left spinning beside
the next): the threads idle for that while (30-60 ms) as in a rest, and the caches lose the weights
too. Read it against the 20 and 200 ms columns: what the caches add to a rest.

Results: benchmarks/results/<cpu class>/idle_latency.{json,md} (`--output` another folder).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESTS = (0.0, 0.02, 0.2)
FLUSH_MB = 400  # more than the largest L3 seen on these machines (300 MiB, an Emerald Rapids Xeon)
INPUTS = 40
SPIN = {"GOMP_SPINCOUNT": "30000000"}  # libgomp's workers spin ~0.7 s after a call instead of ~10 ms
RUNS = [("bertkit_fp32", {}), ("bertkit_fp32", SPIN), ("bertkit_engine_fp32", {}), ("onnxruntime_fp32", {}),
        ("bertkit_int8", {}), ("bertkit_int8", SPIN), ("onnxruntime_int8", {})]


def engine_runner():
    """bertkit's InferenceEngine as `serve` runs it: warmed up first."""
    from bertkit.inference import InferenceEngine
    from bertkit.reproduce import reference_model_dir

    engine = InferenceEngine(reference_model_dir())
    engine.warm_up()

    def run(batch):
        n = batch.lengths[0]
        engine.forward([{"input_ids": batch.token_lists[0], "token_type_ids": batch.type_lists[0],
                         "attention_mask": [1] * n}])
    return run


def child(engine: str, size: str, threads: int, inputs: int) -> dict:
    """In a fresh process: median ms per call of `engine` on `size` after each rest."""
    import numpy as np
    import torch

    import bench_common as C
    import bench_engines as E

    torch.set_num_threads(threads)
    ours = E.bertkit_model(size)
    if engine == "bertkit_engine_fp32":
        run = engine_runner()
    else:
        run = E.build_engines(ours, [engine], Path(tempfile.mkdtemp()), threads, {})[engine]
    batches = [E.Batch(b) for b in C.variable_length_batches(ours.config, 1, count=inputs, low=8, high=64)]
    for batch in batches[:5]:
        run(batch)
    medians = {}
    for rest in RESTS:
        seconds = []
        for batch in batches:
            time.sleep(rest)
            start = time.perf_counter()
            run(batch)
            seconds.append(time.perf_counter() - start)
        medians[str(rest)] = 1000 * statistics.median(seconds)
    flush, seconds = np.ones(FLUSH_MB << 18, dtype=np.float32), []
    for batch in batches:
        flush += 1.0  # every cache line of the buffer written, on one thread: the weights leave the caches
        start = time.perf_counter()
        run(batch)
        seconds.append(time.perf_counter() - start)
    medians["flush"] = 1000 * statistics.median(seconds)
    return medians


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
        return 0
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="minilm", help="minilm and / or base (default minilm)")
    parser.add_argument("--all-engines", action="store_true",
                        help="every engine of bench_engines (OpenVINO, CTranslate2, bf16 too), not only bertkit and ONNX Runtime")
    parser.add_argument("--engines", default=None,
                        help="comma-separated engines of bench_engines (bertkit-compiled_fp32 among them), "
                             "each with the default environment, instead of the usual set")
    parser.add_argument("--output", default=None, help="results folder (default benchmarks/results/<cpu class>)")
    args = parser.parse_args()
    import bench_common as C
    import bench_engines as E

    machine = C.machine_description()
    runs = RUNS + ([(e, {}) for e in E.ENGINES if e not in {r[0] for r in RUNS}] + [("bertkit_bf16", SPIN)]
                   if args.all_engines else [])
    if args.engines:
        runs = [(e, {}) for e in args.engines.split(",")]
    if not machine.get("bf16_supported"):
        runs = [r for r in runs if not r[0].endswith("bf16")]
    rows = []
    for size in args.sizes.split(","):
        inputs = INPUTS if size == "minilm" else INPUTS // 2
        for engine, env in runs:
            if engine == "bertkit_engine_fp32" and size != "minilm":
                continue  # the engine runs a model folder: MiniLM's
            out = subprocess.run([sys.executable, __file__, "--child", engine, size, "2", str(inputs)],
                                 env={**os.environ, **env}, capture_output=True, text=True, check=True)
            medians = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"size": size, "engine": engine, "env": env, "inputs": inputs, "median_ms": medians})
            print(size, engine, env, {k: round(v, 2) for k, v in medians.items()}, flush=True)
    folder = Path(args.output) if args.output else HERE / "results" / machine["cpu_class"]
    folder.mkdir(parents=True, exist_ok=True)
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine, "threads": 2,
               "command": " ".join(["idle_latency.py"] + sys.argv[1:]), "lengths": [8, 64], "rests_s": list(RESTS),
               "flush_mb": FLUSH_MB, "rows": rows}
    (folder / "idle_latency.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"# One input after a rest, each engine alone ({machine['cpu_class']})", "",
             f"`python benchmarks/{results['command']}` on {results['date']}: {machine['cpu']}, 2 threads, "
             "inputs of 8-64 tokens (40 for MiniLM, 20 for base), each engine in its own process; median ms per call.", "",
             f"| model | engine | environment | back to back | 20 ms rest | 200 ms rest | {FLUSH_MB} MB streamed through the caches before each |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        env = ", ".join(f"{k}={v}" for k, v in r["env"].items()) or "defaults"
        lines.append(f"| {r['size']} | {r['engine']} | {env} | "
                     + " | ".join(f"{r['median_ms'][k]:.2f}" for k in [*map(str, RESTS), "flush"]) + " |")
    (folder / "idle_latency.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / 'idle_latency.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
