"""Sentence-pair instances for MLM + NSP, built exactly as the original create_pretraining_data.py.

The procedure (paper §3.1, appendix A.1) works on sentence *lengths* only; the tokens are sliced out afterwards.
That keeps the Python loop cheap and makes every instance a pair of contiguous token spans:

* A is always sentences ``chunk[0:a_end]`` of the current document;
* B is the rest of the chunk (IsNext) or sentences ``random_start:...`` of another document
  (NotNext);
* truncation removes single tokens from the front or back of the longer side, so both sides stay
  contiguous spans.

:func:`plan_instances_from_document` consumes the random generator in exactly the order of the
original ``create_instances_from_document`` with the masking call taken out (masking is done
afterwards with its own generator, see ``masking.py``); given the same documents and the same
``random.Random`` state it yields the same pairs.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class PairSpan(NamedTuple):
    """One instance as token spans: ``[a_start, a_end)`` of document `a_document` and
    ``[b_start, b_end)`` of document `b_document`, offsets into each document's token stream
    (its sentences concatenated)."""

    a_document: int
    a_start: int
    a_end: int
    b_document: int
    b_start: int
    b_end: int
    is_random_next: bool


@dataclasses.dataclass
class TrainingInstance:
    """``[CLS] A [SEP] B [SEP]`` as token ids, with segment ids and the NSP label."""

    input_ids: list[int]
    segment_ids: list[int]
    is_random_next: bool


def truncate_pair_spans(
    a_start: int, a_end: int, b_start: int, b_end: int, max_num_tokens: int, rng: random.Random
) -> tuple[int, int, int, int]:
    """The original truncate_seq_pair on spans: while too long, drop a token from the longer
    side (B when equal), from its front or its back with equal probability."""
    len_a = a_end - a_start
    len_b = b_end - b_start
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            if rng.random() < 0.5:
                a_start += 1
            else:
                a_end -= 1
            len_a -= 1
        else:
            if rng.random() < 0.5:
                b_start += 1
            else:
                b_end -= 1
            len_b -= 1
    return a_start, a_end, b_start, b_end


def _prefix_sums(lengths: Sequence[int]) -> list[int]:
    offsets = [0] * (len(lengths) + 1)
    total = 0
    for index, length in enumerate(lengths):
        total += length
        offsets[index + 1] = total
    return offsets


def plan_instances_from_document(
    sentence_lengths: Sequence[Sequence[int]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    sentence_offsets: Sequence[Sequence[int]] | None = None,
) -> list[PairSpan]:
    """The instances of one document as :class:`PairSpan` s.

    `sentence_lengths[d]` lists the token counts of document d's sentences (all > 0, no empty
    documents); `sentence_offsets[d]` are their prefix sums (computed when not given).
    """
    if sentence_offsets is None:
        sentence_offsets = _LazyPrefixSums(sentence_lengths)
    lengths = sentence_lengths[document_index]
    offsets = sentence_offsets[document_index]
    num_documents = len(sentence_lengths)
    # Account for [CLS], [SEP], [SEP].
    max_num_tokens = max_seq_length - 3
    # Mostly fill the whole sequence; sometimes (short_seq_prob) aim shorter, to reduce the
    # mismatch with short fine-tuning inputs. As in the original, one target per document.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    spans: list[PairSpan] = []
    chunk_first = 0  # index of the chunk's first sentence
    chunk_tokens = 0
    i = 0
    num_sentences = len(lengths)
    while i < num_sentences:
        chunk_tokens += lengths[i]
        if i == num_sentences - 1 or chunk_tokens >= target_seq_length:
            chunk_size = i - chunk_first + 1
            # How many of the chunk's sentences go into A.
            a_end = 1
            if chunk_size >= 2:
                a_end = rng.randint(1, chunk_size - 1)
            a_start_token = offsets[chunk_first]
            a_end_token = offsets[chunk_first + a_end]

            if chunk_size == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - (a_end_token - a_start_token)
                # Rarely more than one try on a real corpus; guards against picking ourselves.
                for _ in range(10):
                    random_document_index = rng.randint(0, num_documents - 1)
                    if random_document_index != document_index:
                        break
                random_lengths = sentence_lengths[random_document_index]
                random_offsets = sentence_offsets[random_document_index]
                random_start = rng.randint(0, len(random_lengths) - 1)
                j = random_start
                b_tokens = 0
                while j < len(random_lengths):
                    b_tokens += random_lengths[j]
                    j += 1
                    if b_tokens >= target_b_length:
                        break
                b_document = random_document_index
                b_start_token = random_offsets[random_start]
                b_end_token = random_offsets[j]
                # The chunk's unused sentences are "put back" for the next instance.
                i -= chunk_size - a_end
            else:
                is_random_next = False
                b_document = document_index
                b_start_token = a_end_token
                b_end_token = offsets[i + 1]

            a_start_token, a_end_token, b_start_token, b_end_token = truncate_pair_spans(
                a_start_token, a_end_token, b_start_token, b_end_token, max_num_tokens, rng
            )
            assert a_end_token > a_start_token and b_end_token > b_start_token
            spans.append(
                PairSpan(document_index, a_start_token, a_end_token,
                         b_document, b_start_token, b_end_token, is_random_next)
            )
            chunk_first = i + 1
            chunk_tokens = 0
        i += 1
    return spans


class _LazyPrefixSums:
    """Prefix sums of each document's sentence lengths, computed when first needed."""

    def __init__(self, sentence_lengths: Sequence[Sequence[int]]):
        self._lengths = sentence_lengths
        self._cache: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._lengths)

    def __getitem__(self, index: int) -> list[int]:
        if index not in self._cache:
            self._cache[index] = _prefix_sums(self._lengths[index])
        return self._cache[index]


class _LazyLengths:
    """Sentence lengths of each document, computed when first needed."""

    def __init__(self, documents: Sequence[Sequence[Sequence[int]]]):
        self._documents = documents
        self._cache: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._documents)

    def __getitem__(self, index: int) -> list[int]:
        if index not in self._cache:
            self._cache[index] = [len(sentence) for sentence in self._documents[index]]
        return self._cache[index]


def create_instances_from_document(
    all_documents: Sequence[Sequence[Sequence[int]]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    *,
    cls_id: int,
    sep_id: int,
) -> list[TrainingInstance]:
    """The original function on token ids: `all_documents[d][s]` is sentence s of document d.

    Documents must be non-empty and sentences non-empty (the original drops both while
    reading). Masking is separate (:func:`bertkit.pretraining.masking.mask_tokens`).
    """
    lengths = _LazyLengths(all_documents)
    spans = plan_instances_from_document(lengths, document_index, max_seq_length, short_seq_prob, rng)
    streams: dict[int, list[int]] = {}

    def stream(index: int) -> list[int]:
        if index not in streams:
            streams[index] = [token for sentence in all_documents[index] for token in sentence]
        return streams[index]

    instances = []
    for span in spans:
        tokens_a = stream(span.a_document)[span.a_start : span.a_end]
        tokens_b = stream(span.b_document)[span.b_start : span.b_end]
        instances.append(
            TrainingInstance(
                input_ids=[cls_id, *tokens_a, sep_id, *tokens_b, sep_id],
                segment_ids=[0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
                is_random_next=span.is_random_next,
            )
        )
    return instances


@dataclasses.dataclass
class PairArrays:
    """Instances as padded arrays (row layout ``[CLS] A [SEP] B [SEP] [PAD]...``).

    `b_starts[i]` is the position of B's first token (segment 1 runs from there to
    ``lengths[i]``); `next_sentence_labels` uses transformers' convention, 0 = IsNext and
    1 = NotNext.
    """

    input_ids: np.ndarray  # (N, T) int32
    lengths: np.ndarray  # (N,) int32, real tokens including specials
    b_starts: np.ndarray  # (N,) int32
    next_sentence_labels: np.ndarray  # (N,) uint8


def assemble_pairs(
    tokens: np.ndarray,
    a_starts: np.ndarray,
    a_ends: np.ndarray,
    b_starts: np.ndarray,
    b_ends: np.ndarray,
    is_random_next: np.ndarray,
    *,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    pad_id: int,
) -> PairArrays:
    """Build the padded id rows of many pairs at once; spans are offsets into `tokens`."""
    a_starts, a_ends, b_starts, b_ends = (np.asarray(x, dtype=np.int64) for x in (a_starts, a_ends, b_starts, b_ends))
    count = len(a_starts)
    len_a = a_ends - a_starts
    len_b = b_ends - b_starts
    if count and int((len_a + len_b).max()) + 3 > max_seq_length:
        raise ValueError("a pair is longer than max_seq_length - 3")
    input_ids = np.full((count, max_seq_length), pad_id, dtype=np.int32)
    rows = np.arange(count)
    input_ids[:, 0] = cls_id
    input_ids[rows, len_a + 1] = sep_id
    input_ids[rows, len_a + len_b + 2] = sep_id
    for starts, lens, first_column in ((a_starts, len_a, np.ones(count, dtype=np.int64)), (b_starts, len_b, len_a + 2)):
        total = int(lens.sum())
        row_of = np.repeat(rows, lens)
        # Position of each token inside its own span.
        within = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
        input_ids[row_of, np.repeat(first_column, lens) + within] = tokens[np.repeat(starts, lens) + within]
    return PairArrays(
        input_ids=input_ids,
        lengths=(len_a + len_b + 3).astype(np.int32),
        b_starts=(len_a + 2).astype(np.int32),
        next_sentence_labels=np.asarray(is_random_next, dtype=np.uint8),
    )
