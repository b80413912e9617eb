"""BatchEncoding: what `tokenizer(...)` returns, answering as transformers' BatchEncoding does.

A dict (so `model(**batch)` works) of lists, numpy arrays or tensors, which also keeps one
`Encoding` per row for the alignment questions token-classification and QA code asks:
`word_ids()`, `sequence_ids()`, `tokens()`, `token_to_word`, `word_to_tokens`, `char_to_token`,
`token_to_chars`, `word_to_chars`, `char_to_word`, `token_to_sequence`.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from bertkit.tokenizer.encoding import CharSpan, Encoding, TokenSpan

TENSOR_TYPES = ("pt", "np")


def as_tensor(value: Any, kind: str):
    """A batch column as a torch tensor ("pt") or numpy array ("np"), as transformers converts
    it: empty columns are int64; ragged rows are refused for "pt" and become an object array of
    rows for "np"."""
    if kind not in TENSOR_TYPES:
        raise ValueError(f"return_tensors must be 'pt', 'np' or None, not {kind!r}")
    if isinstance(value, torch.Tensor):
        return value.numpy() if kind == "np" else value
    if isinstance(value, numpy.ndarray):
        return value if kind == "np" else torch.from_numpy(value)
    rows = value if isinstance(value, (list, tuple)) and value else None
    if rows is not None and isinstance(rows[0], (list, tuple, numpy.ndarray)) and len({len(r) for r in rows}) > 1:
        if kind == "np":
            ragged = numpy.empty(len(rows), dtype=object)
            ragged[:] = [numpy.asarray(row) for row in rows]
            return ragged
        raise ValueError(_RAGGED)
    try:
        array = numpy.asarray(value)
    except ValueError:
        raise ValueError(_RAGGED) from None
    if array.dtype == object:
        raise ValueError(_RAGGED)
    if array.size == 0:
        array = array.astype(numpy.int64)
    return array if kind == "np" else torch.from_numpy(array)


_RAGGED = ("Unable to create tensor: rows of different lengths; activate truncation and/or padding with "
           "padding=True truncation=True to have batched tensors with the same length")


class BatchEncoding(dict):
    """The tokenizer call's result: a plain dict of columns plus the rows' `Encoding`s."""

    def __init__(self, data: dict | None = None, encodings: list[Encoding] | None = None,
                 tensor_type: str | None = None):
        super().__init__(data or {})
        self._encodings = encodings
        if tensor_type is not None:
            self.convert_to_tensors(tensor_type)

    # ---- dict access, as transformers' BatchEncoding ----

    def __getitem__(self, item):
        if isinstance(item, str):
            return super().__getitem__(item)
        if isinstance(item, int):
            if self._encodings is None:
                raise KeyError("indexing by row needs the encodings of a tokenizer call")
            return self._encodings[item]
        if isinstance(item, slice):
            return {key: value[item] for key, value in self.items()}
        raise KeyError(f"invalid key {item!r}: expected a column name, a row index or a slice")

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getstate__(self):
        return {"data": dict(self), "encodings": self._encodings}

    def __setstate__(self, state):
        self.update(state["data"])
        self._encodings = state["encodings"]

    @property
    def encodings(self) -> list[Encoding] | None:
        return self._encodings

    @property
    def is_fast(self) -> bool:
        return self._encodings is not None

    @property
    def n_sequences(self) -> int | None:
        return self._encodings[0].n_sequences if self._encodings else None

    def convert_to_tensors(self, tensor_type: str | None = None) -> "BatchEncoding":
        if tensor_type is None:
            return self
        for key, value in list(self.items()):
            self[key] = as_tensor(value, tensor_type)
        return self

    def to(self, device) -> "BatchEncoding":
        moved = BatchEncoding({k: v.to(device) if hasattr(v, "to") else v for k, v in self.items()}, self._encodings)
        return moved

    # ---- alignment ----

    def _row(self, batch_index: int) -> Encoding:
        if not self._encodings:
            raise ValueError("alignment methods need the encodings of a tokenizer call")
        return self._encodings[batch_index]

    def _split(self, batch_or_index: int, index: int | None) -> tuple[int, int]:
        return (0, batch_or_index) if index is None else (batch_or_index, index)

    def _seq_len(self, batch_index: int) -> int:
        return len(self._row(batch_index))

    def tokens(self, batch_index: int = 0) -> list[str]:
        return self._row(batch_index).tokens

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._row(batch_index).word_ids

    def words(self, batch_index: int = 0) -> list[int | None]:
        return self.word_ids(batch_index)

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._row(batch_index).sequence_ids

    def token_to_sequence(self, batch_or_token_index: int, token_index: int | None = None) -> int | None:
        batch, token = self._split(batch_or_token_index, token_index)
        if token < 0:
            token += self._seq_len(batch)
        return self._row(batch).token_to_sequence(token)

    def token_to_word(self, batch_or_token_index: int, token_index: int | None = None) -> int | None:
        batch, token = self._split(batch_or_token_index, token_index)
        if token < 0:
            token += self._seq_len(batch)
        found = self._row(batch).token_to_word(token)
        return None if found is None else found[1]

    def word_to_tokens(self, batch_or_word_index: int, word_index: int | None = None,
                       sequence_index: int = 0) -> TokenSpan | None:
        batch, word = self._split(batch_or_word_index, word_index)
        if word < 0:
            word += self._seq_len(batch)
        span = self._row(batch).word_to_tokens(word, sequence_index)
        return None if span is None else TokenSpan(*span)

    def token_to_chars(self, batch_or_token_index: int, token_index: int | None = None) -> CharSpan | None:
        batch, token = self._split(batch_or_token_index, token_index)
        found = self._row(batch).token_to_chars(token)
        return None if found is None else CharSpan(*found[1])

    def char_to_token(self, batch_or_char_index: int, char_index: int | None = None,
                      sequence_index: int = 0) -> int | None:
        batch, char = self._split(batch_or_char_index, char_index)
        return self._row(batch).char_to_token(char, sequence_index)

    def word_to_chars(self, batch_or_word_index: int, word_index: int | None = None,
                      sequence_index: int = 0) -> CharSpan | None:
        batch, word = self._split(batch_or_word_index, word_index)
        span = self._row(batch).word_to_chars(word, sequence_index)
        return None if span is None else CharSpan(*span)

    def char_to_word(self, batch_or_char_index: int, char_index: int | None = None,
                     sequence_index: int = 0) -> int | None:
        batch, char = self._split(batch_or_char_index, char_index)
        return self._row(batch).char_to_word(char, sequence_index)
