"""`bertkit` command line: parses arguments and calls the library function of the same name.

Each command lives in the module that implements it, as `add_arguments(parser)` + `run_from_args(args)`;
this file only lists them. Bad input surfaces as one line `error: file:line: problem`, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .errors import BertkitError

# command -> (module[:attribute] with add_arguments/run_from_args, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train-tokenizer": ("bertkit.tokenizer_cli:train", "train a WordPiece vocabulary on corpus files"),
    "tokenize": ("bertkit.tokenizer_cli:tokenize", "tokenize stdin lines into ids or WordPiece tokens"),
    "create-pretraining-data": ("bertkit.pretraining.create", "corpus -> MLM/NSP instances (sharded arrays)"),
    "pretrain": ("bertkit.pretraining.run", "pre-train with MLM + NSP (or the paper's ablations)"),
    "finetune": ("bertkit.tasks.cli:finetune", "fine-tune on glue | swag | squad | ner"),
    "predict": ("bertkit.tasks.cli:predict", "predict new text with any head (or a SQuAD file: predict squad)"),
    "serve": ("bertkit.serve", "HTTP JSON API (text-embeddings-inference routes) with dynamic batching"),
    "export": ("bertkit.export", "the model as an ONNX graph (dynamic batch and sequence axes)"),
    "evaluate": ("bertkit.tasks.cli:evaluate", "official evaluators: squad | conll"),
    "extract-features": ("bertkit.features", "per-token activations of a frozen encoder"),
    "reproduce": ("bertkit.reproduce", "the paper end to end at a compute budget, with a report"),
    "plot": ("bertkit.plot", "PNG curves from a run's metrics.jsonl"),
}


def _load(target: str):
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertkit", description="BERT: tokenizer, pre-training, fine-tuning, reproduction.")
    parser.add_argument("-v", "--verbose", action="store_true", help="info-level logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, help_text) in COMMANDS.items():
        impl = _load(target)
        p = sub.add_parser(name, help=help_text, description=help_text)
        impl.add_arguments(p)
        p.set_defaults(_run=impl.run_from_args)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if not args.command:
        parser.print_help()
        return 2
    try:
        rc = args._run(args)
        return rc if isinstance(rc, int) else 0  # library calls may return their results
    except BertkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
