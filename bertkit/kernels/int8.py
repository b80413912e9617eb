"""Int8 inference: the encoder's Linear layers as dynamically quantised ones.

Weights become int8 once (per output channel, symmetric); activations are quantised per batch on
the fly (per tensor, asymmetric uint8) and the GEMMs accumulate in int32 (fbgemm, or oneDNN's
VNNI kernels where the CPU has them: torch's "x86" quantisation engine picks). This is the scheme
of ONNX Runtime's `quantize_dynamic` and of torch's `quantize_dynamic`, with the weight scales per
channel rather than per tensor (closer to fp32 at the same speed). The layout (unpadding, packed
attention), LayerNorm, softmax, the embeddings and the task heads stay fp32.

The quantised layers are not `kernels.Linear`, so `project_qkv` and `linear_act` call them as
they are (three projections, GELU after the GEMM).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..device import cpu_features

QUANTIZE_CHOICES = ("none", "int8")


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
    there (`reduce_range`, as torch's own dynamic Linear always does); with VNNI all 8."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        weight = layer.weight.detach().float()
        scale = (weight.abs().amax(1).clamp(min=1e-8) / 127.0).double()  # (out,)
        with warnings.catch_warnings():  # torch marks its quantised tensors deprecated (still there in 2.13)
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scale, torch.zeros(len(scale), dtype=torch.long), 0,
                                                 torch.qint8)
        bias = None if layer.bias is None else layer.bias.detach().float().clone()
        self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.reduce_range = not cpu_features().vnni

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._packed, self.reduce_range)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every Linear inside the model's encoder (`model.encoder` or `model.bert.encoder`)
    by its int8 dynamic-quantised copy, in place; returns the model (in eval mode, CPU only)."""
    encoder = getattr(model, "encoder", None) or getattr(getattr(model, "bert", None), "encoder", None)
    if encoder is None:
        raise ValueError(f"{type(model).__name__} has no BERT encoder to quantise")
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 quantisation runs on the CPU only")
    torch.backends.quantized.engine = _engine()
    model.eval()
    targets = [(parent, name, child) for parent in encoder.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return model
