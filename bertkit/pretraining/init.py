"""Initialisation choices for pre-training from scratch (recipe levers, not architecture).

`sinusoidal_positions_` starts the learned position embeddings (§3, Figure 2 of the paper) from
the sine/cosine table of Vaswani et al. 2017 (§3.5) instead of random values; they stay learned
parameters. Why: under a small budget the attention heads of a randomly initialised BERT stay
near-uniform for the whole run (measured: entropy within 2% of uniform after 760 steps of
BERT-TINY), because attending to neighbours needs position vectors with a shared geometry, which
random ones only acquire slowly. A sinusoid table has that geometry from step 0: the vector at
p + k is a fixed rotation of the one at p.
"""

from __future__ import annotations

import math

import torch
from torch import nn

POSITION_INITS = ("normal", "sinusoidal")


@torch.no_grad()
def sinusoidal_positions_(embedding: nn.Embedding, std: float) -> nn.Embedding:
    """Fill `embedding` (positions x hidden) with the sine/cosine table scaled to standard
    deviation `std` (the config's initializer_range, as for every other embedding)."""
    positions, hidden = embedding.weight.shape
    position = torch.arange(positions, dtype=torch.float64)[:, None]
    rates = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float64) * (-math.log(10000.0) / hidden))
    table = torch.zeros(positions, hidden, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * rates)
    table[:, 1::2] = torch.cos(position * rates[: hidden // 2])
    table *= std / table.std()
    embedding.weight.copy_(table.to(embedding.weight.dtype))
    return embedding


__all__ = ["POSITION_INITS", "sinusoidal_positions_"]
