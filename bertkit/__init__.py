"""bertkit: BERT (Devlin et al. 2019) in PyTorch — tokenizer, pre-training, fine-tuning, reproduction."""

__version__ = "0.1.0"

import importlib as _importlib  # noqa: E402
import importlib.abc as _importlib_abc  # noqa: E402
import importlib.util as _importlib_util  # noqa: E402
import sys as _sys  # noqa: E402

# Modules that moved when the package was grouped by what it serves (docs/ARCHITECTURE.md). The old
# dotted names keep importing the same module object, so code written against them (and anything that
# patches them) keeps working.
MOVED_MODULES = {
    "bertkit.answer_defaults": "bertkit.inference.answer_defaults",
    "bertkit.batch_encoding": "bertkit.tokenizer.batch_encoding",
    "bertkit.batching": "bertkit.inference.batching",
    "bertkit.convert": "bertkit.hub.convert",
    "bertkit.encoding": "bertkit.tokenizer.encoding",
    "bertkit.export": "bertkit.inference.export",
    "bertkit.hub_resolve": "bertkit.hub.resolve",
    "bertkit.model_card": "bertkit.hub.model_card",
    "bertkit.pipelines": "bertkit.inference.pipelines",
    "bertkit.plot": "bertkit.train.plot",
    "bertkit.predict": "bertkit.inference.predict",
    "bertkit.reproduce_report": "bertkit.reproduce.report",
    "bertkit.serve": "bertkit.serving.command",
    "bertkit.tf_bert": "bertkit.hub.tf_bert",
    "bertkit.tf_checkpoint": "bertkit.hub.tf_checkpoint",
    "bertkit.tokenizer_cli": "bertkit.tokenizer.cli",
}


class _MovedModules(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return _importlib_util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = _importlib.import_module(MOVED_MODULES[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # The module already ran under its new name; the import system has just given it the old
        # name's spec, so give its own back.
        module.__spec__ = module.__spec__.loader_state


_sys.meta_path.append(_MovedModules())

from .config import BertConfig  # noqa: E402
from .errors import BertkitError  # noqa: E402

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
