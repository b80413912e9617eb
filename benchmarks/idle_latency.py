"""One input after a rest, each engine alone in its own process (issue 39): how a lone request's
latency grows with the idle time before it.

    python benchmarks/idle_latency.py            # ~4 min on 2 cores: MiniLM, fp32 and int8

bench_engines.py --batch 1 alternates nine engines in one process, so each engine has rested a few
hundred milliseconds before its call (the other eight ran meanwhile): the regime where bertkit's
OpenMP team suffers most. Here every engine runs alone (a fresh process each, as one server
runs one engine), on the same 40 inputs of 8-64 tokens (bench_engines' lone batches, bertkit as its
engine runs a model; `bertkit_engine_fp32`: the InferenceEngine itself, warmed up as `serve` starts
it, rows in and tensors out), with 0, 20 and 200 ms of rest before each call; bertkit also with
GOMP_SPINCOUNT raised, which keeps libgomp's worker threads spinning ~0.7 s after a call (one core
busy meanwhile) instead of ~10 ms.

Results: benchmarks/results/<cpu class>/idle_latency.{json,md}.
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
INPUTS = 40
RUNS = [("bertkit_fp32", {}), ("bertkit_fp32", {"GOMP_SPINCOUNT": "30000000"}), ("bertkit_engine_fp32", {}),
        ("onnxruntime_fp32", {}),
        ("bertkit_int8", {}), ("bertkit_int8", {"GOMP_SPINCOUNT": "30000000"}), ("onnxruntime_int8", {})]


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


def child(engine: str, threads: int) -> dict:
    """In a fresh process: median ms per call of `engine` after each rest."""
    import torch

    import bench_common as C
    import bench_engines as E

    torch.set_num_threads(threads)
    ours = E.bertkit_model("minilm")
    if engine == "bertkit_engine_fp32":
        run = engine_runner()
    elif engine.startswith("bertkit"):
        run = E.bertkit_runners(ours)[engine]
    else:
        run = E.onnxruntime_runners(ours, Path(tempfile.mkdtemp()), threads, {})[engine]
    batches = [E.Batch(b) for b in C.variable_length_batches(ours.config, 1, count=INPUTS, low=8, high=64)]
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
    return medians


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]))))
        return 0
    import bench_common as C

    machine = C.machine_description()
    rows = []
    for engine, env in RUNS:
        out = subprocess.run([sys.executable, __file__, "--child", engine, "2"], env={**os.environ, **env},
                             capture_output=True, text=True, check=True)
        medians = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append({"engine": engine, "env": env, "median_ms": medians})
        print(engine, env, {k: round(v, 2) for k, v in medians.items()}, flush=True)
    folder = HERE / "results" / machine["cpu_class"]
    folder.mkdir(parents=True, exist_ok=True)
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine, "threads": 2,
               "inputs": INPUTS, "lengths": [8, 64], "rests_s": list(RESTS), "rows": rows}
    (folder / "idle_latency.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"# One input after a rest, each engine alone ({machine['cpu_class']})", "",
             f"`python benchmarks/idle_latency.py` on {results['date']}: {machine['cpu']}, 2 threads, all-MiniLM-L6-v2, "
             f"{INPUTS} inputs of 8-64 tokens, each engine in its own process; median ms per call.", "",
             "| engine | environment | back to back | 20 ms rest | 200 ms rest |", "|---|---|---:|---:|---:|"]
    for r in rows:
        env = ", ".join(f"{k}={v}" for k, v in r["env"].items()) or "defaults"
        lines.append(f"| {r['engine']} | {env} | " + " | ".join(f"{r['median_ms'][str(s)]:.2f}" for s in RESTS) + " |")
    (folder / "idle_latency.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / 'idle_latency.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
