"""`bertkit evaluate sts | retrieval | reranking`: an embedding model or a cross-encoder scored as
sentence-transformers' evaluators and BEIR score them (the definitions: metrics/retrieval.py).

- sts: Pearson and Spearman of the cosine similarity of each pair's embeddings against its gold
  score (EmbeddingSimilarityEvaluator), on a CSV / TSV / JSON lines file (GLUE's STS-B TSV as is:
  sentence1, sentence2, score).
- retrieval: exact search of every query over the whole corpus (cosine, or dot), the top 100 kept,
  then trec_eval's nDCG / MAP / recall / precision and MRR (BEIR's numbers) on BEIR's layout
  (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), or on the SQuAD retrieval set: the questions of a
  SQuAD file against all its distinct paragraphs, a question's own paragraph its one relevant
  document (v1.1 dev: 10,570 questions, 2,067 paragraphs).
- reranking: JSON lines of {"query", "positive": [...], "negative": [...]} (RerankingEvaluator's
  samples); an embedding model ranks by cosine, a cross-encoder (a one-label classification head)
  by its score of each (query, candidate) pair.
Each prints one JSON document (or writes it to --output) and a one-line summary on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Sequence

from .. import flags
from ..device import DEFAULT_PRECISION, add_precision_argument, precision_label
from ..errors import BertkitError, counted
from ..metrics.retrieval import (
    DEFAULT_K_VALUES,
    SIMILARITIES,
    reranking_scores,
    retrieval_scores,
    scored_query_count,
    sts_scores,
    top_k_similar,
)
from ..outputs import check_output, output_stream
from .examples import BadRows
from .user_files import read_table, read_text_file, text_problem, text_value

log = logging.getLogger("bertkit")


@dataclasses.dataclass
class RetrievalSet:
    """A corpus, queries and graded judgments, as BEIR holds them (ids are strings)."""

    corpus: dict[str, str]  # doc id -> text (BEIR: title + " " + text)
    queries: dict[str, str]  # query id -> text
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: grade}
    name: str = ""


def _engine(model: str, device: str, precision: str, max_batch_tokens: int):
    from ..inference.engine import InferenceEngine  # torch: loaded when a command runs, not for --help

    engine = InferenceEngine(model, device, precision, max_batch_tokens)
    log.info(f"model {model} ({type(engine.model).__name__}) on {precision_label(engine.device, engine.precision)}")
    return engine


# ---------------------------------------------------------------- STS


def read_sts_file(path: str | Path, sentence1_column: str = "sentence1", sentence2_column: str = "sentence2",
                  score_column: str = "score", fmt: str | None = None) -> tuple[list[str], list[str], list[float]]:
    """(first texts, second texts, gold scores) of a scored-pairs table."""
    examples = read_text_file(path, sentence1_column, score_column, sentence2_column, fmt=fmt)
    gold = []
    for example in examples:
        try:
            gold.append(float(example.label))
        except ValueError:
            raise BertkitError(f"the score {example.label!r} in {score_column!r} is not a number",
                               path=str(path), line=example.line) from None
    return [e.text_a for e in examples], [e.text_b for e in examples], gold


def evaluate_sts(model: str, data_file: str | Path, *, sentence1_column: str = "sentence1",
                 sentence2_column: str = "sentence2", score_column: str = "score", fmt: str | None = None,
                 device: str = "auto", precision: str = DEFAULT_PRECISION, max_batch_tokens: int = 16384,
                 progress: bool | None = None) -> dict:
    """{"metrics": {"pearson", "spearman"}, "pairs": N, ...}: the correlations of cosine similarity."""
    import numpy as np

    from ..inference.corpus_embeddings import embed_texts

    first, second, gold = read_sts_file(data_file, sentence1_column, sentence2_column, score_column, fmt)
    engine = _engine(model, device, precision, max_batch_tokens)
    started = time.perf_counter()
    a = embed_texts(engine, first, normalize=True, desc="sentence1", progress=progress)
    b = embed_texts(engine, second, normalize=True, desc="sentence2", progress=progress)
    cosine = (a.astype(np.float64) * b).sum(axis=1)
    return {"task": "sts", "model": str(model), "data": str(data_file), "pairs": len(gold),
            "similarity": "cosine", "metrics": sts_scores(cosine.tolist(), gold),
            "seconds": round(time.perf_counter() - started, 2)}


# ---------------------------------------------------------------- retrieval


def _jsonl_texts(path: Path, what: str, with_title: bool) -> dict[str, str]:
    bad = BadRows(path, skip=False)
    _, rows = read_table(path, bad, "jsonl")
    texts: dict[str, str] = {}
    for line, row in rows:
        row_id = row.get("_id")
        if not isinstance(row_id, (str, int)) or isinstance(row_id, bool) or str(row_id) == "":
            raise BertkitError(f"a {what} needs an '_id' (a string)", path=str(path), line=line)
        text = row.get("text")
        if not isinstance(text, str):
            raise BertkitError(text_problem(row, "text"), path=str(path), line=line)
        if with_title:
            title = row.get("title")
            if title is not None and not isinstance(title, str):
                raise BertkitError(f"'title' must be a string, not {type(title).__name__}", path=str(path), line=line)
            text = f"{title or ''} {text}".strip()  # BEIR's SentenceBERT: title + " " + text
        if str(row_id) in texts:
            raise BertkitError(f"a second {what} with _id {row_id!r}", path=str(path), line=line)
        texts[str(row_id)] = text
    if not texts:
        raise BertkitError(f"no {what}s", path=str(path))
    return texts


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR's qrels TSV: a header, then query-id, corpus-id, score (an integer grade)."""
    if not path.is_file():
        raise BertkitError("qrels file not found", path=str(path))
    header, rows = read_table(path, BadRows(path, skip=False), "tsv")
    if len(header) < 3:
        raise BertkitError(f"expected 3 columns (query-id, corpus-id, score), found {', '.join(header)}",
                           path=str(path), line=1)
    qrels: dict[str, dict[str, int]] = {}
    for line, row in rows:
        query_id, doc_id, grade = (row[column] for column in header[:3])
        try:
            qrels.setdefault(query_id, {})[doc_id] = int(grade)
        except ValueError:
            raise BertkitError(f"the score {grade!r} is not an integer", path=str(path), line=line) from None
    if not qrels:
        raise BertkitError("no judgments", path=str(path))
    return qrels


def read_beir(data_dir: str | Path, split: str = "test") -> RetrievalSet:
    """A BEIR data set folder: corpus.jsonl (_id, title, text), queries.jsonl (_id, text),
    qrels/SPLIT.tsv. Only the queries the qrels judge are kept (BEIR's loader does the same)."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise BertkitError("BEIR data folder not found", path=str(folder))
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    corpus = _jsonl_texts(folder / "corpus.jsonl", "document", with_title=True)
    queries = _jsonl_texts(folder / "queries.jsonl", "query", with_title=False)
    missing = [query_id for query_id in qrels if query_id not in queries]
    if missing:
        raise BertkitError(f"{counted(len(missing), 'judged query', 'judged queries')} missing from queries.jsonl "
                           f"(the first: {missing[0]!r})", path=str(folder / "qrels" / f"{split}.tsv"))
    return RetrievalSet(corpus, {q: queries[q] for q in qrels}, qrels, name=f"{folder.name}/{split}")


def squad_retrieval_set(path: str | Path) -> RetrievalSet:
    """The questions of a SQuAD file against all its distinct paragraphs; each question's own
    paragraph is its one relevant document (grade 1). v2.0's unanswerable questions are left out.
    Paragraph ids are p00000, p00001, ... in file order; query ids the SQuAD question ids."""
    from .squad_windows import read_squad

    data = read_squad(path)
    paragraph_ids: dict[str, str] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for example in data.examples:
        doc_id = paragraph_ids.setdefault(example.context, f"p{len(paragraph_ids):05d}")
        if example.is_impossible:
            continue
        queries[example.qid] = example.question
        qrels[example.qid] = {doc_id: 1}
    if not queries:
        raise BertkitError("no answerable questions", path=str(path))
    return RetrievalSet({doc_id: text for text, doc_id in paragraph_ids.items()}, queries, qrels,
                        name=f"squad-retrieval:{Path(path).name}")


def retrieve(engine, retrieval_set: RetrievalSet, top_k: int = max(DEFAULT_K_VALUES), similarity: str = "cosine",
             progress: bool | None = None) -> dict[str, dict[str, float]]:
    """Every query's top_k documents by exact search over the whole corpus: {query id: {doc id: score}}."""
    from ..inference.corpus_embeddings import embed_texts

    doc_ids, query_ids = list(retrieval_set.corpus), list(retrieval_set.queries)
    corpus = embed_texts(engine, [retrieval_set.corpus[d] for d in doc_ids], desc="corpus", progress=progress)
    queries = embed_texts(engine, [retrieval_set.queries[q] for q in query_ids], desc="queries", progress=progress)
    scores, indices = top_k_similar(queries, corpus, top_k, similarity=similarity)
    return {query_id: {doc_ids[i]: s for i, s in zip(row_indices.tolist(), row_scores.tolist())}
            for query_id, row_scores, row_indices in zip(query_ids, scores, indices)}


def evaluate_retrieval(model: str, retrieval_set: RetrievalSet, *, k_values: Sequence[int] = DEFAULT_K_VALUES,
                       similarity: str = "cosine", ignore_identical_ids: bool = True, device: str = "auto",
                       precision: str = DEFAULT_PRECISION, max_batch_tokens: int = 16384,
                       progress: bool | None = None) -> dict:
    """{"metrics": {"mrr@10", "ndcg@10", "map@100", "recall@1", ...}, counts, seconds}: exact
    search of the whole corpus, the top max(k_values) kept, scored as trec_eval scores (BEIR)."""
    engine = _engine(model, device, precision, max_batch_tokens)
    started = time.perf_counter()
    run = retrieve(engine, retrieval_set, max(max(k_values), max(DEFAULT_K_VALUES)), similarity, progress)
    metrics = retrieval_scores(run, retrieval_set.qrels, k_values, ignore_identical_ids=ignore_identical_ids)
    return {"task": "retrieval", "model": str(model), "data": retrieval_set.name,
            "queries": scored_query_count(retrieval_set.qrels), "corpus": len(retrieval_set.corpus),
            "similarity": similarity, "metrics": metrics, "seconds": round(time.perf_counter() - started, 2)}


# ---------------------------------------------------------------- reranking


@dataclasses.dataclass
class RerankingSample:
    query: str
    positive: list[str]
    negative: list[str]
    line: int = 0


def read_reranking_file(path: str | Path) -> list[RerankingSample]:
    """JSON lines of {"query": str, "positive": [str, ...], "negative": [str, ...]} (a lone string
    is a list of one, as sentence-transformers' evaluators take it)."""
    path = Path(path)
    _, rows = read_table(path, BadRows(path, skip=False), "jsonl")
    samples = []
    for line, row in rows:
        query = text_value(row, "query")
        if query is None:
            raise BertkitError(text_problem(row, "query"), path=str(path), line=line)
        lists = {}
        for field in ("positive", "negative"):
            value = row.get(field, [])
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise BertkitError(f"{field!r} must be a list of strings", path=str(path), line=line)
            lists[field] = value
        samples.append(RerankingSample(query, lists["positive"], lists["negative"], line))
    if not samples:
        raise BertkitError("no samples", path=str(path))
    return samples


def evaluate_reranking(model: str, data_file: str | Path, *, at_k: int = 10, device: str = "auto",
                       precision: str = DEFAULT_PRECISION, max_batch_tokens: int = 16384,
                       progress: bool | None = None) -> dict:
    """{"metrics": {"map", "mrr@10", "ndcg@10"}, ...}: each query's candidates ranked by the model
    (a cross-encoder's pair scores, or an embedding model's cosine)."""
    import numpy as np

    from ..inference.corpus_embeddings import embed_texts, is_cross_encoder, score_pairs

    samples = read_reranking_file(data_file)
    engine = _engine(model, device, precision, max_batch_tokens)
    started = time.perf_counter()
    candidates = [(s.query, text) for s in samples for text in (*s.positive, *s.negative)]
    if is_cross_encoder(engine):
        scorer = "cross-encoder"
        flat = score_pairs(engine, [q for q, _ in candidates], [c for _, c in candidates], progress=progress)
    else:
        scorer = "cosine"
        queries = embed_texts(engine, [s.query for s in samples], normalize=True, desc="queries", progress=progress)
        documents = embed_texts(engine, [c for _, c in candidates], normalize=True, desc="candidates",
                                progress=progress)
        owner = np.repeat(np.arange(len(samples)), [len(s.positive) + len(s.negative) for s in samples])
        flat = (queries[owner].astype(np.float64) * documents).sum(axis=1)
    scored, offset = [], 0
    for s in samples:
        scored.append((flat[offset:offset + len(s.positive)].tolist(),
                       flat[offset + len(s.positive):offset + len(s.positive) + len(s.negative)].tolist()))
        offset += len(s.positive) + len(s.negative)
    used = sum(1 for p, n in scored if p and n)
    return {"task": "reranking", "model": str(model), "data": str(data_file), "samples": used,
            "skipped": len(samples) - used, "scorer": scorer, "metrics": reranking_scores(scored, at_k),
            "seconds": round(time.perf_counter() - started, 2)}


# ---------------------------------------------------------------- the command line


def _model_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="a model folder (sentence-transformers or bertkit)")
    parser.add_argument("--output", default="-", help="the JSON result (default: standard output)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.add_argument("--max-batch-tokens", type=flags.positive_int, default=16384,
                        help="padded tokens per forward pass")
    parser.add_argument("--device", type=flags.device, default="auto")
    add_precision_argument(parser)


def _report(args, document: dict) -> int:
    with output_stream(args.output) as out:
        out.write(json.dumps(document, indent=2) + "\n")
    metrics = document["metrics"]
    log.info(f"{document['task']}: " + ", ".join(f"{name} {value:.4f}" for name, value in metrics.items()
                                                 if "@" not in name or name in HEADLINE)
             + f" ({document['seconds']:.1f} s)")
    return 0


HEADLINE = ("mrr@10", "ndcg@10", "map@100", "recall@1", "recall@10", "recall@100")


def _check_output(args, inputs: Sequence) -> None:
    check_output(args.output, [p for p in inputs if p is not None], args.overwrite)


class Sts:
    """Spearman and Pearson of cosine similarity against gold scores (STS-B, or your own scored pairs)"""

    @staticmethod
    def add_evaluate_arguments(parser) -> None:
        parser.add_argument("--data", required=True, help="CSV / TSV / JSON lines of scored pairs (GLUE's STS-B TSV)")
        parser.add_argument("--sentence1-column", default="sentence1")
        parser.add_argument("--sentence2-column", default="sentence2")
        parser.add_argument("--score-column", default="score")
        parser.add_argument("--format", choices=("csv", "tsv", "jsonl"), default=None,
                            help="the data file's format (default: from its extension)")
        _model_arguments(parser)

    @staticmethod
    def run_evaluate(args) -> int:
        _check_output(args, [args.data])
        return _report(args, evaluate_sts(args.model, args.data, sentence1_column=args.sentence1_column,
                                          sentence2_column=args.sentence2_column, score_column=args.score_column,
                                          fmt=args.format, device=args.device, precision=args.precision,
                                          max_batch_tokens=args.max_batch_tokens))


class Retrieval:
    """MRR@10, nDCG@10, Recall@1/10/100, MAP@100 (trec_eval, as BEIR) on a BEIR folder or a SQuAD file"""

    @staticmethod
    def add_evaluate_arguments(parser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--data", help="a BEIR data set folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv")
        source.add_argument("--squad", help="a SQuAD JSON file: its questions against all its paragraphs "
                                            "(dev-v1.1.json: 10,570 questions, 2,067 paragraphs)")
        parser.add_argument("--split", default="test", help="--data: the qrels file qrels/SPLIT.tsv (default test)")
        parser.add_argument("--similarity", choices=SIMILARITIES, default="cosine")
        parser.add_argument("--k", type=flags.positive_int, nargs="+", default=list(DEFAULT_K_VALUES),
                            help="cut-offs for nDCG, MAP, recall, precision, MRR (1, 10, 100 always reported)")
        parser.add_argument("--keep-identical-ids", action="store_true",
                            help="keep a document whose id is the query's id (BEIR drops it by default)")
        _model_arguments(parser)

    @staticmethod
    def run_evaluate(args) -> int:
        _check_output(args, [args.squad])
        retrieval_set = squad_retrieval_set(args.squad) if args.squad else read_beir(args.data, args.split)
        document = evaluate_retrieval(args.model, retrieval_set, k_values=args.k, similarity=args.similarity,
                                      ignore_identical_ids=not args.keep_identical_ids, device=args.device,
                                      precision=args.precision, max_batch_tokens=args.max_batch_tokens)
        return _report(args, document)


class Reranking:
    """MAP, MRR@10, nDCG@10 of a cross-encoder or embedding model reranking each query's candidates"""

    @staticmethod
    def add_evaluate_arguments(parser) -> None:
        parser.add_argument("--data", required=True,
                            help='JSON lines: {"query": ..., "positive": [...], "negative": [...]}')
        parser.add_argument("--at-k", type=flags.positive_int, default=10, help="the cut-off of MRR and nDCG")
        _model_arguments(parser)

    @staticmethod
    def run_evaluate(args) -> int:
        _check_output(args, [args.data])
        return _report(args, evaluate_reranking(args.model, args.data, at_k=args.at_k, device=args.device,
                                                precision=args.precision, max_batch_tokens=args.max_batch_tokens))


# `bertkit evaluate NAME` for evaluators that are not a fine-tuning task (tasks/cli.py lists them)
EVALUATORS = {"sts": Sts, "retrieval": Retrieval, "reranking": Reranking}

__all__ = ["RetrievalSet", "read_beir", "read_qrels", "squad_retrieval_set", "retrieve", "evaluate_retrieval",
           "read_sts_file", "evaluate_sts", "read_reranking_file", "evaluate_reranking", "EVALUATORS"]
