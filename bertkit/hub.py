"""Checkpoints in the Hugging Face layout: config.json + model.safetensors (+ vocab.txt).

Parameter names in the file are exactly transformers' (`bert.encoder.layer.0.attention.self.query.weight`,
`cls.predictions.bias`, ...), so a bertkit model loads in transformers and a transformers BERT
(base model, pre-training model or any task head) loads here. Weights are never unpickled.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import torch

from .errors import BertkitError

log = logging.getLogger("bertkit")

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # sharded checkpoints: tensor name -> shard file
# Tied to the word embeddings / the output bias: the file may hold them, the model does not.
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise BertkitError(f"cannot read safetensors weights ({e})", path=str(path)) from None


def read_sharded_safetensors(index_path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a sharded checkpoint: every shard its index's weight_map names, read in full."""
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise BertkitError(f"not a safetensors index with a weight_map ({e})", path=str(index_path)) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BertkitError("weight_map must map tensor names to shard file names", path=str(index_path))
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = index_path.parent / shard
        if Path(shard).name != shard or not shard_path.is_file():
            raise BertkitError(f"shard {shard!r} named in the index is missing", path=str(index_path))
        tensors.update(read_safetensors(shard_path))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise BertkitError(f"tensors listed in the index but in no shard: {', '.join(missing[:5])}", path=str(index_path))
    return tensors


def atomic_write(path: Path, write) -> None:
    """write(tmp_path) then rename, so a crash never leaves a half-written file under the real name."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _legacy_name(key: str) -> str:
    # Very old checkpoints (converted from TF) call LayerNorm parameters gamma / beta.
    if key.endswith("LayerNorm.gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith("LayerNorm.beta"):
        return key[: -len("beta")] + "bias"
    return key


def map_checkpoint_keys(ckpt: dict[str, torch.Tensor], model_keys: set[str]):
    """Rename checkpoint tensors to the model's names.

    Handles a base-model checkpoint loaded into a head model (add `bert.`) and a head checkpoint
    loaded into BertModel (drop `bert.`). Returns (mapped state, unexpected checkpoint keys).
    """
    mapped, unexpected = {}, []
    for key, tensor in ckpt.items():
        key = _legacy_name(key)
        if key in TIED_KEYS or key.endswith("position_ids"):
            continue
        for candidate in (key, "bert." + key, key.removeprefix("bert.")):
            if candidate in model_keys:
                mapped[candidate] = tensor
                break
        else:
            unexpected.append(key)
    return mapped, unexpected


class PreTrainedMixin:
    """save_pretrained / from_pretrained for every bertkit model class."""

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> Path:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
        import dataclasses

        config = dataclasses.replace(self.config, architectures=[type(self).__name__])
        atomic_write(directory / "config.json",
                     lambda tmp: Path(tmp).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n"))
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, config=None, **config_overrides):
        """Load weights (and config.json unless `config` is given); overrides such as num_labels=3
        change the config before the model is built (a new head is then freshly initialised)."""
        from .config import BertConfig

        directory = Path(directory)
        if not directory.is_dir():
            raise BertkitError("model directory not found", path=str(directory))
        if config is None:
            config = BertConfig.from_json_file(directory / "config.json")
        if config_overrides:
            config = config.replace(**config_overrides)
        weights = directory / WEIGHTS_NAME
        if not weights.is_file() and (directory / WEIGHTS_INDEX_NAME).is_file():
            model = cls(config)
            index = directory / WEIGHTS_INDEX_NAME
            model.load_checkpoint_state(read_sharded_safetensors(index), source=str(index))
            return model
        if not weights.is_file():
            pickled = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt")]
            hint = (f" (found {', '.join(pickled)}: pickle files can run code and are not loaded; "
                    "convert them to safetensors first)") if pickled else ""
            raise BertkitError(f"no {WEIGHTS_NAME}{hint}", path=str(directory))
        model = cls(config)
        model.load_checkpoint_state(read_safetensors(weights), source=str(weights))
        return model

    def load_checkpoint_state(self, ckpt: dict[str, torch.Tensor], source: str = "checkpoint"):
        own = self.state_dict()
        mapped, unexpected = map_checkpoint_keys(ckpt, set(own))
        for key, tensor in mapped.items():
            if tuple(tensor.shape) != tuple(own[key].shape):
                raise BertkitError(
                    f"tensor {key} has shape {tuple(tensor.shape)} in the checkpoint but "
                    f"{tuple(own[key].shape)} in the model (check vocab_size / hidden_size / num_labels)",
                    path=source,
                )
        missing = sorted(set(own) - set(mapped))
        self.load_state_dict(mapped, strict=False)
        if missing or unexpected:
            parts = []
            if missing:
                parts.append(f"newly initialised (not in checkpoint): {', '.join(missing)}")
            if unexpected:
                parts.append(f"unused from checkpoint: {', '.join(sorted(unexpected))}")
            # A new task head, or pre-training heads left behind, is the normal fine-tuning case; a
            # missing or unused encoder weight is not.
            surprising = [k for k in missing + unexpected
                          if k.startswith(("bert.embeddings", "bert.encoder", "embeddings", "encoder"))]
            log.log(logging.WARNING if surprising else logging.INFO, "%s into %s: %s", source,
                    type(self).__name__, "; ".join(parts))
        self.loading_info = {"missing_keys": missing, "unexpected_keys": sorted(unexpected)}
        return self.loading_info


def load_model(directory: str | Path, **config_overrides):
    """Build whichever bertkit class config.json's `architectures` names (BertModel if none)."""
    from .config import BertConfig
    from .heads import TASK_CLASSES

    config = BertConfig.from_json_file(Path(directory) / "config.json")
    name = (config.architectures or ["BertModel"])[0]
    if name == "BertLMHeadModel":
        name = "BertForMaskedLM"
    if name not in TASK_CLASSES:
        raise BertkitError(f"architecture {name!r} is not a bertkit class", path=str(Path(directory) / "config.json"))
    return TASK_CLASSES[name].from_pretrained(directory, config=config, **config_overrides)
