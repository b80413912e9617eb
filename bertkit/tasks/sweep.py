"""The paper's fine-tuning protocol (§4, appendix A.3): one run per configuration of the grid
(learning rate x epochs x batch size) and seed, the best dev score wins, every run reported.
`run_sweep` is the loop (with resume, sweep_state.py); `run_protocol` runs a `Sweep` (a task that
builds a model, trains it with `train_one`, the shared training loop, and scores it on dev), the
task's RunSettings passed whole, one `RunSettings.point` per run."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Callable

import torch

from ..batching import FeatureSource
from ..device import resolve_precision
from ..errors import BertkitError
from ..train.loop import Phase, TrainArgs, dist_info, fit, set_seed
from .runs import RunResult, config_text, run_name
from .settings import RunSettings
from .sweep_state import SweepState

log = logging.getLogger("bertkit")


def predict_precision(model, precision: str) -> str:
    return resolve_precision(precision, next(model.parameters()).device)


def run_sweep(configs: list[dict], run_one: Callable[[dict], RunResult], *, resume: bool,
              on_run: Callable[[RunResult], None] | None = None, state_dir: str | Path | None = None,
              identity: dict | None = None):
    """Run every configuration; the best dev score wins (the paper's selection). Returns (best, runs).
    Only the best run keeps its artifacts, so a large grid does not hold every model in memory.

    With `state_dir` the sweep can be resumed: each finished run is recorded in
    state_dir/<run_name>/result.json (its config, metrics, score, seconds) and the best run's
    artifacts so far in state_dir/best/. `resume` then skips
    the finished runs (each run sets its own seed, so the others are the same as in one go) and takes
    the best run's artifacts back; without it the records of an earlier sweep are cleared first. A
    finished sweep drops its copy of the best artifacts (the caller saves the model): resumed once
    more, it runs its best run again.
    `identity` (e.g. the data and settings) must match the recorded one to resume."""
    state = None if state_dir is None or dist_info()[0] != 0 else SweepState(Path(state_dir), identity)
    done = {} if state is None else (state.restore() if resume else state.clear())
    best, runs = None, []
    for config in configs:
        restored = done.get(run_name(config))
        result = restored or run_one(config)
        if state is not None and restored is None:
            state.record(result)
        runs.append(result)
        if on_run is not None:
            on_run(result)
        if best is None or result.score > best.score:
            if best is not None:
                best.artifacts = None
            best = result
            if state is not None and restored is None:
                state.save_best(result)  # after the record: restore() tells a best run saved from one that was not
        else:
            result.artifacts = None
    if state is not None:
        state.finish()
    return best, runs


@dataclasses.dataclass(frozen=True)
class TaskHooks:
    """What a task adds to each of its training runs: padding, the tokenizer saved beside checkpoints,
    its batch source (`batch_source(features, batch_size, seed, pad_token_id)`, default FeatureSource's
    seeded shuffles) and the name metrics.jsonl gives the phase."""

    pad_token_id: int = 0
    tokenizer: object = None
    batch_source: Callable | None = None
    phase: str = "train"


@dataclasses.dataclass(frozen=True)
class DevHooks:
    """Dev inside a run: `evaluate(model) -> dict` every --eval-steps and at the end (`per_epoch`: at the
    end of every epoch instead), `stop_after_eval(metrics)` may end the run (early stopping)."""

    evaluate: Callable | None = None
    stop_after_eval: Callable[[dict], bool] | None = None
    per_epoch: bool = False


def train_one(model, features, run: RunSettings, hooks: TaskHooks = TaskHooks(),
              output_dir: str | Path | None = None, dev: DevHooks = DevHooks()):
    """One fine-tuning run (`run`: one point of the grid, RunSettings.point) through the shared
    training loop: AdamW (eps 1e-6), linear warm-up over the first warmup_ratio of the steps then
    linear decay, gradient clipping at 1.0. The batch size is the effective one: grad_accum
    micro-batches of batch_size / grad_accum make a step. With output_dir the loop writes the run's
    metrics.jsonl there (training loss every logging_steps, dev every eval_steps and at the end) for
    `bertkit plot`, and checkpoints every save_steps (with the tokenizer, loadable as models);
    `resume` continues from the newest one there."""
    batch_size, seed = run.batch_size, run.seed
    if batch_size % run.grad_accum:
        raise BertkitError(f"batch size {batch_size} is not a multiple of --grad-accum {run.grad_accum}")
    source = (hooks.batch_source or FeatureSource)(features, batch_size // run.grad_accum, seed=seed,
                                                   pad_token_id=hooks.pad_token_id)
    eval_steps = run.eval_steps
    if dev.per_epoch and not eval_steps:
        eval_steps = -(-source.num_batches(0) // run.grad_accum)  # the optimizer steps of one epoch
    args = TrainArgs(output_dir=None if output_dir is None else str(output_dir), learning_rate=run.learning_rate,
                     warmup_ratio=run.warmup_ratio, grad_accum=run.grad_accum, weight_decay=run.weight_decay,
                     precision=run.precision, device=run.device, seed=seed,
                     logging_steps=run.logging_steps if output_dir is not None else 10**9, eval_steps=eval_steps,
                     save_final_model=False, progress=run.progress, save_steps=run.save_steps, resume=run.resume,
                     tokenizer=hooks.tokenizer)
    return fit(model, Phase(source, epochs=run.num_epochs, name=hooks.phase), args, evaluate=dev.evaluate,
               stop_after_eval=dev.stop_after_eval)


def figures(trained) -> dict:
    """What results.json keeps of a run's training (train.TrainResult): steps, time, throughput."""
    if trained is None:  # a stand-in trainer (tests)
        return {}
    return {"global_step": trained.global_step, "train_seconds": trained.train_seconds,
            "sequences_per_second": trained.sequences_per_second}


class DevTracker:
    """A run's dev evaluations inside the training loop: the last one (the run's result), or with
    early stopping the best one, whose weights are put back at the end (transformers' Trainer with
    load_best_model_at_end), after `patience` evaluations without a better score."""

    def __init__(self, evaluate: Callable, score: Callable[[dict], float], patience: int | None):
        self.evaluate, self.score, self.patience = evaluate, score, patience
        self.kept = None  # (metrics, outputs) of the run's result so far
        self.best_score, self.best_state, self.since_best, self.evaluations, self.best_at = None, None, 0, 0, 0

    def in_loop(self, model) -> dict:
        metrics, outputs = self.evaluate(model)
        self.evaluations += 1
        value = float(self.score(metrics))
        if self.patience is None:
            self.kept = (metrics, outputs)
        elif self.best_score is None or value > self.best_score:
            self.kept, self.best_score, self.since_best = (metrics, outputs), value, 0
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            self.best_at = self.evaluations
        else:
            self.since_best += 1
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}

    def should_stop(self, metrics: dict) -> bool:
        return self.patience is not None and self.since_best >= self.patience

    def finish(self, model) -> None:
        """Early stopping: the best evaluation's weights back in the model."""
        if self.best_state is not None and self.best_at != self.evaluations:
            model.load_state_dict(self.best_state)
            log.info(f"early stopping: kept the weights of dev evaluation {self.best_at} of {self.evaluations}")


@dataclasses.dataclass
class Sweep:
    """One task's sweep: the grid's `configs` (one run each), a fresh model per run (`build_model()`,
    from the pre-trained weights; the seed is set first, so restarts differ in head initialisation as
    well as in shuffling), the training features, `evaluate(model) -> (metrics, outputs)` on dev and
    `score(metrics)`, the one run's selection value.

    `runs_dir`: each run writes runs_dir/<run_name>/metrics.jsonl, and --resume continues an
    interrupted sweep there, whose runs must have had the same `identity` (the caller's data and
    settings). `evaluate` None (no dev data): one run, trained to the end and kept without selection;
    `selects` False (no dev, but splits scored beside it, e.g. a labelled test file): the same one
    run, `evaluate` scoring it once at the end. `evaluates_in_loop` False: dev is not scored inside
    the loop (not in metrics.jsonl) unless early stopping needs it, only after the run. `train`
    stands in for train_one (tests)."""

    configs: list[dict]
    build_model: Callable[[], torch.nn.Module]
    train_features: list
    evaluate: Callable | None
    score: Callable[[dict], float]
    settings: RunSettings
    hooks: TaskHooks = TaskHooks()
    label: str = ""
    runs_dir: str | Path | None = None
    identity: dict | None = None
    selects: bool = True
    evaluates_in_loop: bool = True
    train: Callable | None = None


def run_protocol(sweep: Sweep):
    """The paper's protocol: one run per configuration (grid x seeds), the best dev score wins; the
    best run keeps (model, outputs) as its artifacts. Logs one line per finished run. With
    --early-stopping-patience N, dev is scored every eval_steps (else every epoch) and a run stops
    after N evaluations without a better score, keeping its best weights (DevTracker)."""
    s, evaluate = sweep.settings, sweep.evaluate
    if not sweep.configs:
        raise BertkitError("no run to do: the learning-rate, epochs, batch-size and seed lists must not be empty")
    main = dist_info()[0] == 0  # under torchrun every rank trains, rank 0 alone scores and selects
    selects = sweep.selects and evaluate is not None
    patience = s.early_stopping_patience
    if patience and dist_info()[1] > 1:
        raise BertkitError("--early-stopping-patience stops a run on rank 0's dev scores: not under torchrun")
    if not selects and (len(sweep.configs) > 1 or patience):
        raise BertkitError("without dev data there is nothing to choose runs or stop on: give a dev file or "
                           "--dev-fraction, or one learning rate, epoch count, batch size and seed")
    train = sweep.train or train_one

    def run_one(config: dict) -> RunResult:
        start = time.perf_counter()
        set_seed(int(config["seed"]))
        model = sweep.build_model()
        tracker = DevTracker(evaluate, sweep.score, patience) if selects else None
        dev = DevHooks()
        if tracker is not None and ((sweep.runs_dir is not None and sweep.evaluates_in_loop) or patience):
            dev = DevHooks(tracker.in_loop, tracker.should_stop if patience else None, per_epoch=bool(patience))
        output_dir = None if sweep.runs_dir is None else Path(sweep.runs_dir) / run_name(config)
        trained = train(model, sweep.train_features, s.point(config), sweep.hooks, output_dir, dev)
        if tracker is not None and tracker.kept is not None:
            tracker.finish(model)
            metrics, outputs = tracker.kept
        else:
            metrics, outputs = ({}, {}) if evaluate is None or not main else evaluate(model)
        return RunResult(config=dict(config), metrics=metrics,
                         score=float(sweep.score(metrics)) if selects and metrics else 0.0,
                         seconds=time.perf_counter() - start, artifacts=(model, outputs), training=figures(trained))

    def report(result: RunResult) -> None:
        if not selects:
            log.info(f"{sweep.label}: {config_text(result.config)}: trained in {result.seconds:.1f} s (no dev data)")
            return
        shown = " ".join(f"{k} {v:.4f}" for k, v in result.metrics.items() if isinstance(v, float))
        log.info(f"{sweep.label}: {config_text(result.config)}: dev score {result.score:.4f} ({shown}) "
                 f"in {result.seconds:.1f} s")

    identity = {"task": sweep.label, "train_features": len(sweep.train_features), "warmup_ratio": s.warmup_ratio,
                "weight_decay": s.weight_decay, **(sweep.identity or {})}
    if patience:
        identity["early_stopping_patience"] = patience
    return run_sweep(sweep.configs, run_one, on_run=report, state_dir=sweep.runs_dir, resume=s.resume,
                     identity=identity)
