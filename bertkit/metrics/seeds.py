"""Scores over fine-tuning seeds: their mean and spread, and whether a gap between two models
exceeds that spread.

The rule (`NOISE_RULE`): two models differ beyond the noise when their mean scores differ by more
than two standard deviations, taking the larger of the two models' seed standard deviations (the
sample sd, n - 1 in the denominator). That is the plain reading of "beats it by more than two
standard deviations", and stricter than a two-standard-error (Welch) test, which divides each
variance by its number of seeds: with three seeds a side, 2 x the larger sd is at least 2.45
standard errors. A model with a single run has no sd of its own: the other model's sd stands in
for both (the same pipeline and task); when neither has two runs, a seed sd measured on the same
task with other models may be given (`fallback_sd`); without any there is no verdict.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

NOISE_RULE = ("|mean_a - mean_b| > 2 x max(sd_a, sd_b), sd the sample standard deviation over seeds (n - 1); "
              "a model with one run takes the other's sd, and two single runs the largest seed sd of the other "
              "models on the same task")


@dataclasses.dataclass(frozen=True)
class SeedStats:
    n: int
    mean: float
    sd: float | None  # None with fewer than two runs


def seed_stats(values: Sequence[float]) -> SeedStats:
    if not values:
        raise ValueError("no runs to summarise")
    values = [float(v) for v in values]
    return SeedStats(len(values), statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)


@dataclasses.dataclass(frozen=True)
class Gap:
    a: SeedStats
    b: SeedStats
    difference: float  # mean_a - mean_b
    threshold: float | None  # 2 x the larger sd; None without a noise estimate
    beyond_noise: bool | None  # None: no verdict

    @property
    def verdict(self) -> str:
        """'a' (a ahead beyond the noise), 'b', 'within' or 'unknown'."""
        if self.beyond_noise is None:
            return "unknown"
        if not self.beyond_noise:
            return "within"
        return "a" if self.difference > 0 else "b"


def compare_seeds(a: Sequence[float], b: Sequence[float], fallback_sd: float | None = None) -> Gap:
    """Model a's runs against model b's under `NOISE_RULE`; `fallback_sd` stands in when neither
    model has two runs."""
    sa, sb = seed_stats(a), seed_stats(b)
    sds = [s.sd for s in (sa, sb) if s.sd is not None] or ([] if fallback_sd is None else [fallback_sd])
    difference = sa.mean - sb.mean
    if not sds:
        return Gap(sa, sb, difference, None, None)
    threshold = 2.0 * max(sds)
    return Gap(sa, sb, difference, threshold, abs(difference) > threshold)


__all__ = ["NOISE_RULE", "SeedStats", "seed_stats", "Gap", "compare_seeds"]
