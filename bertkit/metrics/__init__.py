"""Evaluation metrics with their official definitions: GLUE, SQuAD v1.1/v2.0, conlleval, perplexity.

GLUE and CoNLL scores are fractions (0..1); the SQuAD evaluators return percentages, as the
official scripts print them. SWAG (multiple choice) is scored with `accuracy`.
"""

from __future__ import annotations

import math

from .conll import conll_chunks, evaluate_conll, evaluate_conll_file
from .glue import (
    TASK_METRICS,
    accuracy,
    compute_glue_metrics,
    f1,
    glue_score,
    matthews_correlation,
    pearson,
    spearman,
    task_score,
)
from .squad import (
    best_null_threshold,
    evaluate_squad,
    evaluate_v1,
    evaluate_v2,
    exact_match_score,
    exact_match_score_v2,
    f1_score,
    f1_score_v2,
    normalize_answer,
)

# exp(100) ~ 2.7e43 is far beyond any real model (a uniform guess over a 30k vocabulary has
# perplexity 30k); capping keeps a diverged run's loss from overflowing to an error.
MAX_LOG_PERPLEXITY = 100.0


def perplexity(mean_loss: float) -> float:
    """Masked-LM perplexity: exp(mean cross-entropy in nats), with the loss capped at
    MAX_LOG_PERPLEXITY so huge losses give a large finite number; NaN stays NaN."""
    loss = float(mean_loss)
    if math.isnan(loss):
        return loss
    return math.exp(min(loss, MAX_LOG_PERPLEXITY))


__all__ = [
    "TASK_METRICS", "accuracy", "f1", "matthews_correlation", "pearson", "spearman",
    "compute_glue_metrics", "task_score", "glue_score",
    "normalize_answer", "exact_match_score", "f1_score", "exact_match_score_v2", "f1_score_v2",
    "evaluate_v1", "evaluate_v2", "evaluate_squad", "best_null_threshold",
    "conll_chunks", "evaluate_conll", "evaluate_conll_file",
    "perplexity", "MAX_LOG_PERPLEXITY",
]
