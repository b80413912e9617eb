"""Fine-tuning on your own files: `bertkit finetune text-classification | token-classification |
multiple-choice | question-answering`.

Each task reads the user's files (user_files.py, or SQuAD-format JSON) into the examples a benchmark
task already trains on, and runs that task's machinery unchanged: sentence (pair) classification
and regression are GLUE's features, sweep protocol (grid x restarts, best on dev), results.json and
metrics.jsonl; token classification is ner.py's task (windows, tag handling, conlleval chunk F1);
multiple choice is multiple_choice.py's; question answering is squad.py's windows, n-best search,
null threshold and official scorer inside the same sweep protocol. Labels are the user's:
config.json's id2label / label2id hold them, so `bertkit predict` and `bertkit.pipeline` answer
with the user's label names.

Every command is a task object (tasks/task.py) that the runner (tasks/runner.py) runs; token
classification is ner.py's NerTask on the user's files. As a Trainer user
expects, each makes one run at a stated learning rate unless `--grid paper` (the paper's protocol
for the task) or comma lists ask for a grid; dev is a dev file or `--dev-fraction` of the training
file, and without either the one run is trained and saved without selection.

Each command is a task class (its command line included) and one line in tasks/registry.py; they
have no benchmarks, so `bertkit reproduce` does not run them. Every finetune returns a TaskResult
and writes the best model to OUTPUT/model.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Sequence

from .. import flags
from ..errors import BertkitError
from ..tables import QUOTING
from ..heads import BertForSequenceClassification
from ..metrics.glue import accuracy, pearson, spearman
from . import runner, squad
from .arguments import check_finetune_output
from .glue import GlueTask, classification_predictions, glue_features
from .multiple_choice import PAPER_DEFAULTS as PAPER_MC_DEFAULTS
from .multiple_choice import MultipleChoiceTask
from .ner import NerTask, add_tagging_arguments
from .results import TaskResult
from .runner import split_dev
from .runs import config_text
from .settings import Defaults, RunSettings
from .splits import Splits
from .task import Task
from .user_files import (check_labels, check_tags, is_regression, read_choice_file, read_tagged_file,
                         read_text_file, sorted_labels)

log = logging.getLogger("bertkit")

# ---------------------------------------------------------------- sentence (pair) classification / regression


def classification_metrics(predictions: Sequence, gold: Sequence, regression: bool) -> dict:
    """Classification: accuracy and macro-averaged F1 (over the labels in gold or predictions);
    regression: Pearson, Spearman, mean squared error, and their `score` (the mean of the two
    correlations, as GLUE scores STS-B)."""
    if regression:
        r, rho = pearson(predictions, gold), spearman(predictions, gold)
        mse = sum((p - g) ** 2 for p, g in zip(predictions, gold)) / len(gold)
        return {"pearson": r, "spearman": rho, "mse": mse, "score": (r + rho) / 2}
    from sklearn.metrics import f1_score  # imported on use, as in metrics/glue.py

    return {"accuracy": accuracy(predictions, gold),
            "macro_f1": float(f1_score(gold, predictions, average="macro", zero_division=0))}


# The one run an own-data command makes: transformers' Trainer defaults (TrainingArguments: learning rate
# 5e-5, batch 8, 3 epochs). On a few hundred rows the paper's batch 32 at 2e-5 takes too few steps to learn
# (benchmarks/results/small_data_defaults.md); the paper's settings are `--grid paper`.
OWN_DATA_RUN = dict(learning_rate=5e-5, batch_size=8, num_train_epochs=3)

TEXT_DEFAULTS = Defaults(learning_rates=(5e-5, 4e-5, 3e-5, 2e-5), epochs=(3,), batch_sizes=(32,), max_seq_length=128,
                         eval_batch_size=128, anchor="the paper's GLUE protocol (§4.1)", **OWN_DATA_RUN)

# Spelt as transformers' TrainingArguments spells them (one value, or a list for a grid).
SINGULAR_SETTINGS = {"learning_rate": "learning_rates", "batch_size": "batch_sizes", "seed": "seeds",
                     "num_train_epochs": "epochs"}


def own_data_settings(defaults: Defaults, settings: RunSettings | None = None, grid: str | None = None,
                      **options) -> RunSettings:
    """The runner's settings of an own-data command, the command line's defaults: one run at the
    defaults' learning rate, batch size and epochs (OWN_DATA_RUN), or the paper's grid with
    grid="paper", or `settings` as given; `options` (RunSettings fields, or learning_rate /
    batch_size / seed / num_train_epochs; one value or a list) in place of any of it."""
    if grid not in (None, "paper"):
        raise BertkitError(f"grid must be \"paper\" or None, not {grid!r}")
    if settings is None:
        settings = RunSettings.of(**defaults.settings(paper=grid == "paper"))
    options = {SINGULAR_SETTINGS.get(name, name): value for name, value in options.items()}
    for name in SINGULAR_SETTINGS.values():
        if name in options:
            options[name] = tuple(options[name]) if isinstance(options[name], (list, tuple)) else (options[name],)
    return RunSettings.of(**{**dataclasses.asdict(settings), **options})


class TextClassificationTask(Task):
    """sentence (pair) classification or regression on your own CSV / TSV / JSON lines files"""

    name = "text-classification"
    HEAD = BertForSequenceClassification
    defaults = TEXT_DEFAULTS
    own_data, skipped_settings = True, ()

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        add_file_arguments(parser, "CSV, TSV (with a header row) or JSON lines")
        parser.add_argument("--text-column", default="text", help="column holding the text (default text)")
        parser.add_argument("--text-pair-column", default=None, help="column holding the second text of a pair")
        parser.add_argument("--label-column", default="label", help="column holding the label (default label)")
        kind = parser.add_mutually_exclusive_group()
        kind.add_argument("--regression", dest="regression", action="store_true", default=None,
                          help="labels are numbers to predict (default: when some training label has a fraction)")
        kind.add_argument("--classification", dest="regression", action="store_false",
                          help="labels are classes even when they are numbers like 0.5")
        add_table_arguments(parser)

    @classmethod
    def epilog(cls) -> str:
        return own_data_epilog(cls.defaults)

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "TextClassificationTask":
        return cls(args.train_file, args.dev_file, args.test_file, text_column=args.text_column,
                   text_pair_column=args.text_pair_column, label_column=args.label_column, id_column=args.id_column,
                   regression=args.regression, file_format=args.file_format, quoting=args.quoting)

    def __init__(self, train_file, dev_file=None, test_file=None, *, text_column: str = "text",
                 text_pair_column: str | None = None, label_column: str = "label", id_column: str | None = None,
                 regression: bool | None = None, file_format: str | None = None, quoting: str | None = None):
        self.files = {"train": train_file, "dev": dev_file, "test": test_file}
        self.columns = {"text": text_column, "text_pair": text_pair_column, "label": label_column, "id": id_column}
        self.regression, self.file_format, self.quoting = regression, file_format, quoting
        self.label = Path(train_file).stem
        self.labels, self.spec = None, None  # known once the training file is read

    def read(self, skip_bad_rows: bool) -> Splits:
        c = self.columns
        read = functools.partial(read_text_file, text_column=c["text"], label_column=c["label"],
                                 text_pair_column=c["text_pair"], id_column=c["id"], skip_bad_rows=skip_bad_rows,
                                 fmt=self.file_format, quoting=self.quoting)
        # Every row with a label (checked while reading); ids name the predictions, of dev and test only.
        train = read(self.files["train"], id_column=None)
        self.regression = is_regression(train, self.regression)
        labels = None if self.regression else sorted_labels(e.label for e in train)
        if labels is not None and len(labels) < 2:
            raise BertkitError(f"every training label is {labels[0]!r}: a classifier needs at least two",
                               path=train.path)
        self.labels = labels
        train = check_labels(train, labels, skip_bad_rows)
        dev = None if self.files["dev"] is None else check_labels(read(self.files["dev"]), labels, skip_bad_rows)
        test = None if self.files["test"] is None else check_labels(
            read(self.files["test"], labels_optional=True), labels, skip_bad_rows)
        if dev is not None and len(dev) < (2 if self.regression else 1):
            raise BertkitError(f"the dev file has {len(dev)} usable examples: too few to score", path=dev.path)
        self.spec = GlueTask(name=self.label, folder=self.label, text_a=c["text"], text_b=c["text_pair"],
                             label=c["label"], labels=None if labels is None else tuple(labels))
        self.metric = "score" if self.regression else "accuracy"
        self.selection = "best dev " + ("mean of Pearson and Spearman" if self.regression else "accuracy")
        return Splits(train, dev, test, details={
            "train_file": str(self.files["train"]), "dev_file": _str(self.files["dev"]),
            "test_file": _str(self.files["test"]), "columns": dict(self.columns),
            "problem_type": "regression" if self.regression else "single_label_classification", "labels": labels})

    def encode(self, examples, tokenizer, max_seq_length: int) -> list[dict]:
        return glue_features(examples, tokenizer, self.spec, max_seq_length)

    def head_config(self) -> dict:
        if self.regression:
            return dict(num_labels=1, id2label={0: self.columns["label"]}, problem_type="regression")
        return dict(id2label=dict(enumerate(self.labels)), problem_type="single_label_classification")

    def predict(self, model, examples, features, runtime) -> list:
        return classification_predictions(self.spec, self.logits(model, features, runtime))

    def score(self, predictions, examples, split: str) -> dict:
        gold = [e.label if self.regression else self.labels.index(e.label) for e in examples]
        return classification_metrics(predictions, gold, self.regression)

    def describe(self, splits: Splits, train_features) -> str:
        kind = "regression" if self.regression else f"{len(self.labels)} labels ({', '.join(self.labels[:10])}" + \
            (", ...)" if len(self.labels) > 10 else ")")
        return f"{super().describe(splits, train_features)}, {kind}"

    def identity(self, splits: Splits) -> dict:
        return {"dev_examples": 0 if splits.dev is None else len(splits.dev)}

    def prediction_text(self, prediction) -> str:
        return f"{prediction:.6g}" if self.regression else self.labels[prediction]


def _str(path) -> str | None:
    return None if path is None else str(path)


# The columns and format of a text-classification file (TextClassificationTask's, the command's flags).
TEXT_OPTIONS = ("text_column", "text_pair_column", "label_column", "id_column", "regression", "file_format", "quoting")


def task_options(options: dict, names) -> dict:
    """The task's own options (columns, formats) out of a Python call's keywords; the rest are run settings."""
    return {name: options.pop(name) for name in names if name in options}


def finetune_text_classification(model_dir, train_file, dev_file=None, output_dir=None, test_file=None, *,
                                 settings: RunSettings | None = None, **options) -> TaskResult:
    """Fine-tune BertForSequenceClassification on the user's CSV / TSV / JSON lines files; the
    TaskResult's document is results.json. `options`: the file's columns and format (TEXT_OPTIONS:
    text_column "text", text_pair_column, label_column "label", id_column, regression, file_format,
    quoting, as the command's flags) and own_data_settings's run options, or `settings` (default:
    one run, as `bertkit finetune text-classification`; grid="paper" for the paper's GLUE grid).

    Labels: any strings, sorted (numerically when all are whole numbers) into config.json's
    id2label; regression (one output, MSE loss) when `regression` is True, or when None and every
    training label is a number with some fraction among them. With output_dir: results.json,
    dev_predictions.tsv (and test_predictions.tsv), model/ and metrics.jsonl (the best run's; every
    run's in runs/<run>/)."""
    task = TextClassificationTask(train_file, dev_file, test_file, **task_options(options, TEXT_OPTIONS))
    return runner.finetune(task, model_dir, output_dir, own_data_settings(TEXT_DEFAULTS, settings, **options))


# ---------------------------------------------------------------- token classification


TOKEN_DEFAULTS = Defaults(learning_rates=(5e-5, 3e-5, 2e-5), epochs=(2, 3, 4), batch_sizes=(16, 32), max_seq_length=128,
                          eval_batch_size=64, anchor="the paper's fine-tuning grid (appendix A.3)", **OWN_DATA_RUN)


def finetune_token_classification(model_dir, train_file, dev_file=None, output_dir=None, test_file=None, *,
                                  tag_column: int | None = None, tokens_field: str = "tokens",
                                  tags_field: str = "tags", doc_context: bool = False, cased: bool | None = None,
                                  settings: RunSettings | None = None, **options) -> TaskResult:
    """Fine-tune BertForTokenClassification on the user's CoNLL-style or JSON lines files, any tag
    set, as ner.py's task (its windows, conlleval, results.json) through the runner (`settings` /
    `options`: own_data_settings's, default one run as the command line's). Tags are trained as written (IOB1, IOB2, IOBES, or a tag set without chunks);
    the best run is the one with the best dev chunk F1 (conlleval, which reads all three chunk
    schemes), or token accuracy for a tag set without chunks. Without a dev file, `dev_fraction` of
    the training sentences (seeded by split_seed) is dev; with neither, one run is trained and saved
    without selection. Writes (with output_dir) what finetune_ner writes: model/, results.json,
    dev/test predictions, metrics.jsonl."""
    s = own_data_settings(TOKEN_DEFAULTS, settings, **options)
    data = _tagging_data(train_file, dev_file, test_file, s.dev_fraction, s.split_seed, skip_bad_rows=s.skip_bad_rows,
                         tag_column=tag_column, tokens_field=tokens_field, tags_field=tags_field)
    select_on = "accuracy" if data["train"].scheme == "tags" else "f1"
    task = TokenClassificationTask(data=data, doc_context=doc_context, cased=cased, select_on=select_on,
                                   name="token-classification")
    # Dev is held out of whole sentences above, so the runner splits nothing further.
    return runner.finetune(task, model_dir, output_dir, dataclasses.replace(s, dev_fraction=None))


def _tagging_data(train_file, dev_file, test_file, dev_fraction, split_seed, skip_bad_rows: bool, **columns) -> dict:
    """The user's files as NER's splits ({"train", "valid"[, "test"]: ConllData}): dev and test tags
    checked against the training file's, dev held out of train with `dev_fraction` (whole sentences,
    as split_dev does for examples)."""
    read = functools.partial(read_tagged_file, skip_bad_rows=skip_bad_rows, **columns)
    train, _ = read(train_file)
    known = {t for s in train.sentences for t in s.tags}
    if len(known) < 2:
        raise BertkitError(f"every training tag is {next(iter(known))!r}: a tagger needs at least two", path=train.path)
    data = {"train": train}
    if dev_file is not None and dev_fraction:
        raise BertkitError("--dev-fraction holds out part of the training data when there is no dev file; "
                           "this run has one")
    if dev_fraction:
        for split, part, bad_rows in zip(("train", "valid"), split_dev(train.sentences, dev_fraction, split_seed),
                                         (train.bad_rows, 0)):
            data[split] = dataclasses.replace(train, sentences=list(part), bad_rows=bad_rows)
            data[split].num_documents = len(data[split].documents())
    for split, path in (("valid", dev_file), ("test", test_file)):
        if path is not None:
            checked = check_tags(*read(path), known, skip_bad_rows)
            if not checked.sentences:
                raise BertkitError("no sentences left to evaluate", path=checked.path)
            checked.scheme = train.scheme  # predictions are written in the training file's scheme
            data[split] = checked
    return data


# ---------------------------------------------------------------- multiple choice


MC_DEFAULTS = dataclasses.replace(PAPER_MC_DEFAULTS, **OWN_DATA_RUN)  # --grid paper: SWAG's lr 2e-5, batch 16 (§4.4)


# The columns and format of a multiple-choice file, with their defaults (read_choice_file's keywords).
CHOICE_OPTIONS = {"question_column": "question", "choice_columns": ("choices",), "label_column": "label",
                  "context_column": None, "id_column": None, "file_format": None, "quoting": None}


def finetune_choices(model_dir, train_file, dev_file=None, output_dir=None, test_file=None, *,
                     settings: RunSettings | None = None, **options) -> TaskResult:
    """Fine-tune BertForMultipleChoice on the user's CSV / TSV / JSON lines files with
    multiple_choice.py's protocol. `options`: the file's columns and format (CHOICE_OPTIONS, as the
    command's flags) and own_data_settings's run options, or `settings` (default one run as the
    command line's)."""
    columns = {**CHOICE_OPTIONS, **task_options(options, CHOICE_OPTIONS)}
    reader = functools.partial(_read_choices, question_column=columns["question_column"],
                               choice_columns=list(columns["choice_columns"]), label_column=columns["label_column"],
                               context_column=columns["context_column"], id_column=columns["id_column"],
                               fmt=columns["file_format"], quoting=columns["quoting"])
    task = MultipleChoiceFiles(train_file, dev_file, test_file, reader)
    return runner.finetune(task, model_dir, output_dir, own_data_settings(MC_DEFAULTS, settings, **options))


def _read_choices(path, skip_bad_rows=False, **columns):
    return read_choice_file(path, skip_bad_rows=skip_bad_rows, **columns)


# ---------------------------------------------------------------- extractive question answering


# Windows of 384 as the paper's SQuAD settings (§4.2); --grid paper: its lr 5e-5, batch 32, 3 epochs.
QA_DEFAULTS = dataclasses.replace(squad.SQUAD_DEFAULTS, **OWN_DATA_RUN)


def finetune_question_answering(model_dir, train_file, dev_file=None, output_dir=None, *, version: str | None = None,
                                doc_stride: int = 128, max_query_length: int = 64, n_best_size: int = 20,
                                max_answer_length: int = 30, null_score_diff_threshold: float = 0.0,
                                search_null_threshold: bool = True, settings: RunSettings | None = None,
                                **options) -> TaskResult:
    """Fine-tune BertForQuestionAnswering on the user's SQuAD-format JSON (v1.1, or v2.0 with
    is_impossible) over the grid lr x epochs x batch size x seeds; the best run on dev F1 wins.

    Every run predicts the dev file as `bertkit finetune squad` does (windows, n-best, and for v2.0
    the null threshold searched on the dev answers unless search_null_threshold is False) and is
    scored by the official evaluator: its metrics are the official exact match and F1 (v2.0 also
    HasAns / NoAns and best_*) as fractions, at the applied threshold. `settings` / `options`:
    own_data_settings's (default one run, as the command line's); batch sizes are effective batches of
    grad_accum micro-batches. With output_dir: results.json (every run, the best, mean / sd /
    median per setting, the best run's official metrics), the best run's predictions.json,
    nbest_predictions.json (and null_odds.json), model/ and metrics.jsonl (every run's in runs/<run>/)."""
    task = QuestionAnsweringTask(train_file, dev_file, version=version, doc_stride=doc_stride,
                                 max_query_length=max_query_length, n_best_size=n_best_size,
                                 max_answer_length=max_answer_length, null_score_diff_threshold=null_score_diff_threshold,
                                 search_null_threshold=search_null_threshold)
    return runner.finetune(task, model_dir, output_dir, own_data_settings(QA_DEFAULTS, settings, **options))


# ---------------------------------------------------------------- the Python call


def finetune(task: str, model, train_file, output=None, *, dev_file=None, test_file=None,
             settings: RunSettings | None = None, **options) -> TaskResult:
    """Fine-tune `model` (a folder or Hub id) on your own files, as `bertkit finetune TASK` does with
    the same defaults (one run: learning rate 5e-5, batch 8, 3 epochs; grid="paper" for the paper's
    settings), and return its TaskResult (`.metrics`, `.document`: results.json). With `output`
    the command's files are written there (results.json, predictions, model/).

    `task`: text-classification | token-classification | multiple-choice | question-answering.
    `options`: the task's column options (text_column=, label_column=, tag_column= ..., as the
    command's flags without the dashes) and any run setting (learning_rate=, num_train_epochs= or
    epochs=, batch_size=, seed=: one value, or a list for a grid; max_seq_length=, dev_fraction=,
    warmup_ratio=, precision= ...: tasks/runner.RunSettings' fields), or `settings`, a whole
    RunSettings.

        result = bertkit.finetune("text-classification", model="sentence-transformers/all-MiniLM-L6-v2",
                                  train_file="reviews.csv", dev_fraction=0.2, output="reviews-model")
        result.metrics["accuracy"]
    """
    functions = {"text-classification": finetune_text_classification,
                 "token-classification": finetune_token_classification,
                 "multiple-choice": finetune_choices, "question-answering": finetune_question_answering}
    if task not in functions:
        raise BertkitError(f"unknown task {task!r}; choose from {', '.join(functions)}")
    if test_file is not None:
        if task == "question-answering":
            raise BertkitError("question-answering takes no test_file: predict new questions with bertkit.pipeline")
        options["test_file"] = test_file
    return functions[task](model, train_file, dev_file, output, settings=settings, **options)


# ---------------------------------------------------------------- command line


def add_file_arguments(parser, what: str) -> None:
    parser.add_argument("--train-file", required=True, help=f"training data: {what}")
    parser.add_argument("--dev-file", default=None,
                        help="dev data, same layout: selects the best run (without it: --dev-fraction, or one run "
                             "trained and saved without selection)")
    parser.add_argument("--test-file", default=None, help="data to predict after training (labels optional)")


def add_table_arguments(parser) -> None:
    parser.add_argument("--format", dest="file_format", choices=("csv", "tsv", "jsonl"), default=None,
                        help="file format (default: from the extension: .csv, .tsv, .jsonl)")
    parser.add_argument("--quoting", choices=QUOTING, default=None,
                        help="none: every delimiter separates fields and quotes are text (TSV's default, as GLUE's "
                             "reader); csv: a quoted field may hold the delimiter or line breaks (CSV's default)")
    parser.add_argument("--id-column", default=None, help="column copied to the prediction files (default: line number)")


def own_data_epilog(defaults) -> str:
    return (f"One run by default (learning rate {defaults.single_learning_rate:g}, batch {defaults.single_batch_size}, "
            f"{defaults.single_epochs:g} epochs: transformers' Trainer defaults); --grid paper runs {defaults.anchor}; "
            "comma lists make any grid, best on dev wins.")


class TokenClassificationTask(NerTask):
    """token classification (NER, any tag set) on your own CoNLL-style or JSON lines files"""

    defaults = TOKEN_DEFAULTS
    own_data = True
    skipped_settings = ("subset_seed",)  # quick runs keep the first sentences, as ner's

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        add_file_arguments(parser, "CoNLL-style (token ... tag per line, blank line between sentences) or "
                                   ".jsonl ({\"tokens\": [...], \"tags\": [...]} per line)")
        parser.add_argument("--tag-column", type=flags.positive_int, default=None,
                            help="CoNLL-style: the tag's column, counting from 1 (default: the last)")
        parser.add_argument("--tokens-field", default="tokens", help="JSON lines: the tokens' field (default tokens)")
        parser.add_argument("--tags-field", default="tags", help="JSON lines: the tags' field (default tags)")
        add_tagging_arguments(parser)

    @classmethod
    def epilog(cls) -> str:
        return own_data_epilog(cls.defaults)

    @classmethod
    def run_finetune(cls, args) -> int:
        check_finetune_output(args)
        settings = cls.settings_from_args(args)
        if settings.eval_steps:
            raise BertkitError("--eval-steps: token classification scores dev after each run (or, with "
                               "--early-stopping-patience, after each epoch)")
        result = finetune_token_classification(
            args.model, args.train_file, args.dev_file, args.output, args.test_file, tag_column=args.tag_column,
            tokens_field=args.tokens_field, tags_field=args.tags_field, doc_context=args.doc_context,
            cased=args.cased, settings=settings)
        best = result.document["best"]
        scores = "" if best["dev"] is None else \
            f": dev F1 {best['dev']['f1']:.4f}, accuracy {best['dev']['accuracy']:.4f}"
        log.info(f"{Path(args.train_file).stem}: best run {config_text(best['config'])}{scores}; wrote {args.output}")
        return 0

    @classmethod
    def benchmarks(cls) -> tuple:
        return ()  # CoNLL-2003 stays under the `ner` task


class MultipleChoiceFiles(MultipleChoiceTask):
    """multiple choice on your own CSV / TSV / JSON lines files"""

    defaults = MC_DEFAULTS
    own_data, skipped_settings = True, ()

    def __init__(self, train_file, dev_file=None, test_file=None, reader=None):
        super().__init__(train_file, dev_file, test_file, reader, task_name="multiple-choice", requires_dev=False)

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        add_file_arguments(parser, "CSV, TSV (with a header row) or JSON lines")
        parser.add_argument("--question-column", default="question", help="column holding the question (or prompt)")
        parser.add_argument("--context-column", default=None,
                            help="column holding a passage read before the question (optional)")
        parser.add_argument("--choice-columns", default="choices", type=flags.comma_list(str),
                            help="comma list of the columns holding the choices, or one column holding a list "
                                 "(default choices)")
        parser.add_argument("--label-column", default="label",
                            help="column holding the answer: a choice column's name, a 0-based number or the text")
        add_table_arguments(parser)

    @classmethod
    def epilog(cls) -> str:
        return own_data_epilog(cls.defaults)

    @classmethod
    def run_finetune(cls, args) -> int:
        check_finetune_output(args)
        finetune_choices(args.model, args.train_file, args.dev_file, args.output, args.test_file,
                         question_column=args.question_column, choice_columns=args.choice_columns,
                         label_column=args.label_column, context_column=args.context_column,
                         id_column=args.id_column, file_format=args.file_format, quoting=args.quoting,
                         settings=cls.settings_from_args(args))
        return 0

    @classmethod
    def benchmarks(cls) -> tuple:
        return ()  # multiple_choice.py's SWAG-format benchmarks stay under the `swag` task


class QuestionAnsweringTask(squad.SquadTask):
    """extractive question answering on your own SQuAD v1.1 / v2.0 JSON files"""

    defaults = QA_DEFAULTS
    own_data = True
    skipped_settings = ("dev_fraction", "split_seed")  # dev is a SQuAD file: questions are not split off

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        parser.add_argument("--train-file", required=True, help="training data: SQuAD JSON (v1.1, or v2.0 with "
                                                                "is_impossible)")
        parser.add_argument("--dev-file", default=None,
                            help="dev data, same layout, with answers: selects the best run (without it: one run "
                                 "trained and saved without selection)")
        squad.add_window_arguments(parser)

    @classmethod
    def epilog(cls) -> str:
        return own_data_epilog(cls.defaults)

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "QuestionAnsweringTask":
        return cls(args.train_file, args.dev_file, version=args.version, **squad.window_options(args))
