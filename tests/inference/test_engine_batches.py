"""The inference engine's batches: one input runs at its own length (no padding rows, no mask),
several run padded to a bucketed length and unpadded inside the model; the answers are the model's
own on the exact, unpadded input either way."""

import pytest
import torch

from bertkit.inference import InferenceEngine
from bertkit.inference.engine import LENGTH_BUCKET, pad_rows

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return InferenceEngine(tiny_model_dir)


def test_one_input_is_not_padded_and_several_are_bucketed():
    one = pad_rows([{"input_ids": [101, 7, 8, 102], "token_type_ids": [0] * 4, "attention_mask": [1] * 4}], 0)
    assert one["input_ids"].shape == (1, 4) and bool(one["attention_mask"].all())
    rows = [{"input_ids": [101] + [7] * n + [102], "token_type_ids": [0] * (n + 2), "attention_mask": [1] * (n + 2)}
            for n in (2, 5)]
    two = pad_rows(rows, 0)
    assert two["input_ids"].shape == (2, LENGTH_BUCKET)
    assert two["attention_mask"].sum().item() == 4 + 7


def test_a_lone_input_runs_at_its_length_with_the_models_numbers(engine):
    texts = ["a lone request from a search box", "short", "a third one, a little longer than the first"]
    seen = []
    single = engine.forward(engine.encode(texts[:1]), on_batch=lambda rows, tokens: seen.append((rows, tokens)))
    rows = engine.encode(texts[:1])
    assert seen == [(1, len(rows[0]["input_ids"]))]  # no bucketing: the tokens it has
    ids = torch.tensor([rows[0]["input_ids"]])
    with torch.no_grad():
        direct = engine.model(input_ids=ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state[0]
    torch.testing.assert_close(single[0]["last_hidden_state"], direct, rtol=0, atol=1e-5)
    # the same text inside a padded, unpadded batch: the same vector at every real position
    batched = engine.forward(engine.encode(texts))
    torch.testing.assert_close(batched[0]["last_hidden_state"], direct, rtol=0, atol=1e-5)


def test_int8_quantises_a_copy_of_a_given_model(tiny_model_dir):
    from bertkit.heads import load_model

    model = load_model(tiny_model_dir, require_head=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = InferenceEngine(None, model=model, tokenizer=tiny_model_dir, quantize="int8")
    assert engine.model is not model
    assert type(model.encoder.layer[0].attention.self.query).__name__ == "Linear"
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
