"""What sentence-transformers adds around an encoder's pooled vector, for the embedding routes:
named prompts (config_sentence_transformers.json), Matryoshka truncation, the similarity function,
OpenAI's base64 encoding, and the JSON writing of the vectors."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import torch

from ..errors import BertkitError
from ..inference.engine import unit_length
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
    return unit_length(vector) if normalize else vector


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
    """`content` (dicts, lists, JSON values and tensors) as UTF-8 JSON, each tensor as an array (of
    arrays, row by row) of numbers. orjson writes a float32 vector straight from its buffer, each
    number in the fewest digits that give back that float32 exactly (as TEI's serde_json writes an
    f32): a 384-float vector in ~16 us, where Python's %-formatting took ~140 (a tenth of a lone
    request's time outside the model). A tensor holding NaN or infinity, which JSON cannot carry, is
    refused with ValueError."""
    try:
        return orjson.dumps(content, default=_tensor_array, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as e:
        if isinstance(e.__cause__, ValueError):  # ours, from _tensor_array: raised as it was
            raise e.__cause__ from None
        raise


def _tensor_array(value):
    """orjson's hook for what it cannot write itself: a tensor, as a C-ordered numpy array of its
    numbers (float32, or float64 as it is; bf16 and fp16 widened to float32)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    tensor = value.detach().cpu() if value.requires_grad or value.device.type != "cpu" else value
    if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float64):
        tensor = tensor.float()
    array = tensor.numpy()
    # numpy's check, not torch's: on one vector torch's dispatch costs more than the check (see
    # InferenceEngine.pool)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError("a vector holds NaN or infinity, which JSON cannot carry")
    if array.ndim == 0:
        return array.item()
    return np.ascontiguousarray(array)
