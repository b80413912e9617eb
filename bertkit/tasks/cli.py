"""`bertkit finetune|predict|evaluate <task>`: each task module supplies its own arguments and runner."""

from __future__ import annotations

import importlib

# task -> module providing add_<verb>_arguments(parser) and run_<verb>(args)
FINETUNE = {"glue": "bertkit.tasks.glue", "swag": "bertkit.tasks.multiple_choice",
            "squad": "bertkit.tasks.squad", "ner": "bertkit.tasks.ner"}
PREDICT = {"squad": "bertkit.tasks.squad"}
EVALUATE = {"squad": "bertkit.tasks.squad", "conll": "bertkit.tasks.ner"}


def _verb(verb: str, table: dict[str, str]):
    class Command:
        @staticmethod
        def add_arguments(parser):
            sub = parser.add_subparsers(dest="task", metavar="TASK", required=True)
            for task, module_name in table.items():
                try:
                    module = importlib.import_module(module_name)
                    add = getattr(module, f"add_{verb}_arguments")
                    run = getattr(module, f"run_{verb}")
                except (ModuleNotFoundError, AttributeError):
                    p = sub.add_parser(task, help="[not built yet]")
                    p.set_defaults(_task_run=None)
                    continue
                p = sub.add_parser(task, help=(module.__doc__ or task).strip().splitlines()[0])
                add(p)
                p.set_defaults(_task_run=run)

        @staticmethod
        def run_from_args(args):
            if args._task_run is None:
                import sys

                print(f"bertkit {verb} {args.task}: not built yet in this version", file=sys.stderr)
                return 1
            return args._task_run(args)

    return Command


finetune = _verb("finetune", FINETUNE)
predict = _verb("predict", PREDICT)
evaluate = _verb("evaluate", EVALUATE)
