"""The inference levers of issue 28: packed weights (KernelOptions.packed_weights, kernels/packed.py)
and attention by length bucket (attention_bucket, kernels/attention.py): each within 1e-5 of the
path it replaces (fp32), MKL's pack usable at every row count, the pack remade when the weights
change, the usual Linear wherever packing does not apply (gradients), gradients through buckets."""

import copy
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import bertkit
from bertkit import BertConfig, kernels
from bertkit.errors import BertkitError
from bertkit.device import CpuFeatures
from bertkit.kernels import KernelOptions
from bertkit.kernels.options import PACKED_WEIGHTS_BY_CLASS, default_attention_op, default_packed_weights
from bertkit.kernels.packed import has_pack

has_mkl = torch._C.has_mkl and hasattr(torch.ops.mkl, "_mkl_linear")
MODES = [pytest.param("mkl", marks=pytest.mark.skipif(not has_mkl, reason="torch built without MKL")),
         pytest.param("onednn", marks=pytest.mark.skipif(not kernels.onednn_available(),
                                                         reason="torch built without oneDNN")),
         # bertkit's AVX2 op (built on first use; on a CPU without AVX2 / FMA the mode is oneDNN's packs)
         pytest.param("bertkit", marks=pytest.mark.skipif(not has_mkl, reason="the ops' library calls MKL (x86 torch)"))]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def small_model(options: KernelOptions, seed=0):
    torch.manual_seed(seed)
    config = BertConfig.preset("mini", vocab_size=200, max_position_embeddings=64, num_hidden_layers=2)
    model = bertkit.BertModel(config, kernels=options).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # trained-like weights: biases and LayerNorm away from their initial values
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def padded_batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1, 200, (len(lengths), T), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(T)[None] >= 5).long() * mask}


@pytest.mark.skipif(not has_mkl, reason="torch built without MKL")
@pytest.mark.parametrize("inputs, outputs", [(128, 512), (512, 128), (96, 384)])
def test_mkl_pack_serves_every_row_count(inputs, outputs):
    """torch's op uses a pack only for the row count it names; one pack made for 64 rows must give
    F.linear's numbers at every count, as a pack made for that very count does. Not bitwise: on some
    CPUs MKL blocks a one-row pack differently and the last bit of a lone row moves."""
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(outputs, inputs, generator=g), torch.randn(outputs, generator=g)
    pack = torch.ops.mkl._mkl_reorder_linear_weight(weight, 64)
    tolerance = dict(rtol=1e-5, atol=1e-5 * inputs ** 0.5)
    for rows in (1, 2, 7, 63, 64, 65, 100, 640, 1999):
        x = torch.randn(rows, inputs, generator=g)
        reference = F.linear(x, weight, bias)
        own = torch.ops.mkl._mkl_linear(x, torch.ops.mkl._mkl_reorder_linear_weight(weight, rows), weight, bias, rows)
        shared = torch.ops.mkl._mkl_linear(x, pack, weight, bias, rows)
        torch.testing.assert_close(own, reference, **tolerance, msg=lambda m: f"{rows} rows, own pack: {m}")
        torch.testing.assert_close(shared, reference, **tolerance, msg=lambda m: f"{rows} rows, shared pack: {m}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("onednn_linear", ["never", "inference"])
def test_packed_model_matches_the_plain_path(mode, onednn_linear):
    """Unpadded and padded batches, fused QKV and GELU: within 1e-5 of the same model unpacked."""
    base = kernels.PROCESS_DEFAULT.replace(onednn_linear=onednn_linear, unpad="auto", unpad_multiple=8, packed_weights="none")
    model = small_model(base)
    batches = [padded_batch([40, 3, 17, 29, 1, 40, 8]), padded_batch([12, 12, 12])]
    with torch.no_grad():
        reference = [model(**b).last_hidden_state for b in batches]
        model.hold_kernels(base.replace(packed_weights=mode))
        packed = [model(**b).last_hidden_state for b in batches]
    assert has_pack(model.encoder.layer[0].attention.self.query)  # the packed route ran
    for b, ours, ref in zip(batches, packed, reference):
        real = b["attention_mask"].bool()
        assert float((ours[real] - ref[real]).abs().max()) <= 1e-5


@pytest.mark.parametrize("mode", MODES)
def test_pack_is_remade_when_the_weights_change(mode):
    model = small_model(kernels.PROCESS_DEFAULT.replace(packed_weights=mode))
    other = small_model(kernels.PROCESS_DEFAULT, seed=1)
    batch = padded_batch([20, 9, 33])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        model(**batch)  # packs the first weights
        model.load_state_dict(other.state_dict())  # copies in place: new versions
        ours, ref = model(**batch).last_hidden_state, other(**batch).last_hidden_state
    assert float((ours[real] - ref[real]).abs().max()) <= 1e-5


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_pack_is_remade_after_an_optimizer_step(mode, fused):
    """Dev scored mid-training: torch's fused AdamW updates weights without bumping their versions,
    so an inference after a step must not reuse the pack of the weights before it."""
    model = small_model(kernels.PROCESS_DEFAULT.replace(packed_weights=mode))
    plain = small_model(kernels.PROCESS_DEFAULT.replace(packed_weights="none"))
    batch = padded_batch([20, 9, 33])
    real = batch["attention_mask"].bool()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, fused=fused, foreach=None if fused else True)
                  for m in (model, plain)]
    with torch.no_grad():
        before = model(**batch).last_hidden_state  # packs the first weights
    for m, optimizer in zip((model, plain), optimizers):  # a step without dropout: the same step for both
        m(**batch).last_hidden_state.sum().backward()
        optimizer.step()
    with torch.no_grad():
        ours, ref = model(**batch).last_hidden_state, plain(**batch).last_hidden_state
    assert float((ours[real] - before[real]).abs().max()) > 1e-3  # the step moved the outputs...
    assert float((ours[real] - ref[real]).abs().max()) <= 1e-4  # ... to the unpacked model's


@pytest.mark.parametrize("mode", MODES)
def test_gradients_take_the_usual_route(mode):
    model = small_model(kernels.PROCESS_DEFAULT.replace(packed_weights=mode))
    batch = padded_batch([20, 9, 33])
    model(**batch).last_hidden_state.sum().backward()
    assert model.encoder.layer[0].intermediate.dense.weight.grad is not None
    assert not has_pack(model.encoder.layer[0].intermediate.dense)


@pytest.mark.parametrize("mode", MODES)
def test_a_model_that_has_run_packed_copies_and_pickles(mode, tmp_path):
    """The packs (oneDNN's are opaque tensors without storage) are kept beside the module, so
    deepcopy and torch.save of a model that has run copy its parameters and nothing else."""
    model = small_model(kernels.PROCESS_DEFAULT.replace(packed_weights=mode))
    batch = padded_batch([20, 9, 33])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ours = model(**batch).last_hidden_state
        twin = copy.deepcopy(model)
        assert not has_pack(twin.encoder.layer[0].attention.self.query)
        assert torch.equal(twin(**batch).last_hidden_state[real], ours[real])
        torch.save(model, tmp_path / "model.pt")
        loaded = torch.load(tmp_path / "model.pt", weights_only=False)
        assert torch.equal(loaded(**batch).last_hidden_state[real], ours[real])


def test_packed_weights_default_per_cpu_class():
    """oneDNN packs by default on the classes where they measured faster, nowhere else yet."""
    assert PACKED_WEIGHTS_BY_CLASS == {"avx2": "bertkit", "avx512-bf16": "onednn"}
    for cpu_class, expected in (("avx2", "bertkit"), ("avx512", "none"), ("avx512-bf16", "onednn"), ("other", "none")):
        features = mock.Mock(spec=CpuFeatures, cpu_class=cpu_class)
        assert default_packed_weights(features) == (expected if torch.backends.mkldnn.is_available() else "none")
        assert default_attention_op(features) == (cpu_class == "avx2")
    assert KernelOptions.plain().packed_weights == "none" and not KernelOptions.plain().attention_op


def test_packed_weights_values_are_checked():
    with pytest.raises(BertkitError, match="packed_weights must be one of none, mkl, onednn"):
        KernelOptions(packed_weights="blas")
    assert kernels.PROCESS_DEFAULT.replace(packed_weights="none").packed_weights == "none"


@pytest.mark.skipif(not has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_attention_op_gives_torchs_attention_in_inference():
    """attention_op: unpadded batches (the sequences one after another in a row) and a batch without
    padding through bertkit's op, within 1e-5 of torch's attention at the real positions; never with
    gradients (training keeps torch's, differentiable)."""
    from bertkit.kernels import graph_gemm, layout

    if not graph_gemm.eager_ops():
        pytest.skip("bertkit's AVX2 ops do not run on this CPU")
    base = kernels.PROCESS_DEFAULT.replace(unpad="always", unpad_multiple=8, attention_op=False, packed_weights="none")
    model = small_model(base)
    batches = [padded_batch([40, 3, 17, 29, 1, 40, 8]), padded_batch([12, 12, 12]), padded_batch([64, 60, 33, 64])]
    with torch.no_grad():
        reference = [model(**b).last_hidden_state for b in batches]
        model.hold_kernels(base.replace(attention_op=True))
        with mock.patch.object(layout, "eager_attention", wraps=graph_gemm.eager_attention) as op:
            ours = [model(**b).last_hidden_state for b in batches]
    assert op.call_count == 2 * len(batches)  # each layer of each batch
    for b, got, ref in zip(batches, ours, reference):
        real = b["attention_mask"].bool()
        assert float((got[real] - ref[real]).abs().max()) <= 1e-5
    with mock.patch.object(layout, "eager_attention", wraps=graph_gemm.eager_attention) as op:
        model(**batches[0]).last_hidden_state.sum().backward()
    assert op.call_count == 0 and model.encoder.layer[0].attention.self.query.weight.grad is not None


@pytest.mark.parametrize("bucket", [1, 16, 64])
def test_bucketed_attention_matches_per_sequence_attention(bucket):
    """Sequences grouped by rounded length, one masked call per group: within 1e-5 of one call per
    sequence, in inference and in the gradients."""
    base = kernels.PROCESS_DEFAULT.replace(unpad="always", unpad_multiple=8)
    model = small_model(base)
    batch = padded_batch([40, 3, 17, 29, 1, 40, 8, 18, 33])
    real = batch["attention_mask"].bool()
    outputs, grads = [], []
    for options in (base, base.replace(attention_bucket=bucket)):
        model.hold_kernels(options)
        model.zero_grad()
        out = model(**batch).last_hidden_state
        out[real].pow(2).sum().backward()
        outputs.append(out.detach())
        grads.append(model.encoder.layer[0].attention.self.query.weight.grad.clone())
    assert float((outputs[0][real] - outputs[1][real]).abs().max()) <= 1e-5
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_attention_bucket_is_checked():
    with pytest.raises(BertkitError, match="attention_bucket must be 0"):
        KernelOptions(attention_bucket=-1)


bf16_cpu = pytest.mark.skipif(not bertkit.device.cpu_features().bf16 or not kernels.onednn_available(),
                              reason="bf16 packs need a CPU with native bf16 and torch with oneDNN")


@bf16_cpu
def test_bf16_pack_gives_autocasts_numbers_and_is_made_once():
    """Under bf16 autocast the oneDNN pack holds bf16 weights: the very bits of autocast's own route
    (the same bf16 operands, fp32 sums), packed once beside the fp32 pack, remade when weights change."""
    model = small_model(kernels.PROCESS_DEFAULT.replace(unpad="auto", unpad_multiple=8, packed_weights="none"))
    batch = padded_batch([9, 17, 30])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(**batch).last_hidden_state
        model.hold_kernels(model.kernels.replace(packed_weights="onednn"))
        packed = model(**batch).last_hidden_state
    assert torch.equal(packed, reference)
    packs = kernels.packed._PACKS[model.encoder.layer[0].attention.self.query]
    assert set(packs) == {("onednn", torch.bfloat16)}
    pack = packs[("onednn", torch.bfloat16)][1]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(**batch)
        assert packs[("onednn", torch.bfloat16)][1] is pack  # not remade for an unchanged weight
        model.encoder.layer[0].attention.self.query.weight.add_(0.01)
        changed = model(**batch).last_hidden_state
    assert packs[("onednn", torch.bfloat16)][1] is not pack
    assert not torch.equal(changed, packed)


def test_no_bf16_pack_where_autocast_is_not_bf16_inference():
    """The pack route stays out of bf16 autocast with gradients, of fp16 autocast, and of the MKL mode."""
    x = torch.randn(4, 8)
    onednn = kernels.PROCESS_DEFAULT.replace(packed_weights="onednn")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.packed.packed_dtype(x, onednn) is None  # gradients enabled
        with torch.no_grad():
            expected = torch.bfloat16 if bertkit.device.cpu_features().bf16 else None
            assert kernels.packed.packed_dtype(x, onednn) is expected
            if has_mkl:
                assert kernels.packed.packed_dtype(x, onednn.replace(packed_weights="mkl")) is None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert kernels.packed.packed_dtype(x, onednn) is None
    with torch.no_grad():
        assert kernels.packed.packed_dtype(x, onednn) is torch.float32


@pytest.mark.skipif(not (has_mkl and kernels.onednn_available()), reason="torch built without MKL or oneDNN")
@pytest.mark.parametrize("frozen", [False, True], ids=["modules", "frozen-encoder"])
def test_calls_of_few_rows_take_mkls_pack(frozen):
    """With the oneDNN packs and mkl_rows=7 (at width 768: 21 rows at this model's 256): a call of at most
    21 rows runs from MKL's pack (made then, beside the oneDNN one), a larger call from oneDNN's alone;
    both within 1e-5 of F.linear's numbers."""
    from bertkit.inference.frozen import freeze_encoders
    from bertkit.kernels import packed

    options = kernels.PROCESS_DEFAULT.replace(onednn_linear="never", unpad="always", unpad_multiple=8,
                                              packed_weights="onednn", mkl_rows=7)
    model = small_model(options)
    plain = small_model(options.replace(packed_weights="none", mkl_rows=0))
    if frozen:
        assert freeze_encoders(model) == 1
    dense = model.encoder.layer[0].output.dense

    def modes():
        return {mode for mode, _ in packed._PACKS.get(dense, {})}

    with torch.no_grad():
        for lengths, expected_modes in (([30, 12], {"onednn"}), ([9, 6], {"onednn", "mkl"})):
            inputs = padded_batch(lengths)
            got, want = model(**inputs).last_hidden_state, plain(**inputs).last_hidden_state
            real = inputs["attention_mask"].bool()
            assert modes() == expected_modes, lengths
            assert (got[real] - want[real]).abs().max() < 1e-5


def test_mkl_rows_default_per_cpu_class_and_vendor():
    """MKL for a few rows where it was measured faster: Intel with AVX512_BF16 / AMX (MKL's own
    kernels); not on AMD (where MKL takes its AVX2 path) nor on the classes not measured."""
    from bertkit.kernels.options import MKL_ROWS_BY_CLASS, default_mkl_rows
    assert MKL_ROWS_BY_CLASS == {("avx512-bf16", "intel"): 64}
    for cpu_class, vendor, expected in (("avx512-bf16", "intel", 64), ("avx512-bf16", "amd", 0),
                                        ("avx2", "intel", 0), ("avx512", "intel", 0)):
        features = mock.Mock(spec=CpuFeatures, cpu_class=cpu_class, vendor=vendor)
        assert default_mkl_rows(features) == (expected if has_mkl else 0)
    assert KernelOptions.plain().mkl_rows == 0
    options = kernels.PROCESS_DEFAULT.replace(mkl_rows=64)  # rows at width 768, scaled to the Linear's
    assert [options.mkl_row_limit(w) for w in (384, 768, 1024)] == [128, 64, 48]
    with pytest.raises(BertkitError, match="mkl_rows must be 0"):
        kernels.PROCESS_DEFAULT.replace(mkl_rows="-3")
    assert kernels.PROCESS_DEFAULT.replace(mkl_rows="32").mkl_rows == 32
