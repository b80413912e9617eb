"""BertConfig: the paper's §3 presets, config.json round trips, and compatibility with transformers' reader."""

import json

import pytest
import torch
import transformers

from bertkit import BertConfig, BertkitError, BertModel

# Paper §3 and Turc et al. 2019: (layers, hidden, heads).
SPEC_SIZES = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
    "3-768-12": (3, 768, 12),
    "6-768-3": (6, 768, 3),
    "6-768-12": (6, 768, 12),
    "12-768-12": (12, 768, 12),
    "12-1024-16": (12, 1024, 16),
    "24-1024-16": (24, 1024, 16),
}


@pytest.mark.parametrize("name", SPEC_SIZES)
def test_preset_has_spec_sizes(name):
    config = BertConfig.preset(name)
    layers, hidden, heads = SPEC_SIZES[name]
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden
    # The paper's defaults, unless overridden.
    assert config.hidden_act == "gelu"
    assert config.hidden_dropout_prob == config.attention_probs_dropout_prob == 0.1
    assert config.layer_norm_eps == 1e-12
    assert config.max_position_embeddings == 512
    assert config.vocab_size == 30522


def analytic_bert_model_params(L, H, V=30522, P=512, types=2):
    """Hand count of BertModel (with pooler): embeddings, L layers, pooler."""
    embeddings = V * H + P * H + types * H + 2 * H  # three tables + LayerNorm
    attention = 4 * (H * H + H) + 2 * H  # q, k, v, output projections + LayerNorm
    feed_forward = (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * H  # H -> 4H -> H + LayerNorm
    pooler = H * H + H
    return embeddings + L * (attention + feed_forward) + pooler


@pytest.mark.parametrize("name, paper_millions", [("base", 110), ("large", 335)])
def test_parameter_count_matches_paper(name, paper_millions):
    config = BertConfig.preset(name)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = BertModel(config)
    count = model.num_parameters()
    assert count == analytic_bert_model_params(config.num_hidden_layers, config.hidden_size)
    assert abs(count / 1e6 - paper_millions) < 1.5, count


def test_preset_overrides_and_unknown_name():
    config = BertConfig.preset("mini", vocab_size=1000, is_decoder=True)
    assert (config.vocab_size, config.is_decoder, config.hidden_size) == (1000, True, 256)
    with pytest.raises(BertkitError, match="unknown model size 'huge'"):
        BertConfig.preset("huge")


def test_heads_must_divide_hidden_size():
    with pytest.raises(BertkitError, match="not a multiple of num_attention_heads"):
        BertConfig(hidden_size=100, num_attention_heads=3)


def test_config_json_round_trip(tmp_path):
    config = BertConfig.preset(
        "tiny", vocab_size=777, id2label={0: "neg", 1: "neu", 2: "pos"}, classifier_dropout=0.2,
        is_decoder=True, hidden_act="relu", layer_norm_eps=1e-7, problem_type="single_label_classification",
        architectures=["BertForSequenceClassification"],
    )
    config.extra["my_note"] = {"a": [1, 2]}
    config.save(tmp_path)
    again = BertConfig.from_json_file(tmp_path / "config.json")
    assert again == config
    assert again.extra == {"my_note": {"a": [1, 2]}}
    assert again.num_labels == 3 and again.label2id == {"neg": 0, "neu": 1, "pos": 2}
    assert BertConfig.from_name_or_file(str(tmp_path)) == config


@pytest.mark.parametrize("route", ["config.json", "to_dict"])
def test_transformers_reads_our_config(tmp_path, route):
    config = BertConfig.preset("mini", vocab_size=500, id2label={0: "no", 1: "yes", 2: "maybe"},
                               is_decoder=True, classifier_dropout=0.3, type_vocab_size=3)
    if route == "config.json":
        config.save(tmp_path)
        theirs = transformers.BertConfig.from_pretrained(tmp_path)
    else:
        theirs = transformers.BertConfig(**config.to_dict())
    for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                  "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout",
                  "is_decoder", "num_labels"):
        assert getattr(theirs, field) == getattr(config, field), field
    assert theirs.id2label == {0: "no", 1: "yes", 2: "maybe"}


def test_we_read_transformers_config(tmp_path):
    theirs = transformers.BertConfig(vocab_size=321, hidden_size=96, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=200, hidden_act="gelu_new", num_labels=4, is_decoder=True)
    theirs.save_pretrained(tmp_path)
    ours = BertConfig.from_json_file(tmp_path / "config.json")
    assert (ours.vocab_size, ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads,
            ours.intermediate_size, ours.hidden_act, ours.num_labels, ours.is_decoder) == (
        321, 96, 3, 4, 200, "gelu_new", 4, True)
    # Fields we do not model (use_cache, transformers_version, ...) survive a save.
    written = json.loads((tmp_path / "config.json").read_text())
    out = tmp_path / "again"
    out.mkdir()
    ours.save(out)
    rewritten = json.loads((out / "config.json").read_text())
    for key in ("use_cache", "transformers_version", "add_cross_attention", "bos_token_id"):
        assert rewritten[key] == written[key], key


def test_unknown_fields_preserved(tmp_path):
    d = BertConfig.preset("tiny").to_dict()
    d.update({"gradient_checkpointing": False, "_name_or_path": "someone/model", "custom": {"x": [1, 2.5]}})
    (tmp_path / "config.json").write_text(json.dumps(d))
    config = BertConfig.from_json_file(tmp_path / "config.json")
    assert config.extra == {"gradient_checkpointing": False, "_name_or_path": "someone/model", "custom": {"x": [1, 2.5]}}
    out = tmp_path / "out"
    out.mkdir()
    config.save(out)
    assert json.loads((out / "config.json").read_text()) == {**d, "position_embedding_type": "absolute",
                                                             "tie_word_embeddings": True}


def test_num_labels_override_replaces_stale_label_names():
    config = BertConfig.preset("tiny", id2label={0: "a", 1: "b"})
    assert config.num_labels == 2
    five = config.replace(num_labels=5)
    assert five.num_labels == 5 and five.id2label is None
    named = config.replace(id2label={0: "x", 1: "y", 2: "z"})
    assert named.num_labels == 3
    assert config.replace(num_labels=2).id2label == {0: "a", 1: "b"}


def test_from_name_or_file_applies_overrides(tmp_path):
    BertConfig.preset("tiny", id2label={0: "a", 1: "b"}).save(tmp_path)
    config = BertConfig.from_name_or_file(str(tmp_path), num_labels=3, hidden_dropout_prob=0.0)
    assert config.num_labels == 3 and config.hidden_dropout_prob == 0.0 and config.hidden_size == 128


@pytest.mark.parametrize("content, problem", [
    ({"model_type": "roberta"}, "model_type is 'roberta'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
    ({"hidden_size": 100, "num_attention_heads": 3}, "not a multiple"),
])
def test_bad_config_field_names_the_file(tmp_path, content, problem):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BertConfig.preset("tiny").to_dict(), **content}))
    with pytest.raises(BertkitError, match=problem) as err:
        BertConfig.from_json_file(path)
    assert err.value.path == str(path)
    assert str(err.value).startswith(str(path) + ": ")


@pytest.mark.parametrize("text, problem", [("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object"),
                                           ("", "not valid JSON")])
def test_unreadable_config_names_the_file(tmp_path, text, problem):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(BertkitError, match=problem) as err:
        BertConfig.from_json_file(path)
    assert err.value.path == str(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(BertkitError, match="config file not found") as err:
        BertConfig.from_name_or_file(str(tmp_path))
    assert err.value.path == str(tmp_path / "config.json")
