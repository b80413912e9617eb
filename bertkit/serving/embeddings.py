"""What sentence-transformers adds around an encoder's pooled vector, for the embedding routes:
named prompts (config_sentence_transformers.json), Matryoshka truncation, the similarity function,
OpenAI's base64 encoding, and the JSON writing of the vectors."""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import BertkitError
from .requests import RequestError

ST_CONFIG = "config_sentence_transformers.json"
SIMILARITY_FUNCTIONS = ("cosine", "dot", "euclidean", "manhattan")


@dataclass
class SentenceTransformerConfig:
    """The parts of config_sentence_transformers.json that change an embedding or a similarity."""

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"  # sentence-transformers' default
    include_prompt: bool = True  # the Pooling module's: False leaves [CLS] and the prompt out of the pooling

    def prompt(self, prompt_name: str | None) -> str:
        """The text put before each input: the named prompt, else the default one, else nothing."""
        if prompt_name is None:
            return self.prompts.get(self.default_prompt_name, "") if self.default_prompt_name else ""
        if prompt_name not in self.prompts:
            known = ", ".join(repr(name) for name in self.prompts) or "none: the model defines no prompts"
            raise RequestError(422, f"prompt_name {prompt_name!r} is not one of the model's prompts ({known})")
        return self.prompts[prompt_name]


def _pooling_includes_prompt(model_dir: Path) -> bool:
    """The Pooling module's include_prompt (sentence-transformers' default True); the folder's
    pooling files were checked when the engine loaded them."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
        folder = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
        config = json.loads((model_dir / folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return True
    return config.get("include_prompt", True) is not False


def read_sentence_transformer_config(model_dir: Path) -> SentenceTransformerConfig:
    path = Path(model_dir) / ST_CONFIG
    if not path.is_file():
        return SentenceTransformerConfig(include_prompt=_pooling_includes_prompt(Path(model_dir)))
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BertkitError(f"cannot read the sentence-transformers config ({e})", path=str(path)) from None
    if not isinstance(document, dict):
        raise BertkitError("expected a JSON object", path=str(path))
    prompts = document.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise BertkitError("'prompts' must map names to prompt texts", path=str(path))
    default = document.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise BertkitError(f"default_prompt_name {default!r} is not one of the prompts", path=str(path))
    similarity = document.get("similarity_fn_name") or "cosine"
    if similarity not in SIMILARITY_FUNCTIONS:
        raise BertkitError(f"similarity_fn_name must be one of {', '.join(SIMILARITY_FUNCTIONS)}", path=str(path))
    return SentenceTransformerConfig(prompts, default, similarity, _pooling_includes_prompt(Path(model_dir)))


def finish_embedding(vector: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Matryoshka: keep the first `dimensions` values, then scale to unit length when asked
    (sentence-transformers' truncate_dim with normalize_embeddings, TEI's `dimensions`)."""
    if dimensions is not None:
        vector = vector[:dimensions]
    return torch.nn.functional.normalize(vector, dim=0) if normalize else vector


def similarities(source: torch.Tensor, candidates: torch.Tensor, function: str) -> list[float]:
    """sentence-transformers' `similarity(source, candidates)` row: higher is more similar (distances
    come out negated, as there)."""
    if function == "dot":
        scores = candidates @ source
    elif function == "euclidean":
        scores = -torch.linalg.vector_norm(candidates - source, dim=1)
    elif function == "manhattan":
        scores = -(candidates - source).abs().sum(1)
    else:
        scores = torch.nn.functional.cosine_similarity(candidates, source[None, :], dim=1)
    return scores.tolist()


def base64_floats(vector: torch.Tensor) -> str:
    """OpenAI's encoding_format "base64": the little-endian float32 bytes, base64-encoded."""
    return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")


def json_with_vectors(content) -> bytes:
    """`content` (dicts, lists, JSON values and float32 tensors) as UTF-8 JSON, each tensor as an array
    (of arrays, row by row) of numbers with 9 significant digits: enough to give back every float32
    exactly (FLT_DECIMAL_DIG); an integral value is written without a fraction (0, 1), a number to JSON
    as any other. One %-format call writes a vector in a third of json.dumps's time (its repr writes
    the 17 digits of the float64 a float32 widens to), into a body that parses faster. NaN and
    infinity are refused with ValueError, as by json.dumps(allow_nan=False)."""
    return _json_text(content).encode("utf-8")


_json_value = functools.partial(json.dumps, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _json_text(value) -> str:
    if isinstance(value, torch.Tensor):
        return _float_array(value.tolist())
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_value(str(key))}:{_json_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(_json_text, value)) + "]"
    return _json_value(value)


def _float_array(values: list) -> str:
    """A tensor's tolist() (floats, or lists of them) as JSON."""
    if values and isinstance(values[0], list):
        return "[" + ",".join(map(_float_array, values)) + "]"
    text = _vector_format(len(values)) % tuple(values)
    if "n" in text:  # "nan" or "inf": %-formatting of a finite number writes no letter n
        raise ValueError("a vector holds NaN or infinity, which JSON cannot carry")
    return text


@functools.lru_cache(maxsize=16)
def _vector_format(size: int) -> str:
    return "[" + ",".join(["%.9g"] * size) + "]"
