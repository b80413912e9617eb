"""Which kernels pay on this CPU: every speed option against the stock path, in one process.

For the pre-training step (mini: batch 32 x 128, base: batch 8 x 128) and variable-length
inference (lengths 16-128, batch 32), fp32, this alternates round by round

* transformers (sdpa) on the same config, weights, inputs and optimizer: the reference;
* bertkit with its defaults on this CPU (what `cpu_features()` chose);
* bertkit with one option switched (each oneDNN Linear mode, fused QKV off, SDPA instead of the
  written-out attention, torch's dropout masks, the fused GELU off);
* bertkit with every switchable option off ("stock": torch's Linear, SDPA, torch's dropout).

Each row is the speed-up against transformers (median step time ratio, and the median of the
per-round ratios). The decision rule in bertkit/kernels/options.py is read off these tables:
a default must never be slower than the stock path on its CPU class (docs/speed.md).

    python benchmarks/kernel_choice.py --sizes mini,base --output runs/kernel-choice.json
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/kernel_choice.py ...      # an AVX2-only CPU, emulated on an AVX-512 one
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_common as C  # noqa: E402

STOCK = {"onednn_linear": "never", "fused_qkv": False, "attention": "sdpa", "fast_dropout": False,
         "fused_gelu": False}
TRAINING_VARIANTS = {
    "default": {},
    "onednn_linear=always": {"onednn_linear": "always"},
    "onednn_linear=training": {"onednn_linear": "training"},
    "onednn_linear=never": {"onednn_linear": "never"},
    "fused_qkv=0": {"fused_qkv": False},
    "attention=sdpa": {"attention": "sdpa"},
    "fast_dropout=0": {"fast_dropout": False},
    "stock": STOCK,
}
INFERENCE_VARIANTS = {
    "default": {},
    "onednn_linear=always": {"onednn_linear": "always"},
    "onednn_linear=never": {"onednn_linear": "never"},
    "fused_gelu=0": {"fused_gelu": False},
    "fused_qkv=0": {"fused_qkv": False},
    "stock (unpadded)": STOCK,
}
TRAIN_BATCH = {"mini": 32, "base": 8}


def _chosen(variants: dict, names: list[str] | None) -> dict:
    if not names:
        return variants
    return {name: changes for name, changes in variants.items() if name == "default" or name in names}


def training_rows(size: str, rounds: int, log=print, names=None) -> list[dict]:
    from bertkit import BertForPreTraining, kernels

    config = C.bench_config(size)
    torch.manual_seed(0)
    ours = BertForPreTraining(config).train()
    theirs = C.transformers_twin(ours).train()
    batch = C.pretraining_batch(config, TRAIN_BATCH[size], 128)
    opt_ours, opt_theirs = C.bertkit_optimizer(ours), C.transformers_optimizer(theirs)

    def ours_with(changes):
        options = kernels.PROCESS_DEFAULT.replace(**changes)

        def step():
            ours.hold_kernels(options)  # the same model and optimizer, built with these options
            C.training_step(ours, opt_ours, batch, "fp32")
        return step

    steps = {"transformers": lambda: C.training_step(theirs, opt_theirs, batch, "fp32")}
    steps.update({name: ours_with(changes) for name, changes in _chosen(TRAINING_VARIANTS, names).items()})
    times = C.alternate(steps, warmup=1, repeats=rounds)
    rows = _rows(f"pre-training step, batch {TRAIN_BATCH[size]} x 128", size, times)
    for row in rows:
        log(_line(row))
    return rows


def inference_rows(size: str, rounds: int, log=print, names=None) -> list[dict]:
    from bertkit import BertModel, kernels

    config = C.bench_config(size)
    torch.manual_seed(0)
    ours = BertModel(config).eval()
    theirs = C.transformers_twin(ours).eval()
    batches = C.variable_length_batches(config, 32, count=rounds + 1)

    def run(model, changes=None):
        position = [0]
        options = kernels.PROCESS_DEFAULT.replace(**(changes or {}))

        def step():
            if hasattr(model, "hold_kernels"):  # bertkit's model; transformers' has no options
                model.hold_kernels(options)
            with torch.no_grad():
                model(**batches[position[0] % len(batches)])
            position[0] += 1
        return step

    steps = {"transformers": run(theirs)}
    steps.update({name: run(ours, changes) for name, changes in _chosen(INFERENCE_VARIANTS, names).items()})
    times = C.alternate(steps, warmup=1, repeats=rounds)
    rows = _rows("inference, lengths 16-128, batch 32", size, times)
    for row in rows:
        log(_line(row))
    return rows


def _rows(case: str, size: str, times: dict) -> list[dict]:
    theirs = times.pop("transformers")
    rows = []
    for name, ours in times.items():
        cmp = C.compare(ours, theirs)
        # Against the default, > 1: this variant is faster. Paired per round (the same batch and the
        # same moment's load), and from the best round of each (load only ever adds time).
        paired = statistics.median(d / o for d, o in zip(times["default"], ours))
        rows.append({"case": case, "size": size, "variant": name, "speedup": cmp["speedup"],
                     "speedup_paired_median": cmp["speedup_paired_median"], "seconds": cmp["bertkit_s"],
                     "best_s": min(ours), "transformers_s": cmp["transformers_s"],
                     "transformers_best_s": min(theirs), "speedup_best": min(theirs) / min(ours),
                     "vs_default_paired": paired, "vs_default_best": min(times["default"]) / min(ours),
                     "rounds": cmp["rounds"], "times": ours, "transformers_times": theirs})
    return rows


def _line(row: dict) -> str:
    return (f"{row['case']} {row['size']} {row['variant']:<24} {row['seconds']:.3f} s  "
            f"{row['speedup']:.2f}x transformers ({row['speedup_paired_median']:.2f}x paired, {row['speedup_best']:.2f}x "
            f"best rounds); vs default {row['vs_default_paired']:.2f}x paired, {row['vs_default_best']:.2f}x best")


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"CPU class **{m['cpu_class']}**{' (emulated: ' + m['emulation'] + ')' if m.get('emulation') else ''}: "
             f"{m['cpu']}, {m['torch_threads']} threads, flags {', '.join(m.get('isa', []))}; {result['date']}, "
             f"{result['minutes']} min, load {m['load_average_at_start']}.", "",
             "| case | size | variant | s/step (median, best) | vs transformers (median, paired, best) | "
             "vs bertkit default (paired, best) |", "|---|---|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['case']} | {r['size']} | {r['variant']} | {r['seconds']:.3f}, {r['best_s']:.3f} | "
                     f"**{r['speedup']:.2f}x**, {r['speedup_paired_median']:.2f}x, {r['speedup_best']:.2f}x | "
                     f"{r['vs_default_paired']:.2f}x, {r['vs_default_best']:.2f}x |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--cases", default="train,infer", help="train, infer or both")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per variant (after one warm-up)")
    parser.add_argument("--variants", default=None, help="comma-separated variant names (default all; "
                        "'default' is always run)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--output", default=None, help="JSON file for the rows (and a .md beside it)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = C.machine_description()
    started = time.time()
    print(f"CPU class {machine['cpu_class']} {machine.get('emulation') or ''} {machine['cpu']}, "
          f"{machine['torch_threads']} threads, load {machine['load_average_at_start']}", flush=True)
    rows = []
    names = [n.strip() for n in args.variants.split(",")] if args.variants else None

    def save():  # after every case, so that a run cut short keeps what it measured
        result = {"machine": machine, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "minutes": round((time.time() - started) / 60, 1), "rows": rows,
                  "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:]))}
        if args.output:
            out = Path(args.output)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
            out.with_suffix(".md").write_text(markdown(result))
        return result

    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        if "train" in args.cases:
            rows += training_rows(size, args.rounds, lambda line: print(line, flush=True), names)
            save()
        if "infer" in args.cases:
            rows += inference_rows(size, args.rounds + 1, lambda line: print(line, flush=True), names)
            save()
    print(markdown(save()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
