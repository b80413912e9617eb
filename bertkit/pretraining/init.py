"""Initialisation choices for pre-training from scratch (recipe levers, not architecture).

Every parameter stays a learned parameter of the paper's BERT; these only choose where it starts.

`sinusoidal_positions_` starts the learned position embeddings (§3, Figure 2 of the paper) from
the sine/cosine table of Vaswani et al. 2017 (§3.5) instead of random values.

`neighbour_heads_` goes further. Under a small budget the heads of a randomly initialised BERT
never learn to look at a token's neighbours (measured on BERT-TINY: after 3,000 steps every head
is near-uniform or fixed on one token, and MLM sits at the "bag of words" plateau of ~14%): that
needs position vectors with a shared geometry and query/key weights aligned with it at once,
and neither has a gradient while the other is random. So it starts with both. The position table's
first half of sine/cosine pairs has frequencies spread evenly over (0, pi), so that
sum_k cos(w_k * offset) is sharp at offset 0 (the rest keep Vaswani's geometric frequencies, for
absolute position); the first layer's heads then add to their random query/key weights a rotation
of those pairs by one position, alternately backwards and forwards: previous-token and next-token
heads, ~85% of their attention on that neighbour at step 0. Measured: held-out MLM 15% after 500
steps against 9% from random init (benchmarks/results/pretraining_budget.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

POSITION_INITS = ("normal", "sinusoidal", "neighbours")
# Query/key scale of the neighbour heads: at the initializer's std for words and positions it puts
# ~85% of a head's attention on its neighbour (2: 85%, 3: 91%, 1: 15%; BERT-TINY at step 0).
NEIGHBOUR_HEAD_SCALE = 2.0


def _table(positions: int, rates: torch.Tensor, std: float) -> torch.Tensor:
    """(positions, 2 x len(rates)) table: sin in even columns, cos in odd ones, scaled to `std`."""
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * rates[None, :]
    table = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)
    return table * (std / table.std())


@torch.no_grad()
def sinusoidal_positions_(embedding: nn.Embedding, std: float) -> nn.Embedding:
    """Fill `embedding` (positions x hidden) with the sine/cosine table scaled to standard
    deviation `std` (the config's initializer_range, as for every other embedding)."""
    positions, hidden = embedding.weight.shape
    rates = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float64) * (-math.log(10000.0) / hidden))
    embedding.weight.copy_(_table(positions, rates, std).to(embedding.weight.dtype))
    return embedding


def neighbour_rates(hidden: int) -> torch.Tensor:
    """The frequencies of `neighbour_heads_`'s table: hidden/4 pairs evenly over (0, pi), then
    hidden/4 geometric ones as Vaswani's."""
    pairs = hidden // 2
    sharp = pairs // 2
    evenly = math.pi * (torch.arange(sharp, dtype=torch.float64) + 0.5) / sharp
    geometric = torch.exp(torch.arange(pairs - sharp, dtype=torch.float64) * (-math.log(10000.0) / (pairs - sharp)))
    return torch.cat([evenly, geometric])


@torch.no_grad()
def neighbour_heads_(model: nn.Module, std: float, scale: float = NEIGHBOUR_HEAD_SCALE,
                     cls_token_id: int | None = None) -> nn.Module:
    """Start the position embeddings of `model` (a bertkit BertModel or a model holding one as
    `.bert`) from `neighbour_rates`' table, and the first layer's heads as previous-token (even
    heads) and next-token (odd heads) heads on its sharp pairs; see the module docstring.

    With `cls_token_id`, [CLS] starts with no position in those heads: position 0 (where [CLS]
    always sits) starts at zero, and so do the sharp-pair dimensions of the [CLS] and token-type
    embeddings. Its first-layer query then reads no position and it attends over the whole pair,
    the summary that NSP and the sentence-level tasks read from [CLS] (§3.1, §4.1); otherwise it
    starts as a neighbour head of its own, and MLM (for which [CLS] is only a key and a value) then
    keeps it on one or two positions. Measured (held-out NSP up at 8 minutes, within noise at 15;
    fine-tuned scores not yet better): benchmarks/results/pretraining_budget.md, "NSP at 15
    minutes: levers tried"."""
    bert = getattr(model, "bert", model)
    embedding = bert.embeddings.position_embeddings
    positions, hidden = embedding.weight.shape
    rates = neighbour_rates(hidden)
    embedding.weight.copy_(_table(positions, rates, std).to(embedding.weight.dtype))
    attention = bert.encoder.layer[0].attention.self
    heads = attention.num_heads
    head_size = hidden // heads
    sharp = len(rates) // 2
    for head in range(heads):
        offset = 1 if head % 2 == 0 else -1  # query at p looks at the key at p - offset
        # This head's head_size / 2 query/key pairs read sharp pairs spread over all of them.
        used = torch.linspace(0, sharp - 1, min(head_size // 2, sharp)).round().long()
        query = torch.zeros(head_size, hidden, dtype=torch.float64)
        key = torch.zeros(head_size, hidden, dtype=torch.float64)
        for row, pair in enumerate(used.tolist()):
            sin, cos = 2 * pair, 2 * pair + 1
            query[2 * row, sin] = query[2 * row + 1, cos] = 1.0
            # key row = the pair of position j rotated to position j + offset, so that
            # q_p . k_j = sum over pairs of cos(w (p - j - offset)): largest at j = p - offset.
            c, s = math.cos(rates[pair] * offset), math.sin(rates[pair] * offset)
            key[2 * row, sin], key[2 * row, cos] = c, s
            key[2 * row + 1, sin], key[2 * row + 1, cos] = -s, c
        rows = slice(head * head_size, (head + 1) * head_size)
        attention.query.weight[rows] += (scale * query).to(attention.query.weight.dtype)
        attention.key.weight[rows] += (scale * key).to(attention.key.weight.dtype)
    if cls_token_id is not None:
        sharp_dims = 2 * sharp
        embedding.weight[0].zero_()
        words, types = bert.embeddings.word_embeddings.weight, bert.embeddings.token_type_embeddings.weight
        words[cls_token_id, :sharp_dims] = 0.0
        types[:, :sharp_dims] = 0.0
        # Centred, so that the embedding LayerNorm's mean subtraction puts no constant into those
        # dimensions either (a constant there is a query for some position).
        words[cls_token_id, sharp_dims:] -= (words[cls_token_id, sharp_dims:] + types[0, sharp_dims:]).mean()
    return model


__all__ = ["POSITION_INITS", "NEIGHBOUR_HEAD_SCALE", "sinusoidal_positions_", "neighbour_rates", "neighbour_heads_"]
