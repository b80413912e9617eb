"""Original TensorFlow checkpoints: the bundle reader, the variable map and `bertkit convert`.

The fixtures in tests/fixtures/tf/ were written by real TensorFlow (make_tf_checkpoints.py there),
with the outputs TensorFlow computes for a batch of inputs; bertkit's converted models, and
transformers reading the converted folder, must give the same outputs within 1e-5.
"""

import json
import shutil
import struct
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import torch
import transformers

from bertkit import load_model
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.heads import BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification
from bertkit.hub.tf_bert import OriginalCheckpoint, hf_name, infer_do_lower_case
from bertkit.hub.tf_checkpoint import TensorBundle, mask_crc, unmask_crc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tf"
PRETRAINED, CLASSIFIER, SQUAD = FIXTURES / "pretrained", FIXTURES / "classifier", FIXTURES / "squad"


def reference(folder):
    return dict(np.load(folder / "reference.npz"))


def inputs(ref):
    return {k: torch.from_numpy(ref[k]) for k in ("input_ids", "token_type_ids", "attention_mask")}


def assert_matches(ours, ref, keys, per_token=()):
    """Outputs equal TF's within 1e-5; per-token outputs at real (unpadded) positions only, since
    masked positions' values depend on each implementation's mask constant."""
    real = ref["attention_mask"].astype(bool)
    for key in keys:
        got = ours[key].detach().numpy()
        want = ref[key]
        if key in per_token:
            got, want = got[real], want[real]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=key)


def convert(capsys, *args):
    rc = main(["convert", *map(str, args)])
    err = capsys.readouterr().err
    return rc, err


# ----------------------------------------------------------------------------- the reader

def test_crc32c_and_mask_follow_the_published_definitions():
    assert google_crc32c.value(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720 B.4)
    assert mask_crc(0) == 0xA282EAD8  # LevelDB's mask: rotate right 15, add 0xa282ead8
    assert mask_crc(1) == ((1 << 17) + 0xA282EAD8) & 0xFFFFFFFF
    for crc in (0, 1, 0xE3069283, 0xFFFFFFFF):
        assert unmask_crc(mask_crc(crc)) == crc


def test_bundle_lists_variables_with_shapes_dtypes_and_shards():
    bundle = TensorBundle(PRETRAINED / "bert_model.ckpt")
    assert bundle.num_shards == 1 and len(bundle.entries) == 46
    assert bundle.entries["bert/encoder/layer_1/intermediate/dense/kernel"].shape == (32, 64)
    assert bundle.read("cls/predictions/output_bias").dtype == torch.float32

    classifier = TensorBundle(CLASSIFIER / "model.ckpt-30")
    assert classifier.read("global_step").item() == 30 and classifier.read("global_step").dtype == torch.int64
    assert sum(name.endswith(("/adam_m", "/adam_v")) for name in classifier.entries) == 2 * 41

    squad = TensorBundle(SQUAD / "model.ckpt-12")  # a sharded save: three data files
    assert squad.num_shards == 3 and {e.shard_id for e in squad.entries.values()} == {0, 1, 2}
    assert squad.read("global_step").item() == 12


def test_variable_map_names_transformers_parameters():
    reference_names = set(transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=58, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32)).state_dict())
    checkpoint = OriginalCheckpoint.open(PRETRAINED)
    mapped = {name for name, _ in checkpoint.names.values()}
    assert mapped == reference_names - {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert hf_name("bert/encoder/layer_11/attention/self/query/kernel") == \
        ("bert.encoder.layer.11.attention.self.query.weight", True)
    assert hf_name("output_weights") == ("classifier.weight", False)  # (labels, H): not transposed
    assert hf_name("bert/encoder/layer_0/attention/self/query/gamma") is None
    assert hf_name("bert/pooler/LayerNorm/gamma") is None


# ----------------------------------------------------------------------------- converted models vs TF

def test_converted_pretrained_model_matches_tensorflow_and_loads_in_transformers(tmp_path, capsys):
    out = tmp_path / "converted"
    rc, err = convert(capsys, "--from-tf", PRETRAINED, "--output", out)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                     "special_tokens_map.json", "tokenizer.json",
                                                     "tokenizer_config.json", "vocab.txt"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["hidden_act"] == "gelu_new"
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert (out / "vocab.txt").read_text() == (PRETRAINED / "vocab.txt").read_text()

    ref = reference(PRETRAINED)
    keys = ("last_hidden_state", "pooler_output", "prediction_logits", "seq_relationship_logits")
    per_token = ("last_hidden_state", "prediction_logits")
    ours = load_model(out).eval()
    assert isinstance(ours, BertForPreTraining) and ours.loading_info["missing_keys"] == []
    with torch.no_grad():
        out_ours = ours(**inputs(ref))
        encoder = ours.bert(**inputs(ref))
    assert_matches({**out_ours, **encoder}, ref, keys, per_token)

    theirs, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        out_theirs = theirs.eval()(**inputs(ref), output_hidden_states=True)
    out_theirs = {**out_theirs, "last_hidden_state": out_theirs.hidden_states[-1],
                  "pooler_output": theirs.bert(**inputs(ref)).pooler_output}
    assert_matches(out_theirs, ref, keys, per_token)


def test_run_classifier_output_converts_with_the_pretrained_config_and_vocab(tmp_path, capsys):
    out = tmp_path / "mnli"
    rc, err = convert(capsys, "--from-tf", CLASSIFIER, "--output", out,
                      "--config", PRETRAINED / "bert_config.json", "--vocab", PRETRAINED / "vocab.txt")
    assert rc == 0, err
    assert "BertForSequenceClassification, 3 labels" in err and "83 optimizer slots / global_step skipped" in err
    ref = reference(CLASSIFIER)
    ours = load_model(out).eval()
    assert isinstance(ours, BertForSequenceClassification) and ours.config.num_labels == 3
    with torch.no_grad():
        assert_matches({**ours(**inputs(ref)), **ours.bert(**inputs(ref))}, ref,
                       ("logits", "pooler_output", "last_hidden_state"), ("last_hidden_state",))
        theirs = transformers.BertForSequenceClassification.from_pretrained(out).eval()
        assert_matches(theirs(**inputs(ref)), ref, ("logits",))


def test_run_squad_folder_loads_on_the_fly(tmp_path):
    """from_pretrained on the TF folder itself converts in memory; no files are written there."""
    before = sorted(p.name for p in SQUAD.iterdir())
    ref = reference(SQUAD)
    model = BertForQuestionAnswering.from_pretrained(SQUAD).eval()
    assert model.loading_info["missing_keys"] == []
    assert model.loading_info["unexpected_keys"] == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]
    with torch.no_grad():
        assert_matches(model(**inputs(ref)), ref, ("start_logits", "end_logits"), ("start_logits", "end_logits"))
    assert isinstance(load_model(SQUAD), BertForQuestionAnswering)
    assert sorted(p.name for p in SQUAD.iterdir()) == before


def test_pretrained_folder_starts_a_fine_tuning_model():
    ref = reference(PRETRAINED)
    model = BertForSequenceClassification.from_pretrained(PRETRAINED, num_labels=2).eval()
    assert model.loading_info["missing_keys"] == ["classifier.bias", "classifier.weight"]
    with torch.no_grad():
        assert_matches(model.bert(**inputs(ref)), ref, ("pooler_output",))


def test_do_lower_case_from_the_vocabulary_or_a_flag(tmp_path, capsys):
    assert infer_do_lower_case((PRETRAINED / "vocab.txt").read_text().splitlines()) is True
    assert infer_do_lower_case(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "The", "the", "Paris", "##s"]) is False
    rc, err = convert(capsys, "--from-tf", PRETRAINED / "bert_model.ckpt", "--output", tmp_path / "out", "--cased")
    assert rc == 0, err
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["do_lower_case"] is False

    cased = tmp_path / "cased"
    shutil.copytree(PRETRAINED, cased)
    vocab = (cased / "vocab.txt").read_text().splitlines()
    (cased / "vocab.txt").write_text("".join((t.capitalize() if t.isalpha() else t) + "\n" for t in vocab))
    rc, err = convert(capsys, "--from-tf", cased, "--output", tmp_path / "cased-out")
    assert rc == 0 and "do_lower_case=false" in err, err
    assert json.loads((tmp_path / "cased-out" / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_real_uncased_vocabulary_is_inferred_uncased(uncased_vocab):
    assert infer_do_lower_case(uncased_vocab.read_text(encoding="utf-8").splitlines()) is True


@pytest.mark.slow
def test_task_commands_take_an_original_folder(data_dir, tmp_path, capsys):
    """`finetune` and `predict` read a TF folder as they read a converted one (tiny model, real data)."""
    rc = main(["finetune", "glue", "--task", "rte", "--model", str(PRETRAINED), "--data-dir", str(data_dir),
               "--output", str(tmp_path / "rte"), "--max-train-examples", "16", "--epochs", "1",
               "--batch-size", "8", "--learning-rate", "2e-5", "--max-seq-length", "32"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "rte" / "RTE" / "model" / "model.safetensors").is_file()
    rc = main(["predict", "squad", "--model", str(SQUAD), "--input", str(data_dir / "squad" / "dev-v1.1.json"),
               "--max-examples", "8", "--max-seq-length", "32", "--doc-stride", "8", "--max-query-length", "8",
               "--output", str(tmp_path / "squad")])
    assert rc == 0, capsys.readouterr().err
    assert len(json.loads((tmp_path / "squad" / "predictions.json").read_text())) == 8


# ----------------------------------------------------------------------------- bad checkpoints

@pytest.fixture
def pretrained_copy(tmp_path):
    folder = tmp_path / "tf"
    shutil.copytree(PRETRAINED, folder)
    return folder


def one_line_error(capsys, folder, tmp_path, *extra):
    rc, err = convert(capsys, "--from-tf", folder, "--output", tmp_path / "out", *extra)
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out" / "model.safetensors").exists()
    return err


def test_truncated_data_shard(pretrained_copy, tmp_path, capsys):
    data = pretrained_copy / "bert_model.ckpt.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-1000])
    err = one_line_error(capsys, pretrained_copy, tmp_path)
    assert "data shard is truncated" in err and str(data) in err


def test_flipped_byte_in_data_fails_the_crc(pretrained_copy, tmp_path, capsys):
    data = pretrained_copy / "bert_model.ckpt.data-00000-of-00001"
    entry = TensorBundle(pretrained_copy / "bert_model.ckpt").entries["bert/pooler/dense/kernel"]
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 5] ^= 0x10
    data.write_bytes(bytes(raw))
    err = one_line_error(capsys, pretrained_copy, tmp_path)
    assert "variable bert/pooler/dense/kernel fails its CRC32C check" in err


def test_flipped_byte_in_index_fails_the_block_crc(pretrained_copy, tmp_path, capsys):
    index = pretrained_copy / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[40] ^= 0x01  # inside the first data block
    index.write_bytes(bytes(raw))
    assert "fails its CRC32C check" in one_line_error(capsys, pretrained_copy, tmp_path)


def test_compressed_index_is_refused(pretrained_copy, tmp_path, capsys):
    """Mark the index block snappy-compressed (with a valid CRC): refused by name, not misread."""
    index = pretrained_copy / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    footer = raw[-48:]
    pos = 0
    for _ in range(2):  # skip the meta-index handle's two varints
        while footer[pos] & 0x80:
            pos += 1
        pos += 1
    values = []
    for _ in range(2):  # the index block's offset and size
        value = shift = 0
        while True:
            value |= (footer[pos] & 0x7F) << shift
            shift += 7
            pos += 1
            if not footer[pos - 1] & 0x80:
                break
        values.append(value)
    offset, size = values
    raw[offset + size] = 1
    crc = google_crc32c.value(bytes(raw[offset:offset + size + 1]))
    raw[offset + size + 1:offset + size + 5] = struct.pack("<I", mask_crc(crc))
    index.write_bytes(bytes(raw))
    assert "snappy-compressed" in one_line_error(capsys, pretrained_copy, tmp_path)


def test_missing_index(pretrained_copy, tmp_path, capsys):
    (pretrained_copy / "bert_model.ckpt.index").unlink()
    assert "no TensorFlow checkpoint index" in one_line_error(capsys, pretrained_copy, tmp_path)
    with pytest.raises(BertkitError, match="checkpoint index not found"):
        TensorBundle(pretrained_copy / "bert_model.ckpt")


def test_missing_data_shard(pretrained_copy, tmp_path, capsys):
    (pretrained_copy / "bert_model.ckpt.data-00000-of-00001").unlink()
    assert "data shard of variable" in one_line_error(capsys, pretrained_copy, tmp_path)


def test_unknown_variable_is_named(tmp_path, capsys):
    err = one_line_error(capsys, FIXTURES / "unknown_variable", tmp_path)
    assert "unknown variable loss_scale" in err


def test_fine_tuning_folder_without_config_says_to_pass_it(tmp_path, capsys):
    err = one_line_error(capsys, CLASSIFIER, tmp_path)
    assert "bert_config.json not found" in err and "--config" in err
    with pytest.raises(BertkitError, match="bert_config.json not found"):
        BertForSequenceClassification.from_pretrained(CLASSIFIER)


def test_several_checkpoints_without_a_checkpoint_file(tmp_path, capsys):
    folder = tmp_path / "two"
    shutil.copytree(SQUAD, folder)
    (folder / "checkpoint").unlink()
    (folder / "model.ckpt-99.index").write_bytes((folder / "model.ckpt-12.index").read_bytes())
    err = one_line_error(capsys, folder, tmp_path)
    assert "several checkpoints" in err
    rc, err = convert(capsys, "--from-tf", folder / "model.ckpt-12", "--output", tmp_path / "ok")
    assert rc == 0, err


def test_config_that_does_not_fit_the_weights(pretrained_copy, tmp_path, capsys):
    config = json.loads((pretrained_copy / "bert_config.json").read_text())
    config["intermediate_size"] = 128
    (pretrained_copy / "bert_config.json").write_text(json.dumps(config))
    assert "intermediate" in one_line_error(capsys, pretrained_copy, tmp_path)


def test_vocabulary_fits_its_embedding_matrix_or_a_padded_one():
    from bertkit.convert import vocabulary_fits
    assert vocabulary_fits(30522, 30522)
    assert vocabulary_fits(30522, 30528)  # NVIDIA's checkpoints: rows padded to a multiple of 8
    assert vocabulary_fits(30522, 30592)  # Megatron's: a multiple of 128
    assert not vocabulary_fits(30522, 30525)  # not a padding multiple: another vocabulary
    assert not vocabulary_fits(30523, 30522)  # more tokens than rows: ids past the matrix
    assert not vocabulary_fits(21128, 30522)  # e.g. the Chinese vocabulary for an English model
