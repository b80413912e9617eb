"""Sentence-pair instances: exact agreement with the original procedure, and its statistics on real text."""

import math
import random

import numpy as np
from pretraining_helpers import load_shard_arrays

from bertkit.pretraining.instances import (
    assemble_pairs,
    create_instances_from_document,
    plan_instances_from_document,
)

MAX_SEQ_LENGTH = 128


def original_instances_without_masking(all_documents, document_index, max_seq_length, short_seq_prob, rng):
    """Reference: google-research/bert create_instances_from_document, on lists, masking call removed."""
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = [t for segment in current_chunk[:a_end] for t in segment]
                tokens_b = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(current_chunk) - a_end
                else:
                    is_random_next = False
                    tokens_b = [t for segment in current_chunk[a_end:] for t in segment]
                while len(tokens_a) + len(tokens_b) > max_num_tokens:
                    trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
                    if rng.random() < 0.5:
                        del trunc_tokens[0]
                    else:
                        trunc_tokens.pop()
                instances.append((tokens_a, tokens_b, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def test_same_instances_as_the_original_procedure(source_token_documents):
    documents = source_token_documents
    for short_seq_prob, max_seq_length in ((0.1, 128), (0.5, 64), (0.0, 512)):
        ours_rng, reference_rng = random.Random(99), random.Random(99)
        compared = 0
        for document_index in range(len(documents)):
            ours = create_instances_from_document(
                documents, document_index, max_seq_length, short_seq_prob, ours_rng, cls_id=101, sep_id=102
            )
            expected = original_instances_without_masking(
                documents, document_index, max_seq_length, short_seq_prob, reference_rng
            )
            assert len(ours) == len(expected)
            for instance, (tokens_a, tokens_b, is_random_next) in zip(ours, expected):
                assert instance.input_ids == [101, *tokens_a, 102, *tokens_b, 102]
                assert instance.segment_ids == [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                assert instance.is_random_next == is_random_next
                compared += 1
        # Same generator state afterwards: exactly the same random draws were made.
        assert ours_rng.random() == reference_rng.random()
        assert compared > 1000


def test_short_target_rule_on_one_token_sentences():
    # With one-token sentences a chunk stops exactly at the target, so the first instance of a
    # document reveals the target: 125 normally, uniform on [2, 125] with probability 0.1.
    # Documents 1-3 are very long so that a NotNext B practically never runs out of text.
    lengths = [[1] * 300] + [[1] * 1_000_000] * 3
    offsets = [list(range(len(d) + 1)) for d in lengths]
    rng = random.Random(5)
    trials = 4000
    targets = []
    for _ in range(trials):
        first = plan_instances_from_document(lengths, 0, MAX_SEQ_LENGTH, 0.1, rng, offsets)[0]
        targets.append((first.a_end - first.a_start) + (first.b_end - first.b_start))
        assert targets[-1] <= MAX_SEQ_LENGTH - 3
    targets = np.array(targets)
    short = targets[targets < MAX_SEQ_LENGTH - 3]
    # A short draw equal to 125 is indistinguishable; its probability is 0.1 / 124.
    expected = 0.1 * (1 - 1 / 124)
    sigma = math.sqrt(expected * (1 - expected) / trials)
    assert abs(len(short) / trials - expected) < 4 * sigma
    assert short.min() >= 2
    # Uniform on [2, 125) given short: mean 63, sd ~35.5.
    assert abs(short.mean() - 63) < 4 * 35.5 / math.sqrt(len(short))


def test_assemble_pairs_layout():
    tokens = np.arange(1000, 1020, dtype=np.int32)
    pairs = assemble_pairs(
        tokens, [0, 10], [3, 12], [5, 0], [7, 1], [False, True], max_seq_length=10, cls_id=1, sep_id=2, pad_id=0
    )
    assert pairs.input_ids.tolist() == [
        [1, 1000, 1001, 1002, 2, 1005, 1006, 2, 0, 0],
        [1, 1010, 1011, 2, 1000, 2, 0, 0, 0, 0],
    ]
    assert pairs.lengths.tolist() == [8, 6]
    assert pairs.b_starts.tolist() == [5, 4]
    assert pairs.next_sentence_labels.tolist() == [0, 1]


def _find_all(haystack: bytes, needle: bytes) -> list[int]:
    """Token offsets where `needle` occurs in `haystack` (both little-endian int32 arrays)."""
    found, start = [], 0
    while True:
        position = haystack.find(needle, start)
        if position < 0:
            return found
        if position % 4 == 0:
            found.append(position // 4)
        start = position + 1


def test_pairs_come_from_the_source_documents(dynamic_dataset, source_token_documents):
    """IsNext: B follows A across a sentence boundary of the same document. NotNext: B comes
    from another document. Checked against the slice's text, tokenized independently."""
    directory, summary = dynamic_dataset
    arrays = load_shard_arrays(directory)
    # One stream of all documents, -1 between documents.
    stream, document_starts, boundaries = [], [], set()
    for document in source_token_documents:
        document_starts.append(len(stream))
        for sentence in document:
            boundaries.add(len(stream))
            stream.extend(sentence)
        boundaries.add(len(stream))
        stream.append(-1)
    haystack = np.asarray(stream, dtype="<i4").tobytes()
    document_starts = np.asarray(document_starts)

    def document_of(position):
        return int(np.searchsorted(document_starts, position, side="right") - 1)

    checked = {0: 0, 1: 0}
    for row in range(min(2500, len(arrays["lengths"]))):
        ids = arrays["input_ids"][row].astype(np.int64)
        length, b_start = int(arrays["lengths"][row]), int(arrays["b_starts"][row])
        tokens_a, tokens_b = ids[1 : b_start - 1], ids[b_start : length - 1]
        if len(tokens_a) < 10 or len(tokens_b) < 10:
            continue  # short spans can occur in several places
        a_hits = _find_all(haystack, tokens_a.astype("<i4").tobytes())
        b_hits = _find_all(haystack, tokens_b.astype("<i4").tobytes())
        assert a_hits and b_hits, f"instance {row} is not made of corpus text"
        if len({document_of(p) for p in a_hits}) != 1:
            continue
        a_document = document_of(a_hits[0])
        label = int(arrays["next_sentence_labels"][row])
        if label == 0:
            # B starts after A's end in the same document with a sentence boundary in between
            # (truncation may have trimmed A's back and B's front).
            assert any(
                document_of(q) == a_document
                and any(s in boundaries for s in range(p + len(tokens_a), q + 1))
                for p in a_hits for q in b_hits
            ), f"IsNext instance {row}: B does not continue A"
        else:
            assert any(document_of(q) != a_document for q in b_hits), f"NotNext instance {row}: B from A's document"
        checked[label] += 1
    assert checked[0] > 500 and checked[1] > 500


def test_instance_statistics_on_real_text(dynamic_dataset):
    directory, summary = dynamic_dataset
    arrays = load_shard_arrays(directory)
    count = len(arrays["lengths"])
    assert count == summary["instances"] > 4000
    assert arrays["lengths"].max() <= MAX_SEQ_LENGTH and arrays["lengths"].min() >= 5
    # NotNext: one half by the coin, plus every single-sentence chunk (about 55%, as the original create_pretraining_data.py gives).
    not_next = arrays["next_sentence_labels"].mean()
    sigma = math.sqrt(0.25 / count)
    assert 0.5 - 4 * sigma < not_next < 0.6
    assert summary["not_next_fraction"] == not_next
    # Most rows are filled near the target; the short-target documents give a tail.
    fill = arrays["lengths"] / MAX_SEQ_LENGTH
    assert np.median(fill) > 0.9
    assert 0.02 < (fill < 0.5).mean() < 0.3
    ids = arrays["input_ids"].astype(np.int64)
    rows = np.arange(count)
    assert (ids[:, 0] == 101).all()
    assert (ids[rows, arrays["b_starts"].astype(np.int64) - 1] == 102).all()
    assert (ids[rows, arrays["lengths"].astype(np.int64) - 1] == 102).all()
    padding = np.arange(MAX_SEQ_LENGTH)[None, :] >= arrays["lengths"][:, None]
    assert (ids[padding] == 0).all()
