"""The losses a cross-encoder trains with, as sentence-transformers' CrossEncoder losses compute them,
and the training model that carries one: a BertForSequenceClassification with one logit (what
sentence-transformers' CrossEncoder, transformers and `bertkit serve`'s /rerank load) plus its loss.

- `bce`: BinaryCrossEntropyLoss: BCE with logits on the one logit; labels 0/1 or graded in [0, 1];
  an optional `pos_weight` weighs the positive term (torch's BCEWithLogitsLoss).
- `listnet`: ListNetLoss (Cao et al., 2007): each query's passages in one softmax, cross-entropy
  against the softmax of their labels; padded passages are left out of both (logit -1e16, label
  -inf, as sentence-transformers pads), the mean over queries.
- `lambda`: LambdaLoss (Wang et al., 2018) at sentence-transformers' defaults: the NDCG-Loss2++
  weights (mu 10) on every pair of a query's passages with different labels, sigma 1, log base 2.

Training batches for `listnet` hold one row per query: (B, G, T) inputs, (B, G) labels, -100 marking
a padded passage, which is never run through the encoder. `CrossEncoderTraining` saves, checkpoints
and restores as the plain BertForSequenceClassification it wraps (same files, same state-dict names).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..heads import BertForSequenceClassification
from ..model import ModelOutput

# What config.json tells sentence-transformers' CrossEncoder (v4 and later) to apply to the logit: the
# sigmoid, as /rerank does (a model that came with another activation gets this one).
SIGMOID = "torch.nn.modules.activation.Sigmoid"
PADDED = -100.0  # a group's label at a padded passage (listwise batches)
PADDED_LOGIT = -1e16  # sentence-transformers' fill for padded passages: no weight in the softmax


@dataclasses.dataclass(frozen=True)
class RankingLoss:
    """Which loss a cross-encoder trains with: its name (`--loss`), whether its batches are per query
    (listwise) or per pair, the label range it accepts, and sentence-transformers' class it matches."""

    name: str
    listwise: bool
    labels: str  # in the user's words, for errors and --help
    anchor: str  # sentence-transformers' class
    max_label: float | None = None  # None: any non-negative number
    pos_weight: float | None = None  # bce only


LOSSES = {loss.name: loss for loss in (
    RankingLoss("bce", listwise=False, labels="0/1 or a graded relevance in [0, 1]",
                anchor="BinaryCrossEntropyLoss", max_label=1.0),
    RankingLoss("listnet", listwise=True, labels="non-negative relevance grades (0/1, 0-3, ...)",
                anchor="ListNetLoss"),
    RankingLoss("lambda", listwise=True, labels="non-negative relevance grades (0/1, 0-3, ...)",
                anchor="LambdaLoss"),
)}


def bce_loss(logits: torch.Tensor, labels: torch.Tensor, pos_weight: float | None = None) -> torch.Tensor:
    """Mean binary cross-entropy of one logit per pair (B,) against labels in [0, 1] (B,)."""
    weight = None if pos_weight is None else torch.tensor(pos_weight, device=logits.device)
    return F.binary_cross_entropy_with_logits(logits.float().view(-1), labels.float().view(-1), pos_weight=weight)


def listnet_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ListNet over (B, G) logits and labels; positions where labels == PADDED are no passage."""
    present = labels != PADDED  # (B, G)
    scores = logits.float().masked_fill(~present, PADDED_LOGIT)
    targets = labels.float().masked_fill(~present, float("-inf")).softmax(dim=1)  # (B, G)
    return F.cross_entropy(scores, targets)


def lambda_loss(logits: torch.Tensor, labels: torch.Tensor, mu: float = 10.0, sigma: float = 1.0,
                eps: float = 1e-10) -> torch.Tensor:
    """LambdaLoss with NDCG-Loss2++ weights over (B, G) logits and labels (PADDED: no passage): per
    query, the passages in the model's order; each pair (i, j) with label_i > label_j adds
    -w_ij log2 sigmoid(sigma (s_i - s_j)), w_ij = (mu delta_ij + |1/D_i - 1/D_j|) |g_i - g_j|, where
    D_r = log2(1 + r), g = (2^label - 1) / maxDCG and delta_ij = 1/D_|i-j| - 1/D_|i-j|+1; the mean over
    the pairs of the batch."""
    present = labels != PADDED
    scores = logits.float().masked_fill(~present, PADDED_LOGIT)
    grades = labels.float().masked_fill(~present, float("-inf"))
    ranked_scores, order = scores.sort(descending=True, dim=-1)  # (B, G): the model's ranking
    ranked_grades = grades.gather(1, order)
    ideal = grades.sort(descending=True, dim=-1).values
    differ = ranked_grades[:, :, None] - ranked_grades[:, None, :]  # (B, G, G)
    pairs = torch.isfinite(differ) & (differ > 0)  # both passages real, i more relevant than j
    G = labels.shape[1]
    discount = torch.log2(torch.arange(2, G + 2, device=labels.device, dtype=torch.float32))  # D_r, r = 1..G
    max_dcg = ((2 ** ideal.clamp(min=0) - 1) / discount).sum(-1).clamp(min=eps)  # (B,)
    gain = (2 ** ranked_grades.clamp(min=0) - 1) / max_dcg[:, None]  # (B, G)
    gain_gap = (gain[:, :, None] - gain[:, None, :]).abs()
    rank = torch.arange(G, device=labels.device)
    gap = (rank[:, None] - rank[None, :]).abs()  # |i - j|
    delta = (1 / discount[(gap - 1).clamp(min=0)] - 1 / discount[gap]).abs()
    delta = delta.masked_fill(gap == 0, 0.0)  # (G, G)
    lambda_rank = (1 / discount[:, None] - 1 / discount[None, :]).abs()  # (G, G)
    weights = (mu * delta + lambda_rank)[None] * gain_gap
    score_gaps = (ranked_scores[:, :, None] - ranked_scores[:, None, :]).clamp(min=-1e8, max=1e8)
    terms = (weights * F.logsigmoid(sigma * score_gaps) / math.log(2))[pairs]
    return -terms.sum() / max(terms.numel(), 1)


LISTWISE_LOSSES = {"listnet": listnet_loss, "lambda": lambda_loss}


class CrossEncoderTraining(nn.Module):
    """A one-logit BertForSequenceClassification (`scorer`) with the loss it trains on.

    model(**batch) as every task model: `labels` (B,) for pairs, or (B, G) with (B, G, T) inputs for
    listwise groups; without labels, the scorer's logits (B, 1). Saving writes the scorer alone (a
    plain BertForSequenceClassification folder); checkpoints load back into it."""

    def __init__(self, scorer: BertForSequenceClassification, loss: RankingLoss):
        super().__init__()
        self.scorer, self.loss = scorer, loss

    @classmethod
    def from_pretrained(cls, directory, loss: RankingLoss, **config_overrides) -> "CrossEncoderTraining":
        """The scorer from `directory` with one logit (a new head unless it already has one)."""
        scorer = BertForSequenceClassification.from_pretrained(directory, **config_overrides)
        scorer.config = scorer.config.replace(extra={**scorer.config.extra,
                                                     "sentence_transformers": {"activation_fn": SIGMOID}})
        return cls(scorer, loss)

    @property
    def config(self):
        return self.scorer.config

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **kw):
        if input_ids.ndim == 2:  # pairs: (B, T) inputs, (B,) labels
            logits = self.scorer(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                 **kw)["logits"]  # (B, 1)
            loss = None if labels is None else bce_loss(logits, labels, self.loss.pos_weight)
            return ModelOutput(loss=loss, logits=logits)
        B, G, T = input_ids.shape  # groups: a query's G passages, (B, G) labels
        present = (labels != PADDED) if labels is not None else torch.ones(B, G, dtype=torch.bool,
                                                                            device=input_ids.device)
        rows = present.view(-1)  # only real passages run through the encoder

        def pick(x):
            return None if x is None else x.reshape(B * G, T)[rows]

        scored = self.scorer(pick(input_ids), attention_mask=pick(attention_mask),
                             token_type_ids=pick(token_type_ids), **kw)["logits"]  # (N, 1)
        logits = scored.new_full((B, G), PADDED_LOGIT, dtype=torch.float32)
        logits[present] = scored.view(-1).float()  # (N,) -> (B, G)
        loss = None if labels is None else LISTWISE_LOSSES[self.loss.name](logits, labels)
        return ModelOutput(loss=loss, logits=logits)

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> Path:
        return self.scorer.save_pretrained(directory, tokenizer=tokenizer)

    def load_checkpoint_state(self, state: dict, **options):
        return self.scorer.load_checkpoint_state(state, **options)
