"""`bertkit finetune|predict|evaluate <task>`: each task module supplies its own arguments and runner."""

from __future__ import annotations

import importlib

# task -> module providing add_<verb>_arguments(parser) and run_<verb>(args)
FINETUNE = {"glue": "bertkit.tasks.glue", "swag": "bertkit.tasks.multiple_choice",
            "squad": "bertkit.tasks.squad", "ner": "bertkit.tasks.ner",
            # the user's own files (bertkit/tasks/custom.py), named as `bertkit predict` names the tasks
            **{task: f"bertkit.tasks.custom:{task}" for task in ("text-classification", "token-classification",
                                                                 "multiple-choice")},
            "question-answering": "bertkit.tasks.squad"}  # SQuAD-format JSON of one's own
PREDICT = {"squad": "bertkit.tasks.squad",
           # new text with any fine-tuned head (bertkit/predict.py): module:COMMANDS key
           **{task: f"bertkit.predict:{task}" for task in ("text-classification", "token-classification",
                                                            "question-answering", "multiple-choice", "fill-mask",
                                                            "embeddings")}}
EVALUATE = {"squad": "bertkit.tasks.squad", "conll": "bertkit.tasks.ner"}


def _verb(verb: str, table: dict[str, str]):
    class Command:
        @staticmethod
        def add_arguments(parser):
            sub = parser.add_subparsers(dest="task", metavar="TASK", required=True)
            for task, target in table.items():
                module_name, _, key = target.partition(":")
                module = importlib.import_module(module_name)
                if key:  # one of several commands a module offers
                    module = module.COMMANDS[key]
                p = sub.add_parser(task, help=(module.__doc__ or task).strip().splitlines()[0])
                getattr(module, f"add_{verb}_arguments")(p)
                p.set_defaults(_task_run=getattr(module, f"run_{verb}"))

        @staticmethod
        def run_from_args(args):
            return args._task_run(args)

    return Command


finetune = _verb("finetune", FINETUNE)
predict = _verb("predict", PREDICT)
evaluate = _verb("evaluate", EVALUATE)
