"""One runner for every fine-tuning task (tasks/task.py's interface): read, encode, the sweep
(grid x restarts, the best dev score wins, resume), early stopping, results.json, prediction
files and the best model, the same way for all of them.

`RunSettings` are what every task takes besides its own data options: the grid, restarts, the
training recipe (warm-up, decay, dropout, micro-batches) and how dev is found (a dev split, a
held-out fraction of train, or none: one run, trained and saved without selection).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
from pathlib import Path
from typing import Sequence

from ..errors import BertkitError
from ..hub.checkpoints import model_tokenizer
from ..outputs import write_json
from .arguments import FINETUNE_DROPOUT, dropout_overrides
from .examples import Examples, subsample
from .results import TaskResult, publish_best_metrics, results_document
from .runs import config_text, grid
from .sweep import run_protocol, train_one
from .task import Defaults, Runtime, Splits, Task

log = logging.getLogger("bertkit")

NO_DEV_TO_CHOOSE = ("without dev data there is nothing to choose runs or stop on: give a dev file or --dev-fraction, "
                    "or one learning rate, epoch count, batch size and seed")


@dataclasses.dataclass
class RunSettings:
    """The settings every task's fine-tuning takes (the flags tasks/arguments.py defines)."""

    learning_rates: Sequence[float] = (5e-5,)
    epochs: Sequence[float] = (3,)
    batch_sizes: Sequence[int] = (32,)
    seeds: Sequence[int] = (42,)
    max_seq_length: int = 128
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    subset_seed: int = 0  # of the --max-*-examples samples
    precision: str = "auto"
    device: str = "auto"
    skip_bad_rows: bool = False
    eval_batch_size: int = 128
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    dropout: float | None = FINETUNE_DROPOUT
    logging_steps: int = 50
    eval_steps: int = 0
    resume: bool = False
    grad_accum: int = 1
    early_stopping_patience: int | None = None
    dev_fraction: float | None = None  # without a dev split: hold out this fraction of train
    split_seed: int = 0

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
        return cls.of(**{**dict(learning_rates=defaults.learning_rates, epochs=defaults.epochs,
                                batch_sizes=defaults.batch_sizes, max_seq_length=defaults.max_seq_length,
                                eval_batch_size=defaults.eval_batch_size), **options})


def split_dev(examples: Examples, dev_fraction: float, seed: int = 0) -> tuple[Examples, Examples]:
    """Hold out a seeded random dev_fraction of a single file as dev (both parts keep file order)."""
    if not 0.0 < dev_fraction < 1.0:
        raise BertkitError(f"--dev-fraction must be between 0 and 1, not {dev_fraction}")
    n_dev = max(1, round(len(examples) * dev_fraction))
    if n_dev >= len(examples):
        raise BertkitError(f"{len(examples)} examples are too few to hold out {dev_fraction:.0%} as dev",
                           path=getattr(examples, "path", None))
    dev_ids = set(random.Random(seed).sample(range(len(examples)), n_dev))
    path = getattr(examples, "path", None)
    train = Examples([e for i, e in enumerate(examples) if i not in dev_ids], path, getattr(examples, "skipped", ()))
    dev = Examples([e for i, e in enumerate(examples) if i in dev_ids], path)
    return train, dev


def with_dev(splits: Splits, settings: RunSettings) -> Splits:
    """The dev split: the task's, else --dev-fraction of train, else none (and then --dev-fraction
    must not be given with a dev file: one or the other)."""
    if splits.dev is not None:
        if settings.dev_fraction:
            raise BertkitError("--dev-fraction holds out part of the training data when there is no dev file; "
                               "this run has one")
        return splits
    if not settings.dev_fraction:
        return splits
    train, dev = split_dev(splits.train, settings.dev_fraction, settings.split_seed)
    details = {**splits.details, "dev_fraction": settings.dev_fraction, "split_seed": settings.split_seed}
    return dataclasses.replace(splits, train=train, dev=dev, details=details)


def finetune(task: Task, model_dir, output_dir=None, settings: RunSettings | None = None) -> TaskResult:
    """Fine-tune `task` with `settings`; the TaskResult's document is results.json.

    Every (learning rate, epochs, batch size, seed) combination is one run; the best dev score
    (`task.select`) wins. With output_dir (under it, task.output_subdir): results.json, the
    prediction files, model/ (the best run, Hugging Face layout, with its tokenizer) and
    metrics.jsonl (the best run's; every run's in runs/<run>/)."""
    s = settings or RunSettings()
    uneven = [b for b in s.batch_sizes if b % s.grad_accum]
    if uneven:
        raise BertkitError(f"--batch-size {uneven[0]} is not a multiple of --grad-accum {s.grad_accum}")
    splits = with_dev(task.read(s.skip_bad_rows), s)
    configs = grid(s.learning_rates, s.epochs, s.batch_sizes, s.seeds)
    if splits.dev is None and task.requires_dev:
        raise BertkitError("no dev set: give a dev file or --dev-fraction to hold out part of the train file")
    if splits.dev is None and (len(configs) > 1 or s.early_stopping_patience):
        raise BertkitError(NO_DEV_TO_CHOOSE)
    tokenizer = model_tokenizer(model_dir)
    runtime = Runtime(tokenizer, s.eval_batch_size, s.precision, s.max_seq_length)
    train = subsample(splits.train, s.max_train_examples, s.subset_seed)
    dev = None if splits.dev is None else subsample(splits.dev, s.max_eval_examples, s.subset_seed)
    used = dataclasses.replace(splits, train=train, dev=dev)
    train_features = task.encode(train, tokenizer, s.max_seq_length)
    dev_features = None if dev is None else task.eval_features(dev, tokenizer, s.max_seq_length)
    reported = {name: task.eval_features(ex, tokenizer, s.max_seq_length) for name, ex in used.reported.items()}
    head = {**task.head_config(), **dropout_overrides(s.dropout)}

    def build_model():
        return task.HEAD.from_pretrained(model_dir, **head)

    def evaluate(model) -> tuple[dict, dict]:
        metrics, predictions = task.evaluate(model, dev, dev_features, runtime, "dev")
        outputs = {"dev": predictions}
        for name, examples in used.reported.items():  # scored and reported, not used to select
            more, outputs[name] = task.evaluate(model, examples, reported[name], runtime, name)
            metrics.update(more)
        return metrics, outputs

    log.info(f"{task.label}: {task.describe(used, train_features)}, {len(configs)} run(s) (grid x seeds), "
             f"max length {s.max_seq_length}" + ("" if dev is not None else "; no dev data: no selection"))
    for name, examples in used.named().items():
        skipped = getattr(examples, "skipped", ())
        if skipped:
            log.warning(f"{task.label}: skipped {len(skipped)} malformed {name} row(s), first: {skipped[0]}")
    out = None if output_dir is None else Path(output_dir) / task.output_subdir
    runs_dir = None if out is None else out / "runs"
    identity = {"model": str(model_dir), "max_seq_length": s.max_seq_length, "dropout": s.dropout,
                **task.identity(used)}
    if s.grad_accum != 1:
        identity["grad_accum"] = s.grad_accum
    best, runs = run_protocol(configs, build_model, train_features, evaluate if dev is not None else None,
                              score=task.select, precision=s.precision, device=s.device, warmup_ratio=s.warmup_ratio,
                              weight_decay=s.weight_decay, pad_token_id=tokenizer.pad_token_id, label=task.label,
                              train=functools.partial(train_one, grad_accum=s.grad_accum), runs_dir=runs_dir,
                              logging_steps=s.logging_steps, eval_steps=s.eval_steps, resume=s.resume,
                              identity=identity, early_stopping_patience=s.early_stopping_patience)
    results = results_document(task.name, best, runs, {
        "num_train_examples": len(train), "num_dev_examples": 0 if dev is None else len(dev),
        "max_seq_length": s.max_seq_length,
        "skipped_rows": {name: len(getattr(ex, "skipped", ())) for name, ex in used.named().items()},
        "model": str(model_dir), **task.details(used, train_features), **task.best_details(best.artifacts[1]),
        "selection": task.selection if dev is not None else "none: no dev data, the one run is kept",
        **({"grad_accum": s.grad_accum} if s.grad_accum != 1 else {}),
        **({"early_stopping_patience": s.early_stopping_patience} if s.early_stopping_patience else {})})
    result = TaskResult(task=task.name, metric=task.metric, metrics=best.metrics,
                        run_metrics=[r.metrics for r in runs], document=results)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        model, outputs = best.artifacts
        results.update(task.write_outputs(out, model, outputs, used, runtime))
        model.save_pretrained(out / "model", tokenizer=tokenizer)
        publish_best_metrics(runs_dir, best, out)
        write_json(out / "results.json", results)
        result.output_dir, result.model_dir = str(out), str(out / "model")
        shown = f" (dev {task.metric} {best.metrics[task.metric]:.4f})" if task.metric in best.metrics else ""
        log.info(f"{task.label}: best run {config_text(best.config)}{shown}; wrote {out}")
    return result
