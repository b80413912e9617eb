"""Which rows share a batch: sorted by length, so that little padding is computed (evaluation and
inference; training shuffles instead, source.py)."""

from __future__ import annotations

from typing import Iterator, Sequence

from .padding import bucketed


def length_sorted_batches(features: Sequence[dict], batch_size: int, key: str = "input_ids"):
    """Indices in batches of similar length (evaluation: far less padding); yields (indices, batch)."""

    def length(f):
        v = f[key]
        return max(len(s) for s in v) if v and isinstance(v[0], (list, tuple)) else len(v)

    order = sorted(range(len(features)), key=lambda i: length(features[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        yield idx, [features[i] for i in idx]


def length_grouped_batches(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int) -> Iterator[list[int]]:
    """Indices sorted by length and cut into batches whose padded size (rows x bucketed longest)
    stays within max_batch_tokens (a longer single row still runs alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    for i in order:
        padded = bucketed(lengths[i])
        if batch and ((len(batch) + 1) * padded > max_batch_tokens or len(batch) >= max_batch_size):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch
