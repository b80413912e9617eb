"""Fixtures the task tests share."""

import pytest

from bertkit import BertForMaskedLM


@pytest.fixture(scope="module")
def base_model(tiny_model, tmp_path_factory):
    """A tiny pre-trained-like folder (random weights, all-MiniLM-L6-v2's vocabulary) to fine-tune from."""
    return tiny_model(BertForMaskedLM, tmp_path_factory.mktemp("base"), max_positions=64)
