"""`InferenceEngine(compile=True)` (inference/compiled.py): a lone input through the graph AOTInductor
compiled ahead gives the eager engine's numbers; the package is made once and then loaded from the
cache, a new one when the weights change; what compile cannot run is refused in one line."""

import contextlib
import dataclasses
import gc
import os
import re
import shutil
import threading
from pathlib import Path
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertkit import BertForSequenceClassification, BertModel
from bertkit.errors import BertkitError
from bertkit import pipeline
from bertkit.inference import InferenceEngine
from bertkit.device import CpuFeatures, cpu_features
from bertkit.inference import compiled as compiled_module
from bertkit.kernels import graph_gemm
from bertkit.kernels.int8 import GeluRowInt8Linear, Int8Linear, RowInt8Linear, int8_for_graph, quantize_int8

TEXTS = ["hi", "a short query", "a somewhat longer sentence about searching " * 4, "word " * 90]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "compile-cache"
    monkeypatch.setenv(compiled_module.CACHE_ENV, str(folder))
    return folder


@pytest.fixture(scope="module")
def compiled_pair(tmp_path_factory, tiny_model):
    """A tiny encoder and a tiny classifier, each as an eager and a compiled engine (one compile each:
    tens of seconds on 2 cores), sharing one cache folder."""
    root = tmp_path_factory.mktemp("compiled")
    folder = root / "cache"
    patch = pytest.MonkeyPatch()
    patch.setenv(compiled_module.CACHE_ENV, str(folder))
    engines = {}
    for cls in (BertModel, BertForSequenceClassification):
        model_dir = tiny_model(cls, root / cls.__name__, num_labels=3) if cls is not BertModel \
            else tiny_model(cls, root / cls.__name__)
        engine = InferenceEngine(model_dir, compile=True)
        engine.warm_up()
        engines[cls.__name__] = (InferenceEngine(model_dir), engine, model_dir)
    yield engines, folder
    patch.undo()


def test_a_lone_input_through_the_compiled_graph_gives_the_eager_engines_numbers(compiled_pair, one_thread):
    engines, folder = compiled_pair
    eager, fast, _ = engines["BertModel"]
    assert fast._compiled is not None and fast._compiled.path.parent == folder
    for text in TEXTS:
        rows = fast.encode([text])
        assert fast._compiled.accepts(1, len(rows[0]["input_ids"]))  # every length up to the model's limit
        got, want = fast.forward(rows)[0]["last_hidden_state"], eager.forward(rows)[0]["last_hidden_state"]
        assert got.shape == want.shape == (len(rows[0]["input_ids"]), 32)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    eager_c, fast_c, _ = engines["BertForSequenceClassification"]
    for text in TEXTS:
        torch.testing.assert_close(fast_c.logits([text])[0], eager_c.logits([text])[0], atol=1e-4, rtol=1e-4)
    # batches of several: packed in one row where the graph packs, else the eager model (bitwise)
    for a, b in zip(fast_c.logits(TEXTS), eager_c.logits(TEXTS)):
        if fast_c._compiled.packs:
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        else:
            assert torch.equal(a, b)


def test_a_lone_input_really_runs_the_compiled_graph(compiled_pair, monkeypatch, one_thread):
    engines, _ = compiled_pair
    _, fast, _ = engines["BertModel"]
    calls = []
    real = fast._compiled._run
    monkeypatch.setattr(fast._compiled, "_run", lambda *a: calls.append(a[0].shape) or real(*a))
    fast.embeddings(["a short query"])
    # [CLS] a short query [SEP], padded to the lone-input bucket (a multiple of 8), or not at all with
    # bertkit's AVX2 GEMMs in the graph, which make nothing per row count
    lone = (1, 5) if fast._compiled.shapes_free else (1, 8)
    assert calls == [lone]
    fast.embeddings(["a short query", "another"])
    if fast._compiled.packs:  # both in one row of their real tokens, 5 + 3 (batching.pack_rows)
        assert calls == [lone, (1, 8)]
    else:  # a batch of two at fp32: the eager model (compiled_module.batch_limit)
        assert len(calls) == 1
    _, classifier, _ = engines["BertForSequenceClassification"]
    classifier_calls = []
    real = classifier._compiled._run
    monkeypatch.setattr(classifier._compiled, "_run", lambda *a: classifier_calls.append(a[0].shape) or real(*a))
    eager_classifier = engines["BertForSequenceClassification"][0]
    texts = ["a short query", "another", "a third, somewhat longer one"]
    got = classifier.logits(texts)
    if classifier._compiled.packs:  # one row; the graph pools each input's first token
        assert classifier_calls == [(1, 16)]  # 5 + 3 + 8 tokens
    else:
        assert classifier_calls == []
    for text, logits, want in zip(texts, got, eager_classifier.logits(texts)):
        assert logits.shape == want.shape == (3,)
        torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
        if classifier._compiled.packs:  # packed: each text's logits as it gets them alone through the graph
            torch.testing.assert_close(logits, classifier.logits([text])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_a_few_inputs_packed_in_one_row_give_each_inputs_own_numbers(compiled_pair, monkeypatch, one_thread):
    # 2-8 inputs (pairs among them, some past the attention kernel's 64 tokens) in one row of their
    # real tokens: each input's vectors as alone through the graph, and as the eager model's.
    engines, _ = compiled_pair
    eager, fast, _ = engines["BertModel"]
    if not fast._compiled.packs:
        pytest.skip("the graph packs where bertkit's attention and GEMM ops run (AVX-512, MKL's pack or AMX)")
    shapes = []
    real = fast._compiled._run
    monkeypatch.setattr(fast._compiled, "_run", lambda *a: shapes.append((a[0].shape, int(a[1].max()))) or real(*a))
    generator = torch.Generator().manual_seed(0)
    # the tiny model's 128 positions bound the packed row; 70 tokens go to SDPA inside the op
    for lengths in ([70, 40], [5, 30, 60], [3, 9, 17, 25, 40], [4, 8, 12, 16, 20, 24, 10, 6]):
        count, rows = len(lengths), []
        for n in lengths:
            ids = [101] + torch.randint(1000, 5000, (n - 2,), generator=generator).tolist() + [102]
            rows.append({"input_ids": ids, "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2), "attention_mask": [1] * n})
        shapes.clear()
        packed = fast.forward(rows)
        bucket = 1 if fast._compiled.shapes_free else 8  # bertkit's AVX2 GEMMs: no padding to a multiple of 8
        assert [shape for shape, _ in shapes] == [(1, -(-sum(lengths) // bucket) * bucket)] and shapes[0][1] == count
        for row, got, want in zip(rows, packed, eager.forward(rows)):
            alone = fast.forward([row])[0]["last_hidden_state"]
            assert got["last_hidden_state"].shape == (len(row["input_ids"]), 32)
            torch.testing.assert_close(got["last_hidden_state"], alone, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got["last_hidden_state"], want["last_hidden_state"], atol=1e-4, rtol=1e-4)


def test_the_package_is_made_once_and_remade_when_the_weights_change(compiled_pair, monkeypatch, one_thread):
    engines, folder = compiled_pair
    _, fast, model_dir = engines["BertModel"]
    packages = sorted(folder.glob("*.pt2"))
    assert len(packages) == 2 and fast._compiled.compiled_now
    compiles = []
    monkeypatch.setattr(compiled_module.CompiledLoneInput, "_compile", lambda self, *a: compiles.append(a))
    day_ago = time.time() - 86400
    os.utime(fast._compiled.path, (day_ago, day_ago))
    again = InferenceEngine(model_dir, compile=True)
    again.warm_up()
    assert compiles == [] and not again._compiled.compiled_now and again._compiled.path == fast._compiled.path
    assert again._compiled.path.stat().st_mtime > day_ago + 3600  # loaded: now the most recently used (prune_cache)
    rows = again.encode(["a short query"])
    torch.testing.assert_close(again.forward(rows)[0]["last_hidden_state"],
                               fast.forward(rows)[0]["last_hidden_state"], atol=0, rtol=0)
    ops = again._compiled.ops  # the graph's ops are in the key (kernels/graph_gemm.py)
    names = ("last_hidden_state",)
    assert compiled_module.cache_key(again.model, names, 128, "fp32", ops) in fast._compiled.path.name
    for field in ("mkl_gemm", "attention_op", "fma_gemm", "gelu_op", "norm_op"):
        other = dataclasses.replace(ops, **{field: not getattr(ops, field)})
        assert compiled_module.cache_key(again.model, names, 128, "fp32", other) not in fast._compiled.path.name, field
    with monkeypatch.context() as patched:
        patched.setattr(compiled_module, "_source_digest", lambda: "another bertkit")  # the code the graph records
        assert compiled_module.cache_key(again.model, names, 128, "fp32", ops) not in fast._compiled.path.name
    changed = InferenceEngine(model_dir, compile=True)
    with torch.no_grad():
        changed.model.embeddings.word_embeddings.weight[100] += 1.0
    assert compiled_module.cache_key(changed.model, names, 128, "fp32", ops) not in fast._compiled.path.name
    torch.set_num_threads(2)  # the kernels are built for a thread count: another count, another package
    try:
        assert compiled_module.cache_key(again.model, names, 128, "fp32", ops) not in fast._compiled.path.name
    finally:
        torch.set_num_threads(1)


def test_the_cache_deletes_the_least_recently_used_packages_past_its_limit(tmp_path, monkeypatch):
    """prune_cache: oldest first (a load touches its package), down to the limit; the package just
    made stays even when it alone is over; a killed compile's day-old work folder goes, a live one stays."""
    sizes = {"a": 300, "b": 200, "c": 100, "new": 500}
    for age, name in enumerate(("new", "c", "b", "a")):  # a is the least recently used
        path = tmp_path / f"{name}.pt2"
        path.write_bytes(b"x" * sizes[name])
        os.utime(path, (time.time() - 100 * age, time.time() - 100 * age))
    (tmp_path / "notes.txt").write_text("not a package")
    old_work, live_work = tmp_path / ".compiling-old", tmp_path / ".compiling-live"
    for work in (old_work, live_work):
        work.mkdir()
        (work / "model.pt2").write_bytes(b"y" * 1000)
    os.utime(old_work, (time.time() - 2 * 86400, time.time() - 2 * 86400))
    removed = compiled_module.prune_cache(tmp_path, tmp_path / "new.pt2", 800)
    assert [p.name for p in removed] == ["a.pt2"]  # 1100 bytes -> 800
    assert sorted(p.name for p in tmp_path.iterdir()) == [".compiling-live", "b.pt2", "c.pt2", "new.pt2", "notes.txt"]
    compiled_module._mark_used(tmp_path / "b.pt2")  # used now: c is the oldest
    assert [p.name for p in compiled_module.prune_cache(tmp_path, tmp_path / "new.pt2", 0)] == ["c.pt2", "b.pt2"]
    assert (tmp_path / "new.pt2").exists()
    monkeypatch.setenv(compiled_module.CACHE_LIMIT_ENV, "0.5")
    assert compiled_module.cache_limit_bytes() == 500_000_000
    for bad in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv(compiled_module.CACHE_LIMIT_ENV, bad)
        with pytest.raises(BertkitError, match="BERTKIT_COMPILE_CACHE_GB must be a size in GB"):
            compiled_module.cache_limit_bytes()


def test_a_damaged_package_is_named_in_one_line(tiny_model_dir, cache, monkeypatch, one_thread):
    engine = InferenceEngine(tiny_model_dir, compile=True)
    monkeypatch.setattr(compiled_module, "cache_key", lambda *a, **k: "the-key")  # the package it will look for
    cache.mkdir(parents=True)
    damaged = cache / "BertModel-fp32-the-key.pt2"
    damaged.write_bytes(b"not a package")
    with pytest.raises(BertkitError, match="cannot load the compiled model") as caught:
        engine.warm_up()
    assert str(damaged) in str(caught.value) and "\n" not in str(caught.value)


def test_a_failed_compile_is_one_line_and_leaves_no_package(tiny_model_dir, cache, monkeypatch, one_thread):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("C++ compile error\nlong log")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compiler)
    with pytest.raises(BertkitError, match=r"compiling the model failed \(RuntimeError: C\+\+ compile error\)") as caught:
        InferenceEngine(tiny_model_dir, compile=True).warm_up()
    assert "\n" not in str(caught.value)
    assert list(cache.glob("*.pt2")) == [] and list(cache.iterdir()) == []


# Where a graph at int8 compiles: VNNI (oneDNN's int8 GEMM, or AMX), else bertkit's AVX2 int8 op
INT8_GRAPH = cpu_features().vnni or (torch._C.has_mkl and cpu_features().cpu_class in ("avx2", "avx512"))


def test_int8_without_vnni_or_the_avx2_op_is_refused_in_one_line(tiny_model_dir, monkeypatch):
    # Without VNNI the int8 graph needs bertkit's AVX2 int8 op: on a CPU without AVX2, or where the op
    # cannot be built, compile at int8 is refused, in one line, before anything is compiled.
    from bertkit.kernels import graph_gemm

    monkeypatch.setattr(compiled_module, "cpu_features", lambda: CpuFeatures(avx512=False, bf16=False, amx=False, vnni=False))
    monkeypatch.setattr(graph_gemm, "avx2_int8", lambda folder: False)
    with pytest.raises(BertkitError, match="compile at int8 needs a CPU with VNNI .* or AVX2") as caught:
        InferenceEngine(tiny_model_dir, compile=True, quantize="int8")
    assert "\n" not in str(caught.value)

    def no_compiler(folder):
        raise RuntimeError("no C++ compiler (c++ or g++, or $CXX)\nmore")

    monkeypatch.setattr(graph_gemm, "avx2_int8", no_compiler)
    with pytest.raises(BertkitError, match=r"AVX2 int8 op, which could not be built \(no C\+\+ compiler") as caught:
        InferenceEngine(tiny_model_dir, compile=True, quantize="int8")
    assert "\n" not in str(caught.value)
    monkeypatch.setattr(compiled_module, "cpu_features", lambda: CpuFeatures(avx512=True, bf16=False, amx=False, vnni=True))
    compiled_module.check_int8_cpu()  # with VNNI the op is not needed


def test_a_row_int8_linear_is_per_token_int8_of_the_same_weights():
    """RowInt8Linear against the definition, in numpy: the Int8Linear's own int8 weights and scales,
    each row of x scaled to [-127, 127] by its own absolute maximum and rounded, int32 sums."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 24)
    eager = Int8Linear(layer)
    row = RowInt8Linear(eager)
    x = torch.randn(2, 5, 48)
    x[0, 1, 7] = 30.0  # an outlier channel in one token: only that token's scale grows
    qweight, _ = torch.ops.quantized.linear_unpack(eager._packed)
    w = qweight.int_repr().numpy().astype(np.int64)  # (out, in)
    w_scale = qweight.q_per_channel_scales().numpy()
    flat = x.reshape(-1, 48).numpy().astype(np.float64)
    scale = np.abs(flat).max(1, keepdims=True) / 127.0
    q = np.round(flat / scale).astype(np.int64)
    want = (q @ w.T) * scale * w_scale + layer.bias.detach().numpy()
    got = row(x).reshape(-1, 24).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert row.weight.dtype == torch.int8 and row.weight.shape == (48, 24)
    # the other tokens keep their resolution: closer to fp32 than a per-tensor scale would be
    exact = layer(x).detach().reshape(-1, 24)
    others = [i for i in range(10) if i != 1]
    assert (torch.from_numpy(got)[others] - exact[others]).abs().max() < 0.02


def test_the_gelu_fed_projection_quantises_the_gelu_on_its_input_rows_maximum():
    """GeluRowInt8Linear(h) against the definition, in numpy: GELU(h) quantised per row on
    max(the row's maximum of h, 0.17) / 127, an upper bound of |GELU| (GELU(x) < x for x > 0, GELU > -0.17),
    so no value leaves [-127, 127]: rows with a large maximum, one wholly negative, one near zero."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 16)
    eager = Int8Linear(layer)
    fed = GeluRowInt8Linear(eager)
    h = torch.randn(6, 64) * 2
    h[1] = -torch.rand(64) * 5  # GELU of it in (-0.17, 0]: quantised on 0.17 / 127
    h[2] = torch.rand(64) * 0.1
    h[3, 5] = 40.0  # one large pre-activation: that row's scale only
    qweight, _ = torch.ops.quantized.linear_unpack(eager._packed)
    w = qweight.int_repr().numpy().astype(np.int64)
    w_scale = qweight.q_per_channel_scales().numpy()
    x = h.numpy().astype(np.float64)
    gelu = torch.nn.functional.gelu(h.double()).numpy()
    scale = np.maximum(x.max(1, keepdims=True), 0.17) / 127.0
    q = np.round(gelu / scale)
    assert np.abs(q).max() <= 127  # the bound holds: int8 never wraps
    want = (q.astype(np.int64) @ w.T) * scale * w_scale + layer.bias.detach().numpy()
    np.testing.assert_allclose(fed(h).detach().numpy(), want, rtol=1e-5, atol=1e-5)
    # close to the projection of the exact GELU output quantised on its own maximum
    exact_rows = RowInt8Linear(eager)(torch.nn.functional.gelu(h))
    assert (fed(h) - exact_rows).abs().max() < 0.05


def test_the_graph_copy_moves_the_exact_gelu_into_the_output_projection(tiny_model, tmp_path):
    """int8_for_graph: behind the exact GELU the feed-forward output projection takes the
    pre-activations (the intermediate's activation becomes the identity) and computes what the
    plain per-token form (GELU in the intermediate, its output quantised on its own maximum) does,
    within int8's rounding; a tanh-GELU model keeps its GELU where it was. The source model is untouched."""
    ids = torch.randint(5, 90, (1, 12))
    for act, moved in (("gelu", True), ("gelu_new", False)):
        model = BertModel.from_pretrained(tiny_model(BertModel, tmp_path / act, hidden_act=act)).eval()
        activation = model.encoder.layer[0].intermediate.act
        quantize_int8(model)
        graph = int8_for_graph(model)
        for layer, source in zip(graph.encoder.layer, model.encoder.layer):
            assert isinstance(layer.output.dense, GeluRowInt8Linear) is moved
            assert (layer.intermediate.act is activation) is not moved
            assert source.intermediate.act is activation and type(source.output.dense) is Int8Linear
        if not moved:
            continue
        by_hand = int8_for_graph(model)
        for layer in by_hand.encoder.layer:
            plain = RowInt8Linear.__new__(RowInt8Linear)
            plain.__dict__.update(layer.output.dense.__dict__)
            layer.output.dense, layer.intermediate.act = plain, activation
        with torch.no_grad():
            got = graph(ids, torch.ones_like(ids)).last_hidden_state
            want = by_hand(ids, torch.ones_like(ids)).last_hidden_state
        assert 0 < (got - want).abs().max() < 0.05  # not the same module, the same numbers to int8's rounding


@pytest.mark.skipif(not INT8_GRAPH, reason="compile at int8 needs VNNI or AVX2; refused without (test above)")
def test_int8_compiles_the_quantised_weights_per_token(tiny_model_dir, cache, one_thread):
    """quantize int8 with compile: a lone input runs the graph, which computes what the per-token int8
    model (kernels/int8.int8_for_graph) computes eagerly, on the eager int8 engine's weights, as close to
    fp32 as int8 allows; batches keep the eager int8 engine."""
    fast = InferenceEngine(tiny_model_dir, quantize="int8", compile=True)
    fast.warm_up()
    assert "-int8-" in fast._compiled.path.name
    eager, full = InferenceEngine(tiny_model_dir, quantize="int8"), InferenceEngine(tiny_model_dir)
    reference = int8_for_graph(eager.model)
    # on AVX2 without VNNI the graph's activations are 7-bit (the op's): the reference runs that op too
    def scheme():
        return graph_gemm.recording(mkl=False, seven=True) if fast._compiled.seven else contextlib.nullcontext()

    calls = []
    real = fast._compiled._run
    fast._compiled._run = lambda *a: calls.append(tuple(a[0].shape)) or real(*a)
    for text in TEXTS:
        rows = fast.encode([text])
        got, exact = (e.forward(rows)[0]["last_hidden_state"] for e in (fast, full))
        ids = torch.tensor([rows[0]["input_ids"]])
        with torch.no_grad(), scheme():
            want = reference(ids, torch.ones_like(ids), torch.tensor([rows[0]["token_type_ids"]])).last_hidden_state[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        int8_error = (got - exact).abs().max().item()
        assert 0 < int8_error < 0.1  # int8, not fp32
    assert calls and all(shape[0] == 1 for shape in calls) and len(calls) == len(TEXTS)
    rows = fast.encode(TEXTS[:3])  # up to compiled.batch_limit (4, or 8 with the AMX op) inputs: the graph, per token as alone
    for row, got in zip(rows, fast.forward(rows)):
        alone = fast.forward([row])[0]["last_hidden_state"]
        torch.testing.assert_close(got["last_hidden_state"], alone, atol=1e-4, rtol=1e-4)
    # three inputs in one call: packed in one row where the graph packs, else padded (B = 3)
    assert [shape[0] for shape in calls[len(TEXTS):]] == [1 if fast._compiled.packs else 3, 1, 1, 1]
    assert fast._compiled.packs == (fast._compiled.int8_gemm and fast._compiled.attention_op)
    texts = (TEXTS * 3)[:fast._compiled.max_batch + 1]  # past the limit: the eager int8 model
    for a, b in zip(fast.embeddings(texts), eager.embeddings(texts)):
        assert torch.equal(a, b)
    assert len(calls) == len(TEXTS) + 4


def test_bf16_compiles_under_autocast_and_gives_the_eager_bf16_numbers(tiny_model_dir, cache, one_thread):
    """precision bf16: the graph is recorded under bf16 autocast (its own package beside the fp32
    one): as close to the eager bf16 engine as bf16's rounding allows, and as far from fp32 as it."""
    fast = InferenceEngine(tiny_model_dir, precision="bf16", compile=True)
    fast.warm_up()
    assert "-bf16-" in fast._compiled.path.name
    eager, full = InferenceEngine(tiny_model_dir, precision="bf16"), InferenceEngine(tiny_model_dir)
    calls = []
    real = fast._compiled._run
    fast._compiled._run = lambda *a: calls.append(tuple(a[0].shape)) or real(*a)
    # one input, and a batch of three (at bf16 the graph takes up to BATCH_LIMIT["bf16"] = 4)
    for texts in [[text] for text in TEXTS] + [TEXTS[:3]]:
        rows = fast.encode(texts)
        outputs = [e.forward(rows) for e in (fast, eager, full)]
        for row, got, want, exact in zip(rows, *outputs):
            got, want, exact = (out["last_hidden_state"] for out in (got, want, exact))
            assert got.dtype == torch.float32 and got.shape == exact.shape == (len(row["input_ids"]), 32)
            bf16_error = (want - exact).abs().max().item()
            assert 0 < bf16_error < 0.1  # eager bf16 differs from fp32 in bf16's digits: the test can tell
            assert (got - exact).abs().max().item() < 2 * bf16_error + 1e-2
            assert not torch.equal(got, exact)  # computed in bf16, not fp32
    if fast._compiled.packs:  # bertkit's bf16 GEMM (a Zen 4): a few inputs go as one row of their tokens
        assert fast._compiled.bf16_gemm and [shape[0] for shape in calls] == [1] * (len(TEXTS) + 1)
        fast.forward(fast.encode(TEXTS * 2 + TEXTS[:1]))  # nine inputs: past the packed limit, the eager model
    else:
        assert [shape[0] for shape in calls] == [1] * len(TEXTS) + [3]
        fast.forward(fast.encode(TEXTS + TEXTS[:1]))  # five inputs: past the limit, the eager model
    assert len(calls) == len(TEXTS) + 1


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_bf16_graph_calls_the_bf16_op_where_it_runs_its_kernel(tiny_model_dir, cache, one_thread):
    # On a Zen 4 with AVX512_BF16 the bf16 graph's encoder Linears are bertkit's bf16 op (the feed-forward
    # intermediate's through the GELU), its attention and residual + LayerNorm bertkit's fp32 ops, its
    # loops on the calling thread; lone inputs give what the oneDNN graph gives within bf16's rounding.
    from bertkit.kernels import graph_gemm

    if not graph_gemm.bf16_graphs(cache / "ops"):
        pytest.skip("bertkit's bf16 GEMM runs where the graphs' kernels are the Team's and the CPU has AVX512_BF16")
    model = BertModel.from_pretrained(tiny_model_dir).eval()
    torch.set_num_threads(2)
    ours = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64, "bf16")
    plain = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64, "bf16", gemm_ops=False)
    torch.set_num_threads(1)
    assert ours.bf16_gemm and ours.attention_op and ours.norm_op and ours.gelu_op and ours.packs
    assert not plain.bf16_gemm and not plain.attention_op and plain.path != ours.path
    layers = model.config.num_hidden_layers
    wrapper = _wrapper_source(ours.path)
    assert wrapper.count(f"{graph_gemm.BF16_SHIM}(") == 1 + 3 * layers  # (1: its declaration)
    assert wrapper.count(f"{graph_gemm.BF16_GELU_SHIM}(") == 1 + layers
    assert wrapper.count(f"{graph_gemm.ATTENTION_SHIM}(") == 1 + layers
    assert wrapper.count(f"{graph_gemm.ADD_NORM_SHIM}(") == 1 + 2 * layers
    assert f"{graph_gemm.BF16_SHIM}(" not in _wrapper_source(plain.path)
    assert "#pragma omp" not in _wrapper_source(ours.path, "kernel.cpp")
    torch.manual_seed(0)
    for length in (3, 29, 64):
        ids = torch.randint(1000, 5000, (1, length))
        mask, zeros = torch.ones_like(ids), torch.zeros_like(ids)
        with torch.no_grad():
            exact = model(ids, mask, zeros).last_hidden_state
        got, onednn = ours(ids, mask, zeros)[0].float(), plain(ids, mask, zeros)[0].float()
        bf16_error = (onednn - exact).abs().max().item()
        assert 0 < bf16_error < 0.1 and (got - exact).abs().max().item() < 2 * bf16_error + 1e-2


def test_compile_refuses_a_model_object_and_a_ready_engine(tiny_model_dir):
    model = BertModel.from_pretrained(tiny_model_dir)
    with pytest.raises(BertkitError, match="needs a model folder or Hub id"):
        InferenceEngine(None, model=model, tokenizer=tiny_model_dir, compile=True)
    with pytest.raises(BertkitError, match="give it InferenceEngine"):
        pipeline("feature-extraction", model=InferenceEngine(tiny_model_dir), compile=True)
    with pytest.raises(BertkitError, match="compile needs the fp32 weights"):
        pipeline("feature-extraction", model=tiny_model_dir, dtype=torch.bfloat16, compile=True)


def _assert_lone_inputs_give_the_eager_numbers(runner, model) -> None:
    for length in (3, 8, 29, 64):
        ids = torch.randint(1000, 5000, (1, length))
        ones, zeros = torch.ones_like(ids), torch.zeros_like(ids)
        with torch.inference_mode():
            want = model(input_ids=ids, attention_mask=ones, token_type_ids=zeros).last_hidden_state
        torch.testing.assert_close(runner(ids, ones, zeros)[0], want, atol=1e-4, rtol=1e-4)


def _cpu_flags() -> set[str]:
    from bertkit.device import _cpu_info

    return _cpu_info()[0]


def _layer_norm_loops(package) -> list[str]:
    """The names of inductor's LayerNorm loops in a package's kernels."""
    return re.findall(r'extern "C"\s+void\s+(\w*layer_norm\w*)\(', _wrapper_source(package, "kernel.cpp"))


def _wrapper_source(package, ending: str = "wrapper.cpp") -> str:
    import zipfile

    with zipfile.ZipFile(package) as archive:
        return "".join(archive.read(name).decode(errors="replace") for name in archive.namelist()
                       if name.endswith(ending))


@pytest.mark.skipif(not torch._C.has_mkl, reason="this torch has no MKL (the op calls its packed GEMM)")
def test_the_graphs_mkl_op_is_f_linear_and_follows_a_changed_weight(tmp_path):
    from bertkit.kernels import graph_gemm

    graph_gemm.load(tmp_path / "ops")
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 32), torch.randn(48)
    kept = bias.clone()
    for shape in [(1, 32), (7, 32), (40, 32), (300, 32), (2, 5, 32), (0, 32)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(torch.ops.bertkit.bertkit_mkl_linear(x, weight, bias), F.linear(x, weight, bias),
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.ops.bertkit.bertkit_mkl_linear(x, weight, None), F.linear(x, weight),
                                   atol=1e-5, rtol=1e-5)
    assert torch.equal(bias, kept)  # the bias is copied into the output, never written
    x = torch.randn(9, 32)
    with torch.no_grad():
        weight.mul_(-2.0)  # the same address, other values: packed again, not the old pack
    torch.testing.assert_close(torch.ops.bertkit.bertkit_mkl_linear(x, weight, bias), F.linear(x, weight, bias),
                               atol=1e-5, rtol=1e-5)
    transposed = torch.randn(32, 48).t()  # a strided weight is read as its values
    torch.testing.assert_close(torch.ops.bertkit.bertkit_mkl_linear(x, transposed, None), F.linear(x, transposed),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_graphs_avx2_op_is_the_linear_formula_and_follows_a_changed_weight(tmp_path):
    # Against float64: every row count around its 6-row blocks (8-row ones up to 16 rows with
    # AVX-512) and 96-row chunks, widths not a multiple of its 16-column panels, no bias, 3-D input, a
    # weight changed in place. On a CPU without AVX2 / FMA the op is F.linear, which passes too.
    from bertkit.kernels import graph_gemm

    graph_gemm.load(tmp_path / "ops")
    from bertkit.device import _cpu_info

    assert graph_gemm.fma_usable(tmp_path / "ops") == ({"avx2", "fma"} <= _cpu_info()[0])
    torch.manual_seed(0)
    for out, inputs in [(48, 32), (37, 19), (16, 384), (1152, 384), (5, 1)]:
        weight, bias = torch.randn(out, inputs), torch.randn(out)
        kept = bias.clone()
        for rows in (1, 2, 5, 6, 7, 8, 12, 13, 16, 17, 40, 95, 96, 97, 200):
            x = torch.randn(rows, inputs)
            want = x.double() @ weight.double().T
            scale = want.abs().max().item() + 1
            got = torch.ops.bertkit.bertkit_fma_linear(x, weight, bias).double()
            assert (got - (want + bias.double())).abs().max().item() < 2e-6 * scale
            got = torch.ops.bertkit.bertkit_fma_linear(x, weight, None).double()
            assert (got - want).abs().max().item() < 2e-6 * scale
            got = torch.ops.bertkit.bertkit_fma_linear_gelu(x, weight, bias).double()  # the graph's intermediate
            assert (got - F.gelu(want + bias.double())).abs().max().item() < 2e-6 * scale
            if graph_gemm.fma_usable(tmp_path / "ops"):  # an eager model's: its own pack, torch's threads
                pack = graph_gemm.fma_pack(weight)
                got = graph_gemm.eager_linear(x, pack, out, bias).double()
                assert (got - (want + bias.double())).abs().max().item() < 2e-6 * scale
                got = graph_gemm.eager_linear(x, pack, out, bias, gelu=True).double()  # the exact GELU as it stores
                assert (got - F.gelu(want + bias.double())).abs().max().item() < 2e-6 * scale
        assert torch.equal(bias, kept)
    x = torch.randn(2, 5, 32)
    weight = torch.randn(48, 32)
    torch.testing.assert_close(torch.ops.bertkit.bertkit_fma_linear(x, weight, None), F.linear(x, weight),
                               atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        weight.mul_(-2.0)  # the same address, other values: packed again, not the old pack
    torch.testing.assert_close(torch.ops.bertkit.bertkit_fma_linear(x, weight, None), F.linear(x, weight),
                               atol=1e-5, rtol=1e-5)
    assert torch.ops.bertkit.bertkit_fma_linear(torch.randn(0, 32), weight, None).shape == (0, 48)
    if graph_gemm.fma_usable(tmp_path / "ops"):  # the GELU's own approximation of erf, over its whole range
        z = torch.linspace(-12, 12, 4096).view(-1, 16)
        got = graph_gemm.eager_linear(z, graph_gemm.fma_pack(torch.eye(16)), 16, None, gelu=True).double()
        assert (got - F.gelu(z.double())).abs().max().item() < 1e-6
    transposed = torch.randn(32, 48).t()  # a strided weight is read as its values
    torch.testing.assert_close(torch.ops.bertkit.bertkit_fma_linear(x, transposed, None), F.linear(x, transposed),
                               atol=1e-5, rtol=1e-5)


def test_the_avx2_ops_share_their_work_on_threads_of_their_own(tmp_path):
    # The AVX2 GEMM and attention run on the ops' own team (graph_gemm.cpp, Team): any number of
    # threads (more than the cores, fewer than before, one) gives the formula's numbers call after call;
    # callers on several Python threads at once each get their own; a forked child, which has none of
    # the parent's workers, still computes. The workers are named for `top -H`.
    from bertkit.kernels import graph_gemm

    if not graph_gemm.fma_usable(tmp_path / "ops"):
        pytest.skip("this CPU has no AVX2 / FMA")
    before = torch.get_num_threads()
    torch.manual_seed(0)
    try:
        for threads in (2, 4, 3, 1, 2):
            torch.set_num_threads(threads)
            for out, inputs, rows in [(384, 384, 1), (1536, 384, 36), (37, 19, 97), (64, 1536, 300)]:
                weight, bias, x = torch.randn(out, inputs), torch.randn(out), torch.randn(rows, inputs)
                want = x.double() @ weight.double().T + bias.double()
                scale = want.abs().max().item() + 1
                for _ in range(30):
                    got = torch.ops.bertkit.bertkit_fma_linear(x, weight, bias).double()
                    assert (got - want).abs().max().item() < 2e-6 * scale
            qkv = torch.randn(2, 40, 3 * 384)
            q, k, v = qkv.split(384, -1)
            segments = torch.tensor([[1] * 25 + [2] * 15, [1] * 33 + [0] * 7])
            torch.testing.assert_close(torch.ops.bertkit.bertkit_attention(q, k, v, segments, 12).double(),
                                       _attention_formula(q, k, v, segments, 12), atol=2e-5, rtol=1e-5)
        names = [path.read_text().strip() for path in Path("/proc/self/task").glob("*/comm")]
        assert names.count("bertkit-ops") == 3  # four threads at most: the caller and three workers

        torch.set_num_threads(2)
        weights = [torch.randn(384, 384) for _ in range(3)]
        wrong = []

        def caller(weight):
            for _ in range(100):
                x = torch.randn(36, 384)
                if not torch.allclose(torch.ops.bertkit.bertkit_fma_linear(x, weight, None), x @ weight.T, atol=1e-4):
                    wrong.append(1)
        callers = [threading.Thread(target=caller, args=(w,)) for w in weights]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        assert not wrong

        x, weight = torch.randn(36, 384), torch.randn(384, 384)
        want = x.numpy() @ weight.numpy().T
        torch.ops.bertkit.bertkit_fma_linear(x, weight, None)  # packed here: packing runs torch's OpenMP ops
        pid = os.fork()
        if pid == 0:  # only the op and numpy here: libgomp itself is not safe to use after a fork
            got = torch.ops.bertkit.bertkit_fma_linear(x, weight, None).numpy()
            os._exit(0 if np.allclose(got, want, atol=1e-4) else 3)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the worker needs a CPU other than the caller's")
def test_a_sleeping_worker_is_woken_onto_another_cpu_than_its_callers(tmp_path):
    # A scheduler may place a woken thread on its waker's CPU once the other vCPU has idled a while
    # (~0.1 s on a VM that packs its threads onto few vCPUs), where it waits behind the caller for
    # milliseconds: the Team narrows a sleeping worker's affinity to the caller's other CPUs for the
    # wake-up, and the worker restores its own as it runs. The probe's caller waits (up to 50 ms) for
    # the worker to take the job's other item.
    from bertkit.kernels import graph_gemm

    if not graph_gemm.fma_usable(tmp_path / "ops"):
        pytest.skip("this CPU has no AVX2 / FMA")
    before = torch.get_num_threads()
    allowed = os.sched_getaffinity(0)
    try:
        torch.set_num_threads(2)
        torch.ops.bertkit.bertkit_set_team_spin(0)  # the worker sleeps as soon as a job ends
        for _ in range(3):
            torch.ops.bertkit.bertkit_team_wake_probe()
            time.sleep(0.15)  # asleep, its vCPU idle
            caller, worker, waited = torch.ops.bertkit.bertkit_team_wake_probe()
            assert worker in allowed and worker != caller, (caller, worker, waited)
        workers = [int(task.name) for task in Path("/proc/self/task").iterdir()
                   if (task / "comm").read_text().strip() == "bertkit-ops"]
        assert workers and all(os.sched_getaffinity(tid) == allowed for tid in workers)
    finally:
        torch.ops.bertkit.bertkit_set_team_spin(30)  # the library's default
        torch.set_num_threads(before)


def _ops_threads_running() -> bool:
    """Whether any of this process's `bertkit-ops` threads (Team's workers) is running or waiting
    for a CPU (state R), rather than asleep (S)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "bertkit-ops":
                if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R":
                    return True
        except OSError:  # a thread that ended meanwhile
            pass
    return False


def _huge_page_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings advised to take transparent huge pages (VmFlags "hg")."""
    found, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            current = (start, end)
        elif head == "VmFlags:" and "hg" in line.split()[1:]:
            found.append(current)
    return found


def _huge_page_bytes() -> int:
    return sum(end - start for start, end in _huge_page_mappings())


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").is_dir(),
                    reason="the kernel has no transparent huge pages to ask for")
def test_the_ops_packs_sit_in_huge_page_chunks_returned_once_their_packs_are_freed(tmp_path):
    # A lone input streams every pack once per call: the packs are asked for 2 MB pages, several to a
    # chunk, and a chunk that holds no live pack (and takes no new ones) goes back to the system.
    if not graph_gemm.fma_usable(tmp_path / "ops"):
        pytest.skip("this CPU has no AVX2 / FMA")
    before = _huge_page_bytes()
    weights = [torch.randn(512, 512) for _ in range(40)]  # 1 MB packs: three chunks of 16 MB at least
    packs = [graph_gemm.fma_pack(w) for w in weights]
    for pack in packs:
        address = pack.data_ptr()
        assert any(start <= address < end for start, end in _huge_page_mappings()), hex(address)
        assert address % 64 == 0
    x = torch.randn(5, 512)
    for w, pack in zip(weights[:3], packs[:3]):
        torch.testing.assert_close(graph_gemm.eager_linear(x, pack, 512, None), x @ w.T, rtol=1e-4, atol=1e-4)
    grown = _huge_page_bytes()
    assert grown >= before + 24 * 2**20, (before, grown)  # 40 MB of packs, at most a chunk's room already there
    del packs
    gc.collect()
    assert _huge_page_bytes() <= before + 18 * 2**20, (before, _huge_page_bytes())  # the next packs' chunk stays
    torch.ops.bertkit.bertkit_set_pack_pages(False)  # an A/B's 4 KB pages: ordinary memory
    try:
        small = graph_gemm.fma_pack(weights[0])
        assert not any(start <= small.data_ptr() < end for start, end in _huge_page_mappings())
        torch.testing.assert_close(graph_gemm.eager_linear(x, small, 512, None), x @ weights[0].T, rtol=1e-4, atol=1e-4)
    finally:
        torch.ops.bertkit.bertkit_set_pack_pages(True)


def test_the_ops_threads_spin_as_long_as_they_are_told_after_a_call(tmp_path, monkeypatch):
    # bertkit_set_team_spin (BERTKIT_SPIN_MS): after a call the Team's worker spins that long, then
    # sleeps. Told 0 it is asleep while the caller rests; told 400 ms it stays runnable (spinning,
    # yielding to any other thread: its CPU time depends on the machine's load, its state does not)
    # through the first 0.3 s of a rest. The job is two items, which the caller often takes both of
    # before the woken worker arrives: the worker spins all the same, after every call.
    if not graph_gemm.fma_usable(tmp_path / "ops"):
        pytest.skip("this CPU has no AVX2 / FMA")
    before = torch.get_num_threads()
    weight, x = torch.randn(32, 384), torch.randn(1, 384)
    try:
        torch.set_num_threads(2)
        running = {0: [], 400: []}
        for spin in (0, 400, 0, 400, 0, 400):
            torch.ops.bertkit.bertkit_set_team_spin(0)
            torch.ops.bertkit.bertkit_fma_linear(x, weight, None)
            time.sleep(0.05)  # the worker asleep
            torch.ops.bertkit.bertkit_set_team_spin(spin)
            torch.ops.bertkit.bertkit_fma_linear(x, weight, None)
            time.sleep(0.02)  # told 0, a worker the call woke is back asleep by now (on a loaded machine too)
            samples = []
            for _ in range(10):
                samples.append(_ops_threads_running())
                time.sleep(0.025)
            running[spin].append(sum(samples) / len(samples))
        assert max(running[0]) <= 0.2 and min(running[400]) >= 0.8, running
    finally:
        torch.ops.bertkit.bertkit_set_team_spin(30)  # the library's default
        torch.set_num_threads(before)
    for value in ("-1", "abc", "1.5", "60001", "\u00b2"):
        monkeypatch.setenv(graph_gemm.SPIN_ENV, value)
        with pytest.raises(BertkitError, match=f"BERTKIT_SPIN_MS must be a whole number of milliseconds.*{value!r}"):
            graph_gemm.spin_ms()
    monkeypatch.setenv(graph_gemm.SPIN_ENV, " 250 ")
    assert graph_gemm.spin_ms() == 250
    monkeypatch.delenv(graph_gemm.SPIN_ENV)
    assert graph_gemm.spin_ms() is None


def _cpuinfo_field(name: str) -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


@pytest.mark.skipif(not torch._C.has_mkl or not Path("/proc/cpuinfo").is_file(),
                    reason="the ops' library calls MKL's packed GEMM (x86 builds of torch); the CPU read from /proc")
def test_the_graphs_kernels_are_the_ops_own_where_the_vector_units_are_256_bits(tmp_path):
    # The ops' rule, against the CPU as Linux describes it (not capped by ONEDNN_MAX_CPU_ISA): AVX2 and
    # FMA without AMX, and either no AVX-512 or AMD's family 25 (Zen 4: AVX-512 on 256-bit units); the
    # int8 op sums with VNNI only there, on CPUs with AVX512_VNNI, and quantises rows to 255 steps then.
    flags = set(_cpuinfo_field("flags").split())
    avx512, amx = "avx512f" in flags, "amx_int8" in flags and graph_gemm.amx_int8(tmp_path / "ops")
    zen4 = _cpuinfo_field("vendor_id") == "AuthenticAMD" and _cpuinfo_field("cpu family") == "25" and avx512
    team = {"avx2", "fma"} <= flags and not amx and (not avx512 or zen4)
    assert graph_gemm.team_graphs(tmp_path / "ops") == team
    vnni = team and avx512 and {"avx512_vnni", "avx512vl"} <= flags
    assert graph_gemm.vnni_int8(tmp_path / "ops") == vnni
    assert graph_gemm.row_steps(tmp_path / "ops") == (255 if vnni else 127)
    assert graph_gemm.own_int8(tmp_path / "ops") == (amx or vnni or graph_gemm.avx2_int8(tmp_path / "ops"))


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_fp32_graph_calls_the_avx2_op_where_the_vector_units_are_256_bits(tiny_model_dir, cache, monkeypatch,
                                                                              one_thread):
    # Where the vector units are 256 bits wide (AVX2 only, a Zen 4) the fp32 graph's encoder Linears are
    # the AVX2 op (forced here on any x86 CPU with AVX2, as the CPU decides) and give the eager numbers;
    # elsewhere none.
    from bertkit.kernels import KernelOptions, graph_gemm

    if not graph_gemm.fma_usable(cache / "ops"):
        pytest.skip("this CPU has no AVX2 / FMA")
    # Compiled for two threads: the graph's own loops stay on the calling thread with the op (its
    # GEMMs and attention on the ops' team), OpenMP loops without it.
    model = BertModel.from_pretrained(tiny_model_dir, kernels=KernelOptions().replace(mkl_rows=0)).eval()
    monkeypatch.setattr(graph_gemm, "team_graphs", lambda folder: True)
    torch.set_num_threads(2)
    runner = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64)
    assert runner.fma_gemm and not runner.mkl_gemm
    layers = model.config.num_hidden_layers  # the feed-forward intermediate's through the GELU (its op applies it)
    assert _wrapper_source(runner.path).count(f"{graph_gemm.FMA_SHIM}(") == 1 + 3 * layers
    assert _wrapper_source(runner.path).count(f"{graph_gemm.FMA_GELU_SHIM}(") == 1 + layers  # (1: its declaration)
    assert "erf" not in _wrapper_source(runner.path, "kernel.cpp")  # no GELU loop of inductor's
    # each block's residual + LayerNorm is the op's: inductor's only LayerNorm loop is the embeddings'
    assert runner.norm_op and _wrapper_source(runner.path).count(f"{graph_gemm.ADD_NORM_SHIM}(") == 1 + 2 * layers
    assert _layer_norm_loops(runner.path) == ["cpp_fused_add_embedding_native_layer_norm_0"]
    _assert_lone_inputs_give_the_eager_numbers(runner, model)
    monkeypatch.setattr(graph_gemm, "team_graphs", lambda folder: False)
    plain = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64)
    torch.set_num_threads(1)
    assert not plain.fma_gemm and plain.path != runner.path
    assert f"{graph_gemm.FMA_SHIM}(" not in _wrapper_source(plain.path)
    if runner.attention_op:
        assert "#pragma omp" not in _wrapper_source(runner.path, "kernel.cpp")
        assert "#pragma omp" in _wrapper_source(plain.path, "kernel.cpp")


@pytest.mark.skipif(not torch._C.has_mkl, reason="this torch has no MKL (the op calls its packed GEMM)")
def test_the_fp32_graph_calls_mkls_gemm_where_the_options_take_it(tiny_model_dir, cache, one_thread):
    # Forced on (mkl_rows, whatever this CPU's default): the package's wrapper calls the op's C function
    # for every encoder Linear, and gives the eager model's numbers; forced off it calls none.
    from bertkit.kernels import KernelOptions, graph_gemm

    model = BertModel.from_pretrained(tiny_model_dir, kernels=KernelOptions().replace(mkl_rows=64)).eval()
    assert graph_gemm.applies(model)
    runner = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64)
    assert runner.mkl_gemm
    calls = _wrapper_source(runner.path).count(f"{graph_gemm.SHIM}(")
    layers = model.config.num_hidden_layers
    assert calls == 1 + 4 * layers  # its declaration, then query/key/value, output, intermediate, output per layer
    _assert_lone_inputs_give_the_eager_numbers(runner, model)
    off = BertModel.from_pretrained(tiny_model_dir, kernels=KernelOptions().replace(mkl_rows=0)).eval()
    assert not graph_gemm.applies(off)
    plain = compiled_module.CompiledLoneInput(off, ("last_hidden_state",), 64)
    assert not plain.mkl_gemm and plain.path != runner.path and f"{graph_gemm.SHIM}(" not in _wrapper_source(plain.path)


def test_without_the_gemm_ops_the_graphs_keep_onednn_and_say_so(tmp_path, monkeypatch, caplog):
    from bertkit.kernels import graph_gemm

    monkeypatch.setenv("CXX", "false")  # a "compiler" that fails
    with pytest.raises(RuntimeError, match="building the GEMM ops failed"):
        graph_gemm._build(tmp_path / "op.so")
    assert not (tmp_path / "op.so").exists() and not list(tmp_path.glob(".compiling-*"))  # nothing half-made

    def no_compiler(folder):
        raise RuntimeError("no C++ compiler (c++ or g++, or $CXX)")

    monkeypatch.setattr(graph_gemm, "load", no_compiler)
    with caplog.at_level("WARNING", logger="bertkit"):
        assert compiled_module._mkl_op_loaded(tmp_path) is False
        assert compiled_module._amx_int8_op(tmp_path) is False  # the int8 graph keeps _int_mm
        assert compiled_module.uses_attention_op("fp32", tmp_path) is False  # torch's SDPA
    said = ["compile: MKL's GEMM op unavailable (no C++ compiler (c++ or g++, or $CXX)); the graph uses oneDNN's",
            "compile: the AMX int8 GEMM op unavailable (no C++ compiler (c++ or g++, or $CXX)); the graph uses oneDNN's"]
    said.append("compile: the attention op unavailable (no C++ compiler (c++ or g++, or $CXX)); "
                "the graph uses torch's SDPA")
    assert [r.getMessage() for r in caplog.records] == said


@pytest.mark.skipif(not torch._C.has_mkl, reason="this torch has no MKL (the op calls its packed GEMM)")
def test_the_graphs_mkl_op_takes_an_empty_weight(tmp_path):
    from bertkit.kernels import graph_gemm

    graph_gemm.load(tmp_path / "ops")
    x = torch.randn(3, 8)
    assert torch.ops.bertkit.bertkit_mkl_linear(x, torch.empty(0, 8), None).shape == (3, 0)


def _int8_case(m: int, k: int, n: int):
    q = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8).t()  # (in, out) as the graph holds it
    return q, torch.rand(m, 1) / 50, weight, torch.rand(n) / 50, torch.randn(n)


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
@pytest.mark.skipif(not INT8_GRAPH, reason="without AMX or AVX2 the op is oneDNN's _int_mm, whose int8 pair sums "
                                           "saturate without VNNI (the int8 graph is refused there)")
def test_the_graphs_int8_op_gives_the_exact_int8_sums_with_their_scales(tmp_path):
    """bertkit_int8_linear against the definition: int32 sums of int8 products (exact, as oneDNN's
    `_int_mm`), times the row's and the column's scale, plus the bias; on AMX tiles where the CPU
    has them, with the AVX2 kernel where it has neither AMX nor VNNI, for row counts, widths and
    depths that are not whole tiles or register blocks too, and at the extremes of int8 (where the
    AVX2 kernel's 16-bit pair sums would saturate were the products not kept within them)."""
    from bertkit.kernels import graph_gemm

    graph_gemm.load(tmp_path / "ops")
    assert torch.ops.bertkit.bertkit_amx_int8() == graph_gemm.amx_int8(tmp_path / "ops")
    if cpu_features().amx:  # Linux lets a process use the tiles it asks for
        assert torch.ops.bertkit.bertkit_amx_int8()
    assert graph_gemm.avx2_int8(tmp_path / "ops") == (not cpu_features().amx and not cpu_features().vnni)
    torch.manual_seed(0)
    kept = []  # packs are kept per weight address: the weights live through the test
    cases = [_int8_case(m, k, n) for m, k, n in ((1, 384, 384), (7, 100, 50), (16, 64, 64), (17, 384, 1152),
                                                 (40, 1536, 384), (33, 768, 96), (64, 72, 200), (130, 384, 64),
                                                 (0, 64, 64), (5, 3, 17))]
    for sign in (1, -1):  # every product +-127 x 127: each 16-bit pair sum at its largest, 32258
        q, row_scale, weight, weight_scale, bias = _int8_case(6, 1536, 40)
        q.fill_(127 * sign)
        q[1::2] *= -1
        weight.copy_(torch.where(torch.rand(weight.shape) < 0.5, 127, -127).to(torch.int8))
        cases.append((q, row_scale, weight, weight_scale, bias))
    for case in cases:
        q, row_scale, weight, weight_scale, bias = case
        m, n = q.shape[0], weight.shape[1]
        kept.append(case)
        sums = (q.long() @ weight.long()).double()
        want = (sums * row_scale.double() * weight_scale.double() + bias.double()).float()
        got = graph_gemm.graph_int8_linear(q, row_scale, weight, weight_scale, bias)
        assert got.shape == (m, n) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        ones = graph_gemm.graph_int8_linear(q, torch.ones(m, 1), weight, torch.ones(n), None)
        assert torch.equal(ones, sums.float())  # the sums themselves, exactly
    q, row_scale, weight, weight_scale, bias = kept[3]
    before = graph_gemm.graph_int8_linear(q, row_scale, weight, weight_scale, bias)
    weight.neg_()  # changed in place, at the same address: packed again
    torch.testing.assert_close(graph_gemm.graph_int8_linear(q, row_scale, weight, weight_scale, bias), 2 * bias - before,
                               rtol=1e-5, atol=1e-4)
    assert torch.equal(bias, kept[3][4])  # the bias is read, never written


@pytest.mark.skipif(not torch._C.has_mkl or shutil.which("ldd") is None,
                    reason="the ops' library (x86 torch with MKL); ldd (glibc Linux)")
def test_the_ops_library_uses_torchs_own_openmp_runtime(tmp_path):
    # A second OpenMP runtime would bring a second team of threads onto the same cores: the ops'
    # at::parallel_for must resolve to the libgomp torch's own library loads (graph_gemm._openmp_library).
    # (Other libraries in the process may bring their own, as scikit-learn's wheels do.)
    import subprocess

    from bertkit.kernels import graph_gemm

    library = graph_gemm.load(tmp_path / "ops")

    def openmp_of(path) -> set:
        listing = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
        return {Path(line.split("=>")[1].split()[0]).resolve() for line in listing.splitlines()
                if "libgomp" in line and "=>" in line}

    torch_library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    assert openmp_of(library) == openmp_of(torch_library) and len(openmp_of(library)) == 1


@pytest.mark.skipif(not cpu_features().amx, reason="the int8 graph takes bertkit's AMX GEMM only on CPUs with AMX")
def test_the_int8_graph_calls_the_amx_op_and_computes_what_onednn_did(tiny_model_dir, cache, one_thread):
    # The package's wrapper calls the op's C function for every encoder Linear, and its outputs are the
    # _int_mm graph's (the same per-token int8 sums and scales) to float rounding; gemm_ops=False
    # keeps oneDNN's _int_mm and is another package.
    from bertkit.kernels import graph_gemm

    model = quantize_int8(BertModel.from_pretrained(tiny_model_dir).eval())
    ours = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64, "int8")
    assert ours.int8_gemm and not ours.mkl_gemm
    assert ours.max_batch == 8 and ours.batch_dim == 8  # a narrow model: AMX_INT8_BATCH_LIMIT inputs per call
    assert _wrapper_source(ours.path).count(f"{graph_gemm.INT8_SHIM}(") == 1 + 4 * model.config.num_hidden_layers
    onednn = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64, "int8", gemm_ops=False)
    assert not onednn.int8_gemm and onednn.path != ours.path
    assert f"{graph_gemm.INT8_SHIM}(" not in _wrapper_source(onednn.path)
    for batch, length in ((1, 3), (1, 29), (2, 17), (4, 64), (8, 40)):
        ids = torch.randint(1000, 5000, (batch, length))
        mask = torch.ones_like(ids)
        mask[0, length // 2:] = 0 if batch > 1 else 1  # padding in a batch
        zeros = torch.zeros_like(ids)
        # the _int_mm graph takes 4 inputs at most: 8 go through it in halves (per token, rows are independent)
        want = torch.cat([onednn(ids[i:i + 4], mask[i:i + 4], zeros[i:i + 4])[0] for i in range(0, batch, 4)])
        torch.testing.assert_close(ours(ids, mask, zeros)[0], want, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not INT8_GRAPH or cpu_features().amx, reason="the AVX2 and VNNI int8 ops are for CPUs without AMX")
def test_the_int8_graph_on_avx2_calls_the_avx2_ops_on_the_ops_threads(tiny_model_dir, cache, one_thread):
    # Without VNNI the int8 graph compiles with bertkit's 7-bit AVX2 int8 op for every encoder Linear
    # (`seven_bit` False: the exact 8-bit one, another package), inductor's loops on the calling thread
    # (the GEMMs and the attention on the ops' Team), lone inputs at their own lengths; each computes
    # what the per-token int8 model computes eagerly with the same op, and both stay near fp32. On a
    # Zen 4 the same op sums 8-bit rows with VNNI (`seven_bit` changes nothing there); on other CPUs
    # with VNNI the graph keeps oneDNN's `_int_mm`.
    from bertkit.kernels import graph_gemm

    vnni = cpu_features().vnni
    if vnni and not graph_gemm.vnni_int8(cache / "ops"):
        pytest.skip("with VNNI the graph takes bertkit's int8 op only where its kernels are the Team's (a Zen 4)")
    model = quantize_int8(BertModel.from_pretrained(tiny_model_dir).eval())
    ours = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64, "int8")
    eight = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 64, "int8", seven_bit=False)
    assert ours.int8_gemm and ours.seven and ours.avx2_ops and ours.shapes_free and not ours.mkl_gemm and not ours.fma_gemm
    assert ours.vnni == vnni and ours.packs
    if vnni:
        assert eight.path == ours.path
        eight = None
    else:
        assert eight.int8_gemm and not eight.seven and eight.avx2_ops and eight.path != ours.path
    layers = 1 + 4 * model.config.num_hidden_layers
    # the feed-forward intermediate's op applies the GELU as it stores its outputs: no GELU loop of inductor's
    assert _wrapper_source(ours.path).count(f"{graph_gemm.SEVEN_SHIM}(") == layers - model.config.num_hidden_layers
    assert _wrapper_source(ours.path).count(f"{graph_gemm.SEVEN_GELU_SHIM}(") == 1 + model.config.num_hidden_layers
    assert "erf" not in _wrapper_source(ours.path, "kernel.cpp")
    assert f"{graph_gemm.INT8_SHIM}(" not in _wrapper_source(ours.path)
    if eight is not None:
        assert "erf" in _wrapper_source(eight.path, "kernel.cpp")
        assert _wrapper_source(eight.path).count(f"{graph_gemm.INT8_SHIM}(") == layers
    for graph in filter(None, (ours, eight)):  # the blocks' residual + LayerNorm through the op in both
        assert graph.norm_op and _wrapper_source(graph.path).count(f"{graph_gemm.ADD_NORM_SHIM}(") == 1 + 2 * model.config.num_hidden_layers
        assert len(_layer_norm_loops(graph.path)) == 1  # the embeddings'
    reference = int8_for_graph(model)
    full = BertModel.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(0)
    for batch, length in ((1, 3), (1, 29), (2, 17), (4, 64)):
        ids = torch.randint(1000, 5000, (batch, length))
        mask = torch.ones_like(ids)
        zeros = torch.zeros_like(ids)
        with torch.no_grad():
            exact = full(ids, mask, zeros).last_hidden_state
            with graph_gemm.recording(mkl=False, seven=True):  # the row-quantising op, eagerly
                want = reference(ids, mask, zeros).last_hidden_state
            want_eight = reference(ids, mask, zeros).last_hidden_state
        got = ours(ids, mask, zeros)[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        if eight is not None:
            torch.testing.assert_close(eight(ids, mask, zeros)[0], want_eight, atol=1e-4, rtol=1e-4)
        assert 0 < (got - want_eight).abs().max() and (got - exact).abs().max() < 0.1  # another scheme, still int8-close


@pytest.mark.skipif(not INT8_GRAPH, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_seven_bit_int8_op_is_its_definition(tmp_path):
    """bertkit_int8_linear_seven against its definition, in float64 from the same float32 steps: each
    row's range [min(row, 0), max(row, 0)] over 127 steps (255 where it sums with VNNI: a Zen 4),
    its zero point where 0 falls, the values rounded half to even and offset (0-127 / 0-255), exact
    int32 sums with the int8 weight, the zero point times the column's weight sum taken off, times the
    scales, plus the bias; for odd sizes, a zero row, one-signed rows and every product at its largest
    (127 x 127, where 8-bit values would saturate the AVX2 kernel's 16-bit pair sums); weights within
    +-64 (kernels/int8.py's 7-bit weights) take the paired kernel, two pair sums added in int16, exact
    up to every product at 127 x 64, and one weight of 65 keeps a pack off it; the GELU op is the
    exact GELU of the same."""
    from bertkit.kernels import graph_gemm

    steps = graph_gemm.row_steps(tmp_path / "ops")
    assert steps == (255 if graph_gemm.vnni_int8(tmp_path / "ops") else 127)
    assert not graph_gemm.vnni_int8(tmp_path / "ops") or cpu_features().vnni

    def definition(x, weight, weight_scale, bias):
        lo, hi = x.amin(1, keepdim=True).clamp(max=0), x.amax(1, keepdim=True).clamp(min=0)
        scale = (hi - lo) / steps
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        inverse = 1.0 / scale
        zero = torch.round(-lo * inverse).clamp(0, steps)
        q = (torch.round(x * inverse) + zero).clamp(0, steps)
        assert q.numel() == 0 or (q.min() >= 0 and q.max() <= steps)
        sums = q.long() @ weight.long() - zero.long() * weight.long().sum(0)
        return sums.double() * scale.double() * weight_scale.double() + bias.double()

    torch.manual_seed(0)
    kept = []
    for m, k, n in ((1, 384, 384), (5, 384, 1152), (36, 1536, 384), (130, 768, 200), (3, 100, 70), (2, 7, 5), (0, 64, 64)):
        x = torch.randn(m, k) * 2
        if m > 2:
            x[0, 3] = 30.0  # an outlier channel
            x[1].zero_()  # a zero row: the bias alone
            x[2] = x[2].abs()  # one-signed rows: zero point 0, and 127
            x[min(m - 1, 3)] = -x[min(m - 1, 3)].abs()
        for limit in (127, 64):
            weight = torch.randint(-limit, limit + 1, (n, k), dtype=torch.int8).t()
            weight_scale, bias = torch.rand(n) / 50, torch.randn(n)
            kept.append(weight)
            assert graph_gemm.seven_pack(weight)[-64].item() == (limit == 64)  # the pack says whether it pairs
            got = graph_gemm.graph_int8_linear_seven(x, weight, weight_scale, bias)
            assert got.shape == (m, n) and got.dtype == torch.float32
            torch.testing.assert_close(got.double(), definition(x, weight, weight_scale, bias), rtol=1e-5, atol=1e-4)
            if m > 2:
                torch.testing.assert_close(got[1], bias)
            gelu = graph_gemm.graph_int8_linear_seven(x, weight, weight_scale, bias, gelu=True)  # as it stores
            torch.testing.assert_close(gelu.double(), F.gelu(definition(x, weight, weight_scale, bias)), rtol=1e-5, atol=1e-4)
    x = torch.full((4, 1536), 0.5)  # every value the top step after quantising
    weight = torch.full((1536, 40), 127, dtype=torch.int8)
    weight[::2, ::3] = -127
    ones = graph_gemm.graph_int8_linear_seven(x, weight, torch.ones(40), None)
    torch.testing.assert_close(ones.double(), (steps * weight.long().sum(0)).double().expand(4, 40) * (0.5 / steps),
                               rtol=1e-6, atol=0)  # the sums exact: only the float scale's rounding
    for top in (64, -64):  # paired: four products of 127 x +-64 in one int16, 32512 (the limit's edge)
        weight = torch.full((1536, 40), top, dtype=torch.int8)
        weight[::3, ::2] = -top
        assert graph_gemm.seven_pack(weight)[-64].item() == 1
        paired = graph_gemm.graph_int8_linear_seven(x, weight, torch.ones(40), None)
        torch.testing.assert_close(paired.double(), (steps * weight.long().sum(0)).double().expand(4, 40) * (0.5 / steps),
                                   rtol=1e-6, atol=0)
    weight[5, 7] = 65
    assert graph_gemm.seven_pack(weight)[-64].item() == 0


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_bf16_op_is_autocasts_linear(tmp_path):
    """bertkit_bf16_linear against autocast's Linear: fp32 sums of the bf16 products plus the bf16 bias,
    rounded to bf16 once (the sums' order may move a value by one bf16 step); through the exact GELU
    before rounding for the GELU op; for widths that are not whole panels, row counts that are not whole
    register blocks and an odd K (ATen's route), and following a changed weight. Its own kernel where
    the graphs' kernels are the Team's and the CPU has AVX512_BF16 (a Zen 4), ATen's elsewhere."""
    from bertkit.kernels import graph_gemm

    assert graph_gemm.bf16_graphs(tmp_path / "ops") == (graph_gemm.team_graphs(tmp_path / "ops") and cpu_features().bf16)
    torch.manual_seed(0)
    kept = []
    for m, k, n in ((1, 384, 384), (6, 384, 1152), (40, 1536, 384), (13, 768, 3072), (7, 100, 50), (3, 6, 17),
                    (5, 7, 9), (0, 64, 64)):
        x, weight, bias = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.randn(n).bfloat16()
        kept.append(weight)
        sums = x.double() @ weight.double().T + bias.double()
        for op, want in ((torch.ops.bertkit.bertkit_bf16_linear, sums),
                         (torch.ops.bertkit.bertkit_bf16_linear_gelu, F.gelu(sums))):
            got = op(x, weight, bias)
            assert got.dtype == torch.bfloat16 and got.shape == (m, n)
            # within one bf16 step (2^-7 relative) of the exact value rounded: the fp32 sums' order
            step = want.abs().clamp(min=1e-3) * 2.0 ** -7
            assert ((got.double() - want).abs() <= step * 1.01 + 1e-6).all()
        assert torch.equal(torch.ops.bertkit.bertkit_bf16_linear(x, weight, None).double(),
                           torch.ops.bertkit.bertkit_bf16_linear(x, weight, torch.zeros(n).bfloat16()).double())
    x, weight = torch.randn(4, 384).bfloat16(), kept[0]
    before = torch.ops.bertkit.bertkit_bf16_linear(x, weight, None)
    weight.neg_()  # the same address, new values: packed again
    torch.testing.assert_close(torch.ops.bertkit.bertkit_bf16_linear(x, weight, None), -before, atol=0, rtol=0)


def _attention_formula(q, k, v, segments, heads):
    """softmax(q k^T / sqrt(D)) v per head in float64, from (B, T, H) rows, each query attending to
    the keys of its own segment ((B, T) ids, 0 for padding; None: one segment per row); a query with
    no key to attend (padding) gives zeros."""
    B, T, H = q.shape
    split = [t.double().reshape(B, T, heads, H // heads).transpose(1, 2) for t in (q, k, v)]
    scores = split[0] @ split[1].transpose(-1, -2) / (H // heads) ** 0.5
    if segments is not None:
        same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] != 0)  # (B, T, T)
        scores = scores.masked_fill(~same[:, None], float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
    return (probs @ split[2]).transpose(1, 2).reshape(B, T, H)


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_graphs_attention_op_is_the_attention_formula(tmp_path):
    # Short inputs through bertkit's kernel (AVX-512, else AVX2; head dimensions a multiple of 16, of 8
    # on AVX2, up to 64 keys; a head of 128 dimensions keeps K^T on the heap; one of 48 ends its context
    # in single groups of 8 on AVX2), on AVX2 up to 512 keys
    # through its kernel for longer sequences (scores in a buffer),
    # the rest through torch's SDPA inside the op: against the formula in float64, on (B, T, H) views
    # of one fused query/key/value projection as the graph holds them, with and without padding.
    from bertkit.kernels import graph_gemm

    graph_gemm.load(tmp_path / "ops")
    from bertkit.device import _cpu_info

    flags = _cpu_info()[0]  # the CPU itself, not an ISA cap (ONEDNN_MAX_CPU_ISA) that cpu_features honours
    if flags:
        assert graph_gemm.short_attention(tmp_path / "ops") == ("avx512f" in flags or {"avx2", "fma"} <= flags)
    torch.manual_seed(0)
    for batch, length, hidden, heads in [(1, 1, 64, 4), (1, 7, 64, 4), (2, 16, 32, 2), (1, 17, 384, 12),
                                         (3, 40, 384, 12), (2, 64, 768, 12), (1, 33, 256, 4),
                                         (2, 65, 64, 4), (1, 130, 64, 2), (2, 20, 32, 4), (2, 30, 256, 2),
                                         (2, 200, 384, 12), (1, 512, 64, 1), (1, 520, 64, 2), (2, 55, 96, 2), (1, 150, 96, 2)]:
        qkv = torch.randn(batch, length, 3 * hidden) * 2
        q, k, v = qkv.split(hidden, -1)
        kept = qkv.clone()
        keep = torch.arange(length)[None, :] < torch.randint(1, length + 1, (batch, 1))
        # segment ids: inputs packed one after another, then padding (the mask a packing graph gets)
        cuts = torch.sort(torch.randint(0, length + 1, (batch, 3)), dim=1).values
        positions = torch.arange(length)[None, :]
        segments = 1 + (positions >= cuts[:, :1]).long() + (positions >= cuts[:, 1:2]).long()  # 1, 2, 3 ...
        segments = segments.masked_fill(positions >= cuts[:, 2:3], 0)  # ... then padding
        for mask, ids in ((None, None), (keep[:, None, None, :], keep.long()), (keep.long(), keep.long()),
                          (segments, segments)):
            want = _attention_formula(q, k, v, ids, heads)
            for op in (torch.ops.bertkit.bertkit_attention, graph_gemm.eager_attention):  # the Team's, torch's threads
                got = op(q, k, v, mask, heads)
                assert got.shape == (batch, length, hidden) and got.is_contiguous()
                torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5)
        assert torch.equal(qkv, kept)  # the inputs are read, never written
    if graph_gemm.short_attention(tmp_path / "ops"):  # bertkit's kernel: a query with no key to attend gets zeros
        q = torch.randn(1, 8, 64)
        nothing = torch.zeros(1, 1, 1, 8, dtype=torch.bool)
        assert torch.equal(torch.ops.bertkit.bertkit_attention(q, q, q, nothing, 4), torch.zeros(1, 8, 64))


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_the_residual_norm_op_is_the_layer_norm_of_the_sum(tmp_path):
    # bertkit_add_norm (its rows on the ops' Team): LayerNorm(y + residual) over the last dimension,
    # against the formula in float64 (the mean, the variance around it), as close as torch's own;
    # widths with a tail past whole vectors, a row of one value (no spread: the bias), 3-D inputs as
    # a graph holds them; the inputs read, never written.
    from bertkit.kernels import graph_gemm

    graph_gemm.load(tmp_path / "ops")
    torch.manual_seed(0)
    for shape in [(1, 384), (36, 384), (5, 768), (7, 20), (3, 13), (2, 9, 40), (0, 384), (1, 7)]:
        n = shape[-1]
        y, residual = torch.randn(shape) * 4 + 1, torch.randn(shape)
        weight, bias = torch.randn(n), torch.randn(n)
        kept = (y.clone(), residual.clone())
        total = y.double() + residual.double()
        mean = total.mean(-1, keepdim=True)
        variance = ((total - mean) ** 2).mean(-1, keepdim=True)
        want = (total - mean) / torch.sqrt(variance + 1e-12) * weight.double() + bias.double()
        torch_error = (torch.nn.functional.layer_norm(y + residual, (n,), weight, bias, 1e-12).double() - want).abs()
        got = torch.ops.bertkit.bertkit_add_norm(y, residual, weight, bias, 1e-12)
        assert got.shape == y.shape and got.dtype == torch.float32
        if y.numel():
            assert float((got.double() - want).abs().max()) <= max(2e-6, 2 * float(torch_error.max())), shape
        assert torch.equal(y, kept[0]) and torch.equal(residual, kept[1])
    flat = torch.full((2, 24), 3.0)  # no spread: every value the mean, the output its bias
    torch.testing.assert_close(torch.ops.bertkit.bertkit_add_norm(flat, torch.zeros(2, 24), torch.ones(24),
                                                                  torch.arange(24.0), 1e-5), torch.arange(24.0).repeat(2, 1))
    with pytest.raises(RuntimeError, match="one shape"):
        torch.ops.bertkit.bertkit_add_norm(torch.randn(2, 8), torch.randn(2, 9), torch.ones(8), torch.ones(8), 1e-5)


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
@pytest.mark.skipif(not cpu_features().avx512 and not {"avx2", "fma"} <= _cpu_flags(),
                    reason="the graphs record bertkit's attention on CPUs with AVX-512 or AVX2")
def test_the_fp32_graph_calls_the_attention_op_and_computes_what_sdpa_did(tiny_model_dir, cache, one_thread):
    # One call of the op's C function per layer; the model's numbers at lengths under and over the
    # op's own kernel's limit (64 keys); attention_op=False keeps SDPA and is another package.
    from bertkit.kernels import graph_gemm

    model = BertModel.from_pretrained(tiny_model_dir).eval()
    ours = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 128)
    assert ours.attention_op
    assert _wrapper_source(ours.path).count(f"{graph_gemm.ATTENTION_SHIM}(") == 1 + model.config.num_hidden_layers
    sdpa = compiled_module.CompiledLoneInput(model, ("last_hidden_state",), 128, attention_op=False)
    assert not sdpa.attention_op and sdpa.path != ours.path
    assert f"{graph_gemm.ATTENTION_SHIM}(" not in _wrapper_source(sdpa.path)
    for length in (3, 8, 29, 64, 100):
        ids = torch.randint(1000, 5000, (1, length))
        ones, zeros = torch.ones_like(ids), torch.zeros_like(ids)
        with torch.inference_mode():
            want = model(input_ids=ids, attention_mask=ones, token_type_ids=zeros).last_hidden_state
        torch.testing.assert_close(ours(ids, ones, zeros)[0], want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours(ids, ones, zeros)[0], sdpa(ids, ones, zeros)[0], atol=1e-5, rtol=1e-5)
    ids = torch.randint(1000, 5000, (3, 40))  # padded inputs in one call (the graph's batch dimension)
    mask = torch.ones_like(ids)
    mask[0, 21:], mask[2, 5:] = 0, 0
    zeros = torch.zeros_like(ids)
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=mask, token_type_ids=zeros).last_hidden_state
    real = mask.bool()  # the padding rows' outputs are nobody's
    torch.testing.assert_close(ours(ids, mask, zeros)[0][real], want[real], atol=1e-4, rtol=1e-4)


def test_the_graphs_batch_limit_follows_the_precision_the_int8_op_and_the_width():
    limit = compiled_module.batch_limit
    assert [limit(p, 384) for p in ("fp32", "bf16", "int8")] == [1, 4, 4]
    assert limit("int8", 384, amx_int8_gemm=True) == 8  # all-MiniLM-L6-v2 (1.40x eager at 8 inputs)
    assert limit("int8", 768, amx_int8_gemm=True) == 4  # BERT-base (0.97x at 8)
    assert limit("int8", 1024, amx_int8_gemm=True) == 4 and limit("int8", 128, amx_int8_gemm=True) == 8
    assert limit("fp32", 384, amx_int8_gemm=True) == 1


@pytest.mark.skipif(not torch._C.has_mkl, reason="the ops' library calls MKL's packed GEMM (x86 builds of torch)")
def test_token_and_answer_heads_pack_and_give_each_inputs_own_logits(tiny_model, tmp_path, cache, one_thread):
    # Per-token heads pack too: a token classifier's (T, labels) and a reader's start / end logits
    # per input, as the eager engine gives them.
    from bertkit import BertForQuestionAnswering, BertForTokenClassification

    for cls, extra in ((BertForTokenClassification, {"num_labels": 5}), (BertForQuestionAnswering, {})):
        model_dir = tiny_model(cls, tmp_path / cls.__name__, **extra)
        fast, eager = InferenceEngine(model_dir, compile=True), InferenceEngine(model_dir)
        if not fast._compiled_runner().packs:
            pytest.skip("the graph packs where bertkit's attention and GEMM ops run (AVX-512, MKL's pack or AMX)")
        calls = []
        real = fast._compiled._run
        fast._compiled._run = lambda *a: calls.append(tuple(a[0].shape)) or real(*a)
        rows = fast.encode(["a short query", "hi", "a somewhat longer sentence about searching"],
                           ["some context", "more", "and a passage to read"])
        got, want = fast.forward(rows), eager.forward(rows)
        assert len(calls) == 1 and calls[0][0] == 1  # the three in one packed row
        for g, w, row in zip(got, want, rows):
            assert g.keys() == w.keys()
            for key in g:
                assert g[key].shape == w[key].shape and g[key].shape[0] == len(row["input_ids"])
                torch.testing.assert_close(g[key], w[key], atol=1e-4, rtol=1e-4)


def test_left_to_right_models_and_bilstm_heads_never_pack(tiny_model, tmp_path, cache, monkeypatch, one_thread):
    # A left-to-right model's causal attention is SDPA's in the graph, which does not read segment
    # ids; a BiLSTM on top would run over the whole packed row. The same heads without them pack
    # where the graph's ops allow.
    from bertkit import BertForTokenClassification

    monkeypatch.setattr(compiled_module.CompiledLoneInput, "_compile", lambda self, *a: None)
    monkeypatch.setattr(compiled_module, "_package_loader", lambda: lambda *a: None)
    packs = {}
    for name, cls, extra in (("plain", BertModel, {}), ("ltr", BertModel, {"is_decoder": True}),
                             ("tagger", BertForTokenClassification, {"num_labels": 3}),
                             ("bilstm", BertForTokenClassification, {"num_labels": 3, "bilstm_hidden_size": 8}),
                             ("classifier", BertForSequenceClassification, {"num_labels": 3}),
                             ("ltr classifier", BertForSequenceClassification, {"num_labels": 3, "is_decoder": True}),
                             ("bilstm classifier", BertForSequenceClassification,
                              {"num_labels": 3, "bilstm_hidden_size": 8})):
        runner = InferenceEngine(tiny_model(cls, tmp_path / name, **extra), compile=True)._compiled_runner()
        packs[name] = runner.packs
        ops = runner.attention_op and (runner.mkl_gemm or runner.fma_gemm or runner.int8_gemm)
        assert runner.packs == (ops and name in ("plain", "tagger", "classifier"))
        # the graph takes the pooled tokens' positions only where the first token is what it pools
        assert runner.pools == (name == "classifier")
    assert not packs["ltr"] and not packs["bilstm"] and not packs["ltr classifier"]


def test_pack_rows_puts_inputs_one_after_another_numbered_with_their_own_positions():
    from bertkit.batching import SINGLE_LENGTH_BUCKET, pack_rows

    rows = [{"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0]},
            {"input_ids": [101, 8, 9, 102, 10, 102], "token_type_ids": [0, 0, 0, 0, 1, 1]}]
    packed, starts = pack_rows(rows, pad_token_id=0)
    assert starts == [0, 3] and SINGLE_LENGTH_BUCKET == 8
    assert packed["input_ids"].tolist() == [[101, 7, 102, 101, 8, 9, 102, 10, 102, 0, 0, 0, 0, 0, 0, 0]]
    assert packed["attention_mask"].tolist() == [[1, 1, 1, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0]]
    assert packed["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 0]]
    assert all(t.dtype == torch.long and t.is_contiguous() for t in packed.values())
