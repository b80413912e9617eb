"""How many optimizer steps a run takes, and when it evaluates and saves: its plan.

A plan comes from fixed step or epoch counts, or from a wall-clock budget. A budgeted run
first measures what a step of each phase, a held-out evaluation and a checkpoint cost on this
machine (`Calibration`; the measuring steps run at learning rate 0, so the weights do not move),
then turns the budget into a step count (`plan_for_budget`). While it trains, a `BudgetPlanner`
holds the plan and is consulted by the training loop after every step: it stops a run out of time
and re-plans the rest (`replan`) once early, at its pace checks when the pace is off, and
at the end of a phase that is not the last when the pace is off (so that a first phase timed
while the machine was slow does not hand over too early). The plan is recorded in every
checkpoint: a resumed run follows the recorded plan, so its schedule is the one the interrupted
run would have followed (Izsak et al. 2021 tie the schedule to the budget the same way).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable

from ..errors import BertkitError
from ..flags import duration_seconds

log = logging.getLogger("bertkit")

def parse_duration(text: str | float | int) -> float:
    """'900', '90s', '15m', '1.5h', '1h30m' -> seconds (> 0, at most a week): flags.duration_seconds,
    the one budget parser, with its refusal as a BertkitError."""
    try:
        return duration_seconds(text)
    except ValueError as e:
        raise BertkitError(str(e)) from None


@dataclasses.dataclass
class Calibration:
    """Measured costs in seconds: an optimizer step of each phase, one evaluation, one checkpoint."""

    seconds_per_step: list[float]
    eval_seconds: float
    save_seconds: float
    calibration_seconds: float  # wall-clock spent measuring (part of the budget)
    steps_measured: list[int]


@dataclasses.dataclass
class Plan:
    steps_per_phase: list[int]
    warmup_steps: int
    eval_steps: int = 0
    save_steps: int = 0
    time_budget: float | None = None  # seconds, when the plan came from a budget
    calibration: Calibration | None = None
    replanned_at: int | None = None  # the step at which the measured pace re-planned the rest
    min_warmup_steps: int = 0  # the floor under a warm-up given as a share of the steps (`warmup_for`)

    @property
    def total_steps(self) -> int:
        return sum(self.steps_per_phase)

    def phase_ends(self) -> list[int]:
        ends, total = [], 0
        for steps in self.steps_per_phase:
            total += steps
            ends.append(total)
        return ends

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        d = dict(d)
        if d.get("calibration") is not None:
            d["calibration"] = Calibration(**d["calibration"])
        return cls(**d)


def warmup_for(total: int, ratio: float, minimum: int = 0) -> int:
    """`ratio` of `total` steps, but at least `minimum` while that is under a third of the steps: a
    short budget's few warm-up steps at a budget recipe's high learning rate wipe out what the
    initialisation set up (BERT-TINY's neighbour heads: gone after an 88-step warm-up at 2e-3, kept
    after 138)."""
    return max(int(round(ratio * total)), min(minimum, total // 3))


def plan_fixed(phase_steps: list[int], warmup_steps: int | None, warmup_ratio: float, eval_steps: int,
               save_steps: int, min_warmup_steps: int = 0) -> Plan:
    total = sum(phase_steps)
    if warmup_steps is not None:
        return Plan(list(phase_steps), warmup_steps, eval_steps, save_steps)
    return Plan(list(phase_steps), warmup_for(total, warmup_ratio, min_warmup_steps), eval_steps, save_steps,
                min_warmup_steps=min_warmup_steps)


def plan_for_budget(budget: float, elapsed: float, fractions: list[float], calibration: Calibration,
                    warmup_ratio: float, eval_points: int, save_points: int, margin: float,
                    min_warmup_steps: int = 0) -> Plan:
    """The most steps that fit in what is left of `budget` after `elapsed` seconds.

    Phase i takes `fractions[i]` of the steps. What else the run will do inside the budget is
    paid for first: `eval_points` evaluations (the last one after the final step), `save_points`
    checkpoints plus the final model, and a safety `margin`.
    """
    per_step = sum(f * t for f, t in zip(fractions, calibration.seconds_per_step))

    def extras(evals: int, saves: int) -> float:
        return elapsed + margin + evals * calibration.eval_seconds + (saves + 1) * calibration.save_seconds

    total = int((budget - extras(eval_points, save_points)) / per_step) if per_step > 0 else 0
    if total < 1 and (eval_points > 1 or save_points > 0):
        # A short budget runs the steps that fit: intermediate evaluations and checkpoints go first (the
        # final evaluation and the final model stay), rather than refusing a budget that can train.
        eval_points, save_points = min(eval_points, 1), 0
        total = int((budget - extras(eval_points, save_points)) / per_step) if per_step > 0 else 0
    if total < 1:
        needed = math.ceil(extras(eval_points, save_points) + per_step)
        raise BertkitError(
            f"the time budget of {budget:.0f} s leaves no time to train: a step takes {per_step:.2f} s and "
            f"{elapsed:.0f} s went to loading and measuring; the smallest budget that trains here is about "
            f"{needed} s: give at least that, or a smaller model")
    steps = [max(1, round(total * f)) for f in fractions]
    steps[0] = max(1, total - sum(steps[1:]))
    total = sum(steps)
    return Plan(steps, warmup_steps=warmup_for(total, warmup_ratio, min_warmup_steps), min_warmup_steps=min_warmup_steps,
                eval_steps=max(1, math.ceil(total / eval_points)) if eval_points > 1 else 0,
                save_steps=max(1, math.ceil(total / (save_points + 1))) if save_points else 0,
                time_budget=budget, calibration=calibration)


def steps_cost(steps_per_phase: list[int], start: int, end: int, seconds_per_step: list[float]) -> float:
    """Calibrated seconds of steps [start, end), each at its phase's step time."""
    cost, phase_start = 0.0, 0
    for steps, seconds in zip(steps_per_phase, seconds_per_step):
        phase_end = phase_start + steps
        cost += max(0, min(end, phase_end) - max(start, phase_start)) * seconds
        phase_start = phase_end
    return cost


# A budgeted run checks its pace this many times over its steps, whether or not it evaluates.
PACE_CHECKS = 20


def pace_check_due(plan: Plan, step: int) -> bool:
    """Does a budgeted run check its pace (`off_pace`) after `step`? On a grid of its own, every
    1/PACE_CHECKS of the steps. (Checking only at evaluations left a run without held-out data with
    the one early re-plan: its steps, measured while still slow, planned it 16% short of its budget.)"""
    if not plan.time_budget or plan.calibration is None:
        return False
    return step % max(1, math.ceil(plan.total_steps / PACE_CHECKS)) == 0


def early_finish_tolerance(budget: float) -> float:
    """How many seconds before its budget a run may be on course to end without re-planning: 3% of
    the budget, at most 30 s, so that it ends within its last minute whatever its length."""
    return min(0.03 * budget, 30.0)


def off_pace(plan: Plan, step: int, elapsed: float, scale: float) -> bool:
    """Would the rest of `plan`, every step at `scale` times its phase's calibrated time, end more
    than 1% past the budget (the machine got slower) or more than `early_finish_tolerance` before
    it (a later phase, or the run once warm, runs faster than its first steps measured)?"""
    cal = plan.calibration
    rest = scale * steps_cost(plan.steps_per_phase, step, plan.total_steps, cal.seconds_per_step)
    evals_left = (plan.total_steps - step) // plan.eval_steps + 1 if plan.eval_steps else 1
    finish = elapsed + rest + evals_left * cal.eval_seconds + cal.save_seconds
    return not plan.time_budget - early_finish_tolerance(plan.time_budget) <= finish <= plan.time_budget * 1.01


def replan(plan: Plan, step: int, elapsed: float, scale: float, eval_points_left: int, saves_left: int,
           margin: float, ending_phase: int | None = None) -> Plan:
    """Re-plan the steps after `step`: the most that fit in what is left of the budget when every step
    takes `scale` times its phase's calibrated time.

    The calibration times single steps; the loop around them (data, logging) and a machine whose
    load changed are only seen over many steps, as a pace `scale` measured since training began
    (or since the last check). Phases keep their shares of the steps, except those already
    finished, which keep their length; the phase still running keeps its share too, so its end
    (the switch to the next phase) moves with the total. `ending_phase`: `step` is that phase's
    planned last step, and it may still be extended (or end right here). A warm-up still under way
    keeps its share of the steps (the first re-plan comes before it ends: a warm-up cut short by a
    pessimistic calibration wiped out BERT-TINY's neighbour heads at learning rate 2e-3); one
    already over is kept.
    """
    cal = plan.calibration
    old_steps = plan.steps_per_phase
    fractions = [s / plan.total_steps for s in old_steps]
    old_ends = plan.phase_ends()
    if ending_phase is not None:
        current, room = ending_phase, 0  # it may end at this very step
    else:
        current, room = next((i for i, end in enumerate(old_ends) if end > step), len(old_steps) - 1), 1

    def layout(total: int) -> list[int]:
        steps = [old_steps[i] if i < current else max(1, round(total * f)) for i, f in enumerate(fractions)]
        start = sum(steps[:current])
        steps[current] = max(step + room - start, total - start - sum(steps[current + 1:]), 1)
        return steps

    left = plan.time_budget - elapsed - margin - eval_points_left * cal.eval_seconds - (saves_left + 1) * cal.save_seconds

    def fits(total: int) -> bool:
        steps = layout(total)
        return scale * steps_cost(steps, step, sum(steps), cal.seconds_per_step) <= left

    low = step + 1  # always at least one more step
    high = step + 2 + int(max(left, 0) / (scale * min(cal.seconds_per_step)))
    while low < high:  # the largest total that fits
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    steps = layout(low)
    total = sum(steps)
    if step < plan.warmup_steps:
        scaled = round(plan.warmup_steps * total / plan.total_steps)
        plan = dataclasses.replace(plan, warmup_steps=max(step + 1, scaled, min(plan.min_warmup_steps, total // 3)))
    if plan.replanned_at is not None:
        # Later re-plans (off pace, at an evaluation) keep the evaluation and checkpoint grid: a new
        # grid would skip the evaluation due at this very step and scatter the rest of the curve.
        return dataclasses.replace(plan, steps_per_phase=steps, replanned_at=step)
    # The grid keeps the number of evaluations the run was planned with (counting from step 0 to the
    # end): counting from what is left overshot by one or two when the first re-plan came early.
    eval_points = math.ceil(plan.total_steps / plan.eval_steps) if plan.eval_steps else 1
    return dataclasses.replace(plan, steps_per_phase=steps,
                               eval_steps=max(1, math.ceil(total / eval_points)) if plan.eval_steps else 0,
                               save_steps=max(1, math.ceil(total / (saves_left + 1))) if plan.save_steps else 0,
                               replanned_at=step)


class BudgetPlanner:
    """The plan a run follows, and for a budgeted run the decisions that keep it inside its budget.

    The training loop consults it after every optimizer step (`out_of_time`, then `after_step`);
    nothing else changes the plan. `elapsed()` is the run's wall-clock (resumed segments added);
    `paused` (passed in) the seconds spent on evaluations and checkpoints, left out of the pace.
    A plan without a budget, or a resumed budgeted run (it keeps the recorded schedule), never
    changes. `share(plan)` makes every rank follow rank 0's plan.
    """

    def __init__(self, plan: Plan, elapsed: Callable[[], float], resumed: bool = False, evaluates: bool = True,
                 share: Callable[[Plan], Plan] = lambda plan: plan, announce: bool = True):
        self.plan = plan
        self.elapsed = elapsed
        self.resumed = resumed
        self.evaluates = evaluates
        self.share = share
        self.announce = announce
        self.mark = (elapsed(), 0, 0.0)  # (elapsed, step, paused) where the pace is measured from

    @property
    def budgeted(self) -> bool:
        return bool(self.plan.time_budget) and self.plan.calibration is not None

    def start(self, step: int, paused: float) -> None:
        """Training (re)starts at `step`: the pace is measured from here."""
        self.mark = (self.elapsed(), step, paused)

    def first_replan_step(self) -> int | None:
        """A budgeted run re-plans once a tenth of the way in (after at least 20 steps, halfway through
        a warm-up of 40 steps or more, before the first checkpoint); later only when it runs off pace."""
        plan = self.plan
        if not plan.time_budget or plan.calibration is None or plan.replanned_at is not None:
            return None
        step = max(20, round(0.1 * plan.total_steps))
        if plan.warmup_steps >= 40:  # the warm-up then gets its share of the re-planned steps
            step = min(step, plan.warmup_steps // 2)
        if plan.save_steps:  # before the first checkpoint, so that a resumed run finds the final plan
            step = min(step, plan.save_steps - 1)
        return max(1, min(plan.total_steps - 1, step))

    def pace_since_mark(self, step: int, paused: float) -> float:
        """How much slower than calibrated the steps since the mark ran: measured seconds over the
        calibrated seconds of those steps, each at its phase's step time; evaluations and
        checkpoints left out."""
        elapsed0, step0, paused0 = self.mark
        measured = self.elapsed() - elapsed0 - (paused - paused0)
        calibrated = steps_cost(self.plan.steps_per_phase, step0, step, self.plan.calibration.seconds_per_step)
        return measured / calibrated if calibrated > 0 else 1.0

    def is_off_pace(self, step: int, paused: float) -> bool:
        """Would the rest, at the pace kept since the last check (at least 20 steps ago), end more than
        1% past the budget or too early (`off_pace`)? When on pace, the check moves the mark."""
        if self.resumed or self.plan.replanned_at is None or step >= self.plan.total_steps:
            return False
        if step - self.mark[1] < 20:
            return False
        if not off_pace(self.plan, step, self.elapsed(), self.pace_since_mark(step, paused)):
            self.mark = (self.elapsed(), step, paused)
            return False
        return True

    def off_pace_at_check(self, step: int, paused: float) -> bool:
        """At each pace check after the first re-plan (`pace_check_due`, evaluating or not): is the run
        off pace?"""
        if not pace_check_due(self.plan, step):
            return False
        return self.is_off_pace(step, paused)

    def after_step(self, step: int, paused: float, ending_phase: int | None = None) -> bool:
        """Optimizer step `step` is done (`ending_phase`: it is the planned last step of that phase, which
        is not the last). Re-plan when due: the first re-plan, a pace check off pace, or the
        end of a phase while off pace, whose end may then move (the phase keeps its share of the
        re-planned total). True when the plan changed."""
        if not self.budgeted:
            return False
        due = step == self.first_replan_step() or self.off_pace_at_check(step, paused)
        if not due and ending_phase is not None:
            due = self.is_off_pace(step, paused)
        if not due:
            return False
        self.replan(step, paused, ending_phase)
        return True

    def replan(self, step: int, paused: float, ending_phase: int | None = None) -> None:
        old = self.plan
        scale = self.pace_since_mark(step, paused)
        self.mark = (self.elapsed(), step, paused)
        evals_left = (old.total_steps - step) // old.eval_steps + 1 if old.eval_steps else 1
        saves_left = (old.total_steps - step) // old.save_steps if old.save_steps else 0
        self.plan = self.share(replan(old, step, self.elapsed(), scale, evals_left if self.evaluates else 0,
                                      saves_left, margin=min(30.0, 0.01 * old.time_budget), ending_phase=ending_phase))
        if self.announce and self.plan.total_steps != old.total_steps:
            log.info(f"time budget: re-planned to {self.plan.total_steps} steps at {scale:.2f}x the calibrated step time")

    def out_of_time(self, step: int) -> bool:
        """A budgeted run stops when finishing (evaluation + final save) would pass budget + 45 s:
        the machine ran slower than it measured at the start."""
        plan = self.plan
        if not self.budgeted or self.resumed:
            return False
        finish = plan.calibration.eval_seconds + plan.calibration.save_seconds
        if self.elapsed() + finish <= plan.time_budget + 45:
            return False
        if self.announce:
            log.warning(f"time budget reached at step {step} of {plan.total_steps}: this machine ran "
                        "slower than measured at the start; stopping with the learning rate above zero")
        return True


__all__ = ["Calibration", "Plan", "BudgetPlanner", "parse_duration", "warmup_for", "plan_fixed", "plan_for_budget",
           "replan", "steps_cost", "off_pace", "pace_check_due", "early_finish_tolerance", "PACE_CHECKS"]
