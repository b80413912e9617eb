"""The budget planner (train/plan.py BudgetPlanner), consulted by the loop after every step: a phase
that is not the last keeps its share of a re-planned total while it runs, so a run calibrated while
the machine was slow does not hand over to its next phase too early (a fake clock makes it exact)."""

import types

import pytest
import torch
from torch import nn

from bertkit.train import Phase, TrainArgs, fit
from bertkit.train import loop
from bertkit.train.plan import Calibration, plan_for_budget, replan


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now

    perf_counter = time


class ClockedSource:
    """Every batch costs `slow` seconds of the fake clock until `fast_from`, then `fast`."""

    def __init__(self, clock, slow, fast, fast_from):
        self.clock, self.slow, self.fast, self.fast_from = clock, slow, fast, fast_from
        self.served = 0

    def num_batches(self, epoch):
        return 1_000_000

    def batches(self, epoch, start=0):
        for _ in range(start, self.num_batches(epoch)):
            self.clock.now += self.slow if self.clock.now < self.fast_from else self.fast
            self.served += 1
            yield {"input_ids": torch.zeros(1, 4, dtype=torch.long)}


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, 2))

    def forward(self, input_ids, **kw):
        return {"loss": (self.w.sum() - 1) ** 2}


def test_a_replan_at_a_phase_end_moves_the_switch_and_keeps_the_share():
    cal = Calibration([1.0, 2.0], 0.0, 0.0, 25.0, [13, 6])
    plan = plan_for_budget(1000, 25, [0.7, 0.3], cal, 0.0, 1, 0, 10.0)
    first = replan(plan, 74, 99, 1.0, 0, 0, 10.0)
    switch = first.phase_ends()[0]
    faster = replan(first, switch, 144, 0.1, 0, 0, 10.0, ending_phase=0)
    assert faster.total_steps > 5 * first.total_steps
    assert faster.steps_per_phase[0] / faster.total_steps == pytest.approx(0.7, abs=0.01)  # the share kept
    slower = replan(first, switch, 144 + 300, 1.5, 0, 0, 10.0, ending_phase=0)
    assert slower.phase_ends()[0] == switch  # a slower machine switches now, not one step later
    # Without ending_phase the phase counts as finished at its planned end (the step-count-only re-plan).
    assert replan(first, switch, 144, 0.1, 0, 0, 10.0).steps_per_phase[0] == switch


def test_a_run_calibrated_while_slow_keeps_its_first_phase_share(monkeypatch):
    """Calibration and the first ~180 of the short phase's ~200 planned steps run 4x slower than the
    rest (a busy machine that frees up shortly before the switch, after the last pace check that
    could see it): the check at the phase end must move the switch. The short phase then still takes
    70% of the run (not ~30%, as when a later check can only lengthen the next phase) and the run
    uses its budget."""
    clock = FakeClock()
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(time=clock.time, perf_counter=clock.perf_counter))
    short = ClockedSource(clock, slow=1.0, fast=0.25, fast_from=clock.now + 200)
    long = ClockedSource(clock, slow=2.0, fast=0.5, fast_from=clock.now + 200)
    args = TrainArgs(output_dir=None, time_budget=400.0, learning_rate=1e-3, warmup_ratio=0.0, precision="fp32",
                     logging_steps=1_000_000, progress=False, clock_start=clock.now)
    torch.manual_seed(0)
    result = fit(Scalar(), [Phase(short, fraction=0.7, name="short"), Phase(long, fraction=0.3, name="long")], args)
    plan = result.plan
    first_plan = round(400 / 1.3)  # about what the slow calibration alone allows
    assert plan.total_steps > 2 * first_plan and result.global_step == plan.total_steps
    assert plan.steps_per_phase[0] / plan.total_steps == pytest.approx(0.7, abs=0.01)
    assert short.served > 0.69 * plan.total_steps  # the short phase really ran that long
    assert not result.stopped_early and 0.95 * 400 <= result.elapsed_seconds <= 400
