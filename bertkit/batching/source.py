"""A training batch source over in-memory features (what `train.fit` reads, train/loop.py's
BatchSource): seeded shuffles, dynamic padding, exact skipping for resume."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from ..errors import BertkitError
from .padding import collate


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
