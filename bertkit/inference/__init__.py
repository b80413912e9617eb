"""Using a trained model: the batched engine (`engine`), `bertkit.pipeline` (`pipelines`), the `predict`
command, ONNX export (`export`) and the per-task defaults every door shares (`answer_defaults`).
The HTTP server built on them is `bertkit.serving`."""

from .engine import InferenceEngine

__all__ = ["InferenceEngine"]
