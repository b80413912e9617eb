"""InferenceEngine.pool and unit_length (numpy's arithmetic, for speed on one vector) against
sentence-transformers' Pooling and Normalize written in torch."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from bertkit.inference.engine import InferenceEngine, Pooling, unit_length


def reference(tokens: torch.Tensor, mode: str, normalize: bool) -> torch.Tensor:
    tokens = tokens.double()
    vector = {"mean": lambda: tokens.mean(0), "cls": lambda: tokens[0], "max": lambda: tokens.max(0).values}[mode]()
    return F.normalize(vector, dim=0) if normalize else vector


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
@pytest.mark.parametrize("normalize", [None, False, True])
@pytest.mark.parametrize("length", [1, 7, 64])
def test_pool_is_sentence_transformers_pooling(mode, normalize, length):
    generator = torch.Generator().manual_seed(length)
    tokens = torch.randn(length, 384, generator=generator) * 3 - 1
    engine = SimpleNamespace(pooling=Pooling(mode, normalize=True))  # the folder's Normalize, when not overridden
    got = InferenceEngine.pool(engine, tokens, normalize)
    assert got.dtype == torch.float32 and got.shape == (384,)
    torch.testing.assert_close(got.double(), reference(tokens, mode, True if normalize is None else normalize),
                               rtol=1e-6, atol=1e-6)


def test_pool_without_a_pooling_file_is_mean_pooling_and_takes_other_dtypes():
    tokens = torch.randn(9, 32, dtype=torch.bfloat16)
    got = InferenceEngine.pool(SimpleNamespace(pooling=None), tokens)
    torch.testing.assert_close(got.double(), reference(tokens.float(), "mean", False), rtol=1e-6, atol=1e-6)


def test_unit_length_is_torch_normalize():
    vector = torch.randn(768) * 50
    torch.testing.assert_close(unit_length(vector), F.normalize(vector, dim=0), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(unit_length(vector[::3]), F.normalize(vector[::3], dim=0), rtol=1e-6, atol=1e-7)
    assert torch.equal(unit_length(torch.zeros(8)), torch.zeros(8))  # F.normalize's floor: no NaN
    assert torch.isnan(unit_length(torch.tensor([1.0, float("nan")]))).all()  # refused later, by the JSON writer
