"""The left-to-right language model of the paper's ablation (§5.1, "LTR & No NSP"): causal attention,
every position predicts the next token, no masking and no NSP."""

from __future__ import annotations

import numpy as np
import torch

from .base import BatchRows, Objective


class LeftToRight(Objective):
    name = "ltr"
    flag = "ltr"
    label = "LTR & No NSP"
    short_label = "LTR"
    causal = True
    masked = False
    predicts = "next-token prediction"
    accuracy_name = "next-token accuracy"
    deviation = "left-to-right objective (the paper's LTR ablation)"

    def inputs_and_labels(self, rows: BatchRows) -> tuple[torch.Tensor, torch.Tensor]:
        """Unmasked input_ids; position t predicts token t+1 while t+1 is a real token."""
        input_ids = rows.input_ids
        count, width = input_ids.shape
        next_is_real = np.zeros((count, width), dtype=bool)
        next_is_real[:, :-1] = rows.positions[:, 1:] < rows.lengths[:, None]
        labels = torch.full_like(input_ids, -100)
        labels[:, :-1] = input_ids[:, 1:]
        return input_ids, torch.where(torch.from_numpy(next_is_real), labels, torch.full_like(labels, -100))


LTR = LeftToRight()
