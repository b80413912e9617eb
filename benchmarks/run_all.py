"""bertkit vs transformers, side by side on this machine (`make bench`).

Cases (--cases, default all):
  a  pre-training step (forward, backward, AdamW), length 128, per --sizes, fp32 and bf16 autocast
  b  inference on variable-length batches (lengths uniform 16-128, padded to the batch max)
  c  SQuAD-shaped fine-tuning step (BertForQuestionAnswering, length 384)
  d  peak memory of the base pre-training step (batch 32), each framework in a fresh process
  e  create-pretraining-data throughput on the shared corpus (2 workers)
  f  end-to-end GLUE fine-tuning wall time (MRPC subset, all-MiniLM-L6-v2)
  g  levers: bertkit against itself with one speed option off (what each option buys)
  o  offline inference against ONNX Runtime (BERT fusions; fp32, and dynamic int8 on both sides)

Results are kept per CPU class (`bertkit.device.cpu_features().cpu_class`: avx2, avx512,
avx512-bf16), in benchmarks/results/<class>/results.{md,json}, each recording the machine, its
flags and any instruction-set caps it was emulated under.

`--quick` tells, in about a minute, where this machine stands: its CPU class, its matmul peak
against the one in its class's table, bertkit's inference against transformers (case b, mini)
and bertkit against ONNX Runtime and CTranslate2 on all-MiniLM-L6-v2 (benchmarks/bench_engines.py,
a few rounds; needs `pip install -e .[bench]`, left out with a note otherwise), each ratio next to
the committed table of this CPU class. `--quick --cases a,b,c,o` is the longer quick run (under
10 minutes on 2 cores) of the main cases with few rounds. Both write into runs/bench-quick.

Model timings alternate bertkit and transformers in one process, with the same config, weights,
inputs and optimizer (fused AdamW, transformers Trainer's default), and report medians after
warm-up. FLOP/s count the useful work of each case (see bench_common), the same for both
frameworks, against the matmul peak measured in the same run.

    nice -n 5 .venv/bin/python benchmarks/run_all.py --quick          # about a minute, runs/bench-quick
    nice -n 5 .venv/bin/python benchmarks/run_all.py --quick --cases a,b,c,o   # under 10 minutes
    .venv/bin/python benchmarks/run_all.py                             # the committed results
    .venv/bin/python benchmarks/run_all.py --cases a,d --sizes base
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        .venv/bin/python benchmarks/run_all.py ...     # the avx2 class, emulated on an AVX-512 CPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_common as C  # noqa: E402

ALL_CASES = "abcdefgo"
QUICK_CASES = "b"  # with the engines check: about a minute
QUICK_SIZES = "mini"
QUICK_ENGINES = "bertkit_fp32,onnxruntime_fp32,ctranslate2_fp32,bertkit_int8,ctranslate2_int8"
GOALS = {  # issue 17, on every CPU class, default settings: (case, size) -> speed-up wanted
    ("a", "tiny"): 2.0, ("a", "mini"): 2.5, ("a", "base"): 1.3,
    ("b", "mini"): 2.0, ("b", "base"): 2.0,
    ("c", "mini"): 1.3, ("c", "base"): 1.3,
    ("o", "mini"): 1.0, ("o", "base"): 1.0,
}
RESULTS = HERE / "results"
QUICK_TOLERANCE = 0.85  # a quick speed-up under this share of its class table's is flagged


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--cases", default=None, help=f"comma-separated letters (default all; with --quick "
                        f"{','.join(QUICK_CASES)} and the engines check)")
    parser.add_argument("--sizes", default=None, help="model sizes for (a) (default tiny,mini,small,base; with "
                        "--quick mini,base); (b), (c), (g), (o) use the ones of mini and base among them; (o) also takes minilm, "
                        "the real all-MiniLM-L6-v2 weights (--cases o --sizes minilm)")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--quick", action="store_true", help="fewer timed steps, smaller data cases, and a "
                        "comparison with the results table of this CPU class")
    parser.add_argument("--output", default=None, help="results folder (default benchmarks/results/<cpu class>, "
                        "or runs/bench-quick with --quick)")
    parser.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"),
                        help="shared data folder for (e) and (f) (default $BERTKIT_DATA)")
    parser.add_argument("--corpus-fraction", type=float, default=None,
                        help="part of each corpus file for (e) (default 0.1, 0.03 with --quick)")
    parser.add_argument("--glue-examples", type=int, default=None, help="MRPC training examples for (f) "
                        "(default 400, 200 with --quick)")
    parser.add_argument("--memory-batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds of (a), (b) and (c) per row (default "
                        "per size; more rounds where step times vary much from step to step)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-nice", action="store_true", help="do not lower this process's priority")
    parser.add_argument("--engines", action=argparse.BooleanOptionalAction, default=None,
                        help="with --quick: bertkit against ONNX Runtime and CTranslate2 on all-MiniLM-L6-v2, a few rounds "
                        "(default: on when --cases is not given)")
    parser.add_argument("--update", action="store_true", help="rerun only --cases and replace their rows in the "
                        "results.json already in --output (the other rows are kept, with their own date)")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds: at least 1, not {args.rounds}")
    if args.engines is None:
        args.engines = args.quick and args.cases is None
    if args.cases is None:
        args.cases = ",".join(QUICK_CASES if args.quick else ALL_CASES)
    if args.sizes is None:
        args.sizes = (QUICK_SIZES if args.engines else "mini,base") if args.quick else "tiny,mini,small,base"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_nice:
        os.nice(5)  # the machine is shared: benchmarks yield to interactive work
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in ALL_CASES]
    if unknown:
        sys.exit(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(ALL_CASES)}")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    small_set = [s for s in sizes if s in ("mini", "base")] or sizes
    machine = C.machine_description()
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if "bf16" in precisions and not machine["bf16_supported"]:
        print("bf16 is emulated on this CPU (no AVX512-BF16 / AMX): leaving it out", file=sys.stderr)
        precisions.remove("bf16")
    table = RESULTS / machine["cpu_class"]
    out = Path(args.output) if args.output else (HERE.parent / "runs" / "bench-quick" if args.quick else table)
    needs_data = {"e", "f"} & set(cases)
    if needs_data and not args.data_dir:
        sys.exit(f"cases {', '.join(sorted(needs_data))} need the shared data: pass --data-dir or set BERTKIT_DATA")

    started = time.time()
    print(f"CPU class {machine['cpu_class']}{' (emulated: ' + machine['emulation'] + ')' if machine['emulation'] else ''}"
          f", default onednn_linear={machine['default_speed_options']['onednn_linear']}", flush=True)
    print(f"machine: {machine['cpu']}, {machine['logical_cpus']} CPUs, torch {machine['torch']}, "
          f"transformers {machine['transformers']}, {machine['torch_threads']} threads, load {machine['load_average_at_start']}",
          flush=True)
    peak = C.matmul_peak(*((1024, 3) if args.engines else ()))
    print(f"matmul peak GFLOP/s: {peak}", flush=True)
    results = {"machine": machine, "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "quick": args.quick,
               "matmul_peak_gflops": peak, "rows": [], "levers": []}

    import bench_model as M

    def log(line):
        print(line, flush=True)

    for case in cases:
        if case == "a":
            for size in sizes:
                for precision in precisions:
                    results["rows"].append(M.pretraining_case(size, precision, args.quick, log, rounds=args.rounds))
        elif case == "b":
            for size in small_set:
                for precision in precisions:
                    results["rows"].append(M.inference_case(size, precision, args.quick, log, rounds=args.rounds))
        elif case == "c":
            for size in small_set:
                for precision in precisions:
                    results["rows"].append(M.squad_case(size, precision, args.quick, log, rounds=args.rounds))
        elif case == "d":
            from bench_memory import memory_case

            for precision in precisions:
                results["rows"].append(memory_case("base", args.memory_batch_size, precision,
                                                   steps=2, log=log))  # the 2nd step holds optimizer state too
        elif case == "e":
            from bench_data import create_data_case

            fraction = args.corpus_fraction or (0.03 if args.quick else 0.1)
            results["rows"].append(create_data_case(args.data_dir, fraction, workers=2, log=log))
        elif case == "f":
            from bench_glue import glue_case

            examples = args.glue_examples or (200 if args.quick else 400)
            results["rows"].append(glue_case(args.data_dir, "mrpc", max_train_examples=examples,
                                             repeats=1 if args.quick else 2, log=log))
        elif case == "o":
            from bench_onnx import onnx_case

            for size in [s for s in sizes if s in ("mini", "base", "minilm")] or small_set:
                results["rows"] += onnx_case(size, args.quick, log)
        elif case == "g":
            for size in small_set:
                for precision in precisions:
                    results["levers"] += M.lever_case(size, precision, args.quick, log)

    engines = engines_check(args.threads or 2, log) if args.engines else None
    end_peak = C.matmul_peak(*((1024, 3) if args.engines else ()))
    results["matmul_peak_gflops_end"] = end_peak
    results["matmul_peak_gflops"] = {k: max(v, end_peak.get(k, 0.0)) for k, v in peak.items()}
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["minutes"] = round((time.time() - started) / 60, 1)
    out.mkdir(parents=True, exist_ok=True)
    if args.update and (out / "results.json").exists():
        results = merged(json.loads((out / "results.json").read_text()), results, cases)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    report = markdown(results)
    (out / "results.md").write_text(report)
    print(report)
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    if args.quick:
        print(compare_with_table(results, table / "results.json"))
        print(peak_against_table(results, table / "results.json"))
    if engines is not None:
        print(engines_report(engines, out, table))
    return 0


def engines_check(threads: int, log) -> dict | str:
    """bench_engines' quick run on all-MiniLM-L6-v2 (a few engines, 2 rounds of batches of 32, then 10
    single inputs of 8-64 tokens: the batch-1 row), or why it cannot run."""
    import bench_engines as E

    missing = [m for m in ("onnxruntime", "ctranslate2", "onnx") if not _importable(m)]
    if missing:
        return f"engines check left out: {', '.join(missing)} not installed (pip install -e .[bench])"
    argv = ["--quick", "--sizes", "minilm", "--engines", QUICK_ENGINES, "--rounds", "2", "--threads", str(threads)]
    args = E.parse_args(argv)
    torch.set_num_threads(threads)  # every engine gets the same number
    results = {"machine": C.machine_description(), "command": "run_all.py --quick: bench_engines.py " + " ".join(argv),
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "quick": True, "threads": threads,
               "versions": E.engine_versions(), "levers": []}
    started = time.time()
    results["rows"] = [E.run_size("minilm", args, log)]
    single = E.parse_args(argv[:-4] + ["--batch", "1", "--lengths", "8,64", "--rounds", "10", "--threads", str(threads)])
    results["batch1_rows"] = [E.run_size("minilm", single, log)]
    results["minutes"] = round((time.time() - started) / 60, 1)
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def engines_report(engines: dict | str, out: Path, table: Path) -> str:
    import bench_engines as E

    if isinstance(engines, str):
        return engines + "\n"
    (out / "engines.json").write_text(json.dumps(engines, indent=1, default=float) + "\n")
    (out / "engines.md").write_text(E.markdown(engines))
    text = E.compare_with_table(engines, table / "engines.json")
    if engines.get("batch1_rows"):
        single = E.markdown({**engines, "rows": engines["batch1_rows"]})
        (out / "engines_batch1.md").write_text(single)
        text += "\n## Batch 1 (one input of 8-64 tokens at a time)\n\n" + "\n".join(
            line for line in single.splitlines() if line.startswith("|")) + "\n"
    return text


def peak_against_table(results: dict, table_file: Path) -> str:
    """This machine's matmul peak against the one its class's table was measured at."""
    if not table_file.is_file():
        return ""
    table = json.loads(table_file.read_text())
    lines = []
    for kind in ("fp32_default", "fp32_onednn"):
        mine, theirs = results["matmul_peak_gflops"].get(kind), table.get("matmul_peak_gflops", {}).get(kind)
        if mine and theirs:
            lines.append(f"matmul peak {kind}: {mine:.0f} GFLOP/s here, {theirs:.0f} in the table ({mine / theirs:.2f}x)")
    return "\n".join(lines) + "\n" if lines else ""


def row_key(row: dict) -> tuple:
    return row["case"][0], row.get("size"), row.get("precision")


def compare_with_table(results: dict, table_file: Path) -> str:
    """Each quick speed-up next to the one in this CPU class's table; a drop below
    QUICK_TOLERANCE of the table's is flagged (quick rounds are few: a flag asks for a full rerun)."""
    cls = results["machine"]["cpu_class"]
    if not table_file.is_file():
        return (f"No results table for CPU class {cls} yet ({table_file}): run benchmarks/run_all.py "
                f"(without --quick) to make one.")
    table = json.loads(table_file.read_text())
    reference = {row_key(r): r for r in table["rows"] if "speedup" in r}
    lines = [f"## Quick run against the {cls} table ({table_file}, {table.get('date')}, "
             f"{table['machine']['cpu']}{', emulated: ' + table['machine']['emulation'] if table['machine'].get('emulation') else ''})",
             "", "| case | size | precision | quick | table | quick / table |", "|---|---|---|---:|---:|---|"]
    for r in results["rows"]:
        ref = reference.get(row_key(r))
        if ref is None or "speedup" not in r:
            continue
        share = r["speedup"] / ref["speedup"]
        flag = "" if share >= QUICK_TOLERANCE else " **slower than the table**"
        lines.append(f"| {r['case']} | {r['size']} | {r['precision']} | {r['speedup']:.2f}x | {ref['speedup']:.2f}x | "
                     f"{share:.2f}{flag} |")
    return "\n".join(lines) + "\n"


def merged(previous: dict, update: dict, cases: list[str]) -> dict:
    """The previous results with the rows the update measured (same case, size, precision) replaced
    by the update's; the others are kept. Levers are measured per (size, precision) as a set: an
    update replaces all lever rows of the sizes and precisions it ran (renamed levers included)."""

    def key(row):
        if "lever" in row:
            return "g", row.get("size"), row.get("precision")
        return row["case"][0], row.get("size"), row.get("precision")

    def order(rows):
        return {key(r): i for i, r in enumerate(rows)}

    for field in ("rows", "levers"):
        new_keys = {key(r) for r in update[field]}
        kept = [r for r in previous.get(field, []) if key(r) not in new_keys]
        position = order(previous.get(field, []))
        # Replaced rows keep their place in the table; new ones go after their case's rows.
        combined = kept + update[field]
        combined.sort(key=lambda r: (r["case"][0] if field == "rows" else 0, position.get(key(r), len(position))))
        previous[field] = combined
    previous.setdefault("updates", []).append(
        {"cases": cases, "command": update["command"], "date": update["date"], "minutes": update["minutes"],
         "load_average": [update["machine"]["load_average_at_start"], update["load_average_at_end"]],
         "matmul_peak_gflops": update["matmul_peak_gflops"]})
    return previous


# ---------------------------------------------------------------- the report


def pct(gflops: float, peak: float) -> str:
    return f"{gflops:.0f} ({100 * gflops / peak:.0f}%)" if peak else f"{gflops:.0f}"


def markdown(results: dict) -> str:
    m, peak = results["machine"], results["matmul_peak_gflops"]
    lines = ["# bertkit vs transformers: benchmark results", "",
             f"Run `{results['command']}` on {results['date']} ({results['minutes']} min"
             f"{', quick mode: few steps, noisy' if results['quick'] else ''}).", "",
             f"Machine: {m['cpu']} (family {m.get('cpu_family', '?')} model {m.get('cpu_model', '?')}), "
             f"{m['logical_cpus']} logical CPUs ({', '.join(m.get('isa', []))}), "
             f"torch {m['torch']} with {m['torch_threads']} thread{'s' if m['torch_threads'] > 1 else ''}, "
             f"transformers {m['transformers']}, "
             f"Python {m['python']}. Load average at start {m['load_average_at_start']}, at end "
             f"{results['load_average_at_end']} (the machine is shared: absolute numbers move with the load, "
             "ratios much less: both frameworks alternate step by step).", "",
             f"Measured matmul peak (a square GEMM: 2048^3, 1024^3 in the one-minute quick check; best of start and end of the run): fp32 default (MKL) "
             f"{peak.get('fp32_default', 0):.0f} GFLOP/s, fp32 oneDNN {peak.get('fp32_onednn', 0):.0f}, "
             f"bf16 {peak.get('bf16', 0):.0f}.", ""]
    if m.get("emulation"):
        lines += [f"CPU class **{m['cpu_class']}, emulated** on this machine with `{m['emulation']}` (oneDNN, ATen "
                  "and MKL capped to these instructions; fbgemm's int8 kernels are not capped).", ""]
    else:
        lines += [f"CPU class **{m.get('cpu_class', '?')}**.", ""]
    for u in results.get("updates", []):
        lines += [f"Case{'s' if len(u['cases']) > 1 else ''} {', '.join(u['cases'])} rerun with `{u['command']}` on {u['date']} ({u['minutes']} min, "
                  f"load {u['load_average'][0]} to {u['load_average'][1]}, matmul peak {u['matmul_peak_gflops']}).", ""]
    model_rows = [r for r in results["rows"] if r["case"][0] in "abc"]
    onnx_rows = [r for r in results["rows"] if r["case"][0] == "o"]
    if model_rows:
        lines += ["## Model speed (same config, weights, inputs, optimizer; alternated; medians)", "",
                  "| case | size | precision | shape | bertkit seq/s | transformers seq/s | speed-up | "
                  "bertkit GFLOP/s (% of peak) | transformers GFLOP/s (% of peak) | rounds |",
                  "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in model_rows:
            p = peak.get("bf16" if r["precision"] == "bf16" else "fp32_onednn", 0)
            lines.append(f"| {r['case']} | {r['size']} | {r['precision']} | {r['shape']} | "
                         f"{C.fmt_rate(r['bertkit_seq_per_s'])} | {C.fmt_rate(r['transformers_seq_per_s'])} | "
                         f"**{r['speedup']:.2f}x** ({r['speedup_paired_median']:.2f}x paired) | "
                         f"{pct(r['bertkit_gflops'], p)} | {pct(r['transformers_gflops'], p)} | {r['rounds']} |")
        lines += ["", "Speed-up: transformers' median step time / bertkit's (in brackets the median of the "
                  "per-round ratios). GFLOP/s: useful FLOPs (matmuls and attention over real tokens, MLM "
                  "vocabulary projection at the masked positions only; the same count for both frameworks) "
                  "per second, as % of the bf16 peak for bf16 rows and of the fp32 oneDNN peak for fp32 rows. "
                  "(a) uses full-length rows with 19 masked positions each and NSP labels; (b) BertModel "
                  "under no_grad; (c) full-length windows with start/end labels.", ""]
        padding = [r["padding_fraction"] for r in model_rows if "padding_fraction" in r]
        if padding:
            share = sum(padding) / len(padding)
            lines += [f"(b): {100 * share:.0f}% of the positions in these batches are padding, so running only the "
                      f"real tokens can cut the token-wise work (projections, feed-forward) by at most "
                      f"{1 / (1 - share):.2f}x; bertkit also runs attention on the packed real tokens, sequence by "
                      "sequence in fp32 and in groups of similar length in bf16, where transformers attends over "
                      "the padded (B, T) layout with a mask.", ""]
    if onnx_rows:
        lines += ["## Offline inference against ONNX Runtime (same weights and batches; alternated; medians)", "",
                  "| size | precision | shape | bertkit seq/s | ONNX Runtime seq/s | speed-up | rounds | output check |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        for r in onnx_rows:
            check = r["checks"]["ort_fp32" if r["precision"] == "fp32" else "bertkit_int8"]
            lines.append(f"| {r['size']} | {r['precision']} | {r['shape']} | {C.fmt_rate(r['bertkit_seq_per_s'])} | "
                         f"{C.fmt_rate(r['onnxruntime_seq_per_s'])} | **{r['speedup']:.2f}x** "
                         f"({r['speedup_paired_median']:.2f}x paired) | {r['rounds']} | "
                         f"max abs diff {check['max_abs_diff_vs_bertkit_fp32']:.1e} |")
        lines += ["", "ONNX Runtime runs the graph of transformers' BertModel optimised with onnxruntime.transformers' "
                  "BERT fusions (" + ", ".join(f"{k} x{v}" for k, v in onnx_rows[0]["onnxruntime_fused_ops"].items())
                  + ") at ORT_ENABLE_ALL, the int8 rows that graph after onnxruntime.quantization.quantize_dynamic; "
                  "bertkit int8 is `--quantize int8` (kernels/int8.py). Output check: fp32 rows ONNX Runtime "
                  "against bertkit fp32, int8 rows bertkit int8 against bertkit fp32, at real positions.", ""]
        for r in onnx_rows:
            if r["precision"] == "int8":
                lines.append(f"{r['size']}: bertkit int8 is {r['int8_vs_bertkit_fp32']:.2f}x bertkit fp32; ONNX Runtime "
                             f"int8 is {r['ort_int8_vs_bertkit_fp32']:.2f}x bertkit fp32.")
        lines.append("")
    memory = [r for r in results["rows"] if r["case"].startswith("d")]
    if memory:
        lines += ["## Peak memory (fresh process per framework, 2 steps, peak resident set size)", "",
                  "| size | precision | shape | bertkit peak MB | transformers peak MB | ratio | bertkit step MB | "
                  "transformers step MB | getrusage MB (bertkit / transformers) |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in memory:
            lines.append(f"| {r['size']} | {r['precision']} | {r['shape']} | {r['bertkit_peak_mb']:.0f} | "
                         f"{r['transformers_peak_mb']:.0f} | **{r['ratio']:.2f}** | {r['bertkit_step_mb']:.0f} | "
                         f"{r['transformers_step_mb']:.0f} | {r.get('bertkit_getrusage_mb', 0):.0f} / "
                         f"{r.get('transformers_getrusage_mb', 0):.0f} |")
        lines += ["", "Peak: VmHWM, the kernel's resident high-water mark of the child process. Step MB: peak minus "
                  "the resident size once model, optimizer and batch were built (activations, gradients, optimizer "
                  "state, allocator slack). getrusage's ru_maxrss inherits the parent's high-water mark through "
                  "fork + exec on Linux, so it can read high.", ""]
    data = [r for r in results["rows"] if r["case"].startswith("e")]
    for r in data:
        lines += ["## create-pretraining-data (bertkit only)", "",
                  f"{r['processed_mb']} MB of the shared corpus ({100 * r['fraction']:.0f}% of each of "
                  f"{len(r['files'])} files) with {r['workers']} workers, dupe_factor 1, static masking, length 128: "
                  f"{r['seconds']} s = **{r['mb_per_s']:.2f} MB/s**, {r['instances_per_s']:.0f} instances/s, "
                  f"{r['tokens_per_s'] / 1e3:.0f}k corpus tokens/s; mean instance fill {100 * r['mean_instance_fill']:.0f}% "
                  f"of 128. Whole corpus ({r['whole_corpus_mb']} MB): projected "
                  f"**{r['projected_whole_corpus_s'] / 60:.1f} min**.", ""]
    glue = [r for r in results["rows"] if r["case"].startswith("f")]
    for r in glue:
        lines += ["## End-to-end fine-tuning", "",
                  f"{r['task'].upper()}, {r['model']}, {r['train_examples']} training examples, {r['epochs']} epoch, "
                  f"batch {r['batch_size']}, precision {r['precision']}, full dev set; reference: {r['reference']}. "
                  f"bertkit {r['bertkit_s']:.1f} s vs transformers {r['transformers_s']:.1f} s: **{r['speedup']:.2f}x** "
                  f"(dev scores {', '.join(f'{100 * s:.1f}' for s in r['bertkit_scores'])} vs "
                  f"{', '.join(f'{100 * s:.1f}' for s in r['transformers_scores'])}).", ""]
    if results["levers"]:
        lines += ["## What each speed option buys (bertkit defaults vs that option off; alternated)", "",
                  "| lever | case | size | precision | gain |", "|---|---|---|---|---:|"]
        for r in results["levers"]:
            lines.append(f"| {r['lever']} | {r['case']} | {r['size']} | {r['precision']} | "
                         f"{r['gain']:.2f}x ({r['gain_paired_median']:.2f}x paired) |")
        lines.append("")
    lines += goals(results)
    return "\n".join(lines) + "\n"


def goals(results: dict) -> list[str]:
    rows = []
    for r in results["rows"]:
        key = (r["case"][0], r.get("size"))
        if key in GOALS:
            target = GOALS[key]
            rows.append((f"{r['case']} {r['size']} {r['precision']} >= {target}x", f"{r['speedup']:.2f}x",
                         r["speedup"] >= target))
        if r["case"][0] == "a" and r["size"] == "base" and r["precision"] == "bf16":
            share = r["bertkit_gflops"] / results["matmul_peak_gflops"].get("bf16", float("inf"))
            rows.append(("bf16 base pre-training >= 55% of the bf16 matmul peak", f"{100 * share:.0f}%", share >= 0.55))
        if r["case"][0] == "d":
            rows.append((f"base peak memory ({r['precision']}) <= 0.8x transformers'", f"{r['ratio']:.2f}x",
                         r["ratio"] <= 0.8))
        if r["case"][0] == "e":
            rows.append(("whole corpus to length-128 instances < 5 min (2 workers)",
                         f"{r['projected_whole_corpus_s'] / 60:.1f} min (projected)", r["projected_whole_corpus_s"] < 300))
    if not rows:
        return []
    return ["## Goals (issue 17, every CPU class)", "", "| goal | measured | met |", "|---|---:|---|"] + \
        [f"| {g} | {v} | {'yes' if ok else '**no**'} |" for g, v, ok in rows] + [""]


if __name__ == "__main__":
    sys.exit(main())
