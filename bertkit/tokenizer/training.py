"""Training a WordPiece vocabulary on corpus files, and streaming a corpus through the tokenizer
(`bertkit train-tokenizer`, `bertkit tokenize`)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
from pathlib import Path
from typing import IO, Iterator, Sequence

from tokenizers import trainers

from ..errors import BertkitError
from ..tables import is_readable_file
from ..outputs import atomic_write_text
from .vocabulary import CONFIG_NAME, SPECIAL_TOKENS, VOCAB_NAME, _build_rust_tokenizer, _tokenizer_config
from .original import _basic_tokenize, _needs_exact_path
from .bert_tokenizer import BertTokenizer


# --------------------------------------------------------------------------------------------
# Training a vocabulary, and the `tokenize` command
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_binary(path: Path) -> Iterator[IO[bytes]]:
    """The file's bytes, gunzipped when it starts with gzip's magic; opened once, so a pipe works."""
    with open(path, "rb") as raw:
        yield gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == b"\x1f\x8b" else raw


def _corpus_lines(files: list[Path], lowercase: bool) -> Iterator[str]:
    """Non-empty lines of BERT-format corpus files (plain or gzip), streamed."""
    for path in files:
        try:
            with _open_binary(path) as handle:
                # Decoded line by line so that an error can name its line.
                for line_number, raw in enumerate(handle, start=1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        raise BertkitError(f"not valid UTF-8 ({err.reason})", path, line_number) from None
                    if not line.strip():
                        continue
                    if _needs_exact_path(line, lowercase):
                        # Count what the tokenizer will see: the original's words for this line.
                        yield " ".join(word.text for word in _basic_tokenize(line, lowercase))
                    else:
                        yield line
        except (gzip.BadGzipFile, EOFError, OSError) as err:
            raise BertkitError(f"cannot read corpus file: {err}", path) from None


def train_tokenizer(
    files: Sequence[str | os.PathLike] | str | os.PathLike,
    vocab_size: int,
    output_dir: str | os.PathLike,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    progress: bool | None = None,
) -> BertTokenizer:
    """Train a WordPiece vocabulary on corpus files; write vocab.txt + tokenizer_config.json.

    The five special tokens get ids 0-4 ([PAD] [UNK] [CLS] [SEP] [MASK]). `progress` defaults
    to showing the `tokenizers` progress bars only when stderr is a terminal. The vocabulary
    can come out smaller than vocab_size when the corpus is too small to fill it.
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [Path(f) for f in files]
    if not paths:
        raise BertkitError("no input files given for tokenizer training")
    for path in paths:
        if not is_readable_file(path):  # a file, or a pipe (`--input <(cmd)`): read once
            raise BertkitError("input file not found", path=path)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise BertkitError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if min_frequency < 1:
        raise BertkitError(f"min_frequency must be at least 1, got {min_frequency}")
    show_progress = sys.stderr.isatty() if progress is None else bool(progress)

    backend = _build_rust_tokenizer(None, lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
    )
    backend.train_from_iterator(_corpus_lines(paths, lowercase), trainer=trainer)
    trained = backend.get_vocab()
    tokens = sorted(trained, key=trained.get)
    if [trained[t] for t in tokens] != list(range(len(tokens))) or tuple(tokens[:5]) != SPECIAL_TOKENS:
        raise RuntimeError("tokenizers returned a vocabulary without contiguous ids or leading specials")
    if len(tokens) == len(SPECIAL_TOKENS):
        raise BertkitError("the corpus files contain no text to train on", path=paths[0])

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / VOCAB_NAME, "".join(t + "\n" for t in tokens))
    atomic_write_text(output_dir / CONFIG_NAME, json.dumps(_tokenizer_config(lowercase), indent=2) + "\n")
    return BertTokenizer.from_pretrained(output_dir)


def tokenize_stream(
    tokenizer: BertTokenizer,
    in_stream: IO,
    out_stream: IO[str],
    as_tokens: bool = False,
    batch_size: int = 1000,
) -> int:
    """One output line per input line: space-separated ids (or tokens), no [CLS]/[SEP].

    `in_stream` yields str or UTF-8 bytes lines (e.g. sys.stdin.buffer); work is done in
    batches of `batch_size` lines, written as each batch finishes. Returns the line count.
    """
    batch: list[str] = []
    count = 0

    def flush() -> None:
        rows = tokenizer.tokenize_batch(batch) if as_tokens else tokenizer.encode_ids_batch(batch)
        out_stream.write("".join(" ".join(map(str, row)) + "\n" for row in rows))
        out_stream.flush()
        batch.clear()

    for line in in_stream:
        count += 1
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as err:
                name = getattr(in_stream, "name", "<input>")
                raise BertkitError(f"not valid UTF-8 ({err.reason})", str(name), count) from None
        batch.append(line.rstrip("\r\n"))
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    return count
