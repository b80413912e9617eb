"""CoNLL-2003 named-entity recognition (paper §5.3): fine-tune, predict, score.

The paper's recipe: a linear layer on each token's final vector, the label of a word taken at its
first WordPiece (other pieces are ignored: label -100 in training, skipped at prediction), no CRF,
a case-preserving vocabulary and "maximal document context" (`doc_context`: each window is filled
with the neighbouring sentences of the same document, and only the centre sentence is predicted).
Scores are conlleval's chunk precision / recall / F1 (bertkit.metrics.conll).

Tags stay as the file gives them (IOB1 or IOB2, detected and recorded); `tag_scheme="iob2"`
converts IOB1 training tags to IOB2; predictions are always written back in the file's scheme.

`NerTask` is the task object (tasks/task.py) the runner runs: read = `read_conll` and encode =
`ner_features` (both in conll_data.py, shared with the feature-based tagger in ner_features.py),
HEAD = BertForTokenClassification with the training tags as labels, prediction = `predict_ner`'s
first-piece argmax, score = `evaluate_conll` on dev and on a labelled test file (every run, not
selecting); the sweep, resume, early stopping and the model folder are the runner's. finetune =
`finetune_ner` -> TaskResult (`--feature-based`: ner_features.train_feature_based_ner);
`evaluate_prediction_file` -> TaskResult scores a predictions file (`bertkit evaluate conll`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import random
from pathlib import Path
from typing import Sequence

from .. import flags
from .. import settings as setting_flags
from ..inference.predict_batches import predict_batches
from ..device import pick_device, resolve_precision
from ..errors import BertkitError
from ..heads import BertForTokenClassification
from ..hub.checkpoints import load_tokenizer
from ..metrics.conll import evaluate_conll, evaluate_conll_file
from . import runner
from .arguments import add_data_dir_argument, check_finetune_output, parse_list
from .benchmarks import Benchmark, BenchmarkSettings
from .examples import subsample
from .results import TaskResult, summarize
from .runs import RunResult
from .settings import DEV_FRACTION, Defaults, RunSettings
from .splits import Runtime, Splits
from .task import Task
from .conll_data import (TAG_SCHEMES, ConllData, Sentence, detect_scheme, find_conll_files,
                         label_list, ner_features, read_conll, to_iob1, to_iob2, to_scheme, word_pieces,
                         write_predictions)
from .ner_features import train_feature_based_ner

log = logging.getLogger("bertkit")

MODEL_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels")


# ---------------------------------------------------------------- prediction

def predict_ner(model, tokenizer, sentences: Sequence[Sentence], max_seq_length: int = 128,
                doc_context: bool = False, batch_size: int = 64, scheme: str = "IOB2",
                id2label: dict[int, str] | None = None, device=None, precision: str = "fp32",
                features: list[dict] | None = None) -> list[list[str]]:
    """Tags for every word of every sentence, argmax at each word's first piece, in `scheme`."""
    id2label = id2label or model.config.id2label
    if not id2label:
        raise BertkitError("the model has no id2label in its config: which tag is which output?")
    if device is None:
        device = next(model.parameters()).device
    else:
        device = pick_device(device) if isinstance(device, str) else device
        model.to(device)
    precision = resolve_precision(precision, device)
    if features is None:
        features = ner_features(sentences, tokenizer, None, max_seq_length, doc_context)
    logits = predict_batches(model, features, batch_size=batch_size, device=device, precision=precision)["logits"]
    predicted: list[list[str | None]] = [[None] * len(s.words) for s in sentences]
    for feature, window_logits in zip(features, logits):
        best = window_logits[feature["first_pieces"]].argmax(-1).tolist()
        row = predicted[feature["sentence"]]
        for offset, label_id in enumerate(best):
            row[feature["word_start"] + offset] = id2label[int(label_id)]
    for index, row in enumerate(predicted):
        if any(tag is None for tag in row):  # a windowing bug, never user input
            raise AssertionError(f"sentence {index}: some words were in no window")
    return [to_scheme(row, scheme) for row in predicted]


def _limit(data: ConllData, n: int | None, seed: int | None = None) -> list[Sentence]:
    """The first n sentences, or (with a seed) whole documents drawn in a seeded random order until
    n sentences, the last one cut, kept in file order: documents stay together for doc_context."""
    if seed is None or n is None or n >= len(data.sentences):
        return subsample(data.sentences, n, contiguous=True)
    if n <= 0:
        raise BertkitError(f"the example limit must be positive, not {n}")
    documents = data.documents()
    random.Random(seed).shuffle(documents)
    keep: list[int] = []
    for document in documents:
        keep += document[: n - len(keep)]
        if len(keep) == n:
            break
    return [data.sentences[i] for i in sorted(keep)]


# ---------------------------------------------------------------- the task (run by tasks/runner.py)

# The one run `bertkit finetune ner` makes without flags; the paper's grid is tasks/custom.py's TOKEN_DEFAULTS.
NER_DEFAULTS = Defaults(learning_rates=(5e-5,), epochs=(3,), batch_sizes=(32,), max_seq_length=128,
                        eval_batch_size=64, anchor="the paper's §5.3 fine-tuning approach")
SPLIT_FILES = {"dev": "valid", "test": "test"}  # the runner's split names -> CoNLL's


class NerTask(Task):
    """CoNLL-2003 named-entity recognition (paper §5.3): fine-tune, predict, score.

    Tagging CoNLL-style sentences (CoNLL-2003, or a user's files as `data`): first-piece labels, the
    windows of conll_data.py, conlleval on dev and on a labelled test file (scored every run, not
    selecting). results.json keeps NER's own layout (`document`)."""

    HEAD = BertForTokenClassification
    defaults = NER_DEFAULTS
    phase = "ner"
    evaluates_in_loop = False  # dev after each run (each epoch with early stopping), as before the runner
    # Dev is CoNLL's valid file; quick runs keep the first sentences (no subset seed); dev is scored
    # after each run or epoch, not every N steps.
    skipped_settings = DEV_FRACTION + ("subset_seed", "eval_steps")

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        add_data_dir_argument(parser, "conll2003/{train,valid,test}.txt or {train,valid,test}.txt")
        add_tagging_arguments(parser)
        parser.add_argument("--tag-scheme", choices=TAG_SCHEMES, default="file",
                            help="file: train on the file's tags; iob2: convert IOB1 training tags to IOB2 "
                                 "(predictions are written in the file's scheme either way)")
        feature = parser.add_argument_group("feature-based (frozen encoder + 2-layer BiLSTM tagger, the paper's §5.3)")
        feature.add_argument("--feature-based", action="store_true", help="train BiLSTM taggers on frozen features "
                             f"instead (learning rate {FEATURE_BASED['learning_rate']:g} and "
                             f"{FEATURE_BASED['epochs']:g} epochs unless given)")
        feature.add_argument("--layers", default="concat-last-four", help=FEATURE_VARIANTS_HELP)
        feature.add_argument("--lstm-size", type=flags.positive_int, default=768,
                             help="BiLSTM units per direction (768 in the paper)")
        feature.add_argument("--lstm-dropout", type=flags.probability, default=0.5)

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "NerTask":
        return cls(args.data_dir, doc_context=args.doc_context, tag_scheme=args.tag_scheme, cased=args.cased)

    @classmethod
    def run_finetune(cls, args) -> int:
        check_finetune_output(args)
        if args.feature_based:
            results = run_feature_based(args)
            summary = {v: {"dev_f1": r["dev"]["f1"], "test_f1": (r.get("test") or {}).get("f1")}
                       for v, r in results["variants"].items()}
        else:
            settings = cls.settings_from_args(args)
            results = runner.finetune(cls.from_args(args, settings), args.model, args.output, settings).document
            summary = {"best_config": results["best"]["config"], "dev_f1": results["best"]["dev"]["f1"],
                       "test_f1": (results["best"]["test"] or {}).get("f1")}
        bad = {k: v for k, v in results["bad_rows"].items() if v}
        if bad:
            summary["skipped_bad_rows"] = bad
        print(json.dumps(summary))
        return 0

    @classmethod
    def add_evaluate_arguments(cls, parser) -> None:
        parser.add_argument("file", metavar="FILE",
                            help="conlleval input: token ... gold predicted per line, blank line between sentences")

    @classmethod
    def run_evaluate(cls, args) -> int:
        print(json.dumps(evaluate_prediction_file(args.file).document["metrics"]))
        return 0

    @classmethod
    def benchmarks(cls) -> tuple:
        return (Benchmark(name="ner", label="CoNLL NER F1", run=run_benchmark,
                          has_data=lambda data_dir: (data_dir / "conll2003" / "train.txt").is_file()),)

    def __init__(self, data_dir=None, data: dict[str, ConllData] | None = None, *, doc_context: bool = False,
                 tag_scheme: str = "file", cased: bool | None = None, select_on: str = "f1", name: str = "ner",
                 subset_seed: int | None = None):
        if tag_scheme not in TAG_SCHEMES:
            raise BertkitError(f"tag_scheme must be one of {', '.join(TAG_SCHEMES)}, not {tag_scheme!r}")
        self.data_dir, self.data, self.doc_context, self.tag_scheme = data_dir, data, doc_context, tag_scheme
        self.cased, self.select_on, self.metric = cased, select_on, select_on
        self.name = self.label = name
        self.selection = f"best dev {select_on}"
        self.labels: list[str] = []
        self.subset_seed = subset_seed  # --max-train-examples draws whole documents by it (None: the first N)

    def read(self, skip_bad_rows: bool) -> Splits:
        if self.data is None:
            files = find_conll_files(self.data_dir)
            self.data = {split: read_conll(path, skip_bad_rows) for split, path in files.items()}
        sentences = {split: d.sentences for split, d in self.data.items()}
        return Splits(sentences["train"], sentences.get("valid"),
                      reported={"test": sentences["test"]} if "test" in sentences else {})

    def tokenizer(self, model_dir):
        return load_tokenizer(model_dir, self.cased)

    def limit(self, splits: Splits, max_train, max_eval, seed) -> Splits:
        first = functools.partial(subsample, contiguous=True)  # whole documents stay together for doc_context
        return dataclasses.replace(splits, train=_limit(self.data["train"], max_train, self.subset_seed),
                                   dev=None if splits.dev is None else first(splits.dev, max_eval),
                                   reported={k: first(v, max_eval) for k, v in splits.reported.items()})

    @property
    def converts_to_iob2(self) -> bool:
        return self.tag_scheme == "iob2" and self.data["train"].scheme == "IOB1"

    def encode(self, sentences, tokenizer, max_seq_length: int) -> list[dict]:
        """Training windows; the tag set (the head's labels) is the training tags'."""
        tags = [to_iob2(s.tags) if self.converts_to_iob2 else s.tags for s in sentences]
        self.labels = label_list(tags)
        training = [dataclasses.replace(s, tags=t) for s, t in zip(sentences, tags)]
        features = ner_features(training, tokenizer, {t: i for i, t in enumerate(self.labels)}, max_seq_length,
                                self.doc_context)
        return [{k: f[k] for k in MODEL_KEYS if k in f} for f in features]

    def eval_features(self, sentences, tokenizer, max_seq_length: int):
        return ner_features(sentences, tokenizer, None, max_seq_length, self.doc_context)

    def head_config(self) -> dict:
        return dict(num_labels=len(self.labels), id2label=dict(enumerate(self.labels)))

    def evaluate(self, model, sentences, features, runtime: Runtime, split: str):
        predicted = predict_ner(model, runtime.tokenizer, sentences, runtime.max_seq_length, self.doc_context,
                                runtime.eval_batch_size, scheme=self.data[SPLIT_FILES[split]].scheme,
                                id2label=dict(enumerate(self.labels)), precision=runtime.precision,
                                features=features)
        scores = evaluate_conll([s.tags for s in sentences], predicted)
        return (scores if split == "dev" else {split: scores}), predicted

    def select(self, metrics: dict) -> float:
        return metrics[self.select_on]

    def identity(self, splits: Splits) -> dict:
        return {"doc_context": self.doc_context, "labels": self.labels,
                "eval_sentences": {SPLIT_FILES[k]: len(v) for k, v in splits.named().items() if k != "train"}}

    def details(self, splits: Splits, features: dict, runtime: Runtime) -> dict:
        file_scheme = self.data["train"].scheme
        return {"files": {split: str(d.path) for split, d in self.data.items()},
                "tag_scheme": {"file": file_scheme, "training": "IOB2" if self.converts_to_iob2 else file_scheme},
                "labels": self.labels, "do_lower_case": runtime.tokenizer.do_lower_case,
                "doc_context": self.doc_context,
                "precision": resolve_precision(runtime.precision, pick_device(runtime.device)),
                "sentences": {SPLIT_FILES.get(k, k): len(v) for k, v in splits.named().items()},
                "documents": {split: d.num_documents for split, d in self.data.items()},
                "windows": {SPLIT_FILES.get(k, k): len(v) for k, v in features.items()},
                "bad_rows": {split: d.bad_rows for split, d in self.data.items()}}

    def result_metrics(self, metrics: dict) -> dict:
        return {k: v for k, v in metrics.items() if k != "test"}

    def document(self, best: RunResult, runs: list[RunResult], details: dict) -> dict:
        """NER's results.json: conlleval's dev and test scores of the best run and of every run."""
        def scores(run: RunResult) -> dict:
            return {"dev": self.result_metrics(run.metrics) or None, "test": run.metrics.get("test")}

        def flat(run: RunResult) -> RunResult:  # the summary's metrics: dev_f1, test_f1, ...
            named = {f"{split}_{k}": v for split, r in scores(run).items() for k, v in (r or {}).items()
                     if k in ("precision", "recall", "f1", "accuracy")}
            if "sequences_per_second" in run.training:
                named["train_seq_per_s"] = run.training["sequences_per_second"]
            return dataclasses.replace(run, metrics=named)

        kept = {k: v for k, v in details.items() if k not in ("num_train_examples", "num_dev_examples", "skipped_rows")}
        return {"task": self.name, **kept, "best": {"config": best.config, **scores(best)},
                "runs": [{"config": r.config, "seconds": r.seconds, **scores(r)} for r in runs],
                "summary": summarize([flat(r) for r in runs])}

    def write_outputs(self, out: Path, model, outputs: dict, splits: Splits, runtime: Runtime) -> dict:
        for split, file_name in (("dev", "dev_predictions.txt"), ("test", "test_predictions.txt")):
            if split in outputs:
                write_predictions(out / file_name, splits.named()[split], outputs[split])
        return {}


def finetune_ner(model_dir: str | Path, data_dir: str | Path | None = None, output_dir: str | Path | None = None, *,
                 doc_context: bool = False, tag_scheme: str = "file", cased: bool | None = None,
                 data: dict[str, ConllData] | None = None, select_on: str = "f1", name: str = "ner",
                 subset_seed: int | None = None, **options) -> TaskResult:
    """Fine-tune BertForTokenClassification on CoNLL-2003 over the grid lr x epochs x batch x seed,
    keep the best run on dev F1, score it (and every run) on dev and test with conlleval.

    `data` ({"train", "valid"[, "test"]: ConllData}) replaces the files of data_dir (a user's own
    files, bertkit.tasks.custom); `select_on` is the dev score that picks the best run ("f1", or
    "accuracy" for a tag set without chunks). `options` are the runner's RunSettings (default: one
    run at lr 5e-5, 3 epochs, batch 32, max length 128; `max_train_examples` / `max_eval_examples`
    keep the first N sentences; with `subset_seed`, the training ones are whole documents in that
    seed's random order). Writes to output_dir (when given): results.json, dev_predictions.txt,
    test_predictions.txt, model/ (the best model, id2label in config.json, with its tokenizer),
    runs/<name>/metrics.jsonl per run and the best run's metrics.jsonl. Without a "valid" split: one
    run, trained and saved without selection."""
    task = NerTask(data_dir, data, doc_context=doc_context, tag_scheme=tag_scheme, cased=cased, select_on=select_on,
                   name=name, subset_seed=subset_seed)
    return runner.finetune(task, model_dir, output_dir, RunSettings.paper(NER_DEFAULTS, **options))


# ---------------------------------------------------------------- CLI: bertkit finetune ner --feature-based

FEATURE_VARIANTS_HELP = ("embeddings, last, second-to-last, sum-last-four, concat-last-four, weighted-sum-all "
                         "(comma list: one tagger each, the paper's Table 7)")
# The feature-based taggers' recipe where the flags give none (the paper's §5.3 taggers train far
# longer at a larger rate than fine-tuning does), and the RunSettings flags they take.
FEATURE_BASED = {"learning_rate": 1e-3, "epochs": 4}
FEATURE_BASED_SETTINGS = {"learning_rates", "epochs", "batch_sizes", "seeds", "max_seq_length", "precision", "device",
                          "max_train_examples", "max_eval_examples", "skip_bad_rows", "warmup_ratio"}


def add_tagging_arguments(parser) -> None:
    """How sentences become windows and which case the vocabulary sees (ner and token-classification)."""
    parser.add_argument("--doc-context", action="store_true",
                        help="fill each window with neighbouring sentences of the same document; predict the centre one")
    case = parser.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="cased", action="store_true", default=None,
                      help="keep case (default: do_lower_case from the model's tokenizer_config.json)")
    case.add_argument("--uncased", dest="cased", action="store_false", help="lower-case and strip accents")


def run_feature_based(args) -> dict:
    """`--feature-based`: the taggers on frozen features with the RunSettings flags they take; any
    other setting given is refused (it would fine-tune the encoder, which stays frozen)."""
    given = setting_flags.given(args, RunSettings)
    refused = sorted(set(given) - FEATURE_BASED_SETTINGS)
    if refused:
        names = ", ".join(setting_flags.flag_of(f) for f in setting_flags.cli_fields(RunSettings) if f.name in refused)
        raise BertkitError(f"{names}: --feature-based trains BiLSTM taggers on a frozen encoder, which these "
                           "fine-tune (the taggers take --lstm-dropout, --learning-rate, --epochs, --batch-size, "
                           "--seed ...)")
    s = RunSettings.from_args(args, dataclasses.replace(NER_DEFAULTS, learning_rates=(FEATURE_BASED["learning_rate"],),
                                                        epochs=(FEATURE_BASED["epochs"],)))
    if len(s.learning_rates) > 1 or len(s.epochs) > 1 or len(s.seeds) > 1 or len(s.batch_sizes) > 1:
        raise BertkitError("--feature-based takes one --learning-rate, --epochs, --seed and --batch-size")
    return train_feature_based_ner(
        args.model, args.data_dir, args.output, variants=parse_list(args.layers, str), lstm_size=args.lstm_size,
        learning_rate=s.learning_rate, epochs=s.num_epochs, batch_size=s.batch_size, seed=s.seed,
        max_seq_length=s.max_seq_length, doc_context=args.doc_context, precision=s.precision, device=s.device,
        max_train_examples=s.max_train_examples, max_eval_examples=s.max_eval_examples, tag_scheme=args.tag_scheme,
        cased=args.cased, dropout=args.lstm_dropout, skip_bad_rows=s.skip_bad_rows,
        warmup_ratio=s.warmup_ratio).document


def evaluate_prediction_file(path: str | Path) -> TaskResult:
    """conlleval on a `token ... gold predicted` file: the TaskResult's metrics are the chunk
    precision / recall / F1 and the token accuracy (fractions), its document's `metrics` the
    scorer's whole output (per entity type and the counts too)."""
    scores = evaluate_conll_file(path)
    metrics = {k: scores[k] for k in ("precision", "recall", "f1", "accuracy")}
    return TaskResult(task="ner", metric="f1", metrics=metrics, run_metrics=[metrics],
                      document={"task": "ner", "file": str(path), "metrics": scores})


# ---------------------------------------------------------------- benchmarks


def run_benchmark(settings: BenchmarkSettings) -> TaskResult:
    """CoNLL-2003 at a reproduction budget's settings (max_train_examples / max_eval_examples: the first
    N sentences)."""
    ft, cfg = settings.finetune, settings.task
    return finetune_ner(
        str(settings.model_dir), str(settings.data_dir), output_dir=str(settings.output_dir),
        batch_sizes=[ft["batch_size"]], max_seq_length=settings.max_seq_length(),
        max_train_examples=cfg.get("max_train_examples"), max_eval_examples=cfg.get("max_eval_examples"),
        learning_rates=ft["learning_rates"], epochs=ft["epochs"], seeds=ft["seeds"], precision=settings.precision,
        subset_seed=cfg.get("subset_seed"), progress=False)


__all__ = ["Sentence", "ConllData", "read_conll", "detect_scheme", "to_iob1", "to_iob2", "label_list",
           "word_pieces", "ner_features", "predict_ner", "write_predictions", "find_conll_files", "load_tokenizer",
           "finetune_ner", "train_feature_based_ner", "evaluate_prediction_file"]
