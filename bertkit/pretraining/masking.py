"""Masked-LM targets: which positions to predict and what the model sees there.

Two implementations with the same distribution:

* :func:`mask_tokens` — one sequence, Python ``random.Random``; the original
  create_masked_lm_predictions (used for static masking when the data is created);
* :func:`mask_batch` — a (B, T) tensor at once, seeded by a ``torch.Generator``; used for
  dynamic masking in the data loader at every step.

The rule (paper §3.1, appendix A.1): predict ``min(max_predictions, max(1, round(n * masked_lm_prob)))`` of the n
non-special positions, chosen uniformly at random (Python's round, i.e. half to even, like the
original's ``int(round(...))``). Two differences from the original, both deliberate:

* n counts only the non-special positions, as the paper describes; the original multiplied the full
  length including ``[CLS]`` and both ``[SEP]``. At length 128 both give 19 predictions.
* With whole-word masking a ``##`` piece joins the previous word only when that word is in the
  same segment; the original also glued a ``##`` piece that opens B (after front truncation) to
  the last word of A, across the ``[SEP]``.

As in the original, a word group that would overshoot the budget is skipped and later (smaller)
groups are still tried. Each chosen position becomes ``[MASK]`` with probability ``mix[0]``,
stays unchanged with ``mix[1]``, and becomes a random id in ``[0, vocab_size)`` with ``mix[2]``
(the original drew from the whole vocabulary, special and unused entries included; so do we).
The draws follow the original's order: ``random() < mix[0]`` -> ``[MASK]``, else
``random() < mix[1] / (mix[1] + mix[2])`` -> unchanged, else a random id; for 80/10/10 these are
the original's ``0.8`` / ``0.5`` tests. The candidates are put in random order lazily
(``rng.sample``, or a Fisher-Yates pass stopped as soon as the budget is full) instead of the
original's full shuffle: the same distribution with ~6x fewer random draws, the main cost of
static masking.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import BertkitError

DEFAULT_MASK_MIX = (0.8, 0.1, 0.1)


def parse_mask_mix(value: str | Sequence[float]) -> tuple[float, float, float]:
    """``"80,10,10"`` (percentages) or three fractions -> fractions ([MASK], same, random)."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace("/", ",").split(",")]
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            raise BertkitError(f"mask mix must be three numbers like 80,10,10, not {value!r}") from None
    else:
        numbers = [float(x) for x in value]
    if len(numbers) != 3 or any(x < 0 for x in numbers):
        raise BertkitError(f"mask mix must be three non-negative numbers ([MASK], same, random), not {value!r}")
    total = sum(numbers)
    if abs(total - 100.0) < 1e-6:
        numbers = [x / 100.0 for x in numbers]
    elif abs(total - 1.0) > 1e-6:
        raise BertkitError(f"mask mix must add up to 100 (percent) or 1, not {total:g}")
    return (numbers[0], numbers[1], numbers[2])


def num_to_predict(num_candidates: int, masked_lm_prob: float, max_predictions: int) -> int:
    """How many positions to predict among `num_candidates` non-special ones."""
    return min(max_predictions, max(1, int(round(num_candidates * masked_lm_prob))))


def continuation_flags(ids_to_tokens: Sequence[str]) -> np.ndarray:
    """Per vocabulary id: does this WordPiece continue the previous word (``##`` prefix)?"""
    return np.fromiter((token.startswith("##") for token in ids_to_tokens), dtype=bool, count=len(ids_to_tokens))


def _random_order(items: list, rng: random.Random):
    """Yield `items` in uniformly random order, lazily (Fisher-Yates from the end, stopping
    whenever the caller does): a full shuffle would spend most draws on unused items."""
    items = list(items)
    for last in range(len(items) - 1, 0, -1):
        pick = rng.randrange(last + 1)
        items[last], items[pick] = items[pick], items[last]
        yield items[last]
    if items:
        yield items[0]


def mask_tokens(
    token_ids: Sequence[int],
    special_mask: Sequence[bool],
    rng: random.Random,
    masked_lm_prob: float = 0.15,
    max_predictions: int = 20,
    mask_mix: Sequence[float] = DEFAULT_MASK_MIX,
    *,
    vocab_size: int,
    mask_id: int,
    whole_word: bool = False,
    is_continuation: Sequence[bool] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Mask one sequence. Returns (masked ids, predicted positions ascending, their original ids).

    `special_mask[i]` marks positions never predicted (``[CLS]``, ``[SEP]``, padding).
    `is_continuation[i]` (per position, needed for `whole_word`) tells whether token i is a
    ``##`` piece, e.g. ``continuation_flags(vocab)[token_ids]``.
    """
    if whole_word and is_continuation is None:
        raise ValueError("whole-word masking needs is_continuation")
    token_ids = list(token_ids)
    if whole_word:
        groups: list[list[int]] = []
        previous_is_candidate = False
        for position, special in enumerate(special_mask):
            if special:
                previous_is_candidate = False
                continue
            if previous_is_candidate and is_continuation[position]:
                groups[-1].append(position)
            else:
                groups.append([position])
            previous_is_candidate = True
        num_candidates = sum(len(g) for g in groups)
    else:
        candidates = [position for position, special in enumerate(special_mask) if not special]
        num_candidates = len(candidates)
    budget = num_to_predict(num_candidates, masked_lm_prob, max_predictions)

    if whole_word:
        chosen: list[int] = []
        for group in _random_order(groups, rng):
            if len(chosen) >= budget:
                break
            # A word that would overshoot the budget is skipped; smaller ones may still fit.
            if len(chosen) + len(group) > budget:
                continue
            chosen.extend(group)
    else:
        chosen = rng.sample(candidates, min(budget, num_candidates))

    mask_share, same_share, random_share = mask_mix
    keep_given_not_masked = same_share / (same_share + random_share) if same_share + random_share > 0 else 0.0
    output = list(token_ids)
    # Draw in the order the positions were chosen, as the original does.
    for position in chosen:
        if rng.random() < mask_share:
            output[position] = mask_id
        elif rng.random() < keep_given_not_masked:
            pass
        else:
            output[position] = rng.randint(0, vocab_size - 1)
    positions = sorted(chosen)
    return output, positions, [token_ids[p] for p in positions]


def mask_batch(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    generator: torch.Generator | None,
    masked_lm_prob: float = 0.15,
    max_predictions: int = 20,
    mask_mix: Sequence[float] = DEFAULT_MASK_MIX,
    *,
    vocab_size: int,
    mask_id: int,
    whole_word: bool = False,
    is_continuation: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask a batch: returns (masked input_ids, labels) with labels -100 where not predicted.

    `input_ids` (B, T) integer, `special_mask` (B, T) bool (True = never predicted: specials
    and padding). `is_continuation` is the per-vocabulary-id ``##`` flag table (V,) bool, needed
    for `whole_word`. Same distribution as :func:`mask_tokens`: a uniformly random subset of
    the allowed size (or, with whole words, the same greedy pass over words in random order).
    """
    input_ids = input_ids.long()
    special_mask = special_mask.bool()
    batch, length = input_ids.shape
    candidates = ~special_mask  # (B, T)
    num_candidates = candidates.sum(dim=1)  # (B,)
    budget = torch.round(num_candidates.double() * masked_lm_prob).long().clamp(min=1, max=max_predictions)  # (B,)

    if not whole_word:
        # Random scores, non-candidates last: the `budget` smallest form a uniform random subset.
        scores = torch.rand(batch, length, generator=generator)
        scores = scores.masked_fill(special_mask, 2.0)
        ranks = scores.argsort(dim=1).argsort(dim=1)  # (B, T) rank of each position
        chosen = candidates & (ranks < budget[:, None])
    else:
        if is_continuation is None:
            raise ValueError("whole-word masking needs is_continuation")
        continues = is_continuation.to(torch.bool)[input_ids]  # (B, T)
        previous_candidate = torch.zeros_like(candidates)
        previous_candidate[:, 1:] = candidates[:, :-1]
        word_start = candidates & ~(continues & previous_candidate)  # (B, T)
        group_of = torch.cumsum(word_start.long(), dim=1) - 1  # (B, T) word index per position
        group_of = group_of.clamp(min=0)
        # Per word (indexed by its number): a random sort key and a size; unused slots sort last.
        # Slot `length` is a dump for positions that do not start a word.
        group_scores = torch.full((batch, length + 1), 2.0)
        start_scores = torch.rand(batch, length, generator=generator)
        group_scores.scatter_(1, torch.where(word_start, group_of, length), start_scores)
        group_scores = group_scores[:, :length]
        group_sizes = torch.zeros(batch, length, dtype=torch.long)
        group_sizes.scatter_add_(1, group_of, candidates.long())
        order = group_scores.argsort(dim=1)  # words in random order, (B, T)
        sizes_in_order = group_sizes.gather(1, order)
        taken_in_order = torch.zeros(batch, length, dtype=torch.bool)
        total = torch.zeros(batch, dtype=torch.long)
        num_groups = int(word_start.sum(dim=1).max()) if batch else 0
        # The original's greedy pass, one word slot at a time for all rows together.
        for slot in range(num_groups):
            size = sizes_in_order[:, slot]
            take = (size > 0) & (total + size <= budget)
            taken_in_order[:, slot] = take
            total += size * take
            if slot % 16 == 15 and bool((total >= budget).all()):
                break
        taken_group = torch.zeros(batch, length, dtype=torch.bool)
        taken_group.scatter_(1, order, taken_in_order)
        chosen = candidates & taken_group.gather(1, group_of)

    mask_share, same_share, _ = mask_mix
    draw = torch.rand(batch, length, generator=generator)
    random_ids = torch.randint(0, vocab_size, (batch, length), generator=generator)
    to_mask = chosen & (draw < mask_share)
    to_random = chosen & (draw >= mask_share + same_share)
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(to_random, random_ids, masked)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    return masked, labels
