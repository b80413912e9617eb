"""SQuAD examples and features: the official JSON read into questions, and sliding windows over
each passage, as Google's run_squad.py builds them.

The original splits the passage on whitespace, WordPiece-tokenizes each word and keeps two index
maps (token -> word, word -> first token) to go back to the text. Here the question and the
passage are tokenized separately with character offsets, which makes both directions exact:
a token's text is `context[start:end]`, and an answer's character span becomes the tokens that
overlap it. Everything else follows the original:

- the question is cut to its first `max_query_length` tokens;
- a window holds `max_seq_length - len(question) - 3` passage tokens: `[CLS] q [SEP] ctx [SEP]`,
  segment 0 up to the first `[SEP]`, 1 after it;
- windows start at 0 and advance by `min(length, doc_stride)` until one reaches the passage end;
- training labels: the answer's first and last token positions in every window that holds the
  whole answer, else `[CLS]` (position 0); unanswerable (v2.0) questions always point at `[CLS]`.
  The original narrows its whitespace-word span with `_improve_answer_span` (the answer "1895" in
  "(1895)."); the offsets give that token span directly, so no improvement step exists. They
  differ only where an answer boundary falls inside a whitespace word and the improvement finds
  no match: the original then labels whole words ('"golden' for "gold", 'nonviolent' for
  "violent"), the offsets only the tokens overlapping the answer (13 of 6,471 windows of every
  6th dev-v1.1 article at length 128, see tests/tasks/test_squad_windows.py);
- a training question whose answer text is not found where `answer_start` says (the original's
  "Could not find answer" check, on whitespace-joined words) is skipped and counted;
- each passage token is scored only in the window where it has the most context
  (`check_is_max_context`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BertkitError
from ..batching.windows import check_is_max_context, doc_spans
from ..metrics.squad import is_squad_v2

log = logging.getLogger("bertkit")


@dataclasses.dataclass
class SquadAnswer:
    text: str
    answer_start: int


@dataclasses.dataclass
class SquadExample:
    """One question about one passage. `answers` may be empty (unlabelled data, or v2.0 unanswerable)."""

    qid: str
    question: str
    context: str
    answers: list[SquadAnswer]
    is_impossible: bool = False
    title: str = ""
    article_index: int = 0


# --------------------------------------------------------------------------- reading


@dataclasses.dataclass
class SquadData:
    examples: list[SquadExample]
    version: str  # "1.1" or "2.0"
    path: str
    bad_rows_skipped: int = 0

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self):
        return iter(self.examples)

    @property
    def has_answers(self) -> bool:
        return any(e.answers or e.is_impossible for e in self.examples)


def read_squad(path: str | Path, version: str | None = None, skip_bad_rows: bool = False) -> SquadData:
    """Questions of an official SQuAD JSON file (v1.1, or v2.0 with `is_impossible`; `version`
    None detects it). Bad questions raise BertkitError naming the file and the question id, or
    with `skip_bad_rows` are skipped and counted."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except FileNotFoundError:
        raise BertkitError("SQuAD file not found", path=path) from None
    except (IsADirectoryError, UnicodeDecodeError) as err:
        raise BertkitError(f"cannot read a SQuAD JSON file: {err}", path=path) from None
    except json.JSONDecodeError as err:
        raise BertkitError(f"not valid JSON: {err.msg} (column {err.colno})", path=path, line=err.lineno) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise BertkitError("not a SQuAD file: expected a JSON object with a 'data' list of articles", path=path)
    if version is None:
        version = "2.0" if is_squad_v2(raw) else "1.1"
    if version not in ("1.1", "2.0"):
        raise BertkitError(f"SQuAD version must be 1.1 or 2.0, not {version!r}", path=path)

    examples: list[SquadExample] = []
    seen_ids: set[str] = set()
    bad = 0
    for article_index, article in enumerate(raw["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise BertkitError(f"article {article_index} has no 'paragraphs' list", path=path)
        title = article.get("title") if isinstance(article.get("title"), str) else ""
        for paragraph_index, paragraph in enumerate(article["paragraphs"]):
            where = f"article {article_index}, paragraph {paragraph_index}"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str) \
                    or not isinstance(paragraph.get("qas"), list):
                raise BertkitError(f"{where}: expected a 'context' string and a 'qas' list", path=path)
            context = paragraph["context"]
            for qa_index, qa in enumerate(paragraph["qas"]):
                try:
                    example = _read_question(qa, context, title, article_index, version, seen_ids,
                                             f"{where}, question {qa_index}")
                except BertkitError as err:
                    if not skip_bad_rows:
                        raise BertkitError(err.message, path=path) from None
                    bad += 1
                    continue
                seen_ids.add(example.qid)
                examples.append(example)
    if bad:
        log.warning(f"{path}: skipped {bad} bad questions")
    return SquadData(examples, version, path, bad)


def _read_question(qa, context: str, title: str, article_index: int, version: str, seen_ids: set[str],
                   where: str) -> SquadExample:
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
        raise BertkitError(f"{where}: a question needs a string 'id'")
    qid = qa["id"]
    if qid in seen_ids:
        raise BertkitError(f"question {qid}: duplicate id")
    if not isinstance(qa.get("question"), str):
        raise BertkitError(f"question {qid}: missing 'question' text")
    is_impossible = qa.get("is_impossible", False)
    if not isinstance(is_impossible, bool):
        raise BertkitError(f"question {qid}: 'is_impossible' must be true or false")
    answers_json = qa.get("answers", [])  # absent in unlabelled (test) files
    if not isinstance(answers_json, list):
        raise BertkitError(f"question {qid}: 'answers' must be a list")
    answers = []
    for answer in answers_json:
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str) \
                or isinstance(answer.get("answer_start"), bool) or not isinstance(answer.get("answer_start"), int):
            raise BertkitError(f"question {qid}: each answer needs a 'text' string and an integer 'answer_start'")
        start, text = answer["answer_start"], answer["text"]
        if start < 0 or start + len(text) > len(context):
            raise BertkitError(f"question {qid}: answer_start {start} + {len(text)} characters lies outside "
                               f"the {len(context)}-character context")
        answers.append(SquadAnswer(text, start))
    return SquadExample(qid, qa["question"], context, answers, is_impossible and version == "2.0", title,
                        article_index)


def squad_json(examples: Sequence[SquadExample], version: str) -> dict:
    """The official JSON layout for these examples only (what the evaluators score against)."""
    articles: dict[int, dict] = {}
    paragraphs: dict[tuple[int, str], dict] = {}
    for e in examples:
        article = articles.setdefault(e.article_index, {"title": e.title, "paragraphs": []})
        key = (e.article_index, e.context)
        if key not in paragraphs:
            paragraphs[key] = {"context": e.context, "qas": []}
            article["paragraphs"].append(paragraphs[key])
        qa = {"id": e.qid, "question": e.question,
              "answers": [{"text": a.text, "answer_start": a.answer_start} for a in e.answers]}
        if version == "2.0":
            qa["is_impossible"] = e.is_impossible
            if e.is_impossible:
                qa["answers"] = []
        paragraphs[key]["qas"].append(qa)
    return {"version": "v2.0" if version == "2.0" else "1.1", "data": list(articles.values())}


def article_key(example: SquadExample) -> str:
    return example.title or f"#{example.article_index}"


def article_split(examples: Sequence[SquadExample], fraction: float, seed: int = 0) -> set[str]:
    """A seeded random `fraction` of the examples' articles (keys: titles), at least one and, when
    there are two or more, leaving at least one out."""
    if not 0.0 < fraction < 1.0:
        raise BertkitError(f"--article-split must lie strictly between 0 and 1, not {fraction}")
    keys = sorted({article_key(e) for e in examples})
    random.Random(seed).shuffle(keys)
    count = min(max(1, round(fraction * len(keys))), max(1, len(keys) - 1))
    return set(keys[:count])


@dataclasses.dataclass
class TokenizedPassage:
    """A passage's WordPiece ids and their (start, end) character spans, shared by its questions."""

    ids: np.ndarray  # (N,) int32
    offsets: np.ndarray  # (N, 2) int64, character spans into the passage


@dataclasses.dataclass
class SquadWindow:
    """One model input: `[CLS] question [SEP] passage[doc_start : doc_start + doc_length] [SEP]`."""

    example_index: int  # into the examples given to squad_windows
    span_index: int  # this window's place among its example's windows
    input_ids: np.ndarray  # (T,) int32
    context_offset: int  # position of the first passage token (= question length + 2)
    doc_start: int  # first passage token (index into the passage's tokens)
    doc_length: int
    spans: list[tuple[int, int]]  # (doc_start, doc_length) of every window of this example
    passage: TokenizedPassage
    start_position: int | None = None  # training labels (0 = [CLS])
    end_position: int | None = None

    def is_context(self, position: int) -> bool:
        return self.context_offset <= position < self.context_offset + self.doc_length

    def context_token(self, position: int) -> int:
        """Passage token index of a window position that is inside the passage part."""
        return self.doc_start + position - self.context_offset

    def char_span(self, position: int) -> tuple[int, int]:
        start, end = self.passage.offsets[self.context_token(position)]
        return int(start), int(end)

    def is_max_context(self, position: int) -> bool:
        return check_is_max_context(self.spans, self.span_index, self.context_token(position))


@dataclasses.dataclass
class SquadWindows(Sequence):
    """The windows of a set of examples, plus what building them dropped."""

    windows: list[SquadWindow]
    skipped_unrecoverable: list[str]  # training qids whose answer text is not at answer_start

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index):
        return self.windows[index]


def answer_token_span(offsets: np.ndarray, char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last passage token overlapping the characters [char_start, char_end), or None."""
    if len(offsets) == 0 or char_end <= char_start:
        return None
    first = int(np.searchsorted(offsets[:, 1], char_start, side="right"))  # first token ending after the start
    last = int(np.searchsorted(offsets[:, 0], char_end, side="left")) - 1  # last token starting before the end
    if first >= len(offsets) or last < first:
        return None
    return first, last


def _is_original_whitespace(ch: str) -> bool:
    return ch in " \t\r\n" or ord(ch) == 0x202F


def answer_is_recoverable(context: str, answer: SquadAnswer) -> bool:
    """The original's training-time check: the whitespace-normalised answer text must occur in the
    whitespace words spanned by [answer_start, answer_start + len(text))."""
    first_char, last_char = answer.answer_start, answer.answer_start + len(answer.text) - 1
    if not answer.text or first_char < 0 or last_char >= len(context):
        return False
    first_word, last_word = _original_word_at(context, first_char), _original_word_at(context, last_char)
    if first_word is None or last_word is None:
        return False
    # The original joins doc_tokens[start_word : end_word + 1] with single spaces.
    spanned = "".join(" " if _is_original_whitespace(c) else c for c in context[first_word[0]:last_word[1] + 1])
    words = [w for w in spanned.split(" ") if w]  # only the original's whitespace separates words
    return " ".join(answer.text.split()) in " ".join(words)


def _original_word_at(context: str, char: int) -> tuple[int, int] | None:
    """(first, last) character of the original's whitespace word for `char` (char_to_word_offset:
    a whitespace character belongs to the word before it); None before the first word."""
    j = char
    while j >= 0 and _is_original_whitespace(context[j]):
        j -= 1
    if j < 0:
        return None
    first = last = j
    while first > 0 and not _is_original_whitespace(context[first - 1]):
        first -= 1
    while last + 1 < len(context) and not _is_original_whitespace(context[last + 1]):
        last += 1
    return first, last


def tokenize_with_offsets(tokenizer, texts: Sequence[str]) -> list[TokenizedPassage]:
    """WordPiece ids and character offsets of each text, without special tokens (one batched call)."""
    encodings = tokenizer.encode_batch(list(texts), truncation=False, return_offsets=True)
    tokenized = []
    for encoding in encodings:
        keep = [i for i, s in enumerate(encoding["sequence_ids"]) if s is not None]
        ids = np.asarray([encoding["input_ids"][i] for i in keep], dtype=np.int32)
        offsets = np.asarray([encoding["offsets"][i] for i in keep], dtype=np.int64).reshape(-1, 2)
        tokenized.append(TokenizedPassage(ids, offsets))
    return tokenized


def squad_windows(examples: Sequence[SquadExample], tokenizer, max_seq_length: int = 384, doc_stride: int = 128,
                  max_query_length: int = 64, training: bool = False) -> SquadWindows:
    """Windows for every example (in example order). With `training`, each window carries
    start/end labels from the example's first answer, and examples whose answer is not
    recoverable are skipped (their qids are listed in the result)."""
    if max_seq_length - max_query_length - 3 < 1:
        raise BertkitError(f"max_seq_length {max_seq_length} leaves no room for the passage after a "
                           f"question of up to {max_query_length} tokens, [CLS] and two [SEP]")
    if doc_stride < 1:
        raise BertkitError(f"doc_stride must be at least 1, not {doc_stride}")
    unique_contexts = list(dict.fromkeys(e.context for e in examples))
    passages = dict(zip(unique_contexts, tokenize_with_offsets(tokenizer, unique_contexts)))
    questions = tokenize_with_offsets(tokenizer, [e.question for e in examples])
    cls_id, sep_id = np.int32(tokenizer.cls_token_id), np.int32(tokenizer.sep_token_id)

    windows: list[SquadWindow] = []
    skipped: list[str] = []
    for example_index, (example, question) in enumerate(zip(examples, questions)):
        passage = passages[example.context]
        query_ids = question.ids[:max_query_length]
        answer_tokens = None
        if training and not example.is_impossible:
            if not example.answers:
                raise BertkitError(f"training question {example.qid} is answerable but has no answer")
            answer = example.answers[0]  # the original requires exactly one; extra (dev) answers are ignored
            if answer_is_recoverable(example.context, answer):
                answer_tokens = answer_token_span(passage.offsets, answer.answer_start,
                                                  answer.answer_start + len(answer.text))
            if answer_tokens is None:
                skipped.append(example.qid)
                continue
        spans = doc_spans(len(passage.ids), max_seq_length - len(query_ids) - 3, doc_stride)
        context_offset = len(query_ids) + 2
        for span_index, (doc_start, doc_length) in enumerate(spans):
            input_ids = np.concatenate([[cls_id], query_ids, [sep_id],
                                        passage.ids[doc_start:doc_start + doc_length], [sep_id]]).astype(np.int32)
            window = SquadWindow(example_index, span_index, input_ids, context_offset, doc_start, doc_length,
                                 spans, passage)
            if training:
                window.start_position = window.end_position = 0
                if answer_tokens is not None:
                    first, last = answer_tokens
                    if doc_start <= first and last <= doc_start + doc_length - 1:
                        window.start_position = first - doc_start + context_offset
                        window.end_position = last - doc_start + context_offset
            windows.append(window)
    return SquadWindows(windows, skipped)


class WindowInputs(Sequence):
    """A read-only view giving each window as the model's input dict (lists, for `collate`), built
    on access so that a large training set stays in compact numpy arrays."""

    def __init__(self, windows: Sequence[SquadWindow], with_labels: bool = False):
        self.windows, self.with_labels = windows, with_labels

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        window = self.windows[index]
        n = len(window.input_ids)
        features = {"input_ids": window.input_ids.tolist(),
                    "token_type_ids": [0] * window.context_offset + [1] * (n - window.context_offset),
                    "attention_mask": [1] * n}
        if self.with_labels:
            features["start_positions"] = window.start_position
            features["end_positions"] = window.end_position
        return features
