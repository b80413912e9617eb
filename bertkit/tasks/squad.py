"""SQuAD v1.1 / v2.0 span question answering, following Google's run_squad.py (paper §4.2-4.3, appendix A.3).

Read the official JSON -> sliding windows over each passage (`squad_windows`, see
squad_windows.py) -> BertForQuestionAnswering (start/end logits, loss (CE(start) + CE(end)) / 2)
-> `postprocess_predictions`: the original's n-best search and answer text -> the official
evaluators (bertkit.metrics.squad).

Post-processing, as the original's write_predictions:
- per window, the `n_best_size` highest start and end logits (ties: lower position first); a pair
  is a candidate when both positions lie in the passage part of the window, the start token has
  its maximum context in this window, end >= start and the span has at most `max_answer_length`
  tokens; candidates of all windows are ranked by start + end logit and de-duplicated by text;
- the text is `context[start of first token : end of last token]`, an exact substring of the
  passage. The original rebuilds it from whitespace words and `get_final_text`; for ordinary text
  both agree (tests/tasks/test_squad_windows.py checks it on the dev set). They differ only where
  the original's version is lossy: it joins words with one space (a span crossing a line break or
  a double space) and falls back to whole words when its character alignment fails;
- v2.0: the null score is start_logit[0] + end_logit[0] ([CLS]) of the window where it is
  smallest; the null answer joins the candidates; the prediction is "" when null score - best
  non-null score > `null_score_diff_threshold` (tau). null_odds.json holds that difference per
  question (the official evaluator's na_prob input). With gold answers at hand, tau is also
  searched to maximise F1 (bertkit.metrics.squad.best_null_threshold) and applied; results.json
  reports the scores at the default and at the best tau;
- the original's rare edge cases are kept: a question with no valid span predicts "empty" (v1.1)
  or "" with null odds 1e6 (v2.0, where the original would crash).
tests/tasks/test_squad_postprocess.py checks predictions, n-best lists and null odds against
transformers' line-by-line port of write_predictions on real passages.

Differences from the original, all deliberate: the passage is tokenized once with offsets rather
than word by word (identical WordPiece tokens for ordinary whitespace); a training question with
several answers uses the first (the original demands exactly one); logits are computed over the
unpadded window, so padding positions never take n-best slots.

No SQuAD v2.0 training set exists locally. The honest local v2.0 protocol splits the ARTICLES of
dev-v2.0 in two: train on one part, evaluate (and tune tau) on the other, never sharing a passage:

    bertkit finetune squad --model DIR --train-file dev-v2.0.json --dev-file dev-v2.0.json \\
        --article-split 0.5 --split-seed 0 --output OUT

`--article-split F` keeps a seeded random fraction F of the training file's articles (by title)
for training and drops every dev article with one of those titles. Any v2.0-format file works as
`--train-file`.

`SquadTask` is the task class (tasks/task.py) the runner runs (`finetune question-answering` on a
user's files); `SquadRunTask`, `finetune squad`, adds the article split, writes the run's record as
results.json and has the `predict squad` and `evaluate squad` commands: `finetune_squad`,
`predict_squad_file` and `evaluate_prediction_file` are their Python calls, all -> TaskResult (the official scripts report percent; the TaskResult's metrics are fractions, its
document keeps the official numbers). The fine-tuned model is saved in OUTPUT/model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from .. import flags
from ..inference.predict_batches import predict_batches
from ..device import add_precision_argument, pick_device, resolve_precision
from ..errors import BertkitError, counted
from ..heads import BertForQuestionAnswering
from ..hub.checkpoints import model_tokenizer
from ..metrics.squad import best_null_threshold, evaluate_squad, evaluate_v1, evaluate_v2
from ..outputs import check_output_dir, write_json
from . import runner
from .arguments import add_overwrite_argument, check_finetune_output
from .benchmarks import Benchmark, BenchmarkSettings
from .examples import subsample
from .results import PERCENT, TaskResult
from .runs import RunResult
from .settings import MIN_SEQ_LENGTH, Defaults, RunSettings
from .splits import Splits
from .sweep import predict_precision
from .sweep_state import restorable
from .task import Task
from .squad_windows import (SquadAnswer, SquadData, SquadExample, SquadWindow, WindowInputs, article_key,
                            article_split, check_is_max_context, read_squad, squad_json, squad_windows)

__all__ = ["SquadAnswer", "SquadExample", "SquadData", "SquadPredictions", "read_squad", "squad_json",
           "squad_windows", "check_is_max_context", "postprocess_predictions", "predict_squad",
           "score_predictions", "finetune_squad", "predict_squad_file", "evaluate_prediction_file", "article_split"]

log = logging.getLogger("bertkit")

NO_SPAN_NULL_ODDS = 1e6  # the original's "large and positive" null-score sentinel
MAX_SEQ_LENGTH = 384  # the paper's (and run_squad.py's) window length


# --------------------------------------------------------------------------- post-processing


@restorable  # a sweep's best run keeps them (sweep_state.py)
@dataclasses.dataclass
class SquadPredictions:
    predictions: dict[str, str]  # qid -> answer text ("" = no answer, v2.0)
    nbest: dict[str, list[dict]]  # qid -> [{text, probability, start_logit, end_logit}]
    version_2_with_negative: bool = False
    null_odds: dict[str, float] = dataclasses.field(default_factory=dict)  # v2.0: null - best non-null score
    best_non_null: dict[str, str] = dataclasses.field(default_factory=dict)  # v2.0: the answer when answering
    null_score_diff_threshold: float = 0.0

    def with_threshold(self, threshold: float) -> "SquadPredictions":
        """The v2.0 predictions at another null threshold tau ("" where null odds > tau)."""
        if not self.version_2_with_negative:
            return self
        predictions = {qid: "" if odds > threshold else self.best_non_null[qid] for qid, odds in self.null_odds.items()}
        return dataclasses.replace(self, predictions=predictions, null_score_diff_threshold=threshold)

    def write(self, output_dir: str | Path) -> list[Path]:
        """predictions.json, nbest_predictions.json and (v2.0) null_odds.json, as the original names them."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {"predictions.json": self.predictions, "nbest_predictions.json": self.nbest}
        if self.version_2_with_negative:
            files["null_odds.json"] = self.null_odds
        broken = [qid for qid, odds in self.null_odds.items() if not math.isfinite(odds)]
        if broken:  # a NaN would also make every threshold comparison false: no usable answer
            raise BertkitError(f"the model gave non-finite scores for {counted(len(broken), 'question')} "
                               f"(first: {broken[0]}); "
                               "its weights are probably broken (NaN or overflow)")
        for name, content in files.items():
            write_json(out / name, content, indent=4)
        return [out / name for name in files]


def _best_indexes(logits: list[float], n_best_size: int) -> list[int]:
    # sorted() is stable, so equal logits keep position order, as in the original.
    return sorted(range(len(logits)), key=lambda i: logits[i], reverse=True)[:n_best_size]


def _softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def postprocess_predictions(examples: Sequence[SquadExample], windows: Sequence[SquadWindow], start_logits,
                            end_logits, version_2_with_negative: bool = False, n_best_size: int = 20,
                            max_answer_length: int = 30, null_score_diff_threshold: float = 0.0) -> SquadPredictions:
    """The original's write_predictions. start_logits[i] / end_logits[i]: one value per position of
    windows[i] (tensors or lists). Returns predictions, n-best lists and (v2.0) null odds."""
    by_example: dict[int, list[int]] = defaultdict(list)
    for window_index, window in enumerate(windows):
        by_example[window.example_index].append(window_index)

    predictions, all_nbest, null_odds, best_non_null = {}, {}, {}, {}
    for example_index, example in enumerate(examples):
        prelim = []  # (score, window index, start, end, start logit, end logit), in the original's order
        score_null, null_window, null_start_logit, null_end_logit = NO_SPAN_NULL_ODDS, None, 0.0, 0.0
        for window_index in by_example.get(example_index, []):
            window = windows[window_index]
            starts, ends = _as_floats(start_logits[window_index]), _as_floats(end_logits[window_index])
            if len(starts) != len(window.input_ids) or len(ends) != len(window.input_ids):
                raise BertkitError(f"window {window_index} has {len(window.input_ids)} positions but "
                                   f"{len(starts)} start / {len(ends)} end logits")
            if version_2_with_negative and starts[0] + ends[0] < score_null:
                score_null, null_window = starts[0] + ends[0], window_index
                null_start_logit, null_end_logit = starts[0], ends[0]
            end_candidates = _best_indexes(ends, n_best_size)
            for start in _best_indexes(starts, n_best_size):
                if not window.is_context(start) or not window.is_max_context(start):
                    continue
                for end in end_candidates:
                    if not window.is_context(end) or end < start or end - start + 1 > max_answer_length:
                        continue
                    prelim.append((starts[start] + ends[end], window_index, start, end, starts[start], ends[end]))
        if version_2_with_negative and null_window is not None:
            prelim.append((score_null, null_window, 0, 0, null_start_logit, null_end_logit))
        prelim.sort(key=lambda p: p[0], reverse=True)  # stable: ties keep the original's order

        nbest, seen = [], set()
        for _, window_index, start, end, start_logit, end_logit in prelim:
            if len(nbest) >= n_best_size:
                break
            if start > 0:
                window = windows[window_index]
                text = example.context[window.char_span(start)[0]:window.char_span(end)[1]]
            else:
                text = ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": start_logit, "end_logit": end_logit})
        if version_2_with_negative and "" not in seen:
            nbest.append({"text": "", "start_logit": null_start_logit, "end_logit": null_end_logit})
        if not nbest:  # the original's nonce when no span is valid
            nbest.append({"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
        probabilities = _softmax([e["start_logit"] + e["end_logit"] for e in nbest])
        all_nbest[example.qid] = [{"text": e["text"], "probability": p, "start_logit": e["start_logit"],
                                   "end_logit": e["end_logit"]} for e, p in zip(nbest, probabilities)]
        if not version_2_with_negative:
            predictions[example.qid] = nbest[0]["text"]
            continue
        best = next((e for e in nbest if e["text"]), None)
        if best is None:
            best_non_null[example.qid], null_odds[example.qid] = "", NO_SPAN_NULL_ODDS
        else:
            best_non_null[example.qid] = best["text"]
            null_odds[example.qid] = score_null - best["start_logit"] - best["end_logit"]
        abstain = null_odds[example.qid] > null_score_diff_threshold
        predictions[example.qid] = "" if abstain else best_non_null[example.qid]
    return SquadPredictions(predictions, all_nbest, version_2_with_negative, null_odds, best_non_null,
                            null_score_diff_threshold)


def _as_floats(values) -> list[float]:
    return values.tolist() if hasattr(values, "tolist") else [float(v) for v in values]


# --------------------------------------------------------------------------- predict and score


@dataclasses.dataclass(frozen=True)
class Answering:
    """How questions become windows and windows answers (the original run_squad.py's flags)."""

    max_seq_length: int = MAX_SEQ_LENGTH
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0


def predict_squad(model, tokenizer, examples: Sequence[SquadExample], version_2_with_negative: bool = False,
                  batch_size: int = 64, device=None, precision: str = "fp32", **answering) -> SquadPredictions:
    """Windows -> start/end logits (BertForQuestionAnswering) -> the original's post-processing;
    `answering`: Answering's fields."""
    a = Answering(**answering)
    max_seq_length, doc_stride, max_query_length = a.max_seq_length, a.doc_stride, a.max_query_length
    n_best_size, max_answer_length, null_score_diff_threshold = a.n_best_size, a.max_answer_length, \
        a.null_score_diff_threshold
    if device is not None:
        model.to(pick_device(device) if isinstance(device, str) else device)
    run_device = next(model.parameters()).device
    windows = squad_windows(examples, tokenizer, max_seq_length, doc_stride, max_query_length, training=False)
    outputs = predict_batches(model, WindowInputs(windows.windows), batch_size=batch_size,
                      output_keys=("start_logits", "end_logits"), pad_token_id=tokenizer.pad_token_id,
                      device=run_device, precision=resolve_precision(precision, run_device))
    return postprocess_predictions(examples, windows.windows, outputs["start_logits"], outputs["end_logits"],
                                   version_2_with_negative, n_best_size, max_answer_length, null_score_diff_threshold)


def score_predictions(examples: Sequence[SquadExample], result: SquadPredictions,
                      search_threshold: bool = True) -> tuple[dict, SquadPredictions]:
    """Official metrics of `result` on these examples. v2.0: the scores at the given null threshold
    and, with `search_threshold`, at the tau maximising F1; returns (metrics, the predictions at the
    applied threshold)."""
    if not result.version_2_with_negative:
        return evaluate_v1(squad_json(examples, "1.1"), result.predictions), result
    dataset = squad_json(examples, "2.0")
    default = evaluate_v2(dataset, result.predictions, na_probs=result.null_odds)
    metrics = {"null_score_diff_threshold": result.null_score_diff_threshold,
               "default_threshold": {"null_score_diff_threshold": result.null_score_diff_threshold, **default}}
    if not search_threshold:
        return metrics, result
    threshold, _ = best_null_threshold(dataset, result.best_non_null, result.null_odds)
    tuned = result.with_threshold(threshold)
    metrics["best_threshold"] = {"null_score_diff_threshold": threshold,
                                 **evaluate_v2(dataset, tuned.predictions, na_probs=result.null_odds)}
    metrics["null_score_diff_threshold"] = threshold
    return metrics, tuned


def _scored(examples: Sequence[SquadExample], result: SquadPredictions, search_threshold: bool,
            has_answers: bool) -> tuple[dict | None, SquadPredictions]:
    if not has_answers:
        return None, result
    return score_predictions(examples, result, search_threshold)


def headline_metrics(metrics: dict | None) -> dict:
    """The official metrics at the applied null threshold (v2.0: the searched one when searched), as
    fractions: exact match and F1 (and their HasAns / NoAns parts) divided by 100; counts left out."""
    if not metrics:
        return {}
    applied = metrics.get("best_threshold") or metrics.get("default_threshold") or metrics
    return {k: v / PERCENT for k, v in applied.items()
            if isinstance(v, (int, float)) and ("exact" in k or "f1" in k) and "thresh" not in k}


def _result(record: dict, output_dir) -> TaskResult:
    metrics = headline_metrics(record.get("metrics"))
    task = "squad2" if record.get("version") == "2.0" else "squad"
    return TaskResult(task=task, metric="f1", metrics=metrics, run_metrics=[metrics] if metrics else [],
                      document=record, output_dir=None if output_dir is None else str(output_dir))


# --------------------------------------------------------------------------- fine-tune and predict (files)


def read_train_dev(train_file: str | Path, dev_file: str | Path | None, version: str | None = None,
                   skip_bad_rows: bool = False) -> tuple[SquadData, SquadData | None]:
    """The training file and the dev file (when given), both of one SQuAD version: `version`, or the
    one detected in both files."""
    train_data = read_squad(train_file, version, skip_bad_rows)
    dev_data = read_squad(dev_file, version, skip_bad_rows) if dev_file is not None else None
    if version is None and dev_data is not None and dev_data.version != train_data.version:
        raise BertkitError(f"the training file is SQuAD {train_data.version} but the dev file is "
                           f"{dev_data.version}; pass --version", path=str(dev_file))
    return train_data, dev_data


def training_windows(examples: Sequence[SquadExample], tokenizer, max_seq_length: int, doc_stride: int,
                     max_query_length: int, train_file: str | Path):
    """The labelled windows to train on. An answerable question without an answer is refused; one whose
    answer text is not at answer_start is skipped with a warning, as the original does."""
    for example in examples:
        if not example.is_impossible and not example.answers:
            raise BertkitError(f"training question {example.qid} is answerable but has no answer", path=str(train_file))
    windows = squad_windows(examples, tokenizer, max_seq_length, doc_stride, max_query_length, training=True)
    if windows.skipped_unrecoverable:
        log.warning(f"skipped {len(windows.skipped_unrecoverable)} training questions whose answer text is not at "
                    f"answer_start (as the original does)")
    return windows


# The paper's SQuAD settings (§4.2): lr 5e-5, batch 32, 3 epochs, windows of 384 (one run).
SQUAD_DEFAULTS = Defaults(learning_rates=(5e-5,), epochs=(3,), batch_sizes=(32,), max_seq_length=MAX_SEQ_LENGTH,
                          eval_batch_size=64, anchor="the paper's SQuAD settings (§4.2)")
WINDOW_OPTIONS = ("doc_stride", "max_query_length", "n_best_size", "max_answer_length", "null_score_diff_threshold",
                  "search_null_threshold")


def window_options(args) -> dict:
    """The flags of add_window_arguments as the keyword options of SquadTask and predict_squad_file."""
    return dict(doc_stride=args.doc_stride, max_query_length=args.max_query_length, n_best_size=args.n_best_size,
                max_answer_length=args.max_answer_length, null_score_diff_threshold=args.null_score_diff_threshold,
                search_null_threshold=not args.no_threshold_search)


class SquadTask(Task):
    """Extractive question answering on SQuAD v1.1 / v2.0 JSON files (the benchmark's or a user's):
    the windows, n-best search, null threshold and official scorer above, run by tasks/runner.py.
    `article_split_fraction`: the local v2.0 protocol (train and dev never share an article);
    `unanswered_dev`: a dev file without answers is predicted, not scored (no selection then)."""

    name = "question-answering"
    HEAD = BertForQuestionAnswering
    defaults = SQUAD_DEFAULTS
    metric = "f1"

    def __init__(self, train_file, dev_file=None, *, version: str | None = None,
                 article_split_fraction: float | None = None, split_seed: int = 0, unanswered_dev: bool = False,
                 eval_subset_seed: int | None = None, search_null_threshold: bool = True, **answering):
        """`answering`: how windows are made and answers picked (Answering's fields but max_seq_length,
        which is the run's)."""
        self.train_file, self.dev_file, self.version = train_file, dev_file, version
        self.label = Path(train_file).stem
        given = Answering(**answering)
        self.answering = {k: v for k, v in dataclasses.asdict(given).items() if k != "max_seq_length"}
        self.search_null_threshold = search_null_threshold
        self.article_split, self.unanswered_dev = (article_split_fraction, split_seed), unanswered_dev
        # known once read / encoded
        self.is_v2, self.windows, self.has_answers, self.split_record = False, None, True, None
        self.eval_subset_seed = eval_subset_seed  # None: dev is sampled with the runner's subset seed

    def read(self, skip_bad_rows: bool) -> Splits:
        train_data, dev_data = read_train_dev(self.train_file, self.dev_file, self.version, skip_bad_rows)
        if dev_data is not None and not dev_data.has_answers and not self.unanswered_dev:
            raise BertkitError("the dev file has no answers: the best run is chosen on dev F1", path=str(self.dev_file))
        self.has_answers = dev_data is not None and dev_data.has_answers
        self.is_v2 = train_data.version == "2.0"
        self.selection = "best dev F1" + (" at the null threshold searched on dev" if self.is_v2 and
                                          self.search_null_threshold else
                                          " at --null-score-diff-threshold" if self.is_v2 else "")
        train, dev = self.split_articles(train_data.examples, None if dev_data is None else dev_data.examples)
        return Splits(train, dev, details={
            "version": train_data.version, "train_file": str(self.train_file),
            "dev_file": None if self.dev_file is None else str(self.dev_file),
            "bad_rows_skipped": train_data.bad_rows_skipped + (0 if dev_data is None else dev_data.bad_rows_skipped)})

    def split_articles(self, train: list, dev: list | None) -> tuple[list, list | None]:
        """--article-split: a seeded fraction of the training file's articles to train on, dev outside them."""
        fraction, seed = self.article_split
        if fraction is None:
            return train, dev
        training_articles = article_split(train, fraction, seed)
        train = [e for e in train if article_key(e) in training_articles]
        self.split_record = {"fraction": fraction, "seed": seed, "training_articles": sorted(training_articles)}
        if dev is None:
            return train, None
        dev = [e for e in dev if article_key(e) not in training_articles]
        if not dev:
            raise BertkitError("the article split leaves no dev questions", path=str(self.dev_file))
        return train, dev

    def limit(self, splits: Splits, max_train, max_eval, seed) -> Splits:
        # A learning curve draws each seed's training subset but scores every run on one dev subset.
        eval_seed = seed if self.eval_subset_seed is None else self.eval_subset_seed
        train = subsample(splits.train, max_train, seed)
        return dataclasses.replace(splits, train=train,
                                   dev=None if splits.dev is None else subsample(splits.dev, max_eval, eval_seed))

    def tokenizer(self, model_dir):
        return model_tokenizer(model_dir)

    def encode(self, examples, tokenizer, max_seq_length: int):
        self.windows = training_windows(examples, tokenizer, max_seq_length, self.answering["doc_stride"],
                                        self.answering["max_query_length"], self.train_file)
        return WindowInputs(self.windows.windows, with_labels=True)

    def eval_features(self, examples, tokenizer, max_seq_length: int):
        return None  # predict_squad windows the questions itself

    def evaluate(self, model, examples, features, runtime, split: str):
        started = time.perf_counter()
        predicted = predict_squad(model, runtime.tokenizer, examples, self.is_v2, batch_size=runtime.eval_batch_size,
                                  precision=predict_precision(model, runtime.precision),
                                  max_seq_length=runtime.max_seq_length, **self.answering)
        official, applied = _scored(examples, predicted, self.search_null_threshold, self.has_answers)
        return headline_metrics(official), {"official": official, "predictions": applied,
                                            "seconds": time.perf_counter() - started}

    def describe(self, splits: Splits, train_features) -> str:
        dev = "no" if splits.dev is None else len(splits.dev)
        return (f"SQuAD {'2.0' if self.is_v2 else '1.1'}, {len(splits.train)} train questions "
                f"({len(self.windows)} windows) / {dev} dev questions")

    def details(self, splits: Splits, features: dict, runtime) -> dict:
        return {**splits.details, "num_train_windows": len(self.windows),
                "train_skipped_unrecoverable": len(self.windows.skipped_unrecoverable), **self.answering}

    def identity(self, splits: Splits) -> dict:
        return {"doc_stride": self.answering["doc_stride"],
                "dev_questions": 0 if splits.dev is None else len(splits.dev)}

    def best_details(self, outputs: dict) -> dict:
        """The best run's official metrics, in the official scripts' percent."""
        return {"official_metrics": outputs["dev"]["official"]} if outputs else {}

    def write_outputs(self, out: Path, model, outputs: dict, splits: Splits, runtime) -> dict:
        if outputs:
            outputs["dev"]["predictions"].write(out)
        return {}


class SquadRunTask(SquadTask):
    """SQuAD v1.1 / v2.0 question answering (paper §4.2, §4.3): fine-tune, predict, score.

    `bertkit finetune squad`: the paper's SQuAD run on the benchmark files (article split, a dev
    file with or without answers), its results.json the run's record as it always was: version,
    files, config, data counts, the training loop's figures and the official metrics."""

    phase = "squad"
    # --split-seed is the article split's (the dev split of the local v2.0 protocol)
    skipped_settings = ("dev_fraction",)

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        parser.add_argument("--train-file", required=True, help="SQuAD JSON (v1.1 or v2.0)")
        parser.add_argument("--dev-file", default=None, help="SQuAD JSON to predict and score after training")
        parser.add_argument("--article-split", type=flags.open_fraction, default=None, metavar="FRACTION",
                            help="train on this fraction of the training file's articles; evaluate only on dev "
                                 "articles outside it (the local SQuAD v2.0 protocol, see the module doc; seeded by "
                                 "--split-seed)")
        add_window_arguments(parser)

    @classmethod
    def from_args(cls, args, settings: RunSettings) -> "SquadRunTask":
        return cls(args.train_file, args.dev_file, settings=settings, version=args.version,
                   article_split_fraction=args.article_split, split_seed=settings.split_seed,
                   **window_options(args))

    @classmethod
    def run_finetune(cls, args) -> int:
        if not getattr(args, "resume", False):  # --resume continues the run in --output on purpose
            check_finetune_output(args)
        settings = cls.settings_from_args(args)
        record = runner.finetune(cls.from_args(args, settings), args.model, args.output, settings).document
        print(json.dumps(record.get("metrics"), indent=2))
        return 0

    @classmethod
    def add_predict_arguments(cls, parser) -> None:
        parser.add_argument("--model", required=True, help="fine-tuned SQuAD model directory")
        parser.add_argument("--input", required=True, help="SQuAD JSON to answer")
        parser.add_argument("--output", required=True, help="directory for predictions.json and friends")
        add_overwrite_argument(parser)
        parser.add_argument("--eval-batch-size", type=flags.positive_int, default=64,
                            help="windows per forward pass (default 64)")
        parser.add_argument("--max-examples", type=flags.positive_int, default=None,
                            help="a seeded random sample of questions")
        parser.add_argument("--allow-missing-weights", action="store_true",
                            help="predict even with a model that has no span head (its answers are random)")
        add_window_arguments(parser)
        parser.add_argument("--max-seq-length", type=flags.int_between(MIN_SEQ_LENGTH), default=MAX_SEQ_LENGTH)
        parser.add_argument("--device", default="auto", type=flags.device, help="auto | cpu | cuda | cuda:N")
        add_precision_argument(parser)
        parser.add_argument("--skip-bad-rows", action="store_true", help="skip (and count) malformed questions")
        parser.add_argument("--subset-seed", type=flags.seed, default=0, help="seed of the --max-examples sample")

    @classmethod
    def run_predict(cls, args) -> int:
        check_output_dir(args.output, overwrite=args.overwrite, kind="predictions")
        options = PredictOptions(**window_options(args), max_seq_length=args.max_seq_length,
                                 batch_size=args.eval_batch_size, device=args.device, precision=args.precision,
                                 max_examples=args.max_examples, subset_seed=args.subset_seed,
                                 skip_bad_rows=args.skip_bad_rows, allow_missing_weights=args.allow_missing_weights)
        record = predict_squad_file(args.model, args.input, args.output, args.version, options).document
        if record["metrics"] is not None:
            print(json.dumps(record["metrics"], indent=2))
        return 0

    @classmethod
    def add_evaluate_arguments(cls, parser) -> None:
        parser.add_argument("data_file", metavar="DATA_FILE", help="official SQuAD JSON (v1.1 or v2.0)")
        parser.add_argument("pred_file", metavar="PRED_FILE", help="predictions.json: question id -> answer text")
        parser.add_argument("--na-prob-file", default=None,
                            help="v2.0: question id -> no-answer score (null_odds.json)")

    @classmethod
    def run_evaluate(cls, args) -> int:
        """Exactly the official scripts' numbers and keys, as one JSON object (what `predict squad` prints)."""
        result = evaluate_prediction_file(args.data_file, args.pred_file, args.na_prob_file)
        print(json.dumps(result.document["metrics"]))
        return 0

    @classmethod
    def benchmarks(cls) -> tuple:
        return SQUAD_BENCHMARKS

    def __init__(self, train_file, dev_file=None, *, settings: RunSettings, **options):
        super().__init__(train_file, dev_file, unanswered_dev=True, **options)
        self.settings = settings

    def read(self, skip_bad_rows: bool) -> Splits:
        splits = super().read(skip_bad_rows)
        self.name = "squad2" if self.is_v2 else "squad"
        return splits

    def best_details(self, outputs: dict) -> dict:
        return {"dev": outputs.get("dev")}

    def document(self, best: RunResult, runs: list[RunResult], details: dict) -> dict:
        s, config = self.settings, best.config
        record = {
            "task": "squad", "version": details["version"], "model": details["model"],
            "train_file": details["train_file"], "dev_file": details["dev_file"], "article_split": self.split_record,
            "config": {"epochs": config["epochs"], "learning_rate": config["learning_rate"],
                       "batch_size": config["batch_size"], "grad_accum": s.grad_accum,
                       "max_seq_length": s.max_seq_length, **{k: self.answering[k] for k in WINDOW_OPTIONS[:4]},
                       "warmup_ratio": s.warmup_ratio, "seed": config["seed"], "subset_seed": s.subset_seed,
                       "precision": s.precision, "dropout": s.dropout},
            "train_examples": details["num_train_examples"], "train_windows": details["num_train_windows"],
            "train_skipped_unrecoverable": details["train_skipped_unrecoverable"],
            "bad_rows_skipped": details["bad_rows_skipped"], "train": best.training}
        dev = details["dev"]
        if dev is not None:
            record.update(dev_examples=details["num_dev_examples"], predict_seconds=dev["seconds"],
                          metrics=dev["official"])
        if len(runs) > 1:  # a grid (Python callers): every run's configuration and metrics
            record["runs"] = [{"config": r.config, "metrics": r.metrics, "score": r.score} for r in runs]
        return record

    def result_metrics(self, metrics: dict) -> dict:
        return metrics


def finetune_squad(model_dir: str | Path, train_file: str | Path, output_dir: str | Path,
                   dev_file: str | Path | None = None, version: str | None = None, *, epochs: float = 3.0,
                   learning_rate: float = 5e-5, batch_size: int = 32, seed: int = 42,
                   article_split_fraction: float | None = None, split_seed: int = 0,
                   eval_subset_seed: int | None = None, **options) -> TaskResult:
    """Fine-tune BertForQuestionAnswering on a SQuAD file through the runner (linear warm-up over
    `warmup_ratio` of the steps, then decay), save it (HF layout) in output_dir/model, predict the
    dev file there and score it. `batch_size` is the effective batch: micro-batches of
    batch_size / grad_accum. `options`: the window options (doc_stride, max_query_length,
    n_best_size, max_answer_length, null_score_diff_threshold, search_null_threshold) and the
    runner's RunSettings (max_seq_length 384, eval_batch_size 64, save_steps: checkpoints in
    output_dir/runs/<run>/, resume: continue from the newest, ...); `eval_subset_seed` samples dev
    (--max-eval-examples) with its own seed. The TaskResult's document is the run's record (results.json)."""
    answering = {k: options.pop(k) for k in WINDOW_OPTIONS if k in options}
    settings = RunSettings.paper(SQUAD_DEFAULTS, learning_rates=(learning_rate,), epochs=(epochs,),
                                 batch_sizes=(batch_size,), seeds=(seed,), split_seed=split_seed, **options)
    task = SquadRunTask(train_file, dev_file, version=version, article_split_fraction=article_split_fraction,
                        split_seed=split_seed, eval_subset_seed=eval_subset_seed, settings=settings, **answering)
    return runner.finetune(task, model_dir, output_dir, settings)


@dataclasses.dataclass(frozen=True)
class PredictOptions(Answering):
    """`bertkit predict squad`'s settings besides the files: the windows and answers, the v2.0 null
    threshold search, batch, device, precision, a sample of the questions, bad rows."""

    search_null_threshold: bool = True
    batch_size: int = 64
    device: str = "auto"
    precision: str = "auto"
    max_examples: int | None = None
    subset_seed: int = 0
    skip_bad_rows: bool = False
    allow_missing_weights: bool = False


def predict_squad_file(model_dir: str | Path, data_file: str | Path, output_dir: str | Path,
                       version: str | None = None, options: PredictOptions | None = None, **given) -> TaskResult:
    """Predict a SQuAD file with a fine-tuned model; write the prediction files, and results.json
    with the official metrics when the file has answers. `options` (or its fields as keywords). A
    model without a span head is refused unless `allow_missing_weights` (its answers would come from
    random weights)."""
    o = options or PredictOptions(**given)
    data = read_squad(data_file, version, o.skip_bad_rows)
    examples = subsample(data.examples, o.max_examples, o.subset_seed)
    tokenizer = model_tokenizer(model_dir)
    model = BertForQuestionAnswering.from_pretrained(model_dir, require_head=True,
                                                     allow_missing_weights=o.allow_missing_weights)
    started = time.perf_counter()
    answering = {f.name: getattr(o, f.name) for f in dataclasses.fields(Answering)}
    result = predict_squad(model, tokenizer, examples, data.version == "2.0", o.batch_size, device=o.device,
                           precision=o.precision, **answering)
    metrics, applied = _scored(examples, result, o.search_null_threshold, data.has_answers)
    files = applied.write(output_dir)
    record = {"task": "squad", "version": data.version, "model": str(model_dir), "data_file": str(data_file),
              "examples": len(examples), "bad_rows_skipped": data.bad_rows_skipped,
              "predict_seconds": time.perf_counter() - started, "files": [str(f) for f in files],
              "metrics": metrics}
    if metrics is not None:
        write_json(Path(output_dir) / "results.json", record)
    return _result(record, output_dir)


def evaluate_prediction_file(data_file: str | Path, pred_file: str | Path,
                             na_prob_file: str | Path | None = None) -> TaskResult:
    """The official v1.1 / v2.0 evaluator (picked by the data's version) on a predictions file, as
    `predict_squad_file` reports: the TaskResult's metrics are fractions, its document's `metrics`
    exactly the official script's output (percent, the script's keys)."""
    official = evaluate_squad(data_file, pred_file, na_prob_file)
    record = {"task": "squad", "version": "1.1" if "exact_match" in official else "2.0", "data_file": str(data_file),
              "pred_file": str(pred_file), "na_prob_file": None if na_prob_file is None else str(na_prob_file),
              "metrics": official}
    return _result(record, None)


# --------------------------------------------------------------------------- command line


def add_window_arguments(parser) -> None:
    """How questions become windows and windows answers (also `finetune question-answering`'s)."""
    parser.add_argument("--version", choices=["1.1", "2.0"], default=None, help="SQuAD version (default: detected)")
    parser.add_argument("--doc-stride", type=flags.positive_int, default=128, help="tokens between window starts")
    parser.add_argument("--max-query-length", type=flags.positive_int, default=64,
                        help="questions are cut to this many tokens")
    parser.add_argument("--n-best-size", type=flags.positive_int, default=20)
    parser.add_argument("--max-answer-length", type=flags.positive_int, default=30, help="longest answer, in tokens")
    parser.add_argument("--null-score-diff-threshold", type=flags.finite_float, default=0.0,
                        help="v2.0: answer \"\" when null score - best span score exceeds this")
    parser.add_argument("--no-threshold-search", action="store_true",
                        help="v2.0: apply --null-score-diff-threshold as given instead of the F1-maximising "
                             "threshold found on the gold answers")


# --------------------------------------------------------------------------- benchmarks


def run_benchmark(version: str, settings: BenchmarkSettings) -> TaskResult:
    """SQuAD at a reproduction budget's settings: one configuration (the budget's first learning rate
    and epoch count: SQuAD's cost rules out a grid at these budgets), once per seed of the budget. v2.0
    has no training set here: the documented article-split protocol on dev-v2.0."""
    ft, cfg, squad = settings.finetune, settings.task, settings.data_dir / "squad"
    if version == "1.1":
        files = dict(train_file=str(squad / "train-v1.1.json"), dev_file=str(squad / "dev-v1.1.json"))
    else:
        files = dict(train_file=str(squad / "dev-v2.0.json"), dev_file=str(squad / "dev-v2.0.json"),
                     article_split_fraction=cfg.get("article_split", 0.5))

    def run(output_dir: Path, seed: int) -> TaskResult:
        return finetune_squad(
            str(settings.model_dir), output_dir=str(output_dir),
            batch_size=cfg.get("batch_size", ft["batch_size"]),
            learning_rate=cfg.get("learning_rate", ft["learning_rates"][0]), epochs=cfg.get("epochs", ft["epochs"][0]),
            seed=seed, precision=settings.precision, max_seq_length=settings.max_seq_length(MAX_SEQ_LENGTH),
            doc_stride=cfg.get("doc_stride", 128), max_query_length=cfg.get("max_query_length", 64),
            max_train_examples=cfg.get("max_train_examples"),
            max_eval_examples=cfg.get("max_eval_examples"),
            subset_seed=cfg.get("subset_seed", 0), eval_subset_seed=cfg.get("eval_subset_seed"), progress=False,
            **files)

    seeds = list(ft["seeds"])
    if len(seeds) == 1:
        return run(Path(settings.output_dir), seeds[0])
    return best_of_seeds([run(Path(settings.output_dir) / "runs" / f"seed{s}", s) for s in seeds],
                         Path(settings.output_dir))


def best_of_seeds(results: list[TaskResult], output_dir: Path) -> TaskResult:
    """Several seeds' runs (each in its own folder) as one result, as the sweep tasks report one: the
    best dev F1 wins (its results.json, prediction files and model are copied into output_dir), and
    every run's metrics and configuration are kept (run_metrics, results.json's "runs")."""
    best = max(results, key=lambda r: -math.inf if r.value is None else r.value)
    for item in Path(best.output_dir).iterdir():
        if item.is_file() and item.name != "results.json":
            shutil.copy2(item, output_dir / item.name)
    shutil.copytree(Path(best.output_dir) / "model", output_dir / "model", dirs_exist_ok=True)
    document = {**best.document, "runs": [{"config": r.document["config"], "metrics": r.document.get("metrics"),
                                           "folder": str(r.output_dir)} for r in results],
                "best": {"config": best.document["config"], "metrics": best.document.get("metrics")}}
    write_json(output_dir / "results.json", document)
    return TaskResult(task=best.task, metric=best.metric, metrics=best.metrics,
                      run_metrics=[r.metrics for r in results], document=document, output_dir=str(output_dir),
                      model_dir=str(output_dir / "model"))


SQUAD_BENCHMARKS = (
    Benchmark(name="squad", label="SQuAD v1.1 F1", max_seq_length=MAX_SEQ_LENGTH,
              has_data=lambda data_dir: (data_dir / "squad" / "train-v1.1.json").is_file(),
              run=lambda settings: run_benchmark("1.1", settings)),
    Benchmark(name="squad2", label="SQuAD v2.0 F1", max_seq_length=MAX_SEQ_LENGTH,
              has_data=lambda data_dir: (data_dir / "squad" / "dev-v2.0.json").is_file(),
              run=lambda settings: run_benchmark("2.0", settings)),
)
