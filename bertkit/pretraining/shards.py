"""Pre-training data on disk: sharded NumPy arrays + ``manifest.json``, and the loader.

Layout of an output directory::

    manifest.json              written last; a directory without it is not a dataset
    vocab.txt                  copy of the vocabulary the ids refer to
    shard_00000/               one directory per shard, N rows each
        input_ids.npy          (N, T) uint16 (int32 when the vocabulary has > 65,536 entries),
                               padded with [PAD]; masked already when masking is static
        lengths.npy            (N,) uint16, real tokens including [CLS]/[SEP]
        b_starts.npy           (N,) uint16, position of B's first token (segment ids are 1 from
                               here up to the length; no full segment array is stored)
        next_sentence_labels.npy (N,) uint8, 0 = IsNext, 1 = NotNext (transformers' labels)
      static masking only:
        masked_lm_positions.npy (N, P) uint16, ascending, zero-padded
        masked_lm_ids.npy      (N, P) original ids at those positions (the MLM labels)
        masked_lm_counts.npy   (N,) uint8, valid entries per row

Every shard is written under a temporary name and renamed into place, the manifest last, so a
crash never leaves a directory that looks complete. The reader memory-maps the arrays.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import BertkitError
from ..tokenizer import load_vocab
from .instances import PairArrays, truncate_pair_spans
from .masking import mask_batch, parse_mask_mix
from .objectives import BatchRows, Objective, resolve_objective

FORMAT_NAME = "bertkit-pretraining-data"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARD_PREFIX = "shard_"
PAIR_ARRAYS = ("input_ids", "lengths", "b_starts", "next_sentence_labels")
MASK_ARRAYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_counts")


def id_dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of ints/strings, the same in every process and Python run."""
    digest = hashlib.sha256(repr(tuple(parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative whole number, found {value!r}")
    return value


class ShardWriter:
    """Buffers instances and writes full shards of `shard_size` rows (the last may be short)."""

    def __init__(self, output_dir: str | os.PathLike, *, max_seq_length: int, max_predictions: int,
                 vocab_size: int, static_masks: bool, shard_size: int = 65536):
        if shard_size < 1:
            raise BertkitError("shard size must be at least 1")
        self.output_dir = Path(output_dir)
        self.max_seq_length = max_seq_length
        self.max_predictions = max_predictions
        self.id_dtype = id_dtype_for(vocab_size)
        self.static_masks = static_masks
        self.shard_size = shard_size
        self.shards: list[dict] = []
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0

    def add(self, pairs: PairArrays, masks: dict[str, np.ndarray] | None = None) -> None:
        """Append rows; `masks` holds the three static-mask arrays when masking is static."""
        arrays = {
            "input_ids": pairs.input_ids,
            "lengths": pairs.lengths,
            "b_starts": pairs.b_starts,
            "next_sentence_labels": pairs.next_sentence_labels,
        }
        if self.static_masks:
            if masks is None:
                raise ValueError("static masking needs the mask arrays")
            arrays.update(masks)
        self._pending.append(arrays)
        self._pending_rows += len(pairs.lengths)
        while self._pending_rows >= self.shard_size:
            self._write_shard(self.shard_size)

    def close(self) -> list[dict]:
        if self._pending_rows:
            self._write_shard(self._pending_rows)
        return self.shards

    def _take(self, rows: int) -> dict[str, np.ndarray]:
        merged = {key: np.concatenate([a[key] for a in self._pending]) for key in self._pending[0]}
        taken = {key: value[:rows] for key, value in merged.items()}
        rest = {key: value[rows:] for key, value in merged.items()}
        self._pending_rows -= rows
        self._pending = [rest] if self._pending_rows else []
        return taken

    def _write_shard(self, rows: int) -> None:
        arrays = self._take(rows)
        name = f"{SHARD_PREFIX}{len(self.shards):05d}"
        final = self.output_dir / name
        tmp = self.output_dir / (name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        dtypes = {
            "input_ids": self.id_dtype,
            "lengths": np.uint16,
            "b_starts": np.uint16,
            "next_sentence_labels": np.uint8,
            "masked_lm_positions": np.uint16,
            "masked_lm_ids": self.id_dtype,
            "masked_lm_counts": np.uint8,
        }
        for key, value in arrays.items():
            np.save(tmp / f"{key}.npy", np.ascontiguousarray(value, dtype=dtypes[key]))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.shards.append({"name": name, "instances": rows})


def clear_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Make `output_dir` ready for a new dataset; refuse to clobber one unless asked."""
    if output_dir.exists() and not output_dir.is_dir():
        raise BertkitError("output path exists and is not a directory", path=str(output_dir))
    output_dir.mkdir(parents=True, exist_ok=True)
    old = [p for p in output_dir.iterdir() if p.name == MANIFEST_NAME or p.name.startswith(SHARD_PREFIX)]
    if old and not overwrite:
        raise BertkitError("output directory already holds pre-training data; pass --overwrite to replace it",
                           path=str(output_dir))
    # The manifest goes first, so an interrupted clean-up never leaves a valid-looking dataset.
    for path in sorted(old, key=lambda p: p.name != MANIFEST_NAME):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


class PretrainingDataset:
    """A created pre-training data directory, memory-mapped.

    ``get_batch(indices, ...)`` returns a dict of torch tensors ready for
    ``BertForPreTraining(**batch)``.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST_NAME
        if not manifest_path.is_file():
            raise BertkitError("no manifest.json: not a pre-training data directory (or its creation did not finish)",
                               path=str(self.directory))
        try:
            self.manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BertkitError(f"manifest is not valid JSON: {exc.msg}", path=str(manifest_path),
                               line=exc.lineno) from None
        if not isinstance(self.manifest, dict):
            raise BertkitError("manifest is not a JSON object", path=str(manifest_path))
        if self.manifest.get("format") != FORMAT_NAME or self.manifest.get("format_version") != FORMAT_VERSION:
            raise BertkitError(
                f"unsupported data format {self.manifest.get('format')!r} "
                f"version {self.manifest.get('format_version')!r}"
                f" (this bertkit reads {FORMAT_NAME!r} version {FORMAT_VERSION})",
                path=str(manifest_path),
            )
        try:
            config, vocab = self.manifest["config"], self.manifest["vocab"]
            self.max_seq_length: int = _manifest_int(config["max_seq_length"])
            self.masking: str = config["masking"]
            self.masked_lm_prob: float = config["masked_lm_prob"]
            self.max_predictions: int = _manifest_int(config["max_predictions_per_seq"])
            self.mask_mix = tuple(config["mask_mix"])
            self.whole_word_mask: bool = config["whole_word_mask"]
            # Where NotNext partners were drawn (create.py); data made before the choice drew from its block.
            self.not_next_partners: str = config.get("not_next_partners", "block")
            self.vocab_size: int = _manifest_int(vocab["size"])
            self.pad_id: int = _manifest_int(vocab["pad_id"])
            self.cls_id: int = _manifest_int(vocab["cls_id"])
            self.sep_id: int = _manifest_int(vocab["sep_id"])
            self.mask_id: int = _manifest_int(vocab["mask_id"])
            shards = [(str(s["name"]), _manifest_int(s["instances"])) for s in self.manifest["shards"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BertkitError(f"manifest is incomplete or malformed ({type(exc).__name__}: {exc})",
                               path=str(manifest_path)) from None
        if self.masking not in ("static", "dynamic"):
            raise BertkitError(f"manifest masking {self.masking!r} is not 'static' or 'dynamic'", path=str(manifest_path))
        self._check_vocabulary(vocab)
        names = PAIR_ARRAYS + (MASK_ARRAYS if self.masking == "static" else ())
        self._shards: list[dict[str, np.ndarray]] = []
        for name, instances in shards:
            arrays = {key: self._load_array(self.directory / name / f"{key}.npy", instances) for key in names}
            self._check_shard(arrays, self.directory / name)
            self._shards.append(arrays)
        counts = [instances for _, instances in shards]
        self._shard_ends = np.cumsum(counts, dtype=np.int64)
        self._continuation: torch.Tensor | None = None

    def _check_vocabulary(self, vocab: dict) -> None:
        """The vocabulary copy is the one the ids were made with: same SHA-256 and size as recorded."""
        path = self.directory / str(vocab.get("file", "vocab.txt"))
        if not path.is_file():
            raise BertkitError("vocabulary copy missing from the data directory", path=str(path))
        recorded = vocab.get("sha256")
        if recorded is not None and sha256_file(path) != recorded:
            raise BertkitError("vocabulary differs from the one the data was made with (SHA-256 does not match "
                               "manifest.json); recreate the data or restore its vocab.txt", path=str(path))
        entries = len(load_vocab(path))
        if entries != self.vocab_size:
            raise BertkitError(f"vocabulary has {entries} entries, manifest.json says {self.vocab_size}", path=str(path))
        if max(self.pad_id, self.cls_id, self.sep_id, self.mask_id) >= self.vocab_size:
            raise BertkitError("manifest's special token ids lie outside the vocabulary", path=str(path))

    @staticmethod
    def _load_array(path: Path, rows: int) -> np.ndarray:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise BertkitError("shard file listed in the manifest is missing", path=str(path)) from None
        except (ValueError, OSError, EOFError) as exc:  # truncated or not a .npy file
            raise BertkitError(f"corrupt shard array ({exc})", path=str(path)) from None
        if array.ndim == 0 or len(array) != rows:
            raise BertkitError(f"shard has {0 if array.ndim == 0 else len(array)} rows, manifest says {rows}",
                               path=str(path))
        if not np.issubdtype(array.dtype, np.integer):
            raise BertkitError(f"shard array has dtype {array.dtype}, expected integers", path=str(path))
        return array

    def _check_shard(self, arrays: dict[str, np.ndarray], folder: Path) -> None:
        """Shapes and value ranges, so a damaged shard fails here, not as an IndexError mid-training."""
        ids = arrays["input_ids"]
        if ids.ndim != 2 or ids.shape[1] != self.max_seq_length:
            raise BertkitError(f"input_ids has shape {ids.shape}, expected (rows, {self.max_seq_length})",
                               path=str(folder / "input_ids.npy"))
        for key in ("input_ids", "masked_lm_ids"):
            if key in arrays and arrays[key].size and int(arrays[key].max()) >= self.vocab_size:
                raise BertkitError(f"{key} holds token id {int(arrays[key].max())}, beyond the vocabulary's "
                                   f"{self.vocab_size} entries", path=str(folder / f"{key}.npy"))
        lengths = arrays["lengths"]
        if lengths.size and (int(lengths.max()) > self.max_seq_length or int(lengths.min()) < 1):
            raise BertkitError(f"lengths outside 1..{self.max_seq_length}", path=str(folder / "lengths.npy"))
        if "masked_lm_positions" in arrays:
            positions = arrays["masked_lm_positions"]
            if positions.ndim != 2 or (positions.size and int(positions.max()) >= self.max_seq_length):
                raise BertkitError("masked_lm_positions outside the sequence", path=str(folder / "masked_lm_positions.npy"))

    def __len__(self) -> int:
        return int(self._shard_ends[-1]) if len(self._shard_ends) else 0

    def continuation_table(self) -> torch.Tensor:
        """(V,) bool: which vocabulary ids are ``##`` pieces (for whole-word masking)."""
        if self._continuation is None:
            vocab_path = self.directory / self.manifest["vocab"]["file"]
            try:
                tokens = vocab_path.read_text(encoding="utf-8").splitlines()
            except FileNotFoundError:
                raise BertkitError("vocabulary copy missing from the data directory", path=str(vocab_path)) from None
            self._continuation = torch.tensor([t.startswith("##") for t in tokens], dtype=torch.bool)
        return self._continuation

    def rows(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The stored arrays for the given instance indices (in that order), as int64 arrays."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"instance index out of range 0..{len(self) - 1}")
        shard_of = np.searchsorted(self._shard_ends, indices, side="right")
        starts = np.concatenate([[0], self._shard_ends[:-1]])
        out: dict[str, np.ndarray] = {}
        for shard_index in np.unique(shard_of):
            picked = np.nonzero(shard_of == shard_index)[0]
            local = indices[picked] - starts[shard_index]
            for key, array in self._shards[shard_index].items():
                if key not in out:
                    out[key] = np.empty((len(indices),) + array.shape[1:], dtype=np.int64)
                out[key][picked] = array[local]
        return out

    def _cut_pairs(self, raw: dict[str, np.ndarray], max_length: int, generator: torch.Generator | None
                   ) -> dict[str, np.ndarray]:
        """[CLS] A [SEP] B [SEP] rows cut to `max_length` tokens, A and B trimmed as the data was."""
        if max_length < 5:
            raise BertkitError(f"cannot cut sentence pairs to {max_length} tokens (at least 5)")
        seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if generator is not None else 0
        rng = random.Random(seed)
        ids = np.full((len(raw["lengths"]), max_length), self.pad_id, dtype=np.int64)
        lengths, b_starts = raw["lengths"].copy(), raw["b_starts"].copy()
        for row, (length, b_start) in enumerate(zip(raw["lengths"], raw["b_starts"])):
            a0, a1, b0, b1 = truncate_pair_spans(1, int(b_start) - 1, int(b_start), int(length) - 1,
                                                 max_length - 3, rng)
            source = raw["input_ids"][row].copy()
            if "masked_lm_counts" in raw:  # static data: put the stored masks' tokens back before cutting
                count = int(raw["masked_lm_counts"][row])
                source[raw["masked_lm_positions"][row, :count]] = raw["masked_lm_ids"][row, :count]
            cut = np.concatenate([[self.cls_id], source[a0:a1], [self.sep_id], source[b0:b1], [self.sep_id]])
            ids[row, :len(cut)] = cut
            lengths[row], b_starts[row] = len(cut), a1 - a0 + 2
        out = {**raw, "input_ids": ids, "lengths": lengths, "b_starts": b_starts}
        if "masked_lm_counts" in raw:
            out["masked_lm_counts"] = np.zeros_like(raw["masked_lm_counts"])
        return out

    def get_batch(
        self,
        indices: Sequence[int] | np.ndarray,
        *,
        generator: torch.Generator | None = None,
        masking: str | None = None,
        masked_lm_prob: float | None = None,
        max_predictions: int | None = None,
        mask_mix: Sequence[float] | None = None,
        whole_word: bool | None = None,
        objective: Objective | str = "mlm",
        nsp: bool = True,
        trim: bool = True,
        max_length: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """A batch as torch tensors: input_ids, token_type_ids, attention_mask, and the objective's
        labels (objectives/: masked tokens, or the next token for "ltr") and next_sentence_label
        when it has NSP. `objective`: an Objective or its name ("mlm" with `nsp=False`: MLM only).

        masking: "static" uses the stored masks (only for data created with static masking);
        "dynamic" draws masks now with `generator` (stored static masks are undone first).
        Default: the dataset's own mode. The masking overrides (prob, max predictions, mix,
        whole word) need dynamic masking. `trim` cuts the batch to its longest row. `max_length`
        (dynamic masking) first cuts each pair to that many tokens the way the data was made (the
        original's truncate_seq_pair): a short-sequence phase from the same data.
        """
        objective = resolve_objective(objective, nsp)
        masking = masking or self.masking
        self._check_masking(masking, objective, {"masked_lm_prob": masked_lm_prob, "max_predictions": max_predictions,
                                                 "mask_mix": mask_mix, "whole_word": whole_word})
        raw = self._rows_at(indices, objective, masking, max_length, generator)
        lengths = raw["lengths"]
        width = int(lengths.max()) if trim and len(lengths) else self.max_seq_length
        ids = np.ascontiguousarray(raw["input_ids"][:, :width])
        positions = np.arange(width)[None, :]
        attention = positions < lengths[:, None]
        token_types = (positions >= raw["b_starts"][:, None]) & attention
        stored = self._stored_masks(raw, ids, undo=masking == "dynamic" or not objective.masked)
        draw_masks = self._mask_drawer(generator, masked_lm_prob, max_predictions, mask_mix, whole_word)
        # [CLS], the middle [SEP], the final [SEP] and padding are never predicted.
        special = ((positions == 0) | (positions == raw["b_starts"][:, None] - 1)
                   | (positions >= lengths[:, None] - 1))
        input_ids, labels = objective.inputs_and_labels(BatchRows(
            input_ids=torch.from_numpy(ids), special=torch.from_numpy(special), lengths=lengths,
            positions=positions, masking=masking, stored=stored, draw_masks=draw_masks))
        batch: dict[str, torch.Tensor] = {"input_ids": input_ids}
        batch["token_type_ids"] = torch.from_numpy(token_types.astype(np.int64))
        batch["attention_mask"] = torch.from_numpy(attention.astype(np.int64))
        batch["labels"] = labels
        if objective.nsp:
            batch["next_sentence_label"] = torch.from_numpy(raw["next_sentence_labels"])
        return batch

    def _check_masking(self, masking: str, objective: Objective, overrides: dict) -> None:
        """Static masking needs stored masks, and takes no override that differs from them."""
        if masking not in ("static", "dynamic"):
            raise BertkitError(f"masking must be 'static' or 'dynamic', not {masking!r}")
        if masking == "static" and self.masking != "static":
            raise BertkitError("this data was created with dynamic masking: it stores no masks",
                               path=str(self.directory))
        if masking == "static" and objective.masked:
            stored = {"masked_lm_prob": self.masked_lm_prob, "max_predictions": self.max_predictions,
                      "mask_mix": self.mask_mix, "whole_word": self.whole_word_mask}
            for key, value in overrides.items():
                wanted = parse_mask_mix(value) if key == "mask_mix" and value is not None else value
                if wanted is not None and wanted != stored[key]:
                    raise BertkitError(f"{key}={value!r} differs from the stored static masks ({stored[key]!r}); "
                                       "use masking='dynamic' to draw new masks at load time")

    def _rows_at(self, indices, objective: Objective, masking: str, max_length: int | None,
                 generator: torch.Generator | None) -> dict:
        """The stored rows, each pair cut to `max_length` where that is shorter than the data's."""
        raw = self.rows(indices)
        if max_length is not None and max_length < self.max_seq_length:
            # The cut puts stored masks' tokens back, so MLM must draw new masks; LTR needs none.
            if objective.masked and masking != "dynamic":
                raise BertkitError("cutting instances to a shorter length needs dynamic MLM masking (or an "
                                   "objective without masks, such as LTR)")
            raw = self._cut_pairs(raw, max_length, generator)
        return raw

    def _stored_masks(self, raw: dict, ids: np.ndarray, undo: bool):
        """Static data's masks as (rows, positions, original ids), None for dynamic data; with `undo`
        the original tokens are put back into `ids` (new masks are drawn, or none are needed)."""
        if self.masking != "static":
            return None
        valid = np.arange(raw["masked_lm_positions"].shape[1])[None, :] < raw["masked_lm_counts"][:, None]
        stored = (np.nonzero(valid)[0], raw["masked_lm_positions"][valid], raw["masked_lm_ids"][valid])
        if undo:
            ids[stored[0], stored[1]] = stored[2]
        return stored

    def _mask_drawer(self, generator, masked_lm_prob, max_predictions, mask_mix, whole_word):
        """draw_masks(input_ids, special): new MLM masks with the dataset's settings, or the overrides."""
        mix = parse_mask_mix(mask_mix) if mask_mix is not None else self.mask_mix
        use_whole_word = self.whole_word_mask if whole_word is None else whole_word

        def draw_masks(input_ids: torch.Tensor, special: torch.Tensor):
            return mask_batch(
                input_ids,
                special,
                generator,
                self.masked_lm_prob if masked_lm_prob is None else masked_lm_prob,
                self.max_predictions if max_predictions is None else max_predictions,
                mix,
                vocab_size=self.vocab_size,
                mask_id=self.mask_id,
                whole_word=use_whole_word,
                is_continuation=self.continuation_table() if use_whole_word else None,
            )

        return draw_masks


class PretrainingBatchSource:
    """Batches for the training loop: ``num_batches(epoch)`` and ``batches(epoch, start=0)``.

    Each epoch visits the instances in a fresh random order (a permutation seeded by
    (seed, epoch)). Global batch b holds permutation entries ``[b*B*W, (b+1)*B*W)``; rank r
    takes its own contiguous slice of B of them, so ranks never overlap and each reads only
    its rows. `batch_size` is the per-rank batch. Dynamic masks are drawn with a generator
    seeded by (seed, epoch, batch index, rank): a new mask every epoch, the same on a rerun
    and when resuming at `start`. Without `drop_last` the last global batch is cut evenly
    across ranks, topped up from the start of the permutation so that all ranks get the
    same number of batches (as torch's DistributedSampler does).
    """

    def __init__(
        self,
        dataset: PretrainingDataset,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        *,
        mask_mix: Sequence[float] | str | None = None,
        objective: Objective | str = "mlm",
        nsp: bool = True,
        **batch_options,
    ):
        """`batch_options`: get_batch's (masking, masked_lm_prob, max_predictions, whole_word, trim,
        max_length), checked on the first instance here."""
        if batch_size < 1:
            raise BertkitError("batch size must be at least 1")
        if not 0 <= rank < world_size:
            raise BertkitError(f"rank {rank} outside world size {world_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.options = dict(batch_options, mask_mix=parse_mask_mix(mask_mix) if mask_mix is not None else None,
                            objective=resolve_objective(objective, nsp))
        # Fail now, not at the first batch, on options the data cannot serve.
        if len(dataset):
            dataset.get_batch([0], generator=torch.Generator().manual_seed(0), **self.options)
        if self.num_batches(0) == 0:
            raise BertkitError(f"{len(dataset)} instances are fewer than one batch of {batch_size * world_size}")

    def num_batches(self, epoch: int) -> int:
        global_batch = self.batch_size * self.world_size
        if self.drop_last:
            return len(self.dataset) // global_batch
        return math.ceil(len(self.dataset) / global_batch)

    def _permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "order", epoch))
        return torch.randperm(len(self.dataset), generator=generator)

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        order = self._permutation(epoch).numpy()
        total = len(order)
        global_batch = self.batch_size * self.world_size
        for index in range(start, self.num_batches(epoch)):
            first = index * global_batch
            if first + global_batch <= total:
                mine = order[first + self.rank * self.batch_size: first + (self.rank + 1) * self.batch_size]
            else:
                # Last, partial global batch: an even share per rank, padded by wrapping around.
                per_rank = math.ceil((total - first) / self.world_size)
                picked = np.take(order, np.arange(first, first + per_rank * self.world_size), mode="wrap")
                mine = picked[self.rank * per_rank:(self.rank + 1) * per_rank]
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "mask", epoch, index, self.rank))
            yield self.dataset.get_batch(mine, generator=generator, **self.options)
