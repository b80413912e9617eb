"""The learning curve's numbers and words: pre-trained BERT against random init of the same
architecture, per task and fine-tuning set size, over seeds.

Each point: per model, the learning rate of the grid with the best mean dev score over the seeds
(the paper's protocol, the same grid for both models), that rate's mean and sample sd (n - 1), the
difference of the means and the noise threshold of the project's one rule (metrics/seeds.py,
`NOISE_RULE`: twice the larger of the two sds), so this report and the ablation report call the same
gap the same way. The two are within noise at a point when the gap is not beyond that threshold. A task's verdict (`curve_verdict`) is
read from its largest size down: the smallest size from which every point on is within noise, or,
when the largest is not, which model is still ahead there.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Mapping, Sequence

from ..metrics.seeds import NOISE_RULE, SeedStats, compare_seeds, seed_stats
from ..tasks.registry import BENCHMARKS

CURVE_NOISE_RULE = ("within noise unless beyond it by the rule of the ablation report: " + NOISE_RULE
                    + "; each model's runs at its chosen learning rate")
MODEL_LABELS = {"bert": "BERT", "random-init": "random init"}


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    size: int  # examples asked for
    used: int  # examples trained on (the whole training set when it is smaller than `size`)
    bert: SeedStats
    bert_learning_rate: float
    random: SeedStats
    random_learning_rate: float
    threshold: float | None  # the gap beyond which the two differ (2 x the larger sd); None without an sd

    @property
    def difference(self) -> float:
        return self.bert.mean - self.random.mean

    @property
    def within_noise(self) -> bool | None:
        """None without a noise estimate (fewer than two runs on both sides)."""
        if self.threshold is None:
            return None
        return abs(self.difference) <= self.threshold


def best_learning_rate(runs: Mapping[float, Sequence[float]]) -> tuple[float, list[float]]:
    """The learning rate whose runs have the best mean (the first of the grid on a tie) and its runs."""
    best = max(runs, key=lambda lr: statistics.fmean(runs[lr]))  # max keeps the first of equal means
    return best, list(runs[best])


def curve_points(by_model: Mapping[str, Mapping[int, Mapping]]) -> list[CurvePoint]:
    """Points of one task from {model: {size: {"used": n, "runs": {learning rate: [scores]}}}}, by size;
    a size only one model ran is left out."""
    points = []
    bert, random_init = by_model.get("bert", {}), by_model.get("random-init", {})
    for size in sorted(set(bert) & set(random_init)):
        bert_lr, bert_runs = best_learning_rate(bert[size]["runs"])
        random_lr, random_runs = best_learning_rate(random_init[size]["runs"])
        gap = compare_seeds(bert_runs, random_runs)
        points.append(CurvePoint(size, min(bert[size]["used"], random_init[size]["used"]), seed_stats(bert_runs),
                                 bert_lr, seed_stats(random_runs), random_lr, gap.threshold))
    return points


def size_label(point: CurvePoint) -> str:
    return f"{point.used:,} (all)" if point.used < point.size else f"{point.size:,}"


def curve_verdict(points: Sequence[CurvePoint]) -> str:
    """In plain words, from the numbers: from which size on the two are within noise, or who is still
    ahead at the largest size."""
    if not points:
        return "no verdict: no size ran with both models"
    if any(p.within_noise is None for p in points):
        return "no verdict: a point has fewer than two runs per model, so no noise estimate"
    last = points[-1]
    if not last.within_noise:
        leader = "pre-training" if last.difference > 0 else "random init"
        return f"{leader} still ahead at {_examples(last)} (|diff| {abs(last.difference):.1f} > 2 x the larger sd " \
               f"{last.threshold:.1f})"
    first_within = len(points) - 1
    while first_within > 0 and points[first_within - 1].within_noise:
        first_within -= 1
    text = f"from {_examples(points[first_within])} on the two are within noise (|diff| <= 2 x the larger sd)"
    # Below that size at least one point is beyond the noise; the others there are within it.
    before = points[:first_within]
    ahead = [p for p in before if not p.within_noise and p.difference > 0]
    behind = [p for p in before if not p.within_noise and p.difference < 0]
    level = [p for p in before if p.within_noise]
    said = []
    if ahead:
        said.append(f"pre-training is ahead at {', '.join(size_label(p) for p in ahead)}")
    if behind:
        said.append(f"random init is ahead at {', '.join(size_label(p) for p in behind)}")
    if level:
        said.append(f"the two are within noise at {', '.join(size_label(p) for p in level)}")
    return text + "; below that " + "; and ".join(said) if said else text


def _examples(point: CurvePoint) -> str:
    if point.used < point.size:
        return f"{point.used:,} examples (the whole training set)"
    return f"{point.size:,} examples"


def curve_table(task: str, points: Sequence[CurvePoint]) -> list[str]:
    """The markdown table of one task's curve, then its verdict."""
    label = BENCHMARKS[task].label if task in BENCHMARKS else task
    lines = [f"### {label}", "",
             "| examples | BERT mean | sd | lr | random init mean | sd | lr | diff | 2 x larger sd | within noise? |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in points:
        within = {True: "yes", False: "no", None: "-"}[p.within_noise]
        lines.append(f"| {size_label(p)} | {p.bert.mean:.1f} | {_sd(p.bert.sd)} | {p.bert_learning_rate:g} | "
                     f"{p.random.mean:.1f} | {_sd(p.random.sd)} | {p.random_learning_rate:g} | {p.difference:+.1f} | "
                     f"{_sd(p.threshold)} | {within} |")
    lines += ["", f"Verdict ({label}): {curve_verdict(points)}.", ""]
    return lines


def point_record(point: CurvePoint) -> dict:
    return {"size": point.size, "used": point.used, "bert": dataclasses.asdict(point.bert),
            "bert_learning_rate": point.bert_learning_rate, "random_init": dataclasses.asdict(point.random),
            "random_init_learning_rate": point.random_learning_rate, "difference": point.difference,
            "noise_threshold": point.threshold, "within_noise": point.within_noise}


def _sd(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


__all__ = ["CURVE_NOISE_RULE", "CurvePoint", "best_learning_rate", "curve_points", "curve_verdict",
           "curve_table", "point_record", "size_label"]
