"""`bertkit mine-hard-negatives`: for each (anchor, positive) row of a training file, the passages an
embedding model ranks closest to the anchor that are not its positive, written as a training file
for `bertkit finetune sentence-embeddings` (anchor, positive, negative_1 .. negative_N).

The selection is sentence-transformers' `mine_hard_negatives` (util/hard_negatives.py):
- the corpus is the given passages plus every positive, de-duplicated (file order); an anchor
  repeated over rows is one query whose positives are all those rows' positives;
- candidates are each query's top range_max + (most positives of a query) + 1 corpus passages by
  cosine similarity (exact search in chunks, metrics.retrieval.top_k_similar), optionally
  re-scored by a cross-encoder (its scores, as CrossEncoder.predict gives them, replace the
  cosine for the candidates and the positives);
- a candidate is dropped when it is one of the query's positives or the query's own text, when its
  score is above max_score or below min_score, or within absolute_margin of (or relative_margin x
  |score| below) the query's lowest positive score;
- the survivors, best first, from rank range_min up to range_max: the first num_negatives
  ("top"), or num_negatives drawn at random from them ("random", seeded);
- n-tuple output drops a row that got fewer than num_negatives negatives; triplet output writes
  one (anchor, positive, negative) row per negative found.
range_max defaults as there: range_min + num_negatives (+ the most positives of a query), times 10
for the negatives when a margin or max_score may drop candidates.

Memory: the corpus and query embeddings in memory as float32 ((N + Q) x D x 4 bytes: 1M passages
and 1M anchors of a 384-wide model are 3 GB; float16 with embedding_dtype halves that), the
candidates (Q x (range_max + extra)), never a Q x N matrix: the search holds one
(query chunk x corpus chunk) block at a time. Measured at 1M passages of a 384-wide model
(benchmarks/results/mine_hard_negatives_scale.md): a peak of 3.2 GiB in float32, 2.5 GiB in
float16, growing by the embedding row and the text of each passage.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import flags
from ..device import add_precision_argument
from ..errors import BertkitError, counted
from ..metrics.retrieval import top_k_similar
from ..outputs import check_output, output_stream
from ..tables import TableWriter

log = logging.getLogger("bertkit")

OUTPUT_FORMATS = ("n-tuple", "triplet")
SAMPLING = ("top", "random")


@dataclasses.dataclass(frozen=True)
class MiningOptions:
    """The choice of negatives (sentence-transformers' mine_hard_negatives arguments, same names)."""

    num_negatives: int = 3
    range_min: int = 0
    range_max: int | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    max_score: float | None = None
    min_score: float | None = None
    sampling_strategy: str = "top"
    seed: int = 0

    def __post_init__(self):
        if self.num_negatives < 1:
            raise BertkitError(f"num_negatives must be at least 1, got {self.num_negatives}")
        if self.range_min < 0:
            raise BertkitError(f"range_min must be 0 or more, got {self.range_min}")
        if self.range_max is not None and self.range_max < self.range_min + self.num_negatives:
            raise BertkitError(f"range_max ({self.range_max}) must leave room for {self.num_negatives} negatives "
                               f"after range_min ({self.range_min})")
        if self.sampling_strategy not in SAMPLING:
            raise BertkitError(f"sampling_strategy must be one of {', '.join(SAMPLING)}, not {self.sampling_strategy!r}")

    def candidate_range(self, max_positives: int) -> int:
        if self.range_max is not None:
            return self.range_max
        filtered = any(v is not None for v in (self.absolute_margin, self.relative_margin, self.max_score))
        return self.range_min + self.num_negatives * (10 if filtered else 1) + max_positives


@dataclasses.dataclass
class MiningProblem:
    """The rows as unique queries over one de-duplicated corpus (indices into `corpus`)."""

    queries: list[str]
    corpus: list[str]
    positives: list[list[int]]  # per query, its positives' corpus indices
    row_query: list[int]  # per input row, its query
    row_positive: list[int]  # per input row, its positive's corpus index
    query_in_corpus: list[int]  # per query, the corpus index of its own text, -1 when not there


def mining_problem(anchors: Sequence[str], positives: Sequence[str], corpus: Sequence[str] = ()) -> MiningProblem:
    if len(anchors) != len(positives):
        raise ValueError(f"{len(anchors)} anchors for {len(positives)} positives")
    # One text -> index dict for the whole corpus, built once here (at 1M passages it is ~60 MB)
    corpus_index: dict[str, int] = {}
    for text in itertools.chain(corpus, positives):
        corpus_index.setdefault(text, len(corpus_index))
    texts = list(corpus_index)
    query_texts = list(dict.fromkeys(anchors))
    query_index = {text: i for i, text in enumerate(query_texts)}
    query_positives: list[list[int]] = [[] for _ in query_texts]
    for anchor, positive in zip(anchors, positives):
        own = query_positives[query_index[anchor]]
        if corpus_index[positive] not in own:
            own.append(corpus_index[positive])
    return MiningProblem(query_texts, texts, query_positives, [query_index[a] for a in anchors],
                         [corpus_index[p] for p in positives], [corpus_index.get(q, -1) for q in query_texts])


@dataclasses.dataclass
class MinedNegatives:
    """Per query, its negatives' corpus indices and scores, best first (maybe fewer than asked)."""

    problem: MiningProblem
    negatives: list[list[int]]
    scores: list[list[float]]
    positive_scores: list[list[float]]  # per query, its positives' scores (problem.positives' order)
    dropped: dict[str, int]  # candidates dropped, by rule
    num_negatives: int = 3  # how many were asked for


def choose_negatives(problem: MiningProblem, candidate_scores: np.ndarray, candidate_indices: np.ndarray,
                     positive_scores: Sequence[Sequence[float]], options: MiningOptions) -> MinedNegatives:
    """The selection rules of the module docstring on each query's candidates ((Q, C) scores and
    corpus indices, any order)."""
    rng = random.Random(options.seed)
    range_max = options.candidate_range(max(map(len, problem.positives)))
    dropped = {"positive": 0, "max_score": 0, "min_score": 0, "absolute_margin": 0, "relative_margin": 0}
    negatives, scores = [], []
    for q in range(len(problem.queries)):
        excluded = set(problem.positives[q])
        if problem.query_in_corpus[q] >= 0:
            excluded.add(problem.query_in_corpus[q])
        lowest_positive = min(positive_scores[q])
        kept: list[tuple[float, int]] = []
        for score, index in zip(candidate_scores[q].tolist(), candidate_indices[q].tolist()):
            if index in excluded:
                dropped["positive"] += 1
            elif options.absolute_margin is not None and score + options.absolute_margin > lowest_positive:
                dropped["absolute_margin"] += 1
            elif options.relative_margin is not None and \
                    score > lowest_positive - abs(lowest_positive) * options.relative_margin:
                dropped["relative_margin"] += 1
            elif options.max_score is not None and score > options.max_score:
                dropped["max_score"] += 1
            elif options.min_score is not None and score < options.min_score:
                dropped["min_score"] += 1
            else:
                kept.append((score, index))
        kept.sort(key=lambda pair: -pair[0])  # stable: equal scores keep the search's order
        window = kept[options.range_min:range_max]
        if options.sampling_strategy == "random" and len(window) > options.num_negatives:
            window = sorted(rng.sample(window, options.num_negatives), key=lambda pair: -pair[0])
        chosen = window[:options.num_negatives]
        negatives.append([index for _, index in chosen])
        scores.append([score for score, _ in chosen])
    return MinedNegatives(problem, negatives, scores, [list(s) for s in positive_scores], dropped,
                          options.num_negatives)


def mine_hard_negatives(anchors: Sequence[str], positives: Sequence[str], embed: Callable[[list[str], str], np.ndarray],
                        corpus: Sequence[str] = (), options: MiningOptions = MiningOptions(),
                        rescore: Callable[[list[str], list[str]], np.ndarray] | None = None,
                        progress: bool | None = None) -> MinedNegatives:
    """Hard negatives for (anchor, positive) rows. `embed(texts, what)` returns their (N, D)
    embeddings (what: "corpus" or "queries"); `rescore(queries, passages)` a cross-encoder's
    score per pair, when given."""
    from tqdm import tqdm

    problem = mining_problem(anchors, positives, corpus)
    max_positives = max(map(len, problem.positives))
    candidates = min(options.candidate_range(max_positives) + max_positives + 1, len(problem.corpus))
    corpus_embeddings = embed(problem.corpus, "corpus")
    query_embeddings = embed(problem.queries, "queries")
    bar = tqdm(total=len(problem.queries), desc="search", unit=" queries", file=sys.stderr,
               disable=(not sys.stderr.isatty()) if progress is None else not progress)
    scores, indices = top_k_similar(query_embeddings, corpus_embeddings, candidates, progress=bar.update)
    bar.close()
    scores, indices = scores.numpy().astype(np.float64), indices.numpy()
    if rescore is None:
        positive_scores = [[_cosine(query_embeddings[q], corpus_embeddings[p]) for p in problem.positives[q]]
                           for q in range(len(problem.queries))]
    else:
        flat_queries = [problem.queries[q] for q in range(len(problem.queries)) for _ in range(indices.shape[1])]
        flat_passages = [problem.corpus[i] for i in indices.reshape(-1).tolist()]
        scores = np.asarray(rescore(flat_queries, flat_passages), dtype=np.float64).reshape(indices.shape)
        pairs = [(q, p) for q in range(len(problem.queries)) for p in problem.positives[q]]
        flat = rescore([problem.queries[q] for q, _ in pairs], [problem.corpus[p] for _, p in pairs]).tolist()
        positive_scores, offset = [], 0
        for q in range(len(problem.queries)):
            positive_scores.append(flat[offset:offset + len(problem.positives[q])])
            offset += len(problem.positives[q])
    return choose_negatives(problem, scores, indices, positive_scores, options)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))


def training_rows(mined: MinedNegatives, output_format: str = "n-tuple") -> tuple[list[int], list[list[str]]]:
    """(the input rows kept, their text rows): (anchor, positive, negative_1..N) per input row that
    got num_negatives negatives, or one (anchor, positive, negative) per negative."""
    problem = mined.problem
    kept, rows = [], []
    for row, (q, p) in enumerate(zip(problem.row_query, problem.row_positive)):
        texts = [problem.corpus[i] for i in mined.negatives[q]]
        head = [problem.queries[q], problem.corpus[p]]
        if output_format == "triplet":
            rows.extend([*head, negative] for negative in texts)
            kept.extend([row] * len(texts))
        elif len(texts) == mined.num_negatives:
            rows.append([*head, *texts])
            kept.append(row)
    return kept, rows


# ---------------------------------------------------------------- files


def read_pairs(path: str | Path, anchor_column: str | None = None, positive_column: str | None = None,
               fmt: str | None = None) -> tuple[list[str], list[str], tuple[str, str]]:
    """(anchors, positives, (anchor column, positive column)) of a CSV / TSV / JSON lines file; the
    columns default to the first two in file order (sentence-transformers' convention)."""
    from .examples import BadRows
    from .user_files import read_table, text_problem, text_value

    path = Path(path)
    header, rows = read_table(path, BadRows(path, skip=False), fmt)
    rows = list(rows)
    names = header if header is not None else (list(rows[0][1]) if rows else [])
    if anchor_column is None or positive_column is None:
        if len(names) < 2:
            raise BertkitError("expected at least two columns (anchor, positive)", path=str(path), line=1)
        anchor_column = anchor_column or names[0]
        positive_column = positive_column or next(n for n in names if n != anchor_column)
    if header is not None:
        for column in (anchor_column, positive_column):
            if column not in header:
                raise BertkitError(f"no column {column!r}; the columns are {', '.join(header)}", path=str(path), line=1)
    anchors, positives = [], []
    for line, row in rows:
        for column, out in ((anchor_column, anchors), (positive_column, positives)):
            text = text_value(row, column)
            if text is None:
                raise BertkitError(text_problem(row, column), path=str(path), line=line)
            out.append(text)
    if not anchors:
        raise BertkitError("no (anchor, positive) rows", path=str(path))
    return anchors, positives, (anchor_column, positive_column)


def read_corpus(path: str | Path, column: str | None = None) -> list[str]:
    """Passages: a .txt file (one per line, blank lines skipped) or a table's `column` (default
    "text" when there is one, else the first column; BEIR's corpus.jsonl: title + " " + text)."""
    from .examples import BadRows
    from .multiple_choice import read_utf8
    from .user_files import read_table, text_problem

    path = Path(path)
    if path.suffix.lower() == ".txt":
        if not path.is_file():
            raise BertkitError("corpus file not found", path=str(path))
        passages = [line.strip() for line in read_utf8(path).splitlines() if line.strip()]
    else:
        header, rows = read_table(path, BadRows(path, skip=False))
        passages = []
        for line, row in rows:
            name = column or ("text" if "text" in row else next(iter(row), None))
            value = row.get(name)
            if not isinstance(value, str) or not value.strip():
                raise BertkitError(text_problem(row, name), path=str(path), line=line)
            title = row.get("title") if column is None and name == "text" else None
            passages.append(f"{title} {value}".strip() if isinstance(title, str) and title else value)
    if not passages:
        raise BertkitError("no passages", path=str(path))
    return passages


def write_training_file(path: str | Path, fmt: str, columns: list[str], rows: list[list[str]]) -> None:
    import json

    with output_stream(path) as out:
        if fmt == "jsonl":
            for row in rows:
                out.write(json.dumps(dict(zip(columns, row)), ensure_ascii=False) + "\n")
            return
        writer = TableWriter(out, fmt)
        writer.writerow(columns)
        for row in rows:
            writer.writerow(row)


# ---------------------------------------------------------------- the command


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="the embedding model that ranks the passages")
    parser.add_argument("--train-file", required=True, help="CSV / TSV / JSON lines of (anchor, positive) rows")
    parser.add_argument("--anchor-column", default=None, help="default: the first column")
    parser.add_argument("--positive-column", default=None, help="default: the second column")
    parser.add_argument("--corpus", default=None,
                        help="passages to mine from, besides the positives (.txt one per line, or a table's "
                             "--corpus-column); default: the train file's positives only")
    parser.add_argument("--corpus-column", default=None, help="default: 'text' (with 'title' before it), else the first")
    parser.add_argument("--output", required=True, help="the training file written (.csv, .tsv or .jsonl)")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--output-format", choices=OUTPUT_FORMATS, default="n-tuple",
                        help="n-tuple: anchor, positive, negative_1..N (rows short of N dropped); "
                             "triplet: one anchor, positive, negative row per negative")
    parser.add_argument("--num-negatives", type=flags.positive_int, default=3)
    parser.add_argument("--range-min", type=flags.non_negative_int, default=0,
                        help="skip the closest candidates up to this rank (possible unlabelled positives)")
    parser.add_argument("--range-max", type=flags.positive_int, default=None,
                        help="consider candidates up to this rank (default: enough for the negatives)")
    parser.add_argument("--margin", type=flags.finite_float, default=None, dest="absolute_margin",
                        help="keep a negative only when its score is at least this far below the positive's")
    parser.add_argument("--relative-margin", type=flags.finite_float, default=None,
                        help="keep a negative only when it is this fraction of |positive score| below it")
    parser.add_argument("--max-score", type=flags.finite_float, default=None, help="drop candidates scoring above this")
    parser.add_argument("--min-score", type=flags.finite_float, default=None, help="drop candidates scoring below this")
    parser.add_argument("--sampling", choices=SAMPLING, default="top", dest="sampling_strategy",
                        help="top: the best N of the range; random: N drawn from it")
    parser.add_argument("--seed", type=flags.seed, default=0, help="--sampling random's draw")
    parser.add_argument("--cross-encoder", default=None,
                        help="a cross-encoder folder that re-scores the candidates and positives")
    parser.add_argument("--embedding-dtype", choices=("float32", "float16"), default="float32",
                        help="how the embeddings are held in memory (float16: half the memory)")
    parser.add_argument("--max-batch-tokens", type=flags.positive_int, default=16384)
    parser.add_argument("--device", type=flags.device, default="auto")
    add_precision_argument(parser)


def run_from_args(args) -> int:
    from ..inference.corpus_embeddings import embed_texts, require_cross_encoder, score_pairs
    from ..inference.engine import InferenceEngine

    fmt = check_output(args.output, [args.train_file, args.corpus], args.overwrite, formats=("csv", "tsv", "jsonl"))
    options = MiningOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(MiningOptions)})
    anchors, positives, columns = read_pairs(args.train_file, args.anchor_column, args.positive_column)
    corpus = read_corpus(args.corpus, args.corpus_column) if args.corpus else ()
    engine = InferenceEngine(args.model, args.device, args.precision, args.max_batch_tokens)
    dtype = np.float16 if args.embedding_dtype == "float16" else np.float32

    def embed(texts: list[str], what: str) -> np.ndarray:
        out = np.empty((len(texts), engine.config.hidden_size), dtype=dtype)
        return embed_texts(engine, texts, out=out, normalize=True, desc=what)

    rescore = None
    if args.cross_encoder:
        cross_encoder = InferenceEngine(args.cross_encoder, args.device, args.precision, args.max_batch_tokens)
        require_cross_encoder(cross_encoder)

        def cross_encoder_scores(queries, passages):
            return score_pairs(cross_encoder, queries, passages, desc="cross-encoder")

        rescore = cross_encoder_scores

    mined = mine_hard_negatives(anchors, positives, embed, corpus, options, rescore)
    kept, rows = training_rows(mined, args.output_format)
    if not rows:  # refused before anything is written: an empty training file helps nobody
        found = summary(mined, kept, len(anchors), args.output_format, options)
        raise BertkitError(f"no row found {options.num_negatives} negatives ({found}): raise --range-max, lower "
                           "--num-negatives or loosen --margin / --max-score", path=args.train_file)
    names = list(columns) + (["negative"] if args.output_format == "triplet"
                             else [f"negative_{i + 1}" for i in range(options.num_negatives)])
    write_training_file(args.output, fmt, names, rows)
    log.info(summary(mined, kept, len(anchors), args.output_format, options))
    return 0


def summary(mined: MinedNegatives, kept: list[int], num_rows: int, output_format: str, options: MiningOptions) -> str:
    negative_scores = [s for scores in mined.scores for s in scores]
    positive_scores = [s for scores in mined.positive_scores for s in scores]
    short = sum(1 for n in mined.negatives if len(n) < options.num_negatives)
    dropped = ", ".join(f"{n:,} by {rule.replace('_', ' ')}" for rule, n in mined.dropped.items() if n)
    text = (f"mined {counted(len(negative_scores), 'negative')} for {counted(len(mined.problem.queries), 'query', 'queries')} "
            f"over {counted(len(mined.problem.corpus), 'passage')}; mean score positive "
            f"{np.mean(positive_scores):.4f}, negative {np.mean(negative_scores) if negative_scores else float('nan'):.4f}; "
            f"{counted(len(kept), output_format + ' row')} written")
    if short:
        text += f"; {counted(short, 'query', 'queries')} found fewer than {options.num_negatives} negatives"
        if output_format == "n-tuple":
            text += f" ({counted(num_rows - len(kept), 'row')} left out)"
    return text + (f"; candidates dropped: {dropped}" if dropped else "")


__all__ = ["MiningOptions", "MinedNegatives", "mine_hard_negatives", "choose_negatives", "mining_problem",
           "training_rows", "read_pairs", "read_corpus"]
