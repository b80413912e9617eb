"""`bertkit plot RUN_DIR`: PNG curves (loss, MLM/NSP accuracy, learning rate, a fine-tuning run's dev
metrics) from metrics.jsonl."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..errors import BertkitError
from ..outputs import atomic_write, check_output_file


def read_metrics(run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """(training records, evaluation records) from a run's metrics.jsonl."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise BertkitError("no metrics.jsonl (is this a bertkit run directory?)", path=str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BertkitError(f"not UTF-8 text ({e.reason})", path=str(path)) from None
    train, evals = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise BertkitError(f"not a JSON object ({getattr(e, 'msg', 'nested too deeply')})",
                               path=str(path), line=n) from None
        if not isinstance(record, dict):
            raise BertkitError(f"expected a JSON object, found {type(record).__name__}", path=str(path), line=n)
        if not _is_number(record.get("step")):
            raise BertkitError("record has no numeric \"step\"", path=str(path), line=n)
        (evals if record.get("eval") else train).append(record)
    return train, evals


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# figure file -> [(record kind, key, label)]
FIGURES = {
    "loss.png": [("train", "loss", "train loss"), ("train", "mlm_loss", "train MLM loss"),
                 ("train", "nsp_loss", "train NSP loss"), ("eval", "mlm_loss", "held-out MLM loss")],
    "accuracy.png": [("train", "mlm_accuracy", "train MLM acc."), ("train", "nsp_accuracy", "train NSP acc."),
                     ("eval", "mlm_accuracy", "held-out MLM acc."), ("eval", "nsp_accuracy", "held-out NSP acc.")],
    "learning_rate.png": [("train", "learning_rate", "learning rate")],
}
# A series this short is drawn with a marker at every point: a line alone would hide one point (a
# short run's single logged step) and make three look like a kink.
FEW_POINTS = 20
# A fine-tuning run's evaluations (pre-training's held-out ones have figures above): every numeric dev metric.
DEV_FIGURE = "dev_metrics.png"
NOT_DEV_METRICS = {"step", "eval", "elapsed_s"}
# Held-out accuracy against wall-clock, for runs that record it (budgeted pre-training does).
WALL_CLOCK_FIGURE = ("heldout_vs_time.png", [("mlm_accuracy", "held-out MLM acc."),
                                             ("nsp_accuracy", "held-out NSP acc.")])


def plot_run(run_dir: str | Path, output_dir: str | Path | None = None, title: str | None = None,
             overwrite: bool = True) -> list[Path]:
    import matplotlib  # heavy (about a second to import): only `bertkit plot` and reproduce's curves need it

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    train, evals = read_metrics(run_dir)
    if not train and not evals:
        raise BertkitError("no records to plot (the file is empty)", path=str(Path(run_dir) / "metrics.jsonl"))
    out = Path(output_dir or run_dir)
    for name in (*FIGURES, DEV_FIGURE, WALL_CLOCK_FIGURE[0]):  # before drawing: refuse what would be replaced
        check_output_file(out / name, overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, series in FIGURES.items():
        fig, ax = plt.subplots(figsize=(6, 3.6))
        drawn = 0
        for kind, key, label in series:
            records = train if kind == "train" else evals
            points = [(r["step"], r[key]) for r in records if _is_number(r.get(key))]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if kind == "eval" or len(xs) <= FEW_POINTS else None, markersize=3,
                        label=label)
                drawn += 1
        if not drawn:
            plt.close(fig)
            continue
        written.append(_save(fig, ax, f"{title or Path(run_dir).name}: {name[:-4].replace('_', ' ')}", out / name))
    dev_keys = sorted({k for r in evals for k, v in r.items() if k not in NOT_DEV_METRICS and _is_number(v)})
    if dev_keys and not any("mlm_loss" in r for r in evals):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for key in dev_keys:
            xs, ys = zip(*[(r["step"], r[key]) for r in evals if _is_number(r.get(key))])
            ax.plot(xs, ys, marker="o", markersize=3, label=f"dev {key.replace('_', ' ')}")
        written.append(_save(fig, ax, f"{title or Path(run_dir).name}: dev metrics", out / DEV_FIGURE))
    name, series = WALL_CLOCK_FIGURE
    fig, ax = plt.subplots(figsize=(6, 3.6))
    drawn = 0
    for key, label in series:
        points = [(r["elapsed_s"] / 60, r[key]) for r in evals
                  if isinstance(r.get(key), (int, float)) and isinstance(r.get("elapsed_s"), (int, float))]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
            drawn += 1
    if drawn:
        written.append(_save(fig, ax, f"{title or Path(run_dir).name}: held-out accuracy", out / name,
                             xlabel="wall-clock minutes"))
    plt.close(fig)
    return written


def _save(fig, ax, title: str, path: Path, xlabel: str = "optimizer step") -> Path:
    """Label, lay out and write one figure atomically, then free it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a pre-training or fine-tuning output directory with metrics.jsonl")
    p.add_argument("--output", help="where the PNGs go (default: the run directory)")
    p.add_argument("--overwrite", action="store_true", help="replace PNGs an earlier plot wrote there")


def run_from_args(args) -> int:
    for path in plot_run(args.run_dir, args.output, overwrite=args.overwrite):
        print(path)
    return 0
