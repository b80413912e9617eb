"""The embedding routes' JSON writer (serving/embeddings.py): every float32 comes back exactly, the
rest of the answer is what json.dumps writes, and a tensor holding NaN or infinity is refused."""

import json

import numpy as np
import pytest
import torch

from bertkit.serving.embeddings import json_with_vectors


def test_every_float32_comes_back_exactly():
    rng = np.random.default_rng(0)
    # magnitudes from subnormal to near the float32 maximum, both signs, zeros, and float32's edges
    values = (rng.standard_normal(20_000) * 10.0 ** rng.integers(-45, 38, 20_000)).astype(np.float32)
    edges = np.array([0.0, -0.0, 1.0, 0.1, np.finfo(np.float32).max, np.finfo(np.float32).tiny,
                      np.finfo(np.float32).smallest_subnormal, np.nextafter(np.float32(1), np.float32(2))],
                     dtype=np.float32)
    vector = torch.from_numpy(np.concatenate([values, edges]))
    back = np.array(json.loads(json_with_vectors(vector)), dtype=np.float32)
    np.testing.assert_array_equal(back, vector.numpy())


def test_the_rest_of_the_answer_is_json_dumps_own():
    vectors = torch.tensor([[0.5, -0.25], [1.0, 2.0]])
    answer = {"object": "list", "data": [{"index": 0, "embedding": vectors[0]}, {"index": 1, "embedding": vectors}],
              "model": 'a "quoted"\nname é', "usage": {"prompt_tokens": 3, "ok": True, "none": None}, "empty": []}
    expected = {**answer, "data": [{"index": 0, "embedding": [0.5, -0.25]},
                                   {"index": 1, "embedding": [[0.5, -0.25], [1.0, 2.0]]}]}
    assert json.loads(json_with_vectors(answer)) == expected
    assert json.loads(json_with_vectors([torch.zeros(0)])) == [[]]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused(bad):
    with pytest.raises(ValueError, match="NaN or infinity"):
        json_with_vectors([torch.tensor([0.5, bad])])


def test_tensors_of_any_layout_and_float_type_are_written_as_their_numbers():
    """A transposed (not C-ordered) tensor row by row; bf16 and fp16 as the float32 they widen to;
    float64 at its own precision; integer tensors as integers."""
    def back(tensor):
        return np.array(json.loads(json_with_vectors(tensor)), dtype=np.float32)

    matrix = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    np.testing.assert_array_equal(back(matrix.t()), matrix.t().numpy())
    half = torch.tensor([0.1, -2.5, 1e-3], dtype=torch.bfloat16)
    np.testing.assert_array_equal(back(half), half.float().numpy())
    np.testing.assert_array_equal(back(half.half()), half.half().float().numpy())
    assert json.loads(json_with_vectors(torch.tensor([0.1], dtype=torch.float64))) == [0.1]
    assert json.loads(json_with_vectors({"ids": torch.tensor([3, 1]), "score": torch.tensor(0.5)})) == \
        {"ids": [3, 1], "score": 0.5}


def test_views_half_precision_and_integer_tensors_are_written_as_their_values():
    matrix = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8
    assert json.loads(json_with_vectors(matrix.t())) == (matrix.t()).tolist()  # a non-contiguous view
    assert json.loads(json_with_vectors(matrix[:, 1])) == matrix[:, 1].tolist()
    assert json.loads(json_with_vectors(torch.tensor([0.5, 1.5], dtype=torch.bfloat16))) == [0.5, 1.5]
    assert json.loads(json_with_vectors(torch.tensor([3, -2]))) == [3, -2]
    assert json.loads(json_with_vectors(torch.tensor(0.25))) == 0.25
    assert json.loads(json_with_vectors(torch.ones(2, requires_grad=True))) == [1.0, 1.0]
    with pytest.raises(ValueError, match="NaN or infinity"):
        json_with_vectors(torch.tensor([1.0, float("inf")], dtype=torch.bfloat16))
