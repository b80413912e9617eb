"""The exact path: a pure-Python port of the original release's basic tokenizer and greedy WordPiece
(google-research/bert tokenization.py), tracking each character's span in the input, and the rule that
sends a text here instead of the `tokenizers` fast path (see bertkit.tokenizer)."""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from .vocabulary import MAX_INPUT_CHARS_PER_WORD, UNK


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
    word_ids: list[int] = field(default_factory=list)


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
    for index, word in enumerate(words):
        pieces = _word_pieces(word.text, vocab)
        if pieces is None:
            pieces = [(UNK, 0, len(word.text))]
        for token, start, end in pieces:
            out.ids.append(vocab[token])
            out.tokens.append(token)
            out.offsets.append((word.starts[start], word.ends[end - 1]))
            out.word_ids.append(index)
    return out


# --------------------------------------------------------------------------------------------
# Vocabulary files
# --------------------------------------------------------------------------------------------


