"""Model references as users write them: a local folder, or a Hugging Face Hub id (`bert-base-uncased`,
`sentence-transformers/all-MiniLM-L6-v2`) fetched into the Hub cache with huggingface_hub.

The cache is huggingface_hub's own (HF_HOME / HF_HUB_CACHE), shared with transformers and
sentence-transformers, so a model either of them downloaded is reused; HF_HUB_OFFLINE, HF_TOKEN, revision
pinning and resumable downloads behave as there. Only the files bertkit reads are fetched.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from ..errors import BertkitError

log = logging.getLogger("bertkit")

# What bertkit reads from a model repository (config, safetensors weights and their shard index, tokenizer,
# sentence-transformers pooling / normalisation modules, model card).
TOKENIZER_FILES = ["vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"]
MODEL_FILES = TOKENIZER_FILES + [
    "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
    "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
    "1_Pooling/config.json", "2_Normalize/*", "README.md",
]
# Pickled weights only where a repository has no safetensors: torch.load(weights_only=True) reads them.
PICKLED_WEIGHTS = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"]
SAFETENSORS_NAMES = ("model.safetensors", "model.safetensors.index.json")

_REPO_ID = re.compile(r"(?:[\w\-.]{1,96}/)?[\w\-.]{1,96}", flags=re.ASCII)
_SNAPSHOT = re.compile(r"models--(?P<org_name>.+)[/\\]snapshots[/\\][0-9a-f]{40}$")


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> Path:
    """The cache huggingface_hub uses (read at call time, so HF_HOME set after import counts too)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return _is_true(os.environ.get("HF_HUB_OFFLINE")) or _is_true(os.environ.get("TRANSFORMERS_OFFLINE"))


def looks_like_hub_id(reference: str) -> bool:
    """`name` or `org/name` in the Hub's spelling; paths (absolute, ./, ~, two slashes, a file
    extension such as vocab.txt) are not ids."""
    text = str(reference)
    if text.startswith((".", "/", "~")) or "\\" in text or ".." in text or "--" in text:
        return False
    if text.endswith((".txt", ".json", ".safetensors", ".bin", ".index")):
        return False
    return _REPO_ID.fullmatch(text) is not None and not text.endswith(("-", "."))


def hub_id_of(folder: str | Path) -> str | None:
    """`org/name` when `folder` is a snapshot in the Hub cache (models--org--name/snapshots/<sha>)."""
    match = _SNAPSHOT.search(str(folder))
    return match.group("org_name").replace("--", "/") if match else None


class ModelReference(str):
    """A model reference with the revision it was given at (`--model org/name --revision v1`): the
    revision travels with the reference through every layer that loads from it (tokenizer, weights),
    where a process-wide table would leak into the next command run in the same process. It is the
    reference text itself everywhere else (logs, results.json)."""

    revision: str | None

    def __new__(cls, reference: str | os.PathLike, revision: str | None = None) -> "ModelReference":
        made = super().__new__(cls, os.fspath(reference))
        made.revision = revision
        return made

    def __reduce__(self):  # pickled (DataLoader workers, torchrun) with its revision
        return ModelReference, (str(self), self.revision)


def resolve_model(reference: str | os.PathLike, revision: str | None = None, tokenizer_only: bool = False) -> Path:
    """A local folder for `reference`: the folder itself when it exists, else the Hub id's cached
    snapshot (downloading what is missing). A reference that is neither comes back unchanged, for the
    caller's own "not found" error."""
    revision = revision or getattr(reference, "revision", None)
    path = Path(reference).expanduser()
    if path.exists():
        if revision:
            raise BertkitError(f"--revision {revision} applies to Hub ids, not to a local folder", path=str(path))
        return path
    if not looks_like_hub_id(str(reference)):
        return path
    repo_id = str(reference)
    folder = _download(repo_id, revision, TOKENIZER_FILES if tokenizer_only else MODEL_FILES)
    _check_is_bert(repo_id, folder)
    if not tokenizer_only and not any((folder / name).is_file() for name in SAFETENSORS_NAMES):
        folder = _download(repo_id, revision, PICKLED_WEIGHTS)
    return folder


def _download(repo_id: str, revision: str | None, patterns: list[str]) -> Path:
    import httpx  # huggingface_hub's HTTP client: a dropped connection surfaces as its TransportError
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HFValidationError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    cache = hub_cache_dir()
    where = f"{repo_id}" + (f" (revision {revision})" if revision else "")
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=patterns, cache_dir=str(cache),
                                   endpoint=os.environ.get("HF_ENDPOINT") or None, local_files_only=offline())
    except GatedRepoError:
        raise BertkitError(f"{repo_id} is a gated model: accept its terms on the Hub, then set HF_TOKEN (or run "
                           "`hf auth login`) with an account that has access") from None
    except RepositoryNotFoundError:
        token = " (or it is private and HF_TOKEN is not set)" if not _has_token() else ""
        raise BertkitError(f"{repo_id}: no such local folder, and no Hub model of that name{token}") from None
    except RevisionNotFoundError:
        raise BertkitError(f"{repo_id} has no revision {revision or 'main'!r} on the Hub "
                           "(a branch, tag or commit hash)") from None
    except HFValidationError as e:
        raise BertkitError(f"{repo_id}: not a local folder or a valid Hub id ({e})") from None
    except (LocalEntryNotFoundError, OSError, httpx.TransportError) as e:  # not reachable and not cached; a broken download
        if offline():
            reason = (f"{repo_id}: no such local folder, and HF_HUB_OFFLINE is set while {where} is not (fully) "
                      f"in the Hub cache {cache}")
        elif isinstance(e, (LocalEntryNotFoundError, HfHubHTTPError)):
            reason = (f"{repo_id}: no such local folder, and the Hub cannot be reached while {where} is not (fully) "
                      f"in the Hub cache {cache} (HF_HUB_OFFLINE is not set)")
        else:
            reason = (f"download of {where} failed ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                      "nothing partial was kept: run the command again")
        raise BertkitError(reason) from None
    return Path(folder)


def _has_token() -> bool:
    from huggingface_hub import get_token

    return get_token() is not None


def _check_is_bert(repo_id: str, folder: Path) -> None:
    config_file = folder / "config.json"
    if not config_file.is_file():
        return
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type", "bert")
    except (ValueError, AttributeError):
        return  # config.json's own reader reports the problem with its line
    if model_type != "bert":
        raise BertkitError(f"{repo_id} is not a BERT model: its config.json says model_type {model_type!r} "
                           "(bertkit loads model_type 'bert')")
