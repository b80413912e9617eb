"""The inference engine's batches: one input is padded to a fine bucket and runs padded, several
run padded to a coarser bucketed length and unpadded inside the model; the answers are the model's
own on the exact, unpadded input either way. warm_up makes the lone shapes before any request."""

import pytest
import torch

from bertkit.inference import InferenceEngine
from bertkit.batching import LENGTH_BUCKET, SINGLE_LENGTH_BUCKET, pad_rows
from bertkit.inference.engine import WARM_UP_LENGTHS

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return InferenceEngine(tiny_model_dir)


def test_one_input_is_padded_to_the_fine_bucket_and_several_to_the_coarse_one():
    one = pad_rows([{"input_ids": [101, 7, 8, 102], "token_type_ids": [0] * 4, "attention_mask": [1] * 4}], 0)
    assert one["input_ids"].shape == (1, SINGLE_LENGTH_BUCKET) and one["attention_mask"].sum().item() == 4
    exact = pad_rows([{"input_ids": [7] * 16, "token_type_ids": [0] * 16, "attention_mask": [1] * 16}], 0)
    assert exact["input_ids"].shape == (1, 16) and bool(exact["attention_mask"].all())
    rows = [{"input_ids": [101] + [7] * n + [102], "token_type_ids": [0] * (n + 2), "attention_mask": [1] * (n + 2)}
            for n in (2, 5)]
    two = pad_rows(rows, 0)
    assert two["input_ids"].shape == (2, LENGTH_BUCKET)
    assert two["attention_mask"].sum().item() == 4 + 7


def test_a_lone_input_runs_at_its_bucket_with_the_models_numbers(engine):
    # The bucket is SINGLE_LENGTH_BUCKET's, or the input's own length where the fp32 GEMMs are
    # bertkit's AVX2 op, which makes nothing per shape (the avx2 class: engine.shapes_free)
    from bertkit.inference.engine import shapes_free

    assert engine.lone_bucket == (1 if shapes_free(engine.kernels) else SINGLE_LENGTH_BUCKET)
    texts = ["a lone request from a search box", "short", "a third one, a little longer than the first"]
    seen = []
    single = engine.forward(engine.encode(texts[:1]), on_batch=lambda rows, tokens: seen.append((rows, tokens)))
    rows = engine.encode(texts[:1])
    n = len(rows[0]["input_ids"])
    assert seen == [(1, -(-n // engine.lone_bucket) * engine.lone_bucket)] and n % SINGLE_LENGTH_BUCKET
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


def test_warm_up_runs_every_lone_bucket_and_a_batch(engine):
    seen = []
    forward = engine.forward
    engine.forward = lambda rows, **kw: seen.append([len(r["input_ids"]) for r in rows]) or forward(rows, **kw)
    try:
        engine.warm_up()
    finally:
        del engine.forward
    lone = [n for n in WARM_UP_LENGTHS if n <= engine.max_length]
    assert seen == [[n] for n in lone] + [lone]
