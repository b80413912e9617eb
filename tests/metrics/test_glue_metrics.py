"""GLUE metrics against hand-computed values, textbook formulas and the real MRPC / STS-B dev sets."""

import csv
import math
import warnings

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.metrics import (
    MAX_LOG_PERPLEXITY,
    TASK_METRICS,
    accuracy,
    compute_glue_metrics,
    f1,
    glue_score,
    matthews_correlation,
    pearson,
    perplexity,
    spearman,
    task_score,
)


def test_accuracy_by_hand():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert isinstance(accuracy([0], [0]), float)


def test_binary_f1_by_hand():
    # TP = 2 (positions 0, 4), FP = 1 (position 1), FN = 1 (position 3): P = R = 2/3.
    assert f1([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(2 / 3)
    # Class 1 is the positive class: with 0 and 1 swapped, TP = 1 (position 2), FP = 1, FN = 1.
    assert f1([0, 0, 1, 1, 0], [0, 1, 1, 0, 0]) == pytest.approx(0.5)
    assert f1([1, 1, 1], [0, 0, 1]) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


def test_matthews_correlation_by_hand():
    # TP = 2, TN = 1, FP = 1, FN = 1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6.
    assert matthews_correlation([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(1 / 6)
    assert matthews_correlation([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)


def test_correlations_by_hand():
    # x = [1,2,3], y = [1,2,4]: sum dx*dy = 3, sum dx^2 = 2, sum dy^2 = 42/9 -> r = 9/sqrt(84).
    assert pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / math.sqrt(84))
    # Ranks with a tie: x -> [1, 2.5, 2.5, 4], y -> [1, 3, 2, 4]; Pearson of ranks = 4.5/sqrt(4.5*5).
    assert spearman([10, 20, 20, 30], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1, 2, 3, 4], [1, 10, 100, 1000]) == pytest.approx(1.0)


def test_degenerate_inputs_give_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert matthews_correlation([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0
        assert matthews_correlation([0, 0], [0, 0]) == 0.0
        assert pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
        assert spearman([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]) == 0.0
        assert f1([0, 0, 0], [0, 0, 0]) == 0.0  # no positives anywhere


def test_accepts_tensors_and_arrays():
    torch = pytest.importorskip("torch")
    assert accuracy(torch.tensor([1, 0, 2]), np.array([1, 1, 2])) == pytest.approx(2 / 3)
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), [1, 2, 4]) == pytest.approx(9 / math.sqrt(84))


@pytest.mark.parametrize(
    "call",
    [
        lambda: accuracy([1, 0], [1]),  # length mismatch
        lambda: accuracy([], []),  # nothing to score
        lambda: accuracy([[0.1, 0.9], [0.8, 0.2]], [1, 0]),  # logits instead of class ids
        lambda: f1([0, 2], [0, 1]),  # not binary
        lambda: pearson([1.0], [2.0]),  # correlation of one point
        lambda: compute_glue_metrics("squad", [1], [1]),  # not a GLUE task
        lambda: task_score("mrpc", {"f1": 0.9}),  # missing accuracy
        lambda: task_score("ax", {}),  # unlabelled
        lambda: glue_score({"wnli": {"accuracy": 0.5}}),  # nothing left to average
    ],
)
def test_bad_input_raises_bertkit_error(call):
    with pytest.raises(BertkitError):
        call()


def test_task_metric_table_is_the_glue_definition():
    assert TASK_METRICS == {
        "cola": ("matthews_correlation",),
        "sst-2": ("accuracy",),
        "mrpc": ("f1", "accuracy"),
        "qqp": ("f1", "accuracy"),
        "sts-b": ("pearson", "spearman"),
        "mnli": ("accuracy",),
        "mnli-mm": ("accuracy",),
        "qnli": ("accuracy",),
        "rte": ("accuracy",),
        "wnli": ("accuracy",),
        "ax": (),
    }


def test_compute_glue_metrics_keys_and_aliases():
    preds, labels = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    mrpc = compute_glue_metrics("MRPC", preds, labels)
    assert mrpc == {"f1": pytest.approx(2 / 3), "accuracy": pytest.approx(3 / 5)}
    assert set(compute_glue_metrics("qqp", preds, labels)) == {"f1", "accuracy"}
    assert set(compute_glue_metrics("CoLA", preds, labels)) == {"matthews_correlation"}
    assert set(compute_glue_metrics("sst2", preds, labels)) == {"accuracy"}
    assert set(compute_glue_metrics("STS_B", [1.0, 2.5, 4.0], [1.2, 2.0, 4.5])) == {"pearson", "spearman"}
    assert compute_glue_metrics("ax", preds, labels) == {}


def test_task_and_glue_scores_by_hand():
    assert task_score("mrpc", {"f1": 0.9, "accuracy": 0.8}) == pytest.approx(0.85)
    assert task_score("sts-b", {"pearson": 0.88, "spearman": 0.86, "accuracy": 0.0}) == pytest.approx(0.87)
    per_task = {
        "cola": {"matthews_correlation": 0.5},
        "mrpc": {"f1": 0.9, "accuracy": 0.8},  # 0.85
        "mnli": {"accuracy": 0.84},
        "mnli-mm": {"accuracy": 0.82},  # MNLI counts once: 0.83
        "wnli": {"accuracy": 0.10},  # left out by default
        "ax": {},  # never scored
    }
    assert glue_score(per_task) == pytest.approx((0.5 + 0.85 + 0.83) / 3)
    assert glue_score(per_task, include_wnli=True) == pytest.approx((0.5 + 0.85 + 0.83 + 0.10) / 4)
    # Only one MNLI flavour given: it is the MNLI entry.
    assert glue_score({"mnli-mm": {"accuracy": 0.8}, "rte": {"accuracy": 0.6}}) == pytest.approx(0.7)


def _read_tsv(path):
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_mrpc_dev_majority_class_baseline(data_dir):
    labels = [int(row["Quality"]) for row in _read_tsv(data_dir / "glue" / "MRPC" / "dev.tsv")]
    assert len(labels) == 408
    always_paraphrase = [1] * len(labels)
    positive_rate = sum(labels) / len(labels)
    metrics = compute_glue_metrics("mrpc", always_paraphrase, labels)
    # Predicting "paraphrase" everywhere: precision = positive rate, recall = 1.
    assert metrics["accuracy"] == pytest.approx(positive_rate)
    assert metrics["f1"] == pytest.approx(2 * positive_rate / (1 + positive_rate))
    # The GLUE baseline numbers for this set: 68.4 accuracy, 81.2 F1.
    assert round(100 * metrics["accuracy"], 1) == 68.4
    assert round(100 * metrics["f1"], 1) == 81.2
    assert compute_glue_metrics("cola", always_paraphrase, labels) == {"matthews_correlation": 0.0}


def _average_ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _textbook_pearson(xs, ys):
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    return covariance / math.sqrt(sum((x - mean_x) ** 2 for x in xs) * sum((y - mean_y) ** 2 for y in ys))


def test_sts_b_dev_correlations_match_textbook_formulas(data_dir):
    scores = [float(row["score"]) for row in _read_tsv(data_dir / "glue" / "STS-B" / "dev.tsv")]
    assert len(scores) == 1500
    rng = np.random.default_rng(0)
    # A noisy "model": rounded to half points so the prediction side has many ties too.
    predictions = list(np.round((np.array(scores) + rng.normal(0, 1.0, len(scores))) * 2) / 2)
    metrics = compute_glue_metrics("sts-b", predictions, scores)
    assert metrics["pearson"] == pytest.approx(_textbook_pearson(predictions, scores), abs=1e-12)
    assert metrics["spearman"] == pytest.approx(
        _textbook_pearson(_average_ranks(predictions), _average_ranks(scores)), abs=1e-12
    )
    assert 0.5 < metrics["spearman"] < 0.99


def test_perplexity():
    assert perplexity(0.0) == 1.0
    assert perplexity(math.log(3.99)) == pytest.approx(3.99)
    assert perplexity(1e9) == math.exp(MAX_LOG_PERPLEXITY)  # no OverflowError
    assert math.isnan(perplexity(float("nan")))
