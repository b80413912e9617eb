"""The official SQuAD evaluators (evaluate-v1.1.py and evaluate-v2.0.py), reimplemented.

Scores are percentages, exactly as the official scripts print them. The two versions differ in
small ways that change numbers, and both are reproduced:

- v1.1: every question must have gold answers; an empty prediction scores F1 0 even against an
  answer that normalises to nothing; a question without a prediction scores 0 (a message goes to
  stderr). Output: {"exact_match", "f1"}.
- v2.0: gold answers whose text normalises to "" are dropped, and a question left with none is
  unanswerable: its only gold answer is "". F1 between an empty and a non-empty token list is 0,
  between two empty lists 1. A prediction is forced to "no answer" when its no-answer
  probability exceeds na_prob_thresh (default 1.0, i.e. never for probabilities). Output:
  {"exact", "f1", "total"} plus "HasAns_*" / "NoAns_*" for the subsets that are non-empty, plus
  "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh" when no-answer probabilities are
  given. The official script crashes (KeyError) when a prediction is missing; here that is a
  BertkitError naming the questions.

Answer normalisation (both): lower-case, delete string.punctuation characters, replace the
words a/an/the by a space, collapse whitespace.
"""

from __future__ import annotations

import json
import logging
import math
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ..errors import BertkitError, counted, reading

log = logging.getLogger("bertkit")

_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)  # ASCII punctuation only, as the scripts
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


# --------------------------------------------------------------------------- answer comparison


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation, drop articles, collapse whitespace (in that order)."""
    lowered = text.lower()
    without_punctuation = lowered.translate(_DELETE_PUNCTUATION)
    without_articles = _ARTICLES.sub(" ", without_punctuation)
    return " ".join(without_articles.split())


def _token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    overlap = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0
    precision = 1.0 * overlap / len(prediction_tokens)
    recall = 1.0 * overlap / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    """SQuAD v1.1 exact match: the normalised strings are equal."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
    """SQuAD v1.1 token F1 of the normalised strings (0 when nothing overlaps, even if both are empty)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _answer_tokens_v2(text: str) -> list[str]:
    if not text:
        return []
    return normalize_answer(text).split()


def exact_match_score_v2(prediction: str, ground_truth: str) -> int:
    """SQuAD v2.0 exact match (compute_exact): 1 if the normalised strings are equal, else 0."""
    return int(normalize_answer(ground_truth) == normalize_answer(prediction))


def f1_score_v2(prediction: str, ground_truth: str) -> float:
    """SQuAD v2.0 token F1 (compute_f1): if either side has no tokens, 1 when both have none, else 0."""
    gold_tokens = _answer_tokens_v2(ground_truth)
    prediction_tokens = _answer_tokens_v2(prediction)
    if not gold_tokens or not prediction_tokens:
        return int(gold_tokens == prediction_tokens)
    return _token_f1(prediction_tokens, gold_tokens)


# --------------------------------------------------------------------------- input reading


def _load_json(path: str | Path, what: str) -> Any:
    try:
        with reading(path, what), open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as err:
        message = f"{what} is not valid JSON: {err.msg} (column {err.colno})"
        raise BertkitError(message, path=str(path), line=err.lineno) from None


def _dataset_json(dataset: Any) -> tuple[dict, str | None]:
    """Accept a path, the whole SQuAD JSON object, or its 'data' list; return (json object, path)."""
    if isinstance(dataset, (str, Path)):
        path = str(dataset)
        return _load_json(path, "SQuAD data file"), path
    if isinstance(dataset, list):
        return {"data": dataset}, None
    return dataset, None


def _questions(dataset_json: Any, path: str | None) -> list[tuple[str, list[str]]]:
    """(question id, gold answer texts) for every question, in file order, with the layout checked."""
    if not isinstance(dataset_json, dict) or not isinstance(dataset_json.get("data"), list):
        raise BertkitError("not a SQuAD file: expected a JSON object with a 'data' list of articles", path=path)
    questions = []
    for article_index, article in enumerate(dataset_json["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise BertkitError(f"article {article_index} has no 'paragraphs' list", path=path)
        for paragraph_index, paragraph in enumerate(paragraphs):
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(qas, list):
                raise BertkitError(f"article {article_index}, paragraph {paragraph_index} has no 'qas' list", path=path)
            for qa in qas:
                where = f"article {article_index}, paragraph {paragraph_index}"
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise BertkitError(f"{where}: a question has no string 'id'", path=path)
                answers = qa.get("answers")
                if not isinstance(answers, list) or not all(
                    isinstance(answer, dict) and isinstance(answer.get("text"), str) for answer in answers
                ):
                    message = f"question {qa['id']}: 'answers' must be a list of {{'text': ...}} objects"
                    raise BertkitError(message, path=path)
                questions.append((qa["id"], [answer["text"] for answer in answers]))
    return questions


def _check_predictions(predictions: Any, path: str | None = None) -> Mapping[str, str]:
    if not isinstance(predictions, Mapping):
        raise BertkitError("predictions must be a JSON object mapping question id to answer text", path=path)
    for qid, text in predictions.items():
        if not isinstance(text, str):
            raise BertkitError(f"prediction for question {qid} is {type(text).__name__}, expected a string", path=path)
    return predictions


def _check_na_probs(na_probs: Any, path: str | None = None) -> Mapping[str, float]:
    if not isinstance(na_probs, Mapping):
        raise BertkitError("no-answer probabilities must be a JSON object mapping question id to a number", path=path)
    for qid, value in na_probs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BertkitError(f"no-answer probability for question {qid} is {value!r}, expected a finite number",
                               path=path)
    return na_probs


def is_squad_v2(dataset_json: Mapping) -> bool:
    """True for SQuAD 2.0 data: version "v2.0", or any question carrying 'is_impossible'."""
    if str(dataset_json.get("version", "")).lstrip("v") == "2.0":
        return True
    return any("is_impossible" in qa for qa in _question_objects(dataset_json))


def _question_objects(dataset_json: Mapping) -> Iterator[Mapping]:
    """Every question object, stepping over anything of the wrong shape (the readers report those)."""
    def items(container, key):
        value = container.get(key) if isinstance(container, Mapping) else None
        return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []

    for article in items(dataset_json, "data"):
        for paragraph in items(article, "paragraphs"):
            yield from items(paragraph, "qas")


# --------------------------------------------------------------------------- SQuAD v1.1


def evaluate_v1(dataset: Any, predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: {"exact_match": %, "f1": %}, averaged over every question in the data.

    dataset: a path, the SQuAD JSON object, or its 'data' list. predictions: question id -> text.
    """
    dataset_json, path = _dataset_json(dataset)
    return _score_v1(dataset_json, _check_predictions(predictions), path)


def _score_v1(dataset_json: Any, predictions: Mapping[str, str], path: str | None) -> dict[str, float]:
    questions = _questions(dataset_json, path)
    if not questions:
        raise BertkitError("the SQuAD data has no questions", path=path)
    exact_total = f1_total = 0
    for qid, gold_answers in questions:
        if qid not in predictions:
            log.warning(f"Unanswered question {qid} will receive score 0.")  # the official script's words
            continue
        if not gold_answers:
            message = f"question {qid} has no gold answers, which SQuAD v1.1 requires (is this v2.0 data?)"
            raise BertkitError(message, path=path)
        prediction = predictions[qid]
        exact_total += max(exact_match_score(prediction, gold) for gold in gold_answers)
        f1_total += max(f1_score(prediction, gold) for gold in gold_answers)
    return {"exact_match": 100.0 * exact_total / len(questions), "f1": 100.0 * f1_total / len(questions)}


# --------------------------------------------------------------------------- SQuAD v2.0


def apply_no_ans_threshold(
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    qid_to_has_ans: Mapping[str, bool],
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """Scores after abstaining where na_prob > na_prob_thresh: abstaining scores 1.0 on an
    unanswerable question and 0.0 on an answerable one."""
    thresholded = {}
    for qid, score in scores.items():
        if na_probs[qid] > na_prob_thresh:
            thresholded[qid] = float(not qid_to_has_ans[qid])
        else:
            thresholded[qid] = score
    return thresholded


def make_eval_dict(
    exact_scores: Mapping[str, float], f1_scores: Mapping[str, float], qid_list: Iterable[str] | None = None
) -> dict[str, float]:
    """{"exact", "f1", "total"} in percent over qid_list (all scored questions when None or empty)."""
    qids = list(qid_list) if qid_list else None
    if not qids:
        total = len(exact_scores)
        return {
            "exact": 100.0 * sum(exact_scores.values()) / total,
            "f1": 100.0 * sum(f1_scores.values()) / total,
            "total": total,
        }
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact_scores[qid] for qid in qids) / total,
        "f1": 100.0 * sum(f1_scores[qid] for qid in qids) / total,
        "total": total,
    }


def find_best_thresh(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    qid_to_has_ans: Mapping[str, bool],
) -> tuple[float, float]:
    """The official sweep: (best score in %, na_prob threshold reaching it).

    It starts from "abstain on everything" (score = number of unanswerable questions) and, in
    increasing na_prob order, switches questions to answering: an answerable question adds its
    raw score, an unanswerable one loses 1 if the prediction text is non-empty. The threshold
    starts at 0.0 and is the na_prob of the question where the best running score was first
    reached. Quirks kept as in the script: ties in na_prob are not grouped, and a non-empty
    prediction that normalises to "" still counts as answering.
    """
    running = best = sum(1 for qid in qid_to_has_ans if not qid_to_has_ans[qid])
    best_threshold = 0.0
    for qid in sorted(na_probs, key=lambda key: na_probs[key]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            running += scores[qid]
        elif predictions[qid]:
            running += -1
        if running > best:
            best = running
            best_threshold = na_probs[qid]
    return 100.0 * best / len(scores), best_threshold


def find_all_best_thresh(
    predictions: Mapping[str, str],
    exact_raw: Mapping[str, float],
    f1_raw: Mapping[str, float],
    na_probs: Mapping[str, float],
    qid_to_has_ans: Mapping[str, bool],
) -> dict[str, float]:
    """{"best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"} from find_best_thresh."""
    best_exact, exact_threshold = find_best_thresh(predictions, exact_raw, na_probs, qid_to_has_ans)
    best_f1, f1_threshold = find_best_thresh(predictions, f1_raw, na_probs, qid_to_has_ans)
    return {
        "best_exact": best_exact,
        "best_exact_thresh": exact_threshold,
        "best_f1": best_f1,
        "best_f1_thresh": f1_threshold,
    }


def _gold_answers_v2(answers: list[str]) -> list[str]:
    # Answers that normalise to nothing are dropped; with none left the question is unanswerable.
    return [text for text in answers if normalize_answer(text)] or [""]


def _require_predictions(
    questions: list[tuple[str, list[str]]], predictions: Mapping[str, str], predictions_path: str | None
) -> None:
    missing = [qid for qid, _ in questions if qid not in predictions]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise BertkitError(
            f"{len(missing)} of {counted(len(questions), 'question')} {'has' if len(missing) == 1 else 'have'} no "
            f"prediction ({shown}); "
            "SQuAD v2.0 scoring needs one per question (\"\" means no answer)",
            path=predictions_path,
        )


def _raw_scores_v2(
    questions: list[tuple[str, list[str]]], predictions: Mapping[str, str], predictions_path: str | None
) -> tuple[dict[str, int], dict[str, float]]:
    _require_predictions(questions, predictions, predictions_path)
    exact_raw: dict[str, int] = {}
    f1_raw: dict[str, float] = {}
    for qid, answers in questions:
        gold_answers = _gold_answers_v2(answers)
        prediction = predictions[qid]
        exact_raw[qid] = max(exact_match_score_v2(prediction, gold) for gold in gold_answers)
        f1_raw[qid] = max(f1_score_v2(prediction, gold) for gold in gold_answers)
    return exact_raw, f1_raw


def evaluate_v2(
    dataset: Any,
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """evaluate-v2.0.py: exact/f1/total (+ HasAns_*, NoAns_*, and best_* when na_probs is given).

    dataset: a path, the SQuAD JSON object, or its 'data' list. predictions: question id -> text
    ("" = no answer). na_probs: question id -> probability (or any score) that there is no answer.
    """
    dataset_json, path = _dataset_json(dataset)
    checked_na_probs = None if na_probs is None else _check_na_probs(na_probs)
    return _score_v2(dataset_json, _check_predictions(predictions), checked_na_probs, na_prob_thresh, path, None, None)


def _score_v2(
    dataset_json: Any,
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None,
    na_prob_thresh: float,
    path: str | None,
    predictions_path: str | None,
    na_probs_path: str | None,
) -> dict[str, float]:
    questions = _questions(dataset_json, path)
    if not questions:
        raise BertkitError("the SQuAD data has no questions", path=path)
    qid_to_has_ans = {qid: bool(answers) for qid, answers in questions}
    exact_raw, f1_raw = _raw_scores_v2(questions, predictions, predictions_path)

    if na_probs is None:
        probabilities: Mapping[str, float] = {qid: 0.0 for qid in predictions}
    else:
        probabilities = na_probs
        missing = [qid for qid in exact_raw if qid not in probabilities]
        if missing:
            raise BertkitError(
                f"{counted(len(missing), 'question')} without a no-answer probability (first: {missing[0]})",
                path=na_probs_path,
            )
    exact_thresholded = apply_no_ans_threshold(exact_raw, probabilities, qid_to_has_ans, na_prob_thresh)
    f1_thresholded = apply_no_ans_threshold(f1_raw, probabilities, qid_to_has_ans, na_prob_thresh)

    result = make_eval_dict(exact_thresholded, f1_thresholded)
    has_ans_qids = [qid for qid, has_ans in qid_to_has_ans.items() if has_ans]
    no_ans_qids = [qid for qid, has_ans in qid_to_has_ans.items() if not has_ans]
    for prefix, subset in (("HasAns", has_ans_qids), ("NoAns", no_ans_qids)):
        if subset:
            for key, value in make_eval_dict(exact_thresholded, f1_thresholded, subset).items():
                result[f"{prefix}_{key}"] = value
    if na_probs is not None:
        result.update(find_all_best_thresh(predictions, exact_raw, f1_raw, probabilities, qid_to_has_ans))
    return result


def best_null_threshold(
    dataset: Any, predictions: Mapping[str, str], null_score_diffs: Mapping[str, float]
) -> tuple[float, float]:
    """Pick the SQuAD v2.0 null threshold tau that maximises F1 on this data.

    predictions: question id -> the best non-null answer text. null_score_diffs: question id ->
    null score minus best span score (larger = more likely unanswerable), the na_prob values the
    official script accepts. Returns (tau, best F1 in %) such that answering "" exactly where
    diff > tau, and the given text elsewhere, scores that F1 under evaluate_v2.

    Unlike the official find_best_thresh, questions with equal diffs are switched together (a
    threshold cannot separate them), a non-empty text that normalises to "" is scored as what
    it is, and when abstaining everywhere is best tau lies just below the smallest diff (the
    script reports 0.0 there, which would not abstain on negative diffs).
    """
    dataset_json, path = _dataset_json(dataset)
    questions = _questions(dataset_json, path)
    _check_predictions(predictions)
    _check_na_probs(null_score_diffs)
    if not questions:
        raise BertkitError("the SQuAD data has no questions", path=path)
    _require_predictions(questions, predictions, None)
    missing = [qid for qid, _ in questions if qid not in null_score_diffs]
    if missing:
        raise BertkitError(f"{counted(len(missing), 'question')} without a null score difference (first: {missing[0]})")

    # F1 of each question when answering with its text, and when abstaining (predicting "").
    answer_score: dict[str, float] = {}
    abstain_score: dict[str, float] = {}
    for qid, answers in questions:
        gold_answers = _gold_answers_v2(answers)
        answer_score[qid] = max(f1_score_v2(predictions[qid], gold) for gold in gold_answers)
        abstain_score[qid] = max(f1_score_v2("", gold) for gold in gold_answers)

    ordered = sorted(answer_score, key=lambda qid: null_score_diffs[qid])
    running = best = sum(abstain_score.values())
    best_threshold = math.nextafter(float(null_score_diffs[ordered[0]]), -math.inf)
    for position, qid in enumerate(ordered):
        running += answer_score[qid] - abstain_score[qid]
        last_of_tie = position + 1 == len(ordered) or null_score_diffs[ordered[position + 1]] != null_score_diffs[qid]
        if last_of_tie and running > best:
            best = running
            best_threshold = float(null_score_diffs[qid])
    return best_threshold, 100.0 * best / len(answer_score)


# --------------------------------------------------------------------------- files


def evaluate_squad(
    data_file: str | Path, pred_file: str | Path, na_prob_file: str | Path | None = None
) -> dict[str, float]:
    """Score a predictions file against a SQuAD data file, picking the evaluator by data version.

    v2.0 data (version "v2.0" or any 'is_impossible' field) -> evaluate_v2, with the no-answer
    probabilities from na_prob_file when given; otherwise evaluate_v1.
    """
    dataset_json = _load_json(data_file, "SQuAD data file")
    _questions(dataset_json, str(data_file))  # layout errors name the data file
    predictions = _check_predictions(_load_json(pred_file, "predictions file"), str(pred_file))
    if is_squad_v2(dataset_json):
        na_probs = None
        if na_prob_file is not None:
            na_probs = _check_na_probs(_load_json(na_prob_file, "no-answer probability file"), str(na_prob_file))
        return _score_v2(
            dataset_json, predictions, na_probs, 1.0, str(data_file), str(pred_file),
            None if na_prob_file is None else str(na_prob_file),
        )
    if na_prob_file is not None:
        raise BertkitError("a no-answer probability file only applies to SQuAD v2.0 data", path=str(data_file))
    scores = _score_v1(dataset_json, predictions, str(data_file))  # first: an error stays the only stderr line
    version = dataset_json.get("version")
    if version is not None and version != "1.1":
        log.warning(f"Evaluation expects v-1.1, but got dataset with v-{version}")
    return scores
