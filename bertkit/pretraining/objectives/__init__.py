"""The pre-training objectives: one object each (base.Objective) that builds its batch's inputs and
targets, names its head and metrics and its departure from the paper. Data loading, the run,
reproduce and its report ask the object.

A new objective is one file here (a subclass of `Objective` with `inputs_and_labels`) plus one
line in OBJECTIVES; `pretrain --objective NAME` and `reproduce --variants NAME` then take it.
"""

from __future__ import annotations

from ...errors import BertkitError
from .base import BatchRows, Objective
from .left_to_right import LTR
from .masked_lm import MLM_NSP, MLM_ONLY

OBJECTIVES: dict[str, Objective] = {objective.name: objective for objective in (MLM_NSP, MLM_ONLY, LTR)}


def resolve_objective(objective: Objective | str, nsp: bool = True) -> Objective:
    """The objective an argument names: an Objective, a registry name, or the CLI's "mlm" (masked LM,
    with NSP unless `nsp` is False: the --no-nsp flag); `nsp=False` drops NSP from MLM + NSP."""
    if not isinstance(objective, Objective):
        name = "bert" if objective == "mlm" else objective
        if name not in OBJECTIVES:
            raise BertkitError(f"objective must be one of mlm, {', '.join(OBJECTIVES)}, not {objective!r}")
        objective = OBJECTIVES[name]
    return MLM_ONLY if objective.nsp and not nsp else objective


__all__ = ["Objective", "BatchRows", "OBJECTIVES", "resolve_objective", "MLM_NSP", "MLM_ONLY", "LTR"]
