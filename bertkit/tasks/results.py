"""What a fine-tuning task returns and writes: `TaskResult` (the one result shape), results.json's
layout with per-setting statistics over seeds, prediction files and the best run's metrics.jsonl.

Every metric is a fraction (0..1), whatever unit the task's official scorer uses."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Sequence

from ..errors import BertkitError
from ..outputs import atomic_open, atomic_write_text
from ..tables import TableWriter
from .runs import RunResult, run_name

# The metric values a TaskResult holds are fractions (0..1); the SQuAD evaluators report percent.
PERCENT = 100.0


@dataclasses.dataclass
class TaskResult:
    """What every task's `finetune` (and SQuAD's `predict`) returns: one shape for the command line,
    `bertkit reproduce` and scripts.

    `metrics` are the best run's dev metrics as fractions (0..1), whatever unit the task's official
    scorer uses; `metric` names the headline one (the paper's table cell); `run_metrics` holds each
    run's dev metrics in the same units (one entry per configuration of the sweep); `document` is
    results.json as written (the task's own details); `model_dir` is where the best model was saved.
    """

    task: str
    metric: str
    metrics: dict
    run_metrics: list[dict] = dataclasses.field(default_factory=list)
    document: dict = dataclasses.field(default_factory=dict)
    output_dir: str | None = None
    model_dir: str | None = None

    @property
    def value(self) -> float | None:
        value = self.metrics.get(self.metric)
        return None if value is None else float(value)

    @property
    def run_values(self) -> list[float]:
        """Each run's headline metric (not the selection score, which may average two metrics)."""
        return [float(m[self.metric]) for m in self.run_metrics if isinstance(m.get(self.metric), (int, float))]


def summarize(runs: list[RunResult]) -> list[dict]:
    """Per hyper-parameter configuration (seeds pooled): mean, sd, median of the score and each metric."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in runs:
        key = tuple((k, v) for k, v in sorted(r.config.items()) if k != "seed")
        groups.setdefault(key, []).append(r)
    table = []
    for key, rs in groups.items():
        row = {"config": dict(key), "n": len(rs), "seeds": [r.config.get("seed") for r in rs]}
        names = ["score"] + sorted({m for r in rs for m in r.metrics if isinstance(r.metrics[m], (int, float))})
        for name in names:
            vals = [r.score if name == "score" else r.metrics[name] for r in rs if name == "score" or name in r.metrics]
            row[name] = {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                         "median": statistics.median(vals)}
        table.append(row)
    return table


def results_document(task: str, best: RunResult, runs: list[RunResult], extra: dict | None = None) -> dict:
    """The results.json layout every sentence-level task writes."""
    def run_dict(r: RunResult) -> dict:
        return {"config": r.config, "metrics": r.metrics, "score": r.score, "seconds": round(r.seconds, 3)}

    return {"task": task, "metrics": best.metrics,
            "runs": [run_dict(r) for r in runs],
            "best": {"config": best.config, "metrics": best.metrics, "score": best.score},
            "summary": summarize(runs), **(extra or {})}


def write_predictions(path: Path, indices: Sequence, predictions: Sequence) -> None:
    if len(indices) != len(predictions):
        raise BertkitError(f"{len(predictions)} predictions for {len(indices)} examples", path=str(path))
    with atomic_open(path) as handle:  # an id holding a tab or line break is quoted, never written raw
        table = TableWriter(handle, "tsv")
        table.writerow(["index", "prediction"])
        for i, p in zip(indices, predictions):
            table.writerow([str(i), str(p)])


def publish_best_metrics(runs_dir: str | Path, best: RunResult, output_dir: str | Path) -> None:
    """The best run's metrics.jsonl, copied beside the model (`bertkit plot OUTPUT` draws it); every
    run's own stays in runs_dir/<run_name>/."""
    source = Path(runs_dir) / run_name(best.config) / "metrics.jsonl"
    if source.is_file():
        atomic_write_text(Path(output_dir) / "metrics.jsonl", source.read_text(encoding="utf-8"))
