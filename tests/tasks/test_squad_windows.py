"""SQuAD reading and windows: hand-computed cases, the real dev set, and the original algorithm.

The references are independent of bertkit: Hugging Face's port of run_squad.py's pieces
(`transformers.data.processors.squad.SquadExample` for the whitespace words,
`_improve_answer_span`, `_check_is_max_context`; `squad_metrics.get_final_text`) and the
pure-Python BERT tokenizer (`BertTokenizerLegacy`) for word-by-word WordPiece, as the original did.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.squad import read_squad
from bertkit.tasks.squad_windows import (SquadAnswer, SquadExample, answer_is_recoverable, answer_token_span,
                                         check_is_max_context, doc_spans, squad_windows)


@pytest.fixture(scope="module")
def tokenizer(uncased_vocab):
    from bertkit.tokenizer import BertTokenizer

    return BertTokenizer.from_pretrained(uncased_vocab)


@pytest.fixture(scope="module")
def dev_v11(data_dir):
    return read_squad(data_dir / "squad" / "dev-v1.1.json")


# --------------------------------------------------------------------------- hand-computed


def test_doc_spans_advance_by_min_of_length_and_stride():
    # 10 tokens, 4 per window, stride 3: starts 0, 3, 6; the third reaches the end.
    assert doc_spans(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    # A stride beyond the window length advances by the length: no token is skipped.
    assert doc_spans(10, 4, 6) == [(0, 4), (4, 4), (8, 2)]
    assert doc_spans(3, 4, 2) == [(0, 3)]
    assert doc_spans(0, 4, 2) == []


def test_max_context_prefers_the_centred_window_and_the_first_on_ties():
    spans = [(0, 5), (2, 5)]
    # token 3: window 0 -> min(3, 1) + 0.05 = 1.05; window 1 -> min(1, 3) + 0.05 = 1.05: tie, first wins
    assert check_is_max_context(spans, 0, 3) and not check_is_max_context(spans, 1, 3)
    # token 4: window 0 -> min(4, 0) + 0.05; window 1 -> min(2, 2) + 0.05
    assert check_is_max_context(spans, 1, 4) and not check_is_max_context(spans, 0, 4)
    # the 0.01 * length term breaks a tie towards the longer window
    # token 3: window 0 -> min(3, 0) + 0.04; window 1 -> min(0, 1) + 0.02
    assert check_is_max_context([(0, 4), (3, 2)], 0, 3) and not check_is_max_context([(0, 4), (3, 2)], 1, 3)
    assert check_is_max_context([(0, 2), (0, 4)], 1, 1)  # min(1,0)+0.02 vs min(1,2)+0.04


def test_answer_token_span_uses_overlapping_tokens():
    # "in (1895), hesses" -> tokens: in | ( | 1895 | ) | , | hesse | ##s
    offsets = np.array([[0, 2], [3, 4], [4, 8], [8, 9], [9, 10], [11, 16], [16, 17]])
    assert answer_token_span(offsets, 4, 8) == (2, 2)  # "1895": exactly one token, no improvement step needed
    assert answer_token_span(offsets, 3, 9) == (1, 3)  # "(1895)"
    assert answer_token_span(offsets, 11, 15) == (5, 5)  # "hess": inside a token -> the whole token
    assert answer_token_span(offsets, 2, 3) is None  # only whitespace
    assert answer_token_span(offsets, 10, 12) == (5, 5)  # leading space is not a token


def test_answer_is_recoverable_is_the_originals_whitespace_check():
    context = "Born in (1895),  the  city of\tPeace."
    assert answer_is_recoverable(context, SquadAnswer("1895", context.index("1895")))
    assert answer_is_recoverable(context, SquadAnswer("the city", context.index("the")))  # spaces normalised
    assert answer_is_recoverable(context, SquadAnswer("city of Peace", context.index("city")))
    assert not answer_is_recoverable(context, SquadAnswer("1895", 0))  # text not where answer_start says
    assert not answer_is_recoverable(context, SquadAnswer("Peace.!", context.index("Peace")))  # runs past the end
    # U+00A0 is not whitespace to the original: "a b" is not found in the word "a\u00a0b"
    assert not answer_is_recoverable("x a\u00a0b y", SquadAnswer("a b", 2))


def _write(tmp_path, content, name="squad.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _squad(qas, context="Paris is in France.", version=None):
    data = {"data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}
    if version:
        data["version"] = version
    return data


def test_reader_versions_and_answers(tmp_path):
    v1 = read_squad(_write(tmp_path, _squad([{"id": "q1", "question": "Where?", "answers": [
        {"text": "France", "answer_start": 12}]}], version="1.1")))
    assert v1.version == "1.1" and v1.examples[0].answers == [SquadAnswer("France", 12)]
    v2 = read_squad(_write(tmp_path, _squad([
        {"id": "q1", "question": "Where?", "answers": [{"text": "France", "answer_start": 12}], "is_impossible": False},
        {"id": "q2", "question": "Who?", "answers": [], "is_impossible": True}])))
    assert v2.version == "2.0" and [e.is_impossible for e in v2] == [False, True]


@pytest.mark.parametrize("content, expected", [
    ('{"data": [', "not valid JSON"),
    ({"dat": []}, "'data' list"),
    (_squad([{"question": "Where?", "answers": []}]), "string 'id'"),
    (_squad([{"id": "q7", "answers": []}]), "question q7: missing 'question'"),
    (_squad([{"id": "q7", "question": "?", "answers": [{"text": "France"}]}]), "question q7: each answer"),
    (_squad([{"id": "q7", "question": "?", "answers": [{"text": "France", "answer_start": 40}]}]),
     "question q7: answer_start 40"),
    (_squad([{"id": "q7", "question": "?"}, {"id": "q7", "question": "?"}]), "question q7: duplicate id"),
    (_squad([{"id": "q7", "question": "?", "is_impossible": "yes"}]), "question q7: 'is_impossible'"),
])
def test_reader_errors_name_the_file_and_the_question(tmp_path, content, expected):
    path = _write(tmp_path, content)
    with pytest.raises(BertkitError) as err:
        read_squad(path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_reader_skips_and_counts_bad_questions(tmp_path):
    path = _write(tmp_path, _squad([{"id": "q1", "question": "?", "answers": []}, {"id": "q2"},
                                    {"id": "q3", "question": "?", "answers": [{"text": "x", "answer_start": 99}]}]))
    data = read_squad(path, skip_bad_rows=True)
    assert [e.qid for e in data] == ["q1"] and data.bad_rows_skipped == 2


def test_window_layout_and_labels(tokenizer):
    context = "The quick brown fox jumps over the lazy dog near the river bank today"
    example = SquadExample("q", "what jumps?", context, [SquadAnswer("fox", context.index("fox"))])
    windows = squad_windows([example], tokenizer, max_seq_length=12, doc_stride=3, max_query_length=5,
                            training=True)
    query = tokenizer.tokenize("what jumps?")  # 3 tokens -> 12 - 3 - 3 = 6 passage tokens per window
    passage = tokenizer.tokenize(context)
    assert [(w.doc_start, w.doc_length) for w in windows] == doc_spans(len(passage), 6, 3)
    fox = passage.index("fox")
    for w in windows:
        tokens = tokenizer.convert_ids_to_tokens(w.input_ids.tolist())
        assert tokens == ["[CLS]", *query, "[SEP]", *passage[w.doc_start:w.doc_start + w.doc_length], "[SEP]"]
        assert w.context_offset == len(query) + 2
        if w.doc_start <= fox < w.doc_start + w.doc_length:
            assert tokens[w.start_position] == tokens[w.end_position] == "fox"
        else:
            assert w.start_position == w.end_position == 0  # the answer is outside: point at [CLS]
    impossible = dataclasses.replace(example, answers=[], is_impossible=True)
    assert all(w.start_position == w.end_position == 0 for w in
               squad_windows([impossible], tokenizer, 12, 3, 5, training=True))
    wrong = dataclasses.replace(example, answers=[SquadAnswer("fox", 0)])
    assert squad_windows([wrong], tokenizer, 12, 3, 5, training=True).skipped_unrecoverable == ["q"]


# --------------------------------------------------------------------------- the real dev set


def test_every_dev_answer_maps_back_to_its_gold_text(tokenizer, dev_v11):
    """Each (question, answer) of dev-v1.1 as a training example: the labelled token span of every
    window that holds it, mapped back through the offsets, must give the gold text. The only
    allowed difference: a gold boundary inside a WordPiece token (the label is then that whole
    token; the original's word-level labels cannot be finer)."""
    examples = [dataclasses.replace(e, qid=f"{e.qid}/{k}", answers=[a])
                for e in dev_v11 for k, a in enumerate(e.answers)]
    assert len(examples) == 34726
    windows = squad_windows(examples, tokenizer, max_seq_length=384, doc_stride=128, max_query_length=64,
                            training=True)
    assert windows.skipped_unrecoverable == []
    exact, inside_token, other, labelled = 0, [], [], set()
    for w in windows:
        if w.start_position == 0:
            continue
        example = examples[w.example_index]
        answer = example.answers[0]
        first, last = w.char_span(w.start_position), w.char_span(w.end_position)
        text = example.context[first[0]:last[1]]
        labelled.add(w.example_index)
        gold_start, gold_end = answer.answer_start, answer.answer_start + len(answer.text)
        if text == answer.text:
            exact += 1
        elif first[0] <= gold_start < first[1] and last[0] < gold_end <= last[1] and \
                (first[0] < gold_start or gold_end < last[1]):
            inside_token.append((answer.text, text))
        else:
            other.append((example.qid, answer.text, text))
    # Every answer fits a 384-token window here (none is longer than 256 passage tokens).
    assert len(labelled) == len(examples)
    assert other == []
    # Answers cut inside a word piece: e.g. "Europe" of "European" is "europe"+"##an" -> "European".
    assert all(gold in text for gold, text in inside_token)
    assert len(inside_token) < 0.01 * exact, inside_token[:20]
    print(f"exact {exact}, boundary inside a token {len(inside_token)}: {sorted(set(inside_token))[:10]}")


# --------------------------------------------------------------------------- the original algorithm


def _original_features(example, legacy, max_seq_length, doc_stride, max_query_length, passage_cache):
    """run_squad.py's convert_examples_to_features for one training example, word by word."""
    from transformers.data.processors.squad import SquadExample as Ref, _check_is_max_context, _improve_answer_span

    answer = example.answers[0]
    ref = Ref(example.qid, example.question, example.context, answer.text, answer.answer_start, example.title)
    query_tokens = legacy.tokenize(example.question)[:max_query_length]
    if example.context not in passage_cache:  # the original re-tokenizes per question; same result
        tok_to_orig_index, orig_to_tok_index, all_doc_tokens = [], [], []
        for i, word in enumerate(ref.doc_tokens):
            orig_to_tok_index.append(len(all_doc_tokens))
            for sub_token in legacy.tokenize(word):
                tok_to_orig_index.append(i)
                all_doc_tokens.append(sub_token)
        passage_cache[example.context] = tok_to_orig_index, orig_to_tok_index, all_doc_tokens
    tok_to_orig_index, orig_to_tok_index, all_doc_tokens = passage_cache[example.context]
    tok_start = orig_to_tok_index[ref.start_position]
    tok_end = (orig_to_tok_index[ref.end_position + 1] - 1 if ref.end_position < len(ref.doc_tokens) - 1
               else len(all_doc_tokens) - 1)
    tok_start, tok_end = _improve_answer_span(all_doc_tokens, tok_start, tok_end, legacy, answer.text)
    max_tokens_for_doc = max_seq_length - len(query_tokens) - 3
    spans, start_offset = [], 0
    while start_offset < len(all_doc_tokens):  # verbatim from the original
        length = min(len(all_doc_tokens) - start_offset, max_tokens_for_doc)
        spans.append(SimpleNamespace(start=start_offset, length=length))
        if start_offset + length == len(all_doc_tokens):
            break
        start_offset += min(length, doc_stride)
    features = []
    for span_index, span in enumerate(spans):
        tokens = ["[CLS]", *query_tokens, "[SEP]"]
        segment_ids = [0] * len(tokens)
        token_to_orig_map, token_is_max_context = {}, {}
        for i in range(span.length):
            token_to_orig_map[len(tokens)] = tok_to_orig_index[span.start + i]
            token_is_max_context[len(tokens)] = _check_is_max_context(spans, span_index, span.start + i)
            tokens.append(all_doc_tokens[span.start + i])
            segment_ids.append(1)
        tokens.append("[SEP]")
        segment_ids.append(1)
        start = end = 0
        if span.start <= tok_start and tok_end <= span.start + span.length - 1:
            start = tok_start - span.start + len(query_tokens) + 2
            end = tok_end - span.start + len(query_tokens) + 2
        features.append(SimpleNamespace(tokens=tokens, segment_ids=segment_ids, start=start, end=end,
                                        token_to_orig_map=token_to_orig_map,
                                        token_is_max_context=token_is_max_context, doc_tokens=ref.doc_tokens))
    return features


def _original_text(feature, start, end):
    """The original's answer text for positions start..end: WordPieces joined, then get_final_text
    aligns them with the whitespace words they came from. Returns (text, the words joined)."""
    from transformers.data.metrics.squad_metrics import get_final_text

    tok_text = " ".join(feature.tokens[start:end + 1]).replace(" ##", "").replace("##", "")
    tok_text = " ".join(tok_text.strip().split())
    orig_words = " ".join(feature.doc_tokens[feature.token_to_orig_map[start]:feature.token_to_orig_map[end] + 1])
    return get_final_text(tok_text, orig_words, do_lower_case=True), orig_words


def test_windows_labels_and_texts_match_the_original_algorithm(tokenizer, dev_v11, uncased_vocab):
    """Every 6th dev article at max_seq_length 128 / doc_stride 48 (many multi-window passages):
    the same windows, tokens, segments and max-context flags as run_squad.py; the same labels and
    the same answer text (labelled spans and random spans) except in the explained categories."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    legacy = BertTokenizerLegacy(vocab_file=str(uncased_vocab), do_lower_case=True)
    examples = [e for e in dev_v11 if e.article_index % 6 == 0]
    windows = squad_windows(examples, tokenizer, max_seq_length=128, doc_stride=48, max_query_length=64,
                            training=True)
    assert windows.skipped_unrecoverable == []
    by_example: dict[int, list] = {}
    for w in windows:
        by_example.setdefault(w.example_index, []).append(w)
    rng = np.random.default_rng(0)
    passage_cache: dict = {}
    counts = dict(windows=0, labels=0, label_narrower=0, texts=0, text_equal=0, whitespace_joined=0,
                  whole_word_fallback=0, other_occurrence=0)
    unexplained = []
    for example_index, example in enumerate(examples):
        ours = by_example[example_index]
        original = _original_features(example, legacy, 128, 48, 64, passage_cache)
        assert len(ours) == len(original), example.qid
        answer = example.answers[0]
        for w, ref in zip(ours, original):
            counts["windows"] += 1
            assert tokenizer.convert_ids_to_tokens(w.input_ids.tolist()) == ref.tokens, example.qid
            assert [0] * w.context_offset + [1] * (len(ref.tokens) - w.context_offset) == ref.segment_ids
            assert {p: w.is_max_context(p) for p in ref.token_is_max_context} == ref.token_is_max_context
            counts["labels"] += 1
            if (w.start_position, w.end_position) != (ref.start, ref.end):
                # A gold boundary inside a whitespace word where _improve_answer_span finds no match: the
                # original labels the whole words ('"golden' for "gold", '1978.' for "7", 'nonviolent'
                # for "violent"); the offsets label only the tokens overlapping the answer, inside them.
                first, last = w.char_span(w.start_position), w.char_span(w.end_position)
                covers_gold = example.context[first[0]:last[1]].find(answer.text) >= 0
                if covers_gold and ref.start <= w.start_position <= w.end_position <= ref.end and ref.start > 0:
                    counts["label_narrower"] += 1
                else:
                    unexplained.append(("label", answer.text, ref.tokens[ref.start:ref.end + 1]))
            spans = [(w.start_position, w.end_position)] if w.start_position else []
            for _ in range(2):
                s = int(rng.integers(w.context_offset, w.context_offset + w.doc_length))
                spans.append((s, min(s + int(rng.integers(0, 6)), w.context_offset + w.doc_length - 1)))
            for s, e in spans:
                counts["texts"] += 1
                ours_text = example.context[w.char_span(s)[0]:w.char_span(e)[1]]
                original_text, original_words = _original_text(ref, s, e)
                if ours_text == original_text:
                    counts["text_equal"] += 1
                elif " ".join(ours_text.split()) == original_text:
                    counts["whitespace_joined"] += 1  # the original re-joins words with one space
                elif original_text == original_words and " ".join(ours_text.split()) in original_words:
                    counts["whole_word_fallback"] += 1  # get_final_text could not align (e.g. CJK) -> words
                elif ours_text.lower() == original_text.lower():
                    counts["other_occurrence"] += 1  # get_final_text took the first match ("k" of "Kok")
                else:
                    unexplained.append(("text", ours_text, original_text))
    print(counts)
    assert unexplained == []
    assert counts["windows"] > 6000
    # the differences are rare: labels 13 of 6471, texts 53 of 16578 with this vocabulary
    assert counts["label_narrower"] < 0.005 * counts["labels"]
    assert counts["text_equal"] > 0.995 * counts["texts"]
