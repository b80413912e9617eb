"""Chunk (entity) scoring exactly as conlleval.pl (CoNLL-2000/2003, version 2004-01-26) does it.

A tag is split at its first hyphen into a prefix and a type ("B-PER" -> "B", "PER"; "O" -> "O",
""). Whether a chunk ends or starts between two tokens depends only on the two prefixes and
types (end_of_chunk / start_of_chunk below), which is what lets one scorer read IOB1 ("I-X" after
"O" or after another type starts a chunk, "B-X" only separates two adjacent chunks of one type),
IOB2 (every chunk starts with "B-X"), IOE and the bracket tags "[" "]" ".". conlleval.pl itself
has no S (single) tag, so IOBES support adds the widely used extension: S-X is a one-token chunk
and E-X ends its chunk even before B-X. Those extra rules only fire on S tags or on E followed by
B/S, so IOB1/IOB2/IOE sequences are scored exactly as by the original script.

Counting is conlleval's: a predicted chunk is correct when it starts and ends on the same tokens
as a gold chunk of the same type. Sentences are separated by a boundary token (tags O, not
counted in the accuracy). Like conlleval.pl, a "-DOCSTART-" line is an ordinary token (its tags,
normally O, count in the accuracy); only blank lines and lines starting with "-X-" are
boundaries. Scores here are fractions; conlleval prints percentages.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ..errors import BertkitError, reading

BOUNDARY_TOKEN = "-X-"
_TAG_PARTS = re.compile(r"^([^-]*)-(.*)$")

# (previous prefix, current prefix) pairs that close / open a chunk, from conlleval.pl ...
_END_PAIRS = {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
_START_PAIRS = {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}
# ... plus the IOBES extension (S = single-token chunk; E ends a chunk before B too).
_END_PAIRS |= {("B", "S"), ("I", "S"), ("E", "S"), ("E", "B")} | {("S", tag) for tag in "BEIOS"}
_START_PAIRS |= {(tag, "S") for tag in "BEIOS"} | {("S", "B"), ("E", "B"), ("S", "I"), ("S", "E")}


def split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'B-ADJ-P' -> ('B', 'ADJ-P'); 'O' -> ('O', '')."""
    match = _TAG_PARTS.match(tag)
    if match is None:
        return tag, ""
    prefix, chunk_type = match.group(1), match.group(2)
    # conlleval.pl tests the type for Perl truth, so a type "0" reads as no type at all.
    return prefix, "" if chunk_type == "0" else chunk_type


def end_of_chunk(previous_prefix: str, prefix: str, previous_type: str, chunk_type: str) -> bool:
    """Did a chunk end between the previous token and this one?"""
    if (previous_prefix, prefix) in _END_PAIRS:
        return True
    if previous_prefix not in ("O", ".") and previous_type != chunk_type:
        return True
    return previous_prefix in ("[", "]")  # bracket chunks are one token long


def start_of_chunk(previous_prefix: str, prefix: str, previous_type: str, chunk_type: str) -> bool:
    """Does a chunk start at this token?"""
    if (previous_prefix, prefix) in _START_PAIRS:
        return True
    if prefix not in ("O", ".") and previous_type != chunk_type:
        return True
    return prefix in ("[", "]")


def conll_chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Chunks of one sentence as (type, start, end) with end exclusive: tags[start:end].

    >>> conll_chunks(["I-PER", "I-PER", "B-PER", "O", "I-LOC"])  # IOB1
    [('PER', 0, 2), ('PER', 2, 3), ('LOC', 4, 5)]
    """
    chunks = []
    open_start: int | None = None
    open_type = ""
    previous_prefix, previous_type = "O", ""
    for position, tag in enumerate(tags):
        prefix, chunk_type = split_tag(tag)
        if open_start is not None and end_of_chunk(previous_prefix, prefix, previous_type, chunk_type):
            chunks.append((open_type, open_start, position))
            open_start = None
        if start_of_chunk(previous_prefix, prefix, previous_type, chunk_type):
            if open_start is not None:  # a start the end rules did not foresee closes the open chunk
                chunks.append((open_type, open_start, position))
            open_start, open_type = position, chunk_type
        previous_prefix, previous_type = prefix, chunk_type
    if open_start is not None:
        chunks.append((open_type, open_start, len(tags)))
    return chunks


class _ConllevalCounter:
    """conlleval.pl's single pass over the token stream, counts only."""

    def __init__(self) -> None:
        self.correct_chunks = 0
        self.gold_chunks = 0
        self.predicted_chunks = 0
        self.correct_tags = 0
        self.tokens = 0
        self.correct_by_type: dict[str, int] = {}
        self.gold_by_type: dict[str, int] = {}
        self.predicted_by_type: dict[str, int] = {}
        self._in_correct = False  # the chunk being read is correct so far
        self._last_gold = ("O", "")
        self._last_predicted = ("O", "")

    def add_boundary(self) -> None:
        self._step("O", "O", is_boundary=True)

    def add_token(self, gold_tag: str, predicted_tag: str) -> None:
        self._step(gold_tag, predicted_tag, is_boundary=False)

    def _step(self, gold_tag: str, predicted_tag: str, is_boundary: bool) -> None:
        gold_prefix, gold_type = split_tag(gold_tag)
        predicted_prefix, predicted_type = split_tag(predicted_tag)
        last_gold_prefix, last_gold_type = self._last_gold
        last_predicted_prefix, last_predicted_type = self._last_predicted

        if self._in_correct:
            gold_ended = end_of_chunk(last_gold_prefix, gold_prefix, last_gold_type, gold_type)
            predicted_ended = end_of_chunk(last_predicted_prefix, predicted_prefix, last_predicted_type, predicted_type)
            if gold_ended and predicted_ended and last_predicted_type == last_gold_type:
                self._in_correct = False
                self.correct_chunks += 1
                self.correct_by_type[last_gold_type] = self.correct_by_type.get(last_gold_type, 0) + 1
            elif gold_ended != predicted_ended or predicted_type != gold_type:
                self._in_correct = False

        gold_started = start_of_chunk(last_gold_prefix, gold_prefix, last_gold_type, gold_type)
        predicted_started = start_of_chunk(last_predicted_prefix, predicted_prefix, last_predicted_type, predicted_type)
        if gold_started and predicted_started and predicted_type == gold_type:
            self._in_correct = True
        if gold_started:
            self.gold_chunks += 1
            self.gold_by_type[gold_type] = self.gold_by_type.get(gold_type, 0) + 1
        if predicted_started:
            self.predicted_chunks += 1
            self.predicted_by_type[predicted_type] = self.predicted_by_type.get(predicted_type, 0) + 1
        if not is_boundary:
            if gold_prefix == predicted_prefix and gold_type == predicted_type:
                self.correct_tags += 1
            self.tokens += 1

        self._last_gold = (gold_prefix, gold_type)
        self._last_predicted = (predicted_prefix, predicted_type)

    def result(self) -> dict:
        if self._in_correct:  # a correct chunk running to the end of the input
            self._in_correct = False
            last_type = self._last_gold[1]
            self.correct_chunks += 1
            self.correct_by_type[last_type] = self.correct_by_type.get(last_type, 0) + 1
        per_type = {}
        for chunk_type in sorted(set(self.gold_by_type) | set(self.predicted_by_type)):
            correct = self.correct_by_type.get(chunk_type, 0)
            gold = self.gold_by_type.get(chunk_type, 0)
            predicted = self.predicted_by_type.get(chunk_type, 0)
            counts = {"support": gold, "predicted": predicted, "correct": correct}
            per_type[chunk_type] = {**_prf(correct, predicted, gold), **counts}
        return {
            **_prf(self.correct_chunks, self.predicted_chunks, self.gold_chunks),
            "accuracy": self.correct_tags / self.tokens if self.tokens else 0.0,
            "tokens": self.tokens,
            "gold_chunks": self.gold_chunks,
            "predicted_chunks": self.predicted_chunks,
            "correct_chunks": self.correct_chunks,
            "per_type": per_type,
        }


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def evaluate_conll(gold_sequences: Sequence[Sequence[str]], pred_sequences: Sequence[Sequence[str]]) -> dict:
    """conlleval scores for sentences of gold and predicted tags.

    Returns precision, recall, f1 (chunk level), accuracy (token level), the counts tokens /
    gold_chunks / predicted_chunks / correct_chunks, and per_type: {TYPE: {precision, recall,
    f1, support (gold chunks), predicted, correct}}. Scores are fractions.
    """
    if len(gold_sequences) != len(pred_sequences):
        raise BertkitError(f"{len(gold_sequences)} gold sentences but {len(pred_sequences)} predicted")
    counter = _ConllevalCounter()
    for index, (gold_tags, predicted_tags) in enumerate(zip(gold_sequences, pred_sequences)):
        if isinstance(gold_tags, str) or isinstance(predicted_tags, str):
            raise BertkitError(f"sentence {index}: expected a list of tags, got a string")
        if len(gold_tags) != len(predicted_tags):
            raise BertkitError(f"sentence {index}: {len(gold_tags)} gold tags but {len(predicted_tags)} predicted")
        if index > 0:
            counter.add_boundary()
        for gold_tag, predicted_tag in zip(gold_tags, predicted_tags):
            counter.add_token(gold_tag, predicted_tag)
    if counter.tokens == 0:
        raise BertkitError("no tokens to evaluate")
    return counter.result()


def evaluate_conll_file(path: str | Path) -> dict:
    """conlleval on a file: one token per line, the last two whitespace-separated columns are the
    gold and the predicted tag (earlier columns are ignored), sentences separated by blank lines.
    Every non-blank line must have the same number of columns (at least 3), as conlleval requires.
    Returns the same dict as evaluate_conll.
    """
    path = str(path)
    counter = _ConllevalCounter()
    columns_expected: int | None = None
    first_line = 0
    with reading(path, "CoNLL file"), open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                counter.add_boundary()
                continue
            if len(fields) < 3:
                raise BertkitError(
                    f"expected at least 3 columns (token ... gold predicted), "
                    f"found {len(fields)}: {line.strip()!r}",
                    path=path,
                    line=line_number,
                )
            if columns_expected is None:
                columns_expected, first_line = len(fields), line_number
            elif len(fields) != columns_expected:
                raise BertkitError(
                    f"expected {columns_expected} columns like line {first_line}, found {len(fields)}",
                    path=path,
                    line=line_number,
                )
            if fields[0] == BOUNDARY_TOKEN:
                counter.add_boundary()
            else:
                counter.add_token(fields[-2], fields[-1])
    if counter.tokens == 0:
        raise BertkitError("no tokens to evaluate", path=path)
    return counter.result()
