"""`bertkit export --format onnx`: onnxruntime on the exported graph gives bertkit's outputs (within
1e-4) on padded variable-length batches of other sizes than the export's example, for each head."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

from bertkit import BertConfig
from bertkit.cli import main
from bertkit.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                           BertForTokenClassification)
from bertkit.heads import load_model
from bertkit.model import BertModel



def _padded_batch(lengths, T, vocab=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), T), generator=g)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    ids = ids * mask  # [PAD] = 0 at padding
    types = torch.zeros_like(ids)
    types[:, T // 2:] = 1
    return ids, mask, types * mask


@pytest.mark.parametrize("cls", [BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering,
                                 BertModel])
def test_onnx_outputs_equal_bertkits_on_padded_batches(cls, tmp_path):
    torch.manual_seed(0)
    cls(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   max_position_embeddings=128, num_labels=5)).save_pretrained(tmp_path)
    assert main(["export", "--model", str(tmp_path), "--format", "onnx", "--output", str(tmp_path / "model.onnx")]) == 0
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    model = load_model(tmp_path).eval()
    names = [o.name for o in session.get_outputs()]
    for lengths, T in (([37, 5, 100, 1], 100), ([3], 3), ([20, 20], 20), ([60, 2, 17, 9, 31, 44, 8], 64)):
        ids, mask, types = _padded_batch(lengths, T)
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()})
        with torch.no_grad():  # bertkit with its default speed options (unpadding, oneDNN)
            expected = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        for name, value in zip(names, got):
            want = expected[name].numpy()
            assert value.shape == want.shape
            if value.ndim >= 2 and value.shape[1] == T:  # token-level: real positions only
                for row, length in enumerate(lengths):
                    np.testing.assert_allclose(value[row, :length], want[row, :length], atol=1e-4, rtol=0)
            else:
                np.testing.assert_allclose(value, want, atol=1e-4, rtol=0)


def test_multiple_choice_exports_with_a_choices_axis(tmp_path):
    torch.manual_seed(0)
    BertForMultipleChoice(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path)
    assert main(["export", "--model", str(tmp_path), "--output", str(tmp_path / "mc.onnx")]) == 0
    session = ort.InferenceSession(str(tmp_path / "mc.onnx"))
    ids, mask, types = _padded_batch([9, 30, 4, 30, 12, 7], 30)
    ids, mask, types = (t.view(2, 3, 30) for t in (ids, mask, types))
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()})[0]
    with torch.no_grad():
        want = load_model(tmp_path).eval()(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_export_of_a_missing_folder_is_a_one_line_error(tmp_path, capsys):
    assert main(["export", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "m.onnx")]) == 2
    assert "error:" in capsys.readouterr().err and not (tmp_path / "m.onnx").exists()
