"""One runner for every fine-tuning task (tasks/task.py's interface): read, encode, the sweep
(grid x restarts, the best dev score wins, resume), early stopping, results.json, prediction
files and the best model, the same way for all of them.

`RunSettings` (tasks/settings.py) are what every task takes besides its own data options, passed
whole: the grid, restarts, the training recipe (warm-up, decay, dropout, micro-batches) and how dev
is found (a dev split, a held-out fraction of train, or none: one run, trained and saved without
selection).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING

from ..device import pick_device, precision_label, resolve_precision
from ..errors import BertkitError, counted
from ..outputs import write_json
from ..train.loop import dist_info
from .arguments import dropout_overrides
from .examples import Examples, subsample
from .results import TaskResult, publish_best_metrics
from .runs import config_text, grid
from .settings import RunSettings, check_grad_accum
from .sweep import Sweep, TaskHooks, run_protocol
from .splits import Runtime, Splits

if TYPE_CHECKING:
    from .task import Task

log = logging.getLogger("bertkit")

NO_DEV_TO_CHOOSE = ("without dev data there is nothing to choose runs or stop on: give a dev file or --dev-fraction, "
                    "or one learning rate, epoch count, batch size and seed")


def running_on(settings: RunSettings) -> str:
    """The device and precision the runs train in ("cpu, fp32"), for the first log line."""
    device = pick_device(settings.device)
    return precision_label(device, resolve_precision(settings.precision, device))


def split_dev(examples: Examples, dev_fraction: float, seed: int = 0) -> tuple[Examples, Examples]:
    """Hold out a seeded random dev_fraction of a single file as dev (both parts keep file order)."""
    if not 0.0 < dev_fraction < 1.0:
        raise BertkitError(f"--dev-fraction must be between 0 and 1, not {dev_fraction}")
    n_dev = max(1, round(len(examples) * dev_fraction))
    if n_dev >= len(examples):
        raise BertkitError(f"{counted(len(examples), 'example')} {'is' if len(examples) == 1 else 'are'} too few "
                           f"to hold out {dev_fraction:.0%} as dev",
                           path=getattr(examples, "path", None))
    dev_ids = set(random.Random(seed).sample(range(len(examples)), n_dev))
    path = getattr(examples, "path", None)
    train = Examples([e for i, e in enumerate(examples) if i not in dev_ids], path, getattr(examples, "skipped", ()))
    dev = Examples([e for i, e in enumerate(examples) if i in dev_ids], path)
    return train, dev


def refuse_one_class_split(train: Examples, whole: Examples, dev_fraction: float) -> None:
    """A classifier's training part of a --dev-fraction split needs two labels, as a one-class
    training file is refused when read (classes are text labels; regression's are numbers)."""
    def classes(examples):
        return {e.label for e in examples if isinstance(getattr(e, "label", None), str)}

    left = classes(train)
    if len(classes(whole)) >= 2 and len(left) < 2:
        shown = f"every one labelled {next(iter(left))!r}" if left else "none of them labelled"
        raise BertkitError(f"--dev-fraction {dev_fraction:g} leaves {counted(len(train), 'training example')}, "
                           f"{shown}: a classifier needs at least two labels to train on; hold out less or give "
                           "a --dev-file", path=getattr(whole, "path", None))


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
    refuse_one_class_split(train, splits.train, settings.dev_fraction)
    details = {**splits.details, "dev_fraction": settings.dev_fraction, "split_seed": settings.split_seed}
    return dataclasses.replace(splits, train=train, dev=dev, details=details)


def finetune(task: Task, model_dir, output_dir=None, settings: RunSettings | None = None) -> TaskResult:
    """Fine-tune `task` with `settings`; the TaskResult's document is results.json.

    Every (learning rate, epochs, batch size, seed) combination is one run; the best dev score
    (`task.select`) wins. With output_dir (under it, task.output_subdir): results.json, the
    prediction files, model/ (the best run, Hugging Face layout, with its tokenizer) and
    metrics.jsonl (the best run's; every run's in runs/<run>/)."""
    s = settings or RunSettings()
    check_grad_accum(s)
    splits = with_dev(task.read(s.skip_bad_rows), s)
    configs = grid(s.learning_rates, s.epochs, s.batch_sizes, s.seeds)
    if splits.dev is None and task.requires_dev:
        raise BertkitError("no dev set: give a dev file or --dev-fraction to hold out part of the train file")
    if splits.dev is None and (len(configs) > 1 or s.early_stopping_patience):
        raise BertkitError(NO_DEV_TO_CHOOSE)
    tokenizer = task.tokenizer(model_dir)
    runtime = Runtime(tokenizer, s.eval_batch_size, s.precision, s.max_seq_length, s.device)
    used = quick_subsets(task, splits, s)
    features = encode_splits(task, used, tokenizer, s.max_seq_length)
    log.info(f"{task.label}: {task.describe(used, features['train'])}, {len(configs)} run(s) (grid x seeds), "
             f"max length {s.max_seq_length}, {running_on(s)}"
             + ("" if used.dev is not None else "; no dev data: no selection"))
    log_skipped_rows(task, used)
    out = None if output_dir is None else Path(output_dir) / task.output_subdir
    best, runs = sweep(task, model_dir, used, features, runtime, configs, s, out)
    if dist_info()[0] != 0:  # under torchrun, rank 0 alone scores and writes
        return TaskResult(task=task.name, metric=task.metric, metrics={})
    details = run_details(task, used, features, runtime, s, str(model_dir))
    results = task.document(best, runs, {**details, **task.best_details(best.artifacts[1])})
    result = TaskResult(task=task.name, metric=task.metric, metrics=task.result_metrics(best.metrics),
                        run_metrics=[task.result_metrics(r.metrics) for r in runs], document=results)
    if out is not None:
        write_best(task, best, out, results, used, runtime)
        result.output_dir, result.model_dir = str(out), str(out / "model")
    return result


def quick_subsets(task: Task, splits: Splits, s: RunSettings) -> Splits:
    """--max-train-examples / --max-eval-examples: the task's rule, else a seeded random sample of
    train and of dev (every run of the sweep sees the same)."""
    limited = task.limit(splits, s.max_train_examples, s.max_eval_examples, s.subset_seed)
    if limited is not None:
        return limited
    dev = None if splits.dev is None else subsample(splits.dev, s.max_eval_examples, s.subset_seed)
    return dataclasses.replace(splits, train=subsample(splits.train, s.max_train_examples, s.subset_seed), dev=dev)


def encode_splits(task: Task, used: Splits, tokenizer, max_seq_length: int) -> dict:
    """Model inputs by split name: train's for training, dev's and the reported splits' for scoring."""
    features = {"train": task.encode(used.train, tokenizer, max_seq_length)}
    if used.dev is not None:
        features["dev"] = task.eval_features(used.dev, tokenizer, max_seq_length)
    for name, examples in used.reported.items():
        features[name] = task.eval_features(examples, tokenizer, max_seq_length)
    return features


def log_skipped_rows(task: Task, used: Splits) -> None:
    for name, examples in used.named().items():
        skipped = getattr(examples, "skipped", ())
        if skipped:
            log.warning(f"{task.label}: skipped {len(skipped)} malformed {name} row(s), first: {skipped[0]}")


def sweep(task: Task, model_dir, used: Splits, features: dict, runtime: Runtime, configs: list[dict],
          s: RunSettings, out: Path | None):
    """The grid's runs (run_protocol): each a fresh model from model_dir, trained, scored on dev (and
    the reported splits); the best dev score wins. Returns (best, runs)."""
    head = {**task.head_config(), **dropout_overrides(s.dropout)}

    def build_model():
        return task.HEAD.from_pretrained(model_dir, **head)

    def evaluate(model) -> tuple[dict, dict]:
        metrics, outputs = {}, {}
        if used.dev is not None:
            metrics, predictions = task.evaluate(model, used.dev, features["dev"], runtime, "dev")
            outputs["dev"] = predictions
        for name, examples in used.reported.items():  # scored and reported, not used to select
            more, outputs[name] = task.evaluate(model, examples, features[name], runtime, name)
            metrics.update(more)
        return metrics, outputs

    identity = {"model": str(model_dir), "max_seq_length": s.max_seq_length, "dropout": s.dropout,
                **task.identity(used)}
    if s.grad_accum != 1:
        identity["grad_accum"] = s.grad_accum
    scored = used.dev is not None or used.reported
    hooks = TaskHooks(pad_token_id=runtime.tokenizer.pad_token_id, tokenizer=runtime.tokenizer,
                      batch_source=task.batch_source, phase=task.phase)
    return run_protocol(Sweep(configs, build_model, features["train"], evaluate if scored else None, task.select, s,
                              hooks, label=task.label, runs_dir=None if out is None else out / "runs",
                              identity=identity, selects=used.dev is not None,
                              evaluates_in_loop=task.evaluates_in_loop))


def run_details(task: Task, used: Splits, features: dict, runtime: Runtime, s: RunSettings, model: str) -> dict:
    """What results.json says besides the runs: the data, the settings, how the best run was chosen."""
    return {
        "num_train_examples": len(used.train), "num_dev_examples": 0 if used.dev is None else len(used.dev),
        "max_seq_length": s.max_seq_length,
        "skipped_rows": {name: len(getattr(ex, "skipped", ())) for name, ex in used.named().items()},
        "model": model, **task.details(used, features, runtime),
        "selection": task.selection if used.dev is not None else "none: no dev data, the one run is kept",
        **({"grad_accum": s.grad_accum} if s.grad_accum != 1 else {}),
        **({"early_stopping_patience": s.early_stopping_patience} if s.early_stopping_patience else {})}


def write_best(task: Task, best, out: Path, results: dict, used: Splits, runtime: Runtime) -> None:
    """OUTPUT: the prediction files, model/ (with its tokenizer), the best run's metrics.jsonl, results.json."""
    out.mkdir(parents=True, exist_ok=True)
    model, outputs = best.artifacts
    results.update(task.write_outputs(out, model, outputs, used, runtime))
    model.save_pretrained(out / "model", tokenizer=runtime.tokenizer)
    publish_best_metrics(out / "runs", best, out)
    write_json(out / "results.json", results)
    shown = f" (dev {task.metric} {best.metrics[task.metric]:.4f})" if task.metric in best.metrics else ""
    log.info(f"{task.label}: best run {config_text(best.config)}{shown}; wrote {out}")
