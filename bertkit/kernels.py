"""How the model computes: the fast paths behind model.py's one seam, and the speed options.

model.py says what BERT computes; this module supplies, through three things chosen once,

* a `Layout` (`layout_for`, called once per forward by BertModel): the batch as padded (B, T)
  rows with a key mask (`Padded`), or only its real tokens packed (N, H) row after row
  (`Packed`); the layout also runs attention (`Layout.attention`: SDPA, the written-out
  formula, or per-sequence attention on the packed rows);
* `Linear` (an nn.Linear whose fp32 CPU matmuls go through oneDNN where that pays),
  `project_qkv` (query, key and value as one GEMM) and `linear_act` (the exact GELU as the
  GEMM's post-op in inference);
* `Dropout` (an nn.Dropout drawing CPU masks from half as many random numbers).

The options, with what each was measured to buy, are in docs/speed.md. Set them for a block
with ``with speed_options(unpad="never"): ...`` or for a process with the environment variable
``BERTKIT_SPEED_OPTIONS="onednn_linear=never,unpad=never"``. Whatever they say, a traced or
exported model (torch.jit.trace, torch.onnx.export) runs the plain path: F.linear and SDPA on
the padded batch with its mask, so one trace serves every padding pattern.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .device import cpu_features
from .errors import BertkitError

log = logging.getLogger("bertkit")

UNPAD_MODES = ("auto", "always", "never")
ONEDNN_MODES = ("training", "always", "never")
ATTENTION_MODES = ("auto", "sdpa", "explicit")
# Options removed after measuring ~1.0x (fused_residual) and ~1.05x (grouped_attention) end to
# end: still accepted, and ignored, until the next release.
REMOVED_OPTIONS = ("fused_residual", "grouped_attention")


def default_onednn_linear() -> str:
    """oneDNN's fp32 Linear where the CPU has AVX-512, torch's own (MKL) elsewhere.

    On AVX-512 (Zen 5) oneDNN's kernels ran the fp32 GEMMs ~2x faster than MKL's AVX2 path; on
    an AVX2-only CPU (Zen 3) the oneDNN Linear made the BERT-BASE training step slower (1.00x
    of transformers' speed with it, 1.23x without). See docs/speed.md.
    """
    return "always" if cpu_features().avx512 else "never"


@dataclasses.dataclass
class SpeedOptions:
    onednn_linear: str = dataclasses.field(default_factory=default_onednn_linear)
    fused_qkv: bool = True
    attention: str = "auto"
    fast_dropout: bool = True
    unpad: str = "auto"
    unpad_min_saved_tokens: int = 128
    # The unpadded token count is rounded up to a multiple of this (with a few padding rows), so
    # that varying batches reuse a few GEMM shapes: oneDNN generates code for every new shape.
    unpad_multiple: int = 64
    packed_attention: bool = True
    fused_gelu: bool = True


def _from_environment() -> SpeedOptions:
    options = SpeedOptions()
    text = os.environ.get("BERTKIT_SPEED_OPTIONS", "").strip()
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        _set(options, name.strip(), value.strip(), source="BERTKIT_SPEED_OPTIONS")
    return options


def _set(options: SpeedOptions, name: str, value, source: str | None = None) -> None:
    fields = {f.name: f.type for f in dataclasses.fields(SpeedOptions)}
    where = f" (in {source})" if source else ""
    if name in REMOVED_OPTIONS:
        log.warning("speed option %s%s was removed (it bought ~1.0x); it is ignored", name, where)
        return
    if name not in fields:
        raise BertkitError(f"unknown speed option {name!r}{where}; choose from {', '.join(fields)}")
    if isinstance(value, str):
        if fields[name] == "bool":
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise BertkitError(f"speed option {name} must be 0 or 1, not {value!r}{where}")
            value = value.lower() in ("1", "true", "yes", "on")
        elif fields[name] == "int":
            try:
                value = int(value)
            except ValueError:
                raise BertkitError(f"speed option {name} must be an integer, not {value!r}{where}") from None
    for option, modes in (("unpad", UNPAD_MODES), ("onednn_linear", ONEDNN_MODES), ("attention", ATTENTION_MODES)):
        if name == option and value not in modes:
            raise BertkitError(f"speed option {option} must be one of {', '.join(modes)}, not {value!r}{where}")
    setattr(options, name, value)


options = _from_environment()


@contextlib.contextmanager
def speed_options(**changes):
    """Change speed options inside a block: `with speed_options(onednn_linear="never"): ...`."""
    saved = dataclasses.replace(options)
    try:
        for name, value in changes.items():
            _set(options, name, value)
        yield options
    finally:
        for field in dataclasses.fields(SpeedOptions):
            setattr(options, field.name, getattr(saved, field.name))


def exporting() -> bool:
    """True while the model is recorded rather than run: torch.jit.trace (and the TorchScript ONNX
    exporter), torch.export / torch.onnx.export(dynamo=True) and torch.compile. The plain path
    then runs. (torch.onnx.is_in_onnx_export would say it too, at ~10x the cost per call.)"""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


# ---------------------------------------------------------------- Linear through oneDNN


@functools.cache
def onednn_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def _onednn_matmul(x, weight, bias=None):
    """x @ weight.T + bias for (..., in) x (out, in); strided (e.g. transposed) operands are fine."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_matmul(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        rows = grad.reshape(-1, grad.shape[-1])  # (M, out)
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_matmul(grad, weight.t())  # (..., out) @ (out, in)
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_gradient(rows, x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(0)
        return grad_x, grad_weight, grad_bias


def _weight_gradient(grad_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
    """grad_rows.T @ x_rows: (M, out), (M, in) -> (out, in).

    The contraction runs over the rows of both, so one operand must be transposed; oneDNN takes
    the second ("weight") operand in any layout but copies a transposed first one. Either copy
    grad.T (M x out elements), or x.T (M x in) and then the transposed result (in x out) into
    the parameter's layout: take the smaller (for the MLM decoder, with out = 30522, the second).
    """
    M, out = grad_rows.shape
    inputs = x_rows.shape[1]
    if M * out <= M * inputs + inputs * out:
        return _onednn_matmul(grad_rows.t(), x_rows.t())  # (out, M) @ (M, in)
    return _onednn_matmul(x_rows.t(), grad_rows.t()).t().contiguous()  # ((in, M) @ (M, out)).T


def _onednn_applies(x: torch.Tensor) -> bool:
    return (not exporting() and options.onednn_linear != "never" and x.device.type == "cpu" and x.numel() > 0
            and onednn_available())


def _bf16_autocast_inference(x: torch.Tensor) -> bool:
    """Inference under CPU bf16 autocast on a CPU with native bf16 dot products. Elsewhere
    oneDNN has no bf16 inner product (on AVX2 it fails to create one): torch's own route then."""
    return (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and not torch.is_grad_enabled() and cpu_features().bf16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, with fp32 CPU matmuls through oneDNN as `options.onednn_linear` says.

    Under bf16 autocast in inference ("always", a CPU with bf16), oneDNN's matmul is called
    directly on the bf16 operands autocast would make: ~7% faster than F.linear's addmm route.
    """
    if not _onednn_applies(x):
        return F.linear(x, weight, bias)
    mode = options.onednn_linear
    if torch.is_autocast_enabled("cpu"):
        if mode == "always" and _bf16_autocast_inference(x):
            return _onednn_matmul(x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16())
        return F.linear(x, weight, bias)
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return F.linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if needs_grad:
        return _OneDNNLinear.apply(x, weight, bias)
    if mode == "always":
        return _onednn_matmul(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x @ weight.T + bias), exact (erf) GELU. In inference through oneDNN (bf16 autocast on a
    CPU with bf16, or fp32 with `onednn_linear="always"`) the GELU runs as the GEMM's post-op
    (`options.fused_gelu`): one pass less over the (..., 4H) activations."""
    if not exporting() and options.fused_gelu and not torch.is_grad_enabled() and x.device.type == "cpu" \
            and x.numel() and onednn_available():
        if torch.is_autocast_enabled("cpu"):
            if _bf16_autocast_inference(x):
                # What autocast does for F.linear (bf16 operands, fp32 accumulation), with the GELU
                # applied to the fp32 sums before rounding to bf16 rather than after.
                return torch.ops.mkldnn._linear_pointwise(
                    x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16(), "gelu", [], "none")
        elif options.onednn_linear == "always" and x.dtype == weight.dtype == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], "none")
    return F.gelu(linear(x, weight, bias))


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) computed by `linear` above."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)


def linear_act(layer: nn.Module, act, x: torch.Tensor) -> torch.Tensor:
    """act(layer(x)). For a bertkit Linear followed by the exact GELU, `linear_gelu` (one fused
    GEMM in inference); any other layer (an adapter, a quantised Linear) runs as it is."""
    if act is F.gelu and type(layer) is Linear:
        return linear_gelu(x, layer.weight, layer.bias)
    return act(layer(x))


def project_qkv(x: torch.Tensor, query: nn.Module, key: nn.Module, value: nn.Module):
    """(query(x), key(x), value(x)), each (..., H). With `options.fused_qkv` (and three bertkit
    Linear layers) one GEMM on the concatenated (3H, H) weights, returned as three views; the
    checkpoint keeps query / key / value."""
    layers = (query, key, value)
    if options.fused_qkv and all(type(layer) is Linear for layer in layers):
        weight = torch.cat([layer.weight for layer in layers])  # (3H, H)
        bias = torch.cat([layer.bias for layer in layers])
        return linear(x, weight, bias).chunk(3, -1)  # (..., 3H) -> 3 x (..., H)
    return query(x), key(x), value(x)


# ---------------------------------------------------------------- dropout


def keep_mask(shape, p: float, device=None) -> tuple[torch.Tensor, float]:
    """A bool mask keeping each element with probability 1 - p' (p' = p rounded to 1/32768), and
    the scale 1 / (1 - p'). Each int32 draw of torch's generator is uniform on [0, 2^31): its
    bits 0-14 and 16-30 are two independent 15-bit uniforms."""
    n = math.prod(shape)
    threshold = min(32768, max(0, round(p * 32768)))
    bits = torch.empty((n + 1) // 2, dtype=torch.int32, device=device).random_()
    keep = torch.empty((n + 1) // 2, 2, dtype=torch.bool, device=device)
    torch.ge(bits & 0x7FFF, threshold, out=keep[:, 0])
    torch.ge(bits >> 16, threshold, out=keep[:, 1])
    scale = 1.0 / (1.0 - threshold / 32768) if threshold < 32768 else 0.0
    return keep.view(-1)[:n].view(shape), scale


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        keep, scale = keep_mask(x.shape, p, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        # Scale, then zero in place with the bool mask: no float copy of the mask (x * keep makes one).
        return x.mul(scale).mul_(keep)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.mul(ctx.scale).mul_(keep), None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout, with `keep_mask` masks on the CPU when `options.fast_dropout` is on."""
    if not training or p == 0.0:
        return x
    if options.fast_dropout and x.device.type == "cpu" and 0.0 < p < 1.0:
        return _Dropout.apply(x, p)
    return F.dropout(x, p, training)


class Dropout(nn.Dropout):
    """nn.Dropout computed by `dropout` above; setting `p = 0` turns it off like any nn.Dropout."""

    def forward(self, x):
        return dropout(x, self.p, self.training)

    def active_rate(self) -> float:
        """The rate to apply now: p in training, 0 in eval."""
        return self.p if self.training else 0.0


# ---------------------------------------------------------------- attention


def _explicit_attention_pays(q: torch.Tensor, dropout_p: float) -> bool:
    """Written-out attention where torch's CPU SDPA is slow: training with dropout (SDPA then
    takes its unfused math path) and bf16 training (its fused bf16 backward took twice as long)."""
    if options.attention != "auto":
        return options.attention == "explicit"
    training = torch.is_grad_enabled() and q.requires_grad
    return q.device.type == "cpu" and training and (dropout_p > 0.0 or q.dtype == torch.bfloat16)


def attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False):
    """softmax(q k^T / sqrt(D) + mask) v for (B, A, T, D) inputs; attn_mask bool, True = may attend.

    torch's SDPA, or (see `options.attention`) the same formula written out; rows with nothing to
    attend to give zeros in both.
    """
    if not _explicit_attention_pays(q, dropout_p):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    T = q.shape[-2]
    # The scale on q (T x D) rather than on the scores (T x T): a smaller pass, exact for D = 64.
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, A, T, T)
    if is_causal:
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        attn_mask = causal if attn_mask is None else attn_mask & causal
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
        probs = torch.ops.aten._safe_softmax(scores, -1)  # a row with nothing to attend gives zeros
    else:
        probs = torch.softmax(scores, -1)  # every row has keys (a causal row at least itself)
    return dropout(probs, dropout_p) @ v  # (B, A, T, D)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], heads: int,
                     dropout_p: float = 0.0, is_causal: bool = False) -> torch.Tensor:
    """Attention on packed tokens: (N, H) query, key and value rows, sequence after sequence
    (`lengths` rows each, then rows belonging to none) -> (N, H) context, zeros for those last rows.

    Each sequence attends within itself (block-diagonal attention) without a mask and without
    re-padding: per-sequence work is sum(L^2) instead of B * T^2, and the unmasked kernels are
    the fast ones. Differentiable (slices and `attention`).
    """
    N, H = q.shape
    parts, start = [], 0
    for L in lengths:
        if L == 0:
            continue
        q_, k_, v_ = (t[start:start + L].view(1, L, heads, H // heads).transpose(1, 2) for t in (q, k, v))  # (1, A, L, D)
        ctx = attention(q_, k_, v_, dropout_p=dropout_p, is_causal=is_causal)  # (1, A, L, D)
        parts.append(ctx.transpose(1, 2).reshape(L, H))
        start += L
    if start < N:
        parts.append(q.new_zeros(N - start, H))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


# ---------------------------------------------------------------- layouts


class Padded:
    """The batch as it comes, (B, T, H) rows; attention masks the padding keys.

    mask: None (nothing to mask) or bool (B, 1, 1|T, T), True = may attend, causal part included;
    `causal` alone (no mask) lets SDPA take its fast causal path. `plain`: SDPA whatever the
    options say (while exporting).
    """

    def __init__(self, mask: torch.Tensor | None, causal: bool, plain: bool = False):
        self.mask = mask
        self.causal = causal
        self.plain = plain

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return x  # (B, T, H)

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        return x  # (B, T, H)

    def full_mask(self, T: int, device) -> torch.Tensor | None:
        """The whole mask, causal part included, for attention written out: None when nothing is masked."""
        if self.causal and self.mask is None:
            return torch.ones(T, T, dtype=torch.bool, device=device).tril()
        return self.mask

    def attention(self, q, k, v, heads: int, dropout_p: float) -> torch.Tensor:
        """(B, T, H) query, key, value -> (B, T, H) context."""
        B, T, H = q.shape
        q, k, v = (t.view(B, T, heads, H // heads).transpose(1, 2) for t in (q, k, v))  # (B, A, T, D)
        run = F.scaled_dot_product_attention if self.plain else attention
        ctx = run(q, k, v, attn_mask=self.mask, dropout_p=dropout_p, is_causal=self.causal and self.mask is None)  # (B, A, T, D)
        return ctx.transpose(1, 2).reshape(B, T, H)


class Unpadded:
    """Where the real tokens of a padded (B, T) batch sit: `unpad` gathers them, `pad` puts them back.

    Packed order: sequence 0's real tokens, then sequence 1's, ... (`lengths` tokens each), then
    the few padding positions that round the row count up to a multiple of `multiple`: those
    rows are computed like tokens, never attended to, and dropped again.
    """

    def __init__(self, attention_mask: torch.Tensor, multiple: int = 1):
        self.batch, self.length = attention_mask.shape
        real = attention_mask.reshape(-1) != 0
        index = real.nonzero().squeeze(1)
        self.lengths = (attention_mask != 0).sum(1).tolist()  # real tokens per sequence, in packed order
        extra = (-index.numel()) % max(1, multiple)
        if extra:
            index = torch.cat([index, (~real).nonzero().squeeze(1)[:extra]])
        self.index = index  # (N,) positions in the flattened (B*T) batch
        self.tokens = index.numel()

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)"""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at the positions left out."""
        full = x.new_zeros(self.batch * self.length, *x.shape[1:])
        return full.index_copy(0, self.index, x).view(self.batch, self.length, *x.shape[1:])


class Packed(Padded):
    """Only the real tokens, (N, H) rows sequence after sequence (`Unpadded`): the token-wise work
    (projections, feed-forward, LayerNorm, dropout) skips the padding. Attention runs on the
    packed rows sequence by sequence (`options.packed_attention`), or on them padded back."""

    def __init__(self, unpadded: Unpadded, mask: torch.Tensor, causal: bool):
        super().__init__(mask, causal)
        self.unpadded = unpadded
        self.per_sequence = options.packed_attention

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return self.unpadded.unpad(x)  # (B, T, H) -> (N, H)

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        return self.unpadded.pad(x)  # (N, H) -> (B, T, H), zeros at padding

    def attention(self, q, k, v, heads: int, dropout_p: float) -> torch.Tensor:
        """(N, H) query, key, value -> (N, H) context."""
        if self.per_sequence:
            return packed_attention(q, k, v, self.unpadded.lengths, heads, dropout_p, self.causal)
        padded = super().attention(*(self.unpadded.pad(t) for t in (q, k, v)), heads, dropout_p)
        return self.unpadded.unpad(padded)


def padding_mask(attention_mask: torch.Tensor | None, causal: bool, T: int, skip_if_full: bool = True):
    """(B, T) 1/0 padding mask -> bool (B, 1, 1|T, T) for SDPA, or None when nothing is masked
    (`skip_if_full`: a data-dependent check, left out when tracing so the mask is always built)."""
    if attention_mask is None or (skip_if_full and bool(attention_mask.all())):
        return None  # no padding: SDPA's unmasked (or is_causal) fast path
    mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): keys that may be attended
    if causal:
        mask = mask & torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()  # (B, 1, T, T)
    return mask


def layout_for(attention_mask: torch.Tensor | None, causal: bool, T: int) -> Padded:
    """The layout for this batch: packed when `options.unpad` says it pays, padded otherwise, and
    always padded (mask built unconditionally) while the model is being traced or exported."""
    if exporting():
        return Padded(padding_mask(attention_mask, causal, T, skip_if_full=False), causal, plain=True)
    mask = padding_mask(attention_mask, causal, T)
    unpadded = unpadding_for(attention_mask) if mask is not None else None
    return Padded(mask, causal) if unpadded is None else Packed(unpadded, mask, causal)


def unpadding_for(attention_mask: torch.Tensor | None) -> Unpadded | None:
    """An Unpadded for this batch when `options.unpad` says so, else None (run padded)."""
    if attention_mask is None or options.unpad == "never" or attention_mask.dim() != 2:
        return None
    padding = attention_mask.numel() - int(attention_mask.count_nonzero())
    if padding == 0:
        return None
    if options.unpad == "auto" and padding < options.unpad_min_saved_tokens:
        return None
    unpadded = Unpadded(attention_mask, options.unpad_multiple)
    return unpadded if unpadded.tokens < attention_mask.numel() else None


__all__ = ["SpeedOptions", "options", "speed_options", "exporting", "linear", "linear_gelu", "linear_act",
           "Linear", "project_qkv", "keep_mask", "dropout", "Dropout", "attention", "packed_attention",
           "Padded", "Packed", "Unpadded", "padding_mask", "layout_for", "unpadding_for", "onednn_available"]
