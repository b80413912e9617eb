"""GLUE: fine-tune on one task (or all of them) with the paper's protocol (paper §4.1, appendix A.3).

The story of the module, top to bottom:
  1. the tasks and the official GLUE TSV layouts (`GLUE_TASKS`),
  2. reading them (`read_glue_file`, `load_glue_task`): tabs split fields, quotes are literal text,
     malformed rows raise BertkitError(path, line) or are skipped and counted,
  3. features (`glue_features`): `[CLS] a [SEP] b [SEP]`, at most max_seq_length pieces,
  4. one run = one `fit` of BertForSequenceClassification (linear layer on the pooled [CLS]),
  5. the sweep: grid x restarts, the best dev score wins (`finetune_glue`),
  6. outputs: results.json, dev predictions, GLUE server submission files, the model,
     and for several tasks a table laid out like the paper's Table 1.

The task surface (tasks/common.py): read = `load_glue_task`, featurize = `glue_features`, HEAD =
BertForSequenceClassification, postprocess = `classification_predictions`, score = `evaluate_glue`,
finetune = `finetune_glue` -> TaskResult. The sweep protocol, its outputs and flags live in
`common.py`, shared with `multiple_choice.py`. Task names ("sst2", "MNLI-mm") are the GLUE metrics'
names (bertkit.metrics.glue.canonical_task_name); mnli-mm is MNLI's mismatched split.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Sequence

import torch

from ..batching import predict_batches
from ..errors import BertkitError
from ..heads import BertForSequenceClassification
from ..hub import model_tokenizer
from ..metrics.glue import TASK_METRICS, canonical_task_name, compute_glue_metrics, glue_score, task_score
from ..outputs import atomic_write_text, write_json
from .arguments import (FINETUNE_DROPOUT, add_data_dir_argument, add_sweep_arguments, check_finetune_output,
                        dropout_overrides, sweep_options)
from .benchmarks import Benchmark, BenchmarkSettings
from .examples import BadRows, Examples, resolve_data_dir, subsample
from .results import TaskResult, publish_best_metrics, results_document, write_predictions
from .runs import config_text, grid
from .sweep import predict_precision, run_protocol

log = logging.getLogger("bertkit")

# ---------------------------------------------------------------- 1. the tasks


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its files are, which columns hold what, its label vocabulary."""

    name: str  # canonical name, as bertkit.metrics.glue knows it ("sst-2")
    folder: str  # the GLUE download's folder name ("SST-2")
    text_a: str  # column names (as in the files' header rows)
    text_b: str | None
    label: str | None  # None: the task has no labelled split (AX)
    labels: tuple[str, ...] | None  # label vocabulary; None: regression (STS-B)
    index: str | None = "index"  # the id column; None: the row number (SST-2 dev, MRPC train/dev)
    files: tuple[tuple[str, str], ...] = (("train", "train.tsv"), ("dev", "dev.tsv"), ("test", "test.tsv"))
    submission: tuple[tuple[str, str], ...] = ()  # test split -> file name the GLUE server expects
    headerless: tuple[str, ...] | None = None  # column names of train/dev files that have no header row
    test_index: str | None = "index"
    headline: str = "accuracy"  # the metric the paper's Table 5 (and the reproduce report) shows

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    def file_name(self, split: str) -> str:
        names = dict(self.files)
        if split not in names:
            raise BertkitError(f"GLUE task {self.folder} has no {split!r} split; it has {', '.join(names)}")
        return names[split]


NLI_LABELS = ("contradiction", "entailment", "neutral")
BINARY = ("0", "1")

GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("mnli", "MNLI", "sentence1", "sentence2", "gold_label", NLI_LABELS,
             files=(("train", "train.tsv"), ("dev", "dev_matched.tsv"), ("dev_mismatched", "dev_mismatched.tsv"),
                    ("test", "test_matched.tsv"), ("test_mismatched", "test_mismatched.tsv")),
             submission=(("test", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv"))),
    GlueTask("qqp", "QQP", "question1", "question2", "is_duplicate", BINARY, index="id", test_index="id",
             submission=(("test", "QQP.tsv"),)),
    GlueTask("qnli", "QNLI", "question", "sentence", "label", ("entailment", "not_entailment"),
             submission=(("test", "QNLI.tsv"),)),
    GlueTask("sst-2", "SST-2", "sentence", None, "label", BINARY, index=None, submission=(("test", "SST-2.tsv"),)),
    # CoLA's train/dev files have no header: source, label, the author's original mark, sentence.
    GlueTask("cola", "CoLA", "sentence", None, "label", BINARY, index=None, submission=(("test", "CoLA.tsv"),),
             headerless=("source", "label", "original_judgement", "sentence"), headline="matthews_correlation"),
    GlueTask("sts-b", "STS-B", "sentence1", "sentence2", "score", None, submission=(("test", "STS-B.tsv"),),
             headline="spearman"),
    GlueTask("mrpc", "MRPC", "#1 String", "#2 String", "Quality", BINARY, index=None,
             submission=(("test", "MRPC.tsv"),)),
    GlueTask("rte", "RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment"),
             submission=(("test", "RTE.tsv"),)),
    GlueTask("wnli", "WNLI", "sentence1", "sentence2", "label", BINARY, submission=(("test", "WNLI.tsv"),)),
    # The diagnostic set: unlabelled, scored by the GLUE server from MNLI-model predictions.
    GlueTask("ax", "diagnostic", "sentence1", "sentence2", None, NLI_LABELS,
             files=(("test", "diagnostic.tsv"),), submission=(("test", "AX.tsv"),)),
)}

# The paper's Table 1 order (the order `--task all` runs them in); WNLI runs but has no column.
TABLE_TASKS = ("mnli", "qqp", "qnli", "sst-2", "cola", "sts-b", "mrpc", "rte", "wnli")


def glue_task(name: str) -> GlueTask:
    """'MRPC', 'sst2', 'STS_B', 'mnli' -> the GlueTask (case-insensitive). The names are the GLUE
    metrics' (one list, bertkit.metrics.glue); 'mnli-mm' is MNLI's mismatched split, so MNLI's data."""
    try:
        key = canonical_task_name(name)
    except BertkitError:
        raise BertkitError(f"unknown GLUE task {name!r}; expected one of "
                           f"{', '.join(t.folder for t in GLUE_TASKS.values() if t.name != 'ax')} or 'all'") from None
    return GLUE_TASKS["mnli" if key == "mnli-mm" else key]


def task_folder(task: GlueTask, data_dir: str | Path) -> Path:
    """DATA_DIR/glue/<Task> or DATA_DIR/<Task> (or DATA_DIR itself when it is named <Task>)."""
    data_dir = Path(data_dir)
    candidates = [data_dir / "glue" / task.folder, data_dir / task.folder]
    if data_dir.name == task.folder:
        candidates.append(data_dir)
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise BertkitError(f"no {task.folder} folder under the data directory (looked for "
                       f"{' and '.join(str(c) for c in candidates[:2])})", path=str(data_dir))


# ---------------------------------------------------------------- 2. reading the TSV files


@dataclasses.dataclass
class GlueExample:
    index: str  # the file's id column, or the 0-based row number when it has none
    text_a: str
    text_b: str | None
    label: str | float | None  # a label from the task's vocabulary, a float score (STS-B), or None (test)
    line: int = 0  # line in the file, for messages


def read_tsv_lines(path: str | Path) -> list[tuple[int, str]]:
    """(line number, text) for each non-empty line. Splits on '\\n' only: GLUE text may hold other
    Unicode line separators, which str.splitlines would break on. Drops a UTF-8 BOM and '\\r'."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError("file not found", path=str(path))
    lines = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BertkitError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=str(path), line=number) from None
        if number == 1:
            text = text.removeprefix("\ufeff")
        text = text.removesuffix("\r")
        if text.strip():
            lines.append((number, text))
    return lines


def read_glue_file(path: str | Path, task: str | GlueTask, split: str, skip_bad_rows: bool = False) -> Examples:
    """Read one official GLUE TSV file. `split` is train/dev/test (or MNLI's dev_mismatched /
    test_mismatched): test files have an index column and no label."""
    task = task if isinstance(task, GlueTask) else glue_task(task)
    path = Path(path)
    bad = BadRows(path, skip_bad_rows)
    lines = read_tsv_lines(path)
    is_test = split.startswith("test")
    if task.headerless and not is_test:
        header, rows = list(task.headerless), lines
    else:
        if not lines:
            raise BertkitError("empty file: expected a header row", path=str(path))
        header, rows = lines[0][1].split("\t"), lines[1:]
    index_column = task.test_index if is_test else task.index
    label_column = None if is_test else task.label
    wanted = [c for c in (index_column, task.text_a, task.text_b, label_column) if c is not None]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise BertkitError(f"{task.folder} {split} file lacks column(s) {', '.join(map(repr, missing))}; "
                           f"its header is {header}", path=str(path), line=1)
    col = {name: header.index(name) for name in wanted}

    examples = []
    for row_number, (line, text) in enumerate(rows):
        fields = text.split("\t")
        if len(fields) != len(header):
            bad(line, f"expected {len(header)} tab-separated fields ({', '.join(header)}), found {len(fields)}")
            continue
        label = None
        if label_column is not None:
            raw = fields[col[label_column]].strip()
            if task.is_regression:
                try:
                    label = float(raw)
                except ValueError:
                    label = math.nan
                if not 0.0 <= label <= 5.0:  # NaN fails this too
                    bad(line, f"{label_column} {raw!r} is not a similarity score in [0, 5]")
                    continue
            elif raw not in task.labels:
                bad(line, f"{label_column} {raw!r} is not one of {', '.join(task.labels)}")
                continue
            else:
                label = raw
        examples.append(GlueExample(
            index=fields[col[index_column]] if index_column else str(row_number),
            text_a=fields[col[task.text_a]],
            text_b=fields[col[task.text_b]] if task.text_b else None,
            label=label, line=line))
    return Examples(examples, path=path, skipped=bad.skipped)


def glue_file(task: str | GlueTask, data_dir: str | Path, split: str) -> Path:
    """The path of one split's file (AX: DATA_DIR[/glue]/diagnostic/diagnostic.tsv)."""
    task = task if isinstance(task, GlueTask) else glue_task(task)
    return task_folder(task, data_dir) / task.file_name(split)


def load_glue_split(task: str | GlueTask, data_dir: str | Path, split: str, skip_bad_rows: bool = False) -> Examples:
    task = task if isinstance(task, GlueTask) else glue_task(task)
    return read_glue_file(glue_file(task, data_dir, split), task, split, skip_bad_rows)


def load_glue_task(task: str | GlueTask, data_dir: str | Path, skip_bad_rows: bool = False):
    """(train, dev, test) examples; test is None when the folder has no test file.
    MNLI: dev and test are the matched ones (load_glue_split gives the mismatched ones)."""
    task = task if isinstance(task, GlueTask) else glue_task(task)
    train = load_glue_split(task, data_dir, "train", skip_bad_rows)
    dev = load_glue_split(task, data_dir, "dev", skip_bad_rows)
    test_path = glue_file(task, data_dir, "test")
    test = read_glue_file(test_path, task, "test", skip_bad_rows) if test_path.is_file() else None
    return train, dev, test


def has_train_and_dev(task: GlueTask, data_dir: str | Path) -> bool:
    try:
        folder = task_folder(task, data_dir)
    except BertkitError:
        return False
    return all((folder / task.file_name(s)).is_file() for s in ("train", "dev"))


# ---------------------------------------------------------------- 3. features


def label_id(task: GlueTask, label):
    return float(label) if task.is_regression else task.labels.index(label)


def glue_features(examples: Sequence[GlueExample], tokenizer, task: str | GlueTask,
                  max_seq_length: int = 128) -> list[dict]:
    """`[CLS] text_a [SEP] (text_b [SEP])`, truncated to max_seq_length pieces; `labels` is the
    class id (or the float score for STS-B) when the example has a label."""
    task = task if isinstance(task, GlueTask) else glue_task(task)
    if not examples:
        return []
    pairs = [e.text_b for e in examples] if task.text_b else None
    encoded = tokenizer.encode_batch([e.text_a for e in examples], pairs, max_length=max_seq_length, truncation=True)
    features = []
    for example, enc in zip(examples, encoded):
        feature = {"input_ids": list(enc["input_ids"]), "token_type_ids": list(enc["token_type_ids"]),
                   "attention_mask": list(enc["attention_mask"])}
        if example.label is not None:
            feature["labels"] = label_id(task, example.label)
        features.append(feature)
    return features


# ---------------------------------------------------------------- 4./5. runs and the sweep


def classification_predictions(task: GlueTask, logits: list[torch.Tensor]) -> list:
    """Logits -> class ids (classification) or scores (regression)."""
    if task.is_regression:
        return [float(v.view(-1)[0]) for v in logits]
    return [int(v.argmax()) for v in logits]


def evaluate_glue(task: GlueTask, predictions: list, examples: Sequence[GlueExample], metric_task: str | None = None) -> dict:
    gold = [label_id(task, e.label) for e in examples]
    return compute_glue_metrics(metric_task or task.name, predictions, gold)


def finetune_glue(task, model_dir, data_dir=None, output_dir=None,
                  learning_rates=(5e-5, 4e-5, 3e-5, 2e-5), epochs=(3,), batch_sizes=(32,), seeds=(42,),
                  max_seq_length: int = 128, max_train_examples: int | None = None, precision: str = "auto",
                  device: str = "auto", skip_bad_rows: bool = False, eval_batch_size: int = 128,
                  warmup_ratio: float = 0.1, weight_decay: float = 0.01, dropout: float | None = FINETUNE_DROPOUT,
                  logging_steps: int = 50, eval_steps: int = 0, resume: bool = False) -> TaskResult:
    """Fine-tune on one GLUE task with the paper's protocol; the TaskResult's document is results.json.

    Every (learning rate, epochs, batch size, seed) combination is one run; the best dev task score
    wins (MNLI: matched accuracy), as in the paper. `task` may also be 'all' or a list of tasks:
    see `finetune_glue_tasks`. With `output_dir`, writes OUTPUT/<Task>/ (results.json,
    dev_predictions.tsv, the GLUE submission files, model/, the best run's metrics.jsonl, and every
    run's in runs/<run>/).
    """
    if isinstance(task, (list, tuple)) or str(task).lower() == "all" or "," in str(task):
        return finetune_glue_tasks(task, model_dir, data_dir, output_dir, learning_rates=learning_rates,
                                   epochs=epochs, batch_sizes=batch_sizes, seeds=seeds, max_seq_length=max_seq_length,
                                   max_train_examples=max_train_examples, precision=precision, device=device,
                                   skip_bad_rows=skip_bad_rows, eval_batch_size=eval_batch_size,
                                   warmup_ratio=warmup_ratio, weight_decay=weight_decay, dropout=dropout,
                                   logging_steps=logging_steps, eval_steps=eval_steps)
    spec = glue_task(task)
    if spec.name == "ax":
        raise BertkitError("AX has no training data: it is predicted with the MNLI model (--task mnli)")
    data_dir = resolve_data_dir(data_dir)
    tokenizer = model_tokenizer(model_dir)

    train, dev, test = load_glue_task(spec, data_dir, skip_bad_rows)
    splits = {"train": train, "dev": dev, **({"test": test} if test is not None else {})}
    extra_dev = {}
    if spec.name == "mnli":
        mm_path = glue_file(spec, data_dir, "dev_mismatched")
        if mm_path.is_file():
            extra_dev["dev_mismatched"] = splits["dev_mismatched"] = read_glue_file(mm_path, spec, "dev_mismatched",
                                                                                    skip_bad_rows)
    if not dev:
        raise BertkitError("the dev file has no examples", path=dev.path)
    train_examples = subsample(train, max_train_examples)
    train_features = glue_features(train_examples, tokenizer, spec, max_seq_length)
    dev_features = glue_features(dev, tokenizer, spec, max_seq_length)
    extra_features = {name: glue_features(ex, tokenizer, spec, max_seq_length) for name, ex in extra_dev.items()}

    if spec.is_regression:
        head = dict(num_labels=1, id2label={0: "score"}, problem_type="regression")
    else:
        head = dict(id2label=dict(enumerate(spec.labels)), problem_type="single_label_classification")
    head.update(dropout_overrides(dropout))

    def build_model():
        return HEAD.from_pretrained(model_dir, **head)

    def evaluate(model) -> tuple[dict, dict]:
        outputs = {}
        logits = predict_batches(model, dev_features, batch_size=eval_batch_size, pad_token_id=tokenizer.pad_token_id,
                                 precision=predict_precision(model, precision))["logits"]
        outputs["dev"] = classification_predictions(spec, logits)
        metrics = evaluate_glue(spec, outputs["dev"], dev)
        for name, features in extra_features.items():  # MNLI mismatched: reported, not used to select
            logits = predict_batches(model, features, batch_size=eval_batch_size, pad_token_id=tokenizer.pad_token_id,
                                     precision=predict_precision(model, precision))["logits"]
            outputs[name] = classification_predictions(spec, logits)
            for key, value in evaluate_glue(spec, outputs[name], extra_dev[name], "mnli-mm").items():
                metrics[f"{key}_mismatched"] = value
        return metrics, outputs

    configs = grid(learning_rates, epochs, batch_sizes, seeds)
    log.info(f"{spec.folder}: {len(train_features)} train / {len(dev_features)} dev examples, "
             f"{len(configs)} run(s) (grid x seeds), max length {max_seq_length}")
    for name, examples in splits.items():
        if examples.skipped:
            log.warning(f"{spec.folder}: skipped {len(examples.skipped)} malformed {name} row(s), "
                f"first: {examples.skipped[0]}")
    runs_dir = None if output_dir is None else Path(output_dir) / spec.folder / "runs"
    best, runs = run_protocol(configs, build_model, train_features, evaluate,
                              score=lambda metrics: task_score(spec.name, metrics),
                              precision=precision, device=device, warmup_ratio=warmup_ratio,
                              weight_decay=weight_decay, pad_token_id=tokenizer.pad_token_id,
                              label=spec.folder, runs_dir=runs_dir, logging_steps=logging_steps,
                              eval_steps=eval_steps, resume=resume,
                              identity={"model": str(model_dir), "max_seq_length": max_seq_length, "dropout": dropout})
    results = results_document(spec.folder, best, runs, {
        "num_train_examples": len(train_features), "num_dev_examples": len(dev_features),
        "max_seq_length": max_seq_length,
        "labels": list(spec.labels) if spec.labels else "regression (similarity score 0-5)",
        "skipped_rows": {name: len(ex.skipped) for name, ex in splits.items()},
        "selection": "best dev " + ("matched accuracy" if spec.name == "mnli" else _score_name(spec.name)),
    })
    result = TaskResult(task=spec.name, metric=spec.headline, metrics=best.metrics,
                        run_metrics=[r.metrics for r in runs], document=results)
    if output_dir is not None:
        out = Path(output_dir) / spec.folder
        out.mkdir(parents=True, exist_ok=True)
        model, outputs = best.artifacts
        write_predictions(out / "dev_predictions.tsv", [e.index for e in dev],
                          [_label_text(spec, p) for p in outputs["dev"]])
        for name in extra_dev:
            write_predictions(out / f"{name}_predictions.tsv", [e.index for e in extra_dev[name]],
                              [_label_text(spec, p) for p in outputs[name]])
        results["submission_files"] = write_submission(spec, model, tokenizer, data_dir, out, test,
                                                       max_seq_length, eval_batch_size, precision, skip_bad_rows)
        model.save_pretrained(out / "model", tokenizer=tokenizer)
        publish_best_metrics(runs_dir, best, out)
        write_json(out / "results.json", results)
        result.output_dir, result.model_dir = str(out), str(out / "model")
        log.info(f"{spec.folder}: best run {config_text(best.config)} (dev {100 * best.score:.2f}); wrote {out}")
    return result


def _score_name(task_name: str) -> str:
    return " and ".join(TASK_METRICS[task_name]) + (" (mean)" if len(TASK_METRICS[task_name]) > 1 else "")


def _label_text(task: GlueTask, prediction, clip: bool = False) -> str:
    if task.is_regression:
        value = min(5.0, max(0.0, prediction)) if clip else prediction
        return f"{value:.3f}"
    return task.labels[prediction]


def write_submission(task: GlueTask, model, tokenizer, data_dir, out: Path, test, max_seq_length: int,
                     eval_batch_size: int, precision: str, skip_bad_rows: bool) -> list[str]:
    """Test predictions in the GLUE server's format: <out>/<TASK>.tsv, header `index\\tprediction`,
    labels in the task's vocabulary, STS-B clipped to [0, 5]. MNLI also writes MNLI-mm.tsv and AX.tsv."""
    sets = []  # (examples, file name, task whose labels are predicted)
    submission = dict(task.submission)
    if test is not None:
        sets.append((test, submission["test"]))
    if task.name == "mnli":
        mm = glue_file(task, data_dir, "test_mismatched")
        if mm.is_file():
            sets.append((read_glue_file(mm, task, "test_mismatched", skip_bad_rows), submission["test_mismatched"]))
        try:
            ax = glue_file("ax", data_dir, "test")
        except BertkitError:
            ax = None
        if ax is not None and ax.is_file():
            sets.append((read_glue_file(ax, "ax", "test", skip_bad_rows), "AX.tsv"))
    written = []
    for examples, name in sets:
        features = [{k: v for k, v in f.items() if k != "labels"}
                    for f in glue_features(examples, tokenizer, task, max_seq_length)]
        predictions = []
        if features:
            logits = predict_batches(model, features, batch_size=eval_batch_size, pad_token_id=tokenizer.pad_token_id,
                                     precision=predict_precision(model, precision))["logits"]
            predictions = classification_predictions(task, logits)
        write_predictions(out / name, [e.index for e in examples], [_label_text(task, p, clip=True) for p in predictions])
        written.append(name)
    return written


# ---------------------------------------------------------------- 6. several tasks: the Table 1 layout


def finetune_glue_tasks(tasks, model_dir, data_dir=None, output_dir=None, **options) -> TaskResult:
    """Run `finetune_glue` for each task ('all': every task whose train and dev files exist, in the
    paper's Table 1 order) and build the paper-style table; with output_dir also writes
    OUTPUT/glue_table.md and OUTPUT/results.json. The result's headline is the GLUE score."""
    data_dir = resolve_data_dir(data_dir)
    if isinstance(tasks, str) and tasks.strip().lower() == "all":
        chosen = [GLUE_TASKS[name] for name in TABLE_TASKS if has_train_and_dev(GLUE_TASKS[name], data_dir)]
        if not chosen:
            raise BertkitError("no GLUE task with both train and dev files under the data directory",
                               path=str(data_dir))
    else:
        names = tasks.split(",") if isinstance(tasks, str) else tasks
        chosen = []
        for name in names:
            spec = glue_task(name)
            if spec not in chosen:
                chosen.append(spec)
    per_task = {}
    for spec in chosen:
        finished = None if output_dir is None else Path(output_dir) / spec.folder / "results.json"
        if options.get("resume") and finished.is_file():  # written last: the task's sweep and outputs are complete
            log.info(f"{spec.folder}: finished before ({finished}), kept")
            per_task[spec.folder] = json.loads(finished.read_text(encoding="utf-8"))
            continue
        per_task[spec.folder] = finetune_glue(spec.name, model_dir, data_dir, output_dir, **options).document
    table = glue_table({name: r["metrics"] for name, r in per_task.items()})
    results = {"tasks": per_task, "table": table["markdown"], "glue_score": table["glue_score"],
               "glue_score_tasks": table["glue_score_tasks"]}
    log.info(table["markdown"])
    result = TaskResult(task="glue", metric="glue_score", metrics={"glue_score": table["glue_score"]},
                        document=results, output_dir=None if output_dir is None else str(output_dir))
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "glue_table.md", table["markdown"] + "\n")
        write_json(out / "results.json", results)
    return result


TABLE_COLUMNS = (("MNLI-(m/mm)", "MNLI"), ("QQP", "QQP"), ("QNLI", "QNLI"), ("SST-2", "SST-2"), ("CoLA", "CoLA"),
                 ("STS-B", "STS-B"), ("MRPC", "MRPC"), ("RTE", "RTE"))


def glue_table(metrics_by_folder: dict[str, dict]) -> dict:
    """Dev metrics per task (keyed by folder name: 'MRPC') -> a Markdown table in the paper's Table 1
    layout: F1 for QQP and MRPC, Spearman for STS-B, Matthews correlation for CoLA, accuracy for the
    rest; missing tasks shown as '-'. Average = the GLUE score over the tasks run (bertkit.metrics.glue
    .glue_score: two-metric tasks averaged first, MNLI m/mm averaged, WNLI left out)."""
    def pct(x):
        return f"{100 * x:.1f}"

    cells = []
    for _, folder in TABLE_COLUMNS:
        m = metrics_by_folder.get(folder)
        if m is None:
            cells.append("-")
        elif folder == "MNLI":
            mm = m.get("accuracy_mismatched")
            cells.append(pct(m["accuracy"]) + "/" + (pct(mm) if mm is not None else "-"))
        elif folder in ("QQP", "MRPC"):
            cells.append(pct(m["f1"]))
        elif folder == "STS-B":
            cells.append(pct(m["spearman"]))
        elif folder == "CoLA":
            cells.append(pct(m["matthews_correlation"]))
        else:
            cells.append(pct(m["accuracy"]))
    score_input = {}
    for folder, m in metrics_by_folder.items():
        spec = glue_task(folder)
        if spec.name == "mnli":
            score_input["mnli"] = {"accuracy": m["accuracy"]}
            if "accuracy_mismatched" in m:
                score_input["mnli-mm"] = {"accuracy": m["accuracy_mismatched"]}
        else:
            score_input[spec.name] = m
    scored = [GLUE_TASKS[n].folder for n in TABLE_TASKS if n in score_input and n != "wnli"]
    score = glue_score(score_input) if scored else None
    header = "| System | " + " | ".join(c for c, _ in TABLE_COLUMNS) + " | Average |"
    rule = "|---|" + "---:|" * (len(TABLE_COLUMNS) + 1)
    row = "| bertkit (dev) | " + " | ".join(cells) + f" | {pct(score) if score is not None else '-'} |"
    notes = [f"Average: GLUE score over {', '.join(scored) or 'no task'} (each task's metrics averaged first; "
             "MNLI matched and mismatched averaged; WNLI left out). Dev-set scores of the best run per task."]
    if "WNLI" in metrics_by_folder:
        notes.append(f"WNLI (not in the table or the average): accuracy {pct(metrics_by_folder['WNLI']['accuracy'])}.")
    return {"markdown": "\n".join([header, rule, row, ""] + notes), "glue_score": score, "glue_score_tasks": scored}


# ---------------------------------------------------------------- command line


def add_finetune_arguments(parser) -> None:
    parser.add_argument("--task", required=True,
                        help="CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI (case-insensitive; sst2, stsb "
                             "also accepted), a comma list, or 'all' (every task with train and dev files)")
    add_data_dir_argument(parser, "glue/<Task>/ or <Task>/")
    add_sweep_arguments(parser, learning_rates="5e-5,4e-5,3e-5,2e-5", batch_sizes="32", epochs="3")
    parser.epilog = ("Defaults follow the paper: batch 32, 3 epochs, max length 128, and the learning rate chosen "
                     "on dev among 5e-5, 4e-5, 3e-5, 2e-5 (four runs per task).")


def run_finetune(args) -> int:
    check_finetune_output(args)
    finetune_glue(args.task, args.model, args.data_dir, args.output, **sweep_options(args))
    return 0


# ---------------------------------------------------------------- the task surface and its benchmarks

HEAD = BertForSequenceClassification
read = load_glue_task
featurize = glue_features
postprocess = classification_predictions
score = evaluate_glue
finetune = finetune_glue


def run_benchmark(task: GlueTask, settings: BenchmarkSettings) -> TaskResult:
    """One GLUE task at a reproduction budget's settings (one batch size; the budget's grid)."""
    ft = settings.finetune
    return finetune_glue(task.name, str(settings.model_dir), str(settings.data_dir), str(settings.output_dir),
                         learning_rates=ft["learning_rates"], epochs=ft["epochs"], seeds=ft["seeds"],
                         batch_sizes=[ft["batch_size"]], max_seq_length=settings.max_seq_length(),
                         max_train_examples=settings.task.get("max_train_examples"), precision=settings.precision)


def _benchmark(task: GlueTask) -> Benchmark:
    return Benchmark(name=task.name, label=task.folder, has_data=lambda data_dir: has_train_and_dev(task, data_dir),
                     run=lambda settings: run_benchmark(task, settings))


BENCHMARKS = tuple(_benchmark(GLUE_TASKS[name]) for name in TABLE_TASKS)
