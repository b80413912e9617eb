"""WordPiece tokenizer: parity with the original BERT tokenization, offsets, training, errors.

The reference is transformers' BertTokenizerLegacy, the pure-Python port of Google's
tokenization.py. We call its basic tokenizer and WordPiece directly (Google's
FullTokenizer.tokenize): its `tokenize()` adds a transformers-only rule that keeps literal
special-token strings such as "[MASK]" whole, which the original did not have.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import unicodedata

import pytest
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from bertkit.errors import BertkitError
from bertkit.tokenizer import (
    SPECIAL_TOKENS,
    BertTokenizer,
    _basic_tokenize,
    _needs_exact_path,
    _wordpiece,
    tokenize_stream,
    train_tokenizer,
    truncated_pair_lengths,
)

CORPUS_FILES = ("nltk2008.txt.gz", "gutenberg_digiuga.txt.gz", "enwiki2015.txt.gz")

HOSTILE = [
    "",
    "   \t\n  ",
    "\u200b\u200b",
    "Héllo Wörld, Ångström, niño, crème brûlée, Zoë, façade",
    "e\u0301 A\u030a n\u0303o cafe\u0301s Cafe\x00\u0301",
    "İstanbul ß ẞ ﬁne ligature Ǆ ǅ ǆ",
    "\u2126 \u212a \u212b Greek question mark\u037e ano teleia\u0387",
    "中文字符测试 and 日本語テキスト 한국어 \uf900\uf901 \U00020000\U0002b820\U0002b91f\U0002b920",
    "\u1100\u1161\u11a8 jamo",
    "I ❤️ 🤖 emojis 👍🏽 👨\u200d👩\u200d👧 \U0001fae0",
    "a\x00b\x07c\ufffdd\u200be\tf\rg\nh\u00a0i\u3000j",
    "\x0b\x0c\x1c\x1d\x85 \u2028line\u2029sep soft\xadhyphen \u200e\u200f\ufeff",
    "a\ud800b lone surrogate \udfff",
    "unassigned \u0378\u0890 private \ue000\U000f0000 tag \U000e0041 variation \ufe0f\U000e0100",
    "Καλημέρα κόσμε ΟΔΟΣ ΣΟΦΟΣ Σ ΑΣ. ΑΣ'Β ὈΔΥΣΣΕΎΣ",
    "Привет, мир! Ёлка ЁЖ",
    "مرحبا بالعالم، كيف حالك؟ \u064b\u0650",
    "नमस्ते दुनिया। क़",
    "สวัสดีชาวโลก ๆ",
    "don't U.S.A. $3.50 ^caret^ `tick` ~tilde~ |pipe| {brace} <angle> 50% @ #tag &amp; \\ _",
    "«quotes» „German“ —dash– … ¿Qué? ¡Sí! § 12 ¶ 3 ‰ ′ ″ • ・ 、。「」",
    "the [MASK] sat on [CLS] [SEP] [PAD] [UNK]",
    "a" * 100 + " " + "a" * 101 + " " + "é" * 101,
    "e\u0301" * 60 + " " + "x\x00" * 70 + " " + "E\u0301" * 101,
    "supercalifragilisticexpialidocious antidisestablishmentarianism ☃☃ \u0bb8\u0bcd",
    "tab\tseparated\tvalues\r\nwindows line",
    "1,000,000.00 3.14159 2^10 1e-9 0x1F",
]


def reference_tokens(legacy: BertTokenizerLegacy, text: str) -> list[str]:
    """Google's FullTokenizer.tokenize: basic tokenization, then WordPiece on every word."""
    return [
        piece for word in legacy.basic_tokenizer.tokenize(text) for piece in legacy.wordpiece_tokenizer.tokenize(word)
    ]


def original_truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """`_truncate_seq_pair` from Google's run_classifier.py, verbatim."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_length:
            break
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def uncased(uncased_vocab) -> BertTokenizer:
    return BertTokenizer.from_pretrained(uncased_vocab)


@pytest.fixture(scope="module")
def legacy_uncased(uncased_vocab) -> BertTokenizerLegacy:
    return BertTokenizerLegacy(str(uncased_vocab), do_lower_case=True)


@pytest.fixture(scope="module")
def cased_vocab(uncased_vocab, tmp_path_factory):
    """The uncased vocabulary plus capitalised / upper-case forms and accented letters."""
    tokens = uncased_vocab.read_text(encoding="utf-8").splitlines()
    seen = set(tokens)
    extra = []
    for token in tokens:
        if token.startswith("["):
            continue
        prefix, body = ("##", token[2:]) if token.startswith("##") else ("", token)
        for variant in (body.capitalize(), body.upper()):
            candidate = prefix + variant
            if candidate not in seen:
                seen.add(candidate)
                extra.append(candidate)
    letters = "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿĀāĂăĄąĆćČčĘęĚěĞğİıŁłŃńŇňŐőŒœŘřŚśŞşŠšŸŹźŻżŽžάέήίόύώΆΈΉΊΌΎΏЁё"
    for letter in letters:
        for candidate in (letter, "##" + letter):
            if candidate not in seen:
                seen.add(candidate)
                extra.append(candidate)
    path = tmp_path_factory.mktemp("cased") / "vocab.txt"
    path.write_text("\n".join(tokens + extra) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cased(cased_vocab) -> BertTokenizer:
    return BertTokenizer(cased_vocab, do_lower_case=False)


@pytest.fixture(scope="module")
def legacy_cased(cased_vocab) -> BertTokenizerLegacy:
    return BertTokenizerLegacy(str(cased_vocab), do_lower_case=False)


@pytest.fixture(scope="module")
def corpus_lines(data_dir) -> list[str]:
    """First 2000 non-empty lines of each corpus, plus the lines among the first 40,000 of
    each that need the exact (pure-Python) path, so both paths meet real text."""
    lines = []
    for name in CORPUS_FILES:
        with gzip.open(data_dir / "corpus" / name, "rt", encoding="utf-8") as handle:
            non_empty = (line.rstrip("\n") for line in itertools.islice(handle, 40_000) if line.strip())
            for index, line in enumerate(non_empty):
                if index < 2000 or _needs_exact_path(line, True) or _needs_exact_path(line, False):
                    lines.append(line)
    return lines


@pytest.fixture(scope="module", params=["uncased", "cased"])
def pair(request, corpus_lines):
    """(our tokenizer, the reference, the reference's tokens of corpus_lines) for one casing."""
    ours, legacy = request.getfixturevalue(request.param), request.getfixturevalue("legacy_" + request.param)
    return ours, legacy, [reference_tokens(legacy, line) for line in corpus_lines]


# ------------------------------------------------------------------------------------ parity


def test_corpus_parity(pair, corpus_lines):
    ours, legacy, expected = pair
    exact = [line for line in corpus_lines if _needs_exact_path(line, ours.do_lower_case)]
    assert len(exact) >= 10, "the sample should exercise the exact path too"
    assert ours.tokenize_batch(corpus_lines) == expected
    assert ours.encode_ids_batch(corpus_lines) == [legacy.convert_tokens_to_ids(t) for t in expected]


def test_hostile_strings_parity(pair):
    ours, legacy, _ = pair
    for text in HOSTILE:
        expected = reference_tokens(legacy, text)
        # split_special_tokens: "[MASK]" typed in text is text, as in the original
        assert ours.tokenize(text, split_special_tokens=True) == expected, repr(text)
        assert ours.encode_batch([text])[0]["input_ids"][1:-1] == legacy.convert_tokens_to_ids(expected), repr(text)
    assert ours.tokenize_batch(HOSTILE) == [reference_tokens(legacy, t) for t in HOSTILE]


def test_every_settled_character_on_the_rust_path(pair):
    """Each character below U+30000 inside a word, wherever the router sends it to Rust."""
    ours, legacy, _ = pair
    items = [f"x{chr(cp)}y" for cp in range(0x30000) if not 0xD800 <= cp <= 0xDFFF]
    items = [item for item in items if not _needs_exact_path(item, ours.do_lower_case)]
    assert len(items) > 100_000
    text = " ".join(items)
    assert not _needs_exact_path(text, ours.do_lower_case)
    assert ours.tokenize(text) == reference_tokens(legacy, text)


def test_every_character_on_the_exact_path(pair):
    """The Python path on characters that stress it: every one whose NFC, lower-casing or
    decomposition changes the text, a quarter of those the router sends to this path, every
    40th other one, every 97th unassigned or private-use one, and surrogates."""
    ours, legacy, _ = pair
    chars = []
    for cp in range(0x110000):
        char = chr(cp)
        if 0xD800 <= cp <= 0xDFFF or unicodedata.category(char) in ("Cn", "Co"):
            keep = cp % 97 == 0
        elif len(char.lower()) != 1 or unicodedata.normalize("NFD", char) != char:
            keep = True
        elif unicodedata.normalize("NFC", "A" + char) != "A" + char:
            keep = True
        else:
            keep = cp % 40 == 0 or (cp % 4 == 0 and _needs_exact_path(char, ours.do_lower_case))
        if keep:
            chars.append(char)
    assert len(chars) > 15_000
    text = " ".join(f"A{char}b" for char in chars)
    assert _needs_exact_path(text, ours.do_lower_case)
    assert ours.tokenize(text) == reference_tokens(legacy, text)


def test_whitespace_lies_in_the_bmp():
    # The exact path lists separators from the BMP only.
    assert not any(chr(cp).isspace() for cp in range(0x10000, 0x110000))


def test_hand_computed_examples(uncased):
    assert uncased.tokenize("Don't U.S.A. $3.50 ^x`") == [
        "don", "'", "t", "u", ".", "s", ".", "a", ".", "$", "3", ".", "50", "^", "x", "`",
    ]  # fmt: skip
    assert uncased.tokenize("unaffable") == ["una", "##ffa", "##ble"]
    # The original checks the length of the normalised word: 100 characters pass, 101 do not.
    pieces = uncased.tokenize("a" * 100)
    assert "[UNK]" not in pieces and "".join(p.removeprefix("##") for p in pieces) == "a" * 100
    assert uncased.tokenize("a" * 101) == ["[UNK]"]
    assert uncased.tokenize("e\u0301" * 60) == uncased.tokenize("e" * 60) != ["[UNK]"]
    assert uncased.tokenize("x\x00" * 70) == uncased.tokenize("x" * 70)
    assert uncased.tokenize("É" * 101) == ["[UNK]"]
    assert uncased.tokenize("ΟΔΟΣ") == uncased.tokenize("οδος") != uncased.tokenize("οδοσ")
    # Special-token strings in raw text are ordinary text in the original (tokenize_batch, the
    # path of pre-training data); transformers' tokenize keeps them whole unless told otherwise.
    assert uncased.tokenize_batch(["the [MASK] sat"]) == [["the", "[", "mask", "]", "sat"]]
    assert uncased.tokenize("the [MASK] sat", split_special_tokens=True) == ["the", "[", "mask", "]", "sat"]
    assert uncased.tokenize("the [MASK] sat") == ["the", "[MASK]", "sat"]
    assert uncased.tokenize("") == [] and uncased.tokenize(" \t\u3000\n ") == []


def test_special_ids_and_sizes(uncased):
    # The original release: uncased English BERT ids.
    assert (uncased.pad_token_id, uncased.unk_token_id, uncased.cls_token_id) == (0, 100, 101)
    assert (uncased.sep_token_id, uncased.mask_token_id) == (102, 103)
    assert uncased.vocab_size == len(uncased) == len(uncased.ids_to_tokens) == 30522
    assert uncased.do_lower_case is True
    assert uncased.convert_ids_to_tokens([101, 102]) == ["[CLS]", "[SEP]"]
    assert uncased.convert_ids_to_tokens(103) == "[MASK]"
    assert uncased.convert_tokens_to_ids(["[MASK]", "never-a-token"]) == [103, 100]
    with pytest.raises(BertkitError, match="30522"):
        uncased.convert_ids_to_tokens([30522])


# ------------------------------------------------------------------------------------ encode


def test_pair_encoding_and_truncation_match_the_original(pair, corpus_lines):
    ours, legacy, expected = pair
    texts_a, texts_b = corpus_lines[0:600:2], corpus_lines[1:600:2]
    ids_a = [legacy.convert_tokens_to_ids(tokens) for tokens in expected[0:600:2]]
    ids_b = [legacy.convert_tokens_to_ids(tokens) for tokens in expected[1:600:2]]
    for max_length in (3, 5, 8, 16, 32, 64, 128):
        got = ours.encode_batch(texts_a, texts_b, max_length=max_length, padding=True)
        for a, b, result in zip(ids_a, ids_b, got):
            a, b = list(a), list(b)
            original_truncate_seq_pair(a, b, max_length - 3)
            input_ids = legacy.build_inputs_with_special_tokens(a, b)
            segments = legacy.create_token_type_ids_from_sequences(a, b)
            padding = max_length - len(input_ids)
            assert result["input_ids"] == input_ids + [legacy.pad_token_id] * padding
            assert result["token_type_ids"] == segments + [0] * padding
            assert result["attention_mask"] == [1] * len(input_ids) + [0] * padding
        single = ours.encode_batch(texts_a, max_length=max_length)
        for a, result in zip(ids_a, single):
            assert result["input_ids"] == legacy.build_inputs_with_special_tokens(a[: max_length - 2])
    untruncated = ours.encode_batch([texts_a[0]], [texts_b[0]], max_length=8, truncation=False)[0]
    assert untruncated["input_ids"] == legacy.build_inputs_with_special_tokens(ids_a[0], ids_b[0])


def test_truncated_pair_lengths_equals_the_original_loop():
    for length_a, length_b, budget in itertools.product(range(13), range(13), range(26)):
        a, b = list(range(length_a)), list(range(length_b))
        original_truncate_seq_pair(a, b, budget)
        assert truncated_pair_lengths(length_a, length_b, budget) == (len(a), len(b))


def test_encode_layout_padding_and_arguments(uncased):
    result = uncased.encode_batch(["Hello world"], ["Good bye"], return_offsets=True)[0]
    assert uncased.convert_ids_to_tokens(result["input_ids"]) == [
        "[CLS]", "hello", "world", "[SEP]", "good", "bye", "[SEP]",
    ]  # fmt: skip
    assert result["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert result["attention_mask"] == [1] * 7
    assert result["offsets"] == [(0, 0), (0, 5), (6, 11), (0, 0), (0, 4), (5, 8), (0, 0)]
    assert result["sequence_ids"] == [None, 0, 0, None, 1, 1, None]

    padded = uncased.encode_batch(["Hello"], max_length=6, padding=True, return_offsets=True)[0]
    assert padded["input_ids"] == [101, uncased.vocab["hello"], 102, 0, 0, 0]
    assert padded["attention_mask"] == [1, 1, 1, 0, 0, 0]
    assert padded["offsets"][3:] == [(0, 0)] * 3 and padded["sequence_ids"][3:] == [None] * 3

    batch = uncased.encode_batch(["a", "a b c"], padding="longest")
    assert [len(r["input_ids"]) for r in batch] == [5, 5] and batch[0]["attention_mask"] == [1, 1, 1, 0, 0]
    assert "offsets" not in batch[0]
    with pytest.raises(ValueError):
        uncased.encode_batch(["x"], padding="max_length")
    with pytest.raises(BertkitError, match="max_length=2"):
        uncased.encode_batch(["x"], ["y"], max_length=2)
    with pytest.raises(TypeError):
        uncased.tokenize_batch("not a list")


# ------------------------------------------------------------------------------------ offsets


def _fold_sigma(text: str) -> str:
    return text.replace("ς", "σ")


def test_offsets_map_back_to_the_original_text(pair, corpus_lines):
    ours, legacy, _ = pair
    texts = corpus_lines[:1000] + [t for t in corpus_lines if _needs_exact_path(t, ours.do_lower_case)] + HOSTILE
    results = ours.encode_batch(texts, texts[::-1], return_offsets=True)
    checked = 0
    for text_a, text_b, result in zip(texts, texts[::-1], results):
        tokens = ours.convert_ids_to_tokens(result["input_ids"])
        # Tokens sharing one span (pieces of a single character, e.g. a decomposed Hangul
        # syllable) are checked together against that span.
        groups: list[list] = []
        for token, span, sequence in zip(tokens, result["offsets"], result["sequence_ids"]):
            if sequence is None:
                assert span == (0, 0) and token in SPECIAL_TOKENS
                continue
            source = text_a if sequence == 0 else text_b
            start, end = span
            assert 0 <= start < end <= len(source), (source, token, span)
            if groups and groups[-1][0] == (sequence, span):
                groups[-1][1].append(token)
            else:
                groups.append([(sequence, span), [token]])
        for (sequence, (start, end)), group in groups:
            if "[UNK]" in group:
                continue
            source = text_a if sequence == 0 else text_b
            normalised = "".join(legacy.basic_tokenizer.tokenize(source[start:end]))
            pieces = "".join(token.removeprefix("##") for token in group)
            assert _fold_sigma(pieces) == _fold_sigma(normalised), (source, group, (start, end))
            checked += 1
    assert checked > 30_000


def test_exact_path_offsets_equal_rust_offsets(pair, corpus_lines):
    """On text both paths can take, the Python path reproduces Rust's tokens and offsets."""
    ours, _, _ = pair
    texts = [t for t in corpus_lines[:500] if not _needs_exact_path(t, ours.do_lower_case)]
    texts += [t for t in HOSTILE if not _needs_exact_path(t, ours.do_lower_case)]
    fast = ours.encode_batch(texts, return_offsets=True)
    for text, result in zip(texts, fast):
        exact = _wordpiece(_basic_tokenize(text, ours.do_lower_case), ours.vocab)
        assert exact.ids == result["input_ids"][1:-1], text
        assert exact.offsets == result["offsets"][1:-1], text


# ------------------------------------------------------------------------------------ decode


def test_decode_matches_transformers(pair, corpus_lines):
    ours, legacy, _ = pair
    for text in corpus_lines[:300] + HOSTILE:
        ids = ours.encode_batch([text])[0]["input_ids"]
        for skip in (True, False):
            got = ours.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=True)
            assert got == legacy.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=True), text


def test_decode_joins_pieces(uncased):
    ids = uncased.convert_tokens_to_ids(["[CLS]", "una", "##ffa", "##ble", "fellow", ",", "don", "'", "t", "[SEP]"])
    assert uncased.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True) == "unaffable fellow, don't"
    assert uncased.decode(ids, clean_up_tokenization_spaces=True) == "[CLS] unaffable fellow, don't [SEP]"
    # transformers' defaults: special tokens kept, no clean-up without tokenizer_config.json asking
    assert uncased.decode(ids) == "[CLS] unaffable fellow, don ' t [SEP]"


# ------------------------------------------------------------------------------------ training


@pytest.fixture(scope="module")
def training_files(data_dir, tmp_path_factory):
    """A plain-text and a gzip slice of real corpora, with their blank document separators."""
    folder = tmp_path_factory.mktemp("corpus")
    with gzip.open(data_dir / "corpus" / "nltk2008.txt.gz", "rt", encoding="utf-8") as handle:
        (folder / "books.txt").write_text("".join(itertools.islice(handle, 4_000)), encoding="utf-8")
    with gzip.open(data_dir / "corpus" / "enwiki2015.txt.gz", "rt", encoding="utf-8") as handle:
        with gzip.open(folder / "wiki.txt.gz", "wt", encoding="utf-8") as out:
            out.write("".join(itertools.islice(handle, 4_000)))
    return [folder / "books.txt", folder / "wiki.txt.gz"]


def _lines(path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in itertools.islice(handle, 150) if line.strip()]


@pytest.mark.parametrize("lowercase", [True, False])
def test_train_tokenizer(training_files, tmp_path, lowercase, capfd):
    trained = train_tokenizer(training_files, 1500, tmp_path / "tok", lowercase=lowercase, progress=False)
    assert capfd.readouterr().err == ""  # no progress bars unless asked or on a terminal
    tokens = (tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(tokens) == 1500 == trained.vocab_size and len(set(tokens)) == 1500
    assert tuple(tokens[:5]) == SPECIAL_TOKENS
    assert any(t.startswith("##") for t in tokens)
    assert any(t != t.lower() for t in tokens[5:]) is (not lowercase)
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is lowercase and config["tokenizer_class"] == "BertTokenizer"
    assert config["model_max_length"] == 512 and config["mask_token"] == "[MASK]"
    assert trained.do_lower_case is lowercase and trained.pad_token_id == 0 and trained.mask_token_id == 4

    # The reference tokenizer agrees with ours on the trained vocabulary.
    legacy = BertTokenizerLegacy.from_pretrained(str(tmp_path / "tok"))
    assert legacy.do_lower_case is lowercase
    texts = _lines(training_files[0]) + _lines(training_files[1]) + HOSTILE
    assert trained.tokenize_batch(texts) == [reference_tokens(legacy, t) for t in texts]

    # save_pretrained / from_pretrained round trip.
    trained.save_pretrained(tmp_path / "copy")
    again = BertTokenizer.from_pretrained(tmp_path / "copy")
    assert again.ids_to_tokens == trained.ids_to_tokens and again.do_lower_case is lowercase
    assert again.encode_batch(texts, return_offsets=True) == trained.encode_batch(texts, return_offsets=True)


def test_train_tokenizer_bad_inputs(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("some text here\n\nmore text\n", encoding="utf-8")
    missing = tmp_path / "absent.txt.gz"
    with pytest.raises(BertkitError, match="absent.txt.gz"):
        train_tokenizer([good, missing], 100, tmp_path / "out")
    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"fine line\n\nsecond fine line\n\xff\xfe bad bytes\n")
    with pytest.raises(BertkitError, match=r"broken.txt:4: .*UTF-8"):
        train_tokenizer([broken], 100, tmp_path / "out")
    with pytest.raises(BertkitError, match="vocab_size"):
        train_tokenizer([good], 5, tmp_path / "out")


# ------------------------------------------------------------------------------------ loading


def _write_vocab(tmp_path, tokens, name="vocab.txt"):
    path = tmp_path / name
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


def test_from_pretrained_reads_the_config_next_to_the_vocab(tmp_path, uncased_vocab):
    vocab = _write_vocab(tmp_path, uncased_vocab.read_text(encoding="utf-8").splitlines())
    assert BertTokenizer.from_pretrained(tmp_path).do_lower_case is True  # no config: default
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    assert BertTokenizer.from_pretrained(tmp_path).do_lower_case is False
    assert BertTokenizer.from_pretrained(vocab).do_lower_case is False
    assert BertTokenizer.from_pretrained(vocab, do_lower_case=True).do_lower_case is True
    assert BertTokenizer.from_pretrained(vocab).tokenize("Hello") == ["[UNK]"]  # no cased "Hello"

    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false,\n "x": }')
    with pytest.raises(BertkitError, match=r"tokenizer_config.json:2: invalid JSON"):
        BertTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(BertkitError, match="do_lower_case"):
        BertTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("special", SPECIAL_TOKENS)
def test_vocab_without_a_special_token(tmp_path, special):
    vocab = _write_vocab(tmp_path, [t for t in SPECIAL_TOKENS if t != special] + ["a", "##b"])
    with pytest.raises(BertkitError) as info:
        BertTokenizer(vocab)
    assert str(vocab) in str(info.value) and special in str(info.value)


def test_bad_vocab_files(tmp_path):
    with pytest.raises(BertkitError, match="nowhere/vocab.txt"):
        BertTokenizer(tmp_path / "nowhere" / "vocab.txt")
    with pytest.raises(BertkitError, match="nowhere"):
        BertTokenizer.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(BertkitError, match="no vocab.txt"):
        BertTokenizer.from_pretrained(tmp_path / "emptydir")
    duplicate = _write_vocab(tmp_path, [*SPECIAL_TOKENS, "a", "b", "a"], "dup.txt")
    with pytest.raises(BertkitError, match=r"dup.txt:8: duplicate token 'a' \(first on line 6\)"):
        BertTokenizer(duplicate)
    empty = _write_vocab(tmp_path, [], "empty.txt")
    with pytest.raises(BertkitError, match="empty.txt: vocabulary file is empty"):
        BertTokenizer(empty)
    blank_line = _write_vocab(tmp_path, [*SPECIAL_TOKENS, "", "a"], "blank.txt")
    with pytest.raises(BertkitError, match="blank.txt:6: empty line"):
        BertTokenizer(blank_line)
    not_utf8 = tmp_path / "latin1.txt"
    not_utf8.write_bytes("\n".join([*SPECIAL_TOKENS, "ok", "café"]).encode("latin-1") + b"\n")
    with pytest.raises(BertkitError, match="latin1.txt:7: vocabulary is not valid UTF-8"):
        BertTokenizer(not_utf8)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("\r\n".join([*SPECIAL_TOKENS, "a\u2028b"]).encode() + b"\r\n")
    assert BertTokenizer(crlf).ids_to_tokens == [*SPECIAL_TOKENS, "a\u2028b"]


# ------------------------------------------------------------------------------------ tokenize command


def test_tokenize_stream(uncased, legacy_uncased):
    lines = ["Hello, world!", "", "   ", "Ünïcödé 😀 text", "don't stop", "ΟΔΟΣ", "last line"]
    out = io.StringIO()
    count = tokenize_stream(uncased, io.StringIO("".join(line + "\n" for line in lines)), out, batch_size=2)
    assert count == len(lines)
    expected = [legacy_uncased.convert_tokens_to_ids(reference_tokens(legacy_uncased, line)) for line in lines]
    assert out.getvalue() == "".join(" ".join(map(str, ids)) + "\n" for ids in expected)
    assert out.getvalue().splitlines()[1:3] == ["", ""]

    out = io.StringIO()
    tokenize_stream(uncased, io.BytesIO("Hello, world!\r\nda\n".encode()), out, as_tokens=True)
    assert out.getvalue() == "hello , world !\nda\n"

    bad = io.BytesIO(b"fine\nfine too\n\xc3\x28 broken\n")
    with pytest.raises(BertkitError, match=r":3: not valid UTF-8"):
        tokenize_stream(uncased, bad, io.StringIO())
