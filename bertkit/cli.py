"""`bertkit` command line: parses arguments and calls the library function of the same name.

Each command lives in the module that implements it, as `add_arguments(parser)` + `run_from_args(args)`;
this file only lists them. Bad input surfaces as one line `error: file:line: problem`, exit 2.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys

from .version import __version__
from .errors import BertkitError

# command -> (module[:attribute] with add_arguments/run_from_args, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train-tokenizer": ("bertkit.tokenizer.cli:train", "train a WordPiece vocabulary on corpus files"),
    "tokenize": ("bertkit.tokenizer.cli:tokenize", "tokenize stdin lines into ids or WordPiece tokens"),
    "create-pretraining-data": ("bertkit.pretraining.create", "corpus -> MLM/NSP instances (sharded arrays)"),
    "pretrain": ("bertkit.pretraining.run", "pre-train with MLM + NSP (or the paper's ablations)"),
    "finetune": ("bertkit.tasks.cli:finetune", "fine-tune on glue | swag | squad | ner, or your own files: text-classification | "
                                                 "token-classification | question-answering | multiple-choice"),
    "predict": ("bertkit.tasks.cli:predict", "predict new text with any head (or a SQuAD file: predict squad)"),
    "serve": ("bertkit.serving.command", "HTTP JSON API (text-embeddings-inference routes) with dynamic batching"),
    "export": ("bertkit.inference.export", "the model as an ONNX graph (dynamic batch and sequence axes)"),
    "evaluate": ("bertkit.tasks.cli:evaluate", "official evaluators: squad | conll, and embeddings: sts | retrieval | reranking"),
    "extract-features": ("bertkit.features", "per-token activations of a frozen encoder"),
    "mine-hard-negatives": ("bertkit.tasks.hard_negatives", "add hard negatives to (anchor, positive) pairs: "
                                                                 "a training file for finetune sentence-embeddings"),
    "reproduce": ("bertkit.reproduce.command", "the paper end to end at a compute budget, with a report"),
    "plot": ("bertkit.train.plot", "PNG curves from a run's metrics.jsonl"),
    "convert": ("bertkit.convert", "original TensorFlow checkpoint -> Hugging Face-layout folder"),
}


# Flags whose value is a model: a local folder or a Hub id (`bert-base-uncased`, `org/name`).
MODEL_FLAGS = ("model", "init_from")
REVISION_HELP = ("Hub revision (branch, tag or commit hash) of a model given as a Hub id "
                 "(default: main; cached in HF_HOME / HF_HUB_CACHE)")


def add_revision_flags(parser: argparse.ArgumentParser) -> None:
    """--revision on every (sub-)command that takes a model."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                add_revision_flags(child)
    dests = {action.dest for action in parser._actions}
    if dests & set(MODEL_FLAGS) and "revision" not in dests:
        parser.add_argument("--revision", help=REVISION_HELP)
        for action in parser._actions:
            if action.dest in MODEL_FLAGS and action.help and "Hub id" not in action.help:
                action.help += ", or a Hub id (bert-base-uncased, org/name)"


def attach_revision(args: argparse.Namespace) -> None:
    """--revision travels with the command's model reference (hub.resolve.ModelReference) to wherever
    the command loads it (tokenizer, weights); Hub ids are resolved there, after the command's own
    checks of its outputs."""
    from .hub.resolve import ModelReference

    revision = getattr(args, "revision", None)
    references = [getattr(args, dest) for dest in MODEL_FLAGS if isinstance(getattr(args, dest, None), str)]
    if revision:
        if not references:
            raise BertkitError("--revision applies to a model given as a Hub id (--model / --init-from)")
        for reference in references:
            if os.path.exists(reference):
                raise BertkitError(f"--revision {revision} applies to Hub ids, not to a local folder", path=reference)
        for dest in MODEL_FLAGS:
            if isinstance(getattr(args, dest, None), str):
                setattr(args, dest, ModelReference(getattr(args, dest), revision))


def _load(target: str):
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a BertkitError (one `error:` line, exit 2), not usage + message.
    Sub-command parsers inherit the class, so every command behaves the same."""

    def error(self, message: str):
        raise BertkitError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser(commands: set[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `commands`, only those commands' modules are imported (and
    their flags built): the others are listed with their help line, so `bertkit --help` and
    `--version` start without torch."""
    parser = OneLineErrorParser(prog="bertkit", description="BERT: tokenizer, pre-training, fine-tuning, reproduction.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug-level logging")
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if commands is not None and name not in commands:
            continue
        impl = _load(target)
        impl.add_arguments(p)
        add_revision_flags(p)
        p.set_defaults(_run=impl.run_from_args)
    return parser


def chosen_command(argv: list[str]) -> set[str]:
    """The command named on the command line (the first argument that is one), as build_parser's
    `commands`: empty for `bertkit --help`, `bertkit --version` or no command."""
    first = next((arg for arg in argv if arg in COMMANDS), None)
    return {first} if first else set()


# `serve`: libgomp's spin count, set explicitly. With libgomp's default wait policy the event-loop
# thread, woken to answer, resumed 0.9-2.9 ms after a short forward pass had finished, once the
# server had been 0.1 s without requests (MiniLM, compiled bf16 and int8, 2 vCPUs); with an explicit
# count, 0.1 ms (10,000 and 30,000,000 alike; why the default does this was not established: libgomp
# throttles its spinning once it manages more threads than there are CPUs, as a server's loop, batcher
# and tokenizer threads make it). 10,000 rounds are a thirtieth of the default's, so the worker does
# not hold a core long between requests. Whole requests as the client saw them, the default against this,
# after 0.1 s of rest / back to back: compiled int8 9.4-9.6 -> 6.4-6.7 ms / 5.6-5.9 -> 5.0-5.4,
# compiled fp32 10.3-10.9 -> 8.8-9.0 / 8.6-9.0 -> 7.3-7.6, eager fp32 11.2-11.8 -> 10.4-10.7 /
# 9.8-10.4 -> 8.8-9.1, eager int8 10.5 -> 9.7 / 8.4 -> 7.6 (docs/serving.md). libgomp reads it
# once, when torch loads it: set before any import of torch, and only where the user has not.
SERVE_GOMP_SPINCOUNT = "10000"


def prepare_openmp(commands: set[str], environ=os.environ, modules=sys.modules) -> None:
    if "serve" in commands and "GOMP_SPINCOUNT" not in environ and "torch" not in modules:
        environ["GOMP_SPINCOUNT"] = SERVE_GOMP_SPINCOUNT


def os_error_text(e: OSError) -> str:
    """`PATH: reason` for an operating-system failure (disk full, permission denied, not a folder ...)."""
    reason = e.strerror or str(e) or errno.errorcode.get(e.errno or 0, type(e).__name__)
    return f"{e.filename}: {reason}" if e.filename is not None else reason


def silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests capture it)
        pass


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (tests and callers may swap it)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


class _Format(logging.Formatter):
    """Progress lines as they are; warnings and worse prefixed with their level ("warning: ...")."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def setup_logging(verbose: bool) -> None:
    """The one output channel: the "bertkit" logger to stderr. Progress (info) is shown; --verbose
    adds debug detail. Results go to stdout or files, never through the logger."""
    logger = logging.getLogger("bertkit")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_Format("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)


def print_error(text: str) -> None:
    print("error: " + " ".join(text.splitlines()), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        commands = chosen_command(argv)
        prepare_openmp(commands)  # before the command's module imports torch
        parser = build_parser(commands)
        args = parser.parse_args(argv)
    except BertkitError as e:
        print_error(str(e))
        return 2
    except SystemExit as e:  # --help / --version
        return e.code if isinstance(e.code, int) else 0
    setup_logging(args.verbose)
    if not args.command:
        parser.print_help()
        return 2
    try:
        attach_revision(args)
        rc = args._run(args)
        rc = rc if isinstance(rc, int) else 0  # library calls may return their results
        if rc == 0 and args.command in ("finetune", "pretrain") and getattr(args, "output", None):
            from .hub.model_card import refresh_model_cards  # results.json and summaries exist only now

            refresh_model_cards(args.output)
        return rc
    except BertkitError as e:
        print_error(str(e))
        return 2
    except BrokenPipeError:
        # The reader went away (`bertkit tokenize ... | head -1`): stop quietly, as Unix tools do.
        silence_stdout()
        return 128 + 13  # SIGPIPE's conventional status
    except OSError as e:  # disk full, permission denied, a file where a folder belongs ...
        print_error(os_error_text(e))
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
