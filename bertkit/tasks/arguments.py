"""The command-line flags every fine-tuning task spells the same way: the sweep's grid
(--learning-rate, --epochs, --batch-size, --seed as comma lists), the output folder rules
(--overwrite, --resume), the data folder, quick-run limits and the fine-tuning dropout."""

from __future__ import annotations

from .. import flags
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


# [CLS] + at least one word piece of each segment + two [SEP]s, with room for a question or a pair.
MIN_SEQ_LENGTH = 8


def add_overwrite_argument(parser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an output folder that already holds results (they are replaced)")


def add_resume_argument(parser) -> None:
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted sweep in --output with the same flags: finished runs are "
                             "kept (their results and the best model so far), the others run")


def check_finetune_output(args) -> None:
    """Before any work: the output folder must not hold a previous run's results unless --overwrite
    (or --resume, which continues them)."""
    resume = getattr(args, "resume", False)
    if resume and args.overwrite:
        raise BertkitError("give --resume or --overwrite, not both")
    check_output_dir(args.output, overwrite=args.overwrite or resume, kind="fine-tuning results")


def deprecated(old: str) -> str:
    """Help text for a renamed flag's old spelling, accepted for one more release."""
    return f" ({old}: the old spelling, deprecated; it will be removed in the next release)"


def add_data_dir_argument(parser, layout: str) -> None:
    parser.add_argument("--data-dir", default=None, help=f"data folder holding {layout} (default: $BERTKIT_DATA)")


def add_max_examples_arguments(parser, train_old: str | None = None, eval_old: str | None = None,
                               how: str = "a deterministic random subset") -> None:
    """--max-train-examples / --max-eval-examples: every task spells its quick-run limits the same way."""
    parser.add_argument("--max-train-examples", *([train_old] if train_old else []), dest="max_train_examples",
                        type=flags.positive_int, default=None,
                        help=f"train on {how} of N examples (quick runs)" + (deprecated(train_old) if train_old else ""))
    parser.add_argument("--max-eval-examples", *([eval_old] if eval_old else []), dest="max_eval_examples",
                        type=flags.positive_int, default=None,
                        help=f"evaluate on {how} of N dev (and test) examples (quick runs)"
                             + (deprecated(eval_old) if eval_old else ""))


FINETUNE_DROPOUT = 0.1  # the paper's fine-tuning dropout (§A.3: "always kept at 0.1")


def add_dropout_argument(parser, default: float | None = FINETUNE_DROPOUT) -> None:
    """--dropout; `default` None lets a command tell a given value from the default (ner's feature-based mode)."""
    parser.add_argument("--dropout", type=flags.probability, default=default,
                        help="hidden and attention dropout while fine-tuning, in place of config.json's "
                             f"(default {FINETUNE_DROPOUT}, the paper's; a model pre-trained without dropout may "
                             "do better with 0)")


def dropout_overrides(dropout: float | None) -> dict:
    """config.json overrides that set the fine-tuning dropout; None keeps the model's own values."""
    return {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}


def add_sweep_arguments(parser, learning_rates: str, batch_sizes: str, epochs: str, max_seq_length: int = 128) -> None:
    """The flags every task with the sweep protocol shares; comma lists make a grid."""
    parser.add_argument("--model", required=True, help="pre-trained model directory (Hugging Face layout)")
    parser.add_argument("--output", required=True, help="output directory")
    add_overwrite_argument(parser)
    add_resume_argument(parser)
    parser.add_argument("--learning-rate", default=learning_rates, type=flags.comma_list(flags.positive_float),
                        help=f"comma list of peak learning rates; each is one run, best on dev wins (default {learning_rates})")
    parser.add_argument("--epochs", default=epochs, type=flags.comma_list(flags.positive_number),
                        help=f"comma list of epoch counts (default {epochs})")
    parser.add_argument("--batch-size", default=batch_sizes, type=flags.comma_list(flags.positive_int),
                        help=f"comma list of batch sizes (default {batch_sizes})")
    parser.add_argument("--seed", default="42", type=flags.comma_list(flags.seed),
                        help="comma list of seeds: restarts (shuffling and head init); default 42")
    parser.add_argument("--max-seq-length", type=flags.int_between(MIN_SEQ_LENGTH), default=max_seq_length,
                        help=f"word pieces per sequence (default {max_seq_length})")
    parser.add_argument("--max-train-examples", type=flags.positive_int, default=None,
                        help="train on a deterministic random subset of N examples (quick runs)")
    parser.add_argument("--eval-batch-size", type=flags.positive_int, default=128)
    parser.add_argument("--warmup-ratio", type=flags.probability, default=0.1, help="linear warm-up fraction (default 0.1)")
    parser.add_argument("--weight-decay", type=flags.non_negative_float, default=0.01)
    add_dropout_argument(parser)
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--device", default="auto", type=flags.device, help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="skip malformed data rows (and report how many) instead of stopping at the first")
    parser.add_argument("--logging-steps", type=flags.positive_int, default=50,
                        help="training loss to runs/<run>/metrics.jsonl every N steps (default 50, as ner and squad)")
    parser.add_argument("--eval-steps", type=flags.non_negative_int, default=0,
                        help="dev metrics to metrics.jsonl every N steps as well as at the end (default 0: at the end)")


def sweep_options(args) -> dict:
    return dict(learning_rates=parse_list(args.learning_rate, float), epochs=parse_list(args.epochs, number),
                batch_sizes=parse_list(args.batch_size, int), seeds=parse_list(args.seed, int),
                max_seq_length=args.max_seq_length, max_train_examples=args.max_train_examples,
                precision=args.precision, device=args.device, skip_bad_rows=args.skip_bad_rows,
                eval_batch_size=args.eval_batch_size, warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
                dropout=args.dropout, logging_steps=args.logging_steps, eval_steps=args.eval_steps, resume=args.resume)
