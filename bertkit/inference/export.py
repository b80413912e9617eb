"""`bertkit export --model DIR --format onnx --output FILE`: the model as an ONNX graph.

Inputs input_ids, attention_mask, token_type_ids, each (batch, sequence) int64 with both axes
dynamic; outputs the head's (logits; start_logits + end_logits; last_hidden_state). The graph is
traced from a model built with the plain kernels (`KernelOptions.plain()`: plain matmuls, SDPA with
the padding mask, no unpadding): the fast paths call oneDNN directly or branch on the data, which a
graph cannot hold.
What the model computes is the same, padded positions included in the mask, so a padded
variable-length batch gives bertkit's outputs at every real position (tests/inference/test_export.py checks
this under onnxruntime). Multiple-choice models take (batch, choices, sequence) inputs.

torch's TorchScript-based exporter does the tracing: its dynamo-based one refuses the model's
data-dependent check for padding (`attention_mask.all()`), which the trace records as the masked
path. Needs the `onnx` package (`pip install bertkit[export]`; the dev extra has it).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from .. import flags, kernels
from ..errors import BertkitError
from ..heads import load_model
from ..outputs import atomic_write, check_output, folder_files
from .engine import TASKS
from ..kernels.int8 import QUANTIZE_CHOICES

FORMATS = ("onnx",)
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


class _Exported(torch.nn.Module):
    """The model with positional inputs and a tuple of its head's outputs (what a graph needs)."""

    def __init__(self, model, output_names: tuple[str, ...]):
        super().__init__()
        self.model, self.output_names = model, output_names

    def forward(self, input_ids, attention_mask, token_type_ids, position_ids=None, pooled_tokens=None):
        pooled = {} if pooled_tokens is None else {"pooled_tokens": pooled_tokens}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         position_ids=position_ids, **pooled)
        return tuple(out[name] for name in self.output_names)


def output_names_for(model) -> tuple[str, ...]:
    task = TASKS.get(type(model).__name__)
    if task == "question-answering":
        return ("start_logits", "end_logits")
    if task == "feature-extraction":
        return ("last_hidden_state",)
    if type(model).__name__ == "BertForPreTraining":
        return ("prediction_logits", "seq_relationship_logits")
    return ("logits",)


def export_onnx(model_dir: str | Path, output: str | Path, opset: int = 18, quantize: str = "none",
                overwrite: bool = False) -> Path:
    """Write the model folder's model as ONNX to `output` (atomically); returns the path.

    quantize "int8": the graph's MatMuls with int8 weights (a scale per output channel) and uint8
    activations quantised per call, by ONNX Runtime's `quantize_dynamic` (needs onnxruntime):
    the scheme of bertkit's own `--quantize int8` without its fp32 outlier channels in the
    feed-forward output projection (kernels/int8.py).

    The weights use 7 bits (`reduce_range`), so the file is exact on every CPU it is later run on,
    not only the one that exported it: without VNNI (AVX2, AVX-512 before Cascade Lake) ONNX
    Runtime's u8 x s8 kernel sums pairs of products in int16 (vpmaddubsw), which 255 * 127 * 2
    overflows and saturates (max abs error 0.40 on a test model); 255 * 64 * 2 = 32,640 fits. This is
    the workaround ONNX Runtime's quantisation guide gives; uint8 weights (its other one) came out
    slightly closer to fp32 but ~20% slower on an AVX2 EPYC."""
    if quantize not in QUANTIZE_CHOICES:
        raise BertkitError(f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, not {quantize!r}")
    # Before any work: the model folder's files are inputs (an --output M/model.safetensors would put the
    # graph in place of the weights), an existing file needs --overwrite, and the name must say .onnx.
    check_output(output, inputs=folder_files(model_dir), overwrite=overwrite, formats=FORMATS)
    if quantize == "int8":
        try:
            from onnxruntime.quantization import QuantType, quantize_dynamic
        except ImportError:
            raise BertkitError("int8 ONNX export needs the onnxruntime package: pip install onnxruntime") from None
    try:
        import onnx  # noqa: F401  (torch's exporter writes through it)
    except ImportError:
        raise BertkitError("ONNX export needs the onnx package: pip install onnx") from None
    model = load_model(model_dir, kernels=kernels.KernelOptions.plain()).eval()
    names = output_names_for(model)
    wrapped = _Exported(model, names).eval()
    choices = type(model).__name__ == "BertForMultipleChoice"
    shape = (2, 2, 8) if choices else (2, 8)
    # The example batch has padding, so the trace takes the masked attention path (the model skips
    # the mask for a batch without padding, a branch on the data that a graph cannot keep).
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., -3:] = 0
    mask[0, ...] = 1
    example = (torch.full(shape, 5, dtype=torch.long), mask, torch.zeros(shape, dtype=torch.long))
    axes = {0: "batch", 1: "choices", 2: "sequence"} if choices else {0: "batch", 1: "sequence"}
    dynamic_axes = {name: axes for name in INPUT_NAMES}
    dynamic_axes.update({name: {0: "batch"} for name in names})
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)

    def trace(path: str) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about Python-side checks on shapes
            torch.onnx.export(wrapped, example, path, input_names=list(INPUT_NAMES), output_names=list(names),
                              dynamic_axes=dynamic_axes, dynamo=False, opset_version=opset)

    def write(tmp: str) -> None:
        if quantize == "none":
            return trace(tmp)
        with tempfile.TemporaryDirectory() as folder:
            fp32 = str(Path(folder) / "model.onnx")
            trace(fp32)
            quantize_dynamic(fp32, tmp, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)

    atomic_write(output, write)
    return output


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="model folder (Hugging Face layout)")
    parser.add_argument("--format", default="onnx", choices=FORMATS)
    parser.add_argument("--output", required=True, help="file to write, named .onnx (e.g. model.onnx)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output (never a model file)")
    parser.add_argument("--opset", type=flags.int_between(7, 25), default=18, help="ONNX opset version (default 18)")
    parser.add_argument("--quantize", default="none", choices=QUANTIZE_CHOICES,
                        help="int8: dynamic int8 MatMuls via onnxruntime.quantization (needs onnxruntime)")


def run_from_args(args) -> int:
    path = export_onnx(args.model, args.output, args.opset, args.quantize, overwrite=args.overwrite)
    kind = "ONNX, int8 dynamic quantisation" if args.quantize == "int8" else "ONNX"
    print(f"export: {args.model} -> {path} ({kind}, dynamic batch and sequence axes)")
    return 0
