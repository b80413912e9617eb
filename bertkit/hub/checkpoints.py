"""Checkpoints in the Hugging Face layout: config.json + model.safetensors (+ vocab.txt).

Parameter names in the file are exactly transformers' (`bert.encoder.layer.0.attention.self.query.weight`,
`cls.predictions.bias`, ...), so a bertkit model loads in transformers and a transformers BERT
(base model, pre-training model or any task head) loads here. Weights are never unpickled as objects: a
folder with only pytorch_model.bin is read with torch.load(weights_only=True), tensors alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..config import BertConfig
from ..device import parse_dtype, pick_device
from ..errors import BertkitError
from ..finite import check_finite_tensors
from .resolve import hub_id_of, resolve_model
from .model_card import CARD_NAME, is_bertkit_card, write_model_card
from ..outputs import atomic_write, atomic_write_text
from .tf_bert import BERT_CONFIG_NAME, OriginalCheckpoint, is_original_checkpoint
from ..tokenizer import BertTokenizer

log = logging.getLogger("bertkit")

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # sharded checkpoints: tensor name -> shard file
PICKLED_NAME = "pytorch_model.bin"  # transformers' format before safetensors (read as tensors only)
PICKLED_INDEX_NAME = "pytorch_model.bin.index.json"
# Tied to the word embeddings / the output bias: the file may hold them, the model does not.
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
ENCODER_PREFIXES = ("bert.embeddings", "bert.encoder", "embeddings", "encoder")
ALLOW_HINT = ("to use random weights there on purpose, pass --allow-missing-weights (predict, extract-features) "
              "or allow_missing_weights=True")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
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


def pickled_weights(directory: Path) -> Path | None:
    """transformers' older weights file (or its shard index), for folders that have no safetensors."""
    for name in (PICKLED_NAME, PICKLED_INDEX_NAME):
        if (directory / name).is_file():
            return directory / name
    return None


def read_pickled_weights(path: Path) -> dict[str, torch.Tensor]:
    """pytorch_model.bin (or its shards) read with torch.load(weights_only=True): tensors and plain
    containers only, so a pickle cannot run code."""
    log.info("note: %s has no %s; reading %s as tensors only (torch.load weights_only=True)",
             path.parent, WEIGHTS_NAME, path.name)
    if path.name == PICKLED_INDEX_NAME:
        try:
            shards = sorted(set(json.loads(path.read_text(encoding="utf-8"))["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise BertkitError(f"not a weights index with a weight_map ({e})", path=str(path)) from None
        files = [path.parent / shard for shard in shards if Path(shard).name == shard]
    else:
        files = [path]
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            loaded = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - unpickling refusals and corrupt files come as many types
            raise BertkitError(f"cannot read {file.name} as plain tensors ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:160]})", path=str(file)) from None
        if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
            raise BertkitError("not a state dict of tensors", path=str(file))
        tensors.update(loaded)
    return tensors


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
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
        config = dataclasses.replace(self.config, architectures=[type(self).__name__])
        atomic_write_text(directory / "config.json", json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
        if tokenizer is not None:
            save_tokenizer_files(tokenizer, directory, config.max_position_embeddings)
        for name, data in getattr(self, "sentence_transformers_files", {}).items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(directory / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
        write_model_card(directory, config, getattr(self, "base_model_id", None))
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, config=None, require_head: bool = False,
                        allow_missing_weights: bool = False, dtype=None, torch_dtype=None, kernels=None,
                        attn_implementation: str | None = None, revision: str | None = None, device_map=None,
                        **config_overrides):
        """Load weights (and config.json unless `config` is given); overrides, as transformers takes
        them (any BertConfig field: num_labels=3, id2label / label2id, output_hidden_states=True,
        hidden_dropout_prob=0.0 ...; see config_with_overrides), change the config before the model
        is built (a new head is then freshly initialised, and said so in a warning).
        `device_map`: the device the whole model goes to ("cpu", "cuda", "cuda:1", an index, "auto").
        `dtype` (or its old name `torch_dtype`), as transformers: the parameters' dtype, e.g.
        torch.bfloat16 for inference in half the memory; "auto" keeps the file's. `kernels` (a
        kernels.KernelOptions) and `attn_implementation` choose how the model computes (default:
        kernels.default_options()).

        An encoder the checkpoint does not fill exactly (fewer or more layers than config.json says)
        is an error, and with `require_head` (prediction) so is a task head it lacks; random weights
        there would give silently meaningless outputs. `allow_missing_weights` permits both.

        `directory` is a local folder or a Hub id (`bert-base-uncased`, `org/name`, at `revision`)."""
        if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
            raise BertkitError("give dtype or torch_dtype (its old name), not both")
        dtype = dtype if dtype is not None else torch_dtype
        parsed = parse_dtype(dtype)  # refused before anything is read
        directory = resolve_model(directory, revision)
        if not directory.is_dir():
            raise BertkitError("model directory not found", path=str(directory))
        # An original TensorFlow checkpoint folder (bert_config.json, *.ckpt.index) converts in memory.
        original = OriginalCheckpoint.open(directory) if is_original_checkpoint(directory) else None
        if config is None:
            config = (original.config(directory / BERT_CONFIG_NAME) if original
                      else BertConfig.from_json_file(directory / "config.json"))
        device = one_device(device_map)
        if config_overrides:
            config = config_with_overrides(config, config_overrides)
        weights = directory / WEIGHTS_NAME
        index = directory / WEIGHTS_INDEX_NAME
        if original:
            state, source = original.state_dict(), str(original.bundle.index_path)
        elif not weights.is_file() and index.is_file():
            state, source = read_sharded_safetensors(index), str(index)
        elif not weights.is_file() and pickled_weights(directory) is not None:
            state, source = read_pickled_weights(pickled_weights(directory)), str(pickled_weights(directory))
        else:
            if not weights.is_file():
                others = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt")]
                hint = (f" (found {', '.join(others)}: only {PICKLED_NAME} is read, as tensors alone; "
                        "convert others to safetensors first)") if others else ""
                raise BertkitError(f"no {WEIGHTS_NAME}{hint}", path=str(directory))
            state, source = read_safetensors(weights), str(weights)
        model = cls(config, kernels=kernels)
        if attn_implementation is not None:
            model.set_attention_implementation(attn_implementation)
        model.load_checkpoint_state(state, source=source, complete=not allow_missing_weights,
                                    require_head=require_head)
        model.base_model_id = source_model_id(directory)  # the model card's base_model when this one is saved
        if type(model).__name__ == "BertModel":  # an embedding model keeps its pooling / normalisation when saved
            model.sentence_transformers_files = sentence_transformers_files(directory)
        if dtype == "auto":  # the file's floating-point dtype
            parsed = next((t.dtype for t in state.values() if t.is_floating_point()), None)
        model = model.to(parsed) if parsed is not None else model
        return model.to(device) if device is not None else model

    def load_checkpoint_state(self, ckpt: dict[str, torch.Tensor], source: str = "checkpoint",
                              complete: bool = False, require_head: bool = False):
        """Copy checkpoint tensors in; `complete` refuses (see check_complete) instead of reporting gaps."""
        own = self.state_dict()
        mapped, unexpected = map_checkpoint_keys(ckpt, set(own))
        for key, tensor in mapped.items():
            if tuple(tensor.shape) != tuple(own[key].shape):
                raise BertkitError(
                    f"tensor {key} has shape {tuple(tensor.shape)} in the checkpoint but "
                    f"{tuple(own[key].shape)} in the model (check vocab_size / hidden_size / num_labels)",
                    path=source,
                )
        check_finite_tensors(mapped, source)  # a NaN weight would give NaN everywhere, silently
        missing = sorted(set(own) - set(mapped))
        if complete:
            check_complete(missing, sorted(unexpected), self.config, require_head, source)
        self.load_state_dict(mapped, strict=False)
        if missing or unexpected:
            parts = []
            if missing:
                parts.append(f"newly initialised (not in checkpoint): {', '.join(missing)}")
            if unexpected:
                parts.append(f"unused from checkpoint: {', '.join(sorted(unexpected))}")
            # Pre-training heads left behind are the normal fine-tuning case (info); a new head is
            # said aloud, as transformers warns (train it before predicting); a missing or unused
            # encoder weight is a warning too.
            surprising = [k for k in missing + unexpected if k.startswith(ENCODER_PREFIXES)]
            if missing and not surprising:
                parts.append("train this model on a task before using it for predictions")
            log.log(logging.WARNING if surprising or missing else logging.INFO, "%s into %s: %s", source,
                    type(self).__name__, "; ".join(parts))
        self.loading_info = {"missing_keys": missing, "unexpected_keys": sorted(unexpected)}
        return self.loading_info


CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(BertConfig)) - {"extra"}


def config_with_overrides(config: BertConfig, overrides: dict) -> BertConfig:
    """from_pretrained's keyword overrides, as transformers' from_pretrained takes them: any
    BertConfig field; label2id as well as (or instead of) id2label; a num_labels without label
    names gets transformers' LABEL_0, LABEL_1 ... An unknown name is refused, naming it."""
    overrides = dict(overrides)
    unknown = sorted(set(overrides) - CONFIG_FIELDS - {"label2id"})
    if unknown:
        raise BertkitError(f"from_pretrained: unknown argument {unknown[0]!r} (neither a BertConfig field nor a "
                           "loading option)")
    if "label2id" in overrides:
        label2id = overrides.pop("label2id")
        if not isinstance(label2id, dict) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                     for i in label2id.values()):
            raise BertkitError(f"label2id must map label names to ids, not {label2id!r}")
        id2label = {i: name for name, i in label2id.items()}
        given = overrides.get("id2label")
        if given is not None and {int(k): v for k, v in given.items()} != id2label:
            raise BertkitError("id2label and label2id disagree: give one of them")
        overrides["id2label"] = id2label
    labels = overrides.get("num_labels")
    if (isinstance(labels, int) and not isinstance(labels, bool) and labels > 0 and "id2label" not in overrides
            and (config.id2label is None or len(config.id2label) != labels)):
        overrides["id2label"] = {i: f"LABEL_{i}" for i in range(labels)}
    if "id2label" in overrides and "num_labels" in overrides and len(overrides["id2label"]) != labels:
        raise BertkitError(f"num_labels={labels} but id2label names {len(overrides['id2label'])} labels")
    return config.replace(**overrides)


def one_device(device_map) -> torch.device | None:
    """transformers' `device_map` when it names one device for the whole model (bertkit does not
    split a model across devices)."""
    if device_map is None:
        return None
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        device_map = f"cuda:{device_map}"
    if isinstance(device_map, torch.device):
        device_map = str(device_map)
    if not isinstance(device_map, str):
        raise BertkitError(f"device_map must name one device (cpu, cuda, cuda:N, auto), not {device_map!r}: "
                           "bertkit keeps a model on one device")
    return pick_device(device_map)


def source_model_id(directory: Path) -> str | None:
    """The Hub id a loaded folder stands for: its own (a cached snapshot), else the base model its
    bertkit model card names (a local fine-tuning or checkpoint of a Hub model)."""
    own = hub_id_of(directory)
    if own:
        return own
    card = directory / CARD_NAME
    if card.is_file() and is_bertkit_card(card):
        for line in card.read_text(encoding="utf-8").splitlines():
            if line.startswith("base_model:"):
                return line.split(":", 1)[1].strip().strip('"') or None
    return None


SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                               "1_Pooling/config.json")


def sentence_transformers_files(directory: Path) -> dict[str, bytes]:
    """A sentence-transformers folder's module files (pooling, normalisation) by relative name."""
    if not (directory / "modules.json").is_file():
        return {}
    return {name: (directory / name).read_bytes() for name in SENTENCE_TRANSFORMERS_FILES
            if (directory / name).is_file()}


def save_tokenizer_files(tokenizer, directory: Path, max_positions: int) -> None:
    """vocab.txt, tokenizer_config.json and special_tokens_map.json, as transformers' AutoTokenizer reads
    them; model_max_length is the model's own position limit (transformers truncates to it)."""
    tokenizer.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    settings = json.loads(config_path.read_text(encoding="utf-8"))
    settings["model_max_length"] = min(int(settings.get("model_max_length") or max_positions), max_positions)
    atomic_write_text(config_path, json.dumps(settings, indent=2) + "\n")
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
               "mask_token": "[MASK]"}
    atomic_write_text(directory / "special_tokens_map.json", json.dumps(special, indent=2) + "\n")


def _shown(keys: list[str], limit: int = 3) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def check_complete(missing: list[str], unexpected: list[str], config, require_head: bool, source: str) -> None:
    """Refuse a load that leaves encoder weights random or unused (or, with require_head, the task head)."""
    encoder_missing = [k for k in missing if k.startswith(ENCODER_PREFIXES)]
    encoder_unused = [k for k in unexpected if k.startswith(ENCODER_PREFIXES)]
    if encoder_missing or encoder_unused:
        what = (f"has no weights for {_shown(encoder_missing)}" if encoder_missing
                else f"holds encoder weights the model does not use ({_shown(encoder_unused)})")
        raise BertkitError(f"checkpoint {what}: it does not match config.json's {config.num_hidden_layers} layers "
                           f"of size {config.hidden_size}; {ALLOW_HINT}", path=source)
    head_missing = [k for k in missing if not k.startswith(ENCODER_PREFIXES)]
    if require_head and head_missing:
        raise BertkitError(f"checkpoint has no task head ({_shown(head_missing)}): predictions would come from "
                           f"random weights (fine-tune it first); {ALLOW_HINT}", path=source)


def model_tokenizer(directory: str | Path, do_lower_case: bool | None = None, revision: str | None = None):
    """The model folder's (or Hub id's) tokenizer, checked against its config.json: every id the tokenizer
    gives must have a row in the embedding matrix (a foreign vocab.txt fails here, not mid-training)."""
    directory = resolve_model(directory, revision, tokenizer_only=True)
    tokenizer = BertTokenizer.from_pretrained(directory, do_lower_case=do_lower_case)
    config_file = Path(directory) / "config.json"
    if config_file.is_file():
        vocab_size = BertConfig.from_json_file(config_file).vocab_size
        if len(tokenizer) > vocab_size:  # added tokens count: their ids must have embedding rows
            raise BertkitError(f"vocabulary has {len(tokenizer)} entries but config.json's vocab_size is "
                               f"{vocab_size}: is this the model's own vocab.txt (after added tokens, "
                               "model.resize_token_embeddings(len(tokenizer)))?", path=str(tokenizer.vocab_file))
    return tokenizer


def load_tokenizer(model_dir: str | Path, cased: bool | None = None, revision: str | None = None):
    """The model directory's tokenizer; `cased` (--cased / --uncased) overrides its do_lower_case."""
    tokenizer = model_tokenizer(model_dir, do_lower_case=None if cased is None else not cased, revision=revision)
    if cased:
        upper_case_pieces = sum(any(c.isupper() for c in t) for t in tokenizer.ids_to_tokens if not t.startswith("["))
        if upper_case_pieces < 0.001 * tokenizer.vocab_size:  # cased English vocabularies have thousands
            log.warning("--cased with a vocabulary that has (almost) no upper-case pieces: capitalised words "
                        "will become [UNK] or be split badly")
    return tokenizer
