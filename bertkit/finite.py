"""Finite-number checks: a weight or a loss that is NaN or infinite is refused where it first appears.

A checkpoint holding a NaN trains to `loss nan` and writes NaN features without a word; a loss that
turns non-finite poisons every weight at the next optimizer step. Both stop here with one line.
"""

from __future__ import annotations

import torch

from .errors import BertkitError


def check_finite_tensors(tensors: dict[str, torch.Tensor], source: str) -> None:
    """Refuse the first floating-point tensor holding NaN or Inf, naming it and its file."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = (~torch.isfinite(tensor)).sum().item()
            kind = "NaN" if bool(torch.isnan(tensor).any()) else "infinite"
            raise BertkitError(f"tensor {name} holds {bad} {kind} value(s) of {tensor.numel()}: the weights are "
                               "corrupt (a diverged or damaged checkpoint); refusing to use them", path=source)


def check_finite_loss(loss: float, step: int) -> None:
    """Stop at the first non-finite training loss (before the optimizer step that would spread it)."""
    if not torch.isfinite(torch.as_tensor(loss)).item():
        raise BertkitError(f"the training loss is {loss} at step {step}: training diverged (try a lower learning "
                           "rate or check the data); stopped, the last saved checkpoint is kept as it was")


def check_finite_weights(model: torch.nn.Module, step: int) -> None:
    """Before a checkpoint is written: weights that turned non-finite (an update from a huge gradient
    can overflow before any loss shows it) stop the run instead of replacing a good checkpoint."""
    for name, parameter in model.named_parameters():
        if not bool(torch.isfinite(parameter.detach()).all()):
            raise BertkitError(f"weight {name} is no longer finite after step {step}: training diverged (try a "
                               "lower learning rate); stopped before saving, the last saved checkpoint is kept")
