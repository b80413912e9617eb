"""bertkit: BERT (Devlin et al. 2019) in PyTorch — tokenizer, pre-training, fine-tuning, reproduction."""

import importlib as _importlib

from .config import BertConfig
from .errors import BertkitError
from .version import __version__  # noqa: F401

# The model classes need torch, the tokenizer `tokenizers`: both are imported on first use, so the
# command line (`bertkit --help`, `--version`) starts without them.
_LAZY = {
    "BertModel": "bertkit.model",
    **dict.fromkeys(("BertForMaskedLM", "BertForMultipleChoice", "BertForPreTraining", "BertForQuestionAnswering",
                     "BertForSequenceClassification", "BertForTokenClassification", "load_model"), "bertkit.heads"),
    **dict.fromkeys(("BertTokenizer", "train_tokenizer"), "bertkit.tokenizer"),
    "pipeline": "bertkit.inference.pipelines",
    "InferenceEngine": "bertkit.inference.engine",
    "finetune": "bertkit.tasks.custom",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'bertkit' has no attribute {name!r}")
    return getattr(_importlib.import_module(_LAZY[name]), name)


__all__ = [
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForQuestionAnswering", "BertForTokenClassification", "BertForMultipleChoice", "BertkitError",
    "BertTokenizer", "train_tokenizer", "load_model", "pipeline", "InferenceEngine", "finetune",
]
