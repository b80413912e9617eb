"""Every speed option in bertkit/kernels/ against its reference path: oneDNN Linear against
float64 matmuls and F.linear, the written-out attention against SDPA, fast dropout masks against
the Bernoulli statistics they must have, unpadding and fused QKV against the padded / separate
model (and transformers), bf16 training against fp32 training on the same batches, the traced
model against the eager one, and the CPU-feature fallbacks on an emulated AVX2-only CPU."""

import dataclasses
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import bertkit
from bertkit import BertConfig, kernels
from bertkit.device import cpu_features
from bertkit.errors import BertkitError
from bertkit.kernels import KernelOptions, speed_options
from bertkit.kernels.attention import explicit_attention_pays
from bertkit.kernels.options import _from_environment


def options_with(**changes) -> KernelOptions:
    """The process default options with `changes`: what a model built with `kernels=` would hold."""
    return kernels.PROCESS_DEFAULT.replace(**changes)


def holding(model, **changes):
    """The model, now holding `options_with(**changes)` (as if built with them)."""
    return model.hold_kernels(options_with(**changes))


@pytest.fixture(autouse=True)
def small_thread_count():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: extra threads only spin on a shared machine
    yield
    torch.set_num_threads(threads)


def rel_err(ours: torch.Tensor, exact: torch.Tensor) -> float:
    return float((ours.detach().double() - exact.detach()).abs().max() / exact.detach().abs().max())


# ---------------------------------------------------------------- oneDNN Linear


needs_onednn = pytest.mark.skipif(not kernels.onednn_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows, inputs, outputs", [(37, 64, 96), (5, 48, 3000), (2 * 19, 96, 24)])
def test_onednn_linear_matches_float64_forward_and_backward(rows, inputs, outputs):
    """Both ways of forming the weight gradient (out > or < in) and a 3-D input."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, rows // 2 + 1, inputs, generator=g, requires_grad=True)
    w = (torch.randn(outputs, inputs, generator=g) * 0.1).requires_grad_()
    b = torch.randn(outputs, generator=g, requires_grad=True)
    grad = torch.randn(2, rows // 2 + 1, outputs, generator=g)
    y = kernels.linear(x, w, b, options_with(onednn_linear="training"))
    assert y.grad_fn is not None and "OneDNN" in type(y.grad_fn).__name__
    y.backward(grad)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    yd = F.linear(xd, wd, bd)
    yd.backward(grad.double())
    assert rel_err(y, yd) < 1e-5
    assert rel_err(x.grad, xd.grad) < 1e-5
    assert rel_err(w.grad, wd.grad) < 1e-5
    assert rel_err(b.grad, bd.grad) < 1e-5
    assert w.grad.is_contiguous() and w.grad.shape == w.shape


@needs_onednn
def test_onednn_linear_modes_and_fallbacks():
    x, w = torch.randn(6, 8), torch.randn(4, 8)
    with torch.no_grad():
        always = kernels.linear(x, w, None, options_with(onednn_linear="always"))
        inference = kernels.linear(x, w, None, options_with(onednn_linear="training"))  # no gradient: MKL, bitwise F.linear
        never = kernels.linear(x, w, None, options_with(onednn_linear="never"))
    reference = F.linear(x, w)
    assert torch.equal(inference, reference) and torch.equal(never, reference)
    torch.testing.assert_close(always, reference, rtol=1e-5, atol=1e-6)
    b = torch.randn(4)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), torch.profiler.profile() as profile:
        autocast_reference = F.linear(x, w, b)
        # oneDNN directly on the operands autocast would make
        direct = kernels.linear(x, w, b, options_with(onednn_linear="always"))
        assert torch.equal(kernels.linear(x, w, b, options_with(onednn_linear="training")), autocast_reference)
    assert direct.dtype == torch.bfloat16
    # The direct bf16 kernel where the CPU has bf16; torch's own route (the same as autocast) elsewhere.
    direct_call = any("_linear_pointwise" in event.name for event in profile.events())
    assert direct_call == cpu_features().bf16
    if not cpu_features().bf16:
        assert torch.equal(direct, autocast_reference)
    exact = F.linear(x.bfloat16().double(), w.bfloat16().double(), b.bfloat16().double())
    assert rel_err(direct.float(), exact) < 1e-2 and rel_err(autocast_reference.float(), exact) < 1e-2
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast with gradients: plain F.linear, cast to bf16
        assert kernels.linear(x.requires_grad_(), w).dtype == torch.bfloat16
    assert kernels.linear(torch.randn(0, 8, requires_grad=True), w).shape == (0, 4)


@needs_onednn
def test_linear_gelu_fuses_only_in_onednn_inference_and_matches_float64():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(37, 64, generator=g), torch.randn(96, 64, generator=g) * 0.2, torch.randn(96, generator=g)
    exact = F.gelu(F.linear(x.double(), w.double(), b.double()))  # erf GELU

    def run(**options):
        with torch.no_grad(), torch.profiler.profile() as profile:
            y = kernels.linear_gelu(x, w, b, options_with(**options))
        return y, {event.name for event in profile.events()}

    fused, fused_ops = run(onednn_linear="always", fused_gelu=True)
    separate, separate_ops = run(onednn_linear="always", fused_gelu=False)
    mkl, mkl_ops = run(onednn_linear="training", fused_gelu=True)  # no oneDNN matmul here: F.gelu(F.linear)
    assert "aten::gelu" not in fused_ops and "aten::gelu" in separate_ops and "aten::gelu" in mkl_ops
    assert rel_err(fused, exact) < 1e-5 and rel_err(separate, exact) < 1e-5
    assert torch.equal(mkl, F.gelu(F.linear(x, w, b)))
    x.requires_grad_()
    y = kernels.linear_gelu(x, w, b, options_with(onednn_linear="always", fused_gelu=True))  # gradients: unfused
    assert "Gelu" in type(y.grad_fn).__name__
    torch.testing.assert_close(y.detach(), fused, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- attention


def attention_inputs(dtype=torch.float32, B=3, A=2, T=7, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, A, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("masking", ["none", "padding", "causal", "causal+padding"])
def test_explicit_attention_matches_sdpa_with_gradients(masking):
    B, T = 3, 7
    padding = torch.arange(T)[None] < torch.tensor([7, 4, 2])[:, None]  # (B, T)
    mask = padding[:, None, None, :] if "padding" in masking else None
    causal = masking.startswith("causal")
    if causal and mask is not None:
        mask = mask & torch.ones(T, T, dtype=torch.bool).tril()
        causal = False  # as BertSelfAttention: the causal flag only without a mask
    results = {}
    for mode in ("explicit", "sdpa"):
        q, k, v = attention_inputs()
        out = kernels.attention(q, k, v, attn_mask=mask, is_causal=causal, options=options_with(attention=mode))
        out.backward(torch.ones_like(out))
        results[mode] = (out, q.grad, k.grad, v.grad)
    for ours, reference in zip(results["explicit"], results["sdpa"]):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_explicit_attention_rows_with_nothing_to_attend_are_zero_not_nan():
    q, k, v = attention_inputs(T=4)
    mask = torch.zeros(3, 1, 4, 4, dtype=torch.bool)
    mask[0] = True  # first sequence attends everywhere, the others nowhere
    out = kernels.attention(q, k, v, attn_mask=mask, options=options_with(attention="explicit"))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    assert out[1:].abs().max() == 0


def test_explicit_attention_chosen_where_it_pays():
    q, k, v = attention_inputs()
    auto = explicit_attention_pays
    assert auto(q, 0.1)  # training with dropout: SDPA would take its math path
    assert not auto(q, 0.0)  # fp32 training without dropout: SDPA's fused kernel
    assert auto(q.detach().bfloat16().requires_grad_(), 0.0)  # bf16 training
    with torch.no_grad():
        assert not auto(q, 0.1)  # inference: SDPA

    def runs_sdpa(mode):
        with torch.profiler.profile() as profile:
            kernels.attention(q, k, v, dropout_p=0.1, options=options_with(attention=mode))
        return any(event.name == "aten::scaled_dot_product_attention" for event in profile.events())

    # Asked for, SDPA is what runs (one selector: the option the caller or model holds).
    assert runs_sdpa("sdpa") and not runs_sdpa("auto") and not runs_sdpa("explicit")


def test_attention_dropout_is_inverted_dropout_on_the_probabilities():
    """Uniform attention (q = 0) over T equal values: each output is the mean kept share x value / (1-p)."""
    B, A, T, D = 4, 4, 64, 2
    q = torch.zeros(B, A, T, D, requires_grad=True)
    k = torch.randn(B, A, T, D)
    v = torch.ones(B, A, T, D)
    torch.manual_seed(0)
    out = kernels.attention(q, k, v, dropout_p=0.25, options=options_with(attention="explicit"))
    kept_share = out[..., 0].flatten()  # = (kept / T) / (1 - p): mean 1 over rows
    assert abs(kept_share.mean().item() - 1.0) < 4 * math.sqrt(0.25 / 0.75 / T / kept_share.numel())
    assert kept_share.std() > 0.05  # rows differ: the mask is random, not a constant scale


@pytest.mark.parametrize("mode", ["sdpa", "explicit"])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_attention_matches_masked_padded_attention_with_gradients(mode, causal):
    """Sequences of lengths 1 .. T (one full-length) packed one after another, plus rounding rows
    that belong to none, against the padded (B, A, T, D) layout with a key-padding mask."""
    lengths, A, D, extra = [5, 1, 9, 3, 9, 0, 2], 3, 4, 3
    B, T, H = len(lengths), max(lengths), A * D
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]  # (B, T)
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, T, 3 * H, generator=g)
    real = mask.view(-1).nonzero().squeeze(1)
    packed = torch.cat([qkv.view(B * T, -1)[real], torch.randn(extra, 3 * H, generator=g)]).requires_grad_()
    padded = qkv.clone().requires_grad_()
    grad_out = torch.randn(B, T, H, generator=g)
    options = options_with(attention=mode)
    ours = kernels.packed_attention(*packed.chunk(3, -1), lengths, A, is_causal=causal, options=options)
    q, k, v = padded.view(B, T, 3, A, D).permute(2, 0, 3, 1, 4)
    attn_mask = mask[:, None, None, :] & (torch.ones(T, T, dtype=torch.bool).tril() if causal else True)
    reference = kernels.attention(q, k, v, attn_mask=attn_mask, options=options).transpose(1, 2).reshape(B, T, H)
    assert ours.shape == (int(mask.sum()) + extra, H)
    torch.testing.assert_close(ours[:-extra], reference.reshape(B * T, H)[real], rtol=1e-5, atol=1e-6)
    assert ours[-extra:].abs().max() == 0  # rows of no sequence: zeros
    (ours[:-extra] * grad_out.view(B * T, H)[real]).sum().backward()
    (reference * grad_out * mask[..., None]).sum().backward()
    torch.testing.assert_close(packed.grad[:-extra], padded.grad.view(B * T, -1)[real], rtol=1e-5, atol=1e-6)
    assert packed.grad[-extra:].abs().max() == 0
    if not causal:  # one sequence of length 1 attends only to itself: its context is its value
        start = lengths[0]
        torch.testing.assert_close(ours[start], packed[start, 2 * H:].detach())


# ---------------------------------------------------------------- fast dropout masks


def keep_mask(shape, p):
    drop, scale = kernels.drop_mask(shape, p)
    return ~drop, scale


def test_keep_mask_has_bernoulli_statistics():
    torch.manual_seed(0)
    n, p = 1_000_001, 0.1
    keep, scale = keep_mask((n,), p)
    p_rounded = round(p * 32768) / 32768
    assert abs(p_rounded - p) < 1e-4 and scale == pytest.approx(1 / (1 - p_rounded))
    rate = keep.float().mean().item()
    assert abs(rate - (1 - p_rounded)) < 5 * math.sqrt(p * (1 - p) / n)
    # The two masks cut from one random draw (even / odd positions) are independent, and so are
    # the draws: the joint rates of neighbours match the product of the marginals.
    a, b = keep[0:-1:2].float(), keep[1::2].float()
    both = (a * b).mean().item()
    assert abs(both - (1 - p_rounded) ** 2) < 5 * math.sqrt(0.81 * 0.19 / a.numel())
    c = keep[1:-1:2].float()  # odd position with the next even one: different draws
    d = keep[2::2].float()
    assert abs((c * d).mean().item() - (1 - p_rounded) ** 2) < 5 * math.sqrt(0.81 * 0.19 / c.numel())
    # No position pattern: keep rates in the first and second half of each 16-bit field agree.
    assert abs(keep[: n // 2].float().mean().item() - keep[n // 2:].float().mean().item()) < 0.003


def test_keep_mask_uses_the_full_fifteen_bits():
    torch.manual_seed(1)
    for p in (1 / 32768, 0.5, 1 - 1 / 32768):
        keep, _ = keep_mask((400_000,), p)
        expected = 1 - round(p * 32768) / 32768
        assert abs(keep.float().mean().item() - expected) < 5 * math.sqrt(max(expected * (1 - expected), 1e-5) / 4e5)


def test_fast_dropout_forward_backward_and_seeding():
    x = torch.randn(50, 40, requires_grad=True)
    torch.manual_seed(3)
    y = kernels.dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(kernels.dropout(x, 0.3), y)  # seeded by torch's generator
    kept = y != 0
    scale = 1 / (1 - round(0.3 * 32768) / 32768)
    torch.testing.assert_close(y[kept], x[kept] * scale)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, kept.float() * scale)  # the forward's mask, same scale
    assert kernels.dropout(x, 0.3, training=False) is x
    assert "_Dropout" in y.grad_fn.name()
    assert "_Dropout" not in kernels.dropout(x, 0.3, fast=False).grad_fn.name()  # torch's own dropout
    module = kernels.Dropout(0.3)
    module.kernels = options_with(fast_dropout=False)  # what a model holding these options sets
    assert "_Dropout" not in module(x).grad_fn.name()


def test_dropout_module_keeps_nn_dropout_interface():
    module = kernels.Dropout(0.2)
    assert isinstance(module, torch.nn.Dropout) and module.p == 0.2
    x = torch.randn(10, 10)
    assert torch.equal(module.eval()(x), x)


# ---------------------------------------------------------------- unpadding and fused QKV (model level)


def tiny_config(**kw):
    return BertConfig.preset("mini", vocab_size=200, max_position_embeddings=64, **kw)


def padded_batch(lengths, seed=0, vocab=200, left=False):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1, vocab, (len(lengths), T), generator=g) * mask
    types = (torch.arange(T)[None] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {k: v.flip(-1) for k, v in batch.items()} if left else batch


def randomized(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def test_unpadding_decision():
    full = torch.ones(4, 64, dtype=torch.long)
    assert kernels.unpadding_for(full) is None
    few = full.clone()
    few[:, -8:] = 0  # 32 padding tokens: below the auto threshold
    many = full.clone()
    many[:, 16:] = 0  # 192
    assert kernels.unpadding_for(few) is None
    unpadded = kernels.unpadding_for(many)
    assert unpadded is not None and unpadded.tokens == 64 and unpadded.tokens % kernels.PROCESS_DEFAULT.unpad_multiple == 0
    assert kernels.unpadding_for(few, options_with(unpad="always", unpad_multiple=1)).tokens == 4 * 56
    assert kernels.unpadding_for(many, options_with(unpad="never")) is None


def test_small_unpadded_counts_round_to_eight_up_to_unpad_fine_rows():
    """The engine's rounding (inference/engine.engine_kernels): 64-row steps for oneDNN's shapes, but a
    count of at most 128 tokens to a multiple of 8, the row counts its padded lone inputs make; with
    bertkit's AVX2 GEMM (no kernel made per shape) 8-row steps throughout."""
    from bertkit.inference.engine import engine_kernels, shapes_free
    from bertkit.kernels import graph_gemm

    options = engine_kernels(kernels.PROCESS_DEFAULT.replace(packed_weights="onednn"))
    assert (options.unpad, options.unpad_multiple, options.unpad_fine_rows) == ("always", 64, 128)
    if torch._C.has_mkl and graph_gemm.eager_ops():  # the ops' library calls MKL (x86 torch)
        own = engine_kernels(kernels.PROCESS_DEFAULT.replace(packed_weights="bertkit"))
        assert shapes_free(own) and (own.unpad_multiple, own.unpad_fine_rows) == (8, 128)
        assert engine_kernels(own, unpad="auto").unpad_multiple == 64  # a GPU's: no packs there

    def rows(lengths, T=64):
        mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
        unpadded = kernels.unpadding_for(mask, options)
        return None if unpadded is None else unpadded.tokens

    assert rows([30, 20]) == 56  # 50 tokens: 56, not 64
    assert rows([64, 60], T=96) == 128  # 124: still under the fine limit
    assert rows([64, 64, 5], T=128) == 192  # 133: past it, the next multiple of 64
    assert rows([64, 60]) is None  # 128 rows either way: run padded
    assert rows([3, 1]) == 8
    assert rows([64, 1], T=64) == 72
    with pytest.raises(BertkitError, match="unpad_fine_rows must be 0"):
        kernels.PROCESS_DEFAULT.replace(unpad_fine_rows=-1)
    assert kernels.PROCESS_DEFAULT.unpad_fine_rows == 0  # a model outside the engine: as before


def test_unpadded_gathers_and_restores_real_tokens():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 1]])
    x = torch.arange(12.0).view(3, 4, 1).expand(3, 4, 2)
    unpadded = kernels.Unpadded(mask, multiple=4)
    assert unpadded.tokens == 8  # 7 real tokens rounded up with one padding position
    rows = unpadded.unpad(x)
    real = mask.bool().view(-1)
    assert set(rows[:, 0].tolist()) >= set(torch.arange(12.0)[real].tolist())
    assert unpadded.lengths == [3, 1, 3]
    # Packed order: each sequence's real tokens together, in sequence order, the rounding row last.
    assert rows[:7, 0].tolist() == [0.0, 1.0, 2.0, 4.0, 9.0, 10.0, 11.0]
    restored = unpadded.pad(rows)
    assert torch.equal(restored[mask.bool()], x[mask.bool()])
    assert int((restored[~mask.bool()] != 0).any(-1).sum()) <= 1  # at most the one rounding row


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("head", ["BertModel", "BertForSequenceClassification", "BertForQuestionAnswering"])
def test_unpadded_model_matches_padded_model_on_real_tokens(head, packed):
    config = tiny_config(num_labels=3)
    model = randomized(getattr(bertkit, head)(config)).eval()
    batch = padded_batch([40, 3, 17, 29, 1, 40, 8])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        reference = holding(model, unpad="never")(**batch, output_hidden_states=True)
        ours = holding(model, unpad="always", packed_attention=packed)(**batch, output_hidden_states=True)
    for a, b in zip(ours.hidden_states, reference.hidden_states, strict=True):
        torch.testing.assert_close(a[real], b[real], rtol=1e-5, atol=1e-5)
    for key in ("pooler_output", "logits"):
        if key in reference:
            torch.testing.assert_close(ours[key], reference[key], rtol=1e-5, atol=1e-5)
    if head == "BertForQuestionAnswering":
        torch.testing.assert_close(ours.start_logits[real], reference.start_logits[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head, outputs", [
    ("BertModel", ("last_hidden_state", "pooler_output")),
    ("BertForSequenceClassification", ("logits",)),
    ("BertForQuestionAnswering", ("start_logits", "end_logits")),
    ("BertForTokenClassification", ("logits",)),
    ("BertForMaskedLM", ("logits",)),
])
def test_packed_attention_model_matches_transformers(head, outputs, tmp_path):
    """Default speed options (packed attention on the unpadded tokens, oneDNN fp32 Linear, fused
    GELU) against transformers on mixed lengths: length 1, full length and in between, with
    token types; outputs compared at the real positions."""
    import transformers

    config = tiny_config(num_labels=3, type_vocab_size=2)
    ours = randomized(getattr(bertkit, head)(config)).eval()
    ours.save_pretrained(tmp_path)
    theirs = getattr(transformers, head).from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    batch = padded_batch([40, 1, 17, 40, 2, 33, 9, 25])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        assert kernels.unpadding_for(batch["attention_mask"]) is not None  # the packed path runs
        mine = ours(**batch)
        ref = theirs(**batch)
    for name in outputs:
        a, b = mine[name], ref[name]
        if a.dim() >= 2 and a.shape[:2] == real.shape:
            a, b = a[real], b[real]
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=lambda m: f"{head} {name}: {m}")


@pytest.mark.parametrize("left", [False, True])
def test_unpadded_causal_model_matches_transformers(left, tmp_path):
    import transformers

    config = tiny_config(is_decoder=True)
    ours = randomized(bertkit.BertModel(config)).eval()
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertModel.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    batch = padded_batch([30, 12, 5, 30, 21], left=left)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        mine = holding(ours, unpad="always")(**batch).last_hidden_state
    ref = theirs(**batch).last_hidden_state.detach()
    torch.testing.assert_close(mine[real], ref[real], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("packed", [True, False])
def test_speed_options_training_gradients_match_reference_and_transformers(packed, tmp_path):
    """The default options (oneDNN Linear in training, fused QKV, unpadding with packed or re-padded
    attention, written-out attention) against every option off, and against transformers: loss
    and every gradient, on rows of length 1 to full length."""
    import transformers

    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = randomized(bertkit.BertForPreTraining(config)).train()
    batch = padded_batch([40, 12, 33, 7, 40, 25, 1, 2])
    g = torch.Generator().manual_seed(5)
    chosen = (torch.rand(batch["input_ids"].shape, generator=g) < 0.2) & batch["attention_mask"].bool()
    labels = torch.where(chosen, batch["input_ids"], -100)
    targets = {"labels": labels, "next_sentence_label": torch.tensor([0, 1] * 4)}

    def gradients(model, **options):
        model.zero_grad()
        loss = holding(model, **options)(**batch, **targets).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    assert kernels.unpadding_for(batch["attention_mask"], options_with(unpad="always")) is not None
    fast_loss, fast = gradients(ours, unpad="always", attention="explicit", onednn_linear="training", fused_qkv=True,
                                packed_attention=packed)
    ref_loss, ref = gradients(ours, unpad="never", attention="sdpa", onednn_linear="never", fused_qkv=False)
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path, attn_implementation="sdpa").train()
    their_loss = theirs(**batch, **targets).loss
    their_loss.backward()
    their = {n: p.grad for n, p in theirs.named_parameters()}
    torch.testing.assert_close(fast_loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast_loss, their_loss.detach(), rtol=1e-5, atol=1e-6)
    assert set(fast) == set(ref) == set(their)
    for name in fast:
        torch.testing.assert_close(fast[name], ref[name], rtol=1e-4, atol=2e-6, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(fast[name], their[name], rtol=1e-4, atol=2e-6, msg=lambda m: f"{name}: {m}")


def test_fused_qkv_is_the_same_projection():
    layer = randomized(bertkit.BertModel(tiny_config())).encoder.layer[0].attention.self
    x = torch.randn(2, 5, layer.query.in_features)
    fused = torch.cat(kernels.project_qkv(x, layer.query, layer.key, layer.value, options_with(fused_qkv=True)), -1)
    separate = torch.cat(kernels.project_qkv(x, layer.query, layer.key, layer.value, options_with(fused_qkv=False)), -1)
    expected = torch.cat([layer.query(x), layer.key(x), layer.value(x)], -1)
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(separate, expected, rtol=0, atol=0)
    # A swapped-in layer (here a plain nn.Linear, as an adapter would be) runs as it is.
    plain = torch.nn.Linear(layer.query.in_features, layer.query.out_features)
    q, _, _ = kernels.project_qkv(x, plain, layer.key, layer.value, options_with(fused_qkv=True))
    torch.testing.assert_close(q, plain(x), rtol=0, atol=0)


def test_bf16_inference_with_speed_options_tracks_fp32():
    model = randomized(bertkit.BertModel(tiny_config())).eval()
    batch = padded_batch([40, 3, 17, 29, 1, 40, 8, 33])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        reference = model(**batch).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = holding(model, unpad="always")(**batch).last_hidden_state.float()
    error = (ours - reference)[real].abs()
    assert error.mean() < 0.02 and error.max() < 0.15  # bf16 keeps ~3 significant digits


# ---------------------------------------------------------------- bf16 training reaches the fp32 loss


def synthetic_mlm_batches(steps, batch_size=16, length=24, vocab=60, seed=0):
    """A learnable stream: every sequence repeats one random token, ~20% of positions masked, so a
    masked token is any visible neighbour (learnt through attention in a few dozen steps)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        ids = torch.randint(5, vocab, (batch_size, 1), generator=g).expand(batch_size, length).clone()
        chosen = torch.rand(ids.shape, generator=g) < 0.2
        chosen[:, 0] = True
        labels = torch.where(chosen, ids, -100)
        batches.append({"input_ids": ids.masked_fill(chosen, 4), "attention_mask": torch.ones_like(ids),
                        "labels": labels, "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g)})
    return batches


def test_bf16_training_reaches_the_fp32_loss():
    from bertkit.train.optim import build_optimizer

    steps = 60
    batches = synthetic_mlm_batches(steps)
    final = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = bertkit.BertForPreTraining(BertConfig.preset("tiny", vocab_size=60, max_position_embeddings=32)).train()
        optimizer = build_optimizer(model, lr=2e-3)
        losses = []
        for batch in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model(**batch).mlm_loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        final[precision] = (sum(losses[:5]) / 5, sum(losses[-8:]) / 8)
    (fp32_start, fp32_end), (bf16_start, bf16_end) = final["fp32"], final["bf16"]
    assert fp32_start > math.log(55) - 0.5  # starts near chance ...
    assert fp32_end < 0.6 * fp32_start  # ... and learns
    assert abs(bf16_end - fp32_end) < 0.1 * (fp32_start - fp32_end), final


# ---------------------------------------------------------------- the options themselves


def test_speed_options_are_values_and_validated():
    """An options value is immutable (a model holds it; nothing changes it under the model); a block
    gives its options to the models built inside it, and the default is back after it."""
    before = kernels.default_options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.unpad = "never"
    with speed_options(unpad="never") as options:
        assert options.unpad == "never" and kernels.default_options() is options
        model = bertkit.BertModel(tiny_config())
    assert kernels.default_options() == before and model.kernels.unpad == "never"
    assert bertkit.BertModel(tiny_config()).kernels == before
    with pytest.raises(BertkitError, match="unknown speed option 'turbo'"):
        with speed_options(turbo=True):
            pass
    with pytest.raises(BertkitError, match="unpad must be one of"):
        with speed_options(unpad="sometimes"):
            pass
    with pytest.raises(BertkitError, match="unpad must be one of"):
        KernelOptions(unpad="sometimes")


def test_a_removed_speed_option_is_an_unknown_one(monkeypatch):
    """grouped_attention and fused_residual (measured ~1.05x and ~1.0x) were removed before any release."""
    with pytest.raises(BertkitError, match="unknown speed option 'grouped_attention'"):
        with speed_options(grouped_attention=False):
            pass
    monkeypatch.setenv("BERTKIT_SPEED_OPTIONS", "fused_residual=1,unpad=never")
    with pytest.raises(BertkitError, match="unknown speed option 'fused_residual' \\(in BERTKIT_SPEED_OPTIONS\\)"):
        _from_environment()


def test_speed_options_from_the_environment(monkeypatch):
    monkeypatch.setenv("BERTKIT_SPEED_OPTIONS", "onednn_linear=never, unpad_min_saved_tokens=7,fast_dropout=0")
    options = _from_environment()
    assert (options.onednn_linear, options.unpad_min_saved_tokens, options.fast_dropout) == ("never", 7, False)
    monkeypatch.setenv("BERTKIT_SPEED_OPTIONS", "fast_dropout=maybe")
    with pytest.raises(BertkitError, match="BERTKIT_SPEED_OPTIONS"):
        _from_environment()




# ---------------------------------------------------------------- export and CPU features


@pytest.mark.parametrize("causal", [False, True])
def test_traced_default_model_handles_any_padding(causal):
    """torch.jit.trace of the default inference model, traced on a batch without padding, gives the
    eager outputs on padded variable-length batches (and the reverse): the trace records the
    plain padded path with its mask, not the branch the tracing batch happened to take."""
    model = randomized(bertkit.BertForSequenceClassification(tiny_config(num_labels=3, is_decoder=causal))).eval()
    full = padded_batch([40, 40, 40, 40])
    with torch.no_grad():
        traced = torch.jit.trace(model, (full["input_ids"], full["attention_mask"], full["token_type_ids"]),
                                 strict=False)
        traced_encoder = torch.jit.trace(model.bert, (full["input_ids"], full["attention_mask"]), strict=False)
        for lengths in ([40, 1, 17, 40, 2, 33, 9, 25], [12, 5, 3], [40, 40]):
            batch = padded_batch(lengths)
            ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
            torch.testing.assert_close(traced(ids, mask, types)["logits"], model(**batch).logits, rtol=1e-4, atol=1e-4)
            real = mask.bool()
            torch.testing.assert_close(traced_encoder(ids, mask)["last_hidden_state"][real],
                                       model.bert(ids, mask).last_hidden_state[real], rtol=1e-4, atol=1e-4)


def test_exported_default_model_handles_any_padding():
    """torch.export (what torch.onnx.export builds on) of the default encoder, recorded on a batch
    without padding, gives the eager outputs on a padded batch of the same shape."""
    model = randomized(bertkit.BertModel(tiny_config())).eval()
    full = padded_batch([40, 40, 40, 40])
    program = torch.export.export(model, (full["input_ids"], full["attention_mask"]), {"return_dict": False})
    batch = padded_batch([40, 1, 17, 33])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        exported = program.module()(batch["input_ids"], batch["attention_mask"], return_dict=False)
        eager = model(batch["input_ids"], batch["attention_mask"], return_dict=False)
    assert len(exported) == len(eager) == 2  # last_hidden_state, pooler_output
    torch.testing.assert_close(exported[0][real], eager[0][real], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(exported[1], eager[1], rtol=1e-4, atol=1e-4)


AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}

AVX2_SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F

    import bertkit
    from bertkit import BertConfig, kernels
    from bertkit.device import cpu_features, resolve_precision

    torch.set_num_threads(1)
    features = cpu_features()
    assert not features.avx512 and not features.bf16, features
    assert kernels.PROCESS_DEFAULT.onednn_linear == "never"  # the stock torch Linear without AVX-512
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    # The emulation is real: oneDNN has no bf16 inner product here (what crashed on Zen 3).
    x, w = torch.randn(6, 8).bfloat16(), torch.randn(4, 8).bfloat16()
    try:
        torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        raise SystemExit("oneDNN bf16 inner product ran: the AVX2 emulation did not take")
    except RuntimeError as e:
        assert "primitive descriptor" in str(e), e
    # bf16 inference and training with every speed option on (they must route around it).
    torch.manual_seed(0)
    config = BertConfig.preset("mini", vocab_size=200, max_position_embeddings=64)
    model = bertkit.BertForPreTraining(config)
    ids = torch.randint(1, 200, (6, 40))
    mask = (torch.arange(40)[None] < torch.tensor([40, 3, 17, 29, 1, 40])[:, None]).long()
    real = mask.bool()
    model.hold_kernels(kernels.PROCESS_DEFAULT.replace(onednn_linear="always", unpad="always"))
    model.eval()
    with torch.no_grad():
        fp32 = model.bert(ids * mask, mask).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model.bert(ids * mask, mask).last_hidden_state.float()
    assert (bf16 - fp32)[real].abs().mean() < 0.02
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids * mask, mask, labels=torch.where(real, ids, -100)).loss
    loss.backward()
    assert torch.isfinite(loss)
    print("fallbacks ok")
""")


def test_avx2_only_cpu_falls_back_to_kernels_it_has():
    """An AVX-512 machine emulating an AVX2-only CPU (oneDNN and MKL capped to AVX2): the features
    read as AVX2-only, the default Linear is torch's, and bf16 autocast (inference and training,
    even with the oneDNN options forced on) runs instead of failing to create a oneDNN primitive."""
    env = {**os.environ, **AVX2_ONLY, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", AVX2_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "fallbacks ok" in result.stdout, result.stderr[-3000:]
