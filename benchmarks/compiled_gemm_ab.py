"""The compiled fp32 graph with MKL's GEMMs (kernels/graph_gemm.py) against the same graph with
oneDNN's, one input at a time, alternated in one process (issue 39).

    python benchmarks/compiled_gemm_ab.py                          # all-MiniLM-L6-v2, 8-64 tokens, 0.1 s of rest
    python benchmarks/compiled_gemm_ab.py --size base --rounds 80
    python benchmarks/compiled_gemm_ab.py --rest 0 --lengths 128,256

Both graphs are compiled (or loaded from the compile cache) from the same weights: one from a model
holding this CPU's options, one holding `mkl_rows=0` (so it keeps inductor's oneDNN GEMMs). Each
round sends one input (length a multiple of 8, drawn in LO-HI) through both, in turns, each call
after `--rest` seconds without any. Prints the medians and the paired median of per-call ratios; with
--output, writes compiled_gemm_ab_<size>_<lo>-<hi>_rest<rest>.json there.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engines  # noqa: E402
from bench_common import machine_description  # noqa: E402

from bertkit.inference.compiled import CompiledLoneInput  # noqa: E402
from bertkit.inference.export import output_names_for  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="minilm", choices=("minilm", "base"))
    parser.add_argument("--lengths", default="8,64", help="LO,HI tokens (rounded to multiples of 8)")
    parser.add_argument("--rest", type=float, default=0.1, help="seconds without any call before each timed call")
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    lo, hi = (int(v) for v in args.lengths.split(","))
    torch.set_num_threads(args.threads)

    mkl_model = bench_engines.bertkit_model(args.size)
    onednn_model = bench_engines.bertkit_model(args.size)
    onednn_model.hold_kernels(onednn_model.kernels.replace(mkl_rows=0))
    graphs = {"oneDNN GEMMs": CompiledLoneInput(onednn_model, output_names_for(onednn_model), 512),
              "MKL GEMMs": CompiledLoneInput(mkl_model, output_names_for(mkl_model), 512)}
    if not graphs["MKL GEMMs"].mkl_gemm:
        raise SystemExit("this CPU's options do not take MKL for few rows (mkl_rows is 0): nothing to compare")

    def one_input(length: int):
        ids = torch.randint(1000, 20000, (1, length))
        ids[0, 0], ids[0, -1] = 101, 102
        return ids, torch.ones_like(ids), torch.zeros_like(ids)

    rng = random.Random(0)
    lengths = [8 * rng.randint(-(-lo // 8), max(1, hi // 8)) for _ in range(args.rounds)]
    times: dict[str, list[float]] = {name: [] for name in graphs}
    with torch.inference_mode():
        for length in sorted(set(lengths)):  # each row count's kernels made before timing
            for graph in graphs.values():
                graph(*one_input(length))
        inputs = one_input(40)
        difference = (graphs["MKL GEMMs"](*inputs)[0] - graphs["oneDNN GEMMs"](*inputs)[0]).abs().max().item()
        for i, length in enumerate(lengths):
            inputs = one_input(length)
            for name in (list(graphs) if i % 2 else list(graphs)[::-1]):
                if args.rest:
                    time.sleep(args.rest)
                started = time.perf_counter()
                graphs[name](*inputs)
                times[name].append(time.perf_counter() - started)
    medians = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    result = {"size": args.size, "lengths": [lo, hi], "rest_s": args.rest, "rounds": args.rounds,
              "threads": args.threads, "median_ms": medians, "max_abs_difference": difference,
              "mkl_speedup_median": medians["oneDNN GEMMs"] / medians["MKL GEMMs"],
              "mkl_speedup_paired": statistics.median(a / b for a, b in zip(times["oneDNN GEMMs"], times["MKL GEMMs"])),
              "machine": machine_description(), "torch": torch.__version__}
    print(f"{args.size}, one input of {lo}-{hi} tokens, {args.rest} s of rest: oneDNN GEMMs "
          f"{medians['oneDNN GEMMs']:.2f} ms, MKL GEMMs {medians['MKL GEMMs']:.2f} ms; MKL's speed-up "
          f"{result['mkl_speedup_median']:.3f}x median, {result['mkl_speedup_paired']:.3f}x paired; "
          f"outputs {difference:.1e} apart")
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        path = args.output / f"compiled_gemm_ab_{args.size}_{lo}-{hi}_rest{args.rest:g}.json"
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
