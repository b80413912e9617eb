"""SWAG-style multiple choice: pick the ending that follows a context (paper §4.4, appendix A.3).

Each example becomes one `[CLS] context [SEP] ending_k [SEP]` sequence per ending, as in SWAG's
original set-up and transformers' run_swag: the context is `sent1`, the second segment is
`sent2 + " " + ending_k`. BertForMultipleChoice scores each pooled [CLS] with one vector V and takes
a softmax over the endings; the metric is accuracy. Training uses the same sweep protocol as GLUE
(grid x restarts, best dev accuracy wins); the paper's SWAG settings are lr 2e-5, batch 16, 3 epochs.

The task class (tasks/task.py) is `MultipleChoiceTask`, also the `bertkit finetune swag` command;
its benchmarks are the SWAG-format files under DATA/multiple-choice/ (`MC_FILES`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..errors import BertkitError
from ..heads import BertForMultipleChoice
from ..metrics.glue import accuracy
from . import runner
from .benchmarks import Benchmark, BenchmarkSettings
from .examples import BadRows, Examples
from .results import TaskResult
from .settings import Defaults, RunSettings
from .splits import Splits
from .task import Task

log = logging.getLogger("bertkit")

ENDING_PREFIX = "ending"


@dataclasses.dataclass
class MultipleChoiceExample:
    index: str  # SWAG's unnamed first column (or the row number)
    context: str  # sent1
    start: str  # sent2: the first words of the ending, shared by every choice
    endings: list[str]
    label: int | None  # index of the right ending; None in unlabelled (test) files
    line: int = 0


def read_utf8(path: Path) -> str:
    """The file's text (a leading BOM dropped); invalid UTF-8 is reported with its line number."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise BertkitError(f"not valid UTF-8 ({e.reason})", path=str(path), line=line) from None


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone accepts '²', which int() refuses


def _records(path: Path):
    """(line number, {column: value}) per record, or (line, None, field count) when a CSV record has
    the wrong number of fields. Reads a real CSV (quoted fields may hold commas and line breaks) or,
    for .json/.jsonl, one JSON object per line."""
    text = read_utf8(path)
    if path.suffix in (".json", ".jsonl"):
        for number, text in enumerate(text.split("\n"), start=1):
            if text.strip():
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as e:
                    raise BertkitError(f"not a JSON object per line ({e.msg})", path=str(path), line=number) from None
                if not isinstance(row, dict):
                    raise BertkitError("not a JSON object per line", path=str(path), line=number)
                yield number, {k: (v if isinstance(v, str) else str(v)) for k, v in row.items()}, None
        return
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                raise BertkitError("empty file: expected a header row", path=str(path))
            start = reader.line_num + 1
            for fields in reader:
                if any(v.strip() for v in fields):
                    if len(fields) == len(header):
                        yield start, dict(zip(header, fields)), None
                    else:
                        yield start, dict.fromkeys(header), f"expected {len(header)} comma-separated fields, found {len(fields)}"
                start = reader.line_num + 1
        except csv.Error as e:
            raise BertkitError(f"malformed CSV ({e})", path=str(path), line=reader.line_num) from None


def read_swag_file(path: str | Path, skip_bad_rows: bool = False) -> Examples:
    """Read SWAG's CSV (`video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0..3, label`;
    CODAH and HellaSwag converted to those columns) or the same fields as JSON lines. The number of
    endings is however many `endingK` columns there are; `label` is optional (test files)."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError("file not found", path=str(path))
    bad = BadRows(path, skip_bad_rows)
    examples, endings = [], None
    for row_number, (line, row, problem) in enumerate(_records(path)):
        if endings is None:
            endings = sorted((c for c in row if c.startswith(ENDING_PREFIX) and _is_number(c[len(ENDING_PREFIX):])),
                             key=lambda c: int(c[len(ENDING_PREFIX):]))
            if "sent1" not in row or "sent2" not in row or len(endings) < 2:
                raise BertkitError(f"not a SWAG-style file: needs sent1, sent2 and ending0, ending1, ... columns; "
                                   f"found {list(row)}", path=str(path), line=1)
        if problem is None and any(row.get(c) is None for c in ["sent1", "sent2"] + endings):
            problem = f"missing field(s): {', '.join(c for c in ['sent1', 'sent2'] + endings if row.get(c) is None)}"
        if problem is not None:
            bad(line, problem)
            continue
        label = None
        raw = (row.get("label") or "").strip()
        if raw != "":
            if not _is_number(raw) or not 0 <= int(raw) < len(endings):
                bad(line, f"label {raw!r} is not an ending number 0..{len(endings) - 1}")
                continue
            label = int(raw)
        index = row.get("") or row.get("id") or str(row_number)
        examples.append(MultipleChoiceExample(index=index, context=row["sent1"], start=row["sent2"],
                                              endings=[row[c] for c in endings], label=label, line=line))
    if not examples and not bad.skipped:
        raise BertkitError("no examples", path=str(path))
    return Examples(examples, path=path, skipped=bad.skipped)


def multiple_choice_features(examples: Sequence[MultipleChoiceExample], tokenizer,
                             max_seq_length: int = 128) -> list[dict]:
    """Per example, C sequences `[CLS] sent1 [SEP] sent2 ending_k [SEP]` (lists of C lists per key)."""
    if not examples:
        return []
    firsts, seconds, sizes = [], [], []
    for e in examples:
        for ending in e.endings:
            firsts.append(e.context)
            seconds.append(f"{e.start} {ending}".strip())
        sizes.append(len(e.endings))
    encoded = tokenizer.encode_batch(firsts, seconds, max_length=max_seq_length, truncation=True)
    features, at = [], 0
    for e, size in zip(examples, sizes):
        choices = encoded[at:at + size]
        at += size
        feature = {key: [list(c[key]) for c in choices] for key in ("input_ids", "token_type_ids", "attention_mask")}
        if e.label is not None:
            feature["labels"] = e.label
        features.append(feature)
    return features


# The paper's SWAG settings (§4.4): lr 2e-5, batch 16, 3 epochs (one run; no grid is given for SWAG).
PAPER_DEFAULTS = Defaults(learning_rates=(2e-5,), epochs=(3,), batch_sizes=(16,), max_seq_length=128,
                          eval_batch_size=64, anchor="the paper's SWAG settings (§4.4)")


class MultipleChoiceTask(Task):
    """SWAG-style multiple choice: pick the ending that follows a context (paper §4.4, appendix A.3).

    From files read by `reader(path, skip_bad_rows)` (default: SWAG's layout)."""

    HEAD = BertForMultipleChoice
    defaults = PAPER_DEFAULTS
    metric = "accuracy"
    selection = "best dev accuracy"
    skipped_settings = ()  # --dev-fraction: the benchmarks' files have no dev split

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        parser.add_argument("--train-file", required=True, help="SWAG-style CSV (or JSON lines) with labels")
        parser.add_argument("--dev-file", default=None, help="labelled dev file; without it see --dev-fraction")
        parser.add_argument("--test-file", default=None, help="file to predict (labels optional)")

    @classmethod
    def epilog(cls) -> str:
        return "Defaults follow the paper's SWAG settings: lr 2e-5, batch 16, 3 epochs, max length 128."

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "MultipleChoiceTask":
        return cls(args.train_file, args.dev_file, args.test_file)

    @classmethod
    def benchmarks(cls) -> tuple:
        return tuple(_benchmark(name) for name in MC_FILES)

    def __init__(self, train_file, dev_file=None, test_file=None, reader: Callable[..., Examples] = read_swag_file,
                 task_name: str = "swag", requires_dev: bool = True):
        self.files = {"train": train_file, "dev": dev_file, "test": test_file}
        self.reader, self.name, self.label = reader, task_name, Path(train_file).stem
        self.requires_dev = requires_dev  # the SWAG protocol selects on dev; own files may have none

    def read(self, skip_bad_rows: bool) -> Splits:
        train = self.reader(self.files["train"], skip_bad_rows)
        dev = None if self.files["dev"] is None else self.reader(self.files["dev"], skip_bad_rows)
        test = None if self.files["test"] is None else self.reader(self.files["test"], skip_bad_rows)
        for split in (train, dev):
            unlabelled = [] if split is None else [e for e in split if e.label is None]
            if unlabelled:
                raise BertkitError("train and dev examples need a label", path=split.path, line=unlabelled[0].line)
        return Splits(train, dev, test, details={"train_file": str(self.files["train"]),
                                                 "dev_file": None if dev is None else str(self.files["dev"]),
                                                 "dev_fraction": None, "split_seed": None})

    def encode(self, examples, tokenizer, max_seq_length: int) -> list[dict]:
        return multiple_choice_features(examples, tokenizer, max_seq_length)

    def predict(self, model, examples, features, runtime) -> list:
        return choices(self.logits(model, features, runtime))

    def score(self, predictions, examples, split: str) -> dict:
        return {"accuracy": accuracy(predictions, [e.label for e in examples])}

    def describe(self, splits: Splits, train_features) -> str:
        return f"{super().describe(splits, train_features)} ({len(splits.train[0].endings)} endings each)"

    def identity(self, splits: Splits) -> dict:
        return {"dev_examples": 0 if splits.dev is None else len(splits.dev)}


def finetune_multiple_choice(model_dir, train_file, dev_file=None, output_dir=None, test_file=None,
                             reader: Callable[..., Examples] = read_swag_file, **options) -> TaskResult:
    """Fine-tune BertForMultipleChoice with the paper's protocol; the TaskResult's document is results.json.

    Without a dev file, `dev_fraction` of the train file (seeded by split_seed) is held out as dev
    With output_dir: results.json, dev_predictions.tsv, test_predictions.tsv (when a test file is
    given), model/ (the best run, Hugging Face layout) and metrics.jsonl (the best run's; every
    run's in runs/<run>/). `reader(path, skip_bad_rows)` reads each file (default: SWAG's layout);
    `options` are RunSettings fields (default: the paper's SWAG settings)."""
    task = MultipleChoiceTask(train_file, dev_file, test_file, reader)
    return runner.finetune(task, model_dir, output_dir, RunSettings.paper(PAPER_DEFAULTS, **options))


def choices(logits: Sequence[torch.Tensor]) -> list[int]:
    """Per example, the ending with the highest score."""
    return [int(v.argmax()) for v in logits]


# ---------------------------------------------------------------- benchmarks

# Benchmark -> its file under the data folder (no dev file: a seeded fraction of it is held out)
MC_FILES = {"codah": "multiple-choice/codah.csv", "hellaswag": "multiple-choice/hellaswag_val.csv",
            "swag": "multiple-choice/swag_train.csv"}


def run_benchmark(name: str, settings: BenchmarkSettings) -> TaskResult:
    ft, cfg = settings.finetune, settings.task
    result = finetune_multiple_choice(
        str(settings.model_dir), str(settings.data_dir / MC_FILES[name]), output_dir=str(settings.output_dir),
        dev_fraction=cfg.get("dev_fraction", 0.2), batch_sizes=[cfg.get("batch_size", 16)],
        max_seq_length=settings.max_seq_length(), max_train_examples=cfg.get("max_train_examples"),
        learning_rates=ft["learning_rates"], epochs=ft["epochs"], seeds=ft["seeds"], precision=settings.precision)
    return dataclasses.replace(result, task=name)


def _benchmark(name: str) -> Benchmark:
    label = {"hellaswag": "HellaSwag"}.get(name, name.upper())
    return Benchmark(name=name, label=label, has_data=lambda data_dir: (data_dir / MC_FILES[name]).is_file(),
                     run=lambda settings: run_benchmark(name, settings))

