"""Sentence embeddings from a model object (a BertModel being trained, or loaded): `pool` turns
token vectors into one vector per row as sentence-transformers' Pooling does, `embed` runs texts
through a model in length-sorted batches and returns an (N, D) matrix (training-time evaluation,
teachers, mining)."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..device import autocast
from ..batching import collate, length_sorted_batches

POOLING_MODES = ("mean", "cls", "max")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str = "mean", normalize: bool = False):
    """(B, T, H) token vectors and their (B, T) mask -> (B, H): the mean of the real tokens, the
    [CLS] vector, or the maximum over real tokens (sentence-transformers' Pooling), optionally
    L2-normalised (its Normalize module)."""
    if mode == "cls":
        vectors = hidden[:, 0]
    elif mode == "max":
        vectors = hidden.masked_fill(~attention_mask.bool()[..., None], float("-inf")).max(1).values
    elif mode == "mean":
        mask = attention_mask[..., None].to(hidden.dtype)
        vectors = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    else:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, not {mode!r}")
    return F.normalize(vectors, p=2, dim=-1) if normalize else vectors


@torch.no_grad()
def embed(model, tokenizer, texts: Sequence[str], pooling: str = "mean", batch_size: int = 64,
          normalize: bool = True, max_length: int = 256, precision: str = "fp32") -> torch.Tensor:
    """(N, D) float32 CPU embeddings of `texts` from a BertModel object (its device, eval mode for
    the call, the mode it was in restored); each text truncated to `max_length` word pieces."""
    if not texts:
        return torch.zeros(0, model.config.hidden_size)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    features = tokenizer.encode_batch(list(texts), max_length=max_length, truncation=True)
    out = torch.empty(len(texts), model.config.hidden_size)
    try:
        for indices, chunk in length_sorted_batches(features, batch_size):
            batch = collate([{k: f[k] for k in ("input_ids", "token_type_ids", "attention_mask")} for f in chunk],
                            tokenizer.pad_token_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            with autocast(device, precision):
                hidden = model(**batch)["last_hidden_state"]
            out[indices] = pool(hidden.float(), batch["attention_mask"], pooling, normalize).cpu()
    finally:
        model.train(was_training)
    return out


__all__ = ["POOLING_MODES", "embed", "pool"]
