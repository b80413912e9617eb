"""Int8 inference: the encoder's Linear layers as dynamically quantised ones.

Weights become int8 once (per output channel, symmetric); activations are quantised per batch on
the fly (per tensor, asymmetric uint8) and the GEMMs accumulate in int32 (fbgemm, or oneDNN's
VNNI kernels where the CPU has them: torch's "x86" quantisation engine picks). On the avx2 class
without VNNI the inference engine takes bertkit's 7-bit AVX2 op instead (`seven_bit`:
each token quantised over its own range, the feed-forward intermediate weights to 7 bits too, no
outlier split; kernels/graph_gemm.py). This is the scheme
of ONNX Runtime's `quantize_dynamic` and of torch's `quantize_dynamic`, with the weight scales per
channel rather than per tensor (closer to fp32 at the same speed). The layout (unpadding, packed
attention), LayerNorm, softmax, the embeddings and the task heads stay fp32.

One exception to the per-tensor activations: the feed-forward output projection (4H -> H). Its
input, the GELU output, has a few channels 5-10x larger than the rest (Bondarenko et al. 2021,
"Understanding and Overcoming the Challenges of Efficient Transformer Quantization"; in
all-MiniLM-L6-v2 fine-tuned on MRPC one channel reaches 25 against a 99.9th percentile of 2-3),
and one such channel stretches the single activation scale over all the others. There the
channels past `OUTLIER_THRESHOLD` in a call are multiplied in fp32 (with the int8 weights' values)
and the rest in int8: LLM.int8()'s mixed-precision decomposition (Dettmers et al. 2022, its
threshold 6.0). The cost is one pass reading the input (its channels' maxima, and minima where
the input has no known floor); where a channel passes the threshold, a gather of those channels
and one pass over the (N, H) output, with no copy of the input. The
other Linears stay plain int8: splitting them too gains less per pass (the intermediate Linear's
extra pass would be over its (N, 4H) output; numbers in docs/speed.md, from
benchmarks/int8_accuracy.py --layers).
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..device import cpu_features
from . import graph_gemm
from .linear import ProjectedWithQuery, QKVProjection

QUANTIZE_CHOICES = ("none", "int8")
OUTLIER_THRESHOLD = 6.0  # |activation| past which a channel is computed in fp32 (LLM.int8()'s value)
# Rows (tokens in the call) at width 768 from which a CPU with AMX runs the int8 GEMM through
# oneDNN's AMX kernels rather than fbgemm's VNNI ones; a narrower Linear's count scales up (768 / its
# width, the smaller of its in and out features: 128 rows for all-MiniLM-L6-v2's 384). The dynamic
# Linear alone, MiniLM's and BERT-base's four shapes, oneDNN's over fbgemm's speed 0.96x / 1.08x at
# 40 rows, 1.12-1.37x at 160, 1.17-1.42x at 320-1280; a whole lone input through oneDNN measured
# 0.70-0.90x fbgemm's speed. The eager int8 engine, two inputs of 8-64 tokens: BERT-base 1.075x from
# 64 rows against 128 (even at one input of 57-64 tokens), MiniLM 0.95x from 64 (docs/speed.md).
AMX_ROWS = 64
AMX_REFERENCE_WIDTH = 768
# `seven_bit`: the feed-forward intermediate Linears' (H -> 4H) weights at 7 bits (+-63), which the
# AVX2 op's paired kernel sums two pair products of in int16 (a third of the encoder's multiply-adds;
# the kernel's loop 1.4-1.5x on Zen 3). Fine-tuned all-MiniLM-L6-v2, dev examples alone against fp32
# (Zen 3): 7 bits there MRPC -0.10 F1 / 0.00 accuracy, SST-2 -0.23 / 0.00 points (eager / graph); in
# every Linear SST-2 -0.80, and every Linear but the feed-forward output projection (its input the
# GELU's, with the outlier channels above) -0.46, close to issue 39's 0.5 limit (docs/speed.md).
SEVEN_BIT_LEVELS = 63.0
GELU_FLOOR = -0.17  # the exact GELU's least value (-0.16997 at x = -0.7518): its output never lies below
# Said where int8 buys no speed: fbgemm's kernels without VNNI, measured on a 2-core AVX2-only EPYC,
# all-MiniLM-L6-v2 int8 34.9 against fp32 36.7 sequences/s, BERT-base 5.24 against 5.16
# (benchmarks/results/avx2/engines.md); with VNNI (Zen 5) 1.31x and 1.83x fp32. Not said for
# `seven_bit` (bertkit's 7-bit op, the engine's int8 on the avx2 class): 1.42x and 1.64x on Zen 3.
NO_VNNI_NOTE = ("note: this CPU has no VNNI, so int8 runs 7-bit with 16-bit pair sums and measured no faster "
                "than fp32 on such a CPU (docs/speed.md, int8); it still holds the weights in a quarter of the memory")

log = logging.getLogger("bertkit")


def _engine() -> str:
    """torch's x86 engine (fbgemm and oneDNN by shape) where it exists, else whatever it has."""
    engines = torch.backends.quantized.supported_engines
    for name in ("x86", "fbgemm", "onednn", "qnnpack"):
        if name in engines:
            return name
    raise RuntimeError("this torch build has no quantised CPU engine")


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 (symmetric, a scale per output row) and x quantised to uint8 per
    call (its own min / max); int32 accumulation, fp32 in and out. Inference only.

    Without VNNI the int8 dot product (vpmaddubsw) saturates at int16, so the activations use 7 bits
    there (`reduce_range`, as torch's own dynamic Linear always does); with VNNI all 8.

    With `outlier_threshold`, the input channels holding a value past it in this call are left out
    of the quantised GEMM (so out of its activation range) and multiplied in fp32 with their columns
    of the int8 weights: y = Q(x with those channels zeroed) W^T + x[:, outliers] W[:, outliers]^T.
    The input is changed in place meanwhile and restored before returning (inference only), unless
    the caller says it never reads it again (`overwrite_input`)."""

    def __init__(self, layer: nn.Linear, outlier_threshold: float | None = None, input_floor: float | None = None,
                 seven_bit: bool = False, weight_levels: float = 127.0):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        weight = layer.weight.detach().float()
        # `weight_levels` SEVEN_BIT_LEVELS: 7-bit weights, which the 7-bit op's paired kernel takes
        scale = (weight.abs().amax(1).clamp(min=1e-8) / weight_levels).double()  # (out,)
        with warnings.catch_warnings():  # torch marks its quantised tensors deprecated (still there in 2.13)
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scale, torch.zeros(len(scale), dtype=torch.long), 0,
                                                 torch.qint8)
        bias = None if layer.bias is None else layer.bias.detach().float().clone()
        self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        # A second pack of the same int8 weights for oneDNN's AMX kernels (CPUs with AMX-BF16 have
        # AMX-INT8 too), taken from AMX_ROWS rows on: the call runs the kernels of the pack it is given.
        self._packed_amx = _onednn_pack(qweight, bias) if cpu_features().amx else None
        self.amx_rows = AMX_ROWS * AMX_REFERENCE_WIDTH // min(self.in_features, self.out_features)
        self._amx_elements = self.amx_rows * self.in_features
        self.reduce_range = not cpu_features().vnni
        self.outlier_threshold = outlier_threshold
        # The least value the input can hold, where it is known (the exact GELU's output): past the
        # negative threshold nothing can lie then, and the outlier search reads the channels' maxima only.
        self.input_floor = input_floor
        # `seven_bit` (AVX2 without VNNI, `seven_bit_default`): the calls run bertkit's 7-bit op on its own
        # pack of the int8 weights, each token's row quantised over its own range (as the compiled
        # graph there), with no outlier split; the fbgemm pack stays for int8_for_graph and export
        self._seven = graph_gemm.seven_pack(qweight.int_repr().t()) if seven_bit else None
        if seven_bit:
            self._seven_scale = scale.float()
            self._seven_bias = bias
            self.outlier_threshold = outlier_threshold = None
        if outlier_threshold is not None:  # the packed copy is opaque: keep the int8 values for the fp32 columns
            self._int_weight = qweight.int_repr()  # (out, in) int8
            self._weight_scale = scale.float()[:, None]  # (out, 1)
            # The fp32 columns per set of outlier channels: a model's outliers sit in the same few
            # channels call after call (Bondarenko et al.), so each set is made once, not per call.
            self._columns: dict[tuple[int, ...], torch.Tensor] = {}
            self._last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (mask, channels, columns)

    def forward(self, x: torch.Tensor, overwrite_input: bool = False) -> torch.Tensor:  # (..., in) -> (..., out)
        """`overwrite_input`: the caller never reads x again (the inference flat loop's GELU output), so
        the outlier channels zeroed in it for the int8 GEMM need not be put back."""
        return self.gemm(x.detach().float().contiguous(), overwrite_input)

    def forward_gelu(self, x: torch.Tensor) -> torch.Tensor:
        """GELU(forward(x)) (kernels/linear.linear_act): on the 7-bit op, applied by the op as it stores
        its outputs, as the compiled graph's feed-forward intermediate does."""
        return self.gemm(x.detach().float().contiguous(), gelu=True)

    def gemm(self, x: torch.Tensor, overwrite_input: bool = False, gelu: bool = False) -> torch.Tensor:
        """forward, for an input already fp32, contiguous and outside autograd (the inference flat
        loop's, inference/frozen.py): three dispatched no-op calls fewer per GEMM; through the exact
        GELU with `gelu`."""
        if self._seven is not None:
            return graph_gemm.eager_int8_seven(x, self._seven, self.out_features, self._seven_scale, self._seven_bias,
                                               gelu)
        if gelu:
            return torch.ops.aten.gelu_(self.gemm(x, overwrite_input))  # in place: the output is this call's own
        packed = self._packed if self._packed_amx is None or x.numel() < self._amx_elements else self._packed_amx
        if self.outlier_threshold is None:
            return torch.ops.quantized.linear_dynamic(x, packed, self.reduce_range)
        flat = x.view(-1, self.in_features)  # (N, in)
        split = None if flat.shape[0] == 0 else self._outlier_split(flat)
        if split is None:
            return torch.ops.quantized.linear_dynamic(x, packed, self.reduce_range)
        outliers, columns = split
        kept = flat.index_select(1, outliers)  # (N, k)
        # The int8 GEMM takes its range from the whole tensor: zero the outlier channels in place for it
        # and put them back after (a copy of the input would be the split's largest cost).
        flat.index_fill_(1, outliers, 0.0)
        try:
            y = torch.ops.quantized.linear_dynamic(flat, packed, self.reduce_range)  # (N, out)
        finally:
            if not overwrite_input:
                flat.index_copy_(1, outliers, kept)
        return y.addmm_(kept, columns.T).view(*x.shape[:-1], self.out_features)

    def _outlier_split(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The input channels holding a value past the threshold in this call and their fp32 weight
        columns, or None. Per-channel maxima (and minima, unless the input's floor rules them out)
        along dim 0: one pass each, ~10x faster on the CPU here than aminmax(dim=0). A model's
        outliers sit in the same few channels call after call (Bondarenko et al.): when this call's
        channels are the last call's, their index and columns are reused as they are."""
        past = torch.gt(flat.amax(0), self.outlier_threshold)  # (in,)
        if self.input_floor is None or self.input_floor < -self.outlier_threshold:
            past |= flat.amin(0) < -self.outlier_threshold
        last = self._last
        if last is not None and torch.equal(past, last[0]):
            return last[1], last[2]
        outliers = torch.nonzero(past).flatten()  # (k,)
        if not len(outliers):
            return None
        self._last = (past, outliers, self._outlier_columns(outliers))
        return self._last[1:]

    def _outlier_columns(self, outliers: torch.Tensor) -> torch.Tensor:
        """(out, k): the int8 weights' columns of these channels in fp32, made once per set of channels."""
        key = tuple(outliers.tolist())
        columns = self._columns.get(key)
        if columns is None:
            if len(self._columns) >= 64:  # a bound, should the sets keep changing
                self._columns.clear()
            columns = self._columns[key] = self._int_weight[:, outliers].float() * self._weight_scale
        return columns

    def extra_repr(self) -> str:
        outliers = "" if self.outlier_threshold is None else f", fp32 channels past {self.outlier_threshold}"
        seven = ", 7-bit per token" if self._seven is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{outliers}{seven}"


def _onednn_pack(qweight: torch.Tensor, bias: torch.Tensor | None):
    """The int8 weights prepacked by torch's "onednn" quantisation engine, or None where it has none."""
    engines = torch.backends.quantized.supported_engines
    if "onednn" not in engines:
        return None
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn"
    try:
        return torch.ops.quantized.linear_prepack(qweight, bias)
    finally:
        torch.backends.quantized.engine = previous


class Int8QKV(QKVProjection):
    """query, key and value of one attention layer as one `Int8Linear` on their concatenated
    (3H, H) weights: x is quantised once (its range is the same for all three) and one GEMM runs
    instead of three, with the same numbers as three separate Int8Linears (the weight scales are
    per output row, the int32 sums exact)."""

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, seven_bit: bool = False):
        super().__init__()
        layers = (query, key, value)
        fused = nn.Linear(query.in_features, sum(layer.out_features for layer in layers),
                          bias=query.bias is not None)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([layer.weight.detach().float() for layer in layers]))
            if fused.bias is not None:
                fused.bias.copy_(torch.cat([layer.bias.detach().float() for layer in layers]))
        self.projection = Int8Linear(fused, seven_bit=seven_bit)
        self.sizes = [layer.out_features for layer in layers]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(self.projection(x).split(self.sizes, -1))


def _tell_when_int8_buys_no_speed(seven_bit: bool) -> None:
    # fbgemm's 7-bit kernels without VNNI; bertkit's 7-bit op there ran 1.4-1.6x fp32 (docs/speed.md)
    if not cpu_features().vnni and not seven_bit:
        log.info(NO_VNNI_NOTE)


def seven_bit_default() -> bool:
    """Whether the inference engine's int8 runs on bertkit's 7-bit op (`quantize_int8(seven_bit=True)`):
    on CPUs of the avx2 class without VNNI whose AVX2 ops build (kernels/graph_gemm.py). There fbgemm's int8 is
    7-bit too, but per tensor with the outlier split; per token it was closer to fp32 (fine-tuned
    all-MiniLM-L6-v2, SST-2 dev in batches: -0.57 points per tensor, -0.11 per token) and faster
    (docs/speed.md, "On an AMD EPYC Zen 3")."""
    features = cpu_features()  # the avx2 class, where it was measured (an AVX-512 CPU without VNNI was not)
    return features.cpu_class == "avx2" and not features.vnni and not features.amx and graph_gemm.eager_seven()


def quantize_int8(model: nn.Module, seven_bit: bool = False) -> nn.Module:
    """Replace every Linear inside the model's encoder (`model.encoder` or `model.bert.encoder`)
    by its int8 dynamic-quantised copy, in place: query / key / value as one `Int8QKV`, the
    feed-forward output projections with their outlier channels in fp32; returns the model (in
    eval mode, CPU only). `seven_bit`: the Linears run bertkit's 7-bit per-token op instead (AVX2;
    `seven_bit_default`), no outlier split, the feed-forward intermediate Linears' weights at 7 bits
    (+-63 per output channel: the op's paired kernel, SEVEN_BIT_LEVELS)."""
    encoder = getattr(model, "encoder", None) or getattr(getattr(model, "bert", None), "encoder", None)
    if encoder is None:
        raise ValueError(f"{type(model).__name__} has no BERT encoder to quantise")
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 quantisation runs on the CPU only")
    if seven_bit and not graph_gemm.eager_seven():
        raise ValueError("seven_bit int8 needs bertkit's AVX2 int8 op: a CPU with AVX2 and without VNNI or AMX, "
                         "and a C++ compiler to build it")
    torch.backends.quantized.engine = _engine()
    _tell_when_int8_buys_no_speed(seven_bit)
    model.eval()
    # The feed-forward output projections (layer.output.dense, fed by the GELU) get the outlier split;
    # behind the exact GELU their input has a known floor.
    layers = getattr(encoder, "layer", ())
    ffn_outputs = {id(layer.output.dense) for layer in layers}
    gelu_fed = {id(layer.output.dense) for layer in layers if getattr(layer.intermediate, "act", None) is F.gelu}
    # With `seven_bit` the intermediate Linears (H -> 4H) hold 7-bit weights (SEVEN_BIT_LEVELS)
    seven_weights = {id(layer.intermediate.dense) for layer in layers} if seven_bit else set()
    # Query, key and value read the same input: one quantisation and one GEMM for the three.
    for attention in list(encoder.modules()):
        if all(isinstance(getattr(attention, name, None), nn.Linear) for name in ("query", "key", "value")):
            attention.query = Int8QKV(attention.query, attention.key, attention.value, seven_bit)
            attention.key, attention.value = ProjectedWithQuery(), ProjectedWithQuery()
    targets = [(parent, name, child) for parent in encoder.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child, OUTLIER_THRESHOLD if id(child) in ffn_outputs else None,
                                         GELU_FLOOR if id(child) in gelu_fed else None, seven_bit,
                                         SEVEN_BIT_LEVELS if id(child) in seven_weights else 127.0))
    return model


# ---------------------------------------------------------------- int8 in a compiled graph


class RowInt8Linear(nn.Module):
    """An `Int8Linear` as plain tensor ops, for a graph compiled ahead (inference/compiled.py): the
    same int8 weights (per output channel), x quantised per row (per token, symmetric int8) inside
    the graph, int32 accumulation by `torch._int_mm`. The packed fbgemm weights and the per-call
    outlier split of `Int8Linear` cannot be exported; this form can: in the compiled graph
    `_int_mm` is oneDNN's s8 x s8 -> s32 GEMM (VNNI, AMX) and inductor fuses the quantisation, the two
    scales and the bias into the loops around it. (Written with `.to(torch.float32)`, which torch.export
    records with a metadata check, inductor's pattern for oneDNN's prepacked `qlinear_pointwise` does
    not fire; made to fire, it measured 0.82-1.00x this speed: docs/speed.md.) A scale per token rather than per
    tensor keeps one token's large channel (Bondarenko et al.) from coarsening every other token's
    values, which is what the outlier split is for in the eager path. Needs VNNI: without it oneDNN's
    int8 pair sums can saturate at int16 (the eager path's 7-bit `reduce_range` is fbgemm's)."""

    def __init__(self, layer: Int8Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        qweight, bias = torch.ops.quantized.linear_unpack(layer._packed)
        # (in, out) as a transposed view of the (out, in) rows: oneDNN's s8 GEMM reads it 3-17% faster
        # than the same values laid out (in, out) (40 rows, the encoder's shapes)
        self.register_buffer("weight", qweight.int_repr().t())
        self.register_buffer("weight_scale", qweight.q_per_channel_scales().float())  # (out,)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        # a feed-forward intermediate whose GELU the next projection (GeluRowInt8Linear) takes: under the
        # 7-bit op this layer's op applies it instead, on the op's own threads (int8_for_graph)
        self.gelu_follows = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        flat = x.reshape(-1, self.in_features)
        if graph_gemm.is_recording_seven():  # AVX2 without VNNI: the op quantises each row itself, to 7 bits
            return self.seven(flat, gelu=self.gelu_follows).reshape(*x.shape[:-1], self.out_features)
        row_scale = flat.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127.0  # (N, 1); a zero row stays zero
        return self.project(flat, row_scale).reshape(*x.shape[:-1], self.out_features)

    def project(self, flat: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
        """(N, in) values and their (N, 1) scales -> (N, out)."""
        # times the row's reciprocal, not divided by its scale: one division per row, not per value
        # (inductor kept a vector division per value: 2-3% of the MiniLM int8 graph)
        quantised = torch.round(flat * (1.0 / row_scale)).to(torch.int8)
        if graph_gemm.is_recording_int8():  # bertkit's AMX GEMM, the scales and bias applied as it writes
            return graph_gemm.graph_int8_linear(quantised, row_scale, self.weight, self.weight_scale, self.bias)
        # int32 -> fp32, times the row scale, times the weight scale, plus bias: one fused loop after the GEMM
        y = torch._int_mm(quantised, self.weight).to(torch.float32) * row_scale * self.weight_scale
        return y if self.bias is None else y + self.bias

    def seven(self, flat: torch.Tensor, gelu: bool = False) -> torch.Tensor:
        """(N, in) fp32 -> (N, out) through bertkit's 7-bit op (kernels/graph_gemm.py): each row
        quantised to unsigned 7-bit values over its own range, the same int8 weights (7-bit ones,
        +-63, `quantize_int8(seven_bit=True)`'s intermediate Linears, take its paired kernel); the
        exact GELU of each output with `gelu`."""
        return graph_gemm.graph_int8_linear_seven(flat, self.weight, self.weight_scale, self.bias, gelu)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per token"


class GeluRowInt8Linear(RowInt8Linear):
    """`RowInt8Linear` of GELU(h), given h: the feed-forward output projection of a compiled graph,
    with the intermediate's exact GELU moved in. The row scale comes from h's row maximum m, an upper
    bound of the row's largest |GELU| (GELU(x) < x for x > 0, and its negative values lie above -0.17),
    so no GELU is computed for it; taken from the GELU's output, inductor computed the GELU twice
    (once for the scale, once to quantise). The bound is looser than the exact maximum by 1 / Phi(m):
    0.1% at m = 3, 0.8% at 2.4, 9% at 1.4. all-MiniLM-L6-v2's feed-forward rows on MRPC and SST-2
    text have maxima of 0.5-25, median 2.4; its fine-tuned dev accuracy held (docs/speed.md). Under
    the 7-bit op (AVX2 without VNNI) the intermediate's op applies the GELU as it stores its outputs,
    on the op's threads, and this layer's op quantises them on their exact range."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (..., in) pre-activations -> (..., out)
        flat = h.reshape(-1, self.in_features)
        if graph_gemm.is_recording_seven():  # h is already GELU(h): the intermediate's op applied it (gelu_follows)
            return self.seven(flat).reshape(*h.shape[:-1], self.out_features)
        row_scale = flat.amax(1, keepdim=True).clamp(min=-GELU_FLOOR) / 127.0
        return self.project(F.gelu(flat), row_scale).reshape(*h.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", GELU of its input"


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class RowInt8QKV(QKVProjection):
    """An `Int8QKV` for a compiled graph: one `RowInt8Linear` over the concatenated weights."""

    def __init__(self, layer: Int8QKV):
        super().__init__()
        self.projection = RowInt8Linear(layer.projection)
        self.sizes = list(layer.sizes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(self.projection(x).split(self.sizes, -1))


def int8_for_graph(model: nn.Module) -> nn.Module:
    """A copy of a `quantize_int8` model whose int8 layers are `RowInt8Linear` / `RowInt8QKV` (the
    same int8 weights), for torch.export; the fbgemm layers are not copied. Raises ValueError for a
    model with no int8 layer."""
    import copy

    swaps = {}
    fused = {id(m.projection) for m in model.modules() if isinstance(m, Int8QKV)}  # copied with their Int8QKV
    # feed-forward blocks whose int8 output projection reads the exact GELU of an int8 intermediate Linear
    gelu_blocks = [m for m in model.modules()
                   if isinstance(getattr(m, "output", None), nn.Module) and isinstance(getattr(m.output, "dense", None), Int8Linear)
                   and isinstance(getattr(getattr(m, "intermediate", None), "dense", None), Int8Linear)
                   and getattr(m.intermediate, "act", None) is F.gelu]
    gelu_fed = {id(block.output.dense) for block in gelu_blocks}
    gelu_feeding = {id(block.intermediate.dense) for block in gelu_blocks}
    for module in model.modules():
        if isinstance(module, Int8QKV):
            swaps[id(module)] = RowInt8QKV(module)
        elif isinstance(module, Int8Linear) and id(module) not in fused:
            swaps[id(module)] = (GeluRowInt8Linear if id(module) in gelu_fed else RowInt8Linear)(module)
            swaps[id(module)].gelu_follows = id(module) in gelu_feeding
    if not swaps:
        raise ValueError(f"{type(model).__name__} has no int8 layer (quantize_int8 makes them)")
    graph_model = copy.deepcopy(model, memo=dict(swaps)).eval()
    for block in [m for m in graph_model.modules() if isinstance(getattr(getattr(m, "output", None), "dense", None),
                                                                 GeluRowInt8Linear)]:
        block.intermediate.act = _identity  # the GELU is computed by the output projection
    return graph_model
