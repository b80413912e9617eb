"""The original release's TensorFlow checkpoints, as bertkit weights in Hugging Face names.

A released model is a folder with bert_config.json, vocab.txt and bert_model.ckpt.{index,data-*};
run_classifier.py and run_squad.py leave model.ckpt-STEP.{index,data-*} and a `checkpoint` file
naming the latest. The variable map (TF name -> transformers name):

    bert/embeddings/{word,position,token_type}_embeddings    bert.embeddings.*_embeddings.weight
    bert/embeddings/LayerNorm/{gamma,beta}                    bert.embeddings.LayerNorm.{weight,bias}
    bert/encoder/layer_N/attention/self/{query,key,value}/    bert.encoder.layer.N.attention.self.*
    bert/encoder/layer_N/attention/output/{dense,LayerNorm}/  bert.encoder.layer.N.attention.output.*
    bert/encoder/layer_N/{intermediate,output}/dense/         bert.encoder.layer.N.{intermediate,output}.dense.*
    bert/encoder/layer_N/output/LayerNorm/                    bert.encoder.layer.N.output.LayerNorm.*
    bert/pooler/dense/                                        bert.pooler.dense.*
    cls/predictions/transform/{dense,LayerNorm}/              cls.predictions.transform.*
    cls/predictions/output_bias                               cls.predictions.bias
    cls/seq_relationship/output_{weights,bias}                cls.seq_relationship.{weight,bias}
    output_{weights,bias}  (run_classifier.py)                classifier.{weight,bias}
    cls/squad/output_{weights,bias}  (run_squad.py)           qa_outputs.{weight,bias}

Dense `kernel`s are (in, out) in TF (y = x @ kernel) and transposed to torch's (out, in); the
`output_weights` of the heads are already (out, in) (the original multiplies with transpose_b) and
are not. The optimizer's slots (NAME/adam_m, NAME/adam_v) and global_step are skipped; any other
variable is an error naming it, so nothing is silently dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import BertConfig
from ..errors import BertkitError
from .tf_checkpoint import TensorBundle

BERT_CONFIG_NAME = "bert_config.json"

_WHOLE_NAMES = {
    "bert/embeddings/word_embeddings": "bert.embeddings.word_embeddings.weight",
    "bert/embeddings/position_embeddings": "bert.embeddings.position_embeddings.weight",
    "bert/embeddings/token_type_embeddings": "bert.embeddings.token_type_embeddings.weight",
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "output_weights": "classifier.weight",
    "output_bias": "classifier.bias",
    "cls/squad/output_weights": "qa_outputs.weight",
    "cls/squad/output_bias": "qa_outputs.bias",
}
_DENSE = re.compile(r"(bert/encoder/layer_\d+/(attention/self/(query|key|value)|attention/output/dense"
                    r"|intermediate/dense|output/dense)|bert/pooler/dense|cls/predictions/transform/dense)"
                    r"/(kernel|bias)")
_LAYER_NORM = re.compile(r"(bert/embeddings|bert/encoder/layer_\d+/(attention/output|output)"
                         r"|cls/predictions/transform)/LayerNorm/(gamma|beta)")
_LEAF = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}

# Which model the variables make: a task head decides it, else the pre-training heads.
HEAD_ARCHITECTURES = {
    "output_weights": "BertForSequenceClassification",
    "cls/squad/output_weights": "BertForQuestionAnswering",
}


def is_skipped(tf_name: str) -> bool:
    """Training state, not model weights: the optimizer's slots and the step counter."""
    return tf_name == "global_step" or tf_name.endswith(("/adam_m", "/adam_v"))


def hf_name(tf_name: str) -> tuple[str, bool] | None:
    """(transformers name, whether to transpose) for a model variable; None if it is not one."""
    if tf_name in _WHOLE_NAMES:
        return _WHOLE_NAMES[tf_name], False
    match = _DENSE.fullmatch(tf_name) or _LAYER_NORM.fullmatch(tf_name)
    if match is None:
        return None
    module, leaf = tf_name.rsplit("/", 1)
    name = re.sub(r"layer_(\d+)", r"layer.\1", module).replace("/", ".") + "." + _LEAF[leaf]
    return name, leaf == "kernel"


def architecture(tf_names) -> str:
    heads = [HEAD_ARCHITECTURES[name] for name in HEAD_ARCHITECTURES if name in tf_names]
    if len(heads) > 1:
        raise BertkitError(f"the checkpoint holds two task heads ({' and '.join(heads)}); convert one at a time")
    if heads:
        return heads[0]
    if any(name.startswith(("cls/predictions/", "cls/seq_relationship/")) for name in tf_names):
        return "BertForPreTraining"
    return "BertModel"


def find_checkpoint_prefix(path: str | Path) -> Path:
    """The checkpoint PREFIX that `path` names: a prefix itself, or a folder holding one (the one
    its `checkpoint` file names as the latest, else the folder's only *.index)."""
    path = Path(path)
    if Path(f"{path}.index").is_file():
        return path
    if not path.is_dir():
        raise BertkitError("no TensorFlow checkpoint here (neither a folder nor PREFIX.index)", path=path)
    state_file = path / "checkpoint"
    if state_file.is_file():
        match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', state_file.read_text(errors="replace"), re.M)
        if match:
            # Estimator writes paths relative to the folder; an absolute one may point to where it was trained.
            prefix = path / Path(match.group(1)).name
            if not Path(f"{prefix}.index").is_file():
                raise BertkitError(f"names checkpoint {match.group(1)!r}, but {prefix.name}.index is not in the folder",
                                   path=state_file)
            return prefix
    indexes = sorted(path.glob("*.index"))
    if not indexes:
        raise BertkitError("no TensorFlow checkpoint index (*.index) in the folder", path=path)
    if len(indexes) > 1:
        names = ", ".join(p.name for p in indexes)
        raise BertkitError(f"several checkpoints ({names}) and no `checkpoint` file naming the latest: "
                           "give the prefix, e.g. DIR/model.ckpt-1000", path=path)
    return path / indexes[0].name[: -len(".index")]


def is_original_checkpoint(directory: str | Path) -> bool:
    """A folder that holds a TensorFlow checkpoint (and no model.safetensors to prefer)."""
    directory = Path(directory)
    return (directory.is_dir() and not (directory / "model.safetensors").is_file()
            and any(directory.glob("*.index")))


def config_from_bert_config(path: str | Path) -> BertConfig:
    """bert_config.json -> BertConfig. The original's "gelu" is the tanh approximation (modeling.py),
    which bertkit and transformers call gelu_new: the converted model computes what the original did."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError(f"{BERT_CONFIG_NAME} not found (the original model's config: pass it with --config)",
                           path=path)
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BertkitError(f"not valid JSON ({e})", path=path) from None
    if not isinstance(fields, dict):
        raise BertkitError("expected a JSON object", path=path)
    if fields.get("hidden_act") == "gelu":
        fields["hidden_act"] = "gelu_new"
    try:
        return BertConfig.from_dict(fields)
    except (BertkitError, TypeError) as e:
        raise BertkitError(str(getattr(e, "message", e)), path=path) from None


@dataclass
class OriginalCheckpoint:
    prefix: Path
    bundle: TensorBundle
    names: dict[str, tuple[str, bool]]  # TF variable -> (transformers name, transpose)

    @classmethod
    def open(cls, path: str | Path) -> "OriginalCheckpoint":
        bundle = TensorBundle(find_checkpoint_prefix(path))
        names, unknown = {}, []
        for tf_name in bundle.entries:
            if is_skipped(tf_name):
                continue
            mapped = hf_name(tf_name)
            if mapped is None:
                unknown.append(tf_name)
            else:
                names[tf_name] = mapped
        if "_CHECKPOINTABLE_OBJECT_GRAPH" in bundle.entries:
            raise BertkitError("a TensorFlow 2 object-based checkpoint (Keras / tf.train.Checkpoint), not the "
                               "original release's variable layout", path=bundle.index_path)
        if unknown:
            raise BertkitError(f"unknown variable {unknown[0]}"
                               + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                               + ": not one the original BERT scripts write", path=bundle.index_path)
        return cls(bundle.prefix, bundle, names)

    @property
    def architecture(self) -> str:
        try:
            return architecture(self.names)
        except BertkitError as e:
            raise BertkitError(e.message, path=self.bundle.index_path) from None

    def config(self, bert_config: str | Path) -> BertConfig:
        """bert_config.json's fields, the architecture the variables make and, for a classifier,
        num_labels from its output_weights."""
        config = config_from_bert_config(bert_config).replace(architectures=[self.architecture])
        if "output_weights" in self.names:
            config = config.replace(num_labels=self.bundle.entries["output_weights"].shape[0])
        return config

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every model variable under its transformers name, in torch's layout (CRC-checked)."""
        state = {}
        for tf_name, (name, transpose) in self.names.items():
            tensor = self.bundle.read(tf_name)
            if transpose:
                if tensor.dim() != 2:
                    raise BertkitError(f"variable {tf_name} should be a 2-D kernel, has shape {list(tensor.shape)}",
                                       path=self.bundle.index_path)
                tensor = tensor.t().contiguous()
            state[name] = tensor
        return state


def infer_do_lower_case(vocabulary: list[str]) -> bool:
    """Uncased vocabularies were built from lower-cased text: no token but [CLS]-style specials has a
    capital letter, while a cased one has capitalised words throughout."""
    tokens = [t for t in vocabulary if t and not (t.startswith("[") and t.endswith("]"))]
    capitalised = sum(any(ch.isupper() for ch in token) for token in tokens)
    return capitalised <= 0.01 * len(tokens)
