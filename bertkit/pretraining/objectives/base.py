"""What a pre-training objective is: one object that builds its batch's inputs and targets, names its
model head and its metrics, and says how it departs from the paper (as a data collator per
objective in transformers, and cramming's objective factory)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ...config import BertConfig
from ...heads import BertForMaskedLM, BertForPreTraining


@dataclasses.dataclass
class BatchRows:
    """The rows of a batch as PretrainingDataset.get_batch has them, before the objective's targets.

    input_ids (B, T) with any stored static masks already undone unless `stored_labels` is kept for
    a static-masking objective; `special` (B, T) bool: [CLS], the middle and final [SEP] and padding
    (never predicted); `lengths` (B,) real tokens per row. `masking` is "static" or "dynamic";
    `stored` the data's static masks as (rows, positions, original ids), or None. `draw_masks(ids,
    special)` masks a batch with the dataset's (or the caller's) masking settings.
    """

    input_ids: torch.Tensor
    special: torch.Tensor
    lengths: np.ndarray
    positions: np.ndarray
    masking: str
    stored: tuple | None
    draw_masks: object


class Objective:
    """One pre-training objective. Subclasses set the class attributes and `inputs_and_labels`.

    name: the registry key and the reproduction variant ("bert", "no-nsp", "ltr");
    flag: the `pretrain --objective` value run records and resume identities store;
    label / short_label: how reports name it; nsp: its batches carry next_sentence_label and its
    head has the NSP classifier; causal: left-to-right attention (config.is_decoder); masked: it
    predicts masked tokens (its input is masked, so masking settings apply);
    predicts / accuracy_name: what its "mlm_*" metrics measure, in words; deviation: how it
    departs from the paper's pre-training (None for the paper's own).
    """

    name: str
    flag: str
    label: str
    short_label: str
    nsp: bool = False
    causal: bool = False
    masked: bool = True
    predicts: str = "masked-token prediction"
    accuracy_name: str = "masked-token accuracy"
    deviation: str | None = None

    def head(self):
        """The model class it trains: BertForPreTraining with NSP, BertForMaskedLM without."""
        return BertForPreTraining if self.nsp else BertForMaskedLM

    def configure(self, config: BertConfig) -> BertConfig:
        """The model config this objective trains (left-to-right attention when causal)."""
        return config.replace(is_decoder=self.causal)

    def build_model(self, config: BertConfig):
        return self.head()(self.configure(config))

    def inputs_and_labels(self, rows: BatchRows) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels) for these rows; labels -100 where nothing is predicted."""
        raise NotImplementedError

    def metrics(self) -> tuple[str, ...]:
        """The held-out metrics it reports (make_evaluator's keys)."""
        names = ("mlm_loss", "mlm_accuracy", "mlm_perplexity")
        return names + (("nsp_accuracy",) if self.nsp else ())

    def batch_metrics(self, batch: dict, out) -> dict:
        """Running accuracies for the training logs, as (correct, total) pairs."""
        metrics = {}
        labels = batch.get("labels")
        logits = out.get("prediction_logits")
        if labels is not None and logits is not None:
            targets = labels[labels != -100]
            metrics["mlm_accuracy"] = (int((logits.argmax(-1) == targets).sum()), targets.numel())
        if self.nsp and "next_sentence_label" in batch and out.get("seq_relationship_logits") is not None:
            nsp = batch["next_sentence_label"]
            metrics["nsp_accuracy"] = (int((out["seq_relationship_logits"].argmax(-1) == nsp).sum()), nsp.numel())
        return metrics

    def __repr__(self) -> str:
        return f"<objective {self.name}>"
