"""Masking: the 15% rule and its cap, the [MASK]/same/random mix, specials, whole words — for the
per-sequence (static) and the batched (dynamic) implementation, on real text."""

import math
import random

import numpy as np
import pytest
import torch
from pretraining_helpers import load_shard_arrays

from bertkit.errors import BertkitError
from bertkit.pretraining.masking import continuation_flags, mask_batch, mask_tokens, parse_mask_mix

MASK_ID = 103


def expected_count(num_candidates, prob=0.15, cap=20):
    # Paper §3.1: 15% of the non-special positions, at least 1, at most the cap (round half to even).
    return min(cap, max(1, int(round(num_candidates * prob))))


@pytest.fixture(scope="module")
def rows(dynamic_dataset):
    """Unmasked real instances: (ids (N, T) int64, special (N, T) bool)."""
    arrays = load_shard_arrays(dynamic_dataset[0])
    ids = arrays["input_ids"][:3000].astype(np.int64)
    lengths = arrays["lengths"][:3000].astype(np.int64)
    b_starts = arrays["b_starts"][:3000].astype(np.int64)
    positions = np.arange(ids.shape[1])[None, :]
    special = (positions == 0) | (positions == b_starts[:, None] - 1) | (positions >= lengths[:, None] - 1)
    return ids, special


@pytest.fixture(scope="module")
def continuation(tokenizer):
    return continuation_flags(tokenizer.ids_to_tokens)


def _binomial_ok(successes, trials, p, sigmas=4.5):
    if p in (0.0, 1.0):
        return successes == p * trials
    return abs(successes / trials - p) < sigmas * math.sqrt(p * (1 - p) / trials)


def _mix_counts(original, masked, labels_mask):
    """(n [MASK], n unchanged, n other) over predicted positions."""
    shown, truth = masked[labels_mask], original[labels_mask]
    n_mask = int((shown == MASK_ID).sum())
    n_same = int(((shown == truth) & (truth != MASK_ID)).sum())
    return n_mask, n_same, len(shown) - n_mask - n_same


# The paper's masking ablation (appendix C.2) mixes ([MASK], same, random).
SPEC_MIXES = [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.8, 0.0, 0.2), (0.8, 0.2, 0.0), (0.0, 0.2, 0.8), (0.0, 0.0, 1.0)]


@pytest.mark.parametrize("mix", SPEC_MIXES)
def test_mask_tokens_count_rule_and_mix(rows, tokenizer, mix):
    ids, special = rows
    rng = random.Random(3)
    vocab_size = tokenizer.vocab_size
    masked = ids.copy()
    predicted = np.zeros_like(special)
    for row in range(len(ids)):
        length = int((~special[row]).sum() + 3)
        output, positions, labels = mask_tokens(
            ids[row, :length].tolist(), special[row, :length].tolist(), rng, 0.15, 20, mix,
            vocab_size=vocab_size, mask_id=MASK_ID,
        )
        assert len(positions) == expected_count(length - 3)
        assert positions == sorted(set(positions))
        assert not special[row, positions].any()
        assert labels == ids[row, positions].tolist()
        # Only predicted positions change.
        unchanged = np.ones(length, dtype=bool)
        unchanged[positions] = False
        assert (np.asarray(output)[unchanged] == ids[row, :length][unchanged]).all()
        masked[row, :length] = output
        predicted[row, positions] = True
    n_mask, n_same, n_random = _mix_counts(ids, masked, predicted)
    total = n_mask + n_same + n_random
    assert total > 40000
    # A random replacement hits [MASK], or the original token, with probability 1/V each.
    assert _binomial_ok(n_mask, total, mix[0] + mix[2] / vocab_size)
    assert _binomial_ok(n_same, total, mix[1] + mix[2] / vocab_size)
    if mix[2]:
        replaced = masked[predicted & (masked != ids) & (masked != MASK_ID)]
        assert replaced.min() >= 0 and replaced.max() < vocab_size
        # Uniform over the vocabulary: mean (V-1)/2, sd V/sqrt(12).
        assert abs(replaced.mean() - (vocab_size - 1) / 2) < 4.5 * vocab_size / math.sqrt(12 * len(replaced))


def test_cap_and_minimum():
    rng = random.Random(0)
    long_ids = list(range(1000, 1512))
    special = [True] + [False] * 510 + [True]
    # 510 * 0.15 = 76.5 exactly: Python's round (the original's) goes half to even -> 76.
    _, positions, _ = mask_tokens(long_ids, special, rng, 0.15, 80, vocab_size=30522, mask_id=MASK_ID)
    assert len(positions) == 76
    _, labels = mask_batch(torch.tensor([long_ids]), torch.tensor([special]), torch.Generator().manual_seed(0),
                           0.15, 80, vocab_size=30522, mask_id=MASK_ID)
    assert int((labels != -100).sum()) == 76
    _, positions, _ = mask_tokens(long_ids, special, rng, 0.15, 20, vocab_size=30522, mask_id=MASK_ID)
    assert len(positions) == 20
    _, positions, _ = mask_tokens([101, 7, 102, 8, 102], [True, False, True, False, True], rng,
                                  vocab_size=30522, mask_id=MASK_ID)
    assert len(positions) == 1  # at least one prediction


def _words(tokens_continue, special_row):
    """Word groups of one row: a ## piece extends the word before it inside a segment."""
    groups, previous = [], False
    for position, (cont, special) in enumerate(zip(tokens_continue, special_row)):
        if special:
            previous = False
            continue
        if previous and cont:
            groups[-1].append(position)
        else:
            groups.append([position])
        previous = True
    return groups


def test_whole_word_masking_never_splits_a_word(rows, continuation):
    ids, special = rows
    rng = random.Random(11)
    multi_piece_words_masked = 0
    for row in range(1500):
        length = int((~special[row]).sum() + 3)
        row_ids = ids[row, :length].tolist()
        flags = continuation[row_ids].tolist()
        _, positions, _ = mask_tokens(row_ids, special[row, :length].tolist(), rng, 0.15, 20,
                                      vocab_size=30522, mask_id=MASK_ID, whole_word=True, is_continuation=flags)
        chosen = set(positions)
        assert len(chosen) <= expected_count(length - 3)
        for group in _words(flags, special[row, :length]):
            picked = [p in chosen for p in group]
            assert all(picked) or not any(picked)
            multi_piece_words_masked += len(group) > 1 and all(picked)
    assert multi_piece_words_masked > 100


def test_mask_batch_count_rule_mix_and_specials(rows, tokenizer):
    ids, special = rows
    generator = torch.Generator().manual_seed(1)
    masked, labels = mask_batch(torch.from_numpy(ids), torch.from_numpy(special), generator,
                                vocab_size=tokenizer.vocab_size, mask_id=MASK_ID)
    masked, labels = masked.numpy(), labels.numpy()
    predicted = labels != -100
    assert not (predicted & special).any()
    assert (labels[predicted] == ids[predicted]).all()
    assert (masked[~predicted] == ids[~predicted]).all()
    expected = np.array([expected_count(n) for n in (~special).sum(axis=1)])
    assert (predicted.sum(axis=1) == expected).all()
    n_mask, n_same, n_random = _mix_counts(ids, masked, predicted)
    total = predicted.sum()
    assert _binomial_ok(n_mask, total, 0.8) and _binomial_ok(n_same, total, 0.1 + 0.1 / tokenizer.vocab_size)
    # Every candidate position is equally likely: the chosen positions' spread matches a uniform
    # pick within each row (mean relative position 0.5).
    relative = (np.nonzero(predicted)[1] - 1) / ((~special).sum(axis=1)[np.nonzero(predicted)[0]] + 1)
    assert abs(relative.mean() - 0.5) < 0.02


def test_mask_batch_other_mixes(rows):
    ids, special = rows
    ids_t, special_t = torch.from_numpy(ids[:500]), torch.from_numpy(special[:500])
    for mix, check in (
        ((1.0, 0.0, 0.0), lambda shown, truth: (shown == MASK_ID).all()),
        ((0.0, 1.0, 0.0), lambda shown, truth: (shown == truth).all()),
        ((0.0, 0.0, 1.0), lambda shown, truth: (shown != MASK_ID).mean() > 0.99 and (shown != truth).mean() > 0.99),
    ):
        masked, labels = mask_batch(ids_t, special_t, torch.Generator().manual_seed(2), mask_mix=mix,
                                    vocab_size=30522, mask_id=MASK_ID)
        predicted = labels != -100
        assert check(masked[predicted].numpy(), ids_t[predicted].numpy())


def test_mask_batch_whole_words_and_same_distribution_as_mask_tokens(rows, continuation):
    ids, special = rows
    ids, special = ids[:1500], special[:1500]
    table = torch.from_numpy(continuation)
    masked, labels = mask_batch(torch.from_numpy(ids), torch.from_numpy(special), torch.Generator().manual_seed(4),
                                vocab_size=30522, mask_id=MASK_ID, whole_word=True, is_continuation=table)
    predicted = (labels != -100).numpy()
    batch_counts = predicted.sum(axis=1)
    rng = random.Random(4)
    python_counts, python_pieces = [], []
    for row in range(len(ids)):
        length = int((~special[row]).sum() + 3)
        flags = continuation[ids[row, :length]]
        for group in _words(flags, special[row, :length]):
            picked = predicted[row, group]
            assert picked.all() or not picked.any()
        assert batch_counts[row] <= expected_count(length - 3)
        _, positions, _ = mask_tokens(ids[row, :length].tolist(), special[row, :length].tolist(), rng,
                                      vocab_size=30522, mask_id=MASK_ID, whole_word=True,
                                      is_continuation=flags.tolist())
        python_counts.append(len(positions))
        python_pieces.extend(flags[positions].tolist())
    # Skipping words that overshoot leaves some rows short of the budget, in both implementations
    # alike: compare the mean number of predictions per row.
    python_counts = np.array(python_counts)
    spread = math.sqrt((batch_counts.var() + python_counts.var()) / len(ids))
    assert abs(batch_counts.mean() - python_counts.mean()) < 4.5 * spread
    # Whole words are picked uniformly: the share of ## pieces among predictions is the same
    # in both implementations and close to their share among the candidates.
    continues = continuation[ids]
    batch_share = continues[predicted].mean()
    python_share = np.mean(python_pieces)
    candidate_share = continues[~special].mean()
    assert 0.03 < candidate_share
    assert abs(batch_share - python_share) < 4.5 * math.sqrt(2 * candidate_share / predicted.sum())
    assert abs(batch_share - candidate_share) < 0.25 * candidate_share


def test_mask_batch_is_reproducible_from_the_seed(rows):
    ids, special = (torch.from_numpy(a[:200]) for a in rows)
    first = mask_batch(ids, special, torch.Generator().manual_seed(9), vocab_size=30522, mask_id=MASK_ID)
    again = mask_batch(ids, special, torch.Generator().manual_seed(9), vocab_size=30522, mask_id=MASK_ID)
    other = mask_batch(ids, special, torch.Generator().manual_seed(10), vocab_size=30522, mask_id=MASK_ID)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])


def test_static_dataset_masks_follow_the_rules(static_dataset, dynamic_dataset):
    arrays = load_shard_arrays(static_dataset[0])
    lengths = arrays["lengths"].astype(np.int64)
    counts = arrays["masked_lm_counts"].astype(np.int64)
    assert (counts == [expected_count(n - 3) for n in lengths]).all()
    positions = arrays["masked_lm_positions"].astype(np.int64)
    b_starts = arrays["b_starts"].astype(np.int64)
    for row in range(len(lengths)):
        p = positions[row, : counts[row]]
        assert (np.diff(p) > 0).all() and p[0] > 0 and p[-1] < lengths[row] - 1
        assert b_starts[row] - 1 not in p
    valid = np.arange(positions.shape[1])[None, :] < counts[:, None]
    shown = arrays["input_ids"][np.nonzero(valid)[0], positions[valid]].astype(np.int64)
    truth = arrays["masked_lm_ids"][valid].astype(np.int64)
    n_mask = int((shown == MASK_ID).sum())
    n_same = int(((shown == truth) & (truth != MASK_ID)).sum())
    assert _binomial_ok(n_mask, len(shown), 0.8) and _binomial_ok(n_same, len(shown), 0.1, sigmas=5)


def test_parse_mask_mix():
    assert parse_mask_mix("80,10,10") == (0.8, 0.1, 0.1)
    assert parse_mask_mix("0,20,80") == (0.0, 0.2, 0.8)
    assert parse_mask_mix((1.0, 0.0, 0.0)) == (1.0, 0.0, 0.0)
    for bad in ("80,10", "80,10,20", "a,b,c", "-10,60,50"):
        with pytest.raises(BertkitError):
            parse_mask_mix(bad)
