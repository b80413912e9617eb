"""A task's data by split and what prediction needs besides the model: the values the runner passes
between a task's methods (tasks/task.py)."""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass
class Splits:
    """A task's examples by split. `dev` None: no dev data (one run, no selection); `reported`:
    splits scored beside dev but not used to select (MNLI's mismatched dev)."""

    train: Sequence
    dev: Sequence | None
    test: Sequence | None = None
    reported: dict[str, Sequence] = dataclasses.field(default_factory=dict)
    details: dict = dataclasses.field(default_factory=dict)  # what results.json records about the data

    def named(self) -> dict[str, Sequence]:
        named = {"train": self.train, **({"dev": self.dev} if self.dev is not None else {}),
                 **({"test": self.test} if self.test is not None else {})}
        return {**named, **self.reported}


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What prediction needs besides the model: the tokenizer, batch size and precision."""

    tokenizer: object
    eval_batch_size: int
    precision: str
    max_seq_length: int
    device: str = "auto"
