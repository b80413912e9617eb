"""Checkpoints and where they come from: the Hugging Face layout (`checkpoints`), Hub ids and revisions
(`resolve`), the original TensorFlow release (`tf_checkpoint`, `tf_bert`) and the model card written
beside a saved model (`model_card`).

The names below load on first use: `resolve` and `model_card` sit low in the import order (the
tokenizer resolves a Hub id), `checkpoints` above the tokenizer, so importing one submodule must not
run the others."""

import importlib as _importlib

_LAZY = {
    **dict.fromkeys(("PICKLED_NAME", "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME", "PreTrainedMixin", "load_tokenizer",
                     "model_tokenizer", "read_safetensors"), "bertkit.hub.checkpoints"),
    "resolve_model": "bertkit.hub.resolve",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'bertkit.hub' has no attribute {name!r}")
    return getattr(_importlib.import_module(_LAZY[name]), name)


__all__ = [
    "PICKLED_NAME", "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME", "PreTrainedMixin", "load_tokenizer", "model_tokenizer",
    "read_safetensors", "resolve_model",
]
