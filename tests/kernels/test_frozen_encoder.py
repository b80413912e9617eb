"""The engine's flat inference loop (inference/frozen.py, issue 39): bitwise the module path's numbers
on every layout (a lone input padded, a batch unpadded with packed attention, bf16 autocast where the
CPU has bf16), the layers' modules really not called, the weights' changes seen, and the module path
wherever the loop does not apply (gradients, training, hidden states, a mix of int8 and fp32
layers); int8 layers through their own forwards."""

import copy

import pytest
import torch

import bertkit
from bertkit import BertConfig, kernels
from bertkit.device import cpu_features
from bertkit.inference.frozen import FrozenEncoder, freeze_encoders
from bertkit.kernels import KernelOptions
from bertkit.kernels.int8 import OUTLIER_THRESHOLD, quantize_int8
from bertkit.model import BertEncoder

pytestmark = [pytest.mark.usefixtures("one_thread"),  # conftest.py
              pytest.mark.skipif(not kernels.onednn_available(), reason="torch built without oneDNN")]

OPTIONS = KernelOptions(packed_weights="onednn", onednn_linear="always", unpad="always", unpad_multiple=8)
has_mkl = kernels.options.mkl_available()
# Calls of at most 39 rows through MKL's pack (KernelOptions.mkl_rows 13 at width 768, scaled to these
# models' 256): the lone inputs below (16 rows) take it, the batches (64 rows) oneDNN's.
MKL_ROWS = [0, pytest.param(13, marks=pytest.mark.skipif(not has_mkl, reason="torch built without MKL"))]


def model_pair(options: KernelOptions = OPTIONS, seed=0, head=False):
    """The same weights twice: with the module encoder and with the frozen one."""
    torch.manual_seed(seed)
    config = BertConfig.preset("mini", vocab_size=200, max_position_embeddings=64, num_hidden_layers=2,
                               num_labels=3)
    model = (bertkit.BertForSequenceClassification(config, kernels=options) if head
             else bertkit.BertModel(config, kernels=options)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # trained-like weights: biases and LayerNorm away from their initial values
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    frozen = copy.deepcopy(model)
    assert freeze_encoders(frozen) == 1
    return model, frozen


def batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1, 200, (len(lengths), T), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(T)[None] >= 5).long() * mask}


def layer_calls(model) -> list:
    """Records each BertLayer module call (a forward hook): the flat loop makes none."""
    calls = []
    for layer in model.modules():
        if type(layer).__name__ == "BertLayer":
            layer.register_forward_hook(lambda *args: calls.append(1))
    return calls


@pytest.mark.parametrize("lengths", [[13], [16], [9, 31, 20], [32, 32]], ids=["lone-padded", "lone-full",
                                                                              "batch-unpadded", "batch-full"])
@pytest.mark.parametrize("mkl_rows", MKL_ROWS)
def test_the_flat_loop_gives_the_module_paths_numbers_bitwise(lengths, mkl_rows):
    model, frozen = model_pair(OPTIONS.replace(mkl_rows=mkl_rows))
    calls = layer_calls(frozen)
    inputs = batch(lengths)
    with torch.inference_mode():
        expected = model(**inputs)
        got = frozen(**inputs)
    assert not calls, "the frozen encoder ran its layer modules"
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(got.pooler_output, expected.pooler_output)


def test_a_head_model_keeps_its_state_dict_names_and_logits():
    model, frozen = model_pair(head=True)
    assert list(frozen.state_dict()) == list(model.state_dict())
    assert isinstance(frozen.bert.encoder, FrozenEncoder) and isinstance(frozen.bert.encoder, BertEncoder)
    inputs = batch([7, 12])
    with torch.no_grad():
        assert torch.equal(frozen(**inputs).logits, model(**inputs).logits)


@pytest.mark.skipif(not cpu_features().bf16, reason="oneDNN's bf16 GEMM needs a CPU with native bf16")
def test_under_bf16_autocast_the_flat_loop_runs_the_same_bf16_kernels():
    model, frozen = model_pair()
    calls = layer_calls(frozen)
    inputs = batch([11, 24, 5])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(**inputs).last_hidden_state
        got = frozen(**inputs).last_hidden_state
    assert not calls
    assert torch.equal(got, expected)


@pytest.mark.parametrize("mkl_rows", MKL_ROWS)
@pytest.mark.parametrize("lengths", [[10, 14], [14]])
def test_a_weight_changed_in_place_is_seen_at_the_next_call(mkl_rows, lengths):
    model, frozen = model_pair(OPTIONS.replace(mkl_rows=mkl_rows))
    inputs = batch(lengths)
    with torch.inference_mode():
        before = frozen(**inputs).last_hidden_state
    for m in (model, frozen):
        with torch.no_grad():
            m.encoder.layer[1].output.dense.weight.mul_(1.5)
            m.encoder.layer[0].attention.output.LayerNorm.bias.add_(0.1)
    with torch.inference_mode():
        after = frozen(**inputs).last_hidden_state
        expected = model(**inputs).last_hidden_state
    assert not torch.equal(after, before)
    assert torch.equal(after, expected)


def test_a_weight_replaced_by_a_new_parameter_is_seen():
    model, frozen = model_pair()
    inputs = batch([10])
    with torch.inference_mode():
        frozen(**inputs)
    new = torch.nn.Parameter(model.encoder.layer[0].intermediate.dense.weight.detach() * 0.5)
    model.encoder.layer[0].intermediate.dense.weight = new
    frozen.encoder.layer[0].intermediate.dense.weight = torch.nn.Parameter(new.detach().clone())
    with torch.inference_mode():
        assert torch.equal(frozen(**inputs).last_hidden_state, model(**inputs).last_hidden_state)


def test_int8_layers_run_the_flat_loop_with_the_int8_modules_numbers():
    model, frozen = model_pair()
    inputs = batch([9, 17])
    with torch.inference_mode():
        frozen(**inputs)  # a plan made from the fp32 layers: quantising after it must be seen
    for m in (model, frozen):
        with torch.no_grad():  # large activations: the feed-forward output's fp32 outlier channels run too
            m.encoder.layer[1].intermediate.dense.weight.mul_(8.0)
        quantize_int8(m)
    largest = []
    model.encoder.layer[1].output.dense.register_forward_hook(lambda m, i, o: largest.append(i[0].abs().max()))
    calls = layer_calls(frozen)
    with torch.inference_mode():
        expected = model(**inputs).last_hidden_state
        got = frozen(**inputs).last_hidden_state
    assert largest[0] > OUTLIER_THRESHOLD, "the outlier split must be exercised"
    assert not calls, "int8 layers run in the flat loop too"
    assert torch.equal(got, expected)


def test_a_mix_of_int8_and_fp32_layers_takes_the_module_path():
    model, frozen = model_pair()
    for m in (model, frozen):
        quantize_int8(m)
        m.encoder.layer[1] = copy.deepcopy(model_pair()[0].encoder.layer[1])  # an fp32 layer again
    calls = layer_calls(frozen)
    inputs = batch([9, 17])
    with torch.inference_mode():
        expected = model(**inputs).last_hidden_state
        got = frozen(**inputs).last_hidden_state
    assert calls
    assert torch.equal(got, expected)


def test_freezing_an_int8_model_swaps_its_encoder():
    model, _ = model_pair()
    quantize_int8(model)
    assert freeze_encoders(model) == 1 and type(model.encoder) is FrozenEncoder


@pytest.mark.parametrize("case", ["gradients", "training", "hidden_states", "attentions", "eager_attention",
                                  "no_packs"])
def test_the_module_path_runs_where_the_flat_loop_does_not_apply(case):
    options = {"eager_attention": OPTIONS.replace(attention="eager"),
               "no_packs": OPTIONS.replace(packed_weights="none")}.get(case, OPTIONS)
    model, frozen = model_pair(options)
    calls = layer_calls(frozen)
    inputs = batch([8, 13])
    kwargs = {"hidden_states": {"output_hidden_states": True}, "attentions": {"output_attentions": True}}.get(case, {})
    if case == "training":
        model.train(), frozen.train()
        torch.manual_seed(1)
        expected = model(**inputs).last_hidden_state
        torch.manual_seed(1)
        got = frozen(**inputs).last_hidden_state
    else:
        with torch.set_grad_enabled(case == "gradients"):
            expected = model(**inputs, **kwargs)
            got = frozen(**inputs, **kwargs)
        for key in ("hidden_states", "attentions"):
            if expected.get(key) is not None:
                assert all(torch.equal(a, b) for a, b in zip(got[key], expected[key]))
        expected, got = expected.last_hidden_state, got.last_hidden_state
    assert calls, f"{case}: the module path must run"
    assert torch.equal(got, expected)
    if case == "gradients":
        got.sum().backward()
        assert frozen.encoder.layer[0].attention.self.query.weight.grad is not None


def test_a_frozen_model_that_has_run_deep_copies():
    _, frozen = model_pair()
    inputs = batch([12])
    with torch.inference_mode():
        out = frozen(**inputs).last_hidden_state
    copied = copy.deepcopy(frozen)  # the plan (oneDNN packs) is held beside the module, not on it
    with torch.inference_mode():
        assert torch.equal(copied(**inputs).last_hidden_state, out)


def test_the_engine_freezes_its_own_model_but_not_a_callers(tmp_path):
    from bertkit.inference.engine import InferenceEngine
    from bertkit.tokenizer import BertTokenizer

    model, _ = model_pair(head=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(195)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    model.save_pretrained(tmp_path)
    BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path)
    own = InferenceEngine(tmp_path)
    theirs = InferenceEngine(None, model=model, tokenizer=tmp_path)
    assert type(own.model.bert.encoder) is FrozenEncoder
    assert type(theirs.model.bert.encoder) is BertEncoder
    rows = own.encode(["w1 w2 w3", "w4 w5 w6 w7 w8 w9 w10"])
    for got, expected in zip(own.forward(rows), theirs.forward(rows)):
        assert torch.allclose(got["logits"], expected["logits"], atol=1e-5)


@pytest.mark.skipif(not has_mkl, reason="torch built without MKL")
def test_options_held_anew_are_followed():
    """The flat loop is remade when the model holds other options (its steps bake in mkl_rows)."""
    from bertkit.kernels import packed
    model, frozen = model_pair(OPTIONS.replace(mkl_rows=0))
    inputs = batch([14])
    dense = frozen.encoder.layer[0].output.dense
    with torch.inference_mode():
        frozen(**inputs)
        assert {mode for mode, _ in packed._PACKS[dense]} == {"onednn"}
        for m in (model, frozen):
            m.hold_kernels(m.kernels.replace(mkl_rows=13))
        got = frozen(**inputs).last_hidden_state
        assert {mode for mode, _ in packed._PACKS[dense]} == {"onednn", "mkl"}
        assert torch.equal(got, model(**inputs).last_hidden_state)
