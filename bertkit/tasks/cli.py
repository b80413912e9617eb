"""`bertkit finetune|predict|evaluate <task>`: one sub-command per entry of the task table
(tasks/registry.py); `predict` also offers new-text prediction with any fine-tuned head (predict.py),
`evaluate` the embedding evaluators (retrieval_eval.py)."""

from __future__ import annotations

from ..inference import predict as predict_text
from .registry import TASKS
from .retrieval_eval import EVALUATORS


def _made_by(pipeline: str) -> str:
    tasks = [f"`bertkit finetune {t.name}`" for t in TASKS.values() if t.pipeline == pipeline]
    return f" (models from {' or '.join(tasks)})" if tasks else ""


def _verb(verb: str):
    """A command whose sub-commands are the tasks offering add_<verb>_arguments and run_<verb>."""

    def entries():
        for task in TASKS.values():
            name = task.evaluate if verb == "evaluate" else task.name
            if name and hasattr(task.task, f"run_{verb}"):
                yield name, task.summary, task.task
        if verb == "evaluate":  # evaluators that are no fine-tuning task's: sts, retrieval, reranking
            for name, evaluator in EVALUATORS.items():
                yield name, (evaluator.__doc__ or name).strip().splitlines()[0], evaluator
        if verb == "predict":  # new text with any fine-tuned head, by what the head does
            for name, command in predict_text.COMMANDS.items():
                yield name, (command.__doc__ or name).strip().splitlines()[0] + _made_by(name), command

    class Command:
        @staticmethod
        def add_arguments(parser):
            sub = parser.add_subparsers(dest="task", metavar="TASK", required=True)
            for name, summary, surface in entries():
                p = sub.add_parser(name, help=summary)
                getattr(surface, f"add_{verb}_arguments")(p)
                p.set_defaults(_task_run=getattr(surface, f"run_{verb}"))

        @staticmethod
        def run_from_args(args):
            return args._task_run(args)

    return Command


finetune = _verb("finetune")
predict = _verb("predict")
evaluate = _verb("evaluate")
