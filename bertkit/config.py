"""BertConfig: the model's hyper-parameters, with Hugging Face's config.json field names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .errors import BertkitError
from .outputs import atomic_write_text

# (layers, hidden, heads) per the paper §3 and Turc et al. 2019; intermediate size is always 4 x hidden.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
    # Table 6 size ablation, named L/H/A.
    "3-768-12": (3, 768, 12),
    "6-768-3": (6, 768, 3),
    "6-768-12": (6, 768, 12),
    "12-768-12": (12, 768, 12),
    "12-1024-16": (12, 1024, 16),
    "24-1024-16": (24, 1024, 16),
}


# Field checks (config.json is user input): sizes, counts and probabilities.
POSITIVE_INTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "num_labels")
NON_NEGATIVE_INTS = ("pad_token_id", "bilstm_hidden_size")
FRACTIONS = ("hidden_dropout_prob", "attention_probs_dropout_prob")


@dataclasses.dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    classifier_dropout: float | None = None
    # Left-to-right (causal) attention, the paper's LTR ablation. Hugging Face's name for it.
    is_decoder: bool = False
    # Task heads.
    num_labels: int = 2
    problem_type: str | None = None
    id2label: dict[int, str] | None = None
    # BiLSTM on top of the encoder at fine-tuning time (the paper's "+ BiLSTM" ablation).
    bilstm_hidden_size: int = 0
    architectures: list[str] | None = None
    model_type: str = "bert"
    # What forward returns when the call does not say (transformers' config fields of the same names).
    output_hidden_states: bool = False
    output_attentions: bool = False
    # Fields we do not use but must keep so a round trip through bertkit loses nothing.
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._check_field_types()
        if self.hidden_size % self.num_attention_heads:
            raise BertkitError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.id2label is not None:
            self.id2label = {int(k): v for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)

    def _check_field_types(self) -> None:
        """A config.json with a string where a number belongs (or a negative size) fails here, in words."""
        for name in POSITIVE_INTS + NON_NEGATIVE_INTS:
            value = getattr(self, name)
            low = 1 if name in POSITIVE_INTS else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise BertkitError(f"{name} must be a whole number of at least {low}, not {value!r}")
        for name in FRACTIONS + ("classifier_dropout",):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise BertkitError(f"{name} must be a number between 0 and 1, not {value!r}")
        for name in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise BertkitError(f"{name} must be a positive number, not {value!r}")
        if not isinstance(self.hidden_act, str):
            raise BertkitError(f"hidden_act must be a string, not {self.hidden_act!r}")
        for name in ("is_decoder", "output_hidden_states", "output_attentions"):
            if not isinstance(getattr(self, name), bool):
                raise BertkitError(f"{name} must be true or false, not {getattr(self, name)!r}")
        if self.id2label is not None and not (isinstance(self.id2label, dict) and all(
                isinstance(k, (int, str)) and str(k).lstrip("-").isdigit() for k in self.id2label)):
            raise BertkitError(f"id2label must map label ids to names, not {self.id2label!r}")
        if self.architectures is not None and not (isinstance(self.architectures, list) and self.architectures
                                                   and all(isinstance(a, str) for a in self.architectures)):
            raise BertkitError(f"architectures must be a list of class names, not {self.architectures!r}")

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.id2label is None else {v: k for k, v in self.id2label.items()}

    @classmethod
    def preset(cls, name: str, **overrides) -> "BertConfig":
        if name not in PRESETS:
            raise BertkitError(f"unknown model size {name!r}; choose from {', '.join(PRESETS)} or give a config.json")
        layers, hidden, heads = PRESETS[name]
        fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=4 * hidden)
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BertConfig":
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in d.items() if k in known}
        always_written = {"label2id", "position_embedding_type", "tie_word_embeddings"}
        extra = {k: v for k, v in d.items() if k not in known and k not in always_written}
        if d.get("model_type", "bert") != "bert":
            raise BertkitError(f"model_type is {d.get('model_type')!r}, not 'bert'")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise BertkitError(f"position_embedding_type {d['position_embedding_type']!r} is not supported (only 'absolute')")
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        if not path.is_file():
            raise BertkitError("config file not found", path=str(path))
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BertkitError(f"not valid JSON ({e})", path=str(path)) from None
        if not isinstance(d, dict):
            raise BertkitError(f"expected a JSON object, found {type(d).__name__}", path=str(path))
        try:
            return cls.from_dict(d)
        except BertkitError as e:  # a bad field: say which file it came from
            raise BertkitError(e.message, path=str(path)) from None

    @classmethod
    def from_name_or_file(cls, name_or_path: str, **overrides) -> "BertConfig":
        """A preset name (`mini`) or a config.json / model directory."""
        p = Path(name_or_path)
        if name_or_path in PRESETS:
            return cls.preset(name_or_path, **overrides)
        if p.is_dir():
            p = p / "config.json"
        config = cls.from_json_file(p)
        return config.replace(**overrides) if overrides else config

    def replace(self, **overrides) -> "BertConfig":
        """A copy with some fields changed. A new num_labels drops label names of another count:
        __post_init__ would otherwise take num_labels from them and silently keep the old head size."""
        if ("num_labels" in overrides and "id2label" not in overrides and self.id2label is not None
                and len(self.id2label) != overrides["num_labels"]):
            overrides["id2label"] = None
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        d.update(self.extra)
        if self.id2label is not None:
            d["id2label"] = {str(k): v for k, v in self.id2label.items()}
            d["label2id"] = self.label2id
        for optional in ("architectures", "problem_type", "id2label", "classifier_dropout"):
            if d.get(optional) is None:
                d.pop(optional, None)
        if not self.bilstm_hidden_size:
            d.pop("bilstm_hidden_size")
        for flag in ("output_hidden_states", "output_attentions"):  # written only when set, as transformers
            if not d[flag]:
                d.pop(flag)
        d["position_embedding_type"] = "absolute"
        d["tie_word_embeddings"] = True
        return d

    def save(self, directory: str | Path) -> None:
        atomic_write_text(Path(directory) / "config.json", json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
