"""Shards on disk, the manifest, the loader and the batch source; determinism across worker counts."""

import hashlib
import json

import numpy as np
import pytest
import torch
from pretraining_helpers import load_shard_arrays

from bertkit.errors import BertkitError
from bertkit.pretraining import PretrainingBatchSource, PretrainingDataset, create_pretraining_data

MASK_ID, CLS_ID, SEP_ID = 103, 101, 102


def test_dump_jsonl_matches_shards_and_loader(static_dataset, tokenizer):
    """The JSONL dump (original field names, token strings) and the binary shards describe the
    same instances in the same order; the loader turns them into the right tensors."""
    directory, summary, dump = static_dataset
    records = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    dataset = PretrainingDataset(directory)
    assert len(records) == len(dataset) == summary["instances"]
    batch = dataset.get_batch(np.arange(len(dataset)), trim=False)
    vocab = tokenizer.vocab
    for row in range(0, len(records), 7):
        record = records[row]
        length = len(record["tokens"])
        assert batch["input_ids"][row, :length].tolist() == [vocab[t] for t in record["tokens"]]
        assert batch["token_type_ids"][row, :length].tolist() == record["segment_ids"]
        assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (128 - length)
        assert batch["token_type_ids"][row, length:].eq(0).all()
        assert batch["next_sentence_label"][row].item() == int(record["is_random_next"])
        labels = batch["labels"][row]
        assert torch.nonzero(labels != -100).flatten().tolist() == record["masked_lm_positions"]
        assert labels[record["masked_lm_positions"]].tolist() == [vocab[t] for t in record["masked_lm_labels"]]
    # Segment layout: [CLS] A [SEP] are segment 0, B [SEP] segment 1.
    first = records[0]
    assert first["tokens"][0] == "[CLS]" and first["tokens"][-1] == "[SEP]"
    assert first["tokens"][first["segment_ids"].index(1) - 1] == "[SEP]"


def test_manifest_records_config_hashes_and_counts(static_dataset, corpus_slice, uncased_vocab):
    directory, summary, _ = static_dataset
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    assert manifest["vocab"]["sha256"] == hashlib.sha256(uncased_vocab.read_bytes()).hexdigest()
    assert (directory / "vocab.txt").read_bytes() == uncased_vocab.read_bytes()
    [record] = manifest["inputs"]
    assert record["sha256"] == hashlib.sha256(corpus_slice.read_bytes()).hexdigest()
    assert record["size"] == corpus_slice.stat().st_size
    config = manifest["config"]
    assert config["max_seq_length"] == 128 and config["masking"] == "static" and config["mask_mix"] == [0.8, 0.1, 0.1]
    assert sum(s["instances"] for s in manifest["shards"]) == manifest["num_instances"] == summary["instances"]
    assert manifest["counts"]["documents"] == 300
    arrays = load_shard_arrays(directory)
    assert arrays["input_ids"].dtype == np.uint16 and arrays["next_sentence_labels"].dtype == np.uint8
    assert manifest["counts"]["not_next"] == int(arrays["next_sentence_labels"].sum())
    assert not list(directory.glob("*.tmp"))


def test_same_seed_same_output_with_one_or_two_workers(mini_corpus, uncased_vocab, tmp_path):
    outputs = []
    for workers in (1, 2):
        output = tmp_path / f"w{workers}"
        create_pretraining_data([mini_corpus], uncased_vocab, output, dupe_factor=2, seed=3, workers=workers,
                                block_chars=30_000, shard_size=300, progress=False, whole_word_mask=True)
        outputs.append(load_shard_arrays(output))
    assert outputs[0].keys() == outputs[1].keys()
    for key in outputs[0]:
        assert np.array_equal(outputs[0][key], outputs[1][key]), key
    # A different seed gives different data.
    create_pretraining_data([mini_corpus], uncased_vocab, tmp_path / "other", dupe_factor=2, seed=4,
                            block_chars=30_000, progress=False)
    other = load_shard_arrays(tmp_path / "other")
    assert other["input_ids"].shape != outputs[0]["input_ids"].shape or not np.array_equal(
        other["input_ids"], outputs[0]["input_ids"])


def test_batch_source_order_resume_and_ranks(static_dataset):
    dataset = PretrainingDataset(static_dataset[0])
    source = PretrainingBatchSource(dataset, batch_size=16, seed=5)
    assert source.num_batches(0) == len(dataset) // 16
    epoch0 = list(source.batches(0))
    again = list(source.batches(0))
    assert len(epoch0) == source.num_batches(0)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(epoch0, again))
    # Resuming at batch 10 gives exactly batches 10, 11, ...
    resumed = source.batches(0, start=10)
    for expected in epoch0[10:13]:
        got = next(resumed)
        assert all(torch.equal(got[k], expected[k]) for k in expected)
    # A new epoch is a new order.
    epoch1 = next(source.batches(1))
    assert not torch.equal(epoch1["input_ids"][:, :5], epoch0[0]["input_ids"][:, :5])
    # Every instance at most once per epoch: the labels' fingerprint per row is unique.
    seen = {tuple(b["input_ids"][r].tolist()) for b in epoch0 for r in range(16)}
    assert len(seen) == 16 * len(epoch0)

    # Two ranks: disjoint halves of each global batch, same number of batches.
    ranks = [PretrainingBatchSource(dataset, batch_size=8, seed=5, rank=r, world_size=2) for r in (0, 1)]
    assert ranks[0].num_batches(0) == ranks[1].num_batches(0) == len(dataset) // 16

    def real_rows(batch):
        return [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]

    for index, (b0, b1) in enumerate(zip(ranks[0].batches(0), ranks[1].batches(0))):
        # Rank 0 holds the first half of the single-process batch, rank 1 the second half.
        assert real_rows(b0) + real_rows(b1) == real_rows(epoch0[index])
        if index == 3:
            break


def test_batch_source_without_drop_last_pads_ranks_evenly(static_dataset):
    dataset = PretrainingDataset(static_dataset[0])
    total = len(dataset)
    sources = [PretrainingBatchSource(dataset, batch_size=64, seed=1, rank=r, world_size=3, drop_last=False)
               for r in range(3)]
    assert sources[0].num_batches(0) == -(-total // 192)
    last = [list(s.batches(0, start=s.num_batches(0) - 1)) for s in sources]
    sizes = [len(batches[0]["input_ids"]) for batches in last]
    assert len(set(sizes)) == 1 and 3 * sizes[0] >= total - 192 * (sources[0].num_batches(0) - 1)
    single = PretrainingBatchSource(dataset, batch_size=64, seed=1, drop_last=False)
    covered = sum(len(b["input_ids"]) for b in single.batches(0))
    assert covered == total


def test_dynamic_masks_change_per_epoch_and_are_reproducible(dynamic_dataset):
    dataset = PretrainingDataset(dynamic_dataset[0])
    source = PretrainingBatchSource(dataset, batch_size=32, seed=8)
    batch_a = next(source.batches(0))
    batch_b = next(PretrainingBatchSource(dataset, batch_size=32, seed=8).batches(0))
    assert all(torch.equal(batch_a[k], batch_b[k]) for k in batch_a)
    # Same rows under a different epoch's mask: ask the loader directly with the two generators.
    rows = np.arange(64)
    first = dataset.get_batch(rows, generator=torch.Generator().manual_seed(1))
    second = dataset.get_batch(rows, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(first["labels"], second["labels"])
    # Over a whole epoch: the same instance gets different masks in epochs 0 and 1.
    masks = {}
    for epoch in (0, 1):
        for batch in source.batches(epoch):
            originals = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
            for row in range(len(originals)):
                key = tuple(originals[row][batch["attention_mask"][row].bool()].tolist())
                masks.setdefault(key, []).append(tuple(torch.nonzero(batch["labels"][row] != -100).flatten().tolist()))
    repeated = [m for m in masks.values() if len(m) == 2]
    assert len(repeated) > 100
    assert sum(m[0] != m[1] for m in repeated) > 0.95 * len(repeated)
    # Predictions follow the 15% rule (non-special positions = length - 3).
    lengths = batch_a["attention_mask"].sum(dim=1)
    counts = (batch_a["labels"] != -100).sum(dim=1)
    assert all(c == min(20, max(1, round(0.15 * (n - 3)))) for c, n in zip(counts.tolist(), lengths.tolist()))


def test_trimming_ltr_and_nsp_options(static_dataset):
    dataset = PretrainingDataset(static_dataset[0])
    rows = np.arange(40)
    batch = dataset.get_batch(rows)
    lengths = batch["attention_mask"].sum(dim=1)
    assert batch["input_ids"].shape[1] == int(lengths.max())

    ltr = dataset.get_batch(rows, objective="ltr")
    assert "next_sentence_label" not in ltr
    assert not (ltr["input_ids"] == MASK_ID).any()  # stored masks undone
    unmasked = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
    assert torch.equal(ltr["input_ids"], unmasked)
    for row, length in enumerate(lengths.tolist()):
        assert ltr["labels"][row, : length - 1].tolist() == unmasked[row, 1:length].tolist()
        assert (ltr["labels"][row, length - 1:] == -100).all()

    no_nsp = dataset.get_batch(rows, nsp=False)
    assert "next_sentence_label" not in no_nsp and torch.equal(no_nsp["labels"], batch["labels"])


def test_masking_overrides_need_dynamic_masking(static_dataset):
    dataset = PretrainingDataset(static_dataset[0])
    with pytest.raises(BertkitError, match="dynamic"):
        PretrainingBatchSource(dataset, batch_size=8, seed=0, mask_mix="100,0,0")
    source = PretrainingBatchSource(dataset, batch_size=8, seed=0, mask_mix="100,0,0", masking="dynamic")
    batch = next(source.batches(0))
    predicted = batch["labels"] != -100
    assert predicted.any() and (batch["input_ids"][predicted] == MASK_ID).all()
    # The stored masks were undone before re-masking: no [MASK] outside the new predictions.
    assert not (batch["input_ids"][~predicted] == MASK_ID).any()


def test_loader_errors(tmp_path, static_dataset):
    with pytest.raises(BertkitError, match="manifest"):
        PretrainingDataset(tmp_path)
    with pytest.raises(BertkitError, match="fewer than one batch"):
        PretrainingBatchSource(PretrainingDataset(static_dataset[0]), batch_size=10**7, seed=0)


@pytest.mark.parametrize("fixture", ["dynamic_dataset", "static_dataset"])
def test_pairs_cut_to_a_shorter_length_as_the_original_truncates(fixture, request):
    """max_length cuts [CLS] A [SEP] B [SEP] the way the data was made (truncate_seq_pair: the longer
    side loses tokens, each from its front or back with equal probability); masks are drawn after."""
    dataset = PretrainingDataset(request.getfixturevalue(fixture)[0])
    rows = np.arange(min(len(dataset), 400))
    raw = dataset.rows(rows)
    full = dataset.get_batch(rows, generator=torch.Generator().manual_seed(4), masking="dynamic")
    originals = torch.where(full["labels"] != -100, full["labels"], full["input_ids"])
    cut = dataset.get_batch(rows, generator=torch.Generator().manual_seed(5), masking="dynamic", max_length=32)
    assert cut["input_ids"].shape[1] <= 32
    assert torch.equal(cut["next_sentence_label"], full["next_sentence_label"])
    restored = torch.where(cut["labels"] != -100, cut["labels"], cut["input_ids"])
    front = back = 0
    for row in range(len(rows)):
        n = int(cut["attention_mask"][row].sum())
        ids, types = restored[row, :n].tolist(), cut["token_type_ids"][row, :n].tolist()
        b_start = types.index(1)
        assert ids[0] == CLS_ID and ids[b_start - 1] == SEP_ID and ids[-1] == SEP_ID and n <= 32
        a_full = originals[row, 1:raw["b_starts"][row] - 1].tolist()
        b_full = originals[row, raw["b_starts"][row]:raw["lengths"][row] - 1].tolist()
        a_cut, b_cut = ids[1:b_start - 1], ids[b_start:n - 1]
        # each side is a contiguous piece of its original; nothing is cut from a pair that fits
        for piece, whole in ((a_cut, a_full), (b_cut, b_full)):
            starts = [s for s in range(len(whole) - len(piece) + 1) if whole[s:s + len(piece)] == piece]
            assert starts, (piece, whole)
            if len(piece) < len(whole):
                front += starts[0]
                back += len(whole) - len(piece) - starts[0]
        if raw["lengths"][row] <= 32:
            assert len(a_cut) == len(a_full) and len(b_cut) == len(b_full)
        else:  # the longer side was trimmed until the pair fit: the sides end level, or one is whole
            assert n == 32
            assert abs(len(a_cut) - len(b_cut)) <= 1 or len(a_cut) == len(a_full) or len(b_cut) == len(b_full)
        # masks drawn on the cut row: the 15% rule over its own non-special positions
        assert int((cut["labels"][row] != -100).sum()) == min(dataset.max_predictions, max(1, round(0.15 * (n - 3))))
    # front and back removals are equally likely (binomial, p = 1/2): within 4 standard deviations
    removed = front + back
    assert removed > 500 and abs(front - removed / 2) < 4 * (removed / 4) ** 0.5, (front, back)


@pytest.mark.parametrize("fixture", ["dynamic_dataset", "static_dataset"])
def test_ltr_rows_cut_to_a_shorter_length_predict_the_next_token_of_the_cut_row(fixture, request):
    """The LTR ablation's short-sequence phase: the same cut as MLM's, then next-token labels on the cut
    row (static data's stored masks are undone first, so no [MASK] is left in the input)."""
    dataset = PretrainingDataset(request.getfixturevalue(fixture)[0])
    rows = np.arange(min(len(dataset), 200))
    full = dataset.get_batch(rows, objective="ltr", generator=torch.Generator().manual_seed(1))
    cut = dataset.get_batch(rows, objective="ltr", generator=torch.Generator().manual_seed(1), max_length=32)
    assert cut["input_ids"].shape[1] <= 32 and "next_sentence_label" not in cut
    assert not (cut["input_ids"] == MASK_ID).any()
    for row in range(len(rows)):
        n = int(cut["attention_mask"][row].sum())
        ids = cut["input_ids"][row, :n].tolist()
        assert ids[0] == CLS_ID and ids[-1] == SEP_ID
        assert cut["labels"][row, :n - 1].tolist() == ids[1:] and (cut["labels"][row, n - 1:] == -100).all()
        whole = full["input_ids"][row, :int(full["attention_mask"][row].sum())].tolist()
        assert set(ids) <= set(whole)  # pieces of the original pair, nothing new


def test_cutting_pairs_needs_dynamic_masking_and_room(static_dataset):
    dataset = PretrainingDataset(static_dataset[0])
    with pytest.raises(BertkitError, match="dynamic"):
        dataset.get_batch(np.arange(4), max_length=32)
    with pytest.raises(BertkitError, match="at least 5"):
        dataset.get_batch(np.arange(4), masking="dynamic", generator=torch.Generator().manual_seed(0), max_length=4)
