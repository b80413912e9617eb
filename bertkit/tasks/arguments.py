"""The command-line flags every fine-tuning task spells the same way: the sweep's grid
(--learning-rate, --epochs, --batch-size, --seed as comma lists), the output folder rules
(--overwrite, --resume), the data folder, quick-run limits and the fine-tuning dropout."""

from __future__ import annotations

from .. import flags
from ..device import add_precision_argument
from ..errors import BertkitError
from ..outputs import check_output_dir
from .task import Defaults


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


def add_data_dir_argument(parser, layout: str) -> None:
    parser.add_argument("--data-dir", default=None, help=f"data folder holding {layout} (default: $BERTKIT_DATA)")


def add_max_examples_arguments(parser, how: str = "a deterministic random subset") -> None:
    """--max-train-examples / --max-eval-examples: every task spells its quick-run limits the same way."""
    parser.add_argument("--max-train-examples", dest="max_train_examples", type=flags.positive_int, default=None,
                        help=f"train on {how} of N examples (quick runs)")
    parser.add_argument("--max-eval-examples", dest="max_eval_examples", type=flags.positive_int, default=None,
                        help=f"evaluate on {how} of N dev (and test) examples (quick runs)")


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


def _values(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def add_sweep_arguments(parser, defaults: Defaults, own_data: bool = False) -> None:
    """The flags every task run by tasks/runner.py shares; comma lists make a grid.

    A reproduction command (`own_data` False) runs the paper's protocol by default (`defaults`).
    A command on the user's own files makes one run at the stated learning rate, with the paper's
    grid one flag away (`--grid paper`); it also takes --dev-fraction when there is no dev file, and
    trains and saves one run without selection when there is no dev data at all."""
    parser.add_argument("--model", required=True, help="pre-trained model directory (Hugging Face layout)")
    parser.add_argument("--output", required=True, help="output directory")
    add_overwrite_argument(parser)
    add_resume_argument(parser)
    paper = (f"{_values(defaults.learning_rates)} x epochs {_values(defaults.epochs)} x batch "
             f"{_values(defaults.batch_sizes)}, {defaults.anchor}")
    if own_data:
        parser.add_argument("--grid", choices=("paper",), default=None,
                            help=f"paper: the paper's sweep for this task (learning rates {paper}), best on dev "
                                 "wins; default: one run")
        lr_help = (f"comma list of peak learning rates, each one run, best on dev wins (default "
                   f"{defaults.single_learning_rate:g}, one run; with --grid paper {_values(defaults.learning_rates)})")
        epochs_default = batch_default = None
    else:
        lr_help = f"comma list of peak learning rates; each is one run, best on dev wins (default {paper})"
        epochs_default, batch_default = _values(defaults.epochs), _values(defaults.batch_sizes)
    parser.add_argument("--learning-rate", default=None if own_data else _values(defaults.learning_rates),
                        type=flags.comma_list(flags.positive_float), help=lr_help)
    parser.add_argument("--epochs", default=epochs_default, type=flags.comma_list(flags.positive_number),
                        help=f"comma list of epoch counts (default {defaults.single_epochs:g})")
    parser.add_argument("--batch-size", default=batch_default, type=flags.comma_list(flags.positive_int),
                        help=f"comma list of (effective) batch sizes (default {defaults.single_batch_size}"
                             + (f"; with --grid paper {_values(defaults.batch_sizes)})" if own_data else ")"))
    parser.add_argument("--grad-accum", type=flags.positive_int, default=1,
                        help="micro-batches per optimizer step: each --batch-size must be a multiple of it "
                             "(the same training in less memory)")
    parser.add_argument("--seed", default="42", type=flags.comma_list(flags.seed),
                        help="comma list of seeds: restarts (shuffling and head init); default 42")
    parser.add_argument("--max-seq-length", type=flags.int_between(MIN_SEQ_LENGTH), default=defaults.max_seq_length,
                        help=f"word pieces per sequence (default {defaults.max_seq_length})")
    parser.add_argument("--max-train-examples", type=flags.positive_int, default=None,
                        help="train on a deterministic random subset of N examples (quick runs)")
    parser.add_argument("--eval-batch-size", type=flags.positive_int, default=defaults.eval_batch_size,
                        help=f"batch size of dev and test prediction (default {defaults.eval_batch_size})")
    parser.add_argument("--warmup-ratio", type=flags.probability, default=0.1, help="linear warm-up fraction (default 0.1)")
    parser.add_argument("--weight-decay", type=flags.non_negative_float, default=0.01)
    add_dropout_argument(parser)
    add_precision_argument(parser)
    parser.add_argument("--device", default="auto", type=flags.device, help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="skip malformed data rows (and report how many) instead of stopping at the first")
    parser.add_argument("--logging-steps", type=flags.positive_int, default=50,
                        help="training loss to runs/<run>/metrics.jsonl every N steps (default 50, as ner and squad)")
    parser.add_argument("--eval-steps", type=flags.non_negative_int, default=0,
                        help="dev metrics to metrics.jsonl every N steps as well as at the end (default 0: at the end)")
    parser.add_argument("--early-stopping-patience", type=flags.positive_int, default=None,
                        help="stop a run after N dev evaluations (every --eval-steps, else every epoch) without a "
                             "better score, keeping its best weights (default: train to the end)")


def add_dev_fraction_arguments(parser) -> None:
    parser.add_argument("--dev-fraction", type=flags.open_fraction, default=None,
                        help="hold out this fraction of the training file as dev when there is no dev file (e.g. 0.2)")
    parser.add_argument("--split-seed", type=flags.seed, default=0, help="seed of the --dev-fraction split (default 0)")


def sweep_options(args, defaults: Defaults | None = None) -> dict:
    """RunSettings options from the flags of add_sweep_arguments (and add_dev_fraction_arguments);
    `defaults` fills what an own-data command left unset: the paper's grid with --grid paper, else
    one run."""
    paper = getattr(args, "grid", None) == "paper"

    def given(value, grid, single, cast):
        if value is not None:
            return parse_list(value, cast)
        return list(grid) if paper else [single]

    options = dict(
        learning_rates=given(args.learning_rate, defaults and defaults.learning_rates,
                             defaults and defaults.single_learning_rate, float),
        epochs=given(args.epochs, defaults and defaults.epochs, defaults and defaults.single_epochs, number),
        batch_sizes=given(args.batch_size, defaults and defaults.batch_sizes,
                          defaults and defaults.single_batch_size, int),
        seeds=parse_list(args.seed, int), max_seq_length=args.max_seq_length, max_train_examples=args.max_train_examples,
        precision=args.precision, device=args.device, skip_bad_rows=args.skip_bad_rows,
        eval_batch_size=args.eval_batch_size, warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
        dropout=args.dropout, logging_steps=args.logging_steps, eval_steps=args.eval_steps, resume=args.resume,
        grad_accum=args.grad_accum, early_stopping_patience=args.early_stopping_patience)
    if hasattr(args, "dev_fraction"):
        options.update(dev_fraction=args.dev_fraction, split_seed=args.split_seed)
    return options
