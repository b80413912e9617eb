"""What a fine-tuning task is: one object with one interface, which tasks/runner.py drives.

In the spirit of google-research/bert's `DataProcessor` (a task says how to read its files) and
transformers' data collators (a task says how its examples become model inputs), a task object
answers, in order:

- `read(skip_bad_rows) -> Splits`: its files into examples (train, dev, test; splits that are
  scored but do not select, like MNLI's mismatched dev or CoNLL's labelled test), and `limit` the
  quick-run subsets of them (--max-train-examples / --max-eval-examples);
- `encode(examples, tokenizer, max_seq_length) -> features`: examples into model inputs;
- `HEAD` and `head_config()`: the model class and its config overrides (labels, problem type);
- `predict(model, examples, features, runtime)` and `score(predictions, examples, split)`: dev
  predictions and the task's metrics (fractions), `select(metrics)` the score that picks the best
  run, `metric` the headline (the paper's table cell);
- `prediction_text(prediction)` and `write_outputs(...)`: prediction files; `document` results.json's
  layout (the runner's, unless a task kept its own);
- `defaults`: the paper's (or its anchor's) learning rates, epochs, batch sizes and max length;
- its command line, `bertkit finetune NAME`: `add_data_arguments(parser)` (its files and options;
  RunSettings' flags are added for it), `from_args(args, settings)` the task object from them,
  `report(result)` what the command prints; `run_finetune` ties them to the runner. A task with
  more commands offers `add_predict_arguments` / `run_predict` or `add_evaluate_arguments` /
  `run_evaluate`; `benchmarks()` are what `bertkit reproduce` runs of it.

The runner does the rest, the same way for every task: the sweep, restarts, dev selection,
resume, early stopping, results.json, the model folder. A new task is one file with such a class
and one line in tasks/registry.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..batching import FeatureSource
from ..inference.predict_batches import predict_batches
from ..hub.checkpoints import model_tokenizer
from . import runner
from .arguments import add_overwrite_argument, check_finetune_output
from .results import TaskResult, results_document, write_predictions
from .runs import RunResult
from .settings import DEV_FRACTION, Defaults, RunSettings, add_arguments
from .splits import Runtime, Splits
from .sweep import predict_precision


class Task:
    """The interface every fine-tuning task offers (see the module docstring); the methods here are
    what sentence-level classification does, which most tasks share."""

    name: str  # results.json's "task"
    label: str  # how logs and folders name it
    HEAD: type
    metric: str  # the headline metric
    selection: str  # results.json's "selection": how the best run is chosen
    defaults: Defaults
    output_subdir: str = ""  # under --output (GLUE: the task's folder, so that several tasks share one)
    requires_dev: bool = False  # a benchmark's protocol selects on dev: no dev data is an error, not one run
    phase: str = "train"  # how metrics.jsonl names the training phase
    evaluates_in_loop: bool = True  # dev in each run's metrics.jsonl (False: scored after the run only,
    # and each epoch with early stopping)
    own_data: bool = False  # a command on the user's files: one run unless --grid paper (else the paper's grid)
    skipped_settings: tuple[str, ...] = DEV_FRACTION  # RunSettings flags the command does not take
    model_help: str = "pre-trained model directory (Hugging Face layout)"

    # ---------------------------------------------------------------- the command line

    @classmethod
    def summary(cls) -> str:
        """`bertkit finetune --help`'s line for the task: the first line of the class docstring."""
        return (cls.__doc__ or cls.name).strip().splitlines()[0]

    @classmethod
    def epilog(cls) -> str | None:
        return None

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        """The task's own flags: its files, columns, windows ..."""

    @classmethod
    def add_finetune_arguments(cls, parser) -> None:
        parser.add_argument("--model", required=True, help=cls.model_help)
        parser.add_argument("--output", required=True, help="output directory")
        add_overwrite_argument(parser)
        cls.add_data_arguments(parser)
        add_arguments(parser, cls.defaults, own_data=cls.own_data, skip=cls.skipped_settings)
        parser.epilog = cls.epilog()

    @classmethod
    def settings_from_args(cls, args) -> RunSettings:
        return RunSettings.from_args(args, cls.defaults)

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "Task":
        """The task object of `bertkit finetune NAME`'s flags."""
        raise NotImplementedError

    @classmethod
    def run_finetune(cls, args) -> int:
        check_finetune_output(args)
        settings = cls.settings_from_args(args)
        task = cls.from_args(args, settings)
        task.report(runner.finetune(task, args.model, args.output, settings), args)
        return 0

    @classmethod
    def benchmarks(cls) -> tuple:
        """The data sets `bertkit reproduce` runs with the task (tasks/benchmarks.Benchmark)."""
        return ()

    def report(self, result: TaskResult, args) -> None:
        """What the command says when done (the runner has logged the best run)."""

    # ---------------------------------------------------------------- fine-tuning

    def tokenizer(self, model_dir):
        """The model folder's tokenizer (a task with --cased / --uncased overrides its do_lower_case)."""
        return model_tokenizer(model_dir)

    def limit(self, splits: Splits, max_train: int | None, max_eval: int | None, seed: int) -> Splits | None:
        """The quick-run subsets (--max-train-examples / --max-eval-examples) by the task's own rule;
        None: the runner's, a seeded random sample of train and of dev (every run sees the same)."""
        return None

    def read(self, skip_bad_rows: bool) -> Splits:
        raise NotImplementedError

    def encode(self, examples: Sequence, tokenizer, max_seq_length: int) -> list[dict]:
        raise NotImplementedError

    def eval_features(self, examples: Sequence, tokenizer, max_seq_length: int):
        """What `predict` reads for dev and the reported splits (default: `encode`'s features)."""
        return self.encode(examples, tokenizer, max_seq_length)

    def head_config(self) -> dict:
        return {}

    def batch_source(self, features: list[dict], batch_size: int, seed: int, pad_token_id: int):
        """One run's training batches (train.loop's BatchSource): seeded shuffles of the features."""
        return FeatureSource(features, batch_size, seed=seed, pad_token_id=pad_token_id)

    def logits(self, model, features: list[dict], runtime: Runtime) -> list:
        if not features:
            return []
        return predict_batches(model, features, batch_size=runtime.eval_batch_size,
                               pad_token_id=runtime.tokenizer.pad_token_id,
                               precision=predict_precision(model, runtime.precision))["logits"]

    def predict(self, model, examples: Sequence, features: list[dict], runtime: Runtime) -> list:
        raise NotImplementedError

    def score(self, predictions: list, examples: Sequence, split: str) -> dict:
        raise NotImplementedError

    def evaluate(self, model, examples: Sequence, features: list[dict], runtime: Runtime, split: str):
        """(metrics, what the prediction files need) for one split."""
        predictions = self.predict(model, examples, features, runtime)
        return self.score(predictions, examples, split), predictions

    def select(self, metrics: dict) -> float:
        return metrics[self.metric]

    def describe(self, splits: Splits, train_features) -> str:
        """The data, in the run's first log line."""
        dev = "no" if splits.dev is None else len(splits.dev)
        return f"{len(train_features)} train / {dev} dev examples"

    def details(self, splits: Splits, features: dict, runtime: Runtime) -> dict:
        """What results.json records about the task and its data (`features` by split name)."""
        return dict(splits.details)

    def identity(self, splits: Splits) -> dict:
        """What a resumed sweep must have in common with the interrupted one, besides the runner's settings."""
        return {}

    def best_details(self, outputs: dict) -> dict:
        """What results.json records of the best run's outputs (besides its metrics)."""
        return {}

    def document(self, best: RunResult, runs: list[RunResult], details: dict) -> dict:
        """results.json: the runner's layout (runs, best, summary over seeds) with `details`."""
        return results_document(self.name, best, runs, details)

    def result_metrics(self, metrics: dict) -> dict:
        """A run's metrics as its TaskResult reports them (the dev metrics)."""
        return metrics

    def prediction_text(self, prediction) -> str:
        return str(prediction)

    def unlabelled(self, features: list[dict]) -> list[dict]:
        return [{k: v for k, v in f.items() if k != "labels"} for f in features]

    def write_outputs(self, out: Path, model, outputs: dict, splits: Splits, runtime: Runtime) -> dict:
        """Prediction files for dev (and the reported splits), then for test; returns results.json's additions."""
        for name, examples in {"dev": splits.dev, **splits.reported}.items():
            if examples is not None and name in outputs:
                write_predictions(out / f"{name}_predictions.tsv", [e.index for e in examples],
                                  [self.prediction_text(p) for p in outputs[name]])
        return self.write_test(out, model, splits, runtime)

    def write_test(self, out: Path, model, splits: Splits, runtime: Runtime) -> dict:
        """test_predictions.tsv; a labelled test file is scored too (test_metrics)."""
        test = splits.test
        if test is None:
            return {}
        features = self.unlabelled(self.encode(test, runtime.tokenizer, runtime.max_seq_length))
        predictions = self.predict(model, test, features, runtime) if features else []
        write_predictions(out / "test_predictions.tsv", [e.index for e in test],
                          [self.prediction_text(p) for p in predictions])
        if test and all(e.label is not None for e in test):
            return {"test_metrics": self.score(predictions, test, "test")}
        return {}
