"""Int8 inference (`--quantize int8`, kernels/int8.py): the quantised encoder stays close to fp32,
keeps the fast paths (unpadding), and predict / pipeline / export take the option."""

import copy
import dataclasses
import json
import logging
import math

import numpy as np
import onnxruntime as ort
import pytest
import torch

from bertkit import BertConfig, kernels, pipeline
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.heads import BertForSequenceClassification
from bertkit.inference import InferenceEngine
from bertkit.device import cpu_features
from bertkit.kernels import int8 as int8_module
from bertkit.kernels.int8 import GELU_FLOOR, NO_VNNI_NOTE, Int8Linear, Int8QKV, quantize_int8
from bertkit.kernels.linear import ProjectedWithQuery
from bertkit.model import BertModel
from bertkit.tokenizer import BertTokenizer

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [w for w in "good bad movie plot the a was very great awful".split()]


def _batch(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return torch.randint(5, vocab, (len(lengths), T), generator=g) * mask, mask


def test_int8_linear_matches_a_quantised_reference():
    """Int8Linear = per-channel symmetric int8 weights times uint8-quantised activations, computed
    here independently in fp64 from the same quantisation grid."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    x = torch.randn(10, 64)
    got = Int8Linear(layer)(x)
    w = layer.weight.detach().double()
    scale = w.abs().amax(1, keepdim=True) / 127
    wq = torch.round(w / scale).clamp(-127, 127) * scale
    exact = x.double() @ wq.T + layer.bias.detach().double()
    # The activations are quantised to 256 (or 128) levels over their range: the error per output is
    # bounded by the input step times the weights' L1 norm.
    levels = 127 if Int8Linear(layer).reduce_range else 255
    step = float(x.max() - x.min()) / levels
    bound = step * wq.abs().sum(1).max()
    assert (got.double() - exact).abs().max() <= bound
    assert (got.double() - exact).abs().max() < 0.1 * (exact - layer.bias.detach().double()).abs().mean()


@pytest.mark.skipif("onednn" not in torch.backends.quantized.supported_engines, reason="torch built without oneDNN's int8")
@pytest.mark.parametrize("outliers", [None, 6.0])
def test_on_an_amx_cpu_large_calls_take_onednns_pack_of_the_same_weights(monkeypatch, outliers):
    """With AMX, an Int8Linear also holds oneDNN's pack of its int8 weights and gives it every call
    of `amx_rows` rows or more (AMX_ROWS at width 768, scaled to its own); smaller calls keep fbgemm's. Both are the same int8 model: each call's
    error against the fp64 quantised reference stays within the quantisation bound. Without AMX
    there is no second pack."""
    monkeypatch.setattr(int8_module, "cpu_features", lambda: dataclasses.replace(cpu_features(), amx=True))
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    linear = Int8Linear(layer, outlier_threshold=outliers)
    assert linear._packed_amx is not None
    given = []
    real = torch.ops.quantized.linear_dynamic
    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", lambda x, packed, r: given.append(packed) or real(x, packed, r),
                        raising=False)
    w = layer.weight.detach().double()
    scale = w.abs().amax(1, keepdim=True) / 127
    wq = torch.round(w / scale).clamp(-127, 127) * scale
    assert linear.amx_rows == int8_module.AMX_ROWS * 768 // 48
    for rows, pack in ((linear.amx_rows - 1, linear._packed), (linear.amx_rows, linear._packed_amx),
                       (3 * linear.amx_rows, linear._packed_amx)):
        x = torch.randn(rows, 64)
        if outliers is not None:
            x[:, 3] *= 10  # one channel past the threshold: the split path hands over the same pack
        got = linear(x)
        assert given[-1] is pack
        exact = x.double() @ wq.T + layer.bias.detach().double()
        kept = x.clone()
        if outliers is not None:
            kept[:, 3] = 0
        step = float(kept.max() - kept.min()) / (127 if linear.reduce_range else 255)
        assert (got.double() - exact).abs().max() <= step * wq.abs().sum(1).max()
    monkeypatch.setattr(int8_module, "cpu_features", lambda: dataclasses.replace(cpu_features(), amx=False))
    assert Int8Linear(layer)._packed_amx is None


def test_the_amx_row_count_scales_with_the_width():
    """64 rows at BERT-base's width (768) from where oneDNN's AMX pack pays, 128 at MiniLM's 384: the
    smaller of a Linear's in and out features (the feed-forward's output projection is 4H -> H)."""
    widths = {(384, 1152): 128, (384, 1536): 128, (1536, 384): 128, (768, 2304): 64, (3072, 768): 64, (1024, 4096): 48}
    for (inputs, outputs), rows in widths.items():
        assert Int8Linear(torch.nn.Linear(inputs, outputs)).amx_rows == rows


def test_outlier_channels_leave_the_int8_range_and_are_multiplied_in_fp32():
    """A channel past the threshold (as the GELU output's few large channels are) no longer sets the
    activation scale: the error is that of rounding the other channels on their own range's step,
    as if the outlier were absent. Reference: the int8-weight product in fp64, and the rounding-noise
    model (each input's error uniform over one step: mean |error| = sqrt(2/pi) step/sqrt(12) |w_row|)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    x = 0.5 * torch.randn(3, 40, 64)
    x[:, ::7, 11] = 25.0  # one outlier channel, on some tokens
    w = layer.weight.detach().double()
    scale = w.abs().amax(1, keepdim=True) / 127
    wq = torch.round(w / scale).clamp(-127, 127) * scale
    exact = x.double() @ wq.T + layer.bias.detach().double()
    split, plain = Int8Linear(layer, outlier_threshold=6.0), Int8Linear(layer)
    normal = torch.ones(64, dtype=torch.bool)
    normal[11] = False
    levels = 127 if split.reduce_range else 255

    def rounding_error(values, columns):  # the noise model's mean |error| for inputs spread like `values`
        step = float(values.max() - values.min()) / levels
        return float((math.sqrt(2 / math.pi) * step / math.sqrt(12) * wq[:, columns].norm(dim=1)).mean())

    before = x.clone()
    got = split(x)
    assert got.shape == (3, 40, 48)
    assert torch.equal(x, before)  # the outlier channels, zeroed for the int8 GEMM, are put back
    split_error, plain_error = (got.double() - exact).abs(), (plain(x).double() - exact).abs()
    assert split_error.mean() == pytest.approx(rounding_error(x[..., normal], normal), rel=0.25)
    assert plain_error.mean() == pytest.approx(rounding_error(x, slice(None)), rel=0.25)  # ~7x larger
    step = float(x[..., normal].max() - x[..., normal].min()) / levels
    assert split_error.max() <= step * wq[:, normal].abs().sum(1).max()  # the worst case, outlier left out
    # Nothing past the threshold (or no rows): the plain int8 GEMM, bit for bit.
    quiet = x.clone()
    quiet[..., 11] = 0.1
    assert torch.equal(split(quiet), plain(quiet))
    assert split(torch.zeros(0, 64)).shape == (0, 48)


def test_behind_the_gelu_the_outlier_search_reads_maxima_only_and_columns_are_made_once_per_set():
    """The GELU's output never lies below GELU_FLOOR, so a layer behind it looks for outliers among the
    channels' maxima only: the same channels, the same numbers, as the search that reads minima too.
    The fp32 columns of each set of outlier channels are made once and reused; a negative outlier
    is still found where no floor is known."""
    torch.manual_seed(0)
    assert float(torch.nn.functional.gelu(torch.linspace(-3, 0, 30001)).min()) > GELU_FLOOR
    layer = torch.nn.Linear(64, 48)
    generic, behind_gelu = Int8Linear(layer, 6.0), Int8Linear(layer, 6.0, GELU_FLOOR)
    x = torch.nn.functional.gelu(0.5 * torch.randn(40, 64))
    x[::5, 11] = 25.0
    y = x.clone()
    y[::3, 30] = 9.0
    for inputs in (x, y, x, y):
        assert torch.equal(generic(inputs), behind_gelu(inputs))
    assert sorted(behind_gelu._columns) == [(11,), (11, 30)]
    first = behind_gelu._columns[(11,)]
    behind_gelu(x)
    assert behind_gelu._columns[(11,)] is first  # reused, not remade
    negative = x.clone()
    negative[::4, 5] = -9.0
    w = layer.weight.detach().double()
    wq = torch.round(w / (w.abs().amax(1, keepdim=True) / 127)) * (w.abs().amax(1, keepdim=True) / 127)
    exact = negative.double() @ wq.T + layer.bias.detach().double()
    generic(negative)
    assert (5, 11) in generic._columns
    rest = torch.cat([negative[:, :5], negative[:, 6:11], negative[:, 12:]], 1)  # the channels left in int8
    step = float(rest.max() - rest.min()) / 127
    assert (generic(negative).double() - exact).abs().max() <= step * wq.abs().sum(1).max()


def test_the_last_calls_outlier_channels_are_reused_and_a_consumed_input_is_left_zeroed():
    """A call whose outlier channels are the last call's reuses their index and columns; another set
    is found and computed afresh. `overwrite_input` gives the same numbers and leaves the outlier
    channels of its input zeroed; without it the input comes back bitwise."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    cached, fresh = Int8Linear(layer, 6.0, GELU_FLOOR), Int8Linear(layer, 6.0, GELU_FLOOR)
    x = torch.nn.functional.gelu(0.5 * torch.randn(40, 64))
    x[::5, 11] = 25.0
    y = x.clone()
    y[::3, 30] = 9.0
    cached(x)
    index = cached._last[1]
    cached(x * 0.9)  # other values, the same channel past the threshold
    assert cached._last[1] is index, "the same set: its index reused"
    for inputs in (y, x, y * 1.1, x):
        fresh._last, fresh._columns = None, {}
        assert torch.equal(cached(inputs), fresh(inputs))
    assert cached._last[1].tolist() == [11]
    before = y.clone()
    kept = cached(y)
    assert torch.equal(y, before), "restored"
    assert torch.equal(cached(y, overwrite_input=True), kept)
    assert torch.equal(y[:, [11, 30]], torch.zeros(40, 2)) and torch.equal(y[:, :11], before[:, :11])


def test_fused_query_key_value_equal_three_separate_int8_projections():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 64) for _ in range(3)]
    x = torch.randn(2, 9, 64) * 3
    fused = Int8QKV(*layers)
    for got, layer in zip(fused(x), layers):
        # The same activation range (x's) and per-row weight scales: the same numbers as alone.
        torch.testing.assert_close(got, Int8Linear(layer)(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError):
        ProjectedWithQuery()(x)


def test_quantised_encoder_is_close_to_fp32_and_keeps_unpadding():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64)
    model = BertModel(config, kernels=kernels.PROCESS_DEFAULT.replace(unpad="always", unpad_multiple=1)).eval()
    quantized = quantize_int8(copy.deepcopy(model))
    layers = {name: m for name, m in quantized.encoder.named_modules() if isinstance(m, Int8Linear)}
    assert len(layers) == 2 * 4  # query-key-value (one), attention output, intermediate, output per layer
    assert {name for name in layers if "attention.self" in name} == {
        "layer.0.attention.self.query.projection", "layer.1.attention.self.query.projection"}
    # Only the feed-forward output projection (fed by the GELU) splits off its outlier channels.
    assert {name for name, m in layers.items() if m.outlier_threshold is not None} == {
        "layer.0.output.dense", "layer.1.output.dense"}
    ids, mask = _batch([40, 3, 17, 29], 120)
    real = mask.bool()
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state
        got = quantized(ids, mask).last_hidden_state
    cosine = torch.nn.functional.cosine_similarity(got[real], want[real])
    assert cosine.min() > 0.99, cosine.min()
    assert (got[~real] == 0).all()  # unpadded: padding rows were never computed


@pytest.fixture(scope="module")
def classifier(tiny_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("int8")
    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    tokenizer = BertTokenizer(str(directory / "vocab.txt"))
    return tiny_model(BertForSequenceClassification, directory, tokenizer=tokenizer, num_labels=2,
                      id2label={0: "NEGATIVE", 1: "POSITIVE"})


def test_int8_pipeline_scores_close_to_fp32(classifier):
    texts = ["good movie", "the plot was very bad", "great", "awful awful movie the plot"]
    fp32 = pipeline("text-classification", model=classifier)(texts)
    int8 = pipeline("text-classification", model=classifier, quantize="int8")(texts)
    assert [a["label"] for a in fp32] == [b["label"] for b in int8]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(fp32, int8)) < 0.02


def test_int8_refuses_bf16_and_unknown_modes(classifier):
    with pytest.raises(BertkitError):
        InferenceEngine(classifier, precision="bf16", quantize="int8")
    with pytest.raises(BertkitError):
        InferenceEngine(classifier, quantize="int4")


def test_predict_with_quantize_int8(classifier, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("good movie\nthe plot was bad\n")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "text-classification", "--model", str(classifier), "--input", str(source),
                 "--output", str(out), "--quantize", "int8"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(row["label"] in ("NEGATIVE", "POSITIVE") for row in rows)


def test_int8_onnx_weights_fit_the_int16_pairs_of_cpus_without_vnni(classifier, tmp_path):
    """The exported graph must be exact on every CPU class, not only the exporting one: without VNNI,
    ONNX Runtime's u8 x s8 GEMM adds two products in int16 (vpmaddubsw), so |w| <= 64 is needed for
    255 * |w| * 2 to stay under 32,768 (an 8-bit weight of 127 saturates: max abs error 0.40 on this
    model on an AVX2 EPYC)."""
    import onnx
    from onnx import numpy_helper

    path = tmp_path / "model.int8.onnx"
    assert main(["export", "--model", str(classifier), "--output", str(path), "--quantize", "int8"]) == 0
    graph = onnx.load(str(path)).graph
    int8_weights = [numpy_helper.to_array(t) for t in graph.initializer  # (in, out) matrices, not zero points
                    if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2]
    assert len(int8_weights) >= 4 * 2  # the encoder MatMuls of both layers (projections and feed-forward)
    for weights in int8_weights:
        assert -64 <= int(weights.min()) and int(weights.max()) <= 64
        assert int(np.abs(weights).max()) >= 60  # the range is used, not collapsed


def test_int8_onnx_export_runs_close_to_fp32(classifier, tmp_path):
    path = tmp_path / "model.int8.onnx"
    assert main(["export", "--model", str(classifier), "--output", str(path), "--quantize", "int8"]) == 0
    session = ort.InferenceSession(str(path))
    assert any(node.op_type in ("DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul")
               for node in __import__("onnx").load(str(path)).graph.node)
    ids, mask = _batch([9, 4, 12], len(WORDS))
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                             "token_type_ids": np.zeros_like(ids.numpy())})[0]
    engine = InferenceEngine(classifier, precision="fp32")
    with torch.no_grad():
        want = engine.model(input_ids=ids, attention_mask=mask).logits.numpy()
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize("vnni", [False, True])
def test_int8_tells_the_user_where_it_buys_no_speed(classifier, monkeypatch, caplog, vnni):
    # Without VNNI int8 measured no faster than fp32 (docs/speed.md): the user hears it, once a call.
    from bertkit.kernels import graph_gemm

    features = dataclasses.replace(cpu_features(), vnni=vnni)
    monkeypatch.setattr("bertkit.kernels.int8.cpu_features", lambda: features)
    model = BertForSequenceClassification.from_pretrained(classifier)
    with caplog.at_level(logging.INFO, logger="bertkit"):
        quantize_int8(model)
    notes = [r.getMessage() for r in caplog.records if "no VNNI" in r.getMessage()]
    assert notes == ([] if vnni else [NO_VNNI_NOTE])
    if not vnni and graph_gemm.eager_seven():  # bertkit's 7-bit op, faster than fp32 there (docs/speed.md): no note
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="bertkit"):
            quantize_int8(BertForSequenceClassification.from_pretrained(classifier), seven_bit=True)
        assert not [r for r in caplog.records if "no VNNI" in r.getMessage()]


# Where the 7-bit op can run: bertkit's AVX2 kernel (x86 torch, AVX2); nothing is built at collection
SEVEN_HERE = torch._C.has_mkl and cpu_features().cpu_class in ("avx2", "avx512")


@pytest.mark.skipif(not SEVEN_HERE, reason="the 7-bit int8 op is bertkit's AVX2 kernel (x86 torch, AVX2)")
def test_seven_bit_int8_linears_compute_what_the_int8_graphs_op_computes(classifier):
    """quantize_int8(seven_bit=True): every encoder Linear runs bertkit's 7-bit op on its own pack of
    the int8 weights (each token's row quantised over its own range, no outlier split), the
    feed-forward intermediate Linears' at 7 bits (+-63 per output channel: the paired kernel), so the
    eager model gives the compiled graph's numbers on AVX2 exactly (the op run eagerly on
    int8_for_graph's model of it); near fp32 too. The inference engine takes it by default where the CPU has neither VNNI
    nor AMX, its frozen encoder (inference/frozen.py) with the same numbers."""
    from bertkit.kernels import graph_gemm
    from bertkit.kernels.int8 import RowInt8Linear, int8_for_graph, seven_bit_default

    assert graph_gemm.eager_ops()  # the ops build here (a C++ compiler; AVX2 and FMA)
    fp32 = BertForSequenceClassification.from_pretrained(classifier).eval()
    seven = quantize_int8(copy.deepcopy(fp32), seven_bit=True)
    layers = [m for m in seven.modules() if isinstance(m, Int8Linear)]
    assert layers and all(m._seven is not None and m.outlier_threshold is None for m in layers)
    assert "7-bit per token" in repr(layers[0])
    graph = int8_for_graph(seven)
    widest = {name: m.weight.abs().max().item() for name, m in graph.named_modules() if isinstance(m, RowInt8Linear)}
    intermediate = {name for name in widest if ".intermediate." in name}
    assert len(widest) == len(layers) and len(intermediate) == fp32.config.num_hidden_layers
    assert all(value == (63 if name in intermediate else 127) for name, value in widest.items())  # 7 bits: H -> 4H
    paired = {name for name, m in graph.named_modules()
              if isinstance(m, RowInt8Linear) and graph_gemm.seven_pack(m.weight)[-64].item() == 1}
    assert paired == intermediate  # their packs run the paired kernel, the others' not
    eight = [m.weight.abs().max().item() for m in int8_for_graph(quantize_int8(copy.deepcopy(fp32))).modules()
             if isinstance(m, RowInt8Linear)]
    assert set(eight) == {127}  # 8 bits everywhere without seven_bit
    ids, mask = _batch([3, 9, 17, 5], len(WORDS))
    real = mask.bool()
    with torch.no_grad():
        got = seven.bert(ids, mask).last_hidden_state
        with graph_gemm.recording(mkl=False, seven=True):
            want = graph.bert(ids, mask).last_hidden_state
        exact = fp32.bert(ids, mask).last_hidden_state
    assert torch.equal(got[real], want[real])
    assert 0 < (got[real] - exact[real]).abs().max() < 0.1
    assert seven_bit_default() == (cpu_features().cpu_class == "avx2" and not cpu_features().vnni)
    engine = InferenceEngine(classifier, quantize="int8")
    assert all((m._seven is not None) == seven_bit_default() for m in engine.model.modules() if isinstance(m, Int8Linear))
    if seven_bit_default():
        rows = [{"input_ids": ids[i, :n].tolist(), "attention_mask": [1] * n, "token_type_ids": [0] * n}
                for i, n in enumerate(mask.sum(1).tolist())]
        with torch.no_grad():
            logits = seven(ids, mask).logits
        for i, out in enumerate(engine.forward(rows)):
            torch.testing.assert_close(out["logits"], logits[i], atol=1e-5, rtol=1e-5)
