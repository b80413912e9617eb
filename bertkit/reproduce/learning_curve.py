"""`bertkit reproduce --budget curves`: where pre-training pays at this scale, as a learning curve.

The pre-trained BERT against random init of the same architecture and vocabulary, fine-tuned on
subsets of each task's training set (a budget's `sizes`), each size over `seeds`: seed S draws the
subset (the same one for both models) and initialises the run; every learning rate of the budget's
grid runs for both models, and each model's rate is chosen on dev by its mean over the seeds (the
paper's protocol). Stages are cached as reproduce's are (OUTPUT/stages/<name>/stage.json):

  corpus, vocab, data, pretrain-bert   the pre-trained model: the stages of the budget `pretrained`
                                       names (cpu-hour), or `model-pretrained`: a folder given as --model
  model-random-init                    that model's configuration and vocabulary, randomly initialised
  curve-M-T-N-lrX-sS                   model M on N examples of task T drawn with seed S, learning rate X
  report                               report.md / report.json (learning_curve_report.py)

Every fine-tuning run goes through the task table (`benchmark(task).run`, the runner reproduce uses).
Sizes beyond a task's training set run once on the whole set (MRPC has 3,668 examples). The
fine-tuned models are not kept: the curve needs their scores, not 2 x tasks x sizes x grid x seeds
model folders.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from ..version import __version__
from ..config import BertConfig
from ..errors import BertkitError
from ..heads import BertForPreTraining
from .learning_curve_report import CURVE_NOISE_RULE, curve_points, curve_table, curve_verdict, point_record
from ..outputs import atomic_write_text
from .stages import (Reproduction, Stages, available_tasks, load_budget, stage_corpus, stage_data, stage_pretrain,
                        stage_vocab, task_summary)
from ..tasks.benchmarks import BenchmarkSettings
from ..tasks.examples import resolve_data_dir
from ..tasks.registry import BENCHMARKS, benchmark
from ..tokenizer import BertTokenizer

log = logging.getLogger("bertkit")

KIND = "learning-curve"
MODELS = ("bert", "random-init")
FINETUNE_KEYS = {"learning_rates", "epochs", "batch_size", "max_seq_length"}
# What the curve sets per run: a task section naming them would be silently overridden.
SET_PER_RUN = ("max_train_examples", "subset_seed", "eval_subset_seed", "learning_rate", "seeds")


def is_learning_curve(budget: dict) -> bool:
    return budget.get("kind") == KIND


def check_curve_budget(budget: dict) -> None:
    """Catch, before any work, a curve budget that would fail or be silently ignored."""
    where = budget.get("_path")
    missing = [k for k in ("name", "sizes", "seeds", "finetune", "tasks") if k not in budget]
    if missing:
        raise BertkitError(f"learning-curve budget lacks {', '.join(missing)}", path=where)
    sizes, seeds = budget["sizes"], budget["seeds"]
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes) or sorted(set(sizes)) != list(sizes):
        raise BertkitError("sizes: positive example counts in increasing order", path=where)
    if len(seeds) < 2 or any(not isinstance(s, int) for s in seeds) or len(set(seeds)) != len(seeds):
        raise BertkitError("seeds: at least two different integer seeds (the noise needs two runs a point)",
                           path=where)
    ft = budget["finetune"]
    unknown = sorted(set(ft) - FINETUNE_KEYS)
    if unknown or not ft.get("learning_rates"):
        raise BertkitError(f"finetune: learning_rates (the grid, the same for both models) and any of epochs, "
                           f"batch_size, max_seq_length{'; unknown: ' + ', '.join(unknown) if unknown else ''}",
                           path=where)
    for task, cfg in budget["tasks"].items():
        if task not in BENCHMARKS:
            raise BertkitError(f"tasks.{task}: unknown task (one of {', '.join(BENCHMARKS)})", path=where)
        named = [k for k in SET_PER_RUN if k in cfg]
        if named:
            raise BertkitError(f"tasks.{task}.{named[0]}: the learning curve sets it per run (sizes, seeds, "
                               "finetune.learning_rates)", path=where)
    pretrained = budget.get("pretrained", {})
    if pretrained and (set(pretrained) - {"budget", "variant"} or pretrained.get("variant", "bert") != "bert"
                       or "budget" not in pretrained):
        raise BertkitError('pretrained: {"budget": NAME} (its bert variant is the model)', path=where)
    if pretrained and is_learning_curve(load_budget(pretrained["budget"])):  # an unknown name fails here too
        raise BertkitError(f"pretrained.budget {pretrained['budget']!r} is a learning curve, not a pre-training "
                           "budget", path=where)


# ---------------------------------------------------------------- the wall-time estimate


def sizes_run(budget: dict, task: str) -> list[tuple[int, int]]:
    """(size asked, examples trained on) of each size a task runs: the sizes up to the first past its
    training set (the estimate's `train_examples`), which runs once on the whole set."""
    whole = budget.get("estimate", {}).get("train_examples", {}).get(task)
    out = []
    for size in budget["sizes"]:
        out.append((size, size if whole is None else min(size, whole)))
        if whole is not None and size >= whole:
            break
    return out


def train_sizes_used(budget: dict, task: str) -> list[int]:
    return [used for _, used in sizes_run(budget, task)]


def estimate_seconds(budget: dict, tasks: list[str]) -> float | None:
    """Wall-clock seconds on the estimate's slowest CPU class: per task, every run's examples x epochs
    x the measured seconds per example and epoch, plus a fixed cost per run, times the class factor,
    plus the chained pre-training. None without an "estimate" section."""
    est = budget.get("estimate")
    if not est:
        return None
    runs_per_size = len(MODELS) * len(budget["finetune"]["learning_rates"]) * len(budget["seeds"])
    seconds = 0.0
    for task in tasks:
        epochs = budget["tasks"][task].get("epochs", budget["finetune"].get("epochs", [3])[0])
        for n in train_sizes_used(budget, task):
            seconds += runs_per_size * (n * epochs * est["seconds_per_example_epoch"][task] + est["seconds_per_run"])
    return seconds * est["slowest_class_factor"] + est.get("pretraining_seconds", 0.0)


# ---------------------------------------------------------------- the stages


def use_given_model(model: Path, d: Path) -> dict:
    if not (model / "config.json").is_file():
        raise BertkitError("not a model folder (no config.json)", path=str(model))
    return {"model": str(model)}


def pretrained_by_budget(budget: dict, data_dir: Path, stages: Stages, precision: str) -> Path:
    """The `pretrained` budget's corpus, vocab, data and pretrain-bert stages, in this run's cache."""
    chained = load_budget(budget["pretrained"]["budget"])
    run = Reproduction(budget=chained, data_dir=data_dir, out=stages.root.parent, variants=["bert"], tasks=[],
                       vocab=None, precision=precision, stages=stages, started=time.perf_counter())
    for stage in (stage_corpus, stage_vocab, stage_data, stage_pretrain):
        stage(run)
    return run.model_dirs["bert"]


def make_random_like(model: Path, d: Path) -> dict:
    """The pre-trained model's architecture and vocabulary with no pre-training (the paper's init)."""
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    config.pop("bertkit_pretraining", None)  # what pre-training did is not this model's history
    torch.manual_seed(0)
    tokenizer = BertTokenizer.from_pretrained(model)
    BertForPreTraining(BertConfig.from_dict(config)).save_pretrained(d, tokenizer=tokenizer)
    return {"model": str(d)}


def finetune_point(budget: dict, data_dir: Path, model: Path, task: str, size: int, learning_rate: float,
                   seed: int, precision: str, d: Path) -> dict:
    """One run: `size` examples of `task` drawn with `seed` (dev fixed), the seed's initialisation."""
    ft = {**budget["finetune"], "learning_rates": [learning_rate], "seeds": [seed]}
    ft.setdefault("epochs", [3])
    cfg = {**budget["tasks"][task], "max_train_examples": size, "subset_seed": seed, "eval_subset_seed": 0}
    result = benchmark(task).run(BenchmarkSettings(model_dir=model, data_dir=data_dir, output_dir=d, finetune=ft,
                                                   task=cfg, precision=precision))
    summary = task_summary(task, result)
    for folder in sorted(d.rglob("model"), reverse=True):  # the scores stay; the fine-tuned weights go
        if folder.is_dir():
            shutil.rmtree(folder)
    return {"task": task, "metric": summary["metric"], "value": summary["value"],
            "train_examples": train_examples(result.document, size)}


def train_examples(document: dict, asked: int) -> int:
    """How many examples a run trained on, from its results document (each task family names it)."""
    for value in (document.get("num_train_examples"), document.get("train_examples"),
                  (document.get("sentences") or {}).get("train")):
        if isinstance(value, int):
            return value
    return asked


# ---------------------------------------------------------------- the run


@dataclasses.dataclass
class CurveRun:
    budget: dict
    data_dir: Path
    out: Path
    tasks: list[str]
    precision: str
    stages: Stages
    started: float
    models: dict[str, Path] = dataclasses.field(default_factory=dict)
    # results[task][model][size] = {"used": n, "runs": {learning rate: [scores]}}
    results: dict = dataclasses.field(default_factory=dict)


def learning_curve(budget: str | dict, data_dir: str | None, output: str, model: str | None = None,
                   tasks: list[str] | None = None, precision: str = "auto", dry_run: bool = False) -> dict:
    """Run the curve (the module docstring's stages) and return report.json's content; with dry_run,
    the plan instead."""
    budget = load_budget(budget) if isinstance(budget, str) else budget
    if not is_learning_curve(budget):
        raise BertkitError(f"budget {budget['name']!r} is not a learning curve (its kind is not {KIND!r})")
    check_curve_budget(budget)
    try:
        data_dir = resolve_data_dir(data_dir)
    except BertkitError:
        raise BertkitError("no data directory: pass --data-dir or set BERTKIT_DATA (see README: Data)") from None
    task_names = tasks or available_tasks(budget["tasks"], data_dir)
    unknown = [t for t in task_names if t not in budget["tasks"]]
    if unknown:
        raise BertkitError(f"task(s) {', '.join(unknown)} have no settings in budget {budget['name']!r}")
    if model is None and not budget.get("pretrained"):
        raise BertkitError(f"budget {budget['name']!r} names no pre-training budget: give --model")
    if dry_run:
        return curve_plan(budget, data_dir, task_names, model)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    run = CurveRun(budget, data_dir, out, task_names, precision, Stages(out), time.perf_counter())
    if model is not None:
        given = Path(model).resolve()
        run.stages.run("model-pretrained", {"model": str(given), "weights": _weights_hash(given)},
                       functools.partial(use_given_model, given))
        run.models["bert"], source = given, "model-pretrained"
    else:
        run.models["bert"], source = pretrained_by_budget(budget, data_dir, run.stages, precision), "pretrain-bert"
    run.models["random-init"] = Path(run.stages.run("model-random-init", {}, functools.partial(
        make_random_like, run.models["bert"]), inputs=(source,))["model"])
    inputs = {"bert": source, "random-init": "model-random-init"}
    for task in task_names:
        # Size by size, both models at each: a run stopped part-way leaves whole points behind it.
        whole_set = set()  # models whose last size already used the whole training set
        for size in budget["sizes"]:
            for model_name in MODELS:
                if model_name in whole_set:
                    continue
                curve = run.results.setdefault(task, {}).setdefault(model_name, {})
                point = {"used": size, "runs": {}}
                for lr in budget["finetune"]["learning_rates"]:
                    for seed in budget["seeds"]:
                        config = {"task": task, "task_cfg": budget["tasks"][task], "finetune": budget["finetune"],
                                  "size": size, "learning_rate": lr, "seed": seed, "precision": precision}
                        result = run.stages.run(f"curve-{model_name}-{task}-{size}-lr{lr:g}-s{seed}", config,
                                                functools.partial(finetune_point, budget, data_dir,
                                                                  run.models[model_name], task, size, lr, seed,
                                                                  precision), inputs=(inputs[model_name],))
                        point["runs"].setdefault(lr, []).append(result["value"])
                        point["used"] = min(point["used"], result["train_examples"])
                curve[size] = point
                log.info(f"  {model_name} / {task} / {size}: " + ", ".join(
                    f"lr {lr:g} {sum(v) / len(v):.1f}" for lr, v in point["runs"].items()))
                if point["used"] < size:
                    whole_set.add(model_name)  # larger sizes would repeat this point
            if whole_set == set(MODELS):
                break
    return write_curve_report(run)


def curve_plan(budget: dict, data_dir: Path, tasks: list[str], model: str | None) -> dict:
    stages = [] if model else ["corpus", "vocab", "data", "pretrain-bert"]
    stages += ["model-random-init"]
    for task in tasks:
        for size, _ in sizes_run(budget, task):
            stages += [f"curve-{m}-{task}-{size}-lr{lr:g}-s{s}" for m in MODELS
                       for lr in budget["finetune"]["learning_rates"] for s in budget["seeds"]]
    seconds = estimate_seconds(budget, tasks)
    if seconds is not None and model:
        seconds -= budget["estimate"].get("pretraining_seconds", 0.0)
    return {"budget": budget["name"], "kind": KIND, "model": model or f"{budget['pretrained']['budget']} / bert",
            "tasks": tasks, "sizes": {t: train_sizes_used(budget, t) for t in tasks}, "seeds": budget["seeds"],
            "learning_rates": budget["finetune"]["learning_rates"], "fine_tuning_runs": len(stages) - (
                1 if model else 5), "stages": stages + ["report"],
            "estimated_minutes_slowest_class": None if seconds is None else round(seconds / 60),
            "data_dir": str(data_dir)}


# ---------------------------------------------------------------- the report


def write_curve_report(run: CurveRun) -> dict:
    budget, stages = run.budget, run.stages
    seconds = time.perf_counter() - run.started
    points = {task: curve_points(run.results[task]) for task in run.tasks}
    verdicts = {task: curve_verdict(p) for task, p in points.items()}
    pre = stages.records.get("pretrain-bert", {}).get("result", {})
    final = pre.get("final_eval") or {}
    command = " ".join(sys.argv) if sys.argv and "bertkit" in sys.argv[0] else f"bertkit reproduce --budget " \
                                                                                 f"{budget['name']}"
    source = (f"the `{budget['pretrained']['budget']}` budget's BERT variant, pre-trained in this run's stages "
              f"(held-out MLM {_pct(final.get('mlm_accuracy'))}, NSP {_pct(final.get('nsp_accuracy'))})"
              if "pretrain-bert" in stages.records else f"the given model `{run.models['bert']}`")
    estimate = estimate_seconds(budget, run.tasks)
    lines = [f"# bertkit learning curve — budget `{budget['name']}`", "", budget.get("about", ""), "",
             "## Environment and command", "",
             f"- bertkit {__version__}, Python {platform.python_version()}, torch {torch.__version__}, "
             f"{os.cpu_count()} CPU core(s), precision {run.precision}",
             f"- command: `{command}`", f"- budget file: `{budget['_path']}`; data: `{run.data_dir}`",
             f"- total wall time {seconds / 60:.1f} min (stages taken from cache this time: "
             f"{len(stages.records) - len(stages.ran)} of {len(stages.records)}; the stages' own times, summed: "
             f"{sum(r['seconds'] for r in stages.records.values()) / 60:.1f} min)"
             + ("" if estimate is None else f"; the budget's estimate for the slowest CPU class: "
                                            f"{estimate / 3600:.1f} h"), "",
             "## Pre-trained BERT against random init, by fine-tuning set size", "",
             f"Pre-trained model: {source}. Random init: the same configuration and vocabulary with the paper's "
             f"initialisation. Each size: seeds {', '.join(map(str, budget['seeds']))} (seed S draws the training "
             f"subset, the same for both models, and initialises the run); learning rates "
             f"{', '.join(f'{x:g}' for x in budget['finetune']['learning_rates'])} for both models, each model's "
             "chosen on dev by its mean over the seeds; dev scores in percent, mean and sample sd at the chosen "
             f"rate. Within noise: {CURVE_NOISE_RULE}. A size past the training set runs once on all of it.", ""]
    for task in run.tasks:
        lines += curve_table(task, points[task])
    lines += ["## Verdicts", ""] + [f"- {BENCHMARKS[t].label}: {v}." for t, v in verdicts.items()]
    lines += ["", "## Wall time per stage", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {rec['seconds']:.1f} |" for name, rec in stages.records.items()]
    atomic_write_text(run.out / "report.md", "\n".join(lines) + "\n")
    report = {"budget": budget["name"], "kind": KIND, "seconds": seconds, "precision": run.precision,
              "model": str(run.models["bert"]), "pretraining": pre or None, "noise_rule": CURVE_NOISE_RULE,
              "curves": {t: [point_record(p) for p in ps] for t, ps in points.items()}, "verdicts": verdicts,
              "runs": {t: {m: {str(size): {"used": p["used"], "runs": {f"{lr:g}": v for lr, v in p["runs"].items()}}
                               for size, p in by_size.items()} for m, by_size in by_model.items()}
                       for t, by_model in run.results.items()},
              "estimated_seconds_slowest_class": estimate,
              "stages": {k: {"seconds": v["seconds"], "key": v["key"]} for k, v in stages.records.items()},
              "stages_run_this_time": stages.ran}
    atomic_write_text(run.out / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    return report


def _weights_hash(model: Path) -> str | None:
    weights = model / "model.safetensors"
    if not weights.is_file():
        return None
    digest = hashlib.sha256()
    with open(weights, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


__all__ = ["KIND", "is_learning_curve", "check_curve_budget", "estimate_seconds", "sizes_run", "train_sizes_used",
           "learning_curve", "curve_plan", "write_curve_report"]
