"""create_pretraining_data: corpus files -> sharded MLM + NSP instances (``bertkit create-pretraining-data``).

The original release loads the whole corpus into memory, then runs `dupe_factor` passes over
all documents, drawing each NotNext segment B from a random document of all its input files. To
do the same with bounded memory, this works in two passes over blocks of consecutive documents
of ~`block_chars` characters (default 8 M):

* pass 1 tokenizes the blocks into a corpus index on disk (corpus_index.py: token ids, sentence
  and document boundaries, the input file of each document), read back memory-mapped. A
  document longer than half a block is cut into parts that count as documents;
* pass 2 builds each block's instances by the original procedure: the block's documents
  shuffled, `dupe_factor` passes of ``create_instances_from_document`` over them, the block's
  instances shuffled. A NotNext B comes from a random document of the whole corpus, any input
  file, as in the original (``not_next_partners="corpus"``, the default), never from A's own
  (up to the original's ten draws), and its unused sentences are put back.
  ``not_next_partners="block"`` draws B from the same block instead, as bertkit did before:
  with one block per input file's stretch, a Wikipedia pair's partner was Wikipedia text and
  never Gutenberg's. Kept for re-making the data that recorded benchmarks were measured on;
  the manifest's ``config.not_next_partners`` says which (a manifest without it: "block");
* every random generator is seeded from (seed, block index, pass), and blocks are processed by
  `workers` processes but written in block order, so the output for a seed is the same
  whatever the number of workers. Instances are only shuffled within a block: the loader
  shuffles globally every epoch.

The manifest's counts give, per input file, its documents and the NotNext partners drawn from it
(``documents_used_per_file``, ``not_next_partners_per_file``): the two are proportional.

Masking: "static" (the original) masks each instance once while creating it; "dynamic" stores
unmasked instances and the loader draws a new mask every time. With dynamic masking
`dupe_factor` still means "this many passes over the corpus", each with new pairings, crops and
short-sequence draws; it defaults to 1 there (10 for static) because fresh masks already come
for free.

``dump_jsonl`` writes every instance as one JSON object with the original release's field
names (tokens after masking, segment_ids, is_random_next, masked_lm_positions,
masked_lm_labels). For dynamic masking the dump shows one sampled mask (seeded, but not one the
loader will use).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import random
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import flags
from ..version import __version__
from ..errors import BertkitError, reading
from ..hub.resolve import resolve_model
from ..outputs import atomic_open, check_output_file, write_json
from ..tokenizer import BertTokenizer
from .corpus import (
    DEFAULT_MAX_LINE_CHARS,
    DEFAULT_RAW_DOCUMENT_BREAK_LINES,
    CorpusStats,
    document_chars,
    expand_inputs,
    iter_document_blocks,
    read_corpus_file,
    split_sentences,
)
from .corpus_index import CorpusIndex, CorpusIndexWriter, DocumentsView
from .instances import PairArrays, assemble_pairs, plan_instances_from_document
from .masking import DEFAULT_MASK_MIX, continuation_flags, mask_tokens, parse_mask_mix
from .shards import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARD_PREFIX,
    ShardWriter,
    clear_output_dir,
    derive_seed,
    id_dtype_for,
    sha256_file,
)

logger = logging.getLogger("bertkit.pretraining")

DEFAULT_BLOCK_CHARS = 8_000_000
DEFAULT_SHARD_SIZE = 65536
NOT_NEXT_PARTNERS = ("corpus", "block")
# The tokenized corpus while the data is made (corpus_index.py); removed at the end.
CORPUS_INDEX_DIR = "corpus_index.tmp"
# Sentences handed to the batch tokenizer at once (bounds its temporary memory).
_TOKENIZE_BATCH = 8192


@dataclasses.dataclass(frozen=True)
class _BlockSettings:
    """Everything a worker needs to turn a block of documents into instances."""

    vocab: str
    raw: bool
    max_seq_length: int
    short_seq_prob: float
    dupe_factor: int
    seed: int
    masking: str
    masked_lm_prob: float
    max_predictions: int
    mask_mix: tuple[float, float, float]
    whole_word_mask: bool
    dump: bool
    not_next_partners: str


@dataclasses.dataclass
class _BlockResult:
    pairs: PairArrays
    masks: dict[str, np.ndarray] | None  # stored static masks
    dump_masks: dict[str, np.ndarray] | None  # masks shown in the JSONL dump
    counts: dict[str, int]
    partner_files: list[int]  # NotNext partners per input file


_worker_state: dict = {}


def _refuse_special_only(vocab_file: Path) -> None:
    """A vocabulary of [PAD], [UNK], [CLS] ... alone would turn every word into [UNK]: instances of
    nothing, reported as a success."""
    with reading(vocab_file, "vocabulary file"), open(vocab_file, encoding="utf-8") as f:
        words = [t for t in (line.strip() for line in f) if t and not (t.startswith("[") and t.endswith("]"))]
    if not words:
        raise BertkitError("the vocabulary holds only special tokens ([PAD], [UNK], [CLS], ...): every word would "
                           "become [UNK]; give a WordPiece vocabulary (bertkit train-tokenizer makes one)",
                           path=str(vocab_file))


def _load_tokenizer(vocab: str):
    # Each worker loads its own. A vocabulary lacking [CLS], [SEP], [MASK], [PAD] or [UNK] is
    # refused by the tokenizer with a BertkitError naming the file.
    return BertTokenizer.from_pretrained(vocab)


def _init_worker(settings: _BlockSettings, parallel_tokenizer: bool, tokenizer=None) -> None:
    if not parallel_tokenizer:
        # Several worker processes already share the cores; one tokenizer thread each.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if tokenizer is None:
        tokenizer = _load_tokenizer(settings.vocab)
    _worker_state["settings"] = settings
    _worker_state["tokenizer"] = tokenizer
    _worker_state["continuation"] = continuation_flags(tokenizer.ids_to_tokens).tolist()


def _mask_rows(pairs: PairArrays, rng: random.Random, settings: _BlockSettings, tokenizer, continuation):
    """Static masks for every row: (masked input_ids, the three mask arrays)."""
    count = len(pairs.lengths)
    masked_ids = pairs.input_ids.copy()
    positions = np.zeros((count, settings.max_predictions), dtype=np.int32)
    labels = np.zeros((count, settings.max_predictions), dtype=np.int32)
    counts = np.zeros(count, dtype=np.int32)
    for row in range(count):
        length = int(pairs.lengths[row])
        ids = pairs.input_ids[row, :length].tolist()
        special = [False] * length
        special[0] = special[int(pairs.b_starts[row]) - 1] = special[length - 1] = True
        output, chosen, originals = mask_tokens(
            ids,
            special,
            rng,
            settings.masked_lm_prob,
            settings.max_predictions,
            settings.mask_mix,
            vocab_size=tokenizer.vocab_size,
            mask_id=tokenizer.mask_token_id,
            whole_word=settings.whole_word_mask,
            is_continuation=[continuation[t] for t in ids] if settings.whole_word_mask else None,
        )
        masked_ids[row, :length] = output
        positions[row, : len(chosen)] = chosen
        labels[row, : len(chosen)] = originals
        counts[row] = len(chosen)
    return masked_ids, {"masked_lm_positions": positions, "masked_lm_ids": labels, "masked_lm_counts": counts}


@dataclasses.dataclass
class _TokenizedBlock:
    """One block's kept documents, tokenized, ready for the corpus index."""

    tokens: np.ndarray
    sentence_lengths: np.ndarray  # kept (non-empty) sentences, in order
    sentences_per_document: np.ndarray  # kept (non-empty) documents, in order
    document_files: np.ndarray  # the input file of each kept document
    counts: dict[str, int]


def _tokenize_block(block_index: int, documents: list[tuple[int, list[str]]]) -> _TokenizedBlock:
    """Tokenize one block of (input file, sentences) documents (runs in a worker process)."""
    settings: _BlockSettings = _worker_state["settings"]
    tokenizer = _worker_state["tokenizer"]
    files = [file_index for file_index, _ in documents]
    texts = [sentences for _, sentences in documents]
    if settings.raw:
        texts = [[s for paragraph in document for s in split_sentences(paragraph)] for document in texts]
    sentences = [sentence for document in texts for sentence in document]
    encoded: list[list[int]] = []
    for first in range(0, len(sentences), _TOKENIZE_BATCH):
        encoded.extend(tokenizer.encode_ids_batch(sentences[first : first + _TOKENIZE_BATCH]))
    total_tokens = sum(map(len, encoded))
    tokens = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=total_tokens)

    # Empty sentences hold no tokens, so leaving them out of the lengths keeps `tokens` aligned.
    sentence_lengths: list[int] = []
    sentences_per_document: list[int] = []
    document_files: list[int] = []
    lengths_iter = iter(map(len, encoded))
    for file_index, document in zip(files, texts):
        kept = [n for n in itertools.islice(lengths_iter, len(document)) if n]
        if kept:
            sentence_lengths.extend(kept)
            sentences_per_document.append(len(kept))
            document_files.append(file_index)
    counts = {
        "documents_used": len(sentences_per_document),
        "one_sentence_documents": sum(1 for n in sentences_per_document if n == 1),
        "sentences": len(sentence_lengths),
        "empty_sentences": len(sentences) - len(sentence_lengths),
        "corpus_tokens": total_tokens,
    }
    return _TokenizedBlock(tokens.astype(id_dtype_for(tokenizer.vocab_size)),
                           np.asarray(sentence_lengths, dtype=np.int64),
                           np.asarray(sentences_per_document, dtype=np.int64),
                           np.asarray(document_files, dtype=np.int64), counts)


def _corpus_index(index_dir: str, file_ends: tuple[int, ...]) -> CorpusIndex:
    """The worker's memory map of the corpus index (opened once per worker and run)."""
    key = (index_dir, file_ends)
    if _worker_state.get("index_key") != key:
        _worker_state["index"] = CorpusIndex(index_dir, id_dtype_for(_worker_state["tokenizer"].vocab_size),
                                             file_ends)
        _worker_state["index_key"] = key
    return _worker_state["index"]


def _build_block_instances(block_index: int, first_document: int, end_document: int, index_dir: str,
                           file_ends: tuple[int, ...]) -> _BlockResult:
    """Instances whose A comes from documents [first, end) of the index (runs in a worker process).

    As the original: the block's documents shuffled, then `dupe_factor` passes of
    create_instances_from_document over them. A NotNext B comes from any document of the corpus
    (``corpus``, the original's draw) or of this block (``block``, bertkit before the corpus index).
    """
    settings: _BlockSettings = _worker_state["settings"]
    tokenizer = _worker_state["tokenizer"]
    continuation = _worker_state["continuation"]
    index = _corpus_index(index_dir, file_ends)

    order = list(range(first_document, end_document))
    random.Random(derive_seed(settings.seed, "documents", block_index)).shuffle(order)
    if settings.not_next_partners == "corpus":
        view = DocumentsView(index)  # view index = document number: partners drawn from all of them
        own_documents = order
    else:
        view = DocumentsView(index, order)
        own_documents = list(range(len(order)))

    a_starts, a_ends, b_starts, b_ends, random_next, b_documents = [], [], [], [], [], []
    same_document_random_next = 0
    for dupe in range(settings.dupe_factor):
        rng = random.Random(derive_seed(settings.seed, "pairs", block_index, dupe))
        for document_index in own_documents:
            for span in plan_instances_from_document(view.lengths, document_index, settings.max_seq_length,
                                                     settings.short_seq_prob, rng, view.offsets):
                a_base = view.base(span.a_document)
                b_base = view.base(span.b_document)
                a_starts.append(a_base + span.a_start)
                a_ends.append(a_base + span.a_end)
                b_starts.append(b_base + span.b_start)
                b_ends.append(b_base + span.b_end)
                random_next.append(span.is_random_next)
                if span.is_random_next:
                    b_documents.append(view.document(span.b_document))
                    if span.b_document == span.a_document:
                        same_document_random_next += 1

    # The block's instances in random order.
    permutation = list(range(len(a_starts)))
    random.Random(derive_seed(settings.seed, "shuffle", block_index)).shuffle(permutation)
    pick = np.asarray(permutation, dtype=np.int64)
    pairs = assemble_pairs(
        index.tokens,
        np.asarray(a_starts, dtype=np.int64)[pick],
        np.asarray(a_ends, dtype=np.int64)[pick],
        np.asarray(b_starts, dtype=np.int64)[pick],
        np.asarray(b_ends, dtype=np.int64)[pick],
        np.asarray(random_next, dtype=bool)[pick],
        max_seq_length=settings.max_seq_length,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        pad_id=tokenizer.pad_token_id,
    )

    masks = dump_masks = None
    if settings.masking == "static":
        masked_ids, masks = _mask_rows(pairs, random.Random(derive_seed(settings.seed, "mask", block_index)),
                                       settings, tokenizer, continuation)
        pairs.input_ids = masked_ids
        if settings.dump:
            dump_masks = masks
    elif settings.dump:
        masked_ids, dump_masks = _mask_rows(pairs, random.Random(derive_seed(settings.seed, "dump", block_index)),
                                            settings, tokenizer, continuation)
        dump_masks = dict(dump_masks, masked_input_ids=masked_ids)
    pairs.input_ids = pairs.input_ids.astype(id_dtype_for(tokenizer.vocab_size))

    partner_files = np.bincount(index.file_of(np.asarray(b_documents, dtype=np.int64)),
                                minlength=len(file_ends)).tolist()
    counts = {
        "instances": len(pairs.lengths),
        "instance_tokens": int(pairs.lengths.sum()),
        "not_next": int(pairs.next_sentence_labels.sum()),
        "random_next_from_same_document": same_document_random_next,
        "masked_positions": int(masks["masked_lm_counts"].sum()) if masks is not None else 0,
    }
    return _BlockResult(pairs=pairs, masks=masks, dump_masks=dump_masks, counts=counts,
                        partner_files=partner_files)


def _start_pool(workers: int, settings: _BlockSettings):
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    # Set while the workers start, so that `tokenizers` does not warn about a fork after this
    # process used its thread pool; the caller's setting is restored right after.
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return multiprocessing.get_context(method).Pool(workers, initializer=_init_worker, initargs=(settings, False))
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def _ordered_parallel_map(pool, function, items: Iterable[tuple], max_in_flight: int) -> Iterator:
    """pool.imap with a bound on queued work (imap itself would read the whole corpus ahead)."""
    pending: deque = deque()
    for item in items:
        pending.append(pool.apply_async(function, item))
        if len(pending) >= max_in_flight:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _write_dump(handle, result: _BlockResult, ids_to_tokens: Sequence[str]) -> None:
    pairs, masks = result.pairs, result.dump_masks
    shown_ids = masks.get("masked_input_ids", pairs.input_ids)
    for row in range(len(pairs.lengths)):
        length = int(pairs.lengths[row])
        b_start = int(pairs.b_starts[row])
        count = int(masks["masked_lm_counts"][row])
        record = {
            "tokens": [ids_to_tokens[t] for t in shown_ids[row, :length].tolist()],
            "segment_ids": [0] * b_start + [1] * (length - b_start),
            "is_random_next": bool(pairs.next_sentence_labels[row]),
            "masked_lm_positions": masks["masked_lm_positions"][row, :count].tolist(),
            "masked_lm_labels": [ids_to_tokens[t] for t in masks["masked_lm_ids"][row, :count].tolist()],
        }
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """How corpus files become instances: the settings of the original create_pretraining_data.py
    (paper §3.1, appendix A.2) and bertkit's additions. The field order is the manifest's."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int | None = None  # None: 10 with static masking, 1 with dynamic
    seed: int = 12345
    whole_word_mask: bool = False
    masking: str = "static"
    mask_mix: Sequence[float] | str = DEFAULT_MASK_MIX
    raw: bool = False
    workers: int = 1
    shard_size: int = DEFAULT_SHARD_SIZE
    block_chars: int = DEFAULT_BLOCK_CHARS
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS
    raw_document_break_lines: int = DEFAULT_RAW_DOCUMENT_BREAK_LINES
    encoding_errors: str = "strict"
    dump_jsonl: str | os.PathLike | None = None
    not_next_partners: str = "corpus"
    progress: bool = dataclasses.field(default=True, metadata={"manifest": False})
    overwrite: bool = dataclasses.field(default=False, metadata={"manifest": False})

    def __post_init__(self):
        if self.masking not in ("static", "dynamic"):
            raise BertkitError(f"masking must be 'static' or 'dynamic', not {self.masking!r}")
        if self.not_next_partners not in NOT_NEXT_PARTNERS:
            raise BertkitError(f"not_next_partners must be 'corpus' or 'block', not {self.not_next_partners!r}")
        if self.dupe_factor is None:
            object.__setattr__(self, "dupe_factor", 10 if self.masking == "static" else 1)
        object.__setattr__(self, "mask_mix", parse_mask_mix(self.mask_mix))
        if not 5 <= self.max_seq_length <= 65535:
            raise BertkitError(f"max_seq_length must be between 5 and 65535, not {self.max_seq_length}")
        most = min(255, self.max_seq_length - 3)
        if not 1 <= self.max_predictions_per_seq <= most:
            raise BertkitError(f"max_predictions_per_seq must be between 1 and {most}, "
                               f"not {self.max_predictions_per_seq}")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise BertkitError(f"masked_lm_prob must be in (0, 1], not {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise BertkitError(f"short_seq_prob must be in [0, 1], not {self.short_seq_prob}")
        if self.block_chars < 1:
            raise BertkitError("block_chars must be positive")
        for name in ("dupe_factor", "workers", "max_line_chars", "shard_size", "raw_document_break_lines"):
            if getattr(self, name) < 1:
                raise BertkitError(f"{name} must be at least 1, not {getattr(self, name)}")

    def block_settings(self, vocab: str) -> _BlockSettings:
        return _BlockSettings(
            vocab=vocab, raw=self.raw, max_seq_length=self.max_seq_length, short_seq_prob=self.short_seq_prob,
            dupe_factor=self.dupe_factor, seed=self.seed, masking=self.masking, masked_lm_prob=self.masked_lm_prob,
            max_predictions=self.max_predictions_per_seq, mask_mix=self.mask_mix,
            whole_word_mask=self.whole_word_mask, dump=self.dump_jsonl is not None,
            not_next_partners=self.not_next_partners,
        )

    def manifest_config(self, files: list[Path], vocab: Path) -> dict:
        """The manifest's `config`: the inputs, the vocabulary and every setting that shapes the data.
        (A manifest without `not_next_partners` is from before the choice: "block".)"""
        config = {"inputs": [str(f) for f in files], "vocab": str(vocab)}
        for field in dataclasses.fields(self):
            if field.metadata.get("manifest", True):
                value = getattr(self, field.name)
                config[field.name] = (list(value) if field.name == "mask_mix"
                                      else None if value is None else str(value) if field.name == "dump_jsonl"
                                      else value)
        return config


def create_pretraining_data(inputs: Sequence[str | os.PathLike] | str | os.PathLike, vocab: str | os.PathLike,
                            output_dir: str | os.PathLike, **options) -> dict:
    """Turn corpus files into a pre-training data directory; returns the counts (also in the manifest).

    `vocab` is a vocab.txt, a directory holding one, or a model's Hub id; `options` are `DataOptions`
    fields (max_seq_length=128, dupe_factor, masking="static", workers, ...). See the module docstring
    for blocks, seeding and masking.
    """
    started = time.monotonic()
    options = DataOptions(**options)
    files = expand_inputs(inputs)
    vocab_path, vocab_file, tokenizer = _open_vocabulary(vocab)
    output_dir = Path(output_dir)
    if options.dump_jsonl is not None:  # before any work: never write over an input, a link, a device ...
        check_output_file(options.dump_jsonl, inputs=[*files, vocab_file], overwrite=options.overwrite)
    clear_output_dir(output_dir, options.overwrite)

    stats = CorpusStats()
    made = _make_instances(files, options, tokenizer, options.block_settings(str(vocab_path)), output_dir, stats)
    _copy_vocabulary(vocab_file, output_dir / "vocab.txt")
    counts = _counts(stats, made, options.raw)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created_by": f"bertkit {__version__}",
        "config": options.manifest_config(files, vocab_path),
        "vocab": {
            "file": "vocab.txt", "source": str(vocab_file), "sha256": sha256_file(vocab_file),
            "size": tokenizer.vocab_size, "do_lower_case": bool(getattr(tokenizer, "do_lower_case", True)),
            "pad_id": tokenizer.pad_token_id, "cls_id": tokenizer.cls_token_id,
            "sep_id": tokenizer.sep_token_id, "mask_id": tokenizer.mask_token_id,
        },
        # Full SHA-256 of each input's on-disk bytes, computed while streaming it.
        "inputs": [dataclasses.asdict(record) for record in stats.input_files],
        "counts": counts,
        "dtypes": {"input_ids": str(id_dtype_for(tokenizer.vocab_size)), "lengths": "uint16", "b_starts": "uint16",
                   "next_sentence_labels": "uint8", "masked_lm_positions": "uint16",
                   "masked_lm_ids": str(id_dtype_for(tokenizer.vocab_size)), "masked_lm_counts": "uint8"},
        "num_instances": counts["instances"],
        "shards": made.shards,
    }
    write_json(output_dir / MANIFEST_NAME, manifest)
    return dict(counts, shards=len(made.shards), seconds=round(time.monotonic() - started, 2),
                output_dir=str(output_dir))


def _open_vocabulary(vocab: str | os.PathLike) -> tuple[Path, Path, BertTokenizer]:
    vocab_path = resolve_model(vocab, tokenizer_only=True)  # a vocab.txt, a folder or a Hub id (bert-base-uncased)
    vocab_file = vocab_path / "vocab.txt" if vocab_path.is_dir() else vocab_path
    if not vocab_file.is_file():
        raise BertkitError("vocabulary file not found", path=str(vocab_file))
    _refuse_special_only(vocab_file)
    return vocab_path, vocab_file, _load_tokenizer(str(vocab_path))


def _copy_vocabulary(source: Path, target: Path) -> None:
    temporary = target.with_name(target.name + ".tmp")
    try:
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)  # a failed copy leaves nothing behind


@dataclasses.dataclass
class _Made:
    """What the two passes produced."""

    totals: dict[str, int]  # summed counts of every block
    block_documents: list[tuple[int, int]]  # each block's [first, end) document numbers
    documents_per_file: list[int]
    partner_files: list[int]  # NotNext partners drawn from each input file
    shards: list


@contextlib.contextmanager
def _block_runner(workers: int, settings: _BlockSettings, tokenizer):
    """`run(function, jobs)` -> the results in job order, in this process or in `workers` processes."""
    if workers == 1:
        _init_worker(settings, parallel_tokenizer=True, tokenizer=tokenizer)
        try:
            yield lambda function, jobs: (function(*job) for job in jobs)
        finally:
            _worker_state.clear()
        return
    pool = _start_pool(workers, settings)
    try:
        yield lambda function, jobs: _ordered_parallel_map(pool, function, jobs, max_in_flight=2 * workers)
    finally:
        pool.terminate()
        pool.join()


def _add_counts(totals: dict[str, int], counts: dict[str, int]) -> None:
    for key, value in counts.items():
        totals[key] = totals.get(key, 0) + value


def _make_instances(files: list[Path], options: DataOptions, tokenizer, settings: _BlockSettings,
                    output_dir: Path, stats: CorpusStats) -> _Made:
    """Pass 1 (tokenize every block into the corpus index, in corpus order), then pass 2 (each
    block's instances, partners drawn from the index, written in block order)."""
    index_dir = output_dir / CORPUS_INDEX_DIR
    bar = (tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True,
                desc="create-pretraining-data", file=sys.stderr) if options.progress else None)

    def documents() -> Iterator[tuple[int, list[str]]]:
        for file_index, path in enumerate(files):
            for document in read_corpus_file(
                path, raw=options.raw, stats=stats, max_line_chars=options.max_line_chars,
                max_document_chars=options.block_chars // 2, raw_document_break_lines=options.raw_document_break_lines,
                encoding_errors=options.encoding_errors, on_bytes=bar.update if bar is not None else None,
            ):
                yield file_index, document

    writer = ShardWriter(output_dir, max_seq_length=options.max_seq_length,
                         max_predictions=options.max_predictions_per_seq, vocab_size=tokenizer.vocab_size,
                         static_masks=options.masking == "static", shard_size=options.shard_size)
    made = _Made(totals={}, block_documents=[], documents_per_file=[], partner_files=[0] * len(files), shards=[])
    try:
        with (_block_runner(options.workers, settings, tokenizer) as run_blocks,
              # The dump appears under its name only once complete (atomic_open removes it on any failure).
              atomic_open(options.dump_jsonl) if options.dump_jsonl is not None else contextlib.nullcontext()
              as dump_handle):
            if index_dir.exists():
                shutil.rmtree(index_dir)  # left by an interrupted run
            index = CorpusIndexWriter(index_dir, id_dtype_for(tokenizer.vocab_size), len(files))
            blocks = iter_document_blocks(documents(), options.block_chars, chars=lambda item: document_chars(item[1]))
            for tokenized in run_blocks(_tokenize_block, enumerate(blocks)):
                made.block_documents.append(index.add(tokenized.tokens, tokenized.sentence_lengths,
                                                      tokenized.sentences_per_document, tokenized.document_files))
                _add_counts(made.totals, tokenized.counts)
            index.close()
            made.documents_per_file = list(index.documents_per_file)
            if bar is not None:
                bar.close()
                bar = tqdm(total=len(made.block_documents), unit="block", desc="instances", file=sys.stderr)

            file_ends = tuple(itertools.accumulate(index.documents_per_file))
            jobs = ((number, first, end, str(index_dir), file_ends)
                    for number, (first, end) in enumerate(made.block_documents))
            for result in run_blocks(_build_block_instances, jobs):
                writer.add(result.pairs, result.masks)
                if dump_handle is not None:
                    _write_dump(dump_handle, result, tokenizer.ids_to_tokens)
                _add_counts(made.totals, result.counts)
                made.partner_files = [a + b for a, b in zip(made.partner_files, result.partner_files)]
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(instances=made.totals.get("instances", 0), refresh=False)
            made.shards = writer.close()
            if not made.totals.get("instances"):
                raise BertkitError("the inputs produced no instances: they contain no text the vocabulary can encode")
    finally:
        if bar is not None:
            bar.close()
        for leftover in output_dir.glob(f"{SHARD_PREFIX}*.tmp"):  # only what this run wrote
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        shutil.rmtree(index_dir, ignore_errors=True)
    return made


def _counts(stats: CorpusStats, made: _Made, raw: bool) -> dict:
    totals, instances = made.totals, made.totals["instances"]
    return {
        "files": stats.files,
        "empty_files": len(stats.empty_files),
        "empty_file_paths": stats.empty_files,
        "lines": stats.lines,
        "documents": stats.documents,
        "documents_used": totals["documents_used"],
        "documents_split": stats.documents_split,
        "paragraphs": stats.units if raw else 0,
        "one_sentence_documents": totals["one_sentence_documents"],
        "sentences": totals["sentences"],
        "empty_sentences": totals["empty_sentences"],
        "long_lines_split": stats.long_lines_split,
        "long_paragraphs_split": stats.long_paragraphs_split,
        "undecodable_lines": stats.undecodable_lines,
        "corpus_tokens": totals["corpus_tokens"],
        "blocks": len(made.block_documents),
        "instances": instances,
        "instance_tokens": totals["instance_tokens"],
        "not_next": totals["not_next"],
        "not_next_fraction": totals["not_next"] / instances,
        "random_next_from_same_document": totals["random_next_from_same_document"],
        # Per input file (as "inputs" lists them): its documents, and the NotNext partners drawn from it.
        "documents_used_per_file": made.documents_per_file,
        "not_next_partners_per_file": made.partner_files,
        "masked_positions": totals["masked_positions"],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bertkit create-pretraining-data``."""
    parser.add_argument("--input", nargs="+", required=True, metavar="FILE",
                        help="corpus files (plain or .gz) or directories of them")
    parser.add_argument("--raw", action="store_true",
                        help="inputs are running text in paragraphs; split sentences with pysbd")
    parser.add_argument("--vocab", required=True, metavar="PATH", help="vocab.txt, a directory holding one, or a model's Hub id (bert-base-uncased)")
    parser.add_argument("--output", required=True, metavar="DIR", help="output directory for shards + manifest.json")
    parser.add_argument("--max-seq-length", type=flags.int_between(5, 65535), default=128)
    parser.add_argument("--max-predictions-per-seq", type=flags.int_between(1, 255), default=20)
    parser.add_argument("--masked-lm-prob", type=flags.positive_float, default=0.15)
    parser.add_argument("--short-seq-prob", type=flags.probability, default=0.1)
    parser.add_argument("--dupe-factor", type=flags.positive_int, default=None,
                        help="passes over the corpus (default 10 with static, 1 with dynamic masking)")
    parser.add_argument("--seed", type=flags.seed, default=12345)
    parser.add_argument("--whole-word-mask", action="store_true")
    parser.add_argument("--masking", choices=("static", "dynamic"), default="static")
    parser.add_argument("--mask-mix", default="80,10,10", metavar="MASK,SAME,RANDOM",
                        help="percentages of predicted positions shown as [MASK], unchanged, random token")
    parser.add_argument("--workers", type=flags.int_between(1, 256), default=1, help="processes (1 to 256)")
    parser.add_argument("--dump-jsonl", default=None, metavar="FILE",
                        help="also write every instance as JSON (original field names)")
    parser.add_argument("--shard-size", type=flags.positive_int, default=DEFAULT_SHARD_SIZE, metavar="N", help="instances per shard")
    parser.add_argument("--block-chars", type=flags.positive_int, default=DEFAULT_BLOCK_CHARS, metavar="N",
                        help="characters of text per processing block")
    parser.add_argument("--not-next-partners", choices=NOT_NEXT_PARTNERS, default="corpus",
                        help="where a NotNext segment B comes from: a random document of all the inputs "
                             "(corpus, as the original script) or of the same block of --block-chars "
                             "(block: how bertkit made data before, for re-making the recorded benchmark data)")
    parser.add_argument("--max-line-chars", type=flags.positive_int, default=DEFAULT_MAX_LINE_CHARS, metavar="N",
                        help="longer lines are split at whitespace")
    parser.add_argument("--raw-document-break-lines", type=flags.positive_int, default=DEFAULT_RAW_DOCUMENT_BREAK_LINES, metavar="N",
                        help="with --raw, this many consecutive blank lines end a document")
    parser.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict",
                        help="invalid UTF-8: stop with an error (strict) or replace the bad bytes")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing data in --output (and an existing --dump-jsonl file)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_from_args(args: argparse.Namespace) -> dict:
    """Run the command from parsed arguments; prints a one-line summary and returns the counts."""
    options = {field.name: getattr(args, field.name) for field in dataclasses.fields(DataOptions)
               if field.name != "progress"}
    summary = create_pretraining_data(args.input, args.vocab, args.output, progress=not args.no_progress, **options)
    print(
        f"{summary['instances']} instances ({summary['not_next_fraction']:.1%} NotNext) from "
        f"{summary['documents_used']} documents, {summary['sentences']} sentences in {summary['shards']} shard(s) "
        f"-> {summary['output_dir']} ({summary['seconds']} s)"
    )
    if summary["empty_files"]:
        logger.warning(f"{summary['empty_files']} empty input file(s) skipped")
    return summary
