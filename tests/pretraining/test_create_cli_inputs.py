"""create_pretraining_data end to end: command-line flags, raw text, and bad input."""

import argparse
import json

import numpy as np
import pytest
from pretraining_helpers import load_shard_arrays

from bertkit.errors import BertkitError
from bertkit.pretraining import PretrainingDataset, create_pretraining_data
from bertkit.pretraining.create import add_arguments, run_from_args


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_command_line_flags_reach_the_manifest(mini_corpus, uncased_vocab, tmp_path, capsys):
    output = tmp_path / "out"
    args = _parse([
        "--input", str(mini_corpus), "--vocab", str(uncased_vocab), "--output", str(output),
        "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--masked-lm-prob", "0.2",
        "--short-seq-prob", "0.3", "--seed", "42", "--whole-word-mask", "--masking", "dynamic",
        "--mask-mix", "80,0,20", "--shard-size", "500", "--no-progress", "--workers", "2", "--block-chars", "30000",
    ])
    summary = run_from_args(args)
    assert "instances" in capsys.readouterr().out
    manifest = json.loads((output / "manifest.json").read_text())
    config = manifest["config"]
    assert config["max_seq_length"] == 64 and config["max_predictions_per_seq"] == 10
    assert config["masked_lm_prob"] == 0.2 and config["short_seq_prob"] == 0.3 and config["seed"] == 42
    assert config["whole_word_mask"] is True and config["masking"] == "dynamic"
    assert config["mask_mix"] == [0.8, 0.0, 0.2]
    assert config["dupe_factor"] == 1  # dynamic masking's default
    assert all(s["instances"] <= 500 for s in manifest["shards"]) and len(manifest["shards"]) > 1
    arrays = load_shard_arrays(output)
    assert arrays["input_ids"].shape[1] == 64 and "masked_lm_positions" not in arrays
    assert summary["instances"] == len(arrays["lengths"])
    # The loader applies the stored settings when masking on the fly.
    batch = PretrainingDataset(output).get_batch(np.arange(200))
    lengths = batch["attention_mask"].sum(dim=1)
    assert ((batch["labels"] != -100).sum(dim=1) <= 10).all()
    assert lengths.max() <= 64


def test_dupe_factor_multiplies_instances(mini_corpus, uncased_vocab, tmp_path):
    once = create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "a", dupe_factor=1, progress=False)
    thrice = create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "b", dupe_factor=3, progress=False)
    # Each pass re-draws pairings and short targets, so the counts differ a little, but scale by ~3.
    assert 2.5 < thrice["instances"] / once["instances"] < 3.5
    assert once["corpus_tokens"] == thrice["corpus_tokens"]


def test_raw_text_end_to_end(data_dir, uncased_vocab, tmp_path):
    book = data_dir / "corpus" / "raw" / "carroll-alice.txt"
    summary = create_pretraining_data([book], uncased_vocab, tmp_path / "raw", raw=True, dupe_factor=1, progress=False,
                                      dump_jsonl=tmp_path / "raw.jsonl", masking="dynamic")
    assert summary["documents"] == 12  # chapters
    # pysbd splits paragraphs into sentences.
    assert summary["sentences"] > 1.3 * summary["paragraphs"] > 500
    assert summary["instances"] > 200
    first = json.loads((tmp_path / "raw.jsonl").read_text().splitlines()[0])
    assert set(first) == {"tokens", "segment_ids", "is_random_next", "masked_lm_positions", "masked_lm_labels"}
    assert first["masked_lm_positions"]  # a sampled mask is shown for dynamic data


def test_empty_input_file_is_skipped_and_counted(mini_corpus, uncased_vocab, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    summary = create_pretraining_data([empty, mini_corpus], uncased_vocab, tmp_path / "out", dupe_factor=1,
                                      progress=False)
    assert summary["empty_files"] == 1 and summary["empty_file_paths"] == [str(empty)]
    assert summary["instances"] > 200
    with pytest.raises(BertkitError, match="no instances"):
        create_pretraining_data([empty], uncased_vocab, tmp_path / "none", progress=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_invalid_utf8_stops_with_file_and_line(mini_corpus, uncased_vocab, tmp_path, workers):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"A good sentence.\nAnother one.\n\nThird \xc3\x28 broken.\n")
    with pytest.raises(BertkitError) as info:
        create_pretraining_data([mini_corpus, bad], uncased_vocab, tmp_path / "out", workers=workers,
                                block_chars=20_000, progress=False)
    assert str(info.value).startswith(f"{bad}:4: invalid UTF-8")
    assert not (tmp_path / "out" / "manifest.json").exists()
    summary = create_pretraining_data([mini_corpus, bad], uncased_vocab, tmp_path / "out", workers=workers,
                                      encoding_errors="replace", dupe_factor=1, progress=False, overwrite=True)
    assert summary["undecodable_lines"] == 1


def test_vocabulary_without_mask_token_is_refused(mini_corpus, uncased_vocab, tmp_path):
    lines = uncased_vocab.read_text(encoding="utf-8").splitlines()
    lacking = tmp_path / "vocab.txt"
    lacking.write_text("\n".join(t for t in lines if t != "[MASK]") + "\n", encoding="utf-8")
    with pytest.raises(BertkitError) as info:
        create_pretraining_data([mini_corpus], lacking, tmp_path / "out", progress=False)
    assert "[MASK]" in str(info.value)
    with pytest.raises(BertkitError, match="not found"):
        create_pretraining_data([mini_corpus], tmp_path / "missing.txt", tmp_path / "out", progress=False)


def test_bad_arguments_and_existing_output(mini_corpus, uncased_vocab, tmp_path):
    with pytest.raises(BertkitError, match="not found"):
        create_pretraining_data([tmp_path / "nope.txt"], uncased_vocab, tmp_path / "out", progress=False)
    with pytest.raises(BertkitError, match="max_seq_length"):
        create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "out", max_seq_length=4, progress=False)
    with pytest.raises(BertkitError, match="masking"):
        create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "out", masking="sometimes", progress=False)
    with pytest.raises(BertkitError, match="mask mix"):
        create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "out", mask_mix="90,20,0", progress=False)
    first = create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "out", dupe_factor=1, progress=False)
    with pytest.raises(BertkitError, match="--overwrite"):
        create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "out", dupe_factor=1, progress=False)
    second = create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "out", dupe_factor=1, progress=False,
                                     overwrite=True, shard_size=1000)
    assert second["instances"] == first["instances"]
    assert len(PretrainingDataset(tmp_path / "out")) == first["instances"]
