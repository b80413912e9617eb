"""The task table: every fine-tuning task, once. The command line (`bertkit finetune|predict|evaluate
TASK`, tasks/cli.py) and `bertkit reproduce` (each task's BENCHMARKS) loop over it.

Each entry's module has the command-line surface (read, featurize, HEAD, postprocess, score,
finetune -> TaskResult, add_finetune_arguments / run_finetune, BENCHMARKS; optionally
add_predict_arguments / run_predict and add_evaluate_arguments / run_evaluate); its fine-tuning is a
task object (tasks/task.py) that tasks/runner.py runs. Adding a task is one file with both (see
tasks/paws.py) and one `Task(...)` line below. A module may offer several tasks, each as a class
with the same surface (tasks/custom.py: fine-tuning on the user's own files).
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from ..errors import BertkitError
from . import cross_encoder, custom, glue, multiple_choice, ner, paws, sentence_embeddings, squad
from .benchmarks import Benchmark


@dataclasses.dataclass(frozen=True)
class Task:
    name: str  # `bertkit finetune NAME`
    module: ModuleType | type  # the module (or class) with the task surface
    evaluate: str | None = None  # `bertkit evaluate NAME`: the task's official scorer, when it has one
    pipeline: str | None = None  # `bertkit predict PIPELINE` / `bertkit serve` run its fine-tuned models

    @property
    def summary(self) -> str:
        return (self.module.__doc__ or self.name).strip().splitlines()[0]


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("glue", glue, pipeline="text-classification"),
    Task("swag", multiple_choice, pipeline="multiple-choice"),
    Task("squad", squad, evaluate="squad", pipeline="question-answering"),
    Task("ner", ner, evaluate="conll", pipeline="token-classification"),
    Task("paws", paws, pipeline="text-classification"),
    # the user's own files, named as `bertkit predict` names the pipelines (BENCHMARKS = (): not in reproduce)
    Task("text-classification", custom.TextClassification, pipeline="text-classification"),
    Task("token-classification", custom.TokenClassification, pipeline="token-classification"),
    Task("multiple-choice", custom.MultipleChoice, pipeline="multiple-choice"),
    Task("question-answering", custom.QuestionAnswering, pipeline="question-answering"),
    Task("sentence-embeddings", sentence_embeddings.SentenceEmbeddings, pipeline="sentence-embeddings"),
    Task("cross-encoder", cross_encoder.CrossEncoderFinetuning, pipeline="text-classification"),
)}

# Every data set `bertkit reproduce` can run, by the name budgets use ("mrpc", "codah", "squad2").
BENCHMARKS: dict[str, Benchmark] = {b.name: b for t in TASKS.values() for b in t.module.BENCHMARKS}


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise BertkitError(f"unknown task {name!r}; expected one of {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]
