"""The compiled graph with bertkit's GEMM ops (kernels/graph_gemm.py: MKL's packed sgemm at fp32, the
AMX int8 GEMM at int8) against the same graph with inductor's (oneDNN's), one input at a time,
alternated in one process (issue 39); with `--op attention`, the graph with bertkit's attention op
for short inputs against the same graph with torch's SDPA (both with bertkit's GEMMs); with `--op
seven` (int8, AVX2 without VNNI), the int8 graph with 7-bit activations against the exact 8-bit
AVX2 op; with `--op paired` (the same CPUs), the 7-bit op on the engine's weights there
(`quantize_int8(seven_bit=True)`: the feed-forward intermediate Linears at 7 bits, +-63, which its
paired kernel sums two pair products of in int16 before widening) against the same op on 8-bit
weights everywhere (one widening per pair); with `--op gelu` (the AVX2 class: fp32, or int8 without
VNNI), the graph whose feed-forward intermediate GEMM op applies the GELU as it stores its outputs
against the same graph with inductor's GELU loop after it; with `--op pages`, the graph whose GEMM
ops' packs sit on 2 MB pages (graph_gemm.cpp, PackMemory) against the same graph's packs on 4 KB
pages (`bertkit_set_pack_pages(False)` while its packs are made); with `--op norm` (the AVX2 class),
the graph whose residual + LayerNorm blocks are bertkit's op against inductor's loops for them.

    python benchmarks/compiled_gemm_ab.py                          # all-MiniLM-L6-v2, 8-64 tokens, 0.1 s of rest
    python benchmarks/compiled_gemm_ab.py --size base --rounds 80
    python benchmarks/compiled_gemm_ab.py --rest 0 --lengths 128,256
    python benchmarks/compiled_gemm_ab.py --precision int8         # the engine's int8 weights, per-token graph
    python benchmarks/compiled_gemm_ab.py --op attention [--precision int8]
    python benchmarks/compiled_gemm_ab.py --op seven               # int8: 7-bit against 8-bit activations
    python benchmarks/compiled_gemm_ab.py --op paired              # int8: 7-bit against 8-bit weights
    python benchmarks/compiled_gemm_ab.py --op gelu [--precision int8]
    python benchmarks/compiled_gemm_ab.py --op pages [--precision int8]
    python benchmarks/compiled_gemm_ab.py --op norm [--precision int8]

Both graphs are compiled (or loaded from the compile cache) from the same weights, one with
`gemm_ops=False` (`attention_op=False` with `--op attention`, `seven_bit=False` with `--op seven`;
with `--op paired` from the same fp32 weights, quantised with `seven_bit` and without; `gelu_op=False`
with `--op gelu`, `norm_op=False` with `--op norm`; the same package twice with `--op pages`, each load its own constants and packs). Each round sends one input (length a multiple of 8, drawn in LO-HI) through both,
in turns, each call after `--rest` seconds without any. Prints the medians and the paired median of
per-call ratios; with --output, writes compiled_gemm_ab_<size>_<lo>-<hi>_rest<rest>.json there
(compiled_gemm_ab_int8_... at int8; compiled_attention_ab_... with `--op attention`).
"""

from __future__ import annotations

import argparse
import copy
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
    parser.add_argument("--precision", default="fp32", choices=("fp32", "int8"))
    parser.add_argument("--op", default="gemm", choices=("gemm", "attention", "seven", "paired", "gelu", "pages", "norm"),
                        help="which of bertkit's graph ops to A/B (seven, paired: int8 only)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if args.op in ("seven", "paired"):
        args.precision = "int8"
    lo, hi = (int(v) for v in args.lengths.split(","))
    torch.set_num_threads(args.threads)

    model = bench_engines.bertkit_model(args.size)
    other = model
    if args.precision == "int8":  # the engine's int8 weights; the graph quantises per token (kernels/int8.py)
        from bertkit.kernels.int8 import quantize_int8, seven_bit_default

        if args.op == "paired":  # the same fp32 weights at 8 bits, through the same 7-bit op
            other = quantize_int8(copy.deepcopy(model), seven_bit=False)
        quantize_int8(model, seven_bit=seven_bit_default())
    base, ours = graph_names(args)
    without = {"gemm": {"gemm_ops": False}, "attention": {"attention_op": False}, "seven": {"seven_bit": False},
               "paired": {}, "gelu": {"gelu_op": False}, "pages": {}, "norm": {"norm_op": False}}[args.op]
    graphs = {base: CompiledLoneInput(other, output_names_for(model), 512, args.precision, **without),
              ours: CompiledLoneInput(model, output_names_for(model), 512, args.precision)}
    applies = graphs[ours].attention_op if args.op == "attention" else graphs[ours].seven \
        if args.op in ("seven", "paired") else graphs[ours].gelu_op if args.op == "gelu" \
        else graphs[ours].norm_op if args.op == "norm" \
        else graphs[ours].mkl_gemm or graphs[ours].int8_gemm or graphs[ours].fma_gemm
    if not applies:
        raise SystemExit(f"bertkit's {args.op} op does not apply on this CPU (fp32 GEMM: mkl_rows is 0; int8 GEMM: no "
                         "AMX; attention: no AVX-512; seven, paired: VNNI or AMX; gelu, norm: not the avx2 class): "
                         "nothing to compare")

    def one_input(length: int):
        ids = torch.randint(1000, 20000, (1, length))
        ids[0, 0], ids[0, -1] = 101, 102
        return ids, torch.ones_like(ids), torch.zeros_like(ids)

    rng = random.Random(0)
    lengths = [8 * rng.randint(-(-lo // 8), max(1, hi // 8)) for _ in range(args.rounds)]
    times: dict[str, list[float]] = {name: [] for name in graphs}
    with torch.inference_mode():
        if args.op == "pages":  # each graph's packs made on its first call: the base one's on 4 KB pages
            torch.ops.bertkit.bertkit_set_pack_pages(False)
            graphs[base](*one_input(16))
            torch.ops.bertkit.bertkit_set_pack_pages(True)
        for length in sorted(set(lengths)):  # each row count's kernels made before timing
            for graph in graphs.values():
                graph(*one_input(length))
        inputs = one_input(40)
        difference = (graphs[ours](*inputs)[0] - graphs[base](*inputs)[0]).abs().max().item()
        for i, length in enumerate(lengths):
            inputs = one_input(length)
            for name in (list(graphs) if i % 2 else list(graphs)[::-1]):
                if args.rest:
                    time.sleep(args.rest)
                started = time.perf_counter()
                graphs[name](*inputs)
                times[name].append(time.perf_counter() - started)
    medians = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    result = {"size": args.size, "precision": args.precision, "op": args.op, "lengths": [lo, hi], "rest_s": args.rest,
              "rounds": args.rounds, "threads": args.threads, "median_ms": medians, "max_abs_difference": difference,
              "speedup_median": medians[base] / medians[ours],
              "speedup_paired": statistics.median(a / b for a, b in zip(times[base], times[ours])),
              "machine": machine_description(), "torch": torch.__version__}
    print(f"{args.size} {args.precision}, one input of {lo}-{hi} tokens, {args.rest} s of rest: {base} "
          f"{medians[base]:.2f} ms, {ours} {medians[ours]:.2f} ms; the speed-up "
          f"{result['speedup_median']:.3f}x median, {result['speedup_paired']:.3f}x paired; "
          f"outputs {difference:.1e} apart")
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        tag = "" if args.precision == "fp32" else "int8_"
        path = args.output / f"compiled_{args.op}_ab_{tag}{args.size}_{lo}-{hi}_rest{args.rest:g}.json"
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")


def graph_names(args) -> tuple[str, str]:
    """The two graphs' names: without and with the op."""
    if args.op == "attention":
        return "SDPA", "bertkit attention"
    if args.op == "seven":
        return "8-bit AVX2 int8", "7-bit AVX2 int8"
    if args.op == "paired":
        return "7-bit op, 8-bit weights", "7-bit op, 7-bit weights"
    if args.op == "gelu":
        return "inductor's GELU", "the GEMM op's GELU"
    if args.op == "pages":
        return "packs on 4 KB pages", "packs on 2 MB pages"
    if args.op == "norm":
        return "inductor's residual + LayerNorm", "the residual + LayerNorm op"
    return "oneDNN GEMMs", "MKL GEMMs" if args.precision == "fp32" else "AMX int8 GEMMs"


if __name__ == "__main__":
    main()
