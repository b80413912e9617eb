"""The budget recipe fitted to the data's vocabulary: the cost model against torch's own count of a
forward pass, and the choice it makes, named among the deviations."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bertkit import BertConfig, BertForPreTraining, kernels
from bertkit.pretraining.recipe import (
    BUDGET_RECIPES,
    MEASURED_VOCAB_SIZE,
    multiply_adds_per_token,
    resolve_recipe,
    step_cost_ratio,
)


def _counted_multiply_adds_per_token(vocab_size, batch=16, length=128, predictions=20):
    torch.manual_seed(0)
    # torch's own Linear: the counter sees F.linear, not oneDNN's (the AVX-512 classes' default) nor
    # oneDNN's packed GEMM (the AVX2 class's).
    options = kernels.default_options().replace(packed_weights="none", onednn_linear="never")
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=vocab_size), kernels=options).eval()
    ids = torch.randint(5, vocab_size, (batch, length))
    labels = torch.full((batch, length), -100)
    positions = torch.arange(1, length, length // predictions)[:predictions]
    labels[:, positions] = ids[:, positions]  # 320 predicted rows: a multiple of the head's row padding
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    return counter.get_total_flops() / 2 / (batch * length)


@pytest.mark.parametrize("vocab_size", [MEASURED_VOCAB_SIZE, 30522])
def test_cost_model_matches_torchs_count_of_a_forward_pass(vocab_size):
    encoder, vocabulary = multiply_adds_per_token("tiny", vocab_size)
    config = BertConfig.preset("tiny")
    # The counter does not see bertkit's attention kernel: its two products, 2 x length x hidden a
    # token and layer, are left out of the comparison.
    attention = config.num_hidden_layers * 2 * 128 * config.hidden_size
    counted = _counted_multiply_adds_per_token(vocab_size)
    assert encoder + vocabulary - attention == pytest.approx(counted, rel=0.01)


def test_a_large_vocabulary_halves_the_budget_recipes_batch_and_says_why():
    measured = BUDGET_RECIPES[0][1]
    same, deviations = resolve_recipe({}, 15 * 60, vocab_size=MEASURED_VOCAB_SIZE)
    assert same.batch_size == measured.batch_size and not same.fitted_to_vocab_size
    assert not any("vocabulary" in d for d in deviations)

    fitted, deviations = resolve_recipe({}, 15 * 60, vocab_size=30522)
    assert step_cost_ratio("tiny", 30522) > 1.5
    assert fitted.batch_size == measured.batch_size // 2 and fitted.fitted_to_vocab_size == 30522
    note = next(d for d in deviations if "30,522-piece vocabulary" in d)
    assert "train-tokenizer" in note and "1.7x" in note

    # What the user gives is kept; without a budget the paper's settings are not touched.
    given, _ = resolve_recipe({"batch_size": 32}, 15 * 60, vocab_size=30522)
    assert given.batch_size == 32 and not given.fitted_to_vocab_size
    paper, _ = resolve_recipe({}, None, vocab_size=30522)
    assert paper.batch_size == 256 and not paper.fitted_to_vocab_size
    # A wider model's step is less dominated by the output layer: BERT-MINI keeps its batch.
    mini, _ = resolve_recipe({"model_config": "mini"}, 15 * 60, vocab_size=30522)
    assert mini.batch_size == measured.batch_size and step_cost_ratio("mini", 30522) < 1.5


@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_the_rule_per_vocabulary_size_is_one_bound_per_model(preset):
    """Below the bound the measured recipe's batch, from it on half; the bound is where a step costs
    1.5x the measured one's, and docs/pre-training.md states BERT-TINY's."""
    from pathlib import Path

    from bertkit.pretraining.recipe import COSTLIER_STEP, batch_halving_vocab_size

    bound = batch_halving_vocab_size(preset)
    assert step_cost_ratio(preset, bound - 1) < COSTLIER_STEP <= step_cost_ratio(preset, bound)
    measured = BUDGET_RECIPES[0][1].batch_size
    for vocab_size, batch in ((MEASURED_VOCAB_SIZE, measured), (bound - 1, measured), (bound, measured // 2),
                              (250_000, measured // 2)):
        recipe, _ = resolve_recipe({"model_config": preset}, 15 * 60, vocab_size=vocab_size)
        assert recipe.batch_size == batch, (preset, vocab_size)
        assert recipe.fitted_to_vocab_size == (vocab_size if batch < measured else 0)
    # By hand for BERT-TINY (L=2, H=128, I=512; 20 of 128 positions predicted): encoder 2 x (4 x 128^2 +
    # 2 x 128 x 512 + 2 x 128 x 128) + (20/128) x 128^2 = 461,312 multiply-adds a token, 20 a token per
    # vocabulary piece; (461,312 + 20 V) / (461,312 + 20 x 8,192) >= 1.5 from V = 23,820.8.
    if preset == "tiny":
        assert bound == 23_821
        guide = (Path(__file__).resolve().parents[2] / "docs" / "pre-training.md").read_text(encoding="utf-8")
        assert f"{bound:,} pieces" in guide
