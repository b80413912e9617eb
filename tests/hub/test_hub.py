"""Checkpoints in the Hugging Face layout: round trips through transformers, loading across classes
(with transformers' own loading report as the reference), and bad checkpoints."""

import json
import logging
import struct

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertkit
from bertkit import BertConfig, BertkitError, load_model

ALL_CLASSES = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
               "BertForQuestionAnswering", "BertForTokenClassification", "BertForMultipleChoice"]
TIED_IN_TRANSFORMERS = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}


# These tensors are tiny: extra intra-op threads only spin-wait (~10x slower on a shared 2-core machine).
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def tiny_config(**overrides):
    return BertConfig.preset("tiny", vocab_size=120, max_position_embeddings=32, **overrides)


def build(class_name, config=None, seed=0):
    torch.manual_seed(seed)
    model = getattr(bertkit, class_name)(config or tiny_config())
    with torch.no_grad():  # non-zero biases, non-unit LayerNorms: every tensor distinguishable
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def example_batch(class_name, vocab_size=120):
    g = torch.Generator().manual_seed(5)
    shape = (2, 3, 9) if class_name == "BertForMultipleChoice" else (3, 9)
    input_ids = torch.randint(1, vocab_size, shape, generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[..., 0, 6:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[..., 4:] = 1
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask,
            "token_type_ids": token_type_ids * attention_mask}


def outputs(model, batch):
    with torch.no_grad():
        return {k: v for k, v in model(**batch).items() if isinstance(v, torch.Tensor)}


def no_problems(info):
    return not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"))


@pytest.mark.parametrize("class_name", ALL_CLASSES)
def test_round_trip_through_transformers(class_name, tmp_path):
    ours = build(class_name, tiny_config(num_labels=3 if class_name != "BertForQuestionAnswering" else 2))
    batch = example_batch(class_name)
    ours.save_pretrained(tmp_path / "ours")
    saved = sorted(p.name for p in (tmp_path / "ours").iterdir())
    assert saved == ["README.md", "config.json", "model.safetensors"]  # the model card; no temp files

    theirs, info = getattr(transformers, class_name).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert no_problems(info), info
    theirs.eval()
    mine_out, their_out = outputs(ours, batch), outputs(theirs, batch)
    assert their_out
    for key, value in their_out.items():
        torch.testing.assert_close(mine_out[key], value, atol=1e-5, rtol=0)

    theirs.save_pretrained(tmp_path / "theirs")
    back = getattr(bertkit, class_name).from_pretrained(tmp_path / "theirs").eval()
    assert back.loading_info == {"missing_keys": [], "unexpected_keys": []}
    assert type(load_model(tmp_path / "theirs")) is type(ours)  # architectures picks the class
    original = ours.state_dict()
    assert set(back.state_dict()) == set(original)
    for key, tensor in back.state_dict().items():
        assert torch.equal(tensor, original[key]), key
    for key, value in outputs(back, batch).items():
        assert torch.equal(value, mine_out[key]), key
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "num_labels", "max_position_embeddings", "layer_norm_eps", "is_decoder"):
        assert getattr(back.config, field) == getattr(ours.config, field), field


def test_decoder_checkpoint_from_transformers_loads_as_ltr_model(tmp_path):
    """transformers' BertLMHeadModel (is_decoder) is our BertForMaskedLM with a causal config."""
    config = transformers.BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, max_position_embeddings=32, is_decoder=True)
    torch.manual_seed(0)
    theirs = transformers.BertLMHeadModel(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = load_model(tmp_path).eval()
    assert type(ours) is bertkit.BertForMaskedLM and ours.config.is_decoder
    assert ours.loading_info == {"missing_keys": [], "unexpected_keys": []}
    batch = example_batch("BertForMaskedLM")
    torch.testing.assert_close(outputs(ours, batch)["logits"], outputs(theirs, batch)["logits"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("source", ["BertForPreTraining", "BertModel", "BertForSequenceClassification"])
@pytest.mark.parametrize("target", ["BertModel", "BertForPreTraining", "BertForMaskedLM",
                                    "BertForSequenceClassification", "BertForQuestionAnswering"])
def test_loading_across_classes_reports_what_transformers_reports(source, target, tmp_path):
    build(source).save_pretrained(tmp_path)
    ours = getattr(bertkit, target).from_pretrained(tmp_path)
    _, theirs = getattr(transformers, target).from_pretrained(tmp_path, output_loading_info=True)
    assert set(ours.loading_info["missing_keys"]) == set(theirs["missing_keys"]) - TIED_IN_TRANSFORMERS
    assert set(ours.loading_info["unexpected_keys"]) == set(theirs["unexpected_keys"])


def encoder_state(model):
    encoder = model if isinstance(model, bertkit.BertModel) else model.bert
    return {k: v for k, v in encoder.state_dict().items() if not k.startswith("pooler.")}


def test_pretraining_checkpoint_into_base_model(tmp_path):
    pretrained = build("BertForPreTraining")
    pretrained.save_pretrained(tmp_path)
    base = bertkit.BertModel.from_pretrained(tmp_path).eval()
    assert base.loading_info["missing_keys"] == []
    assert all(k.startswith("cls.") for k in base.loading_info["unexpected_keys"])
    batch = example_batch("BertModel")
    with torch.no_grad():
        expected = pretrained.bert(**batch)
        got = base(**batch)
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(got.pooler_output, expected.pooler_output)


def test_pretraining_checkpoint_into_classifier_reports_once(tmp_path, caplog):
    pretrained = build("BertForPreTraining")
    pretrained.save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="bertkit"):
        classifier = bertkit.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    reports = [r for r in caplog.records if r.name == "bertkit" and r.levelno >= logging.INFO]
    assert len(reports) == 1
    # A new head is announced as transformers does (a warning: train it before predicting), in one line.
    assert reports[0].levelno == logging.WARNING
    message = reports[0].getMessage()
    assert "\n" not in message and "train this model on a task" in message
    assert "newly initialised" in message and "classifier.weight" in message and "classifier.bias" in message
    assert "cls.seq_relationship.weight" in message and "cls.predictions.bias" in message
    assert str(tmp_path / "model.safetensors") in message
    assert classifier.loading_info["missing_keys"] == ["classifier.bias", "classifier.weight"]
    assert classifier.classifier.weight.shape == (4, 128)
    # Encoder and pooler come from the checkpoint; the new head is freshly initialised (N(0, 0.02), as the released BERT).
    for key, tensor in pretrained.bert.state_dict().items():
        assert torch.equal(classifier.bert.state_dict()[key], tensor), key
    assert torch.all(classifier.classifier.bias == 0)
    assert 0 < classifier.classifier.weight.abs().max() <= 0.04


def test_missing_encoder_weights_are_an_error_unless_allowed(tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    build("BertModel").save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["encoder.layer.0.output.dense.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(BertkitError, match="no weights for encoder.layer.0.output.dense.weight.*--allow-missing-weights"):
        bertkit.BertModel.from_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="bertkit"):
        bertkit.BertModel.from_pretrained(tmp_path, allow_missing_weights=True)
    warnings = [r for r in caplog.records if r.name == "bertkit" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "encoder.layer.0.output.dense.weight" in warnings[0].getMessage()


@pytest.mark.parametrize("target", ["BertForSequenceClassification", "BertForQuestionAnswering",
                                    "BertForTokenClassification", "BertForMultipleChoice", "BertForPreTraining"])
def test_base_model_checkpoint_into_head_model(target, tmp_path):
    base = build("BertModel")
    base.save_pretrained(tmp_path)
    head = getattr(bertkit, target).from_pretrained(tmp_path)
    loaded = encoder_state(head)
    for key, tensor in encoder_state(base).items():
        assert torch.equal(loaded[key], tensor), key
    own_head_keys = {k for k in head.state_dict() if not k.startswith("bert.")}
    assert set(head.loading_info["missing_keys"]) == own_head_keys
    if head.bert.pooler is not None:
        assert torch.equal(head.bert.pooler.dense.weight, base.pooler.dense.weight)


def test_transformers_base_checkpoint_into_token_classifier(tmp_path):
    """transformers saves BertModel without the `bert.` prefix; it must still land in our encoder."""
    torch.manual_seed(1)
    theirs = transformers.BertModel(transformers.BertConfig(
        vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=100,
        max_position_embeddings=32)).eval()
    theirs.save_pretrained(tmp_path)
    assert not any(k.startswith("bert.") for k in load_file(tmp_path / "model.safetensors"))
    tagger = bertkit.BertForTokenClassification.from_pretrained(tmp_path, num_labels=5).eval()
    assert tagger.loading_info["missing_keys"] == ["classifier.bias", "classifier.weight"]
    batch = example_batch("BertModel")
    with torch.no_grad():
        torch.testing.assert_close(tagger.bert(**batch).last_hidden_state, theirs(**batch).last_hidden_state,
                                   atol=1e-5, rtol=0)


def test_legacy_checkpoint_names(tmp_path):
    """Old checkpoints: LayerNorm gamma/beta, an explicit tied decoder matrix, position_ids buffers."""
    model = build("BertForPreTraining")
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    legacy = {}
    for key, tensor in state.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        legacy[key] = tensor
    legacy["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    legacy["bert.embeddings.position_ids"] = torch.arange(32)[None]
    save_file(legacy, tmp_path / "model.safetensors")
    loaded = bertkit.BertForPreTraining.from_pretrained(tmp_path)
    assert loaded.loading_info == {"missing_keys": [], "unexpected_keys": []}
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key


def test_num_labels_override_is_not_silently_ignored(tmp_path):
    classifier = build("BertForSequenceClassification", tiny_config(id2label={0: "a", 1: "b", 2: "c"}))
    classifier.save_pretrained(tmp_path)
    assert bertkit.BertForSequenceClassification.from_pretrained(tmp_path).config.label2id == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(BertkitError) as err:
        bertkit.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    message = str(err.value)
    assert ("classifier.bias" in message and "(3,)" in message and "(5,)" in message) or \
        ("classifier.weight" in message and "(3, 128)" in message and "(5, 128)" in message), message
    # Into the encoder alone the old head is simply unused.
    assert bertkit.BertModel.from_pretrained(tmp_path, num_labels=5).loading_info["unexpected_keys"] == [
        "classifier.bias", "classifier.weight"]


def test_save_records_architecture_and_config(tmp_path):
    model = build("BertForTokenClassification", tiny_config(id2label={0: "O", 1: "B-PER", 2: "I-PER"}))
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["BertForTokenClassification"]
    assert written["id2label"] == {"0": "O", "1": "B-PER", "2": "I-PER"}
    assert transformers.AutoConfig.from_pretrained(tmp_path).label2id == {"O": 0, "B-PER": 1, "I-PER": 2}
    assert load_file(tmp_path / "model.safetensors").keys() == model.state_dict().keys()


# ---- bad checkpoints -------------------------------------------------------------------------


@pytest.fixture
def saved_tiny(tmp_path):
    directory = tmp_path / "model"
    build("BertForPreTraining").save_pretrained(directory)
    return directory


def _garbage_header(data: bytes) -> bytes:
    # A plausible header length followed by bytes that are not JSON.
    return struct.pack("<Q", 64) + b"{this is not json" + b"\0" * 100


@pytest.mark.parametrize("corrupt", [
    lambda data: data[: len(data) // 2],  # truncated download
    lambda data: b"\x8f\x13garbage bytes" * 50,
    lambda data: b"",
    _garbage_header,
], ids=["truncated", "garbage", "empty", "bad-header"])
def test_corrupt_safetensors_names_the_file(saved_tiny, corrupt):
    weights = saved_tiny / "model.safetensors"
    weights.write_bytes(corrupt(weights.read_bytes()))
    with pytest.raises(BertkitError, match="cannot read safetensors") as err:
        bertkit.BertForPreTraining.from_pretrained(saved_tiny)
    assert err.value.path == str(weights)


def test_vocab_size_mismatch_names_tensor_and_shapes(saved_tiny):
    config = json.loads((saved_tiny / "config.json").read_text())
    config["vocab_size"] = 150
    (saved_tiny / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError) as err:
        bertkit.BertForPreTraining.from_pretrained(saved_tiny)
    message = str(err.value)
    assert err.value.path == str(saved_tiny / "model.safetensors")
    assert "bert.embeddings.word_embeddings.weight" in message
    assert "(120, 128)" in message and "(150, 128)" in message


def test_missing_directory(tmp_path):
    with pytest.raises(BertkitError, match="model directory not found") as err:
        bertkit.BertModel.from_pretrained(tmp_path / "nope")
    assert err.value.path == str(tmp_path / "nope")


def test_missing_config_json(saved_tiny):
    (saved_tiny / "config.json").unlink()
    with pytest.raises(BertkitError, match="config file not found") as err:
        bertkit.BertModel.from_pretrained(saved_tiny)
    assert err.value.path == str(saved_tiny / "config.json")
    with pytest.raises(BertkitError, match="config file not found"):
        load_model(saved_tiny)


def test_only_pickled_weights_load_as_tensors(saved_tiny, caplog):
    """A folder with only pytorch_model.bin (transformers' older format) loads through
    torch.load(weights_only=True), with a one-line note; the weights equal the safetensors ones."""
    reference = bertkit.BertForPreTraining.from_pretrained(saved_tiny).state_dict()
    state = load_file(saved_tiny / "model.safetensors")
    (saved_tiny / "model.safetensors").unlink()
    torch.save(state, saved_tiny / "pytorch_model.bin")
    with caplog.at_level(logging.INFO, logger="bertkit"):
        loaded = bertkit.BertForPreTraining.from_pretrained(saved_tiny).state_dict()
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)
    assert any("weights_only=True" in r.getMessage() for r in caplog.records)


class _RunsCode:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


def test_pickled_weights_that_hold_code_are_refused(saved_tiny, capsys):
    (saved_tiny / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": _RunsCode()}, saved_tiny / "pytorch_model.bin")
    with pytest.raises(BertkitError, match="cannot read pytorch_model.bin as plain tensors") as err:
        bertkit.BertForPreTraining.from_pretrained(saved_tiny)
    assert err.value.path == str(saved_tiny / "pytorch_model.bin")
    assert "unpickled code ran" not in capsys.readouterr().out


def test_other_pickles_are_not_read(saved_tiny):
    (saved_tiny / "model.safetensors").unlink()
    torch.save({}, saved_tiny / "weights.pt")
    with pytest.raises(BertkitError, match=r"no model\.safetensors .*weights\.pt.*convert") as err:
        bertkit.BertForPreTraining.from_pretrained(saved_tiny)
    assert err.value.path == str(saved_tiny)


def test_not_a_bert_checkpoint(saved_tiny):
    config = json.loads((saved_tiny / "config.json").read_text())
    config["model_type"] = "roberta"
    (saved_tiny / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match="model_type is 'roberta', not 'bert'") as err:
        bertkit.BertModel.from_pretrained(saved_tiny)
    assert err.value.path == str(saved_tiny / "config.json")


def test_unknown_architecture(saved_tiny):
    config = json.loads((saved_tiny / "config.json").read_text())
    config["architectures"] = ["BertForNextSentencePrediction"]
    (saved_tiny / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match="'BertForNextSentencePrediction' is not a bertkit class") as err:
        load_model(saved_tiny)
    assert err.value.path == str(saved_tiny / "config.json")
