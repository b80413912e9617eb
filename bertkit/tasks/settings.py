"""A fine-tuning run's settings, written down once: `RunSettings`, one field per `bertkit finetune`
flag with its type, help and default. The command line is made from these fields (`add_arguments`),
read back whole (`from_args`) and handed whole to the runner, the sweep and the training loop;
`Defaults` are a task's own values for the few fields whose default is the task's (the paper's grid
for it, its sequence length).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .. import flags, settings
from ..device import DEFAULT_PRECISION, PRECISION_MEANINGS, PRECISIONS
from ..errors import BertkitError
from ..settings import setting

# [CLS] + at least one word piece of each segment + two [SEP]s, with room for a question or a pair.
MIN_SEQ_LENGTH = 8
FINETUNE_DROPOUT = 0.1  # the paper's fine-tuning dropout (§A.3: "always kept at 0.1")
# Comma lists whose product is the sweep's grid (one run per combination, the best on dev wins).
GRID = ("learning_rates", "epochs", "batch_sizes")
# Fields whose default is the task's (Defaults), not RunSettings' own.
FROM_TASK = GRID + ("max_seq_length", "eval_batch_size")
# Held-out dev only where a task's dev can be missing (own files, SWAG): a benchmark has its dev file.
DEV_FRACTION = ("dev_fraction", "split_seed")


@dataclasses.dataclass(frozen=True)
class Defaults:
    """A task's settings when no flag says otherwise: `paper` is the protocol of the paper (or its
    anchor) as a grid; `single` the one run an own-data command makes without `--grid paper`."""

    learning_rates: tuple[float, ...]
    learning_rate: float | None = None  # the one run's (own-data commands without --grid paper); None: the first
    epochs: tuple[float, ...] = (3,)
    batch_sizes: tuple[int, ...] = (32,)
    batch_size: int | None = None  # the one run's, as learning_rate; None: the first
    num_train_epochs: float | None = None  # the one run's, as learning_rate; None: the first
    max_seq_length: int = 128
    eval_batch_size: int = 128
    anchor: str = ""  # where they come from, for --help ("the paper's §4.1 GLUE protocol")

    @property
    def single_learning_rate(self) -> float:
        return self.learning_rate if self.learning_rate is not None else self.learning_rates[0]

    @property
    def single_batch_size(self) -> int:
        return self.batch_size if self.batch_size is not None else self.batch_sizes[0]

    @property
    def single_epochs(self) -> float:
        return self.num_train_epochs if self.num_train_epochs is not None else self.epochs[0]

    def grid(self) -> dict:
        return {"learning_rates": self.learning_rates, "epochs": self.epochs, "batch_sizes": self.batch_sizes}

    def single(self) -> dict:
        return {"learning_rates": (self.single_learning_rate,), "epochs": (self.single_epochs,),
                "batch_sizes": (self.single_batch_size,)}

    def settings(self, paper: bool = True) -> dict:
        """RunSettings' task-given fields: the paper's grid, or (paper False) the one run."""
        return {**(self.grid() if paper else self.single()), "max_seq_length": self.max_seq_length,
                "eval_batch_size": self.eval_batch_size}


PRECISION_HELP = " | ".join(f"{name} ({'default: ' if name == DEFAULT_PRECISION else ''}{meaning})"
                            for name, meaning in PRECISION_MEANINGS.items())


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every task's fine-tuning takes besides its data: the grid and restarts, the training
    recipe (warm-up, decay, dropout, micro-batches), quick-run subsets, how dev is found (a dev split,
    a held-out fraction of train, or none: one run, trained and saved without selection), logging
    and checkpoints. Each field is one flag of `bertkit finetune TASK`."""

    learning_rates: tuple[float, ...] = setting(
        (5e-5,), flag="--learning-rate", type=flags.comma_list(flags.positive_float),
        help="comma list of peak learning rates, each one run; the best on dev wins")
    epochs: tuple[float, ...] = setting((3,), type=flags.comma_list(flags.positive_number),
                                        help="comma list of epoch counts")
    batch_sizes: tuple[int, ...] = setting((32,), flag="--batch-size", type=flags.comma_list(flags.positive_int),
                                           help="comma list of (effective) batch sizes")
    seeds: tuple[int, ...] = setting((42,), flag="--seed", type=flags.comma_list(flags.seed),
                                     help="comma list of seeds: restarts (shuffling and head initialisation)")
    max_seq_length: int = setting(128, type=flags.int_between(MIN_SEQ_LENGTH), help="word pieces per sequence")
    max_train_examples: int | None = setting(
        None, type=flags.positive_int,
        help="train on a subset of N examples (quick runs: a seeded random sample; NER the first N sentences)")
    max_eval_examples: int | None = setting(None, type=flags.positive_int,
                                            help="evaluate on a subset of N dev examples, as --max-train-examples")
    subset_seed: int = setting(0, type=flags.seed, help="seed of the --max-train-examples / --max-eval-examples samples")
    precision: str = setting(DEFAULT_PRECISION, choices=PRECISIONS, help=PRECISION_HELP, show_default=False)
    device: str = setting("auto", type=flags.device, help="auto | cpu | cuda | cuda:N")
    skip_bad_rows: bool = setting(False, action="store_true",
                                  help="skip malformed data rows (and report how many) instead of stopping at the first")
    eval_batch_size: int = setting(128, type=flags.positive_int, help="batch size of dev and test prediction")
    warmup_ratio: float = setting(0.1, type=flags.probability, help="linear warm-up over this fraction of the steps")
    weight_decay: float = setting(0.01, type=flags.non_negative_float, help="AdamW weight decay")
    dropout: float | None = setting(
        FINETUNE_DROPOUT, type=flags.probability,
        help="hidden and attention dropout while fine-tuning, in place of config.json's (the paper's; a model "
             "pre-trained without dropout may do better with 0)")
    logging_steps: int = setting(50, type=flags.positive_int,
                                 help="training loss to runs/<run>/metrics.jsonl every N steps")
    eval_steps: int = setting(0, type=flags.non_negative_int,
                              help="dev metrics to metrics.jsonl every N steps as well as at the end (0: at the end)")
    resume: bool = setting(False, action="store_true",
                           help="continue an interrupted sweep in --output with the same flags: finished runs are kept "
                                "(their results and the best model so far), the others run, a run checkpointed with "
                                "--save-steps from its newest checkpoint")
    grad_accum: int = setting(1, type=flags.positive_int,
                              help="micro-batches per optimizer step: each --batch-size must be a multiple of it "
                                   "(the same training in less memory)")
    early_stopping_patience: int | None = setting(
        None, type=flags.positive_int,
        help="stop a run after N dev evaluations (every --eval-steps, else every epoch) without a better score, "
             "keeping its best weights (default: train to the end)")
    dev_fraction: float | None = setting(
        None, type=flags.open_fraction,
        help="hold out this fraction of the training file as dev when there is no dev file (e.g. 0.2)")
    split_seed: int = setting(0, type=flags.seed, help="seed of the --dev-fraction split")
    save_steps: int = setting(0, type=flags.non_negative_int,
                              help="checkpoint every N steps, in --output/runs/<run>/ (0: none); --resume continues "
                                   "an interrupted run from there")
    progress: bool | None = setting(None, cli=False, help="the training progress bar (None: when stderr is a terminal)")

    def __post_init__(self):
        for name in GRID + ("seeds",):  # lists from Python callers and flags: tuples, so settings compare and hash
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(value) if isinstance(value, (list, tuple)) else (value,))

    @classmethod
    def of(cls, **options) -> "RunSettings":
        """From keyword options (a task function's **options), refusing unknown names."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown fine-tuning option(s): {', '.join(unknown)}")
        return cls(**options)

    @classmethod
    def paper(cls, defaults: Defaults, **options) -> "RunSettings":
        """The task's paper protocol (`defaults`), with `options` in place of any of it."""
        return cls.of(**{**defaults.settings(paper=True), **options})

    @classmethod
    def from_args(cls, args, defaults: Defaults) -> "RunSettings":
        """The settings the flags of `add_arguments` give: what the command line set, the task's
        `defaults` under it (an own-data command's one run unless --grid paper), RunSettings' own
        under those."""
        paper = getattr(args, "grid", "paper") == "paper"
        return settings.from_args(cls, args, **defaults.settings(paper=paper))

    def point(self, config: dict) -> "RunSettings":
        """The settings of one run of the grid (`config`: its learning rate, epochs, batch size, seed)."""
        return dataclasses.replace(self, learning_rates=(float(config["learning_rate"]),),
                                   epochs=(config["epochs"],), batch_sizes=(int(config["batch_size"]),),
                                   seeds=(int(config["seed"]),))

    def _one(self, name: str):
        values = getattr(self, name)
        if len(values) != 1:
            raise ValueError(f"{name} holds a grid ({shown_values(values)}): one run's settings hold one value")
        return values[0]

    # One run's values (a grid point's settings).
    learning_rate = property(lambda self: self._one("learning_rates"))
    num_epochs = property(lambda self: self._one("epochs"))
    batch_size = property(lambda self: self._one("batch_sizes"))
    seed = property(lambda self: self._one("seeds"))


def shown_values(values) -> str:
    return settings.shown(values)


def grid_help(defaults: Defaults, own_data: bool) -> dict:
    """--learning-rate / --epochs / --batch-size help: the task's default and, for own data, the grid
    --grid paper runs."""
    paper = (f"{settings.shown(defaults.learning_rates)} x epochs {settings.shown(defaults.epochs)} x batch "
             f"{settings.shown(defaults.batch_sizes)}, {defaults.anchor}")
    fields = {f.name: f for f in dataclasses.fields(RunSettings)}
    if not own_data:
        return {"learning_rates": f"{fields['learning_rates'].metadata['help']} (default {paper})"}
    single = defaults.single()
    grid = defaults.grid()
    return {name: f"{fields[name].metadata['help']} (default {settings.shown(single[name])}, one run; with --grid "
                  f"paper {settings.shown(grid[name])})" for name in GRID}


def add_arguments(parser, defaults: Defaults, own_data: bool = False, skip: Sequence[str] = ()) -> None:
    """RunSettings' flags for a task whose defaults are `defaults`. A reproduction command (`own_data`
    False) runs the paper's protocol by default; a command on the user's own files makes one run,
    with the paper's grid one flag away (--grid paper), and takes --dev-fraction when there is no dev
    file. `skip`: the fields the task does not take."""
    if own_data:
        parser.add_argument("--grid", choices=("paper",), default=None,
                            help=f"paper: the paper's sweep for this task ({defaults.anchor}), best on dev wins; "
                                 "default: one run")
    group = parser.add_argument_group("run settings", "the grid (comma lists: one run per combination), the "
                                      "training recipe, quick runs, logging and checkpoints")
    settings.add_arguments(group, RunSettings, defaults=defaults.settings(paper=not own_data),
                           helps=grid_help(defaults, own_data), skip=skip)


def check_grad_accum(s: RunSettings) -> None:
    uneven = [b for b in s.batch_sizes if b % s.grad_accum]
    if uneven:
        raise BertkitError(f"--batch-size {uneven[0]} is not a multiple of --grad-accum {s.grad_accum}")
