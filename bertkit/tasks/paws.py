"""PAWS paraphrase identification: do two sentences with the same words mean the same?

PAWS (Zhang, Baldridge and He 2019, "PAWS: Paraphrase Adversaries from Word Scrambling") ships
TSV files with a header row `id  sentence1  sentence2  label` (label 1: paraphrase) as
DATA/paws/{train,dev,test}.tsv (PAWS-Wiki's names: dev_2k.tsv / test.tsv also read). It is a
sentence-pair task like MRPC, so it takes the paper's GLUE protocol (§4.1) and MRPC's metrics
(accuracy and F1 of the paraphrase class, selection on their mean).

This file is the whole task (the runner, tasks/runner.py, does the sweep, selection, resume and
outputs): a reader and the task class (tasks/task.py's interface, its command line included).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import BertkitError
from ..heads import BertForSequenceClassification
from ..metrics.glue import compute_glue_metrics, task_score
from . import runner
from .arguments import add_data_dir_argument
from .examples import BadRows, Examples, resolve_data_dir
from .glue import PAPER_DEFAULTS, GlueExample, read_tsv_lines
from .results import TaskResult
from .settings import RunSettings
from .splits import Splits
from .task import Task

COLUMNS = ("id", "sentence1", "sentence2", "label")
FILES = {"train": ("train.tsv",), "dev": ("dev.tsv", "dev_2k.tsv"), "test": ("test.tsv",)}


def read_paws_file(path: str | Path, skip_bad_rows: bool = False) -> Examples:
    """One PAWS TSV file: a header naming id, sentence1, sentence2, label (0 or 1) in any order."""
    path = Path(path)
    lines = read_tsv_lines(path)
    if not lines:
        raise BertkitError("empty file: expected a header row", path=str(path))
    header = lines[0][1].split("\t")
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise BertkitError(f"PAWS file lacks column(s) {', '.join(missing)}; its header is {header}", path=str(path),
                           line=1)
    col = {c: header.index(c) for c in COLUMNS}
    bad, examples = BadRows(path, skip_bad_rows), []
    for line, text in lines[1:]:
        fields = text.split("\t")
        if len(fields) != len(header):
            bad(line, f"expected {len(header)} tab-separated fields, found {len(fields)}")
        elif fields[col["label"]] not in ("0", "1"):
            bad(line, f"label {fields[col['label']]!r} is not 0 or 1")
        else:
            examples.append(GlueExample(index=fields[col["id"]], text_a=fields[col["sentence1"]],
                                        text_b=fields[col["sentence2"]], label=int(fields[col["label"]]), line=line))
    return Examples(examples, path=path, skipped=bad.skipped)


def paws_features(examples, tokenizer, max_seq_length: int = 128) -> list[dict]:
    """`[CLS] sentence1 [SEP] sentence2 [SEP]`, truncated to max_seq_length pieces, with the label."""
    encoded = tokenizer.encode_batch([e.text_a for e in examples], [e.text_b for e in examples],
                                     max_length=max_seq_length, truncation=True) if examples else []
    return [{"input_ids": list(enc["input_ids"]), "token_type_ids": list(enc["token_type_ids"]),
             "attention_mask": list(enc["attention_mask"]), "labels": e.label} for e, enc in zip(examples, encoded)]


def paws_metrics(predictions, examples) -> dict:
    """MRPC's: accuracy and F1 of the paraphrase class (fractions)."""
    return compute_glue_metrics("mrpc", predictions, [e.label for e in examples])


def paws_file(data_dir: Path, split: str) -> Path | None:
    folder = data_dir / "paws" if (data_dir / "paws").is_dir() else data_dir
    return next((folder / name for name in FILES[split] if (folder / name).is_file()), None)


class Paws(Task):
    """PAWS paraphrase identification: do two sentences with the same words mean the same?"""

    name = label = "paws"
    HEAD = BertForSequenceClassification
    metric = "accuracy"  # the PAWS paper's
    selection = "best dev accuracy and f1 (mean)"
    defaults = PAPER_DEFAULTS

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        add_data_dir_argument(parser, "paws/{train,dev,test}.tsv or {train,dev,test}.tsv")

    @classmethod
    def epilog(cls) -> str:
        return "Defaults follow the paper's GLUE protocol (§4.1), as for MRPC."

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "Paws":
        return cls(resolve_data_dir(args.data_dir))

    def read(self, skip_bad_rows: bool) -> Splits:
        paths = {split: paws_file(self.data_dir, split) for split in FILES}
        if paths["train"] is None:
            raise BertkitError("no PAWS train.tsv under the data directory (or its paws/ folder)",
                               path=str(self.data_dir))
        read = {split: None if path is None else read_paws_file(path, skip_bad_rows) for split, path in paths.items()}
        return Splits(read["train"], read["dev"], read["test"], details={"labels": ["0", "1"]})

    def encode(self, examples, tokenizer, max_seq_length: int) -> list[dict]:
        return paws_features(examples, tokenizer, max_seq_length)

    def head_config(self) -> dict:
        return dict(id2label={0: "0", 1: "1"}, problem_type="single_label_classification")

    def predict(self, model, examples, features, runtime) -> list:
        return [int(v.argmax()) for v in self.logits(model, features, runtime)]

    def score(self, predictions, examples, split: str) -> dict:
        return paws_metrics(predictions, examples)

    def select(self, metrics: dict) -> float:
        return task_score("mrpc", metrics)


def finetune_paws(model_dir, data_dir=None, output_dir=None, **options) -> TaskResult:
    """Fine-tune on PAWS with the paper's GLUE protocol (`options`: RunSettings fields)."""
    task = Paws(resolve_data_dir(data_dir))
    return runner.finetune(task, model_dir, output_dir, RunSettings.paper(PAPER_DEFAULTS, **options))
