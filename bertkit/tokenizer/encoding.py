"""One tokenized input as transformers' fast tokenizers return it, and the rules that shape it.

`Encoding` mirrors `tokenizers.Encoding` (ids, type ids, tokens, offsets, word and sequence ids,
masks, overflowing windows). The functions below follow the `tokenizers` library's own rules
(tokenizers/src/utils/truncation.rs, tokenizer/encoding.rs, utils/padding.rs), so that
`BertTokenizer.__call__` answers as `BertTokenizerFast` does on every text, including the ones
bertkit tokenizes on its exact (pure-Python) path: truncation strategies, stride windows and
the order in which the windows of a pair are combined, special tokens, padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

LONGEST_FIRST, ONLY_FIRST, ONLY_SECOND = "longest_first", "only_first", "only_second"


class CharSpan(NamedTuple):
    start: int
    end: int


class TokenSpan(NamedTuple):
    start: int
    end: int


@dataclass
class Encoding:
    """The tokens of one model input (or of one sequence before the special tokens are added)."""

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int]
    attention_mask: list[int]
    overflowing: list["Encoding"] = field(default_factory=list)
    # How many sequences the template placed (1 or 2): asking about another one means, as in
    # the library, the whole encoding.
    placed_sequences: int = 1

    @classmethod
    def sequence(cls, ids, tokens, offsets, word_ids) -> "Encoding":
        """The pieces of one text, not yet placed in a template (sequence 0, type 0)."""
        n = len(ids)
        return cls(list(ids), [0] * n, list(tokens), [tuple(o) for o in offsets], list(word_ids), [0] * n, [0] * n,
                   [1] * n)

    @classmethod
    def special(cls, token_id: int, token: str, type_id: int) -> "Encoding":
        return cls([token_id], [type_id], [token], [(0, 0)], [None], [None], [1], [1])

    def __len__(self) -> int:
        return len(self.ids)

    def _slice(self, start: int, stop: int) -> "Encoding":
        return Encoding(*(getattr(self, name)[start:stop] for name in _TOKEN_FIELDS))

    def placed(self, sequence_id: int, type_id: int) -> "Encoding":
        """This sequence (and its windows) as sequence `sequence_id` with segment `type_id`."""
        n = len(self)
        return replace(self, type_ids=[type_id] * n, sequence_ids=[sequence_id] * n,
                       overflowing=[o.placed(sequence_id, type_id) for o in self.overflowing])

    def truncated(self, max_len: int, stride: int, side: str) -> "Encoding":
        """The first window of `max_len` tokens; the rest, overlapping by `stride`, as overflowing."""
        length = len(self)
        if max_len >= length:
            return self
        if max_len == 0:
            return Encoding([], [], [], [], [], [], [], [], overflowing=[replace(self, overflowing=[])])
        if stride >= max_len:
            raise ValueError(f"stride ({stride}) must be smaller than the room left for each sequence ({max_len})")
        step = max_len - stride
        ranges = []
        if side == "right":
            for start in range(0, length, step):
                ranges.append((start, min(start + max_len, length)))
                if ranges[-1][1] == length:
                    break
        else:
            for stop in range(length, 0, -step):
                ranges.append((max(stop - max_len, 0), stop))
                if ranges[-1][0] == 0:
                    break
        first, *rest = (self._slice(a, b) for a, b in ranges)
        first.overflowing = rest
        return first

    def merged(self, other: "Encoding") -> "Encoding":
        """`self` followed by `other`, windows combined as `Encoding::merge_with` combines them:
        each of our windows with the other's main part and each of its windows, then our main
        part with each of the other's windows."""
        # Windows of windows, which the library nests but never returns, are left out.
        main_self, main_other = replace(self, overflowing=[]), replace(other, overflowing=[])
        overflowing = []
        for mine in self.overflowing:
            overflowing.append(mine.merged(main_other))
            overflowing.extend(mine.merged(theirs) for theirs in other.overflowing)
        overflowing.extend(main_self.merged(theirs) for theirs in other.overflowing)
        joined = Encoding(*(getattr(self, name) + getattr(other, name) for name in _TOKEN_FIELDS))
        joined.overflowing = overflowing
        return joined

    def padded(self, target: int, pad_id: int, pad_token: str, side: str) -> "Encoding":
        missing = target - len(self)
        overflowing = [o.padded(target, pad_id, pad_token, side) for o in self.overflowing]
        if missing <= 0:
            return replace(self, overflowing=overflowing)
        fill = {"ids": pad_id, "type_ids": 0, "tokens": pad_token, "offsets": (0, 0), "word_ids": None,
                "sequence_ids": None, "special_tokens_mask": 1, "attention_mask": 0}
        columns = {}
        for name in _TOKEN_FIELDS:
            pad = [fill[name]] * missing
            columns[name] = pad + getattr(self, name) if side == "left" else getattr(self, name) + pad
        return replace(self, **columns, overflowing=overflowing)

    # ---- alignment, as tokenizers.Encoding answers it ----

    @property
    def n_sequences(self) -> int:
        return self.placed_sequences

    def _sequence_range(self, sequence: int) -> range:
        if not 0 <= sequence < self.placed_sequences:
            return range(len(self))
        positions = [i for i, s in enumerate(self.sequence_ids) if s == sequence]
        return range(positions[0], positions[-1] + 1) if positions else range(0)

    def token_to_sequence(self, token: int) -> int | None:
        return self.sequence_ids[token] if 0 <= token < len(self) else None

    def token_to_word(self, token: int) -> tuple[int, int] | None:
        if not 0 <= token < len(self) or self.sequence_ids[token] is None or self.word_ids[token] is None:
            return None
        return self.sequence_ids[token], self.word_ids[token]

    def token_to_chars(self, token: int) -> tuple[int, tuple[int, int]] | None:
        if not 0 <= token < len(self) or self.sequence_ids[token] is None:
            return None
        return self.sequence_ids[token], self.offsets[token]

    def word_to_tokens(self, word: int, sequence: int = 0) -> tuple[int, int] | None:
        found = [i for i in self._sequence_range(sequence) if self.word_ids[i] == word]
        return (found[0], found[-1] + 1) if found else None

    def word_to_chars(self, word: int, sequence: int = 0) -> tuple[int, int] | None:
        tokens = self.word_to_tokens(word, sequence)
        if tokens is None:
            return None
        return self.offsets[tokens[0]][0], self.offsets[tokens[1] - 1][1]

    def char_to_token(self, position: int, sequence: int = 0) -> int | None:
        for i in self._sequence_range(sequence):
            start, end = self.offsets[i]
            if start <= position < end:
                return i
        return None

    def char_to_word(self, position: int, sequence: int = 0) -> int | None:
        token = self.char_to_token(position, sequence)
        found = None if token is None else self.token_to_word(token)
        return None if found is None else found[1]


_TOKEN_FIELDS = ("ids", "type_ids", "tokens", "offsets", "word_ids", "sequence_ids", "special_tokens_mask",
                 "attention_mask")


def truncate_pair(first: Encoding, second: Encoding | None, max_length: int, strategy: str, stride: int,
                  side: str) -> tuple[Encoding, Encoding | None]:
    """`truncate_encodings` of the `tokenizers` library: `max_length` is the room left for the
    texts' own tokens (negative: no truncation, as the library's unsigned subtraction wraps).
    Pairs under "longest_first" keep the shorter side whole when it fits in half, else both get
    half (the second the odd token): unlike the original BERT's `_truncate_seq_pair`, which
    removes from B first on ties."""
    if max_length < 0:
        return first, second
    if max_length == 0:
        return first.truncated(0, stride, side), None if second is None else second.truncated(0, stride, side)
    total = len(first) + (0 if second is None else len(second))
    if total <= max_length:
        return first, second
    if strategy == LONGEST_FIRST:
        if second is None:
            return first.truncated(max_length, stride, side), None
        n1, n2 = len(first), len(second)
        swap = n1 > n2
        if swap:
            n1, n2 = n2, n1
        n2 = n1 if n1 > max_length else max(n1, max_length - n1)
        if n1 + n2 > max_length:
            n1 = max_length // 2
            n2 = n1 + max_length % 2
        if swap:
            n1, n2 = n2, n1
        return first.truncated(n1, stride, side), second.truncated(n2, stride, side)
    if strategy == ONLY_SECOND and second is None:
        raise ValueError("Truncation error: Second sequence not provided (truncation='only_second' needs a text pair)")
    target = first if strategy == ONLY_FIRST else second
    remove = total - max_length
    if len(target) <= remove:
        raise ValueError(
            f"Truncation error: Sequence to truncate too short to respect the provided max_length "
            f"({strategy}: the sequence has {len(target)} tokens, {remove} must go)"
        )
    cut = target.truncated(len(target) - remove, stride, side)
    return (cut, second) if strategy == ONLY_FIRST else (first, cut)


def padding_target(lengths: list[int], fixed: int | None, multiple: int | None) -> int:
    """The padded length: `fixed` (padding="max_length") or the longest, rounded up to `multiple`."""
    target = fixed if fixed is not None else max(lengths, default=0)
    if multiple and target % multiple:
        target += multiple - target % multiple
    return target
