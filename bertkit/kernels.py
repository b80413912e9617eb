"""Speed options for the model, as run-time configuration (the model code reads the same either way).

* ``onednn_linear``: fp32 Linear layers on the CPU, forward and backward, through oneDNN. torch's
  default fp32 GEMM (MKL) takes an AVX2 path on AMD CPUs: on Zen 5 oneDNN's AVX-512 kernels
  reach ~2x its rate (PERF-NOTES), on Zen 4 (AVX-512 at half width) ~1.1x. bf16 (autocast)
  matmuls already go through oneDNN; in inference "always" calls it directly (see `linear`).
  "always" (the default) in training and inference, "training" only where gradients are
  computed (inference then matches transformers, which uses MKL, more closely), "never".
  oneDNN sums in another order than MKL; both are fp32-accurate (relative error vs fp64 ~4e-7
  against ~2.5e-7 per GEMM), and fp32 inference outputs differ from transformers' by ~2e-6 of
  the output's scale instead of ~1e-6: the parity tests (1e-5 of the scale) hold either way.
  In inference it bought 1.04-1.07x in fp32, ~1.03x in bf16.
* ``fused_gelu``: in inference through oneDNN (bf16 autocast, fp32 with onednn_linear="always"),
  the feed-forward's exact GELU runs as a post-op of its first GEMM (see `linear_gelu`).
* ``fused_qkv``: one (3H x H) projection for query, key and value (weights concatenated at
  forward time; the checkpoint keeps the three).
* ``attention``: "auto" writes attention out (softmax(q k^T / sqrt(D) + mask) v) where torch's
  SDPA is slow on the CPU: in training with dropout (SDPA then takes its unfused math path)
  and in bf16 training (its fused bf16 backward took twice as long as the plain matmuls here).
  Elsewhere, and always with "sdpa", SDPA.
* ``fast_dropout``: CPU dropout masks from half as many random draws as `bernoulli_` (two
  15-bit uniforms per 31-bit draw of torch's generator); the rate p is rounded to 1/32768.
* ``unpad``: in a padded batch, run the token-wise work (projections, feed-forward, LayerNorm,
  dropout) on the real tokens only. "auto" does so when it saves at least
  ``unpad_min_saved_tokens`` tokens: below that the gathers and the extra kernel calls cost
  about what they save (measured break-even ~50 tokens at mini and base width, ~150 for tiny).
  Outputs at padding positions then carry no values (zeros, or whatever the few padding rows
  used to round the token count computed): nothing reads them, but a caller that compares whole
  padded tensors must compare the real positions only.
* ``packed_attention``: with unpadding, attention runs on the packed tokens, sequence by
  sequence (block-diagonal attention, no mask; `packed_attention`), instead of re-padding
  query, key and value to (B, T) in every layer. Variable-length inference (lengths 16-128)
  1.15-1.3x faster, fine-tuning steps on such batches 0.98-1.1x.

* ``grouped_attention``: packed attention in bf16 inference (no gradients, no dropout, not causal)
  runs on groups of sequences of similar length (`attention_groups`): one written-out attention
  (bf16 batched matmuls, key-padding bias, softmax) per group instead of one SDPA call per
  sequence. torch's CPU SDPA reaches ~30 GFLOP/s on such short bf16 sequences; the groups
  1.2-1.3x that at mini width (lengths 16-128), the whole bf16 mini forward ~1.05x. Key
  lengths are rounded up to a multiple of 16 (masked): bf16 softmax rows of other lengths took
  twice as long. Scores are rounded to bf16 before the softmax, as transformers' eager
  attention under autocast does. fp32 keeps per-sequence SDPA (grouped fp32 SDPA measured
  0.9-0.97x, written-out fp32 0.7x: fp32 batched matmuls take MKL's slower path).
* ``fused_residual``: in fp32 inference through oneDNN, the residual sum of the attention and
  feed-forward outputs runs as a post-op of their output GEMM (`linear_add`): the same fp32
  sums (bit-identical here), one pass less over (N, H). Measured per GEMM: 1.04-1.10x at base
  width, ~1.0x at mini width; the fp32 forward ~1.0x at mini.

Set them for a block with ``with speed_options(unpad="never"): ...``, or for a process with the
environment variable ``BERTKIT_SPEED_OPTIONS="onednn_linear=never,unpad=never"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .errors import BertkitError

UNPAD_MODES = ("auto", "always", "never")
ONEDNN_MODES = ("training", "always", "never")
ATTENTION_MODES = ("auto", "sdpa", "explicit")


@dataclasses.dataclass
class SpeedOptions:
    onednn_linear: str = "always"
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
    grouped_attention: bool = True
    fused_residual: bool = True


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


# ---------------------------------------------------------------- fp32 Linear through oneDNN


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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, with fp32 CPU matmuls through oneDNN as `options.onednn_linear` says.

    Under bf16 autocast in inference ("always"), oneDNN's matmul is called directly on the bf16
    operands autocast would make: ~7% faster than F.linear's addmm route to the same library.
    """
    mode = options.onednn_linear
    if mode == "never" or x.device.type != "cpu" or x.numel() == 0 or not onednn_available():
        return F.linear(x, weight, bias)
    if torch.is_autocast_enabled("cpu"):
        if mode == "always" and not torch.is_grad_enabled() and torch.get_autocast_dtype("cpu") == torch.bfloat16:
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
    """gelu(x @ weight.T + bias), exact (erf) GELU. In inference through oneDNN (bf16 autocast, or
    fp32 with `onednn_linear="always"`; no gradients) the GELU runs as the GEMM's post-op
    (`options.fused_gelu`): one pass less over the (..., 4H) activations. Measured: GEMM + GELU
    ~14% faster at mini width in bf16, 3-5% at base width."""
    if options.fused_gelu and x.device.type == "cpu" and x.numel() and not torch.is_grad_enabled() \
            and onednn_available():
        if torch.is_autocast_enabled("cpu"):
            if torch.get_autocast_dtype("cpu") == torch.bfloat16:
                # What autocast does for F.linear (bf16 operands, fp32 accumulation), with the GELU
                # applied to the fp32 sums before rounding to bf16 rather than after.
                return torch.ops.mkldnn._linear_pointwise(
                    x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16(), "gelu", [], "none")
        elif options.onednn_linear == "always" and x.dtype == weight.dtype == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], "none")
    return F.gelu(linear(x, weight, bias))


def linear_add(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor) -> torch.Tensor:
    """x @ weight.T + bias + residual. In fp32 inference through oneDNN (`onednn_linear="always"`, no
    gradients, `options.fused_residual`) the sum is the GEMM's binary post-op, in fp32 as well."""
    if options.fused_residual and options.onednn_linear == "always" and x.device.type == "cpu" and x.numel() \
            and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu") and onednn_available() \
            and x.dtype == weight.dtype == residual.dtype == torch.float32 and residual.is_contiguous() \
            and residual.shape == (*x.shape[:-1], weight.shape[0]):
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")
    return linear(x, weight, bias) + residual


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) computed by `linear` above."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)


# ---------------------------------------------------------------- dropout and attention


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
    def forward(self, x):
        return dropout(x, self.p, self.training)


def _explicit_attention_pays(q: torch.Tensor, dropout_p: float) -> bool:
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


# ---------------------------------------------------------------- unpadding


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
        self._attention_groups = None

    def attention_groups(self) -> "AttentionGroups":
        """The length groups for `grouped_attention`, built once per batch (all layers share them)."""
        if self._attention_groups is None:
            self._attention_groups = AttentionGroups(self.lengths, self.tokens, self.index.device)
        return self._attention_groups

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)"""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at the positions left out."""
        full = x.new_zeros(self.batch * self.length, *x.shape[1:])
        return full.index_copy(0, self.index, x).view(self.batch, self.length, *x.shape[1:])


def packed_attention(qkv: torch.Tensor, lengths: list[int], heads: int, dropout_p: float = 0.0,
                     is_causal: bool = False) -> torch.Tensor:
    """Attention on packed tokens: (N, 3H) query | key | value rows, sequence after sequence
    (`lengths` rows each, then rows belonging to none) -> (N, H) context, zeros for those last rows.

    Each sequence attends within itself (block-diagonal attention) without a mask and without
    re-padding: per-sequence work is sum(L^2) instead of B * T^2, and the unmasked kernels are
    the fast ones. Differentiable (slices and `attention`).
    """
    N, width = qkv.shape
    H = width // 3
    parts, start = [], 0
    for L in lengths:
        if L == 0:
            continue
        q, k, v = qkv[start:start + L].view(1, L, 3, heads, H // heads).permute(2, 0, 3, 1, 4)  # 3 x (1, A, L, D)
        ctx = attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)  # (1, A, L, D)
        parts.append(ctx.transpose(1, 2).reshape(L, H))
        start += L
    if start < N:
        parts.append(qkv.new_zeros(N - start, H))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


class AttentionGroups:
    """Sequences of a packed batch grouped by length for `grouped_attention`.

    Sequences sorted by length (longest first) are cut into groups whose padded size (count x
    longest, keys rounded up to `key_multiple`) wastes at most `waste` of the group's real
    tokens. `index` gathers each group's rows from the packed rows, group after group, each
    sequence padded to its group's length with copies of its first row (masked as keys,
    dropped as queries); `inverse` takes the packed rows back, the rows belonging to no
    sequence from an extra zero row at the end.
    """

    def __init__(self, lengths: list[int], rows: int, device=None, waste: float = 0.1, key_multiple: int = 16):
        starts, offset = [], 0
        for L in lengths:
            starts.append(offset)
            offset += L
        order = sorted((i for i, L in enumerate(lengths) if L > 0), key=lambda i: -lengths[i])
        groups, current, real = [], [], 0
        for i in order:
            if current and (len(current) + 1) * lengths[current[0]] > (real + lengths[i]) * (1 + waste):
                groups.append(current)
                current, real = [], 0
            current.append(i)
            real += lengths[i]
        if current:
            groups.append(current)
        index, inverse, self.groups, offset = [], [0] * rows, [], 0
        for members in groups:
            width = -(-lengths[members[0]] // key_multiple) * key_multiple
            for row, i in enumerate(members):
                L, start = lengths[i], starts[i]
                index.extend(range(start, start + L))
                index.extend([start] * (width - L))
                base = offset + row * width
                inverse[start:start + L] = range(base, base + L)
            masked = [lengths[i] for i in members if lengths[i] < width]
            key_lengths = torch.tensor([lengths[i] for i in members], device=device) if masked else None
            self.groups.append((offset, len(members), width, key_lengths))
            offset += len(members) * width
        self.padded_rows = offset
        real_rows = sum(lengths)
        inverse[real_rows:] = [offset] * (rows - real_rows)  # rows of no sequence: the extra zero row
        self.index = torch.tensor(index, dtype=torch.long, device=device)
        self.inverse = torch.tensor(inverse, dtype=torch.long, device=device)
        self._biases = {}

    def key_bias(self, group: int, heads: int, dtype) -> torch.Tensor | None:
        """(G * A, 1, width) additive bias, -inf at padded keys; None when the group has none."""
        offset, count, width, key_lengths = self.groups[group]
        if key_lengths is None:
            return None
        key = (group, heads, dtype)
        if key not in self._biases:
            padded = torch.arange(width, device=key_lengths.device)[None, :] >= key_lengths[:, None]  # (G, width)
            bias = torch.zeros(count, width, dtype=dtype, device=key_lengths.device).masked_fill_(padded, float("-inf"))
            self._biases[key] = bias[:, None, None, :].expand(count, heads, 1, width).reshape(count * heads, 1, width)
        return self._biases[key]


def grouped_attention(qkv: torch.Tensor, groups: AttentionGroups, heads: int) -> torch.Tensor:
    """`packed_attention` without dropout or causal mask, computed per group of similar lengths:
    (N, 3H) packed query | key | value rows -> (N, H), zeros for rows of no sequence. Runs in
    qkv's dtype (bf16 here); not for autograd (in-place scaling)."""
    N, width = qkv.shape
    H = width // 3
    D = H // heads
    with torch.autocast(qkv.device.type, enabled=False):  # bf16 throughout; autocast would run softmax in fp32
        rows = qkv.index_select(0, groups.index)  # (P, 3H), group after group
        rows[:, :H].mul_(D ** -0.5)  # the scale on q, as `attention`
        out = qkv.new_empty(groups.padded_rows + 1, H)
        out[-1].zero_()
        for number, (offset, count, length, _) in enumerate(groups.groups):
            block = rows[offset:offset + count * length].view(count, length, 3, heads, D)
            q, k, v = (block[:, :, part].transpose(1, 2).reshape(count * heads, length, D) for part in range(3))
            bias = groups.key_bias(number, heads, qkv.dtype)
            scores = torch.bmm(q, k.transpose(1, 2)) if bias is None else torch.baddbmm(bias, q, k.transpose(1, 2))
            probs = torch._softmax(scores, -1, False)
            ctx = torch.bmm(probs, v).view(count, heads, length, D).transpose(1, 2)  # (G, L, A, D)
            out[offset:offset + count * length].view(count, length, heads, D).copy_(ctx)
        return out.index_select(0, groups.inverse)


def grouped_attention_pays(qkv: torch.Tensor, dropout_p: float, is_causal: bool) -> bool:
    return (options.grouped_attention and qkv.device.type == "cpu" and qkv.dtype == torch.bfloat16
            and dropout_p == 0.0 and not is_causal and not (torch.is_grad_enabled() and qkv.requires_grad))


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


__all__ = ["SpeedOptions", "options", "speed_options", "linear", "linear_gelu", "Linear", "keep_mask", "dropout", "Dropout",
           "attention", "packed_attention", "grouped_attention",
           "grouped_attention_pays", "AttentionGroups", "linear_add", "Unpadded", "unpadding_for", "onednn_available"]
