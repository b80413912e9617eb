"""GLUE metrics as the benchmark defines them, and the GLUE average.

Every metric takes predictions and gold labels (lists, NumPy arrays or CPU tensors) and returns a
Python float as a fraction (0.75, not 75.0). Classification metrics expect class ids, not logits.

Degenerate inputs follow one rule: a correlation that is undefined because one side is constant
is reported as 0.0 ("no measurable relationship") instead of NaN plus a warning. This covers MCC
with constant predictions or labels (scikit-learn also returns 0.0 there) and Pearson/Spearman of
a constant vector (SciPy would return NaN and warn). Binary F1 with no positive predictions and
no positive labels is 0.0 (scikit-learn's zero_division=0).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import BertkitError

# scipy.stats and scikit-learn are imported where a metric needs them: at module level they added
# ~1.3 s to the start of every command (the pre-training and serving commands included).

# Task name -> the metrics GLUE reports for it (leaderboard order).
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst-2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "qqp": ("f1", "accuracy"),
    "sts-b": ("pearson", "spearman"),
    "mnli": ("accuracy",),  # matched dev/test
    "mnli-mm": ("accuracy",),  # mismatched
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "ax": (),  # diagnostic set: no public labels (the GLUE server scores it)
}

_TASK_ALIASES = {
    "sst2": "sst-2",
    "stsb": "sts-b",
    "mnli-m": "mnli",
    "mnli-matched": "mnli",
    "mnli-mismatched": "mnli-mm",
    "diagnostic": "ax",
}

def canonical_task_name(task: str) -> str:
    """'SST-2', 'sst2', 'sst_2' -> 'sst-2'; unknown names raise BertkitError."""
    name = str(task).strip().lower().replace("_", "-")
    name = _TASK_ALIASES.get(name, name)
    if name not in TASK_METRICS:
        raise BertkitError(f"unknown GLUE task {task!r}; expected one of {', '.join(TASK_METRICS)}")
    return name


def _as_vector(values: Any, what: str) -> np.ndarray:
    if hasattr(values, "detach"):  # torch tensor
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise BertkitError(
            f"{what} must be a 1-D sequence, got shape {array.shape} "
            "(for classification pass class ids, e.g. logits.argmax(-1))"
        )
    return array


def _pair(preds: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    predictions = _as_vector(preds, "predictions")
    gold = _as_vector(labels, "labels")
    if len(predictions) != len(gold):
        raise BertkitError(f"{len(predictions)} predictions but {len(gold)} labels")
    if len(gold) == 0:
        raise BertkitError("no examples to score")
    return predictions, gold


def _is_constant(values: np.ndarray) -> bool:
    return bool(np.all(values == values[0]))


def accuracy(preds: Any, labels: Any) -> float:
    """Fraction of examples whose predicted class equals the label (also the SWAG metric)."""
    predictions, gold = _pair(preds, labels)
    return float(np.mean(predictions == gold))


def f1(preds: Any, labels: Any) -> float:
    """Binary F1 of the positive class 1 (MRPC, QQP)."""
    predictions, gold = _pair(preds, labels)
    for what, values in (("predictions", predictions), ("labels", gold)):
        unexpected = set(np.unique(values).tolist()) - {0, 1}
        if unexpected:
            raise BertkitError(f"binary F1 needs {what} in {{0, 1}}, found {sorted(unexpected)}")
    from sklearn import metrics as sk_metrics

    return float(sk_metrics.f1_score(gold, predictions, pos_label=1, average="binary", zero_division=0.0))


def matthews_correlation(preds: Any, labels: Any) -> float:
    """Matthews correlation coefficient (CoLA); 0.0 when either side is constant."""
    predictions, gold = _pair(preds, labels)
    if _is_constant(predictions) or _is_constant(gold):
        return 0.0  # the denominator is zero; checked here to avoid scikit-learn's warning
    from sklearn import metrics as sk_metrics

    return float(sk_metrics.matthews_corrcoef(gold, predictions))


def _correlation_inputs(preds: Any, labels: Any, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    predictions, gold = _pair(preds, labels)
    if len(gold) < 2:
        raise BertkitError(f"{name} correlation needs at least 2 examples, got {len(gold)}")
    predictions = predictions.astype(np.float64)
    gold = gold.astype(np.float64)
    if _is_constant(predictions) or _is_constant(gold):
        return None
    return predictions, gold


def pearson(preds: Any, labels: Any) -> float:
    """Pearson correlation (STS-B); 0.0 when either side is constant."""
    from scipy import stats

    pair = _correlation_inputs(preds, labels, "Pearson")
    return 0.0 if pair is None else float(stats.pearsonr(pair[0], pair[1]).statistic)


def spearman(preds: Any, labels: Any) -> float:
    """Spearman rank correlation (STS-B); 0.0 when either side is constant."""
    from scipy import stats

    pair = _correlation_inputs(preds, labels, "Spearman")
    return 0.0 if pair is None else float(stats.spearmanr(pair[0], pair[1]).statistic)


_METRIC_FUNCTIONS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_correlation,
    "pearson": pearson,
    "spearman": spearman,
}


def compute_glue_metrics(task: str, preds: Any, labels: Any) -> dict[str, float]:
    """The task's official metrics, e.g. {'f1': 0.88, 'accuracy': 0.84} for MRPC.

    AX has no public labels, so it yields an empty dict.
    """
    name = canonical_task_name(task)
    return {metric: _METRIC_FUNCTIONS[metric](preds, labels) for metric in TASK_METRICS[name]}


def task_score(task: str, metrics: Mapping[str, float]) -> float:
    """One number per task as GLUE ranks it: the mean of the task's metrics (MRPC/QQP: F1 and
    accuracy; STS-B: Pearson and Spearman), in the units given (fractions in, fraction out)."""
    name = canonical_task_name(task)
    wanted = TASK_METRICS[name]
    if not wanted:
        raise BertkitError(f"GLUE task {name!r} has no labelled metric to score")
    missing = [metric for metric in wanted if metric not in metrics]
    if missing:
        raise BertkitError(f"{name} scores need {', '.join(wanted)}; missing {', '.join(missing)}")
    return float(sum(float(metrics[metric]) for metric in wanted) / len(wanted))


def glue_score(per_task_metrics: Mapping[str, Mapping[str, float]], include_wnli: bool = False) -> float:
    """The GLUE average over the tasks given: task_score per task, MNLI matched and mismatched
    first averaged into one MNLI entry (as the GLUE leaderboard does), then the mean over tasks.

    WNLI is left out unless include_wnli=True (True gives the official leaderboard average; the
    BERT paper drops WNLI because of problems with how the data set was built); AX, a
    diagnostic, is never included. Note the BERT paper's Table 1 "Average" is a different number: it
    takes one metric per column (F1 for MRPC/QQP, Spearman for STS-B) and counts MNLI-m and
    MNLI-mm as two columns.
    """
    scores: dict[str, float] = {}
    for task, metrics in per_task_metrics.items():
        name = canonical_task_name(task)
        if name == "ax" or (name == "wnli" and not include_wnli):
            continue
        scores[name] = task_score(name, metrics)
    if "mnli" in scores and "mnli-mm" in scores:
        scores["mnli"] = (scores["mnli"] + scores.pop("mnli-mm")) / 2
    if not scores:
        raise BertkitError("no GLUE task with a score to average (WNLI and AX are left out)")
    return float(sum(scores.values()) / len(scores))
