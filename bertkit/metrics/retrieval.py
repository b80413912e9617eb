"""Embedding-model metrics as their reference tools define them: STS correlation, retrieval
(trec_eval / pytrec_eval, which BEIR reports), reranking (sentence-transformers' RerankingEvaluator),
and the chunked exact top-k search the retrieval evaluation and hard-negative mining share.

Every score is a fraction (0.3412, not 34.12).

Retrieval (`retrieval_scores`), per query, then the mean over the queries scored:
- the ranking is the run's documents sorted by score, descending; equal scores by document id,
  descending (trec_eval's order: pytrec_eval ranks {"a": 0.5, "b": 0.5} as b, a);
- a document is relevant when its qrels grade is >= 1 (trec_eval's relevance level 1); grades 0
  and below, and unjudged documents, are not;
- nDCG@k: graded, gain = the grade (0 for grades below 1), discount log2(rank + 1), the ideal from
  the query's qrels (all its relevant grades, best first, cut at k): trec_eval's ndcg_cut.k;
- MAP@k: the precision at each relevant document's rank within the top k, summed and divided by
  the query's number of relevant documents (trec_eval's map_cut.k, BEIR's MAP@k); "map" without a
  cut is trec_eval's map over the whole run;
- Recall@k = relevant in the top k / relevant in the qrels; Precision@k = relevant in the top k / k
  (k even when the run holds fewer documents); MRR@k = 1 / the rank of the first relevant
  document within the top k, 0 when none (pytrec_eval's recip_rank of the run cut at k, BEIR's
  MRR@k, sentence-transformers' MRR@k).
Which queries count: every query of the qrels with at least one relevant document. A query
without one is skipped (sentence-transformers' InformationRetrievalEvaluator skips it too;
pytrec_eval, and so BEIR, would average it in as 0 when the run holds it). A scored query absent
from the run scores 0 (pytrec_eval would drop it, which flatters a run that misses queries).
BEIR's data sets give every query a relevant document and every retriever answers every query, so
on them the figures equal BEIR's.

Reranking (`reranking_scores`): one sample is a query's positive and negative candidates'
scores; MAP is scikit-learn's average_precision_score, nDCG@k its ndcg_score (both average over
tied scores), MRR@k as above with ties ranked pessimistically (a negative tied with a positive
ranks first), which is what sentence-transformers' RerankingEvaluator computes for untied scores.
A sample with no positive or no negative is skipped, as that evaluator does.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import BertkitError
from .glue import pearson, spearman

DEFAULT_K_VALUES = (1, 10, 100)
# The keys every retrieval result carries whatever k_values asks for (the headline figures).
HEADLINE_K = (1, 10, 100)
MRR_K = 10


def sts_scores(predicted: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlation of predicted similarities with gold scores (scipy's
    pearsonr / spearmanr; 0.0 when a side is constant): {"pearson": .., "spearman": ..}."""
    if len(predicted) != len(gold):
        raise BertkitError(f"{len(predicted)} predicted scores for {len(gold)} gold scores")
    if len(gold) < 2:
        raise BertkitError(f"a correlation needs at least 2 scored pairs, got {len(gold)}")
    return {"pearson": pearson(predicted, gold), "spearman": spearman(predicted, gold)}


def ranked_documents(doc_scores: Mapping[str, float]) -> list[str]:
    """Document ids by score, descending; equal scores by id, descending (trec_eval's order)."""
    return [doc for doc, _ in sorted(doc_scores.items(), key=lambda item: (item[1], item[0]), reverse=True)]


def _discounts(n: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(n) + 2.0)


def _query_scores(ranked_grades: list[int], relevant_grades: list[int], ks: Sequence[int]) -> dict[str, float]:
    """One query's metrics from the grades of its ranked documents (0 for unjudged) and the grades
    of all its relevant documents."""
    num_relevant = len(relevant_grades)
    grades = np.asarray(ranked_grades, dtype=np.float64)
    is_relevant = grades >= 1
    gains = np.where(is_relevant, grades, 0.0)
    hits = np.cumsum(is_relevant)
    ranks = np.arange(1, len(grades) + 1)
    # precision at each rank, counted only where a relevant document sits
    precision_at_hits = np.where(is_relevant, hits / ranks, 0.0)
    first_hit = int(np.argmax(is_relevant)) + 1 if is_relevant.any() else math.inf
    ideal = np.sort(np.asarray(relevant_grades, dtype=np.float64))[::-1]
    longest = max(max(ks), len(grades))
    discount = _discounts(longest)

    scores: dict[str, float] = {"map": float(precision_at_hits.sum() / num_relevant)}
    for k in ks:
        top_hits = int(hits[min(k, len(grades)) - 1]) if len(grades) else 0
        ideal_dcg = float((ideal[:k] * discount[: min(k, len(ideal))]).sum())
        dcg = float((gains[:k] * discount[: min(k, len(gains))]).sum())
        scores[f"ndcg@{k}"] = dcg / ideal_dcg
        scores[f"map@{k}"] = float(precision_at_hits[:k].sum() / num_relevant)
        scores[f"recall@{k}"] = top_hits / num_relevant
        scores[f"precision@{k}"] = top_hits / k
        scores[f"mrr@{k}"] = 1.0 / first_hit if first_hit <= k else 0.0
    return scores


def retrieval_scores(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    k_values: Sequence[int] = DEFAULT_K_VALUES,
    *,
    ignore_identical_ids: bool = False,
) -> dict[str, float]:
    """Mean retrieval metrics of a run ({query id: {doc id: score}}) against qrels ({query id:
    {doc id: grade}}), as trec_eval defines them (the module docstring): "ndcg@k", "map@k",
    "recall@k", "precision@k", "mrr@k" for every k of k_values and of (1, 10, 100), and "map"
    (uncut). ignore_identical_ids drops a document whose id is its query's id from the run
    (BEIR's default, for corpora that hold the queries: Quora, ArguAna)."""
    ks = sorted({int(k) for k in k_values} | set(HEADLINE_K))
    if ks[0] < 1:
        raise BertkitError(f"k values must be at least 1, got {ks[0]}")
    totals: dict[str, float] = {}
    scored = 0
    for query_id, judged in qrels.items():
        relevant_grades = [int(grade) for grade in judged.values() if int(grade) >= 1]
        if not relevant_grades:
            continue
        doc_scores = dict(run.get(query_id, {}))
        if ignore_identical_ids:
            doc_scores.pop(query_id, None)
        ranked = ranked_documents(doc_scores)
        query = _query_scores([int(judged.get(doc, 0)) for doc in ranked], relevant_grades, ks)
        for name, value in query.items():
            totals[name] = totals.get(name, 0.0) + value
        scored += 1
    if scored == 0:
        raise BertkitError("no query in the qrels has a relevant document (a grade of 1 or more)")
    return {name: total / scored for name, total in sorted(totals.items(), key=lambda item: _metric_order(item[0]))}


def _metric_order(name: str) -> tuple[int, int]:
    family, _, k = name.partition("@")
    order = ("mrr", "ndcg", "map", "recall", "precision")
    return order.index(family), int(k) if k else 0


def scored_query_count(qrels: Mapping[str, Mapping[str, int]]) -> int:
    """How many queries retrieval_scores averages over (those with a relevant document)."""
    return sum(1 for judged in qrels.values() if any(int(grade) >= 1 for grade in judged.values()))


def _tie_averaged_dcg(relevance: np.ndarray, scores: np.ndarray, k: int) -> float:
    """DCG@k with tied scores sharing their mean gain (scikit-learn's ndcg_score, ignore_ties=False)."""
    discount = _discounts(len(scores))
    discount[k:] = 0.0
    order = np.argsort(-scores, kind="stable")
    sorted_scores, sorted_relevance = scores[order], relevance[order]
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    return float(sum(sorted_relevance[s:e].mean() * discount[s:e].sum() for s, e in zip(starts, ends)))


def _average_precision(relevance: np.ndarray, scores: np.ndarray) -> float:
    """scikit-learn's average_precision_score: precision at each distinct score threshold,
    weighted by the recall it adds."""
    order = np.argsort(-scores, kind="stable")
    sorted_scores, sorted_relevance = scores[order], relevance[order]
    last_of_group = np.flatnonzero(np.r_[sorted_scores[1:] != sorted_scores[:-1], True])
    true_positives = np.cumsum(sorted_relevance)[last_of_group]
    retrieved = last_of_group + 1
    added_recall = np.diff(np.r_[0.0, true_positives]) / true_positives[-1]
    return float((added_recall * true_positives / retrieved).sum())


def reranking_scores(
    samples: Sequence[tuple[Sequence[float], Sequence[float]]], at_k: int = MRR_K
) -> dict[str, float]:
    """Mean MAP, MRR@k and nDCG@k over samples of (scores of the positives, scores of the
    negatives), as sentence-transformers' RerankingEvaluator computes them (module docstring):
    {"map": .., "mrr@10": .., "ndcg@10": ..}. Samples lacking positives or negatives are skipped."""
    if at_k < 1:
        raise BertkitError(f"at_k must be at least 1, got {at_k}")
    aps, mrrs, ndcgs = [], [], []
    for positives, negatives in samples:
        if len(positives) == 0 or len(negatives) == 0:
            continue
        scores = np.asarray([*positives, *negatives], dtype=np.float64)
        relevance = np.r_[np.ones(len(positives)), np.zeros(len(negatives))]
        # pessimistic ties: among equal scores the negatives come first
        order = np.lexsort((relevance, -scores))
        hits = np.flatnonzero(relevance[order][:at_k])
        mrrs.append(1.0 / (hits[0] + 1) if len(hits) else 0.0)
        ideal = float(_discounts(min(len(positives), at_k)).sum())
        ndcgs.append(_tie_averaged_dcg(relevance, scores, at_k) / ideal)
        aps.append(_average_precision(relevance, scores))
    if not aps:
        raise BertkitError("no reranking sample has both a positive and a negative candidate")
    return {"map": float(np.mean(aps)), f"mrr@{at_k}": float(np.mean(mrrs)), f"ndcg@{at_k}": float(np.mean(ndcgs))}


SIMILARITIES = ("cosine", "dot")


def top_k_similar(
    query_embeddings: Any,
    corpus_embeddings: Any,
    k: int,
    *,
    similarity: str = "cosine",
    query_chunk_size: int = 1024,
    corpus_chunk_size: int = 16384,
    progress: Callable[[int], None] | None = None,
):
    """Exact top-k corpus rows per query row by cosine (rows normalised) or dot similarity:
    (scores (Q, k) float32, indices (Q, k) int64), best first; k is capped at the corpus size.

    Inputs are (Q, D) / (N, D) arrays or tensors of any float type (a NumPy memmap stays on disk:
    rows are read a chunk at a time). Memory is bounded by the chunks: one (query_chunk_size,
    corpus_chunk_size) similarity block and a running top-k per query chunk, merged with each
    corpus chunk's torch.topk; never the full Q x N matrix. Which of several exactly equal scores
    is kept at the k-th place is torch.topk's choice. progress(n) is called after each query chunk
    with the number of query rows it finished."""
    import torch
    import torch.nn.functional as F

    if similarity not in SIMILARITIES:
        raise BertkitError(f"similarity must be one of {', '.join(SIMILARITIES)}, got {similarity!r}")
    num_queries, num_corpus = len(query_embeddings), len(corpus_embeddings)
    if num_corpus == 0:
        raise BertkitError("the corpus is empty: nothing to search")
    if k < 1:
        raise BertkitError(f"k must be at least 1, got {k}")
    if query_chunk_size < 1 or corpus_chunk_size < 1:
        raise BertkitError("chunk sizes must be at least 1")
    k = min(k, num_corpus)

    def rows(array: Any, start: int, stop: int) -> torch.Tensor:
        block = array[start:stop]
        block = block.float() if isinstance(block, torch.Tensor) else torch.from_numpy(np.asarray(block, dtype=np.float32))
        return F.normalize(block, dim=-1) if similarity == "cosine" else block

    all_scores = torch.empty((num_queries, k), dtype=torch.float32)
    all_indices = torch.empty((num_queries, k), dtype=torch.int64)
    with torch.inference_mode():
        for q_start in range(0, num_queries, query_chunk_size):
            q_stop = min(q_start + query_chunk_size, num_queries)
            queries = rows(query_embeddings, q_start, q_stop)  # (q, D)
            best_scores = torch.empty((q_stop - q_start, 0), dtype=torch.float32)
            best_indices = torch.empty((q_stop - q_start, 0), dtype=torch.int64)
            for c_start in range(0, num_corpus, corpus_chunk_size):
                c_stop = min(c_start + corpus_chunk_size, num_corpus)
                block = queries @ rows(corpus_embeddings, c_start, c_stop).T  # (q, c)
                chunk_scores, chunk_indices = block.topk(min(k, c_stop - c_start), dim=1)
                merged_scores = torch.cat([best_scores, chunk_scores], dim=1)
                merged_indices = torch.cat([best_indices, chunk_indices + c_start], dim=1)
                best_scores, picked = merged_scores.topk(min(k, merged_scores.shape[1]), dim=1)
                best_indices = merged_indices.gather(1, picked)
            all_scores[q_start:q_stop] = best_scores
            all_indices[q_start:q_stop] = best_indices
            if progress is not None:
                progress(q_stop - q_start)
    return all_scores, all_indices
