"""`bertkit reproduce`: the command line of the two kinds of budget, the paper's ablations
(reproduce.py) and the learning curve of pre-trained BERT against random init (learning_curve.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import BertkitError
from .learning_curve import learning_curve
from .stages import ABLATIONS, BUDGET_DIR, VARIANTS, load_budget, reproduce


def add_arguments(p: argparse.ArgumentParser) -> None:
    known = " | ".join(sorted(path.stem for path in BUDGET_DIR.glob("*.json")))
    p.add_argument("--budget", default="demo", help=f"{known}, or a budget .json file")
    p.add_argument("--data-dir", help="data folder (default: $BERTKIT_DATA)")
    p.add_argument("--output", required=True)
    p.add_argument("--variants", help=f"comma list from {', '.join(VARIANTS)} (default: the budget's)")
    p.add_argument("--tasks", help="comma list (default: every task of the budget whose data exists)")
    p.add_argument("--vocab", help="use this vocab.txt instead of training one")
    p.add_argument("--model", help="learning-curve budgets: the pre-trained model folder to compare with random "
                                   "init (default: pre-train it with the budget's `pretrained` budget)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--dry-run", action="store_true", help="print the plan (model, steps, stages) and stop")


def run_from_args(args) -> int:
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()] if s else None  # noqa: E731
    budget = load_budget(args.budget)
    if budget.get("kind", ABLATIONS) == ABLATIONS:
        if args.model:
            raise BertkitError(f"--model is for learning-curve budgets; {budget['name']!r} pre-trains its own "
                               "variants")
        result = reproduce(budget, args.data_dir, args.output, variants=split(args.variants), tasks=split(args.tasks),
                           vocab=args.vocab, precision=args.precision, dry_run=args.dry_run)
    else:
        given = [flag for flag, value in (("--variants", args.variants), ("--vocab", args.vocab)) if value]
        if given:
            raise BertkitError(f"{given[0]} has no effect with the learning-curve budget {budget['name']!r} (it "
                               "compares one pre-trained model with random init; give --model for another)")
        result = learning_curve(budget, args.data_dir, args.output, model=args.model, tasks=split(args.tasks),
                                precision=args.precision, dry_run=args.dry_run)
    if args.dry_run:
        print(json.dumps(result, indent=2))
    else:
        print(f"Report: {Path(args.output) / 'report.md'}")
    return 0
