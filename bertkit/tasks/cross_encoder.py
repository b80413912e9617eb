"""Reranker (cross-encoder) fine-tuning on your own files: `bertkit finetune cross-encoder`.

A cross-encoder reads a query and a passage together (`[CLS] query [SEP] passage [SEP]`, the
paper's sentence-pair input, §4.1) and gives one logit, their relevance: BERT as Nogueira and Cho
(2019) rerank with it, and what sentence-transformers' CrossEncoder trains. The data, as its users
keep it:

- (query, passage) pairs with a label, CSV / TSV / JSON lines (tasks/user_files.py's readers): the
  text columns by flag, else the first two text columns in file order (sentence-transformers'
  rule), the label in `label` or `score`: 0/1 or a graded relevance;
- a query with its passages, JSON lines: {"query", "positive": [...], "negative": [...]} (a string
  for one), or {"query", "passages": [...], "labels": [...]}.

Losses (cross_encoder_losses.py): `bce` (BinaryCrossEntropyLoss, the default) trains on pairs;
`listnet` (ListNetLoss) puts each query's passages in one softmax and `lambda` (LambdaLoss,
NDCG-Loss2++ weights) weighs each pair of them by its effect on nDCG (pair rows of one query are
grouped). Dev is scored per query over its candidates (MRR@10, nDCG@10, MAP: metrics/retrieval.py;
the best run by nDCG@10, sentence-transformers' reranking evaluator's choice), or, when every dev
query has one passage, as pair classification (accuracy, F1 at probability 0.5, selected on F1).

OUTPUT/model is a BertForSequenceClassification with one logit whose config.json carries
sentence-transformers' `sentence_transformers.activation_fn` (Sigmoid): sentence-transformers'
CrossEncoder, transformers and `bertkit serve` (/rerank) load it with the same scores. The runner
(tasks/runner.py) does the rest as for every task: --dev-file / --dev-fraction, grids, --resume,
early stopping, results.json, metrics.jsonl for `bertkit plot`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Sequence

from .. import flags
from ..config import BertConfig
from ..errors import BertkitError
from ..hub.resolve import resolve_model
from ..metrics.retrieval import reranking_scores, retrieval_scores, scored_query_count
from . import runner
from .cross_encoder_losses import LOSSES, PADDED, CrossEncoderTraining, RankingLoss
from .examples import BadRows, Examples
from .glue import GlueExample, GlueTask, glue_features
from .results import TaskResult
from .settings import Defaults, RunSettings
from .splits import Splits
from .task import Task
from .user_files import label_value, read_table, read_text_file, table_format, text_problem, text_value

log = logging.getLogger("bertkit")

# sentence-transformers' CrossEncoder training recipe (its v4+ training examples and the former
# CrossEncoder.fit): learning rate 2e-5, warm-up over 10% of the steps, one epoch; `--grid paper`
# sweeps the paper's fine-tuning rates (appendix A.3) and batch sizes at that epoch count.
CROSS_ENCODER_DEFAULTS = Defaults(learning_rates=(5e-5, 3e-5, 2e-5), learning_rate=2e-5, epochs=(1,),
                                  batch_sizes=(16, 32), max_seq_length=512, eval_batch_size=64,
                                  anchor="the paper's fine-tuning grid (appendix A.3) at sentence-transformers' "
                                         "one epoch")
LABEL_NAMES = ("label", "score")  # sentence-transformers' label column names
LIST_FIELDS = ("positive", "negative", "passages")


@dataclasses.dataclass
class RankingExample:
    """One query with its candidate passages and their labels (a pair file's rows of one query)."""

    index: str
    query: str
    passages: list[str]
    labels: list[float]
    lines: list[int]  # each passage's line in the file, for messages

    @property
    def line(self) -> int:
        return self.lines[0]


# ---------------------------------------------------------------- reading


def _first_row(path: Path, fmt: str) -> tuple[list[str] | None, dict | None]:
    """The header (CSV / TSV) and the first well-formed row, to find the columns and the layout."""
    header, rows = read_table(path, BadRows(path, True), fmt)
    return header, next((row for _, row in rows), None)


def _number(raw, what: str) -> tuple[float | None, str | None]:
    text = label_value(raw)
    if text is None:
        return None, f"no {what}"
    try:
        value = float(text)
    except ValueError:
        return None, f"{what} {text!r} is not a number"
    return (value, None) if math.isfinite(value) else (None, f"{what} {text!r} is not a finite number")


def read_ranking_file(path: str | Path, query_column: str | None = None, passage_column: str | None = None,
                      label_column: str | None = None, skip_bad_rows: bool = False,
                      fmt: str | None = None) -> tuple[Examples, dict]:
    """A training or dev file as RankingExamples (pair rows of one query merged, in file order) and
    what was read: {"layout": "pairs" | "lists", "columns": {...}}. Problems are FILE:LINE errors."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError("file not found", path=str(path))
    fmt = table_format(path, fmt)
    header, first = _first_row(path, fmt)
    if header is None and first is None:
        raise BertkitError("no examples: expected one JSON object per line", path=str(path))
    if fmt == "jsonl" and first is not None and any(isinstance(first.get(f), list) for f in LIST_FIELDS):
        return _read_lists(path, query_column or "query", skip_bad_rows), {
            "layout": "lists", "columns": {"query": query_column or "query"}}
    columns = _pair_columns(path, header, first, query_column, passage_column, label_column)
    pairs = read_text_file(path, text_column=columns["query"], text_pair_column=columns["passage"],
                           label_column=columns["label"], skip_bad_rows=skip_bad_rows, fmt=fmt)
    bad = BadRows(path, skip_bad_rows)
    groups: dict[str, RankingExample] = {}
    for pair in pairs:
        value, problem = _number(pair.label, f"label in {columns['label']!r}")
        if problem:
            bad(pair.line, problem)
            continue
        group = groups.setdefault(pair.text_a, RankingExample(str(pair.line), pair.text_a, [], [], []))
        group.passages.append(pair.text_b)
        group.labels.append(value)
        group.lines.append(pair.line)
    if not groups and not pairs.skipped and not bad.skipped:
        raise BertkitError("no examples", path=str(path))
    return Examples(groups.values(), path, list(pairs.skipped) + bad.skipped), {"layout": "pairs", "columns": columns}


def _pair_columns(path: Path, header, first, query: str | None, passage: str | None, label: str | None) -> dict:
    """The query, passage and label columns: as flagged, else sentence-transformers' defaults (the
    label is `label` or `score`; the texts are the first two other columns, of text in JSON lines)."""
    names = header if header is not None else list(first or {})
    if label is None:
        label = next((n for n in LABEL_NAMES if n in names), None)
        if label is None:
            raise BertkitError(f"no label column: name it with --label-column (looked for "
                               f"{' or '.join(map(repr, LABEL_NAMES))}); the columns are {', '.join(names)}",
                               path=str(path), line=1)
    texts = [n for n in names if n not in (label, query, passage)
             and (header is not None or isinstance((first or {}).get(n), str))]
    query = query or (texts.pop(0) if texts else None)
    passage = passage or (texts.pop(0) if texts else None)
    if query is None or passage is None:
        raise BertkitError(f"need a query and a passage column besides the label {label!r} (--query-column, "
                           f"--passage-column); the columns are {', '.join(names)}", path=str(path), line=1)
    return {"query": query, "passage": passage, "label": label}


def _read_lists(path: Path, query_field: str, skip_bad_rows: bool) -> Examples:
    """JSON lines of {"query", "positive", "negative"} (label 1 / 0) or {"query", "passages", "labels"}."""
    bad = BadRows(path, skip_bad_rows)
    _, rows = read_table(path, bad, "jsonl")
    examples = []
    for line, row in rows:
        query = text_value(row, query_field)
        passages, labels, problem = _listed(row)
        if query is None:
            problem = text_problem(row, query_field)
        if problem is not None:
            bad(line, problem)
            continue
        examples.append(RankingExample(str(line), query, passages, labels, [line] * len(passages)))
    if not examples and not bad.skipped:
        raise BertkitError("no examples", path=str(path))
    return Examples(examples, path, bad.skipped)


def _listed(row: dict) -> tuple[list[str], list[float], str | None]:
    def texts(field):
        value = row.get(field, [])
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            return None
        return value

    if "passages" in row:
        passages, labels = texts("passages"), row.get("labels")
        if not passages:
            return [], [], "'passages' must be a non-empty list of non-empty strings"
        if not isinstance(labels, list) or len(labels) != len(passages):
            return [], [], f"'labels' must be a list of {len(passages)} numbers, one per passage"
        values = []
        for raw in labels:
            value, problem = _number(raw, "label")
            if problem:
                return [], [], problem
            values.append(value)
        return passages, values, None
    positive, negative = texts("positive"), texts("negative")
    if positive is None or negative is None:
        return [], [], "'positive' and 'negative' must be strings or lists of non-empty strings"
    if not positive and not negative:
        return [], [], "no passages: give 'positive' / 'negative' (or 'passages' with 'labels')"
    return positive + negative, [1.0] * len(positive) + [0.0] * len(negative), None


def check_labels(examples: Examples, loss: RankingLoss, skip_bad_rows: bool) -> Examples:
    """Every label in the loss's range (bce: [0, 1]; listnet, lambda: >= 0). A label outside it is a bad row:
    its pair (a pair file), or its query's whole line (a query list)."""
    bad = BadRows(Path(examples.path), skip_bad_rows)
    wrong = set()
    for example in examples:
        for value, line in zip(example.labels, example.lines):
            if line not in wrong and (value < 0 or (loss.max_label is not None and value > loss.max_label)):
                bad(line, f"label {value:g} is not {loss.labels} (--loss {loss.name})")
                wrong.add(line)
    kept = []
    for example in examples:
        keep = [i for i, line in enumerate(example.lines) if line not in wrong]
        if keep:
            kept.append(dataclasses.replace(example, passages=[example.passages[i] for i in keep],
                                            labels=[example.labels[i] for i in keep],
                                            lines=[example.lines[i] for i in keep]))
    return Examples(kept, examples.path, list(examples.skipped) + bad.skipped)


# ---------------------------------------------------------------- features

PAIR_SPEC = GlueTask(name="cross-encoder", folder="", text_a="query", text_b="passage", label="label", labels=None)


def pair_features(examples: Sequence[RankingExample], tokenizer, max_seq_length: int) -> list[dict]:
    """`[CLS] query [SEP] passage [SEP]` per candidate (glue_features' pairs), the label a float."""
    pairs = [GlueExample(index=e.index, text_a=e.query, text_b=p, label=label)
             for e in examples for p, label in zip(e.passages, e.labels)]
    return glue_features(pairs, tokenizer, PAIR_SPEC, max_seq_length)


def group_features(examples: Sequence[RankingExample], tokenizer, max_seq_length: int) -> list[dict]:
    """One feature per query: its candidates' sequences, padded to the most candidates of any query
    (a one-token stand-in, label PADDED, that the model never runs), so that batches stack."""
    flat = iter(pair_features(examples, tokenizer, max_seq_length))
    width = max(len(e.passages) for e in examples) if examples else 0
    stand_in = {"input_ids": [tokenizer.pad_token_id], "token_type_ids": [0], "attention_mask": [1]}
    features = []
    for example in examples:
        rows = [next(flat) for _ in example.passages]
        rows += [dict(stand_in, labels=PADDED)] * (width - len(rows))
        features.append({key: [row[key] for row in rows] for key in ("input_ids", "token_type_ids",
                                                                       "attention_mask", "labels")})
    return features


# ---------------------------------------------------------------- dev scores


def group_scores(logits: Sequence, examples: Sequence[RankingExample]) -> list[list[float]]:
    """The pair logits (one per candidate, in pair_features' order) as each query's list of scores."""
    flat = iter(float(v.reshape(-1)[0]) for v in logits)
    return [[next(flat) for _ in e.passages] for e in examples]


def relevance(label: float) -> int:
    """A label as a qrels grade: whole numbers as they are (0-3 grades), a fraction (a graded [0, 1]
    label) relevant from 0.5 on."""
    return int(label) if float(label).is_integer() else int(label >= 0.5)


def reranking_metrics(scores: Sequence[Sequence[float]], examples: Sequence[RankingExample]) -> dict:
    """MRR@10, nDCG@10, MAP (fractions), each query ranking its own candidates by score: with 0/1
    labels as sentence-transformers' CrossEncoderRerankingEvaluator (queries with no positive or no
    negative skipped), with graded labels as trec_eval (graded nDCG; queries with no relevant
    candidate skipped)."""
    grades = [[relevance(v) for v in e.labels] for e in examples]
    if all(g in (0, 1) for row in grades for g in row):
        samples = [([s for s, g in zip(row, gs) if g], [s for s, g in zip(row, gs) if not g])
                   for row, gs in zip(scores, grades)]
        found = reranking_scores(samples, at_k=10)
    else:
        qrels = {str(i): {str(j): g for j, g in enumerate(gs)} for i, gs in enumerate(grades)}
        run = {str(i): {str(j): float(s) for j, s in enumerate(row)} for i, row in enumerate(scores)}
        if not scored_query_count(qrels):
            raise BertkitError("no dev query has a relevant passage: nothing to rank", path=examples.path)
        found = retrieval_scores(run, qrels, k_values=(10,))
    return {"mrr@10": found["mrr@10"], "ndcg@10": found["ndcg@10"], "map": found["map"]}


def pair_metrics(scores: Sequence[Sequence[float]], examples: Sequence[RankingExample]) -> dict:
    """Accuracy and F1 of the relevant class: relevant when the probability (sigmoid of the logit)
    is at least 0.5, gold relevant when the label is (or is at least 0.5)."""
    from sklearn.metrics import f1_score  # imported on use, as in metrics/glue.py

    predicted = [int(s >= 0.0) for row in scores for s in row]
    gold = [int(relevance(v) > 0) for e in examples for v in e.labels]
    return {"accuracy": sum(p == g for p, g in zip(predicted, gold)) / len(gold),
            "f1": float(f1_score(gold, predicted, zero_division=0))}


# ---------------------------------------------------------------- the task

HEADED = ("BertForSequenceClassification", "BertForTokenClassification", "BertForMultipleChoice")  # a `classifier`


class CrossEncoderTask(Task):
    """a reranker (cross-encoder) on your own (query, passage) pairs or query lists

    (the runner's interface; the command line is `bertkit finetune cross-encoder`)."""

    name = "cross-encoder"
    HEAD = CrossEncoderTraining
    defaults = CROSS_ENCODER_DEFAULTS
    own_data, skipped_settings = True, ()

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        parser.add_argument("--train-file", required=True,
                            help="(query, passage, label) rows as CSV, TSV or JSON lines, or JSON lines of "
                                 '{"query", "positive": [...], "negative": [...]} or {"query", "passages": [...], '
                                 '"labels": [...]}')
        parser.add_argument("--dev-file", default=None,
                            help="dev data, either layout: each query's candidates are ranked and scored, the "
                                 "best run kept (without it: --dev-fraction, or one run saved without selection)")
        parser.add_argument("--loss", choices=tuple(LOSSES), default="bce",
                            help="bce: binary cross-entropy on each pair (sentence-transformers' "
                                 "BinaryCrossEntropyLoss; labels 0/1 or in [0, 1]); listnet: each query's passages "
                                 "in one softmax (ListNetLoss); lambda: LambdaLoss with NDCG-Loss2++ weights over each "
                                 "query's passage pairs (listnet and lambda: labels any grades >= 0). Default bce")
        parser.add_argument("--pos-weight", type=flags.positive_float, default=None,
                            help="bce: weight of the positive pairs' term (e.g. the negatives per positive)")
        parser.add_argument("--query-column", default=None,
                            help="column (JSON lines: field) holding the query (default: the first text column; "
                                 "query lists: query)")
        parser.add_argument("--passage-column", default=None,
                            help="column holding the passage (default: the second text column)")
        parser.add_argument("--label-column", default=None,
                            help="column holding the label (default: label, else score)")
        parser.add_argument("--format", dest="file_format", choices=("csv", "tsv", "jsonl"), default=None,
                            help="file format (default: from the extension: .csv, .tsv, .jsonl)")

    @classmethod
    def epilog(cls) -> str:
        d = cls.defaults
        return (f"One run by default, as sentence-transformers' CrossEncoder training examples: learning "
                f"rate {d.single_learning_rate:g}, batch {d.single_batch_size} (pairs; listnet, lambda: "
                f"queries), {d.single_epochs:g} epoch, warm-up 10% of the steps, max length {d.max_seq_length}; "
                f"--grid paper runs {d.anchor}; comma lists make any grid, best on dev wins.")

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "CrossEncoderTask":
        return cls(args.train_file, args.dev_file, loss=args.loss, pos_weight=args.pos_weight,
                   query_column=args.query_column, passage_column=args.passage_column,
                   label_column=args.label_column, file_format=args.file_format)

    def __init__(self, train_file, dev_file=None, *, loss: str = "bce", pos_weight: float | None = None,
                 query_column: str | None = None, passage_column: str | None = None,
                 label_column: str | None = None, file_format: str | None = None):
        if loss not in LOSSES:
            raise BertkitError(f"unknown loss {loss!r}; choose from {', '.join(LOSSES)}")
        if pos_weight is not None and loss != "bce":
            raise BertkitError(f"--pos-weight weighs bce's positive pairs; --loss {loss} has none")
        self.loss = dataclasses.replace(LOSSES[loss], pos_weight=pos_weight)
        self.files = {"train": train_file, "dev": dev_file}
        self.columns = {"query": query_column, "passage": passage_column, "label": label_column}
        self.file_format = file_format
        self.label = Path(train_file).stem
        self.ranked = True  # known once dev is read: candidates per query (else pairs)
        self.metric, self.selection = "ndcg@10", "best dev nDCG@10 over each query's candidates"

    def read(self, skip_bad_rows: bool) -> Splits:
        def read(path):
            examples, found = read_ranking_file(path, **{f"{k}_column": v for k, v in self.columns.items()},
                                                skip_bad_rows=skip_bad_rows, fmt=self.file_format)
            return check_labels(examples, self.loss, skip_bad_rows), found

        train, found = read(self.files["train"])
        if not train:
            raise BertkitError("no usable training examples", path=train.path)
        dev = None if self.files["dev"] is None else read(self.files["dev"])[0]
        if dev is not None and not dev:
            raise BertkitError("no usable dev examples", path=dev.path)
        return Splits(train, dev, details={"train_file": str(self.files["train"]), "dev_file": _str(self.files["dev"]),
                                           "layout": found["layout"], "columns": found["columns"],
                                           "loss": self.loss.name, "loss_class": self.loss.anchor,
                                           **({"pos_weight": self.loss.pos_weight} if self.loss.pos_weight else {})})

    def tokenizer(self, model_dir):
        """The model's tokenizer; the runner opens the model here first (after the data is read), so
        this is where the new-head line is said."""
        announce_head(model_dir)
        return super().tokenizer(model_dir)

    def encode(self, examples, tokenizer, max_seq_length: int) -> list[dict]:
        encode = group_features if self.loss.listwise else pair_features
        return encode(examples, tokenizer, max_seq_length)

    def eval_features(self, examples, tokenizer, max_seq_length: int):
        self.ranked = any(len(e.passages) > 1 for e in examples)
        if not self.ranked:
            self.metric, self.selection = "f1", "best dev F1 of the relevant pairs (probability 0.5)"
        return pair_features(examples, tokenizer, max_seq_length)

    def head_config(self) -> dict:
        return {"num_labels": 1, "id2label": {0: "LABEL_0"}, "problem_type": None, "loss": self.loss}

    def predict(self, model, examples, features, runtime) -> list[list[float]]:
        return group_scores(self.logits(model, features, runtime), examples)

    def score(self, predictions, examples, split: str) -> dict:
        return reranking_metrics(predictions, examples) if self.ranked else pair_metrics(predictions, examples)

    def describe(self, splits: Splits, train_features) -> str:
        pairs = sum(len(e.passages) for e in splits.train)
        dev = "no dev" if splits.dev is None else \
            f"{sum(len(e.passages) for e in splits.dev)} dev pairs of {len(splits.dev)} queries"
        return (f"{pairs} train pairs of {len(splits.train)} queries / {dev}, loss {self.loss.name} "
                f"(sentence-transformers' {self.loss.anchor})")

    def identity(self, splits: Splits) -> dict:
        return {"loss": self.loss.name, "pos_weight": self.loss.pos_weight,
                "dev_queries": 0 if splits.dev is None else len(splits.dev)}

    def prediction_text(self, prediction) -> str:
        return json.dumps([round(s, 6) for s in prediction])

    def write_test(self, out, model, splits, runtime) -> dict:
        return {}


def _str(path) -> str | None:
    return None if path is None else str(path)


def announce_head(model_dir) -> None:
    """One line: does --model already score pairs with one logit, or does it get a new head? A model
    with another classifier (a head of another size) is refused: its weights would not fit."""
    path = resolve_model(model_dir) / "config.json"
    config = BertConfig.from_json_file(path) if path.is_file() else BertConfig()
    architecture = (config.architectures or ["BertModel"])[0]
    if architecture == "BertForSequenceClassification" and config.num_labels == 1:
        log.info(f"{model_dir}: a cross-encoder (one-logit classifier): training continues from its head")
    elif architecture in HEADED:
        raise BertkitError(f"the model is a {architecture} with {config.num_labels} labels: a cross-encoder starts "
                           "from a plain BERT (no task head) or a one-logit cross-encoder", path=str(model_dir))
    else:
        log.info(f"{model_dir}: {architecture} without a one-logit head: a new relevance head (one logit on the "
                 "pooled [CLS]) is initialised")


def finetune_cross_encoder(model_dir, train_file, dev_file=None, output_dir=None, *, loss: str = "bce",
                           pos_weight: float | None = None, query_column: str | None = None,
                           passage_column: str | None = None, label_column: str | None = None,
                           file_format: str | None = None, **options) -> TaskResult:
    """Fine-tune a cross-encoder (BertForSequenceClassification, one logit) on the user's pairs or
    query lists with `loss` ("bce", "listnet" or "lambda": sentence-transformers' BinaryCrossEntropyLoss,
    ListNetLoss, LambdaLoss); `options` are the runner's RunSettings (default: one run at lr 2e-5, batch 16,
    one epoch, warm-up 10%). Batch sizes count pairs (bce) or queries (listnet, lambda). With output_dir:
    results.json, dev_predictions.tsv (each dev query's scores), model/ (loadable by
    sentence-transformers' CrossEncoder with the same scores) and metrics.jsonl."""
    task = CrossEncoderTask(train_file, dev_file, loss=loss, pos_weight=pos_weight, query_column=query_column,
                            passage_column=passage_column, label_column=label_column, file_format=file_format)
    settings = RunSettings.of(**{**CROSS_ENCODER_DEFAULTS.settings(paper=False), **options})
    return runner.finetune(task, model_dir, output_dir, settings)
