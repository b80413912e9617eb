"""Checkpoints and where they come from: the Hugging Face layout (`checkpoints`), Hub ids and revisions
(`resolve`), the original TensorFlow release (`tf_checkpoint`, `tf_bert`, `convert`) and the model card
written beside a saved model (`model_card`)."""

from .checkpoints import (
    PICKLED_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    PreTrainedMixin,
    load_tokenizer,
    model_tokenizer,
    read_safetensors,
)
from .resolve import resolve_model

__all__ = [
    "PICKLED_NAME", "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME", "PreTrainedMixin", "load_tokenizer", "model_tokenizer",
    "read_safetensors", "resolve_model",
]
