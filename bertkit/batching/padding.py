"""Padding: feature dicts into tensors. `collate` pads to the batch's longest (training and dev
prediction: what the model sees is exactly the data); `pad_rows` pads to a bucketed length, so that an
engine serving ever-changing lengths meets a small set of shapes (oneDNN makes and caches kernels per
shape)."""

from __future__ import annotations

from typing import Sequence

import torch

LENGTH_BUCKET = 16  # padded lengths are multiples of this
SINGLE_LENGTH_BUCKET = 8  # ... and those of a lone sequence, multiples of this


def collate(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Stack features (dicts of lists / ints / floats), padding sequences to the longest in the batch.

    Sequence keys: input_ids, token_type_ids, attention_mask, labels (token-level, padded with -100).
    Multiple choice features hold a list of C sequences per key: padded to (B, C, T).
    """
    batch: dict[str, torch.Tensor] = {}
    for key in features[0]:
        values = [f[key] for f in features]
        first = values[0]
        if isinstance(first, (list, tuple)) and first and isinstance(first[0], (list, tuple)):
            T = max(len(seq) for v in values for seq in v)
            pad = -100 if key == "labels" else (pad_token_id if key == "input_ids" else 0)
            batch[key] = torch.tensor([[list(seq) + [pad] * (T - len(seq)) for seq in v] for v in values])
        elif isinstance(first, (list, tuple)):
            T = max(len(v) for v in values)
            pad = -100 if key == "labels" else (pad_token_id if key == "input_ids" else 0)
            batch[key] = torch.tensor([list(v) + [pad] * (T - len(v)) for v in values])
        elif isinstance(first, float):
            batch[key] = torch.tensor(values, dtype=torch.float32)
        elif isinstance(first, (int, bool)):
            batch[key] = torch.tensor(values, dtype=torch.long)
        # other values (ids, strings) are metadata, not model inputs
    return batch


def bucketed(length: int) -> int:
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


def padded_length(longest: int, sequences: int, lone_bucket: int = SINGLE_LENGTH_BUCKET) -> int:
    """The length a batch of `sequences` sequences is padded to (a lone one: a finer bucket,
    `lone_bucket`; 1 where the kernels make nothing per shape and a lone input runs unpadded)."""
    bucket = lone_bucket if sequences == 1 else LENGTH_BUCKET
    return -(-longest // bucket) * bucket


def pad_rows(rows: Sequence[dict], pad_token_id: int, lone_bucket: int = SINGLE_LENGTH_BUCKET) -> dict[str, torch.Tensor]:
    """input_ids / token_type_ids / attention_mask lists -> (B, T) tensors, T bucketed (`padded_length`);
    rows of multiple choice (C sequences each) -> (B, C, T)."""
    nested = isinstance(rows[0]["input_ids"][0], list)
    sequences = [seq for row in rows for seq in (row["input_ids"] if nested else [row["input_ids"]])]
    T = padded_length(max(len(seq) for seq in sequences), len(sequences), lone_bucket)
    batch = {}
    for key, pad in (("input_ids", pad_token_id), ("token_type_ids", 0), ("attention_mask", 0)):
        if nested:
            values = [[list(seq) + [pad] * (T - len(seq)) for seq in row[key]] for row in rows]
        else:
            values = [list(row[key]) + [pad] * (T - len(row[key])) for row in rows]
        batch[key] = torch.tensor(values, dtype=torch.long)
    return batch


def pack_rows(rows: Sequence[dict], pad_token_id: int, bucket: int = SINGLE_LENGTH_BUCKET
              ) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Several rows' tokens one after another in a single (1, N) row, for a graph whose attention
    reads the mask as segment ids (inference/compiled.py): `attention_mask` numbers the inputs 1, 2,
    ..., `position_ids` restart at each, and N is padded to a multiple of `bucket` (segment 0; 1:
    not padded). Returns the tensors and where each row starts."""
    starts, at = [], 0
    for row in rows:
        starts.append(at)
        at += len(row["input_ids"])
    extra = -at % bucket
    ids = [token for row in rows for token in row["input_ids"]] + [pad_token_id] * extra
    types = [kind for row in rows for kind in row["token_type_ids"]] + [0] * extra
    segments = [number for number, row in enumerate(rows, 1) for _ in row["input_ids"]] + [0] * extra
    positions = [p for row in rows for p in range(len(row["input_ids"]))] + [0] * extra
    values = torch.tensor([ids, segments, types, positions], dtype=torch.long)
    return {"input_ids": values[0:1], "attention_mask": values[1:2], "token_type_ids": values[2:3],
            "position_ids": values[3:4]}, starts
