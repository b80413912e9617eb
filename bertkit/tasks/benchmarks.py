"""The data sets `bertkit reproduce` fine-tunes on, and the settings a reproduction budget gives them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from .results import TaskResult


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    """How `bertkit reproduce` fine-tunes one model on one benchmark: the budget's `finetune`
    section (`finetune`) and its `tasks.<name>` section (`task`)."""

    model_dir: Path
    data_dir: Path
    output_dir: Path
    finetune: dict
    task: dict
    precision: str = "auto"

    def max_seq_length(self, default: int | None = None) -> int:
        return self.task.get("max_seq_length", default or self.finetune["max_seq_length"])


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A data set a task runs on in `bertkit reproduce` (a budget's `tasks` key: "mrpc", "codah",
    "squad2", "ner"), with the paper's table label, whether the data folder has it, and how to run it."""

    name: str
    label: str
    has_data: Callable[[Path], bool]
    run: Callable[[BenchmarkSettings], TaskResult]
    max_seq_length: int | None = None  # its default when the budget gives none (None: the budget's finetune one)
