"""SQuAD evaluators: hand-computed cases, v1.1/v2.0 differences, and the real dev sets scored
against a compact, separately written reference of the official scripts' logic."""

import collections
import json
import random
import re
import string

import pytest

from bertkit.errors import BertkitError
from bertkit.metrics import (
    best_null_threshold,
    evaluate_squad,
    evaluate_v1,
    evaluate_v2,
    exact_match_score,
    exact_match_score_v2,
    f1_score,
    f1_score_v2,
    normalize_answer,
)
from bertkit.metrics.squad import find_best_thresh

# --------------------------------------------------------------------------- reference
# The official evaluate-v1.1.py / evaluate-v2.0.py logic, written out plainly for comparison.


REF_PUNCTUATION = set(string.punctuation)


def ref_normalize(s):
    s = s.lower()
    s = "".join(c for c in s if c not in REF_PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def ref_overlap_f1(pred_toks, gold_toks):
    same = sum((collections.Counter(pred_toks) & collections.Counter(gold_toks)).values())
    if same == 0:
        return 0
    p, r = same / len(pred_toks), same / len(gold_toks)
    return 2 * p * r / (p + r)


def ref_v1(data, preds):
    em = f1 = total = 0
    for article in data:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                total += 1
                if qa["id"] not in preds:
                    continue
                golds = [a["text"] for a in qa["answers"]]
                pred = preds[qa["id"]]
                em += max(ref_normalize(pred) == ref_normalize(g) for g in golds)
                f1 += max(ref_overlap_f1(ref_normalize(pred).split(), ref_normalize(g).split()) for g in golds)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


def ref_v2_f1(gold, pred):
    g = ref_normalize(gold).split() if gold else []
    p = ref_normalize(pred).split() if pred else []
    if not g or not p:
        return int(g == p)
    return ref_overlap_f1(p, g)


def ref_v2(data, preds, na_probs=None, thresh=1.0):
    has_ans, exact, f1 = {}, {}, {}
    for article in data:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                qid = qa["id"]
                has_ans[qid] = bool(qa["answers"])
                golds = [a["text"] for a in qa["answers"] if ref_normalize(a["text"])] or [""]
                exact[qid] = max(int(ref_normalize(g) == ref_normalize(preds[qid])) for g in golds)
                f1[qid] = max(ref_v2_f1(g, preds[qid]) for g in golds)
    probs = na_probs if na_probs is not None else {k: 0.0 for k in preds}

    def threshold(scores):
        return {k: (float(not has_ans[k]) if probs[k] > thresh else v) for k, v in scores.items()}

    exact_t, f1_t = threshold(exact), threshold(f1)
    out = {"exact": 100.0 * sum(exact_t.values()) / len(exact_t), "f1": 100.0 * sum(f1_t.values()) / len(f1_t),
           "total": len(exact_t)}
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [k for k, v in has_ans.items() if v == wanted]
        if qids:
            out[prefix + "_exact"] = 100.0 * sum(exact_t[k] for k in qids) / len(qids)
            out[prefix + "_f1"] = 100.0 * sum(f1_t[k] for k in qids) / len(qids)
            out[prefix + "_total"] = len(qids)
    if na_probs is not None:
        for name, raw in (("exact", exact), ("f1", f1)):
            score = best = sum(1 for v in has_ans.values() if not v)
            best_t = 0.0
            for qid in sorted(na_probs, key=lambda k: na_probs[k]):
                if qid not in raw:
                    continue
                score += raw[qid] if has_ans[qid] else (-1 if preds[qid] else 0)
                if score > best:
                    best, best_t = score, na_probs[qid]
            out["best_" + name] = 100.0 * best / len(raw)
            out["best_" + name + "_thresh"] = best_t
    return out


# --------------------------------------------------------------------------- answer comparison


def test_normalize_answer():
    assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theater and Anthem") == "theater and anthem"  # articles only as whole words
    assert normalize_answer("the-end") == "theend"  # punctuation goes before articles are matched
    assert normalize_answer("A.M.") == "am"
    assert normalize_answer("The the THE") == ""
    assert normalize_answer("\u201cquoted\u201d") == "\u201cquoted\u201d"  # only ASCII punctuation is removed


def test_token_f1_by_hand():
    # pred [cat, sat] vs gold [cat, sat, on, mat]: P = 1, R = 1/2 -> 2/3.
    assert f1_score("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)
    # Repeated tokens count with multiplicity: common {y: 2}, P = R = 2/3.
    assert f1_score("x y y", "y y z") == pytest.approx(2 / 3)
    # common {y: 1}: P = 1/3, R = 1/2 -> 0.4.
    assert f1_score("y y y", "y z") == pytest.approx(0.4)
    assert f1_score("Paris", "London") == 0
    assert exact_match_score("The Eiffel Tower.", "eiffel tower") is True


def test_v1_and_v2_differ_on_empty_answers():
    # v1.1: no overlap means F1 0, even when both sides normalise to nothing.
    assert f1_score("", "") == 0
    assert f1_score("the", "an") == 0
    assert exact_match_score("the", "") is True
    # v2.0: two empty token lists agree (F1 1); empty against non-empty is 0.
    assert f1_score_v2("", "") == 1
    assert f1_score_v2("the", "an") == 1
    assert f1_score_v2("", "Paris") == 0
    assert f1_score_v2("Paris", "") == 0
    assert exact_match_score_v2("the", "") == 1
    assert f1_score_v2("x y y", "y y z") == pytest.approx(2 / 3)


# --------------------------------------------------------------------------- tiny hand-built data


def _squad(questions, version):
    """questions: list of (id, [answer texts]) -> SQuAD JSON with one paragraph."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in answers]}
           for qid, answers in questions]
    if version == "v2.0":
        for qa in qas:
            qa["is_impossible"] = not qa["answers"]
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}


TINY_V1 = _squad(
    [
        ("q1", ["Denver Broncos", "The Denver Broncos"]),
        ("q2", ["Saint Bernadette Soubirous"]),
        ("q3", ["golden anniversary", "gold"]),
        ("q4", ["Santa Clara"]),
    ],
    "1.1",
)
TINY_V1_PREDICTIONS = {
    "q1": "the denver broncos!",  # EM 1, F1 1
    "q2": "Bernadette",  # EM 0; P = 1, R = 1/3 -> F1 0.5
    "q3": "a golden gold anniversary",  # [golden gold anniversary] vs [golden anniversary]: P 2/3, R 1 -> 0.8
    # q4 unanswered: scores 0
    "not-in-data": "ignored",
}


def test_v1_tiny_by_hand(caplog):
    with caplog.at_level("WARNING", logger="bertkit"):
        result = evaluate_v1(TINY_V1, TINY_V1_PREDICTIONS)
    assert result == {"exact_match": pytest.approx(25.0), "f1": pytest.approx(100 * (1 + 0.5 + 0.8 + 0) / 4)}
    assert "Unanswered question q4 will receive score 0." in caplog.text
    assert result == ref_v1(TINY_V1["data"], TINY_V1_PREDICTIONS)


TINY_V2 = _squad(
    [
        ("qa", ["Normandy", "in Normandy"]),
        ("qb", ["10th and 11th centuries"]),
        ("qc", []),
        ("qd", []),
        ("qe", ["the"]),  # answerable in the file, but its only answer normalises to "": gold is [""]
    ],
    "v2.0",
)
TINY_V2_PREDICTIONS = {
    "qa": "Normandy",  # exact 1, f1 1
    "qb": "10th century",  # [10th century] vs [10th and 11th centuries]: P 1/2, R 1/4 -> f1 1/3
    "qc": "",  # unanswerable, abstained: 1, 1
    "qd": "Rollo",  # unanswerable, answered: 0, 0
    "qe": "",  # matches the empty gold: 1, 1 (and still counted under HasAns)
}
TINY_V2_NA_PROBS = {"qa": 0.1, "qb": 0.6, "qc": 0.9, "qd": 0.8, "qe": 0.3}


def test_v2_tiny_by_hand():
    result = evaluate_v2(TINY_V2, TINY_V2_PREDICTIONS)
    expected = {
        "exact": 60.0, "f1": 100 * (1 + 1 / 3 + 1 + 0 + 1) / 5, "total": 5,
        "HasAns_exact": 100 * 2 / 3, "HasAns_f1": 100 * (1 + 1 / 3 + 1) / 3, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
    }
    assert result == pytest.approx(expected)
    assert list(result) == list(expected)  # the official key order
    assert result == ref_v2(TINY_V2["data"], TINY_V2_PREDICTIONS)


def test_v2_tiny_best_thresholds_by_hand():
    result = evaluate_v2(TINY_V2, TINY_V2_PREDICTIONS, na_probs=TINY_V2_NA_PROBS)
    # Start from "abstain everywhere" = 2 (qc, qd); in na_prob order: qa +1 -> 3 (0.1), qe +1 -> 4
    # (0.3), qb +0 exact / +1/3 f1 -> 4 / 4.33 (0.6), qd -1 (non-empty answer), qc +0.
    assert result["best_exact"] == pytest.approx(80.0)
    assert result["best_exact_thresh"] == 0.3
    assert result["best_f1"] == pytest.approx(100 * (13 / 3) / 5)
    assert result["best_f1_thresh"] == 0.6
    # Threshold 1.0 (the default) never abstains on probabilities, so the main scores are unchanged.
    assert result["exact"] == 60.0
    assert result == ref_v2(TINY_V2["data"], TINY_V2_PREDICTIONS, TINY_V2_NA_PROBS)


def test_v2_tiny_with_no_answer_threshold():
    result = evaluate_v2(TINY_V2, TINY_V2_PREDICTIONS, na_probs=TINY_V2_NA_PROBS, na_prob_thresh=0.5)
    # qb (0.6), qc (0.9), qd (0.8) abstain: qb -> 0, qc -> 1, qd -> 1.
    assert result["exact"] == pytest.approx(80.0) and result["f1"] == pytest.approx(80.0)
    assert result["NoAns_exact"] == 100.0 and result["HasAns_f1"] == pytest.approx(100 * 2 / 3)
    assert result == ref_v2(TINY_V2["data"], TINY_V2_PREDICTIONS, TINY_V2_NA_PROBS, thresh=0.5)


def test_v2_subset_keys_only_when_subset_exists():
    answerable_only = _squad([("a", ["x"]), ("b", ["y z"])], "v2.0")
    result = evaluate_v2(answerable_only, {"a": "x", "b": "z"})
    assert set(result) == {"exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"}
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_v2_missing_prediction_is_an_error():
    with pytest.raises(BertkitError, match="1 of 5 questions has no prediction"):
        evaluate_v2(TINY_V2, {k: v for k, v in TINY_V2_PREDICTIONS.items() if k != "qd"})


def test_v1_requires_gold_answers():
    with pytest.raises(BertkitError, match="no gold answers"):
        evaluate_v1(TINY_V2, TINY_V2_PREDICTIONS)


# --------------------------------------------------------------------------- best_null_threshold


THRESHOLD_DATA = _squad([("q1", ["Paris"]), ("q2", []), ("q3", ["Rhine river"]), ("q4", [])], "v2.0")


def _f1_at(dataset, texts, diffs, tau):
    predictions = {qid: ("" if diffs[qid] > tau else text) for qid, text in texts.items()}
    return evaluate_v2(dataset, predictions)["f1"]


def test_best_null_threshold_by_hand():
    texts = {"q1": "Paris", "q2": "Lyon", "q3": "river", "q4": "Seine"}
    diffs = {"q1": -2.0, "q2": -1.0, "q3": 0.5, "q4": 3.0}
    # Abstain everywhere: q2 + q4 = 2. Switching on in diff order: q1 +1 -> 3, q2 -1 -> 2,
    # q3 +2/3 -> 2.67, q4 -1 -> 1.67. Best 3 of 4 at tau = -2.0.
    tau, best = best_null_threshold(THRESHOLD_DATA, texts, diffs)
    assert (tau, best) == (-2.0, pytest.approx(75.0))
    assert _f1_at(THRESHOLD_DATA, texts, diffs, tau) == pytest.approx(best)


def test_best_null_threshold_abstain_everywhere_and_ties():
    unanswerable = _squad([("u1", []), ("u2", [])], "v2.0")
    tau, best = best_null_threshold(unanswerable, {"u1": "a b", "u2": "c"}, {"u1": -3.0, "u2": -1.0})
    assert best == 100.0 and tau < -3.0
    # Equal diffs cannot be separated by a threshold: q1 (right) and q2, q4 (wrong) all at 0.0.
    data = _squad([("q1", ["Paris"]), ("q2", []), ("q4", [])], "v2.0")
    texts, diffs = {"q1": "Paris", "q2": "Lyon", "q4": "Seine"}, {"q1": 0.0, "q2": 0.0, "q4": 0.0}
    tau, best = best_null_threshold(data, texts, diffs)
    assert best == pytest.approx(100 * 2 / 3) and tau < 0.0
    assert _f1_at(data, texts, diffs, tau) == pytest.approx(best)
    # The official sweep takes q1 alone and reports 100.0 at 0.0, which no threshold achieves.
    qid_to_has_ans = {"q1": True, "q2": False, "q4": False}
    assert find_best_thresh(texts, {"q1": 1.0, "q2": 0, "q4": 0}, diffs, qid_to_has_ans) == (100.0, 0.0)


# --------------------------------------------------------------------------- real dev sets


@pytest.fixture(scope="module")
def dev_v1(data_dir):
    with open(data_dir / "squad" / "dev-v1.1.json", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def dev_v2(data_dir):
    with open(data_dir / "squad" / "dev-v2.0.json", encoding="utf-8") as handle:
        return json.load(handle)


def _synthetic_predictions(dataset, seed):
    """60% a gold answer, 30% a perturbed one, 10% empty or a random passage span."""
    rng = random.Random(seed)
    predictions = {}
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            words = paragraph["context"].split()
            for qa in paragraph["qas"]:
                gold = qa["answers"][0]["text"] if qa["answers"] else ""
                draw = rng.random()
                if draw < 0.6:
                    prediction = gold
                elif draw < 0.9:
                    tokens = gold.split() or ["the"]
                    kind = rng.randrange(5)
                    if kind == 0 and len(tokens) > 1:
                        del tokens[rng.randrange(len(tokens))]
                    elif kind == 1:
                        tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(words))
                    elif kind == 2:
                        tokens = [t.upper() for t in tokens]
                    elif kind == 3:
                        tokens.insert(0, "The")
                    else:
                        tokens[-1] += rng.choice([".", ",", "!", "'s"])
                    prediction = " ".join(tokens)
                elif draw < 0.95:
                    prediction = ""
                else:
                    start = rng.randrange(len(words))
                    prediction = " ".join(words[start:start + rng.randint(1, 4)])
                predictions[qa["id"]] = prediction
    return predictions


def test_v1_dev_matches_reference(dev_v1):
    predictions = _synthetic_predictions(dev_v1, seed=11)
    result = evaluate_v1(dev_v1, predictions)
    assert result == ref_v1(dev_v1["data"], predictions)
    assert 60.0 < result["exact_match"] < 90.0 and result["exact_match"] < result["f1"] < 95.0


def test_v1_dev_gold_answers(dev_v1):
    questions = [qa for a in dev_v1["data"] for p in a["paragraphs"] for qa in p["qas"]]
    assert len(questions) == 10570
    first = {qa["id"]: qa["answers"][0]["text"] for qa in questions}
    assert evaluate_v1(dev_v1, first) == {"exact_match": 100.0, "f1": 100.0}
    # One question's last gold answer is "." (a crowd-worker slip). It normalises to "", so v1.1
    # gives it exact match 1 but F1 0 (no overlapping tokens) -- one question short of 100.
    last = {qa["id"]: qa["answers"][-1]["text"] for qa in questions}
    assert last["57340d124776f419006617bf"] == "."
    assert evaluate_v1(dev_v1, last) == {"exact_match": 100.0, "f1": 100.0 * 10569 / 10570}


def test_v2_dev_matches_reference(dev_v2):
    predictions = _synthetic_predictions(dev_v2, seed=12)
    rng = random.Random(13)
    # Two decimals: many ties, so the official sweep's order on ties is exercised too.
    na_probs = {qid: round(rng.random(), 2) for qid in predictions}
    assert evaluate_v2(dev_v2, predictions) == ref_v2(dev_v2["data"], predictions)
    with_probs = evaluate_v2(dev_v2, predictions, na_probs=na_probs, na_prob_thresh=0.7)
    assert with_probs == ref_v2(dev_v2["data"], predictions, na_probs, thresh=0.7)
    assert with_probs["total"] == 11873
    assert (with_probs["HasAns_total"], with_probs["NoAns_total"]) == (5928, 5945)


def test_v2_dev_all_empty_predictions_is_the_no_answer_rate(dev_v2):
    qids = [qa["id"] for a in dev_v2["data"] for p in a["paragraphs"] for qa in p["qas"]]
    result = evaluate_v2(dev_v2, {qid: "" for qid in qids})
    assert result["exact"] == pytest.approx(100 * 5945 / 11873) and result["f1"] == result["exact"]
    assert (result["HasAns_f1"], result["NoAns_f1"]) == (0.0, 100.0)


def test_best_null_threshold_on_real_questions(dev_v2):
    subset = {"version": "v2.0", "data": dev_v2["data"][:2]}
    texts = _synthetic_predictions(subset, seed=14)
    rng = random.Random(15)
    # Non-empty "best span" texts, as post-processing provides; diffs rounded to force ties.
    texts = {qid: text or "answer" for qid, text in texts.items()}
    diffs = {qid: round(rng.uniform(-5, 5) * 2) / 2 for qid in texts}
    tau, best = best_null_threshold(subset, texts, diffs)
    candidates = sorted(set(diffs.values()))
    brute_force = max(_f1_at(subset, texts, diffs, t) for t in [candidates[0] - 1] + candidates)
    assert best == pytest.approx(brute_force)
    assert _f1_at(subset, texts, diffs, tau) == pytest.approx(best)


# --------------------------------------------------------------------------- files and errors


def _write(path, obj):
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_evaluate_squad_detects_version(tmp_path):
    v1 = evaluate_squad(_write(tmp_path / "d1.json", TINY_V1), _write(tmp_path / "p1.json", TINY_V1_PREDICTIONS))
    assert set(v1) == {"exact_match", "f1"}
    assert evaluate_v1(str(tmp_path / "d1.json"), TINY_V1_PREDICTIONS) == v1
    assert evaluate_v1(TINY_V1["data"], TINY_V1_PREDICTIONS) == v1
    v2 = evaluate_squad(_write(tmp_path / "d2.json", TINY_V2), _write(tmp_path / "p2.json", TINY_V2_PREDICTIONS),
                        na_prob_file=_write(tmp_path / "na.json", TINY_V2_NA_PROBS))
    assert v2 == evaluate_v2(TINY_V2, TINY_V2_PREDICTIONS, na_probs=TINY_V2_NA_PROBS)
    # No version field: an is_impossible key is enough to pick v2.0.
    unversioned = dict(TINY_V2)
    del unversioned["version"]
    v2_again = evaluate_squad(_write(tmp_path / "d3.json", unversioned), tmp_path / "p2.json")
    assert "best_f1" not in v2_again and v2_again["NoAns_total"] == 2


def test_evaluate_squad_bad_input(tmp_path):
    data = _write(tmp_path / "data.json", TINY_V2)
    predictions = _write(tmp_path / "pred.json", TINY_V2_PREDICTIONS)
    with pytest.raises(BertkitError, match="not found") as err:
        evaluate_squad(tmp_path / "missing.json", predictions)
    assert "missing.json" in str(err.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [\n  {"paragraphs": ]}', encoding="utf-8")
    with pytest.raises(BertkitError, match="not valid JSON") as err:
        evaluate_squad(broken, predictions)
    assert err.value.line == 2 and "broken.json:2:" in str(err.value)
    with pytest.raises(BertkitError, match="'data' list") as err:
        evaluate_squad(_write(tmp_path / "nodata.json", {"version": "v2.0"}), predictions)
    assert "nodata.json" in str(err.value)
    with pytest.raises(BertkitError, match="mapping question id"):
        evaluate_squad(data, _write(tmp_path / "list.json", ["Normandy"]))
    with pytest.raises(BertkitError, match="expected a string"):
        evaluate_squad(data, _write(tmp_path / "num.json", {**TINY_V2_PREDICTIONS, "qa": 3}))
    with pytest.raises(BertkitError, match="no prediction") as err:
        evaluate_squad(data, _write(tmp_path / "partial.json", {"qa": "Normandy"}))
    assert "partial.json" in str(err.value)
    with pytest.raises(BertkitError, match="only applies to SQuAD v2.0"):
        evaluate_squad(_write(tmp_path / "v1.json", TINY_V1), _write(tmp_path / "p1.json", TINY_V1_PREDICTIONS),
                       na_prob_file=_write(tmp_path / "na.json", TINY_V2_NA_PROBS))
