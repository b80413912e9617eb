"""One inference engine for `predict`, `pipeline()` and `serve`: a model folder in, model outputs out.

The engine loads whichever head config.json's `architectures` names, with its tokenizer (vocab.txt
or tokenizer.json) and, for a sentence-transformers folder, its pooling and normalisation. Rows
run without gradients in length-grouped batches bounded by a token budget; each batch is padded
to a length rounded up to `LENGTH_BUCKET` and unpadded inside the model (loaded holding kernel
options that always unpad: the kernels package), so the matrix row counts oneDNN sees come from a
small set: it generates and caches code per distinct shape, and an unbounded set of shapes grew a
long run's memory to gigabytes. A batch of one input (a lone request: a search box, an API client)
is padded only to a multiple of `SINGLE_LENGTH_BUCKET` and runs padded (36 tokens padded to 48 and
unpadded was a third more work than 40); `warm_up` makes those shapes' kernels before the first
request, so that it is not the one that waits for them. Where the fp32 GEMMs are bertkit's AVX2 op
(the avx2 class: `shapes_free`), nothing is made per shape: a lone input runs at its own length,
unmasked, and an unpadded count is rounded to a multiple of 8 only.
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .. import kernels
from ..batching import LENGTH_BUCKET, SINGLE_LENGTH_BUCKET, length_grouped_batches, pack_rows, pad_rows, padded_length
from ..device import DEFAULT_PRECISION, autocast, pick_device, resolve_precision
from ..errors import BertkitError
from ..hub.resolve import resolve_model
from ..heads import load_model
from ..kernels.int8 import QUANTIZE_CHOICES, quantize_int8, seven_bit_default
from ..kernels.layout import UNPAD_FINE_MULTIPLE
from ..kernels.options import HoldsKernelOptions
from ..kernels.packed import packing_mode
from .frozen import freeze_encoders
from ..tokenizer import BertTokenizer

# oneDNN generates kernels per shape and keeps them in a process-wide cache (1024 entries by
# default); capped, it cannot grow with the variety of lengths clients send. (ideep, torch's
# wrapper, has a second cache, LRU_CACHE_CAPACITY: capped at 64 it thrashed and ran several
# times slower, so it keeps its default; the bucketed shapes below keep it small instead.)
# oneDNN reads the variable when it first makes a kernel, after `serve` and `predict` import this.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")


def release_free_memory() -> None:
    """Hand freed heap pages back to the system (glibc's malloc_trim). Batches of ever-changing
    sizes leave the heap fragmented: without this, a long-running server's resident set creeps up."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def resident_bytes() -> int | None:
    """This process's resident set (Linux's /proc/self/statm), None where there is none to read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


class FreeMemoryReleaser:
    """`release_free_memory` once the resident set has grown `growth` bytes past where the last
    release left it. A release hands back the pages the next forward pass would fault in again:
    a lone all-MiniLM-L6-v2 request after one took 4-7% longer (fp32 / int8, 2-core Xeon). A lone
    request's pages (~3 MB) stay; a large batch's, or a heap fragmenting over many, go. Counted
    from the resident set at construction (nothing released then: a server's first request would
    fault its pages in again after its warm-up)."""

    def __init__(self, growth: int = 16 << 20, resident=resident_bytes, release=release_free_memory):
        self.growth, self._resident, self._release = growth, resident, release
        self.left_at = resident()

    def release(self) -> None:
        self._release()
        self.left_at = self._resident()

    def release_if_grown(self) -> bool:
        now = self._resident()
        if now is not None and self.left_at is not None and now - self.left_at <= self.growth:
            return False
        self.release()
        return True


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): nothing to do
        return None


_LIBC = _glibc()
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

OUTPUT_ALIASES = {"logits": "prediction_logits"}
WARM_UP_LENGTHS = tuple(range(SINGLE_LENGTH_BUCKET, 129, SINGLE_LENGTH_BUCKET))  # the lone lengths warm_up runs
ROW_MULTIPLE = 64  # unpadded token counts are rounded up to a multiple of this (oneDNN shapes)
FINE_ROWS = WARM_UP_LENGTHS[-1]  # ... but counts up to this one to a multiple of 8, as lone inputs are padded
# A few inputs to a compiled graph that packs (inference/compiled.py) go in one row of their real
# tokens; more run the unpadded eager path. Heads whose every output is per token, and a classifier,
# whose graph is told where each input's first token lies (the pre-training head's and a multiple
# choice head's are not).
PACKED_TASKS = ("feature-extraction", "sentence-embeddings", "token-classification", "question-answering")


def engine_kernels(options: kernels.KernelOptions, unpad: str = "always") -> kernels.KernelOptions:
    """`options` as the engine runs its model: unpadded ("always" on the CPU), the token count
    rounded to ROW_MULTIPLE, or to a multiple of 8 up to FINE_ROWS; to a multiple of 8 at any count
    where the CPU's GEMMs make nothing per shape (`shapes_free`)."""
    multiple = UNPAD_FINE_MULTIPLE if unpad == "always" and shapes_free(options) else ROW_MULTIPLE
    return options.replace(unpad=unpad, unpad_multiple=multiple, unpad_fine_rows=FINE_ROWS)


def shapes_free(options: kernels.KernelOptions) -> bool:
    """Whether fp32 inference with these options on the CPU meets no kernel made per shape: its GEMMs
    are bertkit's AVX2 op (`packed_weights` "bertkit", which packs once for every row count) and its
    attention the attention op or SDPA. Then the engine pads a lone input not at all (no padding: the
    attention op's unmasked path) and rounds an unpadded count to a multiple of 8, not of 64."""
    return packing_mode(options) == "bertkit"

# The head class -> the task it answers.
TASKS = {
    "BertForSequenceClassification": "text-classification",
    "BertForTokenClassification": "token-classification",
    "BertForQuestionAnswering": "question-answering",
    "BertForMaskedLM": "fill-mask",
    "BertForPreTraining": "fill-mask",
    "BertForMultipleChoice": "multiple-choice",
    "BertModel": "feature-extraction",
}


POOLING_KEYS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens"}


@dataclass
class Pooling:
    """How a sentence embedding is made from token vectors (sentence-transformers' Pooling)."""

    mode: str = "mean"  # "mean" | "cls" | "max"
    normalize: bool = False


def read_pooling(model_dir: Path) -> Pooling | None:
    """The pooling of a sentence-transformers folder (modules.json + 1_Pooling/config.json), else None."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        pooling_dir = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
        config = json.loads((model_dir / pooling_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        raise BertkitError(f"cannot read the sentence-transformers pooling ({e})", path=str(modules_file)) from None
    normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
    for mode, key in POOLING_KEYS.items():
        if config.get(key):
            return Pooling(mode, normalize)
    raise BertkitError("only mean, cls or max pooling is supported", path=str(model_dir / pooling_dir / "config.json"))


def _max_length_of(model_dir: Path, config) -> int:
    """Positions the model takes: its position table, or less where the folder says so."""
    limit = config.max_position_embeddings
    sbert = model_dir / "sentence_bert_config.json"
    if sbert.is_file():
        try:
            limit = min(limit, int(json.loads(sbert.read_text(encoding="utf-8"))["max_seq_length"]))
        except (ValueError, KeyError, TypeError):
            raise BertkitError("max_seq_length must be an integer", path=str(sbert)) from None
    return limit


class InferenceEngine:
    """A model folder ready to answer: `forward(rows)` for model outputs, the task helpers on top."""

    def __init__(self, model_dir: str | Path | None, device: str = "auto", precision: str = DEFAULT_PRECISION,
                 max_batch_tokens: int = 16384, max_batch_size: int = 256, quantize: str = "none",
                 model=None, tokenizer=None, revision: str | None = None, compile: bool = False):
        """quantize "int8": the encoder's Linear layers in dynamic int8 (kernels/int8.py), CPU, fp32
        activations; "none" keeps the checkpoint's weights as they are.

        `compile`: a lone input (at bf16 and int8 up to four) runs through a graph compiled ahead for this
        model and CPU (inference/compiled.py; fp32, bf16 or int8 on the CPU, int8 with VNNI, AMX or AVX2; compiled
        once, by `warm_up` or the first call, then loaded from the compile cache); larger batches keep
        the eager model.

        `model`: an already built bertkit model object instead of a folder (it is moved to the
        device and put in eval mode, as transformers' pipeline does, and from then on unpads every
        batch: its kernel options' `unpad`; with quantize "int8" a copy is quantised, the caller's
        model is left as it was); `tokenizer`: a BertTokenizer
        or the folder of one (default: the model folder's). `model_dir` may be a Hub id (at `revision`)."""
        self.model_dir = resolve_model(model_dir, revision) if model_dir is not None else None
        if model is None and (self.model_dir is None or not self.model_dir.is_dir()):
            raise BertkitError("model directory not found", path=str(self.model_dir))
        if quantize not in QUANTIZE_CHOICES:
            raise BertkitError(f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, not {quantize!r}")
        self.device = pick_device(device)
        if quantize == "int8" and (self.device.type != "cpu" or precision == "bf16"):
            raise BertkitError("int8 quantisation runs on the CPU with fp32 activations: drop --device / --precision bf16")
        # On the CPU always unpadded, the token count rounded to ROW_MULTIPLE: a few GEMM shapes for
        # oneDNN; up to the longest warmed-up lone input, to a multiple of 8 only: the row counts lone
        # inputs make anyway. On a GPU the model's own choice ("auto": SDPA on the padded batch,
        # kernels/layout.py).
        unpad = "always" if self.device.type == "cpu" else "auto"
        own_model = False
        if model is None:
            model = load_model(self.model_dir, require_head=True, kernels=engine_kernels(kernels.default_options(), unpad))
            own_model = True
        elif type(model).__name__ not in TASKS:
            raise BertkitError(f"model must be a bertkit model ({', '.join(TASKS)}), not {type(model).__name__}")
        else:  # a given model keeps its other options (it was built with them)
            if quantize == "int8":  # quantised as a copy: the caller's model keeps its fp32 weights
                model = copy.deepcopy(model)
            model.hold_kernels(engine_kernels(model.kernels, unpad))
        self.model = model.to(self.device).eval()
        self.quantize = quantize
        if quantize == "int8":
            quantize_int8(self.model, seven_bit=seven_bit_default())
            precision = "fp32"
        if own_model:
            # A model nobody else holds: its encoder's inference forward as one flat loop over the
            # packed weights (inference/frozen.py); int8 layers and a caller's model keep the modules.
            freeze_encoders(self.model)
        self.config = self.model.config
        self.precision = resolve_precision(precision, self.device)
        # the kernel options the model computes with (held by its modules: BertPreTrainedModel.hold_kernels)
        self.kernels = next((m.kernels for m in self.model.modules() if isinstance(m, HoldsKernelOptions)), None)
        # A lone input's padded length: a multiple of SINGLE_LENGTH_BUCKET (few oneDNN shapes), or its
        # own where the fp32 kernels make nothing per shape (int8's fbgemm keeps the buckets)
        free = self.device.type == "cpu" and quantize == "none" and self.precision == "fp32" \
            and self.kernels is not None and shapes_free(self.kernels)
        self.lone_bucket = 1 if free else SINGLE_LENGTH_BUCKET
        if tokenizer is None:
            if self.model_dir is None:
                raise BertkitError("a model object needs tokenizer= (a BertTokenizer or its folder)")
            tokenizer = self.model_dir
        self.tokenizer = tokenizer if isinstance(tokenizer, BertTokenizer) else BertTokenizer.from_pretrained(tokenizer)
        self.pooling = read_pooling(self.model_dir) if self.model_dir is not None else None
        self.max_length = _max_length_of(self.model_dir, self.config) if self.model_dir is not None \
            else self.config.max_position_embeddings
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.task = TASKS[type(self.model).__name__]
        if self.pooling is not None:
            self.task = "sentence-embeddings"
        self.compile = compile
        self._compiled = None
        if compile:
            if self.device.type != "cpu" or self.precision not in ("fp32", "bf16"):
                raise BertkitError("compile runs fp32, bf16 or int8 on the CPU: drop --device")
            if quantize == "int8":
                from .compiled import check_int8_cpu

                check_int8_cpu()
            if self.task == "multiple-choice":
                raise BertkitError("compile takes one sequence per input; a multiple-choice model runs without it")
            if not own_model:  # a caller's model may change after the graph is compiled from its weights
                raise BertkitError("compile needs a model folder or Hub id, not a model object")

    @property
    def output_keys(self) -> tuple[str, ...]:
        """The outputs the head's answers are made from."""
        if self.task == "question-answering":
            return ("start_logits", "end_logits")
        if self.task in ("feature-extraction", "sentence-embeddings"):
            return ("last_hidden_state",)
        return ("logits",)

    @property
    def id2label(self) -> dict[int, str]:
        labels = self.config.id2label
        return labels if labels else {i: f"LABEL_{i}" for i in range(self.config.num_labels)}

    # ---------------------------------------------------------------- tokenization

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, truncate: bool = True,
               max_length: int | None = None, return_offsets: bool = False) -> list[dict]:
        """Model inputs for texts (and pairs); without `truncate` an over-long text is an error."""
        limit = min(max_length or self.max_length, self.max_length)
        rows = self.tokenizer.encode_batch(texts, pairs, max_length=None if not truncate else limit,
                                           truncation=truncate, return_offsets=return_offsets)
        if not truncate:
            for number, row in enumerate(rows):
                if len(row["input_ids"]) > limit:
                    raise BertkitError(f"input {number} has {len(row['input_ids'])} tokens, more than the "
                                       f"model's {limit}: shorten it or ask for truncation")
        return rows

    # ---------------------------------------------------------------- the forward pass

    @torch.no_grad()
    def forward(self, rows: Sequence[dict], keys: Sequence[str] | None = None,
                on_batch=None) -> list[dict[str, torch.Tensor]]:
        """Per row, the model outputs named by `keys` (default: the head's, `output_keys`) as fp32
        CPU tensors, token-level outputs cut to the row's length; rows run in length-grouped
        batches, each reported to `on_batch(rows, padded_tokens)` when given."""
        keys = keys or self.output_keys
        results: list[dict | None] = [None] * len(rows)
        lengths = [max(map(len, r["input_ids"])) if isinstance(r["input_ids"][0], list) else len(r["input_ids"])
                   for r in rows]
        for indices in length_grouped_batches(lengths, self.max_batch_tokens, self.max_batch_size):
            if on_batch is not None:
                sequences = sum(len(rows[i]["input_ids"]) if isinstance(rows[i]["input_ids"][0], list) else 1
                                for i in indices)
                on_batch(len(indices), len(indices) * padded_length(max(lengths[i] for i in indices), sequences,
                                                                    self.lone_bucket))
            for index, output in zip(indices, self._forward_batch([rows[i] for i in indices], keys)):
                results[index] = output
        return results

    def _compiled_runner(self):
        if self._compiled is None:
            from .compiled import CompiledLoneInput
            from .export import output_names_for

            # Every length the model's positions allow: a lone input's bucket may round past max_length.
            self._compiled = CompiledLoneInput(self.model, output_names_for(self.model),
                                               self.config.max_position_embeddings,
                                               "int8" if self.quantize == "int8" else self.precision)
        return self._compiled

    def _forward_batch(self, rows: Sequence[dict], keys: Sequence[str]) -> list[dict[str, torch.Tensor]]:
        if self.compile and not isinstance(rows[0]["input_ids"][0], list):
            outputs = self._compiled_forward(self._compiled_runner(), rows, keys)
            if outputs is not None:
                return outputs
        batch = {k: v.to(self.device) for k, v in pad_rows(rows, self.tokenizer.pad_token_id, self.lone_bucket).items()}
        with autocast(self.device, self.precision):
            out = self.model(**batch)
        return self._outputs(rows, keys, batch, out)

    def _compiled_forward(self, runner, rows: Sequence[dict], keys: Sequence[str]) -> list[dict[str, torch.Tensor]] | None:
        """The compiled graph's outputs for these rows, or None where it does not take them: 2 to
        `max_packed` inputs packed in one row where the graph packs (`_packs`), else up to its
        `max_batch` inputs padded."""
        names = runner.output_names
        if not all(key in names or OUTPUT_ALIASES.get(key) in names for key in keys):
            return None
        if self._packs(runner) and 2 <= len(rows) <= runner.max_packed:
            packed, starts = pack_rows(rows, self.tokenizer.pad_token_id, 1 if runner.shapes_free else SINGLE_LENGTH_BUCKET)
            if runner.accepts(1, packed["input_ids"].shape[1]):
                out = runner(packed["input_ids"], packed["attention_mask"], packed["token_type_ids"],
                             packed["position_ids"], torch.tensor(starts) if runner.pools else None)
                out = {key: out[names.index(key if key in names else OUTPUT_ALIASES[key])] for key in keys}
                if runner.pools:  # one row of logits per input
                    return [{key: value[number] for key, value in out.items()} for number in range(len(rows))]
                return [{key: value[0, start:start + len(row["input_ids"])] for key, value in out.items()}
                        for row, start in zip(rows, starts)]
        if len(rows) <= runner.max_batch:
            # to the engine's buckets (few oneDNN shapes), or a lone input at its length where nothing is made per shape
            batch = pad_rows(rows, self.tokenizer.pad_token_id, 1 if runner.shapes_free else SINGLE_LENGTH_BUCKET)
            if runner.accepts(*batch["input_ids"].shape):
                out = dict(zip(names, runner(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])))
                return self._outputs(rows, keys, batch, out)
        return None

    def _packs(self, runner) -> bool:
        """Whether several inputs go to this graph packed in one row (`_compiled_forward`)."""
        return runner.packs and (self.task in PACKED_TASKS or runner.pools)

    def _outputs(self, rows: Sequence[dict], keys: Sequence[str], batch: dict, out) -> list[dict[str, torch.Tensor]]:
        token_level = batch["input_ids"].dim() == 2
        outputs = []
        for position, row in enumerate(rows):
            values = {}
            for key in keys:
                # BertForPreTraining names its MLM logits prediction_logits.
                value = out[key if key in out else OUTPUT_ALIASES.get(key, key)][position].float().cpu()
                if token_level and value.dim() >= 1 and value.shape[0] == batch["input_ids"].shape[1]:
                    value = value[: len(row["input_ids"])]
                values[key] = value
            outputs.append(values)
        return outputs

    def warm_up(self, lengths: Sequence[int] = WARM_UP_LENGTHS) -> None:
        """Run a lone input of each of these lengths, and a batch, through the model once: oneDNN
        makes its kernels for a shape the first time it meets it, and packed weights are made on first
        use, so without this the first requests after start would pay for both. The tokenizer's
        first call, slower too (the `tokenizers` library sets itself up then), is made here as well.
        OpenMP and oneDNN keep some state per calling thread: a server warms up on the thread that
        will run its batches."""
        self.encode(["warm up"])
        if self.compile:  # compiled (or loaded from the cache) now, before any request
            self._compiled_runner()
        limit = self.max_length
        ids = [self.tokenizer.cls_token_id, self.tokenizer.sep_token_id]
        filler = self.tokenizer.unk_token_id

        def row(n: int) -> dict:
            tokens = ids[:1] + [filler] * (n - 2) + ids[1:]
            row = {"input_ids": tokens, "token_type_ids": [0] * n, "attention_mask": [1] * n}
            if self.task == "multiple-choice":  # (C, T) per row
                row = {k: [v, v] for k, v in row.items()}
            return row

        lone = [n for n in lengths if 2 <= n <= limit]
        for n in lone:
            self.forward([row(n)])
        if lone:  # a batch of several: the unpadded path and its row counts
            self.forward([row(n) for n in lone])
        if self.compile and self._packs(self._compiled_runner()):
            self.forward([row(16), row(24)])  # packed: its ops make nothing per row count, one call
        elif self.compile:  # the small batches the compiled graph takes (bf16, int8), at the batch buckets' lengths
            # up to 4: past that only the int8 graph with bertkit's AMX op takes more, and it makes no
            # kernel per shape (a first batch of 5-8 inputs as fast as the next, MiniLM), while warming
            # 5-8 up took 0.65 s more of `serve`'s start
            for size in range(2, min(self._compiled_runner().max_batch, 4) + 1):
                for n in range(LENGTH_BUCKET, min(128, limit) + 1, LENGTH_BUCKET):
                    self.forward([row(n)] * size)

    # ---------------------------------------------------------------- task helpers

    def logits(self, texts: Sequence[str], pairs: Sequence[str] | None = None, truncate: bool = True) -> list[torch.Tensor]:
        return [out["logits"] for out in self.forward(self.encode(texts, pairs, truncate))]

    def token_vectors(self, texts: Sequence[str], truncate: bool = True) -> list[torch.Tensor]:
        """(T, H) last-layer vectors per text, [CLS] and [SEP] included."""
        self._require_encoder_output()
        return [out["last_hidden_state"] for out in self.forward(self.encode(texts, None, truncate))]

    def embeddings(self, texts: Sequence[str], truncate: bool = True, normalize: bool | None = None) -> list[torch.Tensor]:
        """One vector per text: the folder's pooling (mean over tokens unless it says otherwise)."""
        return [self.pool(tokens, normalize) for tokens in self.token_vectors(texts, truncate)]

    def pool(self, tokens: torch.Tensor, normalize: bool | None = None) -> torch.Tensor:
        """(T, H) token vectors of one text -> its sentence embedding. The sums are numpy's: on one
        text torch's dispatch costs more than the arithmetic, and right after a forward pass has
        cooled the caches a lone request's pooling, normalising and checking took ~3x longer
        through torch (~170 against ~75 us on all-MiniLM-L6-v2)."""
        pooling = self.pooling or Pooling()
        array = _as_array(tokens)
        if pooling.mode == "cls":
            vector = array[0]
        elif pooling.mode == "max":
            vector = np.maximum.reduce(array, axis=0)
        else:
            vector = np.add.reduce(array, axis=0) / len(array)
        if pooling.normalize if normalize is None else normalize:
            vector = _unit_length(vector)
        return torch.from_numpy(vector)

    def _require_encoder_output(self) -> None:
        if self.task not in ("feature-extraction", "sentence-embeddings"):
            raise BertkitError(f"the model is a {type(self.model).__name__} ({self.task}); token vectors and "
                               "embeddings come from a BertModel folder (config architectures BertModel)")


def _as_array(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's numbers as a float32 numpy array; the engine's own outputs (fp32, on the CPU)
    are shared, not copied."""
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" or tensor.requires_grad:
        tensor = tensor.detach().to("cpu", torch.float32)
    return tensor.numpy()


def _unit_length(vector: np.ndarray) -> np.ndarray:
    """torch.nn.functional.normalize's: the vector over its length, the length at least 1e-12."""
    return vector / max(float(np.sqrt(np.dot(vector, vector))), 1e-12)


def unit_length(vector: torch.Tensor) -> torch.Tensor:
    """One vector scaled to length 1 (see pool for why through numpy)."""
    return torch.from_numpy(_unit_length(_as_array(vector)))


__all__ = ["InferenceEngine", "Pooling", "read_pooling", "length_grouped_batches", "pad_rows", "TASKS", "unit_length"]
