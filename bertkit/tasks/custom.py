"""Fine-tuning on your own files: `bertkit finetune text-classification | token-classification |
multiple-choice | question-answering`.

Each task reads the user's files (user_files.py, or SQuAD-format JSON) into the examples a benchmark
task already trains on, and runs that task's machinery unchanged: sentence (pair) classification
and regression are GLUE's features, sweep protocol (grid x restarts, best on dev), results.json and
metrics.jsonl; token classification is ner.py's windows, tag handling and conlleval chunk F1;
multiple choice is multiple_choice.py's; question answering is squad.py's windows, n-best search,
null threshold and official scorer inside the same sweep protocol. Labels are the user's:
config.json's id2label / label2id hold them, so `bertkit predict` and `bertkit.pipeline` answer
with the user's label names.

Each task is a class with the task surface (tasks/common.py) and one line in tasks/registry.py;
their BENCHMARKS are empty, so `bertkit reproduce` does not run them. Every finetune returns a
TaskResult and writes the best model to OUTPUT/model.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Sequence

from .. import flags
from ..batching import predict_batches
from ..errors import BertkitError
from ..heads import BertForMultipleChoice, BertForSequenceClassification, BertForTokenClassification
from ..hub import model_tokenizer
from ..metrics.conll import evaluate_conll
from ..metrics.glue import accuracy, pearson, spearman
from ..outputs import write_json
from . import squad
from .arguments import FINETUNE_DROPOUT, add_sweep_arguments, check_finetune_output, dropout_overrides, sweep_options
from .examples import subsample
from .results import TaskResult, publish_best_metrics, results_document, write_predictions
from .runs import config_text, grid
from .sweep import predict_precision, run_protocol, train_one
from .conll_data import ner_features
from .glue import GlueTask, classification_predictions, glue_features
from .multiple_choice import choices, finetune_multiple_choice, multiple_choice_features
from .ner import finetune_ner, predict_ner
from .squad_windows import WindowInputs
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


def finetune_text_classification(model_dir, train_file, dev_file, output_dir=None, test_file=None, *,
                                 text_column: str = "text", text_pair_column: str | None = None,
                                 label_column: str = "label", id_column: str | None = None,
                                 regression: bool | None = None, file_format: str | None = None,
                                 learning_rates=(5e-5, 4e-5, 3e-5, 2e-5), epochs=(3,), batch_sizes=(32,),
                                 seeds=(42,), max_seq_length: int = 128, max_train_examples: int | None = None,
                                 precision: str = "auto", device: str = "auto", skip_bad_rows: bool = False,
                                 eval_batch_size: int = 128, warmup_ratio: float = 0.1, weight_decay: float = 0.01,
                                 dropout: float | None = FINETUNE_DROPOUT, logging_steps: int = 50,
                                 eval_steps: int = 0, resume: bool = False) -> TaskResult:
    """Fine-tune BertForSequenceClassification on the user's CSV / TSV / JSON lines files with GLUE's
    protocol; the TaskResult's document is results.json.

    Labels: any strings, sorted (numerically when all are whole numbers) into config.json's
    id2label; regression (one output, MSE loss) when `regression` is True, or when None and every
    training label is a number with some fraction among them. With output_dir: results.json,
    dev_predictions.tsv (and test_predictions.tsv), model/ and metrics.jsonl (the best run's; every
    run's in runs/<run>/)."""
    read = functools.partial(read_text_file, text_column=text_column, label_column=label_column,
                             text_pair_column=text_pair_column, id_column=id_column, skip_bad_rows=skip_bad_rows,
                             fmt=file_format)
    train, dev = read(train_file), read(dev_file)  # every row with a label (checked while reading)
    is_regression_task = is_regression(train, regression)
    labels = None if is_regression_task else sorted_labels(e.label for e in train)
    if labels is not None and len(labels) < 2:
        raise BertkitError(f"every training label is {labels[0]!r}: a classifier needs at least two",
                           path=train.path)
    train, dev = check_labels(train, labels, skip_bad_rows), check_labels(dev, labels, skip_bad_rows)
    test = check_labels(read(test_file, labels_optional=True), labels, skip_bad_rows) if test_file else None
    if len(dev) < (2 if is_regression_task else 1):
        raise BertkitError(f"the dev file has {len(dev)} usable examples: too few to score", path=dev.path)

    name = Path(train_file).stem
    spec = GlueTask(name=name, folder=name, text_a=text_column, text_b=text_pair_column, label=label_column,
                    labels=None if labels is None else tuple(labels))
    tokenizer = model_tokenizer(model_dir)
    train_features = glue_features(subsample(train, max_train_examples), tokenizer, spec, max_seq_length)
    dev_features = glue_features(dev, tokenizer, spec, max_seq_length)
    gold = [e.label if is_regression_task else labels.index(e.label) for e in dev]
    if is_regression_task:
        head = dict(num_labels=1, id2label={0: label_column}, problem_type="regression")
    else:
        head = dict(id2label=dict(enumerate(labels)), problem_type="single_label_classification")
    head.update(dropout_overrides(dropout))

    def build_model():
        return BertForSequenceClassification.from_pretrained(model_dir, **head)

    def outputs_of(model, features) -> list:
        logits = predict_batches(model, features, batch_size=eval_batch_size, pad_token_id=tokenizer.pad_token_id,
                         precision=predict_precision(model, precision))["logits"]
        return classification_predictions(spec, logits)

    def evaluate(model):
        predictions = outputs_of(model, dev_features)
        return classification_metrics(predictions, gold, is_regression_task), {"dev": predictions}

    selection = "score" if is_regression_task else "accuracy"
    configs = grid(learning_rates, epochs, batch_sizes, seeds)
    kind = "regression" if is_regression_task else f"{len(labels)} labels ({', '.join(labels[:10])}" + \
        (", ...)" if len(labels) > 10 else ")")
    log.info(f"{name}: {len(train_features)} train / {len(dev_features)} dev examples, {kind}, "
             f"{len(configs)} run(s) (grid x seeds), max length {max_seq_length}")
    splits = {"train": train, "dev": dev, **({"test": test} if test is not None else {})}
    for split, examples in splits.items():
        if examples.skipped:
            log.warning(f"{name}: skipped {len(examples.skipped)} bad {split} row(s), first: {examples.skipped[0]}")
    runs_dir = None if output_dir is None else Path(output_dir) / "runs"
    best, runs = run_protocol(configs, build_model, train_features, evaluate, score=lambda m: m[selection],
                              precision=precision, device=device, warmup_ratio=warmup_ratio,
                              weight_decay=weight_decay, pad_token_id=tokenizer.pad_token_id, label=name,
                              runs_dir=runs_dir, logging_steps=logging_steps, eval_steps=eval_steps, resume=resume,
                              identity={"model": str(model_dir), "max_seq_length": max_seq_length, "dropout": dropout,
                                        "dev_examples": len(dev_features)})
    results = results_document("text-classification", best, runs, {
        "train_file": str(train_file), "dev_file": str(dev_file), "test_file": None if test is None else str(test_file),
        "columns": {"text": text_column, "text_pair": text_pair_column, "label": label_column, "id": id_column},
        "problem_type": "regression" if is_regression_task else "single_label_classification",
        "labels": labels, "num_train_examples": len(train_features), "num_dev_examples": len(dev_features),
        "max_seq_length": max_seq_length, "skipped_rows": {s: len(e.skipped) for s, e in splits.items()},
        "selection": "best dev " + ("mean of Pearson and Spearman" if is_regression_task else "accuracy")})
    result = TaskResult(task="text-classification", metric=selection, metrics=best.metrics,
                        run_metrics=[r.metrics for r in runs], document=results)

    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        model, outputs = best.artifacts

        def shown(p):
            return f"{p:.6g}" if is_regression_task else labels[p]

        write_predictions(out / "dev_predictions.tsv", [e.index for e in dev], [shown(p) for p in outputs["dev"]])
        if test is not None:
            features = [{k: v for k, v in f.items() if k != "labels"}
                        for f in glue_features(test, tokenizer, spec, max_seq_length)]
            predictions = outputs_of(model, features) if features else []
            write_predictions(out / "test_predictions.tsv", [e.index for e in test], [shown(p) for p in predictions])
            if test and all(e.label is not None for e in test):
                test_gold = [e.label if is_regression_task else labels.index(e.label) for e in test]
                results["test_metrics"] = classification_metrics(predictions, test_gold, is_regression_task)
        model.save_pretrained(out / "model", tokenizer=tokenizer)
        publish_best_metrics(runs_dir, best, out)
        write_json(out / "results.json", results)
        result.output_dir, result.model_dir = str(out), str(out / "model")
        log.info(f"{name}: best run {config_text(best.config)} (dev {selection} {best.score:.4f}); wrote {out}")
    return result


# ---------------------------------------------------------------- token classification


def finetune_token_classification(model_dir, train_file, dev_file, output_dir=None, test_file=None, *,
                                  tag_column: int | None = None, tokens_field: str = "tokens",
                                  tags_field: str = "tags", skip_bad_rows: bool = False,
                                  max_train_examples: int | None = None, **options) -> TaskResult:
    """Fine-tune BertForTokenClassification on the user's CoNLL-style or JSON lines files, any tag
    set, with ner.py's windows and sweep (`options` are finetune_ner's: learning_rates, epochs,
    batch_sizes, seeds, max_seq_length, doc_context, cased, ...). Tags are trained as written (IOB1,
    IOB2, IOBES, or a tag set without chunks); the best run is the one with the best dev chunk F1
    (conlleval, which reads all three chunk schemes), or token accuracy for a tag set without chunks.
    Writes (with output_dir) what finetune_ner writes: model/, results.json, dev/test predictions,
    metrics.jsonl."""
    read = functools.partial(read_tagged_file, tag_column=tag_column, skip_bad_rows=skip_bad_rows,
                             tokens_field=tokens_field, tags_field=tags_field)
    train, _ = read(train_file)
    known = {t for s in train.sentences for t in s.tags}
    if len(known) < 2:
        raise BertkitError(f"every training tag is {next(iter(known))!r}: a tagger needs at least two", path=train.path)
    data = {"train": train}
    for split, path in (("valid", dev_file), ("test", test_file)):
        if path is not None:
            checked = check_tags(*read(path), known, skip_bad_rows)
            if not checked.sentences:
                raise BertkitError("no sentences left to evaluate", path=checked.path)
            checked.scheme = train.scheme  # predictions are written in the training file's scheme
            data[split] = checked
    select_on = "accuracy" if train.scheme == "tags" else "f1"
    result = finetune_ner(model_dir, output_dir=output_dir, data=data, skip_bad_rows=skip_bad_rows,
                          max_train_examples=max_train_examples, select_on=select_on, **options)
    result.task, result.metric = "token-classification", select_on
    result.document["task"] = "token-classification"
    result.document["tag_scheme"]["file"] = train.scheme
    if output_dir is not None:
        write_json(Path(output_dir) / "results.json", result.document)
    return result


# ---------------------------------------------------------------- multiple choice


def finetune_choices(model_dir, train_file, dev_file, output_dir=None, test_file=None, *,
                     question_column: str = "question", choice_columns: Sequence[str] = ("choices",),
                     label_column: str = "label", context_column: str | None = None, id_column: str | None = None,
                     file_format: str | None = None, **options) -> TaskResult:
    """Fine-tune BertForMultipleChoice on the user's CSV / TSV / JSON lines files with
    multiple_choice.py's protocol (`options` are finetune_multiple_choice's)."""
    reader = functools.partial(_read_choices, question_column=question_column, choice_columns=list(choice_columns),
                               label_column=label_column, context_column=context_column, id_column=id_column,
                               fmt=file_format)
    return finetune_multiple_choice(model_dir, train_file, dev_file, output_dir, test_file=test_file, reader=reader,
                                    task_name="multiple-choice", **options)


def _read_choices(path, skip_bad_rows=False, **columns):
    return read_choice_file(path, skip_bad_rows=skip_bad_rows, **columns)


# ---------------------------------------------------------------- extractive question answering


def finetune_question_answering(model_dir, train_file, dev_file, output_dir=None, *, version: str | None = None,
                                learning_rates=(5e-5,), epochs=(3,), batch_sizes=(32,), seeds=(42,),
                                grad_accum: int = 1, max_seq_length: int = squad.MAX_SEQ_LENGTH, doc_stride: int = 128,
                                max_query_length: int = 64, n_best_size: int = 20, max_answer_length: int = 30,
                                null_score_diff_threshold: float = 0.0, search_null_threshold: bool = True,
                                max_train_examples: int | None = None, max_eval_examples: int | None = None,
                                subset_seed: int = 0, precision: str = "auto", device: str = "auto",
                                skip_bad_rows: bool = False, eval_batch_size: int = 64, warmup_ratio: float = 0.1,
                                weight_decay: float = 0.01, logging_steps: int = 50, eval_steps: int = 0,
                                resume: bool = False, dropout: float | None = FINETUNE_DROPOUT) -> TaskResult:
    """Fine-tune BertForQuestionAnswering on the user's SQuAD-format JSON (v1.1, or v2.0 with
    is_impossible) over the grid lr x epochs x batch size x seeds; the best run on dev F1 wins.

    Every run predicts the dev file as `bertkit finetune squad` does (windows, n-best, and for v2.0
    the null threshold searched on the dev answers unless search_null_threshold is False) and is
    scored by the official evaluator: its metrics are the official exact match and F1 (v2.0 also
    HasAns / NoAns and best_*) as fractions, at the applied threshold. `batch_sizes` are effective
    batches of grad_accum micro-batches. With output_dir: results.json (every run, the best,
    mean / sd / median per setting, the best run's official metrics), the best run's
    predictions.json, nbest_predictions.json (and null_odds.json), model/ and metrics.jsonl (every
    run's in runs/<run>/)."""
    uneven = [b for b in batch_sizes if b % grad_accum]
    if uneven:
        raise BertkitError(f"--batch-size {uneven[0]} is not a multiple of --grad-accum {grad_accum}")
    configs = grid(learning_rates, epochs, batch_sizes, seeds)
    if dev_file is None:
        raise BertkitError("question answering needs a dev file with answers: the best run is chosen on dev F1")
    train_data, dev_data = squad.read_train_dev(train_file, dev_file, version, skip_bad_rows)
    if not dev_data.has_answers:
        raise BertkitError("the dev file has no answers: the best run is chosen on dev F1", path=str(dev_file))
    is_v2 = train_data.version == "2.0"
    tokenizer = model_tokenizer(model_dir)
    train_examples = subsample(train_data.examples, max_train_examples, subset_seed)
    dev_examples = subsample(dev_data.examples, max_eval_examples, subset_seed)
    windows = squad.training_windows(train_examples, tokenizer, max_seq_length, doc_stride, max_query_length,
                                     train_file)
    answering = dict(max_seq_length=max_seq_length, doc_stride=doc_stride, max_query_length=max_query_length,
                     n_best_size=n_best_size, max_answer_length=max_answer_length,
                     null_score_diff_threshold=null_score_diff_threshold)

    def evaluate(model):
        predicted = squad.predict_squad(model, tokenizer, dev_examples, is_v2, batch_size=eval_batch_size,
                                        precision=predict_precision(model, precision), **answering)
        official, applied = squad.score_predictions(dev_examples, predicted, search_null_threshold)
        return squad.headline_metrics(official), {"official": official, "predictions": applied}

    name = Path(train_file).stem
    log.info(f"{name}: SQuAD {train_data.version}, {len(train_examples)} train questions ({len(windows)} windows) / "
             f"{len(dev_examples)} dev questions, {len(configs)} run(s) (grid x seeds), max length {max_seq_length}")
    runs_dir = None if output_dir is None else Path(output_dir) / "runs"
    best, runs = run_protocol(configs, lambda: squad.HEAD.from_pretrained(model_dir, **dropout_overrides(dropout)),
                              WindowInputs(windows.windows, with_labels=True), evaluate, score=lambda m: m["f1"],
                              precision=precision, device=device, warmup_ratio=warmup_ratio,
                              weight_decay=weight_decay, pad_token_id=tokenizer.pad_token_id, label=name,
                              train=functools.partial(train_one, grad_accum=grad_accum), runs_dir=runs_dir,
                              logging_steps=logging_steps, eval_steps=eval_steps, resume=resume,
                              identity={"model": str(model_dir), "max_seq_length": max_seq_length,
                                        "doc_stride": doc_stride, "dev_questions": len(dev_examples),
                                        "grad_accum": grad_accum, "dropout": dropout})
    model, outputs = best.artifacts
    selection = "best dev F1" + (" at the null threshold searched on dev" if is_v2 and search_null_threshold
                                 else " at --null-score-diff-threshold" if is_v2 else "")
    results = results_document("question-answering", best, runs, {
        "version": train_data.version, "model": str(model_dir), "train_file": str(train_file),
        "dev_file": str(dev_file), "num_train_examples": len(train_examples), "num_train_windows": len(windows),
        "train_skipped_unrecoverable": len(windows.skipped_unrecoverable), "num_dev_examples": len(dev_examples),
        "bad_rows_skipped": train_data.bad_rows_skipped + dev_data.bad_rows_skipped,
        "grad_accum": grad_accum, **answering, "selection": selection,
        "official_metrics": outputs["official"]})  # the best run's, in the official scripts' percent
    result = TaskResult(task="question-answering", metric="f1", metrics=best.metrics,
                        run_metrics=[r.metrics for r in runs], document=results)
    if output_dir is not None:
        out = Path(output_dir)
        outputs["predictions"].write(out)
        model.save_pretrained(out / "model", tokenizer=tokenizer)
        publish_best_metrics(runs_dir, best, out)
        write_json(out / "results.json", results)
        result.output_dir, result.model_dir = str(out), str(out / "model")
        log.info(f"{name}: best run {config_text(best.config)} (dev F1 {100 * best.score:.2f}); wrote {out}")
    return result


# ---------------------------------------------------------------- command line


def _add_file_arguments(parser, what: str) -> None:
    parser.add_argument("--train-file", required=True, help=f"training data: {what}")
    parser.add_argument("--dev-file", required=True, help="dev data, same layout: selects the best run")
    parser.add_argument("--test-file", default=None, help="data to predict after training (labels optional)")


def _add_table_arguments(parser) -> None:
    parser.add_argument("--format", dest="file_format", choices=("csv", "tsv", "jsonl"), default=None,
                        help="file format (default: from the extension: .csv, .tsv, .jsonl)")
    parser.add_argument("--id-column", default=None, help="column copied to the prediction files (default: line number)")


def _finetune_options(args) -> dict:
    options = sweep_options(args)
    options.pop("max_train_examples")
    return options


class TextClassification:
    """sentence (pair) classification or regression on your own CSV / TSV / JSON lines files"""

    HEAD = BertForSequenceClassification
    read = staticmethod(read_text_file)
    featurize = staticmethod(glue_features)
    postprocess = staticmethod(classification_predictions)
    score = staticmethod(classification_metrics)
    finetune = staticmethod(finetune_text_classification)
    BENCHMARKS = ()

    @staticmethod
    def add_finetune_arguments(parser) -> None:
        _add_file_arguments(parser, "CSV, TSV (with a header row) or JSON lines")
        parser.add_argument("--text-column", default="text", help="column holding the text (default text)")
        parser.add_argument("--text-pair-column", default=None, help="column holding the second text of a pair")
        parser.add_argument("--label-column", default="label", help="column holding the label (default label)")
        kind = parser.add_mutually_exclusive_group()
        kind.add_argument("--regression", dest="regression", action="store_true", default=None,
                          help="labels are numbers to predict (default: when some training label has a fraction)")
        kind.add_argument("--classification", dest="regression", action="store_false",
                          help="labels are classes even when they are numbers like 0.5")
        _add_table_arguments(parser)
        add_sweep_arguments(parser, learning_rates="5e-5,4e-5,3e-5,2e-5", batch_sizes="32", epochs="3")
        parser.epilog = "Defaults follow the paper's GLUE protocol: batch 32, 3 epochs, lr chosen on dev among four."

    @staticmethod
    def run_finetune(args) -> int:
        check_finetune_output(args)
        finetune_text_classification(
            args.model, args.train_file, args.dev_file, args.output, args.test_file, text_column=args.text_column,
            text_pair_column=args.text_pair_column, label_column=args.label_column, id_column=args.id_column,
            regression=args.regression, file_format=args.file_format, max_train_examples=args.max_train_examples,
            **_finetune_options(args))
        return 0


class TokenClassification:
    """token classification (NER, any tag set) on your own CoNLL-style or JSON lines files"""

    HEAD = BertForTokenClassification
    read = staticmethod(read_tagged_file)
    featurize = staticmethod(ner_features)
    postprocess = staticmethod(predict_ner)
    score = staticmethod(evaluate_conll)
    finetune = staticmethod(finetune_token_classification)
    BENCHMARKS = ()

    @staticmethod
    def add_finetune_arguments(parser) -> None:
        _add_file_arguments(parser, "CoNLL-style (token ... tag per line, blank line between sentences) or "
                                    ".jsonl ({\"tokens\": [...], \"tags\": [...]} per line)")
        parser.add_argument("--tag-column", type=flags.positive_int, default=None,
                            help="CoNLL-style: the tag's column, counting from 1 (default: the last)")
        parser.add_argument("--tokens-field", default="tokens", help="JSON lines: the tokens' field (default tokens)")
        parser.add_argument("--tags-field", default="tags", help="JSON lines: the tags' field (default tags)")
        parser.add_argument("--doc-context", action="store_true",
                            help="fill each window with neighbouring sentences of the same document")
        case = parser.add_mutually_exclusive_group()
        case.add_argument("--cased", dest="cased", action="store_true", default=None,
                          help="keep case (default: do_lower_case from the model's tokenizer_config.json)")
        case.add_argument("--uncased", dest="cased", action="store_false", help="lower-case and strip accents")
        add_sweep_arguments(parser, learning_rates="5e-5", batch_sizes="32", epochs="3")

    @staticmethod
    def run_finetune(args) -> int:
        check_finetune_output(args)
        if args.eval_steps:
            raise BertkitError("--eval-steps: token classification scores dev after each run only")
        options = _finetune_options(args)
        for unused in ("skip_bad_rows", "eval_steps"):
            options.pop(unused)
        result = finetune_token_classification(
            args.model, args.train_file, args.dev_file, args.output, args.test_file, tag_column=args.tag_column,
            tokens_field=args.tokens_field, tags_field=args.tags_field, skip_bad_rows=args.skip_bad_rows,
            max_train_examples=args.max_train_examples, doc_context=args.doc_context, cased=args.cased, **options)
        best = result.document["best"]
        log.info(f"{Path(args.train_file).stem}: best run {config_text(best['config'])}: dev F1 "
                 f"{best['dev']['f1']:.4f}, accuracy {best['dev']['accuracy']:.4f}; wrote {args.output}")
        return 0


class MultipleChoice:
    """multiple choice on your own CSV / TSV / JSON lines files"""

    HEAD = BertForMultipleChoice
    read = staticmethod(read_choice_file)
    featurize = staticmethod(multiple_choice_features)
    postprocess = staticmethod(choices)
    score = staticmethod(accuracy)
    finetune = staticmethod(finetune_choices)
    BENCHMARKS = ()

    @staticmethod
    def add_finetune_arguments(parser) -> None:
        _add_file_arguments(parser, "CSV, TSV (with a header row) or JSON lines")
        parser.add_argument("--question-column", default="question", help="column holding the question (or prompt)")
        parser.add_argument("--context-column", default=None,
                            help="column holding a passage read before the question (optional)")
        parser.add_argument("--choice-columns", default="choices", type=flags.comma_list(str),
                            help="comma list of the columns holding the choices, or one column holding a list "
                                 "(default choices)")
        parser.add_argument("--label-column", default="label",
                            help="column holding the answer: a choice column's name, a 0-based number or the text")
        _add_table_arguments(parser)
        add_sweep_arguments(parser, learning_rates="2e-5", batch_sizes="16", epochs="3")

    @staticmethod
    def run_finetune(args) -> int:
        check_finetune_output(args)
        finetune_choices(args.model, args.train_file, args.dev_file, args.output, args.test_file,
                         question_column=args.question_column, choice_columns=args.choice_columns,
                         label_column=args.label_column, context_column=args.context_column,
                         id_column=args.id_column, file_format=args.file_format, **sweep_options(args))
        return 0


class QuestionAnswering:
    """extractive question answering on your own SQuAD v1.1 / v2.0 JSON files"""

    HEAD = squad.HEAD
    read = staticmethod(squad.read)
    featurize = staticmethod(squad.featurize)
    postprocess = staticmethod(squad.postprocess)
    score = staticmethod(squad.score)
    finetune = staticmethod(finetune_question_answering)
    BENCHMARKS = ()  # squad.py's SQuAD benchmarks stay under the `squad` task

    @staticmethod
    def add_finetune_arguments(parser) -> None:
        parser.add_argument("--train-file", required=True, help="training data: SQuAD JSON (v1.1, or v2.0 with "
                                                                "is_impossible)")
        parser.add_argument("--dev-file", required=True, help="dev data, same layout, with answers: selects the best run")
        add_sweep_arguments(parser, learning_rates="5e-5", batch_sizes="32", epochs="3",
                            max_seq_length=squad.MAX_SEQ_LENGTH)
        parser.add_argument("--max-eval-examples", type=flags.positive_int, default=None,
                            help="evaluate on a seeded random sample of N dev questions (quick runs)")
        parser.add_argument("--subset-seed", type=flags.seed, default=0,
                            help="seed of the --max-train-examples / --max-eval-examples samples (default 0)")
        parser.add_argument("--grad-accum", type=flags.positive_int, default=1,
                            help="micro-batches per step: each --batch-size must be a multiple of it")
        squad.add_window_arguments(parser)
        parser.epilog = ("Defaults follow the paper's SQuAD settings: lr 5e-5, batch 32, 3 epochs, windows of 384; "
                         "comma lists run the grid and restarts, best dev F1 wins.")

    @staticmethod
    def run_finetune(args) -> int:
        check_finetune_output(args)
        finetune_question_answering(
            args.model, args.train_file, args.dev_file, args.output, version=args.version,
            grad_accum=args.grad_accum, doc_stride=args.doc_stride, max_query_length=args.max_query_length,
            n_best_size=args.n_best_size, max_answer_length=args.max_answer_length,
            null_score_diff_threshold=args.null_score_diff_threshold,
            search_null_threshold=not args.no_threshold_search, max_eval_examples=args.max_eval_examples,
            subset_seed=args.subset_seed, **sweep_options(args))
        return 0
