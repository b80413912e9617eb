"""Model options transformers users call: output_attentions (equal to transformers' eager maps on
every attention path), gradient checkpointing (same gradients), resize_token_embeddings (tied
decoder and bias follow, transformers loads the result), dtype= at load and bf16 / fp16 inference."""

import copy

import pytest
import torch
import transformers

import bertkit
from bertkit import BertConfig, BertkitError, kernels
from bertkit.heads import BertForMaskedLM, BertForPreTraining, BertForSequenceClassification


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def tiny(**overrides) -> BertConfig:
    return BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64, **overrides)


def batch(rows=3, length=20, seed=0):
    """Random ids with ragged padding (one full row, two padded)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 120, (rows, length), generator=generator)
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[1, length * 2 // 3:] = 0
    mask[2, length // 4:] = 0
    return ids, mask


def twin(model, directory, cls, **kwargs):
    model.save_pretrained(directory)
    return cls.from_pretrained(str(directory), **kwargs).eval()


# The layouts and implementations attention can take: padded SDPA, packed per-sequence SDPA,
# packed then padded back, and the formula written out.
PATHS = [("sdpa", {"unpad": "never"}), ("sdpa", {"unpad": "always"}),
         ("sdpa", {"unpad": "always", "packed_attention": False}), ("eager", {"unpad": "always"}),
         ("sdpa", {"unpad": "never", "attention": "explicit"})]


def path_options(implementation, speed):
    """The kernel options a model on that path holds (the attention implementation is one of them)."""
    return kernels.PROCESS_DEFAULT.replace(**{"attention": implementation, **speed})


@pytest.mark.parametrize("implementation, speed", PATHS)
@pytest.mark.parametrize("is_decoder", [False, True])
def test_attention_maps_equal_transformers_eager_maps(implementation, speed, is_decoder, tmp_path):
    torch.manual_seed(0)
    ours = BertForSequenceClassification(tiny(is_decoder=is_decoder, num_labels=3)).eval()
    ours.hold_kernels(path_options(implementation, speed))
    theirs = twin(ours, tmp_path, transformers.AutoModelForSequenceClassification, attn_implementation="eager")
    ids, mask = batch()
    with torch.no_grad():
        mine = ours(ids, mask, output_attentions=True, output_hidden_states=True)
        plain = ours(ids, mask)
    with torch.no_grad():
        ref = theirs(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert len(mine.attentions) == len(ref.attentions) == 2
    for a, b in zip(mine.attentions, ref.attentions):
        assert a.shape == b.shape == (3, 4, 20, 20)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    if not is_decoder:  # (bertkit's left-to-right model pools its last real token, transformers' [CLS])
        torch.testing.assert_close(mine.logits, ref.logits, atol=2e-5, rtol=0)
    torch.testing.assert_close(plain.logits, mine.logits, atol=2e-5, rtol=0)  # the maps change nothing else
    for a, b in zip(mine.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a * mask[..., None], b * mask[..., None], atol=2e-5, rtol=0)


def test_attention_maps_in_tuples_and_every_head(tmp_path):
    torch.manual_seed(0)
    ids, mask = batch()
    for cls, their_cls in ((bertkit.BertModel, transformers.AutoModel),
                           (BertForPreTraining, transformers.BertForPreTraining),
                           (bertkit.BertForQuestionAnswering, transformers.AutoModelForQuestionAnswering),
                           (bertkit.BertForTokenClassification, transformers.AutoModelForTokenClassification)):
        ours = cls(tiny()).eval()
        theirs = twin(ours, tmp_path / cls.__name__, their_cls, attn_implementation="eager")
        with torch.no_grad():
            mine = ours(ids, mask, output_attentions=True, return_dict=False)
            ref = theirs(input_ids=ids, attention_mask=mask, output_attentions=True, return_dict=False)
        ref = tuple(x for x in ref if not (isinstance(x, tuple) and not x))  # BertModel's empty cross-attentions
        assert len(mine) >= len(ref) and len(mine[-1]) == 2
        for a, b in zip(mine, ref):  # transformers' tuple order, attentions included
            if isinstance(b, tuple):
                for x, y in zip(a, b):
                    torch.testing.assert_close(x, y, atol=1e-5, rtol=0)
            elif b is not None:
                torch.testing.assert_close(a, b, atol=5e-5, rtol=0)


@pytest.mark.parametrize("unpad", ["never", "always"])
def test_gradient_checkpointing_gives_the_same_gradients(unpad):
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
                            kernels=kernels.PROCESS_DEFAULT.replace(unpad=unpad)).train()
    ids, mask = batch()
    labels = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.3, -100)

    def gradients():
        torch.manual_seed(7)  # the same dropout masks; the recomputation replays them
        model.zero_grad()
        loss = model(ids, mask, labels=labels).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    loss, expected = gradients()
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    checkpointed_loss, got = gradients()
    assert checkpointed_loss == loss
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-7, rtol=0, msg=name)
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    with pytest.raises(BertkitError, match="non-reentrant"):
        model.gradient_checkpointing_enable({"use_reentrant": True})


def test_gradient_checkpointing_recomputes_in_the_backward_pass():
    """Behaviour that shows the layers' activations are not kept: each layer runs twice per step."""
    model = BertForMaskedLM(tiny()).train()
    calls = []
    model.bert.encoder.layer[0].intermediate.register_forward_hook(lambda *_: calls.append(1))
    ids, mask = batch()
    model(ids, mask).logits.sum().backward()
    assert len(calls) == 1
    model.gradient_checkpointing_enable()
    model(ids, mask).logits.sum().backward()
    assert len(calls) == 3
    with torch.no_grad():  # nothing to recompute without gradients
        model(ids, mask)
    assert len(calls) == 4


@pytest.mark.parametrize("cls, their_cls", [(BertForMaskedLM, transformers.BertForMaskedLM),
                                            (BertForPreTraining, transformers.BertForPreTraining)])
def test_resize_token_embeddings_like_transformers(cls, their_cls, tmp_path):
    torch.manual_seed(0)
    ours = cls(tiny()).eval()
    with torch.no_grad():
        ours.cls.predictions.bias.normal_(0.5, 0.1)  # a bias whose mean is not 0
    theirs = twin(ours, tmp_path / "before", their_cls)
    ids, mask = batch()
    with torch.no_grad():
        before = ours(ids, mask).prediction_logits
    old_rows = ours.bert.embeddings.word_embeddings.weight.detach().clone()
    old_bias = ours.cls.predictions.bias.detach().clone()
    embedding = ours.resize_token_embeddings(130)
    theirs.resize_token_embeddings(130)
    assert embedding is ours.get_input_embeddings() and embedding.weight.shape == (130, 32)
    assert ours.config.vocab_size == 130 and ours.cls.predictions.bias.shape == (130,)
    with torch.no_grad():
        after = ours(ids, mask).prediction_logits
    torch.testing.assert_close(after[..., :120], before)  # the old vocabulary scores as before
    new_rows = embedding.weight[120:].detach()
    # transformers' default (mean_resizing): new rows at the old rows' mean; the tied bias padded with 0
    torch.testing.assert_close(new_rows, old_rows.mean(0).expand(10, -1), atol=1e-3, rtol=0)
    torch.testing.assert_close(new_rows, theirs.get_input_embeddings().weight[120:].detach(), atol=1e-3, rtol=0)
    torch.testing.assert_close(ours.cls.predictions.bias[:120].detach(), old_bias)
    assert (ours.cls.predictions.bias[120:] == 0).all()
    torch.testing.assert_close(ours.cls.predictions.bias.detach(), theirs.cls.predictions.bias.detach())
    # Tied: training the new token's row moves the decoder's row (one matrix), and transformers loads it.
    assert ours.cls.predictions.word_embeddings[0].weight is embedding.weight
    loaded = twin(ours, tmp_path / "after", their_cls)
    with torch.no_grad():
        reloaded = loaded(input_ids=ids, attention_mask=mask, return_dict=False)[0]  # MLM logits either way
        torch.testing.assert_close(reloaded, after, atol=2e-5, rtol=0)


def test_resize_options_and_shrinking():
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny())
    assert model.resize_token_embeddings(121, pad_to_multiple_of=8).num_embeddings == 128
    assert model.config.vocab_size == 128
    model.resize_token_embeddings(200, mean_resizing=False)
    rows = model.get_input_embeddings().weight[128:].detach()
    assert abs(rows.std().item() - 0.02 * 0.88) < 0.004 and rows.abs().max() <= 0.04  # N(0, 0.02) truncated at 2 std
    assert (model.cls.predictions.bias[128:] == 0).all()
    kept = model.get_input_embeddings().weight[:100].detach().clone()
    model.resize_token_embeddings(100)
    assert torch.equal(model.get_input_embeddings().weight.detach(), kept) and model.cls.predictions.bias.shape == (100,)
    with pytest.raises(BertkitError, match="padding token"):
        bertkit.BertModel(tiny(pad_token_id=50)).resize_token_embeddings(40)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inference_on_every_attention_path(dtype):
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny(num_labels=3)).eval()
    ids, mask = batch(rows=4, length=40)
    with torch.no_grad():
        expected = model(ids, mask).logits
        low = copy.deepcopy(model).to(dtype)
        assert low.dtype == dtype
        for implementation, speed in PATHS:
            low.hold_kernels(path_options(implementation, speed))
            out = low(ids, mask, output_hidden_states=True)
            assert out.logits.dtype == dtype
            torch.testing.assert_close(out.logits.float(), expected, atol=0.05, rtol=0.05)
    with torch.no_grad():
        assert low(ids, mask, output_attentions=True).attentions[0].dtype == dtype


def test_from_pretrained_dtype(tmp_path):
    torch.manual_seed(0)
    BertForSequenceClassification(tiny(num_labels=3)).save_pretrained(tmp_path / "fp32")
    model = BertForSequenceClassification.from_pretrained(tmp_path / "fp32", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert bertkit.load_model(tmp_path / "fp32", torch_dtype="float16").dtype == torch.float16
    assert BertForSequenceClassification.from_pretrained(tmp_path / "fp32", dtype="auto").dtype == torch.float32
    model.save_pretrained(tmp_path / "bf16")  # a bf16 file: "auto" keeps it
    assert BertForSequenceClassification.from_pretrained(tmp_path / "bf16", dtype="auto").dtype == torch.bfloat16
    with pytest.raises(BertkitError, match="dtype must be"):
        BertForSequenceClassification.from_pretrained(tmp_path / "fp32", dtype=torch.int8)
    with pytest.raises(BertkitError, match="not both"):
        BertForSequenceClassification.from_pretrained(tmp_path / "fp32", dtype="bf16", torch_dtype="fp16")
    ids, mask = batch()
    with torch.no_grad():
        assert model(ids, mask).logits.dtype == torch.bfloat16
