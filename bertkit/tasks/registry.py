"""The task table: every fine-tuning task, once. The command line (`bertkit finetune|predict|evaluate
TASK`, tasks/cli.py) and `bertkit reproduce` (each task's benchmarks()) loop over it.

Each entry names a Task class (tasks/task.py): its fine-tuning for the runner and its command line
in one class. Adding a task is one file with such a class (see tasks/paws.py) and one
`TaskEntry(...)` line below; a module may offer several (tasks/custom.py: your own files).
"""

from __future__ import annotations

import dataclasses

from ..errors import BertkitError
from .benchmarks import Benchmark
from .cross_encoder import CrossEncoderTask
from .custom import MultipleChoiceFiles, QuestionAnsweringTask, TextClassificationTask, TokenClassificationTask
from .glue import GlueFinetuning
from .multiple_choice import MultipleChoiceTask
from .ner import NerTask
from .paws import Paws
from .sentence_embeddings import SentenceEmbeddingTask
from .squad import SquadRunTask
from .task import Task


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    name: str  # `bertkit finetune NAME`
    task: type[Task]
    evaluate: str | None = None  # `bertkit evaluate NAME`: the task's official scorer, when it has one
    pipeline: str | None = None  # `bertkit predict PIPELINE` / `bertkit serve` run its fine-tuned models

    @property
    def summary(self) -> str:
        return self.task.summary()


TASKS: dict[str, TaskEntry] = {t.name: t for t in (
    TaskEntry("glue", GlueFinetuning, pipeline="text-classification"),
    TaskEntry("swag", MultipleChoiceTask, pipeline="multiple-choice"),
    TaskEntry("squad", SquadRunTask, evaluate="squad", pipeline="question-answering"),
    TaskEntry("ner", NerTask, evaluate="conll", pipeline="token-classification"),
    TaskEntry("paws", Paws, pipeline="text-classification"),
    # the user's own files, named as `bertkit predict` names the pipelines (no benchmarks: not in reproduce)
    TaskEntry("text-classification", TextClassificationTask, pipeline="text-classification"),
    TaskEntry("token-classification", TokenClassificationTask, pipeline="token-classification"),
    TaskEntry("multiple-choice", MultipleChoiceFiles, pipeline="multiple-choice"),
    TaskEntry("question-answering", QuestionAnsweringTask, pipeline="question-answering"),
    TaskEntry("sentence-embeddings", SentenceEmbeddingTask, pipeline="sentence-embeddings"),
    TaskEntry("cross-encoder", CrossEncoderTask, pipeline="text-classification"),
)}

# Every data set `bertkit reproduce` can run, by the name budgets use ("mrpc", "codah", "squad2").
BENCHMARKS: dict[str, Benchmark] = {b.name: b for t in TASKS.values() for b in t.task.benchmarks()}


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise BertkitError(f"unknown task {name!r}; expected one of {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]
