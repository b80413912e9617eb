"""SWAG-style multiple choice: pick the ending that follows a context (paper §4.4, appendix A.3).

Each example becomes one `[CLS] context [SEP] ending_k [SEP]` sequence per ending, as in SWAG's
original set-up and transformers' run_swag: the context is `sent1`, the second segment is
`sent2 + " " + ending_k`. BertForMultipleChoice scores each pooled [CLS] with one vector V and takes
a softmax over the endings; the metric is accuracy. Training uses the same sweep protocol as GLUE
(grid x restarts, best dev accuracy wins); the paper's SWAG settings are lr 2e-5, batch 16, 3 epochs.

The task surface (tasks/common.py): read = `read_swag_file`, featurize = `multiple_choice_features`,
HEAD = BertForMultipleChoice, postprocess = `choices`, score = `accuracy`, finetune =
`finetune_multiple_choice` -> TaskResult. Benchmarks: the SWAG-format files under
DATA/multiple-choice/ (`MC_FILES`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import random
from pathlib import Path
from typing import Callable, Sequence

import torch

from .. import flags
from ..batching import predict_batches
from ..errors import BertkitError
from ..heads import BertForMultipleChoice
from ..hub import model_tokenizer
from ..metrics.glue import accuracy
from ..outputs import write_json
from .arguments import FINETUNE_DROPOUT, add_sweep_arguments, check_finetune_output, dropout_overrides, sweep_options
from .benchmarks import Benchmark, BenchmarkSettings
from .examples import BadRows, Examples, subsample
from .results import TaskResult, publish_best_metrics, results_document, write_predictions
from .runs import config_text, grid
from .sweep import predict_precision, run_protocol

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


def split_dev(examples: Examples, dev_fraction: float, seed: int = 0) -> tuple[Examples, Examples]:
    """Hold out a seeded random dev_fraction of a single file as dev (both parts keep file order)."""
    if not 0.0 < dev_fraction < 1.0:
        raise BertkitError(f"--dev-fraction must be between 0 and 1, not {dev_fraction}")
    n_dev = max(1, round(len(examples) * dev_fraction))
    if n_dev >= len(examples):
        raise BertkitError(f"{len(examples)} examples are too few to hold out {dev_fraction:.0%} as dev",
                           path=examples.path)
    dev_ids = set(random.Random(seed).sample(range(len(examples)), n_dev))
    train = Examples([e for i, e in enumerate(examples) if i not in dev_ids], examples.path, examples.skipped)
    dev = Examples([e for i, e in enumerate(examples) if i in dev_ids], examples.path)
    return train, dev


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


def finetune_multiple_choice(model_dir, train_file, dev_file=None, output_dir=None, test_file=None,
                             dev_fraction: float | None = None, split_seed: int = 0,
                             learning_rates=(2e-5,), epochs=(3,), batch_sizes=(16,), seeds=(42,),
                             max_seq_length: int = 128, max_train_examples: int | None = None,
                             precision: str = "auto", device: str = "auto", skip_bad_rows: bool = False,
                             eval_batch_size: int = 64, warmup_ratio: float = 0.1, weight_decay: float = 0.01,
                             dropout: float | None = FINETUNE_DROPOUT, logging_steps: int = 50, eval_steps: int = 0,
                             resume: bool = False, reader: Callable[..., Examples] = read_swag_file, task_name: str = "swag") -> TaskResult:
    """Fine-tune BertForMultipleChoice with the paper's protocol; the TaskResult's document is results.json.

    Without a dev file, `dev_fraction` of the train file (seeded by split_seed) is held out as dev.
    With output_dir: results.json, dev_predictions.tsv, test_predictions.tsv (when a test file is
    given), model/ (the best run, Hugging Face layout) and metrics.jsonl (the best run's; every
    run's in runs/<run>/). `reader(path, skip_bad_rows)` reads each file (default: SWAG's layout)."""
    train = reader(train_file, skip_bad_rows)
    if dev_file is not None:
        dev = reader(dev_file, skip_bad_rows)
    elif dev_fraction:
        train, dev = split_dev(train, dev_fraction, split_seed)
    else:
        raise BertkitError("no dev set: give a dev file or --dev-fraction to hold out part of the train file")
    for split in (train, dev):
        unlabelled = [e for e in split if e.label is None]
        if unlabelled:
            raise BertkitError("train and dev examples need a label", path=split.path, line=unlabelled[0].line)
    test = reader(test_file, skip_bad_rows) if test_file is not None else None

    tokenizer = model_tokenizer(model_dir)
    train_features = multiple_choice_features(subsample(train, max_train_examples), tokenizer, max_seq_length)
    dev_features = multiple_choice_features(dev, tokenizer, max_seq_length)
    gold = [e.label for e in dev]
    overrides = dropout_overrides(dropout)

    def build_model():
        return HEAD.from_pretrained(model_dir, **overrides)

    def choose(model, features) -> list[int]:
        logits = predict_batches(model, features, batch_size=eval_batch_size, pad_token_id=tokenizer.pad_token_id,
                                 precision=predict_precision(model, precision))["logits"]
        return choices(logits)

    def evaluate(model):
        predictions = choose(model, dev_features)
        return {"accuracy": accuracy(predictions, gold)}, {"dev": predictions}

    configs = grid(learning_rates, epochs, batch_sizes, seeds)
    name = Path(train_file).stem
    log.info(f"{name}: {len(train_features)} train / {len(dev_features)} dev examples "
             f"({len(train[0].endings)} endings each), {len(configs)} run(s), max length {max_seq_length}")
    skipped = {"train": len(train.skipped), "dev": len(dev.skipped), "test": len(test.skipped) if test else 0}
    if any(skipped.values()):
        log.warning(f"{name}: skipped malformed rows: {skipped}")
    runs_dir = None if output_dir is None else Path(output_dir) / "runs"
    best, runs = run_protocol(configs, build_model, train_features, evaluate, score=lambda m: m["accuracy"],
                              precision=precision, device=device, warmup_ratio=warmup_ratio,
                              weight_decay=weight_decay, pad_token_id=tokenizer.pad_token_id, label=name,
                              runs_dir=runs_dir, logging_steps=logging_steps, eval_steps=eval_steps, resume=resume,
                              identity={"model": str(model_dir), "max_seq_length": max_seq_length, "dropout": dropout,
                                        "dev_examples": len(dev_features)})
    results = results_document(task_name, best, runs, {
        "train_file": str(train_file), "dev_file": str(dev_file) if dev_file else None,
        "dev_fraction": None if dev_file else dev_fraction, "split_seed": None if dev_file else split_seed,
        "num_train_examples": len(train_features), "num_dev_examples": len(dev_features),
        "max_seq_length": max_seq_length, "skipped_rows": skipped, "selection": "best dev accuracy"})
    result = TaskResult(task=task_name, metric="accuracy", metrics=best.metrics,
                        run_metrics=[r.metrics for r in runs], document=results)
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        model, outputs = best.artifacts
        write_predictions(out / "dev_predictions.tsv", [e.index for e in dev], outputs["dev"])
        if test is not None:
            test_features = [{k: v for k, v in f.items() if k != "labels"}
                             for f in multiple_choice_features(test, tokenizer, max_seq_length)]
            write_predictions(out / "test_predictions.tsv", [e.index for e in test], choose(model, test_features))
            if all(e.label is not None for e in test):  # a labelled test file: score it too
                results["test_metrics"] = {"accuracy": accuracy(choose(model, test_features), [e.label for e in test])}
        model.save_pretrained(out / "model", tokenizer=tokenizer)
        publish_best_metrics(runs_dir, best, out)
        write_json(out / "results.json", results)
        result.output_dir, result.model_dir = str(out), str(out / "model")
        log.info(f"{name}: best {config_text(best.config)} dev accuracy {100 * best.score:.2f}; wrote {out}")
    return result


def choices(logits: Sequence[torch.Tensor]) -> list[int]:
    """Per example, the ending with the highest score."""
    return [int(v.argmax()) for v in logits]


def add_finetune_arguments(parser) -> None:
    parser.add_argument("--train-file", required=True, help="SWAG-style CSV (or JSON lines) with labels")
    parser.add_argument("--dev-file", default=None, help="labelled dev file; without it see --dev-fraction")
    parser.add_argument("--test-file", default=None, help="file to predict (labels optional)")
    parser.add_argument("--dev-fraction", type=flags.open_fraction, default=None,
                        help="hold out this fraction of the train file as dev when there is no dev file (e.g. 0.2)")
    parser.add_argument("--split-seed", type=flags.seed, default=0, help="seed of the --dev-fraction split (default 0)")
    add_sweep_arguments(parser, learning_rates="2e-5", batch_sizes="16", epochs="3")
    parser.epilog = "Defaults follow the paper's SWAG settings: lr 2e-5, batch 16, 3 epochs, max length 128."


def run_finetune(args) -> int:
    check_finetune_output(args)
    options = sweep_options(args)
    finetune_multiple_choice(args.model, args.train_file, args.dev_file, args.output, test_file=args.test_file,
                             dev_fraction=args.dev_fraction, split_seed=args.split_seed, **options)
    return 0


# ---------------------------------------------------------------- the task surface and its benchmarks

HEAD = BertForMultipleChoice
read = read_swag_file
featurize = multiple_choice_features
postprocess = choices
score = accuracy
finetune = finetune_multiple_choice

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


BENCHMARKS = tuple(_benchmark(name) for name in MC_FILES)
