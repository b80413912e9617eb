"""WordPiece tokenization, id for id the original BERT's (Google's tokenization.py).

Two paths produce the same tokens:

* the fast path: a `tokenizers` (Rust) pipeline, BertNormalizer + BertPreTokenizer + WordPiece;
* the exact path: a pure-Python port of the original basic tokenizer and greedy WordPiece.

The Rust library's Unicode tables are older than Python's (Unicode 14 here); it lower-cases
character by character where Python turns a word-final Σ into ς; it lacks the NFC step of
transformers' port (the reference), and its offsets for composed characters drop the combining
mark. A text goes to the Rust path only when every character in it is "settled" (assigned
already in Unicode 3.2 with the same general category as today, so every table in between
agrees on it) and NFC leaves it unchanged. Anything else (new scripts, emoji, unassigned code
points, lone surrogates, "Σ" when lower-casing, decomposed accents) takes the exact path: on
the shared corpora about one line in a thousand. Both paths report character offsets into the
ORIGINAL text. A literal "[MASK]" in the text is split like any other text ("[", "mask", "]"),
as in the original.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import operator
import os
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from bertkit.errors import BertkitError
from bertkit.outputs import atomic_write_text

VOCAB_NAME = "vocab.txt"
CONFIG_NAME = "tokenizer_config.json"
TOKENIZER_JSON_NAME = "tokenizer.json"  # the `tokenizers` file transformers 5 saves alone
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 100
MODEL_MAX_LENGTH = 512
_CAPITAL_SIGMA = "\u03a3"


# --------------------------------------------------------------------------------------------
# Character classes of the original tokenization.py
# --------------------------------------------------------------------------------------------


def _is_whitespace(char: str) -> bool:
    if char in " \t\n\r":
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    # \t \n \r are Cc but the original counts them as whitespace.
    if char in "\t\n\r":
        return False
    return unicodedata.category(char).startswith("C")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    # All non-alphanumeric ASCII counts ("$", "^", "`" are symbols in Unicode, not punctuation).
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _char_class(code_points: Iterable[int]) -> str:
    """A regex character class (without brackets) listing the code points as ranges."""
    ranges: list[list[int]] = []
    for cp in code_points:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


@functools.cache
def _routing_patterns() -> tuple[re.Pattern, re.Pattern]:
    """(any unsettled character, any character the cleaning step drops).

    Settled = assigned in Unicode 3.2 with an unchanged general category; nothing above U+2FFFF
    qualifies except tag and private-use characters, which we simply leave to the exact path.
    The test suite checks every settled character against the reference tokenizer.
    """
    old = unicodedata.ucd_3_2_0
    settled, dropped = [], []
    for cp in range(0x30000):
        char = chr(cp)
        category = unicodedata.category(char)
        if category in ("Cn", "Cs") or old.category(char) != category:
            continue
        settled.append(cp)
        if cp == 0xFFFD or _is_control(char):
            dropped.append(cp)
    return re.compile(f"[^{_char_class(settled)}]"), re.compile(f"[{_char_class(dropped)}]")


def _needs_exact_path(text: str, lowercase: bool) -> bool:
    if text.isascii():
        return False
    # Python lower-cases a word-final Σ to ς; the Rust normaliser maps every Σ to σ.
    if lowercase and _CAPITAL_SIGMA in text:
        return True
    unsettled, dropped = _routing_patterns()
    if unsettled.search(text):
        return True
    # Rust maps a composed character (e + U+0301 -> é) to its first source character only;
    # the exact path gives it the span of both, so offsets keep the accent. Composition
    # happens after the cleaning step, hence the check on the cleaned text.
    if dropped.search(text):
        text = dropped.sub("", text)
    return not unicodedata.is_normalized("NFC", text)


# --------------------------------------------------------------------------------------------
# The exact path: the original basic tokenizer, tracking each character's span in the input
# --------------------------------------------------------------------------------------------

# A normalised piece of text and the [start, end) span of original characters it came from.
_Span = tuple[str, int, int]


def _map_spans(spans: list[_Span], transform) -> list[_Span]:
    """Apply a string transform to a word piece by piece, keeping spans as fine as possible.

    `transform` (NFC, accent stripping) acts on the whole word in the original; applying it per
    piece is right unless it combines characters across pieces, so pieces are merged at every
    boundary where splitting would change the result.
    """
    pieces = [text for text, _, _ in spans]
    whole = "".join(pieces)
    target = transform(whole)
    mapped = [(transform(text), start, end) for text, start, end in spans]
    if "".join(text for text, _, _ in mapped) == target:
        return mapped
    merged: list[list] = [list(spans[0])]
    position = len(pieces[0])
    for text, start, end in spans[1:]:
        if transform(whole[:position]) + transform(whole[position:]) == target:
            merged.append([text, start, end])
        else:
            merged[-1][0] += text
            merged[-1][2] = end
        position += len(text)
    mapped = [(transform(text), start, end) for text, start, end in merged]
    if "".join(text for text, _, _ in mapped) != target:
        return [(target, spans[0][1], spans[-1][2])]
    return mapped


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _strip_accents(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def _lower_spans(spans: list[_Span]) -> list[_Span]:
    # Lower-case the word as a whole (final sigma depends on context); every other mapping is
    # context-free, so each piece's share of the result has the length of its own lower().
    lowered = "".join(text for text, _, _ in spans).lower()
    out, position = [], 0
    for text, start, end in spans:
        size = len(text.lower())
        out.append((lowered[position : position + size], start, end))
        position += size
    return out


@dataclass
class _Word:
    """A basic token: its characters and, per character, the original span."""

    text: str
    starts: list[int]
    ends: list[int]


_punctuation_cache: dict[str, bool] = {}
_CACHE_LIMIT = 1 << 16  # bounds memory when a text runs through many distinct characters


def _is_punctuation_cached(char: str) -> bool:
    result = _punctuation_cache.get(char)
    if result is None:
        result = _is_punctuation(char)
        if len(_punctuation_cache) < _CACHE_LIMIT:
            _punctuation_cache[char] = result
    return result


_IDEOGRAPH_RANGES = (
    "\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b820-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f"
)


@functools.cache
def _word_pattern() -> re.Pattern:
    """A CJK ideograph (group 1), or a run of characters between separators.

    Separators: the original's whitespace (\\t \\n \\r and Zs) plus U+2028/U+2029, which its
    str.split() also splits on; other str.isspace() characters are controls it deletes.
    """
    # All whitespace lies in the Basic Multilingual Plane (the tests check the rest).
    spaces = [chr(cp) for cp in range(0x10000) if chr(cp).isspace() and not _is_control(chr(cp))]
    separators = re.escape("".join(spaces))
    return re.compile(f"([{_IDEOGRAPH_RANGES}])|[^{separators}{_IDEOGRAPH_RANGES}]+")


def _whitespace_words(text: str) -> Iterator[tuple[str, list[int]]]:
    """Clean the text and split it on whitespace: (word, original index of each character)."""
    for match in _word_pattern().finditer(text):
        word, start = match.group(), match.start()
        # Only C* characters are unprintable inside a run: no deletions needed without them.
        if word.isprintable() and "\ufffd" not in word:
            yield word, list(range(start, match.end()))
            continue
        kept = [(char, start + i) for i, char in enumerate(word) if not (char == "\ufffd" or _is_control(char))]
        if kept:
            yield "".join(char for char, _ in kept), [index for _, index in kept]


def _normalize_word(word: str, positions: list[int], lowercase: bool) -> tuple[str, list[int], list[int]]:
    """NFC, then lower-case + strip accents when asked; per output character its span."""
    starts = positions
    ends = [p + 1 for p in positions]
    if unicodedata.is_normalized("NFC", word):
        if not lowercase:
            return word, starts, ends
        lowered = word.lower()
        # Equal lengths mean every character became exactly one: the spans still hold.
        if len(lowered) == len(word) and (lowered.isascii() or _strip_accents(lowered) == lowered):
            return lowered, starts, ends
    # Characters merge, split or vanish: follow them piece by piece.
    spans = _map_spans([(c, s, e) for c, s, e in zip(word, starts, ends)], _nfc)
    if lowercase:
        spans = _map_spans(_lower_spans(spans), _strip_accents)
    text, starts, ends = [], [], []
    for piece, start, end in spans:
        for char in piece:
            text.append(char)
            starts.append(start)
            ends.append(end)
    return "".join(text), starts, ends


def _basic_tokenize(text: str, lowercase: bool) -> list[_Word]:
    """The original BasicTokenizer.tokenize (plus transformers' NFC step), with offsets."""
    words: list[_Word] = []
    for raw_word, positions in _whitespace_words(text):
        word, starts, ends = _normalize_word(raw_word, positions, lowercase)
        if word.isalnum():  # letters and digits only: nothing to split
            words.append(_Word(word, starts, ends))
            continue
        # Split off every punctuation character (and, defensively, any whitespace left).
        begin = 0
        for index, char in enumerate(word):
            if _is_punctuation_cached(char) or char.isspace():
                if begin < index:
                    words.append(_Word(word[begin:index], starts[begin:index], ends[begin:index]))
                if not char.isspace():
                    words.append(_Word(char, [starts[index]], [ends[index]]))
                begin = index + 1
        if begin < len(word):
            words.append(_Word(word[begin:], starts[begin:], ends[begin:]))
    return words


@dataclass
class _Encoded:
    """WordPiece output of one text without specials (duck-types tokenizers.Encoding)."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]


def _word_pieces(word: str, vocab: dict[str, int]) -> list[tuple[str, int, int]] | None:
    """Greedy longest-match-first split of one word, as the original WordpieceTokenizer:
    (piece, start, end) per piece, or None when the word is unknown as a whole."""
    if len(word) > MAX_INPUT_CHARS_PER_WORD:
        return None
    pieces = []
    start = 0
    while start < len(word):
        end = len(word)
        while end > start:
            candidate = word[start:end] if start == 0 else "##" + word[start:end]
            if candidate in vocab:
                break
            end -= 1
        else:
            return None  # no vocabulary piece covers the text at `start`
        pieces.append((candidate, start, end))
        start = end
    return pieces


def _wordpiece(words: list[_Word], vocab: dict[str, int]) -> _Encoded:
    out = _Encoded([], [], [])
    for word in words:
        pieces = _word_pieces(word.text, vocab)
        if pieces is None:
            pieces = [(UNK, 0, len(word.text))]
        for token, start, end in pieces:
            out.ids.append(vocab[token])
            out.tokens.append(token)
            out.offsets.append((word.starts[start], word.ends[end - 1]))
    return out


# --------------------------------------------------------------------------------------------
# Vocabulary files
# --------------------------------------------------------------------------------------------


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read vocab.txt (one token per line, id = line number - 1) and check it."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError("vocabulary file not found", path=path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BertkitError(f"vocabulary is not valid UTF-8 ({err.reason})", path, line) from None
    vocab: dict[str, int] = {}
    # Universal newlines, like transformers' load_vocab (str.splitlines would also split on
    # characters such as U+2028 that a token may contain).
    for line_number, line in enumerate(io.StringIO(text, newline=None), start=1):
        token = line.rstrip("\n")
        if not token:
            raise BertkitError("empty line in vocabulary (one token per line expected)", path, line_number)
        if token in vocab:
            raise BertkitError(f"duplicate token {token!r} (first on line {vocab[token] + 1})", path, line_number)
        vocab[token] = line_number - 1
    if not vocab:
        raise BertkitError("vocabulary file is empty", path=path)
    for special in SPECIAL_TOKENS:
        if special not in vocab:
            raise BertkitError(f"vocabulary lacks the special token {special}", path=path)
    return vocab


def _read_json_object(path: Path) -> dict:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise BertkitError(f"invalid JSON: {err.msg}", path, err.lineno) from None
    except UnicodeDecodeError:
        raise BertkitError("not valid UTF-8", path) from None
    if not isinstance(document, dict):
        raise BertkitError("expected a JSON object", path)
    return document


def _find_bert_normalizer(normalizer) -> dict | None:
    """The BertNormalizer inside a tokenizer.json normaliser (alone or in a Sequence)."""
    if not isinstance(normalizer, dict):
        return None
    if normalizer.get("type") == "BertNormalizer":
        return normalizer
    for inner in normalizer.get("normalizers") or []:
        found = _find_bert_normalizer(inner)
        if found is not None:
            return found
    return None


def _wordpiece_from_tokenizer_json(document: dict, path: Path) -> tuple[dict[str, int], bool]:
    """(vocabulary, lower-case) of a BERT tokenizer.json; anything else is refused with the reason."""
    model = document.get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        kind = model.get("type") if isinstance(model, dict) else None
        raise BertkitError(f"tokenizer.json holds a {kind} model; bertkit reads WordPiece (BERT) only", path)
    if model.get("continuing_subword_prefix", "##") != "##":
        raise BertkitError("WordPiece continuing_subword_prefix must be '##'", path)
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise BertkitError("tokenizer.json has no WordPiece vocabulary", path)
    ordered = sorted(vocab, key=vocab.get)
    if [vocab[token] for token in ordered] != list(range(len(ordered))):
        raise BertkitError("tokenizer.json vocabulary ids are not 0..N-1 without gaps", path)
    for special in SPECIAL_TOKENS:
        if special not in vocab:
            raise BertkitError(f"vocabulary lacks the special token {special}", path)
    normalizer = _find_bert_normalizer(document.get("normalizer"))
    if normalizer is None:
        raise BertkitError("tokenizer.json has no BertNormalizer; bertkit reads BERT tokenizers only", path)
    lowercase = bool(normalizer.get("lowercase", True))
    strip_accents = normalizer.get("strip_accents")
    if strip_accents is not None and strip_accents != lowercase:
        raise BertkitError(f"strip_accents={strip_accents} with lowercase={lowercase} is not supported", path)
    if normalizer.get("handle_chinese_chars", True) is not True:
        raise BertkitError("handle_chinese_chars=false is not supported", path)
    return {token: vocab[token] for token in ordered}, lowercase


def _read_config(path: Path) -> dict:
    config = _read_json_object(path)
    lowercase = config.get("do_lower_case", True)
    if not isinstance(lowercase, bool):
        raise BertkitError(f"do_lower_case must be true or false, got {lowercase!r}", path)
    # Options of transformers' BertTokenizer this implementation does not offer: refuse rather
    # than tokenize differently from the model's training.
    strip_accents = config.get("strip_accents")
    if strip_accents is not None and strip_accents != lowercase:
        raise BertkitError(f"strip_accents={strip_accents} with do_lower_case={lowercase} is not supported", path)
    if config.get("tokenize_chinese_chars", True) is not True:
        raise BertkitError("tokenize_chinese_chars=false is not supported", path)
    return config


def _tokenizer_config(lowercase: bool) -> dict:
    return {
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "tokenizer_class": "BertTokenizer",
        "model_max_length": MODEL_MAX_LENGTH,
        "unk_token": UNK,
        "sep_token": SEP,
        "pad_token": PAD,
        "cls_token": CLS,
        "mask_token": MASK,
    }


def _rust_normalizer(lowercase: bool):
    # transformers' port applies NFC before splitting; no need here, as text that NFC would
    # change never takes the Rust path (see _needs_exact_path).
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )


def _build_rust_tokenizer(vocab: dict[str, int] | None, lowercase: bool) -> Tokenizer:
    if vocab is None:
        model = models.WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    else:
        model = models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = _rust_normalizer(lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


def truncated_pair_lengths(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths left by the original `_truncate_seq_pair` (pop from the longer; B on ties)."""
    excess = length_a + length_b - budget
    if excess <= 0:
        return length_a, length_b
    if length_a > length_b:
        cut = min(excess, length_a - length_b)
        length_a -= cut
        excess -= cut
    elif length_b > length_a:
        cut = min(excess, length_b - length_a)
        length_b -= cut
        excess -= cut
    # Equal lengths now: B loses first, then they alternate.
    length_b -= (excess + 1) // 2
    length_a -= excess // 2
    return length_a, length_b


def _clean_up_tokenization(text: str) -> str:
    # transformers' decode clean-up, so decode matches BertTokenizer.decode.
    for before, after in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
        (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    ):  # fmt: skip
        text = text.replace(before, after)
    return text


class BatchEncoding(dict):
    """The tokenizer call's result: a plain dict (`model(**encoding)`) that can move its tensors."""

    def to(self, device) -> "BatchEncoding":
        return BatchEncoding({k: v.to(device) if hasattr(v, "to") else v for k, v in self.items()})


def _as_tensor(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


# --------------------------------------------------------------------------------------------
# The tokenizer
# --------------------------------------------------------------------------------------------


class BertTokenizer:
    """BERT's WordPiece tokenizer: `[CLS] A [SEP] (B [SEP])` with segment ids and offsets."""

    def __init__(self, vocab_file: str | os.PathLike, do_lower_case: bool = True, vocab: dict[str, int] | None = None):
        """`vocab`, when given, is the vocabulary already read from `vocab_file` (a tokenizer.json)."""
        self.vocab_file = Path(vocab_file)
        self.vocab: dict[str, int] = load_vocab(self.vocab_file) if vocab is None else vocab
        self.ids_to_tokens: list[str] = list(self.vocab)  # load_vocab assigns ids in file order
        self.do_lower_case = bool(do_lower_case)
        self.pad_token_id = self.vocab[PAD]
        self.unk_token_id = self.vocab[UNK]
        self.cls_token_id = self.vocab[CLS]
        self.sep_token_id = self.vocab[SEP]
        self.mask_token_id = self.vocab[MASK]
        self.all_special_ids = [self.vocab[token] for token in SPECIAL_TOKENS]
        self._backend = _build_rust_tokenizer(self.vocab, self.do_lower_case)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, do_lower_case: bool | None = None) -> "BertTokenizer":
        """Load a directory holding vocab.txt (+ tokenizer_config.json) or a vocab.txt path.

        `do_lower_case` given here overrides the config; without either it defaults to True.
        """
        path = Path(path)
        if path.is_dir():
            vocab_file = path / VOCAB_NAME
            if not vocab_file.is_file():
                if (path / TOKENIZER_JSON_NAME).is_file():
                    return cls.from_tokenizer_json(path / TOKENIZER_JSON_NAME, do_lower_case)
                raise BertkitError(f"no {VOCAB_NAME} or {TOKENIZER_JSON_NAME} in the tokenizer directory", path=path)
        elif path.is_file() and path.name == TOKENIZER_JSON_NAME:
            return cls.from_tokenizer_json(path, do_lower_case)
        elif path.is_file():
            vocab_file = path
        else:
            raise BertkitError("tokenizer path not found (expected a directory or a vocab.txt)", path=path)
        config_file = vocab_file.parent / CONFIG_NAME
        if do_lower_case is None:
            do_lower_case = _read_config(config_file)["do_lower_case"] if config_file.is_file() else True
        return cls(vocab_file, do_lower_case=do_lower_case)

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike, do_lower_case: bool | None = None) -> "BertTokenizer":
        """Load a `tokenizers` tokenizer.json holding a BERT WordPiece model: its vocabulary and its
        normaliser's lower-casing (the rest of a BERT pipeline is fixed, and checked)."""
        path = Path(path)
        document = _read_json_object(path)
        vocab, lowercase = _wordpiece_from_tokenizer_json(document, path)
        return cls(path, do_lower_case=lowercase if do_lower_case is None else do_lower_case, vocab=vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"BertTokenizer({str(self.vocab_file)!r}, vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case})"

    # ---- WordPiece without special tokens ----

    def _encode_texts(self, texts: Sequence[str]) -> list:
        """Per text: ids, tokens and offsets (tokenizers.Encoding or _Encoded), no specials."""
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, got a single string")
        results: list = [None] * len(texts)
        fast_positions = []
        for position, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {position} is {type(text).__name__}, not str")
            if _needs_exact_path(text, self.do_lower_case):
                results[position] = _wordpiece(_basic_tokenize(text, self.do_lower_case), self.vocab)
            else:
                fast_positions.append(position)
        if fast_positions:
            encodings = self._backend.encode_batch([texts[p] for p in fast_positions], add_special_tokens=False)
            for position, encoding in zip(fast_positions, encodings):
                results[position] = encoding
        return results

    def tokenize(self, text: str) -> list[str]:
        return self._encode_texts([text])[0].tokens

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
        return [encoded.tokens for encoded in self._encode_texts(texts)]

    def encode_ids_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """WordPiece ids without special tokens: the fast path for corpora."""
        return [encoded.ids for encoded in self._encode_texts(texts)]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(token, self.unk_token_id) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        try:  # one id: int, numpy integer or 0-d tensor
            return self._id_to_token(operator.index(ids))
        except TypeError:
            return [self._id_to_token(int(i)) for i in ids]

    def _id_to_token(self, token_id: int) -> str:
        if not 0 <= token_id < len(self.ids_to_tokens):
            raise BertkitError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        return self.ids_to_tokens[token_id]

    # ---- model inputs ----

    def encode(
        self,
        text: str,
        text_pair: str | None = None,
        max_length: int | None = None,
        truncation: bool = True,
        padding: bool | str = False,
        return_offsets: bool = False,
    ) -> dict:
        """`[CLS] text [SEP] (text_pair [SEP])` as input_ids / token_type_ids / attention_mask.

        Truncation (when max_length is given) follows the original: a single text loses tokens
        from its end; a pair loses them from the end of the longer side, B when equal.
        padding=True or "max_length" pads to max_length. With return_offsets: `offsets`, the
        (start, end) character span of each token in its own original text ((0, 0) for
        specials and padding), and `sequence_ids` (None for specials and padding, else 0 or 1).
        """
        pairs = None if text_pair is None else [text_pair]
        return self.encode_batch([text], pairs, max_length, truncation, padding, return_offsets)[0]

    def encode_batch(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        truncation: bool = True,
        padding: bool | str = False,
        return_offsets: bool = False,
    ) -> list[dict]:
        """`encode` for many texts at once through the Rust batch path.

        padding: False; "max_length" (needs max_length); "longest" (longest in the batch);
        True means "max_length" when max_length is given, else "longest".
        """
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text pairs")
        if padding is True:
            padding = "max_length" if max_length is not None else "longest"
        if padding not in (False, "max_length", "longest"):
            raise ValueError(f"padding must be False, True, 'max_length' or 'longest', not {padding!r}")
        if padding == "max_length" and max_length is None:
            raise ValueError("padding to max_length needs max_length")
        specials = 2 if text_pairs is None else 3
        if max_length is not None and truncation and max_length < specials:
            raise BertkitError(f"max_length={max_length} leaves no room for the {specials} special tokens")

        first = self._encode_texts(texts)
        second = self._encode_texts(text_pairs) if text_pairs is not None else [None] * len(texts)
        results = [
            self._assemble(a, b, max_length if truncation else None, return_offsets)
            for a, b in zip(first, second)
        ]
        if padding:
            target = max_length if padding == "max_length" else max((len(r["input_ids"]) for r in results), default=0)
            for result in results:
                self._pad(result, target)
        return results

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_offsets_mapping: bool = False,
        return_token_type_ids: bool = True,
        return_attention_mask: bool = True,
    ) -> "BatchEncoding":
        """The call transformers users write: `tokenizer(texts, text_pair, padding=True,
        truncation=True, max_length=128, return_tensors="pt")` -> a dict of lists or tensors.

        A single string gives flat lists (tensors of shape (1, T)); a list gives one row per text.
        truncation=True (or "longest_first") cuts to max_length, by default the model's 512
        positions; padding=True / "longest" pads to the longest row, "max_length" to max_length.
        """
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        pairs = None
        if text_pair is not None:
            if isinstance(text_pair, str) != single:
                raise ValueError("text and text_pair must both be strings or both be lists")
            pairs = [text_pair] if single else list(text_pair)
        if truncation in (None, False, "do_not_truncate"):
            truncate = False
        elif truncation in (True, "longest_first"):
            truncate = True
        else:
            raise ValueError(f"truncation must be True, False or 'longest_first', not {truncation!r}")
        if padding in ("do_not_pad", None):
            padding = False
        if truncate and max_length is None:
            max_length = MODEL_MAX_LENGTH
        rows = self.encode_batch(texts, pairs, max_length, truncate, padding, return_offsets_mapping)
        keys = ["input_ids"]
        if return_token_type_ids:
            keys.append("token_type_ids")
        if return_attention_mask:
            keys.append("attention_mask")
        columns = {key: [row[key] for row in rows] for key in keys}
        if return_offsets_mapping:
            columns["offset_mapping"] = [[tuple(span) for span in row["offsets"]] for row in rows]
        if return_tensors is not None:
            if return_tensors != "pt":
                raise ValueError(f"return_tensors must be 'pt' or None, not {return_tensors!r}")
            lengths = {len(row) for row in columns["input_ids"]}
            if len(lengths) > 1:
                raise ValueError("rows of different lengths cannot become one tensor: pass padding=True")
            return BatchEncoding({key: _as_tensor(value) for key, value in columns.items()})
        if single:
            columns = {key: value[0] for key, value in columns.items()}
        return BatchEncoding(columns)

    def _assemble(self, a, b, max_length: int | None, return_offsets: bool) -> dict:
        length_a, length_b = len(a.ids), 0 if b is None else len(b.ids)
        if max_length is not None:
            if b is None:
                length_a = min(length_a, max_length - 2)
            else:
                length_a, length_b = truncated_pair_lengths(length_a, length_b, max_length - 3)
        input_ids = [self.cls_token_id, *a.ids[:length_a], self.sep_token_id]
        token_type_ids = [0] * (length_a + 2)
        if b is not None:
            input_ids += [*b.ids[:length_b], self.sep_token_id]
            token_type_ids += [1] * (length_b + 1)
        result = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": [1] * len(input_ids)}
        if return_offsets:
            offsets = [(0, 0), *a.offsets[:length_a], (0, 0)]
            sequence_ids = [None, *[0] * length_a, None]
            if b is not None:
                offsets += [*b.offsets[:length_b], (0, 0)]
                sequence_ids += [*[1] * length_b, None]
            result["offsets"] = [tuple(span) for span in offsets]
            result["sequence_ids"] = sequence_ids
        return result

    def _pad(self, result: dict, target: int) -> None:
        missing = target - len(result["input_ids"])
        if missing <= 0:
            return
        result["input_ids"] += [self.pad_token_id] * missing
        result["token_type_ids"] += [0] * missing
        result["attention_mask"] += [0] * missing
        if "offsets" in result:
            result["offsets"] += [(0, 0)] * missing
            result["sequence_ids"] += [None] * missing

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = True) -> str:
        """Join the pieces back into text ("##" continuations glued on), as transformers does."""
        tokens = self.convert_ids_to_tokens([int(i) for i in ids])
        if skip_special_tokens:
            tokens = [token for token in tokens if token not in SPECIAL_TOKENS]
        return self.convert_tokens_to_string(tokens, clean_up_tokenization_spaces)

    def convert_tokens_to_string(self, tokens: Sequence[str], clean_up_tokenization_spaces: bool = True) -> str:
        """Word pieces back to text: "##" continuations glued on, spaces before punctuation removed."""
        text = " ".join(tokens).replace(" ##", "").strip()
        return _clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    def save_pretrained(self, directory: str | os.PathLike) -> tuple[str, str]:
        """Write vocab.txt and tokenizer_config.json (readable by transformers too)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab_path = directory / VOCAB_NAME
        config_path = directory / CONFIG_NAME
        atomic_write_text(vocab_path, "".join(token + "\n" for token in self.ids_to_tokens))
        atomic_write_text(config_path, json.dumps(_tokenizer_config(self.do_lower_case), indent=2) + "\n")
        return str(vocab_path), str(config_path)


# --------------------------------------------------------------------------------------------
# Training a vocabulary, and the `tokenize` command
# --------------------------------------------------------------------------------------------


def _open_binary(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        is_gzip = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if is_gzip else open(path, "rb")


def _corpus_lines(files: list[Path], lowercase: bool) -> Iterator[str]:
    """Non-empty lines of BERT-format corpus files (plain or gzip), streamed."""
    for path in files:
        try:
            with _open_binary(path) as handle:
                # Decoded line by line so that an error can name its line.
                for line_number, raw in enumerate(handle, start=1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        raise BertkitError(f"not valid UTF-8 ({err.reason})", path, line_number) from None
                    if not line.strip():
                        continue
                    if _needs_exact_path(line, lowercase):
                        # Count what the tokenizer will see: the original's words for this line.
                        yield " ".join(word.text for word in _basic_tokenize(line, lowercase))
                    else:
                        yield line
        except (gzip.BadGzipFile, EOFError, OSError) as err:
            raise BertkitError(f"cannot read corpus file: {err}", path) from None


def train_tokenizer(
    files: Sequence[str | os.PathLike] | str | os.PathLike,
    vocab_size: int,
    output_dir: str | os.PathLike,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    progress: bool | None = None,
) -> BertTokenizer:
    """Train a WordPiece vocabulary on corpus files; write vocab.txt + tokenizer_config.json.

    The five special tokens get ids 0-4 ([PAD] [UNK] [CLS] [SEP] [MASK]). `progress` defaults
    to showing the `tokenizers` progress bars only when stderr is a terminal. The vocabulary
    can come out smaller than vocab_size when the corpus is too small to fill it.
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [Path(f) for f in files]
    if not paths:
        raise BertkitError("no input files given for tokenizer training")
    for path in paths:
        if not path.is_file():
            raise BertkitError("input file not found", path=path)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise BertkitError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if min_frequency < 1:
        raise BertkitError(f"min_frequency must be at least 1, got {min_frequency}")
    show_progress = sys.stderr.isatty() if progress is None else bool(progress)

    backend = _build_rust_tokenizer(None, lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
    )
    backend.train_from_iterator(_corpus_lines(paths, lowercase), trainer=trainer)
    trained = backend.get_vocab()
    tokens = sorted(trained, key=trained.get)
    if [trained[t] for t in tokens] != list(range(len(tokens))) or tuple(tokens[:5]) != SPECIAL_TOKENS:
        raise RuntimeError("tokenizers returned a vocabulary without contiguous ids or leading specials")
    if len(tokens) == len(SPECIAL_TOKENS):
        raise BertkitError("the corpus files contain no text to train on", path=paths[0])

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / VOCAB_NAME, "".join(t + "\n" for t in tokens))
    atomic_write_text(output_dir / CONFIG_NAME, json.dumps(_tokenizer_config(lowercase), indent=2) + "\n")
    return BertTokenizer.from_pretrained(output_dir)


def tokenize_stream(
    tokenizer: BertTokenizer,
    in_stream: IO,
    out_stream: IO[str],
    as_tokens: bool = False,
    batch_size: int = 1000,
) -> int:
    """One output line per input line: space-separated ids (or tokens), no [CLS]/[SEP].

    `in_stream` yields str or UTF-8 bytes lines (e.g. sys.stdin.buffer); work is done in
    batches of `batch_size` lines, written as each batch finishes. Returns the line count.
    """
    batch: list[str] = []
    count = 0

    def flush() -> None:
        rows = tokenizer.tokenize_batch(batch) if as_tokens else tokenizer.encode_ids_batch(batch)
        out_stream.write("".join(" ".join(map(str, row)) + "\n" for row in rows))
        out_stream.flush()
        batch.clear()

    for line in in_stream:
        count += 1
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as err:
                name = getattr(in_stream, "name", "<input>")
                raise BertkitError(f"not valid UTF-8 ({err.reason})", str(name), count) from None
        batch.append(line.rstrip("\r\n"))
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    return count
