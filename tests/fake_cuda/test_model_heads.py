"""The encoder and every head, forward and backward on CUDA: fp32, bf16 autocast, fp16 autocast with
a GradScaler (the device comes from conftest.py: faked, or real with BERTKIT_TEST_DEVICE=cuda)."""

import pytest
import torch

from bertkit import BertModel
from bertkit.heads import (BertForMaskedLM, BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering,
                           BertForSequenceClassification, BertForTokenClassification)
from bertkit.train.optim import build_optimizer

from fake_cuda_device import needs_cuda_runtime, needs_real_values

pytestmark = pytest.mark.fake_cuda

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def head_inputs(cls, cuda, B=2, T=8):
    """Inputs with labels for `cls`, on the device; padding in the second row (lengths T and T-3)."""
    ids, mask = cuda.ids(B, T), cuda.padding([T, T - 3], T)
    d = cuda.device
    if cls is BertForMultipleChoice:
        return {"input_ids": ids[:, None].expand(B, 3, T), "attention_mask": mask[:, None].expand(B, 3, T),
                "labels": torch.zeros(B, dtype=torch.long, device=d)}
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    if cls is BertForSequenceClassification:
        inputs["labels"] = torch.ones(B, dtype=torch.long, device=d)
    elif cls is BertForTokenClassification:
        inputs["labels"] = torch.zeros(B, T, dtype=torch.long, device=d)
    elif cls is BertForQuestionAnswering:
        inputs["start_positions"] = torch.ones(B, dtype=torch.long, device=d)
        inputs["end_positions"] = torch.full((B,), 2, dtype=torch.long, device=d)
    elif cls is BertForPreTraining:
        inputs["next_sentence_label"] = torch.zeros(B, dtype=torch.long, device=d)  # MLM logits everywhere
    return inputs


def objective(cls, out):
    """A scalar to differentiate: the loss, or for the models without labels here their outputs."""
    if cls is BertModel:
        return out.last_hidden_state.float().mean() + out.pooler_output.float().mean()
    if cls is BertForMaskedLM:
        return out.logits.float().logsumexp(-1).mean()
    if cls is BertForPreTraining:
        return out.loss + out.prediction_logits.float().logsumexp(-1).mean()
    return out.loss


HEADS = [BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification, BertForQuestionAnswering,
         BertForTokenClassification, BertForMultipleChoice]


def forward(cuda, cls, precision, train=True):
    """One forward pass in `precision` (dropout on with `train`); the scalar to differentiate."""
    model = cuda.model(cls, num_labels=3).train(train)
    dtype = PRECISIONS[precision]
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        out = model(**head_inputs(cls, cuda))
        loss = objective(cls, out)
    assert loss.device == cuda.device and loss.dtype == torch.float32
    assert all(v.device == cuda.device for v in out.values() if torch.is_tensor(v))
    return model, out, loss


@pytest.mark.parametrize("cls", HEADS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_forward_on_cuda(cuda, cls, precision):
    """Every head in training mode (dropout drawn on the device) in fp32, bf16 and fp16 autocast."""
    model, out, _ = forward(cuda, cls, precision)
    if cls is BertModel:
        assert out.last_hidden_state.shape == (2, 8, model.config.hidden_size)
        if precision != "fp32":  # the matmuls ran in the autocast dtype (the last op: a LayerNorm -> fp32)
            assert out.pooler_output.dtype == PRECISIONS[precision]


@needs_cuda_runtime
@pytest.mark.parametrize("cls", HEADS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_backward_and_step_on_cuda(cuda, cls, precision):
    """Backward and a fused AdamW step, fp16 through a GradScaler (real device: autograd)."""
    with torch.enable_grad():
        model, _, loss = forward(cuda, cls, precision)
        optimizer = build_optimizer(model, 1e-3)
        scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
        scaler.scale(loss).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.device == cuda.device and g.dtype == torch.float32 for g in grads)
    scaler.step(optimizer)
    scaler.update()
    assert torch.isfinite(loss)


@needs_real_values
@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM], ids=lambda c: c.__name__)
def test_masked_positions_only(cuda, cls):
    """MLM logits at labels != -100 only (boolean-mask indexing: real values needed)."""
    model = cuda.model(cls)
    ids = cuda.ids()
    positions = torch.arange(ids.shape[1], device=cuda.device)
    labels = torch.where(positions[None] == 2, ids, torch.full_like(ids, -100))
    extra = {"next_sentence_label": torch.zeros(2, dtype=torch.long, device=cuda.device)} \
        if cls is BertForPreTraining else {}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=labels, **extra)
    assert out.prediction_logits.shape == (2, model.config.vocab_size)
    assert torch.isfinite(out.loss)


def test_a_hidden_cpu_tensor_is_caught(cuda, monkeypatch):
    """The check itself: a position index made without a device (the bug this suite is for) fails."""
    from bertkit import model as model_module
    forward = model_module.BertEmbeddings.forward

    def planted(self, input_ids, token_type_ids=None, position_ids=None):
        return forward(self, input_ids, token_type_ids, torch.arange(input_ids.shape[1]))  # no device

    monkeypatch.setattr(model_module.BertEmbeddings, "forward", planted)
    model = cuda.model(BertModel)
    with pytest.raises(RuntimeError, match="(?i)device"):
        model(cuda.ids())
