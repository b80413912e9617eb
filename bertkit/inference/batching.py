"""Batching features for training and prediction, shared by every task, the feature extractor and
the feature-based tagger: padding (`collate`), a seeded, resumable training source
(`FeatureSource`, what `train.fit` reads) and length-sorted prediction (`predict_batches`)."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from ..device import autocast
from ..errors import BertkitError


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


class FeatureSource:
    """Batch source over in-memory features for `train.fit`: a fresh seeded shuffle per epoch,
    dynamic padding, and exact skipping for resume."""

    def __init__(self, features: Sequence[dict], batch_size: int, seed: int = 0, shuffle: bool = True,
                 pad_token_id: int = 0, model_keys: Sequence[str] | None = None):
        if not features:
            raise BertkitError("no training examples")
        self.features, self.batch_size, self.seed, self.shuffle = features, batch_size, seed, shuffle
        self.pad_token_id = pad_token_id
        self.model_keys = model_keys

    def num_batches(self, epoch: int) -> int:
        return -(-len(self.features) // self.batch_size)

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.features)))
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(len(self.features), generator=g).tolist()

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict]:
        order = self.order(epoch)
        for b in range(start, self.num_batches(epoch)):
            chunk = [self.features[i] for i in order[b * self.batch_size:(b + 1) * self.batch_size]]
            if self.model_keys is not None:
                chunk = [{k: f[k] for k in self.model_keys if k in f} for f in chunk]
            yield collate(chunk, self.pad_token_id)


def length_sorted_batches(features: Sequence[dict], batch_size: int, key: str = "input_ids"):
    """Indices in batches of similar length (evaluation: far less padding); yields (indices, batch)."""

    def length(f):
        v = f[key]
        return max(len(s) for s in v) if v and isinstance(v[0], (list, tuple)) else len(v)

    order = sorted(range(len(features)), key=lambda i: length(features[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        yield idx, [features[i] for i in idx]


@torch.no_grad()
def predict_batches(model, features: Sequence[dict], batch_size: int = 64, output_keys=("logits",),
                    input_keys=("input_ids", "token_type_ids", "attention_mask"), pad_token_id: int = 0,
                    device=None, precision: str = "fp32") -> dict[str, list]:
    """Run the model over features in length-sorted batches; return per-feature outputs in input order
    (each a tensor with the padding cut off for token-level outputs)."""
    device = device or next(model.parameters()).device
    model.eval()
    results: dict[str, list] = {k: [None] * len(features) for k in output_keys}
    for idx, chunk in length_sorted_batches(features, batch_size):
        batch = collate([{k: f[k] for k in input_keys if k in f} for f in chunk], pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device, precision):
            out = model(**batch)
        for k in output_keys:
            values = out[k].float().cpu()
            for row, i in enumerate(idx):
                v = values[row]
                if v.ndim >= 1 and "input_ids" in chunk[row] and v.shape[0] == batch["input_ids"].shape[1] \
                        and batch["input_ids"].ndim == 2:
                    v = v[: len(chunk[row]["input_ids"])]  # token-level: drop padding positions
                results[k][i] = v
    return results
