"""predict_batches: outputs back in input order, token-level ones cut to each row's length, and a
sequence-level output never cut, even when its width equals the padded length."""

import torch

from bertkit import BertForQuestionAnswering, BertForSequenceClassification
from bertkit.inference.predict_batches import predict_batches


def rows(lengths):
    return [{"input_ids": [101] + [1037 + i] * (n - 2) + [102], "token_type_ids": [0] * n, "attention_mask": [1] * n}
            for i, n in enumerate(lengths)]


def test_a_sequence_output_as_wide_as_the_padding_is_kept_whole(tiny_model, tmp_path, one_thread):
    model = BertForSequenceClassification.from_pretrained(
        tiny_model(BertForSequenceClassification, tmp_path / "cls", num_labels=8))
    features = rows([8, 5, 8])  # one batch, padded to 8 tokens: as many as the labels
    got = predict_batches(model, features, batch_size=4)["logits"]
    assert [tuple(v.shape) for v in got] == [(8,)] * 3
    alone = model(**{k: torch.tensor([v]) for k, v in features[1].items()}).logits[0]
    torch.testing.assert_close(got[1], alone, atol=1e-5, rtol=1e-5)


def test_token_level_outputs_lose_the_padding_only(tiny_model, tmp_path, one_thread):
    model = BertForQuestionAnswering.from_pretrained(tiny_model(BertForQuestionAnswering, tmp_path / "qa"))
    features = rows([9, 4, 6])
    got = predict_batches(model, features, batch_size=4, output_keys=("start_logits", "end_logits"))
    assert [v.shape[0] for v in got["start_logits"]] == [9, 4, 6] == [v.shape[0] for v in got["end_logits"]]
    alone = model(**{k: torch.tensor([v]) for k, v in features[1].items()}).start_logits[0]
    torch.testing.assert_close(got["start_logits"][1], alone, atol=1e-5, rtol=1e-5)
