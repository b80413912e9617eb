"""Sliding windows over a passage longer than one sequence (the original BERT's SQuAD recipe, §4.2):
where each window starts, and which window gives a token its most context. Shared by SQuAD training
and prediction (tasks/squad_windows.py) and the question-answering pipeline, below both."""

from __future__ import annotations

from collections.abc import Sequence


def check_is_max_context(spans: Sequence[tuple[int, int]], span_index: int, token: int) -> bool:
    """The original's `_check_is_max_context`: is `span_index` the window where `token` has the most
    context? Score = min(tokens to its left, tokens to its right) + 0.01 * window length; the first
    window wins ties."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if token < start or token > end:
            continue
        score = min(token - start, end - token) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return best_index == span_index


def doc_spans(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """Window (start, length) pairs over `num_tokens` passage tokens, exactly as the original."""
    spans = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans
