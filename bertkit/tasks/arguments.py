"""The command-line pieces fine-tuning commands share besides RunSettings' flags (tasks/settings.py):
the output folder rules (--overwrite; --resume continues), the data folder, comma lists read from
Python callers, and the dropout as config.json overrides."""

from __future__ import annotations

from ..errors import BertkitError
from ..outputs import check_output_dir


def parse_list(text, cast=float) -> list:
    """'5e-5,3e-5' -> [5e-05, 3e-05]; a single value -> [value]."""
    if isinstance(text, (list, tuple)):
        return [cast(t) for t in text]
    try:
        return [cast(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BertkitError(f"cannot read {text!r} as a comma-separated list of {cast.__name__}") from None



def number(text: str) -> int | float:
    """'3' -> 3, '2.5' -> 2.5 (epochs may be fractional)."""
    value = float(text)
    return int(value) if value.is_integer() else value


def add_overwrite_argument(parser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an output folder that already holds results (they are replaced)")


def check_finetune_output(args) -> None:
    """Before any work: the output folder must not hold a previous run's results unless --overwrite
    (or --resume, which continues them)."""
    resume = getattr(args, "resume", False)
    if resume and args.overwrite:
        raise BertkitError("give --resume or --overwrite, not both")
    check_output_dir(args.output, overwrite=args.overwrite or resume, kind="fine-tuning results")


def add_data_dir_argument(parser, layout: str) -> None:
    parser.add_argument("--data-dir", default=None, help=f"data folder holding {layout} (default: $BERTKIT_DATA)")


def dropout_overrides(dropout: float | None) -> dict:
    """config.json overrides that set the fine-tuning dropout; None keeps the model's own values."""
    return {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
