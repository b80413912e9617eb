"""What every fine-tuning task shares, and the surface each task module offers.

Every task module in bertkit/tasks/ (glue, multiple_choice, squad, ner; the classes of custom)
tells its story with the same steps: `read` (the official files -> examples), `featurize`
(examples -> model inputs), `HEAD` (the model class), `postprocess` (model outputs -> predictions), `score` (predictions -> the task's
official metrics), and offers `finetune(...) -> TaskResult`, plus the `bertkit finetune|predict|
evaluate` arguments. `TaskResult` is the one result shape; `BENCHMARKS` lists the data sets the
task runs in `bertkit reproduce`. tasks/registry.py lists the task modules.

Shared here: the paper's sweep protocol (grid over lr / epochs / batch size, several restarts,
selection on dev, statistics over seeds), the data-folder rule, subsampling, malformed-row
handling and the flags every task spells the same way.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import logging
import os
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from .. import flags
from ..batching import FeatureSource
from ..device import resolve_precision
from ..errors import BertkitError
from ..outputs import atomic_write_text, check_output_dir
from ..train.loop import Phase, TrainArgs, fit, set_seed

log = logging.getLogger("bertkit")

# The metric values a TaskResult holds are fractions (0..1); the SQuAD evaluators report percent.
PERCENT = 100.0


@dataclasses.dataclass
class TaskResult:
    """What every task's `finetune` (and SQuAD's `predict`) returns: one shape for the command line,
    `bertkit reproduce` and scripts.

    `metrics` are the best run's dev metrics as fractions (0..1), whatever unit the task's official
    scorer uses; `metric` names the headline one (the paper's table cell); `run_metrics` holds each
    run's dev metrics in the same units (one entry per configuration of the sweep); `document` is
    results.json as written (the task's own details); `model_dir` is where the best model was saved.
    """

    task: str
    metric: str
    metrics: dict
    run_metrics: list[dict] = dataclasses.field(default_factory=list)
    document: dict = dataclasses.field(default_factory=dict)
    output_dir: str | None = None
    model_dir: str | None = None

    @property
    def value(self) -> float | None:
        value = self.metrics.get(self.metric)
        return None if value is None else float(value)

    @property
    def run_values(self) -> list[float]:
        """Each run's headline metric (not the selection score, which may average two metrics)."""
        return [float(m[self.metric]) for m in self.run_metrics if isinstance(m.get(self.metric), (int, float))]


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    """How `bertkit reproduce` fine-tunes one model on one benchmark: the budget's `finetune`
    section (`finetune`) and its `tasks.<name>` section (`task`)."""

    model_dir: Path
    data_dir: Path
    output_dir: Path
    finetune: dict
    task: dict
    precision: str = "auto"

    def max_seq_length(self, default: int | None = None) -> int:
        return self.task.get("max_seq_length", default or self.finetune["max_seq_length"])


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A data set a task runs on in `bertkit reproduce` (a budget's `tasks` key: "mrpc", "codah",
    "squad2", "ner"), with the paper's table label, whether the data folder has it, and how to run it."""

    name: str
    label: str
    has_data: Callable[[Path], bool]
    run: Callable[[BenchmarkSettings], TaskResult]
    max_seq_length: int | None = None  # its default when the budget gives none (None: the budget's finetune one)


# ---- data: where it is, subsets, malformed rows ----


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """--data-dir, else $BERTKIT_DATA; it must be a folder."""
    data_dir = data_dir or os.environ.get("BERTKIT_DATA")
    if not data_dir:
        raise BertkitError("no data directory: pass --data-dir or set BERTKIT_DATA")
    if not Path(data_dir).is_dir():
        raise BertkitError("data directory not found", path=str(data_dir))
    return Path(data_dir)


class Examples(list):
    """Examples read from one file, remembering the file and the malformed rows skipped."""

    def __init__(self, items=(), path: str | Path | None = None, skipped: Sequence[str] = ()):
        super().__init__(items)
        self.path = None if path is None else str(path)
        self.skipped = list(skipped)  # "path:line: problem" for each row left out


class BadRows:
    """Raise on the first malformed row, or (skip_bad_rows) record it and go on."""

    def __init__(self, path: Path, skip: bool):
        self.path, self.skip, self.skipped = path, skip, []

    def __call__(self, line: int, message: str) -> None:
        if not self.skip:
            raise BertkitError(f"{message} (or pass --skip-bad-rows to skip and count such rows)",
                               path=str(self.path), line=line)
        self.skipped.append(str(BertkitError(message, path=str(self.path), line=line)))


def subsample(examples: Sequence, n: int | None, seed: int = 0, contiguous: bool = False) -> Sequence:
    """A deterministic subset of n examples in file order (every run of a sweep sees the same): a
    seeded random sample, or with `contiguous` the first n (NER, whose windows take context from
    the neighbouring sentences of a document). All of them (the same object) when n is None or
    at least len(examples)."""
    if n is None or n >= len(examples):
        return examples
    if n <= 0:
        raise BertkitError(f"the example limit must be positive, not {n}")
    keep = range(n) if contiguous else sorted(random.Random(seed).sample(range(len(examples)), n))
    return Examples([examples[i] for i in keep], path=getattr(examples, "path", None),
                    skipped=getattr(examples, "skipped", ()))


# ---- the paper's fine-tuning protocol: grid x restarts, select on dev ----

@dataclasses.dataclass
class RunResult:
    config: dict  # {"learning_rate", "epochs", "batch_size", "seed"}
    metrics: dict  # dev metrics
    score: float  # the selection score (task score on dev)
    seconds: float = 0.0
    artifacts: object = None  # e.g. the trained model, kept only for the best run


def parse_list(text, cast=float) -> list:
    """'5e-5,3e-5' -> [5e-05, 3e-05]; a single value -> [value]."""
    if isinstance(text, (list, tuple)):
        return [cast(t) for t in text]
    try:
        return [cast(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BertkitError(f"cannot read {text!r} as a comma-separated list of {cast.__name__}") from None


def grid(learning_rates, epochs, batch_sizes, seeds) -> list[dict]:
    return [dict(learning_rate=lr, epochs=ep, batch_size=bs, seed=s)
            for lr, ep, bs, s in itertools.product(learning_rates, epochs, batch_sizes, seeds)]


def summarize(runs: list[RunResult]) -> list[dict]:
    """Per hyper-parameter configuration (seeds pooled): mean, sd, median of the score and each metric."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in runs:
        key = tuple((k, v) for k, v in sorted(r.config.items()) if k != "seed")
        groups.setdefault(key, []).append(r)
    table = []
    for key, rs in groups.items():
        row = {"config": dict(key), "n": len(rs), "seeds": [r.config.get("seed") for r in rs]}
        names = ["score"] + sorted({m for r in rs for m in r.metrics if isinstance(r.metrics[m], (int, float))})
        for name in names:
            vals = [r.score if name == "score" else r.metrics[name] for r in rs if name == "score" or name in r.metrics]
            row[name] = {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                         "median": statistics.median(vals)}
        table.append(row)
    return table


def run_sweep(configs: list[dict], run_one: Callable[[dict], RunResult],
              on_run: Callable[[RunResult], None] | None = None, state_dir: str | Path | None = None,
              resume: bool = False, keep: Callable[[object], dict] | None = None, identity: dict | None = None):
    """Run every configuration; the best dev score wins (the paper's selection). Returns (best, runs).
    Only the best run keeps its artifacts, so a large grid does not hold every model in memory.

    With `state_dir` the sweep can be resumed: each finished run is recorded in
    state_dir/<run_name>/result.json (with `keep(artifacts)`, the part of its artifacts the caller
    reads of every run) and the best run's artifacts so far in state_dir/best/. `resume` then skips
    the finished runs (each run sets its own seed, so the others are the same as in one go) and takes
    the best run's artifacts back; without it the records of an earlier sweep are cleared first. A
    finished sweep drops its copy of the best artifacts (the caller saves the model): resumed once
    more, it runs its best run again.
    `identity` (e.g. the data and settings) must match the recorded one to resume."""
    state = None if state_dir is None else SweepState(Path(state_dir), identity)
    done = {} if state is None else (state.restore() if resume else state.clear())
    best, runs = None, []
    for config in configs:
        restored = done.get(run_name(config))
        result = restored or run_one(config)
        if state is not None and restored is None:
            state.record(result, None if keep is None else keep(result.artifacts))
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


@dataclasses.dataclass
class _SavedModel:  # where SweepState.save_best put a model: state_dir/best/<folder>, class module.name
    module: str
    name: str
    folder: str


class SweepState:
    """The records that let an interrupted sweep resume (see `run_sweep`)."""

    def __init__(self, directory: Path, identity: dict | None):
        self.directory, self.identity = directory, identity

    def _result_files(self):
        return sorted(self.directory.glob("*/result.json")) if self.directory.is_dir() else []

    def clear(self) -> dict:
        for path in self._result_files():
            path.unlink()
        (self.directory / "sweep.json").unlink(missing_ok=True)
        self.finish()
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.directory / "sweep.json", json.dumps({"identity": self.identity}, default=str) + "\n")
        return {}

    def restore(self) -> dict:
        """Finished runs by name, the best one with its artifacts; a best run whose artifacts were not
        saved (interrupted in between) is left out, so that it runs again."""
        recorded = self.directory / "sweep.json"
        if not recorded.is_file():  # e.g. the GLUE tasks after the one that was interrupted
            log.info(f"no earlier sweep in {self.directory}: starting one")
            return self.clear()
        identity = json.loads(recorded.read_text(encoding="utf-8")).get("identity")
        expected = json.loads(json.dumps(self.identity, default=str))
        if identity != expected:
            differ = sorted(k for k in set(identity or {}) | set(expected or {})
                            if (identity or {}).get(k) != (expected or {}).get(k))
            raise BertkitError(f"the sweep here was run with other settings ({', '.join(differ)}): resume it with "
                               "the same ones, or --overwrite to start again", path=str(recorded))
        done = {}
        for path in self._result_files():
            record = json.loads(path.read_text(encoding="utf-8"))
            done[path.parent.name] = RunResult(config=record["config"], metrics=record["metrics"],
                                               score=record["score"], seconds=record["seconds"],
                                               artifacts=record.get("kept"))
        if done:
            best_name = max(done, key=lambda n: done[n].score)  # ties: any, the artifacts decide below
            payload = self.load_best()
            if payload is not None and payload["run"] in done and done[payload["run"]].score == done[best_name].score:
                done[payload["run"]].artifacts = payload["artifacts"]
            else:
                del done[best_name]
            log.info(f"resuming the sweep in {self.directory}: {len(done)} finished run(s) kept")
        return done

    def finish(self) -> None:
        shutil.rmtree(self.directory / "best", ignore_errors=True)

    def save_best(self, result: RunResult) -> None:
        """The artifacts in state_dir/best/: models in the Hugging Face layout (a model is not
        picklable as a whole), everything else in artifacts.pt."""
        tmp, best = self.directory / "best.tmp", self.directory / "best"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        models = []

        def pack(value):
            if isinstance(value, torch.nn.Module) and hasattr(value, "save_pretrained"):
                value.save_pretrained(tmp / f"model{len(models)}")
                models.append(value)
                return _SavedModel(type(value).__module__, type(value).__qualname__, f"model{len(models) - 1}")
            if isinstance(value, (list, tuple)):
                return type(value)(pack(v) for v in value)
            if isinstance(value, dict):
                return {k: pack(v) for k, v in value.items()}
            return value

        torch.save({"run": run_name(result.config), "artifacts": pack(result.artifacts)}, tmp / "artifacts.pt")
        shutil.rmtree(best, ignore_errors=True)  # an interruption here: restore() reruns the best run
        os.replace(tmp, best)

    def load_best(self) -> dict | None:
        saved = self.directory / "best" / "artifacts.pt"
        if not saved.is_file():
            return None
        payload = torch.load(saved, map_location="cpu", weights_only=False)

        def unpack(value):
            if isinstance(value, _SavedModel):
                cls = getattr(importlib.import_module(value.module), value.name)
                return cls.from_pretrained(self.directory / "best" / value.folder)
            if isinstance(value, (list, tuple)):
                return type(value)(unpack(v) for v in value)
            if isinstance(value, dict):
                return {k: unpack(v) for k, v in value.items()}
            return value

        return {"run": payload["run"], "artifacts": unpack(payload["artifacts"])}

    def record(self, result: RunResult, kept: dict | None) -> None:
        folder = self.directory / run_name(result.config)
        folder.mkdir(parents=True, exist_ok=True)
        record = {"config": result.config, "metrics": result.metrics, "score": result.score,
                  "seconds": result.seconds, "kept": kept}
        atomic_write_text(folder / "result.json", json.dumps(record, indent=1, default=float) + "\n")


# ---- one run, the sweep protocol and its outputs (sentence-level tasks) ----


def predict_precision(model, precision: str) -> str:
    return resolve_precision(precision, next(model.parameters()).device)


def train_one(model, features, config: dict, precision: str = "auto", device: str = "auto",
              warmup_ratio: float = 0.1, weight_decay: float = 0.01, pad_token_id: int = 0,
              output_dir: str | Path | None = None, evaluate: Callable | None = None, logging_steps: int = 50,
              eval_steps: int = 0, grad_accum: int = 1):
    """One fine-tuning run through the shared training loop: AdamW (decay 0.01, eps 1e-6), linear
    warm-up over the first warmup_ratio of the steps then linear decay, gradient clipping at 1.0.
    The batch size is the effective one: grad_accum micro-batches of batch_size / grad_accum make a step.
    With output_dir the loop writes the run's metrics.jsonl there (training loss every logging_steps,
    `evaluate(model) -> dict` every eval_steps and at the end) for `bertkit plot`."""
    batch_size = int(config["batch_size"])
    if grad_accum < 1 or batch_size % grad_accum:
        raise BertkitError(f"batch size {batch_size} is not a multiple of --grad-accum {grad_accum}")
    source = FeatureSource(features, batch_size // grad_accum, seed=int(config["seed"]), pad_token_id=pad_token_id)
    args = TrainArgs(output_dir=None if output_dir is None else str(output_dir),
                     learning_rate=float(config["learning_rate"]), warmup_ratio=warmup_ratio, grad_accum=grad_accum,
                     weight_decay=weight_decay, precision=precision, device=device, seed=int(config["seed"]),
                     logging_steps=logging_steps if output_dir is not None else 10**9, eval_steps=eval_steps,
                     save_final_model=False)
    return fit(model, Phase(source, epochs=config["epochs"]), args, evaluate=evaluate)


def run_name(config: dict) -> str:
    """The folder name of one run of a sweep: lr5e-05_ep3_bs32_seed42."""
    return f"lr{config['learning_rate']:g}_ep{config['epochs']:g}_bs{config['batch_size']}_seed{config['seed']}"


def publish_best_metrics(runs_dir: str | Path, best: RunResult, output_dir: str | Path) -> None:
    """The best run's metrics.jsonl, copied beside the model (`bertkit plot OUTPUT` draws it); every
    run's own stays in runs_dir/<run_name>/."""
    source = Path(runs_dir) / run_name(best.config) / "metrics.jsonl"
    if source.is_file():
        atomic_write_text(Path(output_dir) / "metrics.jsonl", source.read_text(encoding="utf-8"))


def run_protocol(configs: list[dict], build_model: Callable[[], torch.nn.Module], train_features: list[dict],
                 evaluate: Callable, score: Callable[[dict], float], precision: str = "auto", device: str = "auto",
                 warmup_ratio: float = 0.1, weight_decay: float = 0.01, pad_token_id: int = 0, label: str = "",
                 train: Callable | None = None, runs_dir: str | Path | None = None, logging_steps: int = 50,
                 eval_steps: int = 0, resume: bool = False, identity: dict | None = None):
    """The paper's protocol: one run per configuration (grid x seeds), the best dev score wins.

    `build_model()` makes a fresh model from the pre-trained weights (the seed is set first, so restarts
    differ in head initialisation as well as in shuffling); `evaluate(model) -> (metrics, outputs)`;
    the best run keeps (model, outputs) as its artifacts. Logs one line per finished run. With
    runs_dir, each run writes runs_dir/<run_name>/metrics.jsonl (its losses and dev metrics), and
    `resume` continues an interrupted sweep there (`run_sweep`): its runs must have had the same
    `identity` (the caller's data and settings) and training settings."""
    if not configs:
        raise BertkitError("no run to do: the learning-rate, epochs, batch-size and seed lists must not be empty")
    train = train or train_one

    def run_one(config: dict) -> RunResult:
        start = time.perf_counter()
        set_seed(int(config["seed"]))
        model = build_model()
        evaluated = []

        def evaluate_in_loop(model) -> dict:  # the loop's last evaluation is the run's dev result
            evaluated[:] = [evaluate(model)]
            return {k: v for k, v in evaluated[0][0].items() if isinstance(v, (int, float))}

        logged = {} if runs_dir is None else dict(output_dir=Path(runs_dir) / run_name(config),
                                                  evaluate=evaluate_in_loop, logging_steps=logging_steps,
                                                  eval_steps=eval_steps)
        train(model, train_features, config, precision=precision, device=device, warmup_ratio=warmup_ratio,
              weight_decay=weight_decay, pad_token_id=pad_token_id, **logged)
        metrics, outputs = evaluated[0] if evaluated else evaluate(model)
        return RunResult(config=dict(config), metrics=metrics, score=float(score(metrics)),
                         seconds=time.perf_counter() - start, artifacts=(model, outputs))

    def report(result: RunResult) -> None:
        shown = " ".join(f"{k} {100 * v:.2f}" for k, v in result.metrics.items() if isinstance(v, float))
        log.info(f"{label}: {config_text(result.config)}: dev score {100 * result.score:.2f} ({shown}) "
                 f"in {result.seconds:.1f} s")

    identity = {"task": label, "train_features": len(train_features), "warmup_ratio": warmup_ratio,
                "weight_decay": weight_decay, **(identity or {})}
    return run_sweep(configs, run_one, on_run=report, state_dir=runs_dir, resume=resume, identity=identity)


def config_text(config: dict) -> str:
    return (f"lr {config['learning_rate']:g} epochs {config['epochs']:g} batch {config['batch_size']} "
            f"seed {config['seed']}")


def results_document(task: str, best: RunResult, runs: list[RunResult], extra: dict | None = None) -> dict:
    """The results.json layout every sentence-level task writes."""
    def run_dict(r: RunResult) -> dict:
        return {"config": r.config, "metrics": r.metrics, "score": r.score, "seconds": round(r.seconds, 3)}

    return {"task": task, "metrics": best.metrics,
            "runs": [run_dict(r) for r in runs],
            "best": {"config": best.config, "metrics": best.metrics, "score": best.score},
            "summary": summarize(runs), **(extra or {})}


def write_predictions(path: Path, indices: Sequence, predictions: Sequence) -> None:
    if len(indices) != len(predictions):
        raise BertkitError(f"{len(predictions)} predictions for {len(indices)} examples", path=str(path))
    lines = ["index\tprediction"] + [f"{i}\t{p}" for i, p in zip(indices, predictions)]
    atomic_write_text(path, "\n".join(lines) + "\n")


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
