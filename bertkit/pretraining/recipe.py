"""Pre-training hyper-parameters: the paper's (Devlin et al. 2019, §3.1 and appendix A.2) and,
for a wall-clock budget, the ones that measured best for that budget on a 2-core CPU.

`resolve_recipe(given, time_budget)` fills every setting the user did not give. Without a
budget the defaults are the paper's; with one they come from the `BUDGET_RECIPES` row for the
budget, and every difference from the paper is listed (`deviations`), so that the run's
config.json and the reproduction report can name them.

The budget rows were chosen by measurement (benchmarks/pretrain_budget.py; table and lever
ablations in benchmarks/results/pretraining_budget.md). What they change, and why:
- a smaller model for a shorter budget: in 15 minutes on 2 cores BERT-TINY (2 layers, 128 wide)
  takes ~6,000 steps of 32 sequences, BERT-MINI ~1,300; at this scale the number of updates decides
  how soon MLM leaves the "predict frequent tokens" plateau, more than depth or width;
- (outside the recipe, where the data is made) a smaller vocabulary: 8,192 pieces trained on the
  corpus instead of 30,522 make the embedding and output layers 4x cheaper and every piece
  frequent enough to be learned;
- no dropout while pre-training (Cramming): at this data size nothing is seen often enough
  to overfit, and dropout slows learning; the saved config carries the paper's 0.1 for
  fine-tuning;
- a higher peak learning rate with a short warm-up and linear decay to zero at the budget's
  end (Izsak et al. 2021); the warm-up is 6% of the steps but at least 150 (while under a third of
  them): at 2e-3 an 88-step warm-up wiped out the neighbour heads, 138 steps kept them;
- a smaller batch, 32 (more updates in the budget at the same sequences per second);
- a short-sequence phase: the first 70% of the steps see the same data's pairs cut to 64 tokens
  (the paper's own two-length schedule, §A.2, with the shorter length first): 2.6x the sequences
  per second, and attention spread over fewer positions; +1.7 to +1.9 points of held-out MLM
  accuracy at 5 minutes in three runs (64 for 70%, from separate data or cut at load time; 32 for
  50% the same, 32 for 80% less);
- neighbour heads (init.py): the position embeddings start from a sine table and the first layer's
  heads as previous- and next-token heads on it (all still learned). From random init the heads
  never learn to look at neighbours within these budgets and MLM stalls at the bag-of-words
  plateau (13-14% held-out); with them 22.0% at 5 minutes (21.3% without the short phase); [CLS]
  starts with no position in those heads, attending over the pair (held-out NSP 64.0% against
  55.3% at 8 minutes, 56.2% against 55.1% at 15; one run each, see init.py);
- NSP stays on (the paper's objective), so do sequence length 128 and the 15% masking rate (30%
  gained +0.3 MLM / +4.7 NSP points at 15 minutes in one run each: not clearly above noise).
"""

from __future__ import annotations

import dataclasses

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


def recipe_for_budget(seconds: float | None) -> Recipe:
    if not seconds:
        return NO_BUDGET_DEFAULT
    for bound, recipe in BUDGET_RECIPES:
        if seconds <= bound:
            return recipe
    raise AssertionError("the last row has no bound")


def resolve_recipe(given: dict, time_budget: float | None) -> tuple[Recipe, list[str]]:
    """The recipe with the user's explicit settings (non-None values of `given`) on top, and the
    list of its deviations from the paper's settings."""
    base = recipe_for_budget(time_budget)
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


__all__ = ["Recipe", "PAPER", "NO_BUDGET_DEFAULT", "BUDGET_RECIPES", "recipe_for_budget", "resolve_recipe", "deviations_from_paper"]
