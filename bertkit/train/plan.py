"""How many optimizer steps a run takes, and when it evaluates and saves: its plan.

A plan comes from fixed step or epoch counts, or from a wall-clock budget. A budgeted run
first measures what a step of each phase, a held-out evaluation and a checkpoint cost on this
machine (`Calibration`; the measuring steps run at learning rate 0, so the weights do not move),
then turns the budget into a step count (`plan_for_budget`). The plan is recorded in every
checkpoint: a resumed run follows the recorded plan, so its schedule is the one the interrupted
run would have followed (Izsak et al. 2021 tie the schedule to the budget the same way).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import BertkitError
from ..flags import duration_seconds

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
           margin: float) -> Plan:
    """Re-plan the steps after `step`: the most that fit in what is left of the budget when every step
    takes `scale` times its phase's calibrated time.

    The calibration times single steps; the loop around them (data, logging) and a machine whose
    load changed are only seen over many steps, as a pace `scale` measured since training began
    (or since the last check). Phases keep their shares of the steps, except those already
    finished, which keep their length. A warm-up still under way keeps its share of the steps (the
    first re-plan comes before it ends: a warm-up cut short by a pessimistic calibration wiped out
    BERT-TINY's neighbour heads at learning rate 2e-3); one already over is kept.
    """
    cal = plan.calibration
    old_steps = plan.steps_per_phase
    fractions = [s / plan.total_steps for s in old_steps]
    old_ends = plan.phase_ends()
    current = next((i for i, end in enumerate(old_ends) if end > step), len(old_steps) - 1)

    def layout(total: int) -> list[int]:
        steps = [old_steps[i] if i < current else max(1, round(total * f)) for i, f in enumerate(fractions)]
        start = sum(steps[:current])
        steps[current] = max(step + 1 - start, total - start - sum(steps[current + 1:]), 1)
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


__all__ = ["Calibration", "Plan", "parse_duration", "warmup_for", "plan_fixed", "plan_for_budget", "replan", "steps_cost",
           "off_pace", "pace_check_due", "early_finish_tolerance", "PACE_CHECKS"]
