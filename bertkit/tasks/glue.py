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

The task class (tasks/task.py) is `GlueFinetuning`, one GLUE task's fine-tuning and the
`bertkit finetune glue` command; the sweep protocol and its outputs are the runner's
(tasks/runner.py). Task names ("sst2", "MNLI-mm") are the GLUE metrics' names
(bertkit.metrics.glue.canonical_task_name); mnli-mm is MNLI's mismatched split.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Sequence

import torch

from ..inference.predict_batches import predict_batches
from ..errors import BertkitError
from ..heads import BertForSequenceClassification
from ..metrics.glue import TASK_METRICS, canonical_task_name, compute_glue_metrics, glue_score, task_score
from ..outputs import atomic_write_text, write_json
from .arguments import add_data_dir_argument, check_finetune_output
from .benchmarks import Benchmark, BenchmarkSettings
from .examples import BadRows, Examples, resolve_data_dir
from .results import TaskResult, write_predictions
from . import runner
from .settings import Defaults, RunSettings
from .splits import Splits
from .sweep import predict_precision
from .task import Task

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
    column: str | None = None  # its column in the paper's Table 1 (None: not in the table)
    table_metric: str = "accuracy"  # the metric Table 1 shows
    reported: tuple[tuple[str, str], ...] = ()  # (split, metrics' task name): scored beside dev, not selecting

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
             submission=(("test", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv")),
             column="MNLI-(m/mm)", reported=(("dev_mismatched", "mnli-mm"),)),
    GlueTask("qqp", "QQP", "question1", "question2", "is_duplicate", BINARY, index="id", test_index="id",
             submission=(("test", "QQP.tsv"),), column="QQP", table_metric="f1"),
    GlueTask("qnli", "QNLI", "question", "sentence", "label", ("entailment", "not_entailment"),
             submission=(("test", "QNLI.tsv"),), column="QNLI"),
    GlueTask("sst-2", "SST-2", "sentence", None, "label", BINARY, index=None, submission=(("test", "SST-2.tsv"),),
             column="SST-2"),
    # CoLA's train/dev files have no header: source, label, the author's original mark, sentence.
    GlueTask("cola", "CoLA", "sentence", None, "label", BINARY, index=None, submission=(("test", "CoLA.tsv"),),
             headerless=("source", "label", "original_judgement", "sentence"), headline="matthews_correlation",
             column="CoLA", table_metric="matthews_correlation"),
    GlueTask("sts-b", "STS-B", "sentence1", "sentence2", "score", None, submission=(("test", "STS-B.tsv"),),
             headline="spearman", column="STS-B", table_metric="spearman"),
    GlueTask("mrpc", "MRPC", "#1 String", "#2 String", "Quality", BINARY, index=None,
             submission=(("test", "MRPC.tsv"),), column="MRPC", table_metric="f1"),
    GlueTask("rte", "RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment"),
             submission=(("test", "RTE.tsv"),), column="RTE"),
    GlueTask("wnli", "WNLI", "sentence1", "sentence2", "label", BINARY, submission=(("test", "WNLI.tsv"),)),
    # The diagnostic set: unlabelled, scored by the GLUE server from MNLI-model predictions.
    GlueTask("ax", "diagnostic", "sentence1", "sentence2", None, NLI_LABELS,
             files=(("test", "diagnostic.tsv"),), submission=(("test", "AX.tsv"),)),
)}

# The rows are in the paper's Table 1 order, the order `--task all` runs the labelled ones in (WNLI
# runs but has no column; AX has no training data).
TABLE_TASKS = tuple(t.name for t in GLUE_TASKS.values() if t.label is not None)

# The paper's GLUE protocol (§4.1): batch 32, 3 epochs, the learning rate chosen on dev among four.
PAPER_DEFAULTS = Defaults(learning_rates=(5e-5, 4e-5, 3e-5, 2e-5), epochs=(3,), batch_sizes=(32,), max_seq_length=128,
                          eval_batch_size=128, anchor="the paper's GLUE protocol (§4.1)")


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


class GlueFinetuning(Task):
    """GLUE: fine-tune on one task (or all of them) with the paper's protocol (paper §4.1, appendix A.3).

    One GLUE task's fine-tuning (the runner's interface, tasks/task.py): its row of GLUE_TASKS and
    the data folder; `bertkit finetune glue --task` names one task or several."""

    HEAD = BertForSequenceClassification
    defaults = PAPER_DEFAULTS

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        parser.add_argument("--task", required=True,
                            help="CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI (case-insensitive; sst2, stsb "
                                 "also accepted), a comma list, or 'all' (every task with train and dev files)")
        add_data_dir_argument(parser, "glue/<Task>/ or <Task>/")

    @classmethod
    def epilog(cls) -> str:
        return ("Defaults follow the paper: batch 32, 3 epochs, max length 128, and the learning rate chosen on dev "
                "among 5e-5, 4e-5, 3e-5, 2e-5 (four runs per task).")

    @classmethod
    def run_finetune(cls, args) -> int:
        check_finetune_output(args)
        finetune_glue(args.task, args.model, args.data_dir, args.output, settings=cls.settings_from_args(args))
        return 0

    @classmethod
    def benchmarks(cls) -> tuple:
        return tuple(_benchmark(GLUE_TASKS[name]) for name in TABLE_TASKS)

    def __init__(self, row: GlueTask, data_dir: Path):
        self.row, self.data_dir = row, data_dir
        self.name = self.label = self.output_subdir = row.folder
        self.metric = row.headline
        self.selection = "best dev " + ("matched accuracy" if row.name == "mnli" else _score_name(row.name))
        self.skip_bad_rows = False  # as read(): the submission's extra test files are read the same way

    def read(self, skip_bad_rows: bool) -> Splits:
        self.skip_bad_rows = skip_bad_rows
        train, dev, test = load_glue_task(self.row, self.data_dir, skip_bad_rows)
        if not dev:
            raise BertkitError("the dev file has no examples", path=dev.path)
        reported = {}
        for split, _ in self.row.reported:  # MNLI mismatched: reported, not used to select
            path = glue_file(self.row, self.data_dir, split)
            if path.is_file():
                reported[split] = read_glue_file(path, self.row, split, skip_bad_rows)
        labels = list(self.row.labels) if self.row.labels else "regression (similarity score 0-5)"
        return Splits(train, dev, test, reported=reported, details={"labels": labels})

    def encode(self, examples, tokenizer, max_seq_length: int) -> list[dict]:
        return glue_features(examples, tokenizer, self.row, max_seq_length)

    def head_config(self) -> dict:
        return glue_head(self.row)

    def predict(self, model, examples, features, runtime) -> list:
        return classification_predictions(self.row, self.logits(model, features, runtime))

    def score(self, predictions, examples, split: str) -> dict:
        scored_as = dict(self.row.reported).get(split)
        if scored_as is None:
            return evaluate_glue(self.row, predictions, examples)
        suffix = split.removeprefix("dev_")
        return {f"{k}_{suffix}": v for k, v in evaluate_glue(self.row, predictions, examples, scored_as).items()}

    def select(self, metrics: dict) -> float:
        return task_score(self.row.name, metrics)

    def prediction_text(self, prediction) -> str:
        return _label_text(self.row, prediction)

    def write_test(self, out: Path, model, splits: Splits, runtime) -> dict:
        return {"submission_files": write_submission(self.row, model, runtime.tokenizer, self.data_dir, out,
                                                     splits.test, runtime.max_seq_length, runtime.eval_batch_size,
                                                     runtime.precision, self.skip_bad_rows)}


def glue_head(row: GlueTask) -> dict:
    """config.json's head settings for a task: its labels, or one output for regression."""
    if row.is_regression:
        return dict(num_labels=1, id2label={0: "score"}, problem_type="regression")
    return dict(id2label=dict(enumerate(row.labels)), problem_type="single_label_classification")


def finetune_glue(task, model_dir, data_dir=None, output_dir=None, settings: RunSettings | None = None,
                  **options) -> TaskResult:
    """Fine-tune on one GLUE task with the paper's protocol; the TaskResult's document is results.json.

    Every (learning rate, epochs, batch size, seed) combination is one run; the best dev task score
    wins (MNLI: matched accuracy), as in the paper. `task` may also be 'all' or a list of tasks:
    see `finetune_glue_tasks`. With `output_dir`, writes OUTPUT/<Task>/ (results.json,
    dev_predictions.tsv, the GLUE submission files, model/, the best run's metrics.jsonl, and every
    run's in runs/<run>/). `settings`, or `options` (RunSettings fields): default the paper's GLUE grid.
    """
    if settings is not None and options:
        raise BertkitError("give settings= or run options, not both")
    settings = settings or RunSettings.paper(PAPER_DEFAULTS, **options)
    if isinstance(task, (list, tuple)) or str(task).lower() == "all" or "," in str(task):
        return finetune_glue_tasks(task, model_dir, data_dir, output_dir, settings)
    row = glue_task(task)
    if not row.label:
        raise BertkitError("AX has no training data: it is predicted with the MNLI model (--task mnli)")
    return runner.finetune(GlueFinetuning(row, resolve_data_dir(data_dir)), model_dir, output_dir, settings)


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


def finetune_glue_tasks(tasks, model_dir, data_dir=None, output_dir=None, settings: RunSettings | None = None,
                        **options) -> TaskResult:
    """Run `finetune_glue` for each task ('all': every task whose train and dev files exist, in the
    paper's Table 1 order) and build the paper-style table; with output_dir also writes
    OUTPUT/glue_table.md and OUTPUT/results.json. The result's headline is the GLUE score. `settings`,
    or `options` (RunSettings fields): default the paper's GLUE grid."""
    data_dir = resolve_data_dir(data_dir)
    if settings is not None and options:
        raise BertkitError("give settings= or run options, not both")
    settings = settings or RunSettings.paper(PAPER_DEFAULTS, **options)
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
        if settings.resume and finished.is_file():  # written last: the task's sweep and outputs are complete
            log.info(f"{spec.folder}: finished before ({finished}), kept")
            per_task[spec.folder] = json.loads(finished.read_text(encoding="utf-8"))
            continue
        per_task[spec.folder] = finetune_glue(spec.name, model_dir, data_dir, output_dir, settings).document
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


def glue_table(metrics_by_folder: dict[str, dict]) -> dict:
    """Dev metrics per task (keyed by folder name: 'MRPC') -> a Markdown table in the paper's Table 1
    layout (each row's `column` and `table_metric`: F1 for QQP and MRPC, Spearman for STS-B, Matthews
    correlation for CoLA, accuracy for the rest; MNLI matched/mismatched); missing tasks shown as '-'.
    Average = the GLUE score over the tasks run (bertkit.metrics.glue.glue_score: two-metric tasks
    averaged first, MNLI m/mm averaged, WNLI left out). The cells are percent, as the paper's table."""
    def pct(x):
        return f"{100 * x:.1f}"

    columns = [t for t in GLUE_TASKS.values() if t.column]
    cells = []
    for row in columns:
        m = metrics_by_folder.get(row.folder)
        if m is None:
            cells.append("-")
            continue
        cell = pct(m[row.table_metric])
        for split, _ in row.reported:  # MNLI: matched/mismatched
            extra = m.get(f"{row.table_metric}_{split.removeprefix('dev_')}")
            cell += "/" + (pct(extra) if extra is not None else "-")
        cells.append(cell)
    score_input = {}
    for folder, m in metrics_by_folder.items():
        task = glue_task(folder)
        score_input[task.name] = m
        for split, scored_as in task.reported:  # scored as a task of its own (MNLI-mm)
            suffix = "_" + split.removeprefix("dev_")
            if all(k + suffix in m for k in TASK_METRICS[scored_as]):
                score_input[scored_as] = {k: m[k + suffix] for k in TASK_METRICS[scored_as]}
    scored = [GLUE_TASKS[n].folder for n in TABLE_TASKS if n in score_input and n != "wnli"]
    score = glue_score(score_input) if scored else None
    header = "| System | " + " | ".join(t.column for t in columns) + " | Average |"
    rule = "|---|" + "---:|" * (len(columns) + 1)
    row = "| bertkit (dev) | " + " | ".join(cells) + f" | {pct(score) if score is not None else '-'} |"
    notes = [f"Average: GLUE score over {', '.join(scored) or 'no task'} (each task's metrics averaged first; "
             "MNLI matched and mismatched averaged; WNLI left out). Dev-set scores of the best run per task."]
    if "WNLI" in metrics_by_folder:
        notes.append(f"WNLI (not in the table or the average): accuracy {pct(metrics_by_folder['WNLI']['accuracy'])}.")
    return {"markdown": "\n".join([header, rule, row, ""] + notes), "glue_score": score, "glue_score_tasks": scored}


# ---------------------------------------------------------------- benchmarks


def run_benchmark(task: GlueTask, settings: BenchmarkSettings) -> TaskResult:
    """One GLUE task at a reproduction budget's settings (one batch size; the budget's grid)."""
    ft = settings.finetune
    return finetune_glue(task.name, str(settings.model_dir), str(settings.data_dir), str(settings.output_dir),
                         learning_rates=ft["learning_rates"], epochs=ft["epochs"], seeds=ft["seeds"],
                         batch_sizes=[ft["batch_size"]], max_seq_length=settings.max_seq_length(),
                         max_train_examples=settings.task.get("max_train_examples"),
                         subset_seed=settings.task.get("subset_seed", 0), precision=settings.precision)


def _benchmark(task: GlueTask) -> Benchmark:
    return Benchmark(name=task.name, label=task.folder, has_data=lambda data_dir: has_train_and_dev(task, data_dir),
                     run=lambda settings: run_benchmark(task, settings))

