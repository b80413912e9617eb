"""The one training loop shared by pre-training and every fine-tuning task."""

from .loop import Phase, TrainArgs, TrainResult, fit
from .optim import build_optimizer, linear_schedule

__all__ = ["Phase", "TrainArgs", "TrainResult", "fit", "build_optimizer", "linear_schedule"]
