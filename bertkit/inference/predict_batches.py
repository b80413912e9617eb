"""Features through a model for their outputs (dev and test prediction in every task, the feature
extractor, the feature-based tagger): length-sorted batches, outputs back in input order."""

from __future__ import annotations

from typing import Sequence

import torch

from ..batching import collate, length_sorted_batches
from ..device import autocast

# Outputs with one value per token besides (B, T, H)-shaped ones: cut back to each row's length. A
# sequence-level output is never cut, even when its width equals the padded length (8 labels, T 8).
TOKEN_LEVEL_2D = ("start_logits", "end_logits")


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
        ids = batch.get("input_ids")
        padded = ids.shape[1] if ids is not None and ids.ndim == 2 else None
        for k in output_keys:
            values = out[k].float().cpu()
            per_token = padded is not None and values.shape[1:2] == (padded,) and (
                values.ndim == 3 or k in TOKEN_LEVEL_2D)
            for row, i in enumerate(idx):
                v = values[row]
                if per_token:
                    v = v[: len(chunk[row]["input_ids"])]  # drop the padding positions
                results[k][i] = v
    return results
