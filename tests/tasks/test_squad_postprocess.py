"""SQuAD post-processing: synthetic logits with hand-computed answers, Hugging Face's port of the
original write_predictions on real passages, the v2.0 null threshold, and `bertkit evaluate squad`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.tasks.squad import (SquadPredictions, evaluate_prediction_file, postprocess_predictions, read_squad,
                                 score_predictions, squad_json)
from bertkit.tasks.squad_windows import (SquadAnswer, SquadExample, SquadWindow, TokenizedPassage, doc_spans,
                                         squad_windows)

# A passage of 8 one-letter words: token k is character 2k.
CONTEXT = "a b c d e f g h"
PASSAGE = TokenizedPassage(np.arange(1000, 1008, dtype=np.int32), np.array([[2 * k, 2 * k + 1] for k in range(8)]))
QUESTION_LENGTH = 1  # [CLS] q [SEP] -> the passage starts at position 3


def _windows(max_tokens_for_doc=6, doc_stride=2):
    """Windows over the 8 tokens: (0, 6) and (2, 6) by default; window positions 0-2 are [CLS] q [SEP]."""
    spans = doc_spans(8, max_tokens_for_doc, doc_stride)
    windows = []
    for index, (start, length) in enumerate(spans):
        ids = np.array([101, 2000, 102, *PASSAGE.ids[start:start + length], 102], dtype=np.int32)
        windows.append(SquadWindow(0, index, ids, QUESTION_LENGTH + 2, start, length, spans, PASSAGE))
    return windows


def _logits(windows, start_values, end_values, floor=-10.0):
    """Per window: every position at `floor` except {window index: {passage token: logit}}."""
    starts, ends = [], []
    for index, w in enumerate(windows):
        s, e = [floor] * len(w.input_ids), [floor] * len(w.input_ids)
        for token, value in start_values.get(index, {}).items():
            s[w.context_offset + token - w.doc_start] = value
        for token, value in end_values.get(index, {}).items():
            e[w.context_offset + token - w.doc_start] = value
        starts.append(s)
        ends.append(e)
    return starts, ends


EXAMPLE = SquadExample("q", "?", CONTEXT, [])


def test_a_token_is_scored_only_in_its_max_context_window():
    windows = _windows()
    assert [(w.doc_start, w.doc_length) for w in windows] == [(0, 6), (2, 6)]
    # token 4 ("e"): window 0 -> min(4, 1) + 0.06, window 1 -> min(2, 3) + 0.06: window 1 is its max context.
    # Window 0 scores start "e" far higher, but a start is only taken from its max-context window.
    starts, ends = _logits(windows, {0: {4: 10.0}, 1: {4: 5.0}}, {0: {5: 8.0}, 1: {5: 6.0}})
    result = postprocess_predictions([EXAMPLE], windows, starts, ends, n_best_size=20, max_answer_length=30)
    assert result.predictions == {"q": "e f"}
    best = result.nbest["q"][0]
    assert (best["start_logit"], best["end_logit"]) == (5.0, 6.0)
    # token 3 ("d") has its max context in window 0: the same logits move there.
    starts, ends = _logits(windows, {0: {3: 5.0}, 1: {3: 10.0}}, {0: {4: 6.0}, 1: {4: 8.0}})
    assert postprocess_predictions([EXAMPLE], windows, starts, ends).nbest["q"][0]["start_logit"] == 5.0


def test_length_limit_end_before_start_and_non_passage_positions():
    windows = _windows(max_tokens_for_doc=8)  # one window with the whole passage
    starts, ends = _logits(windows, {0: {0: 9.0, 5: 12.0, 2: 1.0}}, {0: {4: 9.0, 3: 5.0, 1: 0.5}})
    for w_starts, w_ends in zip(starts, ends):
        w_starts[0] = w_starts[1] = w_starts[2] = w_starts[-1] = 50.0  # [CLS], question, [SEP]: never answers
        w_ends[0] = w_ends[1] = w_ends[2] = w_ends[-1] = 50.0
    # "f".."e" (12 + 9) would win but ends before it starts. Unlimited: a..e (9 + 9), five tokens.
    assert postprocess_predictions([EXAMPLE], windows, starts, ends, max_answer_length=30).predictions["q"] == \
        "a b c d e"
    # At most 4 tokens: a..d (9 + 5 = 14) beats c..e (1 + 9 = 10).
    result = postprocess_predictions([EXAMPLE], windows, starts, ends, max_answer_length=4)
    assert result.predictions["q"] == "a b c d"
    assert all(len(e["text"].split()) <= 4 for e in result.nbest["q"])
    # n-best probabilities are the softmax of start + end logits over the listed candidates
    totals = [e["start_logit"] + e["end_logit"] for e in result.nbest["q"]]
    expected = [math.exp(t - max(totals)) for t in totals]
    assert [e["probability"] for e in result.nbest["q"]] == pytest.approx([x / sum(expected) for x in expected])
    # no valid span at all (the only start candidates lie in the question): the original's "empty"
    assert postprocess_predictions([EXAMPLE], windows, starts, ends, n_best_size=4).predictions["q"] == "empty"


def test_v2_null_score_is_the_minimum_over_windows_and_the_threshold_applies():
    windows = _windows()
    starts, ends = _logits(windows, {0: {1: 4.0}, 1: {6: 3.0}}, {0: {2: 4.0}, 1: {7: 3.0}})
    starts[0][0], ends[0][0] = 3.0, 2.0  # null 5 in window 0
    starts[1][0], ends[1][0] = 1.5, 1.0  # null 2.5 in window 1: the minimum is used
    result = postprocess_predictions([EXAMPLE], windows, starts, ends, version_2_with_negative=True)
    assert result.predictions == {"q": "b c"} and result.best_non_null == {"q": "b c"}
    assert result.null_odds["q"] == pytest.approx(2.5 - 8.0)
    null_entry = next(e for e in result.nbest["q"] if e["text"] == "")
    assert (null_entry["start_logit"], null_entry["end_logit"]) == (1.5, 1.0)
    # diff -5.5 > tau -6: abstain
    high = postprocess_predictions([EXAMPLE], windows, starts, ends, version_2_with_negative=True,
                                   null_score_diff_threshold=-6.0)
    assert high.predictions == {"q": ""} and high.with_threshold(-5.5).predictions == {"q": "b c"}


def test_threshold_search_on_hand_computed_questions(tmp_path):
    def example(qid, answer):
        answers = [SquadAnswer(answer, CONTEXT.index(answer))] if answer else []
        return SquadExample(qid, "?", CONTEXT, answers, is_impossible=not answer)

    examples = [example("q1", "b"), example("q2", None), example("q3", None), example("q4", "h")]
    odds = {"q1": -1.0, "q2": 2.0, "q3": -0.5, "q4": 0.5}
    texts = {"q1": "b", "q2": "c", "q3": "d", "q4": "h"}
    result = SquadPredictions({}, {}, True, odds, texts).with_threshold(0.0)
    assert result.predictions == {"q1": "b", "q2": "", "q3": "d", "q4": ""}
    metrics, applied = score_predictions(examples, result)
    # tau 0: q1 and q2 right -> 50; abstaining on q3 needs tau < -0.5, which also drops q4: 75 at tau -1.
    assert metrics["default_threshold"]["f1"] == 50.0 and metrics["default_threshold"]["null_score_diff_threshold"] == 0
    assert metrics["best_threshold"]["f1"] == 75.0 and metrics["best_threshold"]["null_score_diff_threshold"] == -1.0
    assert metrics["null_score_diff_threshold"] == -1.0
    assert applied.predictions == {"q1": "b", "q2": "", "q3": "", "q4": ""}
    assert metrics["best_threshold"]["HasAns_total"] == 2 and metrics["best_threshold"]["NoAns_exact"] == 100.0
    written = applied.write(tmp_path)
    assert sorted(p.name for p in written) == ["nbest_predictions.json", "null_odds.json", "predictions.json"]
    assert json.loads((tmp_path / "predictions.json").read_text()) == applied.predictions
    assert json.loads((tmp_path / "null_odds.json").read_text()) == odds


# --------------------------------------------------------------------------- against the original (HF port)


def _reference_predictions(examples, windows, starts, ends, legacy, version_2, n_best_size, max_answer_length,
                           out_dir):
    """transformers' compute_predictions_logits (a line-by-line port of run_squad.py's write_predictions)
    on features rebuilt from the windows the original way: whitespace words and max-context flags."""
    from types import SimpleNamespace

    from transformers.data.metrics.squad_metrics import compute_predictions_logits
    from transformers.data.processors.squad import SquadExample as Ref, SquadResult, _check_is_max_context

    refs = [Ref(e.qid, e.question, e.context, None, None, e.title) for e in examples]
    features, results = [], []
    for unique_id, w in enumerate(windows):
        tokens = legacy.convert_ids_to_tokens(w.input_ids.tolist())
        spans = [SimpleNamespace(start=s, length=n) for s, n in w.spans]
        context_positions = range(w.context_offset, w.context_offset + w.doc_length)
        features.append(SimpleNamespace(
            unique_id=unique_id, example_index=w.example_index, tokens=tokens,
            token_to_orig_map={p: refs[w.example_index].char_to_word_offset[w.char_span(p)[0]]
                               for p in context_positions},
            token_is_max_context={p: _check_is_max_context(spans, w.span_index, w.context_token(p))
                                  for p in context_positions}))
        results.append(SquadResult(unique_id, list(starts[unique_id]), list(ends[unique_id])))
    nbest_file, odds_file = out_dir / "nbest.json", out_dir / "odds.json"
    predictions = compute_predictions_logits(refs, features, results, n_best_size, max_answer_length, True, None,
                                             str(nbest_file), str(odds_file), False, version_2, 0.0, legacy)
    return predictions, json.loads(nbest_file.read_text()), json.loads(odds_file.read_text()) if version_2 else {}


@pytest.mark.parametrize("version_2", [False, True])
def test_matches_the_original_write_predictions_on_real_passages(data_dir, uncased_vocab, version_2, tmp_path):
    """Random logits on dev-v2.0 passages at max_seq_length 96 / doc_stride 32 (several windows per
    passage), with a bonus on tokens that start / end a whitespace word so that candidates are
    whole words (the original's text path and the offsets agree on those; see test_squad_windows)."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    from bertkit.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(uncased_vocab)
    legacy = BertTokenizerLegacy(vocab_file=str(uncased_vocab), do_lower_case=True)
    examples = read_squad(data_dir / "squad" / "dev-v2.0.json").examples[:240]
    windows = squad_windows(examples, tokenizer, max_seq_length=96, doc_stride=32, max_query_length=64).windows
    assert len(windows) > 2 * len(examples)
    rng = np.random.default_rng(1)
    starts, ends = [], []
    for w in windows:
        context = examples[w.example_index].context
        s = rng.normal(size=len(w.input_ids)).astype(np.float32)
        e = rng.normal(size=len(w.input_ids)).astype(np.float32)
        for p in range(w.context_offset, w.context_offset + w.doc_length):
            first, last = w.char_span(p)
            s[p] += 20.0 * (first == 0 or context[first - 1].isspace())
            e[p] += 20.0 * (last == len(context) or context[last].isspace())
        null_bonus = rng.uniform(20.0, 26.0) * version_2  # the null answer wins for some questions
        s[0] += null_bonus
        e[0] += null_bonus
        starts.append(s.tolist())
        ends.append(e.tolist())
    ours = postprocess_predictions(examples, windows, starts, ends, version_2_with_negative=version_2,
                                   n_best_size=20, max_answer_length=6)
    reference, reference_nbest, reference_odds = _reference_predictions(examples, windows, starts, ends, legacy,
                                                                         version_2, 20, 6, tmp_path)
    # the original re-joins whitespace words with one space; the offsets keep the passage's own spacing
    normalised = {qid: " ".join(text.split()) for qid, text in ours.predictions.items()}
    assert normalised == dict(reference)
    for qid, nbest in ours.nbest.items():
        assert [" ".join(e["text"].split()) for e in nbest] == [e["text"] for e in reference_nbest[qid]]
        for key in ("probability", "start_logit", "end_logit"):
            assert [e[key] for e in nbest] == pytest.approx([e[key] for e in reference_nbest[qid]], rel=1e-9)
    assert ours.null_odds == pytest.approx(reference_odds, rel=1e-9)
    if version_2:
        assert 0 < sum(text == "" for text in ours.predictions.values()) < len(examples)


# --------------------------------------------------------------------------- bertkit evaluate squad


def _write_json(path, content):
    path.write_text(json.dumps(content))
    return str(path)


def test_evaluate_command_prints_the_official_numbers(tmp_path, capsys):
    examples = [SquadExample("q1", "?", CONTEXT, [SquadAnswer("a b", 0), SquadAnswer("b", 2)]),
                SquadExample("q2", "?", CONTEXT, [SquadAnswer("h", 14)])]
    data = _write_json(tmp_path / "v1.json", squad_json(examples, "1.1"))
    predictions = _write_json(tmp_path / "p.json", {"q1": "b c", "q2": "h"})
    assert main(["evaluate", "squad", data, predictions]) == 0
    # q1: "a" is an article, so both golds normalise to "b": EM 0, F1 2 * (1/2 * 1) / (1/2 + 1) = 2/3; q2: 1, 1
    assert json.loads(capsys.readouterr().out) == pytest.approx({"exact_match": 50.0, "f1": 100 * (2 / 3 + 1) / 2})

    v2_examples = examples + [SquadExample("q3", "?", CONTEXT, [], is_impossible=True)]
    data = _write_json(tmp_path / "v2.json", squad_json(v2_examples, "2.0"))
    predictions = _write_json(tmp_path / "p2.json", {"q1": "a b", "q2": "", "q3": ""})
    odds = _write_json(tmp_path / "odds.json", {"q1": -1.0, "q2": 1.0, "q3": 2.0})
    assert main(["evaluate", "squad", data, predictions, "--na-prob-file", odds]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    result = json.loads(out)
    assert set(result) == {"exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                           "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"}
    assert result["exact"] == pytest.approx(200 / 3) and result["total"] == 3 and result["NoAns_exact"] == 100.0

    # As a Python call: the TaskResult every task returns, its metrics the printed numbers as fractions.
    scored = evaluate_prediction_file(data, predictions, odds)
    assert (scored.task, scored.metric, scored.document["metrics"]) == ("squad2", "f1", result)
    assert scored.metrics == pytest.approx({k: v / 100 for k, v in result.items()
                                            if ("exact" in k or "f1" in k) and "thresh" not in k})
    assert scored.value == pytest.approx(result["f1"] / 100) and scored.output_dir is None
    v1 = evaluate_prediction_file(tmp_path / "v1.json", tmp_path / "p.json")
    assert (v1.task, v1.metrics) == ("squad", pytest.approx({"exact_match": 0.5, "f1": (2 / 3 + 1) / 2}))

    assert main(["evaluate", "squad", str(tmp_path / "missing.json"), predictions]) == 2
    assert "missing.json" in capsys.readouterr().err
