"""Many texts through one model folder, a chunk at a time: sentence embeddings into an (N, D)
array, or a cross-encoder's (query, passage) scores. What the retrieval evaluators and hard-negative
mining run on; the model runs through InferenceEngine (the folder's pooling, normalisation and
max_seq_length, as `bertkit predict embeddings`), and only one chunk's token vectors are alive at a
time, so a million passages cost their (N, D) array and no more."""

from __future__ import annotations

import json
import math
import sys
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..errors import BertkitError
from .engine import InferenceEngine

CHUNK_TEXTS = 512  # texts handed to the engine at once (it batches them by length inside); their token
# vectors are alive together: 512 x 256 tokens x 384 floats is 200 MB
EMBEDDING_TASKS = ("feature-extraction", "sentence-embeddings")


def is_cross_encoder(engine: InferenceEngine) -> bool:
    """A sequence-classification head with one label: sentence-transformers' CrossEncoder layout."""
    return engine.task == "text-classification" and engine.config.num_labels == 1


def require_embedding_model(engine: InferenceEngine, flag: str = "--model") -> None:
    if engine.task not in EMBEDDING_TASKS:
        raise BertkitError(f"{flag} must be an embedding model (a BertModel or sentence-transformers folder); this "
                           f"folder holds a {type(engine.model).__name__} ({engine.task})", path=str(engine.model_dir))


def require_cross_encoder(engine: InferenceEngine, flag: str = "--cross-encoder") -> None:
    if not is_cross_encoder(engine):
        raise BertkitError(f"{flag} must be a cross-encoder (a sequence-classification head with one label); this "
                           f"folder holds a {type(engine.model).__name__} with {engine.config.num_labels} label(s)",
                           path=str(engine.model_dir))


def _bar(total: int, desc: str, progress: bool | None):
    return tqdm(total=total, desc=desc, unit=" texts", file=sys.stderr,
                disable=(not sys.stderr.isatty()) if progress is None else not progress)


def embed_texts(engine: InferenceEngine, texts: Sequence[str], *, out: np.ndarray | None = None,
                normalize: bool | None = None, desc: str = "embed", progress: bool | None = None) -> np.ndarray:
    """(N, D) embeddings of `texts` (the folder's pooling; normalised as the folder says unless
    `normalize` is given), written into `out` when given (any float array, e.g. a float16 memmap),
    else a new float32 array."""
    require_embedding_model(engine)
    if out is None:
        out = np.empty((len(texts), engine.config.hidden_size), dtype=np.float32)
    elif out.shape != (len(texts), engine.config.hidden_size):
        raise ValueError(f"out has shape {out.shape}, expected {(len(texts), engine.config.hidden_size)}")
    bar = _bar(len(texts), desc, progress)
    for start in range(0, len(texts), CHUNK_TEXTS):
        chunk = list(texts[start:start + CHUNK_TEXTS])
        out[start:start + len(chunk)] = torch.stack(engine.embeddings(chunk, normalize=normalize)).numpy()
        bar.update(len(chunk))
    bar.close()
    return out


def _activation(engine: InferenceEngine):
    """What sentence-transformers' CrossEncoder.predict applies to a one-label logit: the folder's
    activation_fn (config.json "sentence_transformers"), Sigmoid by default."""
    name = "Sigmoid"
    config_file = engine.model_dir / "config.json" if engine.model_dir is not None else None
    if config_file is not None and config_file.is_file():
        try:
            name = json.loads(config_file.read_text(encoding="utf-8")).get("sentence_transformers", {}).get(
                "activation_fn") or name
        except (ValueError, AttributeError):
            pass
    if name.endswith("Identity"):
        return lambda x: x
    if name.endswith("Sigmoid"):
        return lambda x: 1.0 / (1.0 + math.exp(-x))
    raise BertkitError(f"unsupported cross-encoder activation {name!r} (Sigmoid or Identity)", path=str(config_file))


def score_pairs(engine: InferenceEngine, queries: Sequence[str], passages: Sequence[str], *,
                desc: str = "score", progress: bool | None = None) -> np.ndarray:
    """A cross-encoder's score of each (query, passage) pair, as CrossEncoder.predict gives it
    (the one logit through the folder's activation, Sigmoid by default): (N,) float64."""
    require_cross_encoder(engine)
    if len(queries) != len(passages):
        raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
    activation = _activation(engine)
    scores = np.empty(len(queries), dtype=np.float64)
    bar = _bar(len(queries), desc, progress)
    for start in range(0, len(queries), CHUNK_TEXTS):
        stop = min(start + CHUNK_TEXTS, len(queries))
        logits = engine.logits(list(queries[start:stop]), list(passages[start:stop]))
        scores[start:stop] = [activation(float(logit[0])) for logit in logits]
        bar.update(stop - start)
    bar.close()
    return scores


__all__ = ["embed_texts", "score_pairs", "is_cross_encoder", "require_embedding_model", "require_cross_encoder"]
