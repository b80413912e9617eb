"""Pre-training hyper-parameters: the paper's (Devlin et al. 2019, §3.1 and appendix A.2) and,
for a wall-clock budget, the ones that measured best for that budget on a 2-core CPU.

`resolve_recipe(given, time_budget)` fills every setting the user did not give. Without a
budget the defaults are the paper's; with one they come from the `BUDGET_RECIPES` row for the
budget, and every difference from the paper is listed (`deviations`), so that the run's
config.json and the reproduction report can name them. Why each row is what it is, and the
measurements behind it: benchmarks/results/pretraining_budget.md (benchmarks/pretrain_budget.py).
"""

from __future__ import annotations

import dataclasses
import math

from ..config import PRESETS, BertConfig
from ..errors import BertkitError


@dataclasses.dataclass
class Recipe:
    model_config: str = "base"
    batch_size: int = 256
    learning_rate: float = 1e-4
    warmup_steps: int | None = 10000
    warmup_ratio: float = 0.0
    min_warmup_steps: int = 0  # floor under a warm-up given by warmup_ratio (train.plan.warmup_for)
    max_steps: int | None = 1_000_000
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    dropout: float = 0.1  # hidden and attention dropout while pre-training
    masked_lm_prob: float | None = None  # None: the data's own (15% in the paper)
    nsp: bool = True
    position_init: str = "normal"  # "sinusoidal": learned position embeddings start from the sine table
    short_seq_length: int = 0  # >0: the first short_seq_fraction of the steps on pairs cut to this length
    short_seq_fraction: float = 0.0
    fitted_to_vocab_size: int = 0  # >0: the batch was fitted to data with this many pieces (fit_to_vocabulary)


PAPER = Recipe()
# Without a budget: the paper's optimizer and schedule on a model and step count that fit a CPU
# (what `bertkit pretrain` has always defaulted to).
NO_BUDGET_DEFAULT = dataclasses.replace(PAPER, model_config="mini", max_steps=1000)

# Upper bound of the budget in seconds -> recipe. The first row whose bound is >= the budget is used.
# Measured on 2 cores with an 8,192-piece vocabulary: the first row at 15 minutes (AVX-512 + bf16)
# and 5 minutes (AVX-512, fp32), its learning rate by a sweep (tiny, 600 steps: 5e-4 7.2%, 1e-3
# 8.6%, 2e-3 9.9%, 4e-3 stalls at 4.2% held-out MLM accuracy). Longer budgets are not tuned yet:
# they keep the 15-minute choice up to two hours and move to `mini` beyond.
BUDGET_RECIPES: list[tuple[float, Recipe]] = [
    (2 * 3600, Recipe(model_config="tiny", batch_size=32, learning_rate=2e-3, warmup_steps=None, warmup_ratio=0.06,
                      min_warmup_steps=150, max_steps=None, dropout=0.0, short_seq_length=64, short_seq_fraction=0.7,
                      position_init="neighbours")),
    (float("inf"), Recipe(model_config="mini", batch_size=64, learning_rate=1e-3, warmup_steps=None,
                          warmup_ratio=0.06, max_steps=None, dropout=0.0)),
]


# The budget rows were measured on data with a vocabulary of this many pieces.
MEASURED_VOCAB_SIZE = 8192
# A step this many times the measured one's multiply-adds halves the batch (fit_to_vocabulary).
COSTLIER_STEP = 1.5
# Predicted positions per token: the paper's 20 of 128 (15% masking, at most 20 per sequence).
_PREDICTIONS_PER_TOKEN = 20 / 128


def multiply_adds_per_token(model_config: str, vocab_size: int, seq_length: int = 128) -> tuple[float, float]:
    """(encoder, vocabulary) multiply-adds per token of a pre-training forward pass with a preset
    model: the layers' projections, feed-forward and attention, and the output layer, which runs at
    the masked positions only (heads.masked_lm_loss) but over the whole vocabulary there. Backward
    costs about twice each, so the ratio holds for a step. For BERT-MINI it puts 30,522 pieces at
    1.24x the step of 8,192; measured 1.29x (0.688 against 0.535 s a step, "Recipe levers" in
    benchmarks/results/pretraining_budget.md)."""
    config = BertConfig.preset(model_config)
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    encoder = layers * (4 * hidden * hidden + 2 * hidden * inner + 2 * seq_length * hidden) \
        + _PREDICTIONS_PER_TOKEN * hidden * hidden  # + the prediction head's transform
    return encoder, _PREDICTIONS_PER_TOKEN * hidden * vocab_size


def step_cost_ratio(model_config: str, vocab_size: int) -> float:
    """Estimated cost of a step on data with `vocab_size` pieces over one with the measured 8,192."""
    return sum(multiply_adds_per_token(model_config, vocab_size)) / \
        sum(multiply_adds_per_token(model_config, MEASURED_VOCAB_SIZE))


def batch_halving_vocab_size(model_config: str) -> int:
    """The rule of `fit_to_vocabulary` as a number: the smallest vocabulary whose step costs
    COSTLIER_STEP x the measured 8,192-piece one's with this preset, from which the budget recipe's
    batch is halved (BERT-TINY: 23,821 pieces; bert-base-uncased's 30,522 are past it, a vocabulary
    trained with `bertkit train-tokenizer` at 8,192 or 16,384 is not). The output layer's cost grows
    linearly with the vocabulary, so the bound solves (E + cV) / (E + c x 8,192) = COSTLIER_STEP."""
    encoder, per_piece = multiply_adds_per_token(model_config, 1)
    bound = ((COSTLIER_STEP - 1) * encoder + COSTLIER_STEP * per_piece * MEASURED_VOCAB_SIZE) / per_piece
    size = math.ceil(bound)
    while step_cost_ratio(model_config, size) < COSTLIER_STEP:  # the float bound a hair under the ratio's own
        size += 1
    return size


def fit_to_vocabulary(recipe: Recipe, vocab_size: int) -> Recipe:
    """A budget recipe fitted to data with `vocab_size` pieces: half the batch when a step costs
    COSTLIER_STEP times the measured recipe's or more, so that the budget still holds about the
    updates that take MLM off its plateau (at this scale the number of updates decides that more
    than the sequences seen; batch 16 against 32 on the measured data: the same MLM accuracy)."""
    if recipe.model_config not in PRESETS or step_cost_ratio(recipe.model_config, vocab_size) < COSTLIER_STEP:
        return recipe
    return dataclasses.replace(recipe, batch_size=max(16, recipe.batch_size // 2), fitted_to_vocab_size=vocab_size)


def recipe_for_budget(seconds: float | None) -> Recipe:
    if not seconds:
        return NO_BUDGET_DEFAULT
    for bound, recipe in BUDGET_RECIPES:
        if seconds <= bound:
            return recipe
    raise AssertionError("the last row has no bound")


def resolve_recipe(given: dict, time_budget: float | None,
                   vocab_size: int | None = None) -> tuple[Recipe, list[str]]:
    """The recipe with the user's explicit settings (non-None values of `given`) on top, and the
    list of its deviations from the paper's settings. With a budget and the data's `vocab_size`,
    a batch size the user did not give is fitted to the vocabulary (`fit_to_vocabulary`)."""
    base = recipe_for_budget(time_budget)
    if time_budget and vocab_size and given.get("batch_size") is None:
        base = fit_to_vocabulary(dataclasses.replace(base, model_config=given.get("model_config") or base.model_config),
                                 vocab_size)
    unknown = set(given) - {f.name for f in dataclasses.fields(Recipe)}
    if unknown:
        raise BertkitError(f"unknown pre-training settings: {', '.join(sorted(unknown))}")
    recipe = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    if given.get("warmup_ratio") is not None and given.get("min_warmup_steps") is None:
        recipe = dataclasses.replace(recipe, min_warmup_steps=0)  # a warm-up share the user gives is taken as given
    if time_budget:
        recipe = dataclasses.replace(recipe, max_steps=None)  # the budget sets the step count
        if recipe.warmup_steps is not None and given.get("warmup_steps") is None:
            recipe = dataclasses.replace(recipe, warmup_steps=None)
    return recipe, deviations_from_paper(recipe, time_budget)


def deviations_from_paper(recipe: Recipe, time_budget: float | None) -> list[str]:
    out = []
    if time_budget:
        out.append(f"steps set by a wall-clock budget of {time_budget:.0f} s, learning rate decays to zero at its "
                   "end (paper: 1,000,000 steps)")
    if recipe.model_config != PAPER.model_config:
        out.append(f"model {recipe.model_config} (paper: BERT-BASE)")
    if recipe.batch_size != PAPER.batch_size:
        out.append(f"batch {recipe.batch_size} sequences (paper: 256)")
    if recipe.fitted_to_vocab_size:
        encoder, vocabulary = multiply_adds_per_token(recipe.model_config, recipe.fitted_to_vocab_size)
        out.append(f"batch halved for the data's {recipe.fitted_to_vocab_size:,}-piece vocabulary: the output layer "
                   f"is ~{vocabulary / (encoder + vocabulary):.0%} of a step's multiply-adds, a step ~"
                   f"{step_cost_ratio(recipe.model_config, recipe.fitted_to_vocab_size):.1f}x the "
                   f"{MEASURED_VOCAB_SIZE:,}-piece data's the budget recipe was measured on; half the batch keeps "
                   "its number of updates (estimated, not measured; a vocabulary trained on the corpus with "
                   "`bertkit train-tokenizer` makes every step cheaper)")
    if recipe.learning_rate != PAPER.learning_rate:
        out.append(f"peak learning rate {recipe.learning_rate:g} (paper: 1e-4)")
    if recipe.warmup_steps is None:
        floor = f", at least {recipe.min_warmup_steps} while under a third of them" if recipe.min_warmup_steps else ""
        out.append(f"warm-up {recipe.warmup_ratio:.0%} of the steps{floor} (paper: 10,000 steps)")
    elif recipe.warmup_steps != PAPER.warmup_steps:
        out.append(f"warm-up {recipe.warmup_steps} steps (paper: 10,000)")
    if recipe.dropout != PAPER.dropout:
        out.append(f"dropout {recipe.dropout:g} while pre-training (paper: 0.1; the saved config keeps 0.1 for "
                   "fine-tuning)")
    if recipe.masked_lm_prob is not None and recipe.masked_lm_prob != 0.15:
        out.append(f"masking rate {recipe.masked_lm_prob:.0%} (paper: 15%)")
    if recipe.weight_decay != PAPER.weight_decay:
        out.append(f"weight decay {recipe.weight_decay:g} (paper: 0.01)")
    if not recipe.nsp:
        out.append("no next-sentence prediction (paper: MLM + NSP)")
    if recipe.short_seq_length:
        out.append(f"the first {recipe.short_seq_fraction:.0%} of the steps on pairs cut to {recipe.short_seq_length} "
                   "tokens (paper: 90% at 128, then 512)")
    if recipe.position_init == "neighbours":
        out.append("position embeddings initialised from a sine table and the first layer's heads as previous- and "
                   "next-token heads on it ([CLS] with no position, attending over the pair), then learned (paper: "
                   "random normal)")
    elif recipe.position_init != PAPER.position_init:
        out.append(f"position embeddings initialised from the {recipe.position_init} table, then learned (paper: "
                   "random normal)")
    return out


__all__ = ["Recipe", "PAPER", "NO_BUDGET_DEFAULT", "BUDGET_RECIPES", "MEASURED_VOCAB_SIZE", "recipe_for_budget",
           "resolve_recipe", "deviations_from_paper", "fit_to_vocabulary", "step_cost_ratio", "multiply_adds_per_token",
           "batch_halving_vocab_size"]
