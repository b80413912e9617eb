"""bertkit.metrics.retrieval against independent implementations: pytrec_eval (trec_eval, what BEIR
reports), sentence-transformers' InformationRetrievalEvaluator / RerankingEvaluator computations,
scikit-learn, scipy and ST's EmbeddingSimilarityEvaluator; plus hand-worked cases."""

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import pytrec_eval
import torch
from scipy import stats
from sklearn.metrics import average_precision_score, ndcg_score

from bertkit.errors import BertkitError
from bertkit.metrics.retrieval import (
    ranked_documents,
    reranking_scores,
    retrieval_scores,
    sts_scores,
    top_k_similar,
)

K_VALUES = (1, 3, 10, 100)


def random_collection(seed, queries=40, docs=150, tie_digits=None):
    """Graded qrels (0..3, some zero-graded judgments, some unjudged retrieved docs) and a run."""
    rng = random.Random(seed)
    doc_ids = [f"d{i}" for i in range(docs)]
    qrels, run = {}, {}
    for q in range(queries):
        qid = f"q{q}"
        judged = rng.sample(doc_ids, rng.randint(1, 12))
        qrels[qid] = {d: rng.choice([0, 1, 1, 2, 3]) for d in judged}
        if not any(g >= 1 for g in qrels[qid].values()):
            qrels[qid][judged[0]] = 1
        retrieved = rng.sample(doc_ids, rng.randint(5, docs))
        run[qid] = {d: round(rng.random(), tie_digits) if tie_digits else rng.random() for d in retrieved}
    return qrels, run


def pytrec_reference(qrels, run, ks):
    cuts = ",".join(str(k) for k in ks)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{cuts}", f"map_cut.{cuts}", f"recall.{cuts}",
                                                       f"P.{cuts}", "map"})
    per_query = evaluator.evaluate(run)
    assert len(per_query) == len(qrels)
    mean = lambda key: float(np.mean([scores[key] for scores in per_query.values()]))  # noqa: E731
    expected = {"map": mean("map")}
    for k in ks:
        expected[f"ndcg@{k}"] = mean(f"ndcg_cut_{k}")
        expected[f"map@{k}"] = mean(f"map_cut_{k}")
        expected[f"recall@{k}"] = mean(f"recall_{k}")
        expected[f"precision@{k}"] = mean(f"P_{k}")
        # MRR@k: trec_eval's reciprocal rank of the run cut at k, in trec_eval's own order
        cut = {qid: {d: run[qid][d] for d in ranked_documents(run[qid])[:k]} for qid in run}
        rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(cut)
        expected[f"mrr@{k}"] = float(np.mean([scores["recip_rank"] for scores in rr.values()]))
    return expected


@pytest.mark.parametrize("seed, tie_digits", [(0, None), (1, None), (2, 1), (3, 2)])
def test_retrieval_scores_equal_pytrec_eval(seed, tie_digits):
    """Graded relevance, zero-graded judgments, unjudged documents and (tie_digits) many tied scores,
    which trec_eval breaks by document id, descending."""
    qrels, run = random_collection(seed, tie_digits=tie_digits)
    ours = retrieval_scores(run, qrels, K_VALUES)
    expected = pytrec_reference(qrels, run, K_VALUES)
    for key, value in expected.items():
        assert ours[key] == pytest.approx(value, abs=1e-12), key


def test_ties_follow_trec_eval_order():
    """Equal scores rank by document id, descending: pytrec_eval ranks c, b, a."""
    run = {"q": {"a": 0.5, "b": 0.5, "c": 0.5}}
    assert ranked_documents(run["q"]) == ["c", "b", "a"]
    qrels = {"q": {"a": 1}}
    ours = retrieval_scores(run, qrels)
    reference = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "P.1"}).evaluate(run)["q"]
    assert ours["mrr@10"] == pytest.approx(reference["recip_rank"]) == pytest.approx(1 / 3)
    assert ours["precision@1"] == reference["P_1"] == 0.0


def test_hand_worked_graded_query():
    """Ranking d (grade 0), c (grade 1), b (grade 2), with e (grade 3) never retrieved.
    DCG = 1/log2(3) + 2/log2(4); ideal DCG = 3 + 2/log2(3) + 1/log2(4)."""
    run = {"q": {"d": 3.0, "c": 2.0, "b": 1.0}}
    qrels = {"q": {"b": 2, "c": 1, "d": 0, "e": 3}}
    ours = retrieval_scores(run, qrels)
    dcg = 1 / math.log2(3) + 2 / math.log2(4)
    ideal = 3 + 2 / math.log2(3) + 1 / math.log2(4)
    assert ours["ndcg@10"] == pytest.approx(dcg / ideal)
    assert ours["mrr@10"] == pytest.approx(1 / 2)
    assert ours["recall@1"] == 0.0 and ours["recall@10"] == pytest.approx(2 / 3)
    assert ours["precision@1"] == 0.0 and ours["precision@10"] == pytest.approx(2 / 10)
    assert ours["map@100"] == pytest.approx((1 / 2 + 2 / 3) / 3)  # divided by all 3 relevant documents


def test_queries_without_relevant_documents_are_skipped_missing_runs_score_zero():
    qrels = {"hit": {"a": 1}, "unanswerable": {"b": 0}, "not-retrieved": {"c": 1}}
    run = {"hit": {"a": 1.0, "x": 0.5}, "unanswerable": {"b": 1.0}}
    ours = retrieval_scores(run, qrels)
    assert ours["mrr@10"] == pytest.approx(0.5)  # (1 + 0) / 2: the unanswerable query is not averaged in
    assert ours["recall@100"] == pytest.approx(0.5)
    with pytest.raises(BertkitError, match="no query"):
        retrieval_scores(run, {"q": {"a": 0}})


def test_ignore_identical_ids_drops_the_query_itself():
    run = {"q1": {"q1": 1.0, "d": 0.5}}
    qrels = {"q1": {"d": 1}}
    assert retrieval_scores(run, qrels)["mrr@10"] == pytest.approx(0.5)
    assert retrieval_scores(run, qrels, ignore_identical_ids=True)["mrr@10"] == pytest.approx(1.0)


def test_retrieval_scores_equal_sentence_transformers_information_retrieval_evaluator():
    """ST's own metric code on the same ranked lists (binary relevance, distinct scores, at most
    10 relevant documents so its MAP@100 denominator min(k, R) equals trec_eval's R)."""
    from sentence_transformers.sentence_transformer.evaluation.information_retrieval import (
        InformationRetrievalEvaluator,
    )

    qrels, run = random_collection(7, queries=30, docs=300)
    relevant = {qid: {d for d, g in judged.items() if g >= 1} for qid, judged in qrels.items()}
    binary = {qid: {d: 1 for d in docs} for qid, docs in relevant.items()}
    evaluator = InformationRetrievalEvaluator(
        queries={qid: qid for qid in qrels}, corpus={"d0": "d0"}, relevant_docs=relevant,
        mrr_at_k=[1, 10, 100], ndcg_at_k=[1, 10, 100], accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100],
        map_at_k=[100], write_csv=False)
    top = {qid: ranked_documents(run[qid])[:100] for qid in evaluator.queries_ids}
    results = [[{"corpus_id": d, "score": run[qid][d]} for d in top[qid]] for qid in evaluator.queries_ids]
    reference = evaluator.compute_metrics(results)
    ours = retrieval_scores(run, binary)
    for k in (1, 10, 100):
        assert ours[f"mrr@{k}"] == pytest.approx(reference["mrr@k"][k], abs=1e-12)
        assert ours[f"ndcg@{k}"] == pytest.approx(reference["ndcg@k"][k], abs=1e-12)
        assert ours[f"recall@{k}"] == pytest.approx(reference["recall@k"][k], abs=1e-12)
        assert ours[f"precision@{k}"] == pytest.approx(reference["precision@k"][k], abs=1e-12)
    assert ours["map@100"] == pytest.approx(reference["map@k"][100], abs=1e-12)


def test_sts_scores_equal_scipy_and_sentence_transformers():
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    gold = rng.uniform(0, 5, size=50)
    cosine = (first * second).sum(1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
    ours = sts_scores(cosine.tolist(), gold.tolist())
    assert ours["pearson"] == pytest.approx(stats.pearsonr(cosine, gold).statistic, abs=1e-12)
    assert ours["spearman"] == pytest.approx(stats.spearmanr(cosine, gold).statistic, abs=1e-12)

    class FixedEmbeddings:
        """The least of a model ST's evaluator needs: encode() looks the texts' vectors up."""
        similarity_fn_name = "cosine"
        model_card_data = SimpleNamespace(set_evaluation_metrics=lambda *args: None)

        def __init__(self):
            self.table = {f"a{i}": first[i] for i in range(50)} | {f"b{i}": second[i] for i in range(50)}

        def encode(self, sentences, **kwargs):
            return np.stack([self.table[s] for s in sentences]).astype(np.float32)

    evaluator = EmbeddingSimilarityEvaluator([f"a{i}" for i in range(50)], [f"b{i}" for i in range(50)],
                                             gold.tolist(), main_similarity="cosine", write_csv=False)
    reference = evaluator(FixedEmbeddings())
    assert ours["pearson"] == pytest.approx(reference["pearson_cosine"], abs=1e-6)
    assert ours["spearman"] == pytest.approx(reference["spearman_cosine"], abs=1e-6)


def st_reranking_reference(samples, at_k=10):
    """sentence-transformers' RerankingEvaluator's per-sample computation (reranking.py)."""
    maps, mrrs, ndcgs = [], [], []
    for positives, negatives in samples:
        if not positives or not negatives:
            continue
        scores = torch.tensor([*positives, *negatives])
        is_relevant = [1] * len(positives) + [0] * len(negatives)
        mrr = 0
        for rank, index in enumerate(torch.argsort(-scores)[:at_k]):
            if is_relevant[index]:
                mrr = 1 / (rank + 1)
                break
        mrrs.append(mrr)
        ndcgs.append(ndcg_score([is_relevant], [scores.tolist()], k=at_k))
        maps.append(average_precision_score(is_relevant, scores.tolist()))
    return {"map": np.mean(maps), "mrr@10": np.mean(mrrs), "ndcg@10": np.mean(ndcgs)}


def test_reranking_scores_equal_sentence_transformers_and_sklearn():
    rng = np.random.default_rng(1)
    samples = [(rng.normal(0.3, 1, rng.integers(1, 4)).tolist(), rng.normal(0, 1, rng.integers(1, 30)).tolist())
               for _ in range(60)]
    samples += [([], [0.1, 0.2]), ([0.3], [])]  # skipped, as ST skips them
    ours = reranking_scores(samples)
    reference = st_reranking_reference(samples)
    for key in ("map", "mrr@10", "ndcg@10"):
        assert ours[key] == pytest.approx(reference[key], abs=1e-12), key


def test_reranking_ties_average_like_sklearn_and_rank_pessimistically_for_mrr():
    samples = [([0.5, 0.2], [0.5, 0.5, 0.1]), ([1.0], [1.0])]
    ours = reranking_scores(samples)
    relevance = [[1, 1, 0, 0, 0], [1, 0]]
    scores = [[0.5, 0.2, 0.5, 0.5, 0.1], [1.0, 1.0]]
    assert ours["map"] == pytest.approx(np.mean([average_precision_score(r, s) for r, s in zip(relevance, scores)]))
    assert ours["ndcg@10"] == pytest.approx(np.mean([ndcg_score([r], [s], k=10) for r, s in zip(relevance, scores)]))
    assert ours["mrr@10"] == pytest.approx((1 / 3 + 1 / 2) / 2)  # the tied negatives rank first


def test_top_k_similar_equals_brute_force_in_small_chunks():
    generator = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(37, 16, generator=generator), torch.randn(501, 16, generator=generator)
    for similarity in ("cosine", "dot"):
        if similarity == "cosine":
            full = torch.nn.functional.normalize(queries, dim=1) @ torch.nn.functional.normalize(corpus, dim=1).T
        else:
            full = queries @ corpus.T
        expected_scores, expected_indices = full.topk(20, dim=1)
        scores, indices = top_k_similar(queries.numpy(), corpus, 20, similarity=similarity,
                                        query_chunk_size=8, corpus_chunk_size=64)
        assert torch.equal(indices, expected_indices), similarity
        torch.testing.assert_close(scores, expected_scores, rtol=0, atol=1e-5)


def test_top_k_similar_caps_k_and_reads_memmaps(tmp_path):
    corpus = np.lib.format.open_memmap(tmp_path / "corpus.npy", mode="w+", dtype=np.float16, shape=(5, 4))
    corpus[:] = np.eye(5, 4, dtype=np.float16) + 0.01
    scores, indices = top_k_similar(np.eye(2, 4, dtype=np.float32), corpus, k=10, corpus_chunk_size=2)
    assert scores.shape == indices.shape == (2, 5)
    assert indices[:, 0].tolist() == [0, 1]
    with pytest.raises(BertkitError, match="similarity"):
        top_k_similar(corpus, corpus, 1, similarity="l2")


def test_top_k_similar_holds_one_block_and_reads_one_corpus_chunk_at_a_time():
    """Every tensor the search makes is at most one (query chunk x corpus chunk) block (the (Q, k)
    results aside), and the corpus is read a chunk of rows at a time, so a memmap stays on disk."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorded(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.shapes.extend(tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out])
                               if isinstance(t, torch.Tensor))
            return out

    class Rows:  # an array-like corpus that records the rows asked of it
        def __init__(self, array):
            self.array, self.reads = array, []

        def __len__(self):
            return len(self.array)

        def __getitem__(self, rows):
            self.reads.append(rows.stop - rows.start)
            return self.array[rows]

    generator = np.random.default_rng(0)
    queries, corpus = generator.standard_normal((40, 4), dtype=np.float32), generator.standard_normal((300, 4),
                                                                                                      dtype=np.float32)
    expected = top_k_similar(queries, corpus, 5)[1]
    rows, recorded = Rows(corpus), Recorded()
    with recorded:
        scores, indices = top_k_similar(queries, rows, 5, query_chunk_size=8, corpus_chunk_size=32)
    assert torch.equal(indices, expected)
    assert max(rows.reads) == 32 and sum(rows.reads) == 5 * 300  # each query chunk reads the corpus once
    assert (8, 32) in recorded.shapes
    too_big = [shape for shape in recorded.shapes if shape != (40, 5) and math.prod(shape) > 8 * 32]
    assert not too_big, f"tensors beyond one block: {too_big}"
