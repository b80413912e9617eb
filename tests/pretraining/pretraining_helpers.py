"""Helpers shared by the pre-training data tests (independent of the code under test)."""

import gzip
import json
from pathlib import Path

import numpy as np


def read_bert_format(path: Path) -> list[list[str]]:
    """Independent reference reader: documents are separated by blank lines, one sentence per line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    documents = []
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        if lines:
            documents.append(lines)
    return documents


def load_shard_arrays(directory: Path) -> dict[str, np.ndarray]:
    """All shards' arrays concatenated, read with plain np.load (independent of the loader)."""
    manifest = json.loads((directory / "manifest.json").read_text())
    arrays: dict[str, list[np.ndarray]] = {}
    for shard in manifest["shards"]:
        for path in sorted((directory / shard["name"]).glob("*.npy")):
            arrays.setdefault(path.stem, []).append(np.load(path))
    return {key: np.concatenate(parts) for key, parts in arrays.items()}
