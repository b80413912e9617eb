"""A budgeted run uses its budget: it ends within its last minute even when its steps get faster
after the early re-plan, with or without evaluations.

The loop runs on a simulated clock (each batch advances it by a set cost; the real compute time
is not counted), so the test is exact and fast whatever the machine's load.
"""

import pytest
import torch

from bertkit import BertConfig, BertForSequenceClassification
from bertkit.train import Phase, TrainArgs, fit
from bertkit.train import loop as loop_module
from bertkit.train.plan import Calibration, early_finish_tolerance, off_pace, pace_check_due, plan_for_budget


class SimulatedClock:
    def __init__(self):
        self.now = 1_000_000.0

    def time(self):
        return self.now

    perf_counter = monotonic = time

    def sleep(self, seconds):
        self.now += seconds


class TimedSource:
    """Batches that cost `early` simulated seconds for the first `early_batches` of the run (cold
    kernels, a busy machine), then `late` seconds."""

    def __init__(self, clock, early, late, early_batches, n_batches=50):
        self.clock, self.early, self.late, self.early_batches, self.n = clock, early, late, early_batches, n_batches
        self.served = 0

    def num_batches(self, epoch):
        return self.n

    def batches(self, epoch, start=0):
        g = torch.Generator().manual_seed(epoch)
        for i in range(self.n):
            ids = torch.randint(5, 50, (4, 8), generator=g)
            if i < start:
                continue
            self.clock.sleep(self.early if self.served < self.early_batches else self.late)
            self.served += 1
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": (ids[:, 1] > 25).long()}


def _run(monkeypatch, tmp_path, budget, early, late, early_batches, evaluate=None):
    clock = SimulatedClock()
    monkeypatch.setattr(loop_module, "time", clock)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32, num_labels=2))
    args = TrainArgs(output_dir=str(tmp_path), learning_rate=1e-3, warmup_ratio=0.06, precision="fp32",
                     logging_steps=1000, progress=False, seed=3, time_budget=budget, clock_start=clock.now,
                     save_points=0, save_final_model=False)
    result = fit(model, Phase(TimedSource(clock, early, late, early_batches)), args, evaluate=evaluate)
    return result, result.elapsed_seconds


@pytest.mark.parametrize("evaluate", [None, lambda model: {"score": 1.0}], ids=["no-evaluation", "evaluation"])
def test_a_run_whose_steps_get_faster_still_ends_in_its_last_minute(monkeypatch, tmp_path, evaluate):
    # 15 minutes; steps of 9 s while calibrating and re-planning early, then 6 s: without later
    # pace checks the run would end after ~2/3 of its budget.
    result, elapsed = _run(monkeypatch, tmp_path, 900.0, early=9.0, late=6.0, early_batches=20, evaluate=evaluate)
    assert not result.stopped_early
    assert 900 - 60 <= elapsed <= 900 + 1, elapsed
    assert result.global_step == result.plan.total_steps


def test_a_run_whose_steps_get_slower_still_ends_on_time(monkeypatch, tmp_path):
    result, elapsed = _run(monkeypatch, tmp_path, 900.0, early=6.0, late=7.8, early_batches=20)
    assert not result.stopped_early and 900 - 60 <= elapsed <= 900 + 1, elapsed


def test_pace_checks_do_not_depend_on_evaluations():
    cal = Calibration(seconds_per_step=[1.0], eval_seconds=0.0, save_seconds=0.0, calibration_seconds=0.0,
                      steps_measured=[4])
    plan = plan_for_budget(1000, elapsed=0, fractions=[1.0], calibration=cal, warmup_ratio=0.0, eval_points=1,
                           save_points=0, margin=0)
    assert plan.eval_steps == 0
    due = [step for step in range(1, plan.total_steps) if pace_check_due(plan, step)]
    assert 15 <= len(due) <= 25  # about every 5% of the steps
    gaps = {b - a for a, b in zip(due, due[1:])}
    assert max(gaps) <= plan.total_steps // 15


def test_early_finish_tolerance_keeps_the_end_in_the_last_minute():
    for budget in (60, 300, 900, 3600, 4 * 3600):
        assert 0 < early_finish_tolerance(budget) <= min(0.03 * budget, 60)
    cal = Calibration(seconds_per_step=[1.0], eval_seconds=0.0, save_seconds=0.0, calibration_seconds=0.0,
                      steps_measured=[4])
    plan = plan_for_budget(3600, elapsed=0, fractions=[1.0], calibration=cal, warmup_ratio=0.0, eval_points=1,
                           save_points=0, margin=0)
    # Half-way, at a pace that ends 90 s early (2.5%): off pace for an hour's budget.
    assert off_pace(plan, 1800, 1800, 1 - 90 / 1800)
    assert not off_pace(plan, 1800, 1800, 1 - 10 / 1800)
