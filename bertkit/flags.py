"""Argument types that reject impossible flag values while parsing, before any work starts.

Each is an argparse `type=`: it returns the converted value or raises ArgumentTypeError with the
reason, which the CLI prints as one `error:` line. Comma lists (the fine-tuning grids) check each
item the same way.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable

import torch

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:(\d+))?")


def _int(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, not {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def int_between(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number in [low, high] (high: no limit when None)."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < low or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, not {value}")
        return value

    parse.__name__ = f"int_between_{low}_{high}"
    return parse


# Seeds feed torch, numpy and random alike: numpy takes 0 .. 2**32 - 1.
seed = int_between(0, 2**32 - 1)
seed.__name__ = "seed"


def finite_float(text: str) -> float:
    return _float(text)


def positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, not {value:g}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value:g}")
    return value


def probability(text: str) -> float:
    """A fraction in [0, 1] (masking and warm-up ratios)."""
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {value:g}")
    return value


def open_fraction(text: str) -> float:
    """A fraction strictly between 0 and 1 (a split that leaves something on both sides)."""
    value = _float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, not {value:g}")
    return value


def positive_number(text: str) -> int | float:
    """A positive count that may be fractional (epochs): '3' -> 3, '2.5' -> 2.5."""
    value = positive_float(text)
    return int(value) if value.is_integer() else value


def device(text: str) -> str:
    match = DEVICE_PATTERN.fullmatch(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"device must be auto, cpu, cuda or cuda:N, not {text!r}")
    # Without CUDA at all, the device module says so when the device is picked.
    if match.group(2) is not None and torch.cuda.is_available() and int(match.group(2)) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"there is no {text}: this machine has {torch.cuda.device_count()} GPU(s)")
    return str(text)


def comma_list(item: Callable[[str], object]) -> Callable[[str], list]:
    """'5e-5,3e-5' -> [5e-05, 3e-05], each item checked by `item`; an empty list is refused."""

    def parse(text) -> list:
        if isinstance(text, (list, tuple)):
            return [item(str(t)) for t in text]
        values = [item(t) for t in str(text).split(",") if t.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, not {text!r}")
        return values

    parse.__name__ = f"{item.__name__}_list"
    return parse


# ---------------------------------------------------------------- wall-clock budgets

# A budget is N seconds, Ns, Nm, Nh (N may have a fraction: 1.5h) or NhNm (whole numbers: 1h30m), nothing else:
# a looser pattern read `1.5.5m` as 1.5 s + .5 min. A week is far beyond any run bertkit plans (the paper's
# pre-training took 4 days on 16 TPU chips); a larger figure is a typo, and would plan absurd step counts.
BUDGET_PATTERN = re.compile(r"(?:(\d+(?:\.\d+)?)([smh]?)|(\d+)h(\d+)m)", re.ASCII)
BUDGET_CEILING_SECONDS = 7 * 24 * 3600
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def duration_seconds(text) -> float:
    """'900', '90s', '15m', '1.5h', '1h30m' -> seconds in (0, one week]; ValueError with the reason otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"time budget {text!r} is not a duration such as 900, 15m, 1h or 1h30m")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = BUDGET_PATTERN.fullmatch(str(text).strip().lower())
        if not match:
            raise ValueError(f"time budget {text!r} is not a duration: give N seconds, Ns, Nm, Nh or NhNm "
                             "(e.g. 900, 15m, 1.5h, 1h30m)")
        if match.group(1) is not None:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        else:
            if int(match.group(4)) >= 60:
                raise ValueError(f"time budget {text!r}: the minutes of NhNm must be below 60")
            seconds = int(match.group(3)) * 3600 + int(match.group(4)) * 60
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"time budget must be positive, not {text!r}")
    if seconds > BUDGET_CEILING_SECONDS:
        raise ValueError(f"time budget {text!r} is more than a week ({BUDGET_CEILING_SECONDS} s); give at most 168h")
    return seconds


def duration(text: str) -> float:
    """argparse type for --time-budget."""
    try:
        return duration_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
