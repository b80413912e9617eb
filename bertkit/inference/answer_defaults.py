"""The default answer of every task, in one place: `bertkit predict`, `bertkit.pipeline` and `serve`
all read these, so the same model and input give the same answer whichever door they come through.

The anchor, for every task: what `transformers.pipeline(task)` does when called without options,
because that is the answer a BERT user already knows (transformers 5; for question answering,
whose pipeline transformers 5 dropped, transformers 4's QuestionAnsweringPipeline). Where Google's original
scripts chose differently, it is said beside the value; the fine-tuning and evaluation commands
(`bertkit finetune squad`, `bertkit squad predict`) keep the original's values, as the paper's
numbers were measured with them.
"""

from __future__ import annotations

# Text classification: the best label only (top_k=None: every label, best first). The score
# function follows the model's config (transformers' rule, `pipelines.score_function`):
# regression -> none, one output or multi-label -> sigmoid, otherwise softmax.
TEXT_CLASSIFICATION = {"top_k": 1, "function_to_apply": None}

# Token classification: one entity per token ("none"), as transformers' pipeline; "simple" groups
# B-/I- runs, "first" / "average" / "max" vote per word.
TOKEN_CLASSIFICATION = {"aggregation_strategy": "none", "ignore_labels": ("O",)}
AGGREGATION_STRATEGIES = ("none", "simple", "first", "average", "max")

# Question answering. transformers: longest answer 15 tokens (Google's run_squad.py: 30, kept by
# `bertkit squad`), windows of 384 tokens (both), questions cut to 64 tokens (both), the best
# span only, no empty answer unless asked, spans widened to whole words. `doc_stride` is the step
# between windows, 128 (run_squad's meaning, and `bertkit squad`'s; transformers' tokenizer takes
# it as the overlap of consecutive windows), and a span is kept only in the window where it has
# the most context (run_squad's rule; transformers keeps it in every window).
QUESTION_ANSWERING = {"top_k": 1, "max_answer_len": 15, "max_seq_len": 384, "doc_stride": 128,
                      "max_question_len": 64, "handle_impossible_answer": False}

# Fill-mask: the five most likely tokens per [MASK], from the whole vocabulary (targets=None).
FILL_MASK = {"top_k": 5, "targets": None}

# Zero-shot classification over an NLI model (Yin et al. 2019, as transformers' pipeline).
ZERO_SHOT_CLASSIFICATION = {"hypothesis_template": "This example is {}.", "multi_label": False}

DEFAULTS = {
    "text-classification": TEXT_CLASSIFICATION,
    "token-classification": TOKEN_CLASSIFICATION,
    "question-answering": QUESTION_ANSWERING,
    "fill-mask": FILL_MASK,
    "zero-shot-classification": ZERO_SHOT_CLASSIFICATION,
}

__all__ = ["DEFAULTS", "AGGREGATION_STRATEGIES", "TEXT_CLASSIFICATION", "TOKEN_CLASSIFICATION",
           "QUESTION_ANSWERING", "FILL_MASK", "ZERO_SHOT_CLASSIFICATION"]
