"""Masked language modelling (paper §3.1, Task #1), with next-sentence prediction (Task #2: BERT) or
without it (the paper's No-NSP ablation, §5.1)."""

from __future__ import annotations

import numpy as np
import torch

from .base import BatchRows, Objective


class MaskedLM(Objective):
    """Predict the masked tokens: the data's stored static masks, or masks drawn now (dynamic)."""

    flag = "mlm"

    def __init__(self, nsp: bool):
        self.nsp = nsp
        self.name = "bert" if nsp else "no-nsp"
        self.label = "BERT (MLM + NSP)" if nsp else "No NSP"
        self.short_label = "BERT" if nsp else "No NSP"
        self.deviation = None if nsp else "no next-sentence prediction (paper: MLM + NSP)"

    def inputs_and_labels(self, rows: BatchRows) -> tuple[torch.Tensor, torch.Tensor]:
        if rows.masking == "static":
            count, width = rows.input_ids.shape
            labels = np.full((count, width), -100, dtype=np.int64)
            labels[rows.stored[0], rows.stored[1]] = rows.stored[2]
            return rows.input_ids, torch.from_numpy(labels)
        return rows.draw_masks(rows.input_ids, rows.special)


MLM_NSP = MaskedLM(nsp=True)
MLM_ONLY = MaskedLM(nsp=False)
