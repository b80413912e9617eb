"""bertkit: BERT (Devlin et al. 2019) in PyTorch — tokenizer, pre-training, fine-tuning, reproduction."""

__version__ = "0.1.0"

from .config import BertConfig  # noqa: E402
from .errors import BertkitError  # noqa: E402
from .heads import (  # noqa: E402
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    load_model,
)
from .model import BertModel  # noqa: E402


def __getattr__(name):
    # The tokenizer pulls in `tokenizers`; import it only when asked for.
    if name in ("BertTokenizer", "train_tokenizer"):
        from . import tokenizer

        return getattr(tokenizer, name)
    if name == "pipeline":
        from .pipelines import pipeline

        return pipeline
    if name == "InferenceEngine":
        from .inference import InferenceEngine

        return InferenceEngine
    raise AttributeError(name)


__all__ = [
    "BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForQuestionAnswering", "BertForTokenClassification", "BertForMultipleChoice", "BertkitError",
    "BertTokenizer", "train_tokenizer", "load_model", "pipeline", "InferenceEngine",
]
