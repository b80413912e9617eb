"""Mean, sd and the noise rule over fine-tuning seeds, against hand computation, numpy and scipy."""

import math

import numpy as np
import pytest
from scipy import stats

from bertkit.metrics.seeds import compare_seeds, seed_stats


def test_mean_and_sample_sd_by_hand_and_against_numpy():
    # mean 72; deviations -2, -1, 3: sample variance (4 + 1 + 9) / 2 = 7
    s = seed_stats([70.0, 71.0, 75.0])
    assert s.n == 3 and s.mean == pytest.approx(72.0) and s.sd == pytest.approx(math.sqrt(7.0))
    values = [61.3, 58.9, 64.2, 60.0]
    assert seed_stats(values).sd == pytest.approx(np.std(values, ddof=1))
    assert seed_stats(values).sd == pytest.approx(stats.tstd(values))
    assert seed_stats([80.0]).sd is None
    with pytest.raises(ValueError):
        seed_stats([])


def test_gap_beyond_two_of_the_larger_sd():
    # BERT 80, 82, 84 (sd 2); random init 70, 71, 75 (sd sqrt 7 = 2.6458): gap 10 > 2 x 2.6458 = 5.29
    gap = compare_seeds([80.0, 82.0, 84.0], [70.0, 71.0, 75.0])
    assert gap.a.sd == pytest.approx(2.0) and gap.b.sd == pytest.approx(math.sqrt(7.0))
    assert gap.difference == pytest.approx(10.0)
    assert gap.threshold == pytest.approx(2 * math.sqrt(7.0))
    assert gap.beyond_noise is True and gap.verdict == "a"
    # The same spread with means 4 apart: within 5.29.
    within = compare_seeds([74.0, 76.0, 78.0], [70.0, 71.0, 75.0])
    assert within.difference == pytest.approx(4.0) and within.beyond_noise is False and within.verdict == "within"
    # Reversed: b ahead.
    assert compare_seeds([70.0, 71.0, 75.0], [80.0, 82.0, 84.0]).verdict == "b"


def test_rule_is_stricter_than_two_standard_errors():
    """With three seeds a side, 2 x the larger sd is at least 2.45 Welch standard errors: a gap the rule
    accepts is also significant by Welch's t-test at the 5% level for these numbers."""
    a, b = [80.0, 82.0, 84.0], [70.0, 71.0, 75.0]
    gap = compare_seeds(a, b)
    se = math.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 3)
    assert gap.threshold / se >= 2 / math.sqrt(2 / 3) - 1e-9
    assert stats.ttest_ind(a, b, equal_var=False).pvalue < 0.05


def test_one_run_takes_the_other_models_sd_and_none_gives_no_verdict():
    gap = compare_seeds([90.0], [80.0, 82.0, 84.0])  # sd 2 -> threshold 4; gap 8
    assert gap.threshold == pytest.approx(4.0) and gap.beyond_noise is True
    none = compare_seeds([90.0], [80.0])
    assert none.threshold is None and none.beyond_noise is None and none.verdict == "unknown"
    borrowed = compare_seeds([90.0], [80.0], fallback_sd=6.0)  # another model's sd on the task: 12 > 10
    assert borrowed.threshold == pytest.approx(12.0) and borrowed.beyond_noise is False
    assert compare_seeds([90.0, 92.0], [80.0], fallback_sd=50.0).threshold == pytest.approx(2 * math.sqrt(2.0))
    # Seeds that all agree (e.g. every run at the majority class) differ from nothing equal to them.
    assert compare_seeds([68.4, 68.4, 68.4], [68.4, 68.4, 68.4]).beyond_noise is False
