"""Linear layers on the CPU: fp32 through oneDNN where it pays, bf16 straight to oneDNN where the
CPU has bf16, the exact GELU as a GEMM post-op in inference, query / key / value as one GEMM."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .graph_gemm import graph_linear, graph_linear_bf16, graph_linear_gelu, is_recording, is_recording_bf16
from .options import PROCESS_DEFAULT, HoldsKernelOptions, KernelOptions, exporting
from .packed import bf16_autocast_inference as _bf16_autocast_inference
from .packed import packed_linear, packing_applies


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


def _onednn_applies(x: torch.Tensor, mode: str) -> bool:
    return not exporting() and mode != "never" and x.device.type == "cpu" and x.numel() > 0 and onednn_available()


def _onednn_in_inference(mode: str) -> bool:
    """oneDNN runs the Linear layers of no-grad passes ("always" and "inference")."""
    return mode in ("always", "inference")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           options: KernelOptions = PROCESS_DEFAULT) -> torch.Tensor:
    """F.linear, with fp32 CPU matmuls through oneDNN as `options.onednn_linear` says.

    "always": forward and backward; "training": only where gradients are computed; "inference":
    only where they are not. Under bf16 autocast in inference ("always" / "inference", a CPU with
    bf16), oneDNN's matmul is called directly on the bf16 operands autocast would make: ~7% faster
    than F.linear's addmm route.
    """
    mode = options.onednn_linear
    if is_recording_bf16() and exporting() and torch.is_autocast_enabled("cpu"):  # the bf16 graph's op (graph_gemm.py)
        return graph_linear_bf16(x, weight, bias)
    if not _onednn_applies(x, mode):
        if is_recording() and exporting() and x.dtype == weight.dtype == torch.float32 \
                and not torch.is_autocast_enabled("cpu"):  # a graph compiled ahead with MKL's GEMM (graph_gemm.py)
            return graph_linear(x, weight, bias)
        return F.linear(x, weight, bias)
    if torch.is_autocast_enabled("cpu"):
        if _onednn_in_inference(mode) and _bf16_autocast_inference(x):
            return _onednn_matmul(x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16())
        return F.linear(x, weight, bias)
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return F.linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if needs_grad:
        return _OneDNNLinear.apply(x, weight, bias) if mode in ("always", "training") else F.linear(x, weight, bias)
    if _onednn_in_inference(mode):
        return _onednn_matmul(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                options: KernelOptions = PROCESS_DEFAULT) -> torch.Tensor:
    """gelu(x @ weight.T + bias), exact (erf) GELU. In inference through oneDNN (bf16 autocast on a
    CPU with bf16, or fp32 with `onednn_linear` "always" or "inference") the GELU runs as the GEMM's post-op
    (`options.fused_gelu`): one pass less over the (..., 4H) activations."""
    if is_recording() and exporting() and x.dtype == weight.dtype == torch.float32 \
            and not torch.is_autocast_enabled("cpu"):  # a graph compiled ahead: its GEMM op's own GELU where it has one
        return graph_linear_gelu(x, weight, bias)
    if is_recording_bf16() and exporting() and torch.is_autocast_enabled("cpu"):
        return graph_linear_bf16(x, weight, bias, gelu=True)
    if not exporting() and options.fused_gelu and not torch.is_grad_enabled() and x.device.type == "cpu" \
            and x.numel() and onednn_available():
        if torch.is_autocast_enabled("cpu"):
            if _bf16_autocast_inference(x):
                # What autocast does for F.linear (bf16 operands, fp32 accumulation), with the GELU
                # applied to the fp32 sums before rounding to bf16 rather than after.
                return torch.ops.mkldnn._linear_pointwise(
                    x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16(), "gelu", [], "none")
        elif _onednn_in_inference(options.onednn_linear) and x.dtype == weight.dtype == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], "none")
    return F.gelu(linear(x, weight, bias, options))


class Linear(HoldsKernelOptions, nn.Linear):
    """nn.Linear (same parameters and names) computed by `linear` above with the options it holds
    (in fp32 inference with `packed_weights`, from its weight packed once: kernels/packed.py)."""

    def forward(self, x):
        if packing_applies(x, self.kernels):
            return packed_linear(self, x, (self.weight,), (self.bias,), self.kernels)
        return linear(x, self.weight, self.bias, self.kernels)


def linear_act(layer: nn.Module, act, x: torch.Tensor) -> torch.Tensor:
    """act(layer(x)). For a bertkit Linear followed by the exact GELU, `linear_gelu` (one fused
    GEMM in inference); an int8 Linear, its `forward_gelu`; any other layer (an adapter) runs as it is."""
    if act is F.gelu and type(layer) is Linear:
        if packing_applies(x, layer.kernels):
            return packed_linear(layer, x, (layer.weight,), (layer.bias,), layer.kernels, gelu=True)
        return linear_gelu(x, layer.weight, layer.bias, layer.kernels)
    if act is F.gelu and hasattr(layer, "forward_gelu"):  # an int8 Linear whose op applies the GELU (kernels/int8.py)
        return layer.forward_gelu(x)
    return act(layer(x))


class QKVProjection(nn.Module):
    """A module standing in for query, key and value together (e.g. the int8 projection, which
    quantises x once for all three): set as `query`, it returns the three; `key` and `value` then
    hold a `ProjectedWithQuery`."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class ProjectedWithQuery(nn.Module):
    """The key or value slot of a `QKVProjection`: computed by the query module, never alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this projection is computed together with query (project_qkv)")


def project_qkv(x: torch.Tensor, query: nn.Module, key: nn.Module, value: nn.Module,
                options: KernelOptions = PROCESS_DEFAULT):
    """(query(x), key(x), value(x)), each (..., H). With `options.fused_qkv` (and three bertkit
    Linear layers) one GEMM on the concatenated (3H, H) weights, returned as three views; the
    checkpoint keeps query / key / value. A `QKVProjection` in the query slot computes all three."""
    if isinstance(query, QKVProjection):
        return query(x)
    layers = (query, key, value)
    if options.fused_qkv and all(type(layer) is Linear for layer in layers):
        if packing_applies(x, options):  # the (3H, H) pack is held by the query layer
            return packed_linear(query, x, tuple(layer.weight for layer in layers),
                                 tuple(layer.bias for layer in layers), options).chunk(3, -1)
        weight = torch.cat([layer.weight for layer in layers])  # (3H, H)
        bias = torch.cat([layer.bias for layer in layers])
        return linear(x, weight, bias, options).chunk(3, -1)  # (..., 3H) -> 3 x (..., H)
    return query(x), key(x), value(x)
