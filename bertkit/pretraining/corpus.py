"""Read a pre-training corpus as a stream of documents.

Two input layouts are understood:

* BERT format (the default): one sentence per line, a blank line between documents. Every
  non-blank line is a sentence; a bracketed title line such as ``[Emma by Jane Austen 1816]``
  is simply the document's first sentence, exactly as the original release treats it.
* Raw text (``raw=True``): paragraphs separated by blank lines, hard line breaks inside them.
  Lines of a paragraph are joined with spaces and the paragraph is later split into sentences
  with pysbd (:func:`split_sentences`, run in the worker processes because it is slow,
  ~150 kB/s). A run of ``raw_document_break_lines`` (default 3) or more blank lines ends a
  document: in Project Gutenberg texts chapters are set off by 3-4 blank lines while single
  and double blank lines occur inside chapters, so documents are roughly chapters. The end of
  a file always ends a document (in both layouts).

Bad input is handled as follows (the counts land in :class:`CorpusStats` and the manifest):

* missing input path -> :class:`BertkitError` before anything is read;
* empty file (no non-blank line) -> a warning and ``empty_files`` count, not fatal;
* invalid UTF-8 -> :class:`BertkitError` naming file and line (``encoding_errors="strict"``,
  the default), or with ``encoding_errors="replace"`` the bad bytes become U+FFFD (which the
  tokenizer drops) and the line is counted in ``undecodable_lines``;
* a line longer than ``max_line_chars`` (default 100,000) is split at whitespace into pieces of
  at most that size, each kept as its own sentence (``long_lines_split``); such a "sentence" is
  far longer than any sequence anyway and would be truncated, so nothing useful is lost, and
  the tokenizer is never handed megabyte-sized strings. In raw mode the same limit caps a
  paragraph (``long_paragraphs_split``);
* a document larger than ``max_document_chars`` is cut into consecutive parts, each treated as
  a document (``documents_split``), so that memory stays bounded by the block size;
* corrupt gzip data -> :class:`BertkitError` naming the file.

Plain and gzip files are told apart by their first two bytes, not by the file name. The
SHA-256 of every file's on-disk bytes is computed while it is streamed (no second read).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import logging
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pysbd

from ..errors import BertkitError
from ..tables import is_readable_file

logger = logging.getLogger("bertkit.pretraining")

GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_LINE_CHARS = 100_000
DEFAULT_RAW_DOCUMENT_BREAK_LINES = 3
# How often (in lines) byte progress is reported while a file is read.
_PROGRESS_EVERY_LINES = 8192


@dataclasses.dataclass
class InputFileRecord:
    """What the manifest records about one input file."""

    path: str
    size: int
    sha256: str
    lines: int
    documents: int


@dataclasses.dataclass
class CorpusStats:
    """Counts gathered while reading; every handled irregularity is counted here."""

    files: int = 0
    lines: int = 0
    documents: int = 0
    units: int = 0  # sentences (BERT format) or paragraphs (raw) handed on
    empty_files: list[str] = dataclasses.field(default_factory=list)
    long_lines_split: int = 0
    long_paragraphs_split: int = 0
    documents_split: int = 0
    undecodable_lines: int = 0
    input_files: list[InputFileRecord] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["empty_files"] = list(self.empty_files)
        return out


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Input paths as files: a directory stands for its non-hidden files, sorted by name.

    Every path is checked up front so that a typo fails at once, not after an hour of work.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            members = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if not members:
                raise BertkitError("input directory contains no files", path=str(path))
            files.extend(members)
        elif is_readable_file(path):  # a file, or a pipe (`--input <(cmd)`): both passes read the index
            files.append(path)
        elif path.exists():
            raise BertkitError("input is neither a file nor a directory", path=str(path))
        else:
            raise BertkitError("input file not found", path=str(path))
    if not files:
        raise BertkitError("no input files given")
    return files


class _HashingReader(io.RawIOBase):
    """Passes bytes through while hashing them and counting how many were read."""

    def __init__(self, raw):
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        if n:
            self.sha256.update(memoryview(buffer)[:n])
            self.bytes_read += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _split_long_text(text: str, limit: int) -> list[str]:
    """Cut `text` into pieces of at most `limit` characters, at whitespace where possible."""
    pieces = []
    while len(text) > limit:
        cut = text.rfind(" ", limit // 2, limit + 1)
        if cut <= 0:
            cut = limit  # no space in the second half of the window: hard cut
        piece = text[:cut].strip()
        if piece:
            pieces.append(piece)
        text = text[cut:].lstrip()
    if text:
        pieces.append(text)
    return pieces


class _DocumentBuilder:
    """Collects the units of the current document and hands out finished documents."""

    def __init__(self, stats: CorpusStats, max_chars: int | None):
        self.stats = stats
        self.max_chars = max_chars
        self.units: list[str] = []
        self.chars = 0
        self.documents = 0

    def add(self, unit: str) -> list[str] | None:
        """Append a unit; returns the document when it just reached the size limit and was cut."""
        self.units.append(unit)
        self.chars += len(unit)
        self.stats.units += 1
        if self.max_chars is not None and self.chars >= self.max_chars:
            self.stats.documents_split += 1
            return self.finish()
        return None

    def finish(self) -> list[str] | None:
        if not self.units:
            return None
        document, self.units, self.chars = self.units, [], 0
        self.stats.documents += 1
        self.documents += 1
        return document


def _lines_any_ending(reader) -> Iterator[bytes]:
    """Lines ended by LF, CRLF or a lone CR (old Mac files, some exports): a binary file iterates on LF
    only, which would read a CR-only corpus as one line."""
    for chunk in reader:
        if b"\r" not in chunk:
            yield chunk
            continue
        ended = chunk.endswith(b"\n")
        parts = chunk.replace(b"\r\n", b"\n").rstrip(b"\n").split(b"\r") if ended else chunk.split(b"\r")
        yield from parts


def read_corpus_file(
    path: str | os.PathLike,
    *,
    raw: bool = False,
    stats: CorpusStats | None = None,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    max_document_chars: int | None = None,
    raw_document_break_lines: int = DEFAULT_RAW_DOCUMENT_BREAK_LINES,
    encoding_errors: str = "strict",
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[list[str]]:
    """Yield the documents of one file, each a list of sentences (paragraphs when `raw`).

    `on_bytes(n)` is called with the number of on-disk bytes consumed since its last call
    (for a progress bar). See the module docstring for the handling of bad input.
    """
    _check_reading_options(encoding_errors, raw_document_break_lines, max_line_chars)
    stats = stats if stats is not None else CorpusStats()
    name = str(Path(path))
    hashing, reader = _open_corpus(Path(path), name)
    stats.files += 1
    builder = _DocumentBuilder(stats, max_document_chars)
    lines = _DecodedLines(reader, hashing, name, encoding_errors, stats, on_bytes)
    try:
        if raw:
            yield from _paragraph_documents(lines, builder, stats, max_line_chars, raw_document_break_lines)
        else:
            yield from _sentence_documents(lines, builder, stats, max_line_chars)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise BertkitError(f"corrupt gzip data after line {lines.number}: {exc}", path=name) from None
    finally:
        reader.close()
    _record_file(stats, name, hashing, lines, builder.documents)


def _check_reading_options(encoding_errors: str, raw_document_break_lines: int, max_line_chars: int) -> None:
    if encoding_errors not in ("strict", "replace"):
        raise BertkitError(f"encoding_errors must be 'strict' or 'replace', not {encoding_errors!r}")
    if raw_document_break_lines < 1:
        raise BertkitError("raw_document_break_lines must be at least 1")
    if max_line_chars < 1:  # the long-line splitter would never advance
        raise BertkitError(f"max_line_chars must be at least 1, not {max_line_chars}")


def _open_corpus(path: Path, name: str):
    """(the hashing reader of the bytes on disk, the text bytes: gunzipped when the file is gzip)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise BertkitError("input file not found", path=name) from None
    except OSError as exc:
        raise BertkitError(f"cannot open input file: {exc.strerror}", path=name) from None
    hashing = _HashingReader(handle)
    buffered = io.BufferedReader(hashing, buffer_size=1 << 20)
    is_gzip = buffered.peek(2)[:2] == GZIP_MAGIC
    return hashing, (gzip.GzipFile(fileobj=buffered, mode="rb") if is_gzip else buffered)


class _DecodedLines:
    """A file's lines as stripped text (any line ending, the byte-order mark dropped), counted; bad
    UTF-8 stops at its line, or is replaced and counted with encoding_errors "replace"; progress
    reported every _PROGRESS_EVERY_LINES lines, once the line before has been used."""

    def __init__(self, reader, hashing: _HashingReader, name: str, encoding_errors: str, stats: CorpusStats,
                 on_bytes: Callable[[int], None] | None):
        self.reader, self.hashing, self.name, self.encoding_errors = reader, hashing, name, encoding_errors
        self.stats, self.on_bytes = stats, on_bytes
        self.number = 0  # lines read so far
        self.reported = 0  # bytes passed to on_bytes so far

    def __iter__(self) -> Iterator[str]:
        for line_bytes in _lines_any_ending(self.reader):
            self.number += 1
            yield self.decode(line_bytes)
            if self.on_bytes is not None and self.number % _PROGRESS_EVERY_LINES == 0:
                self.report_progress()

    def decode(self, line_bytes: bytes) -> str:
        try:
            text = line_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            if self.encoding_errors == "strict":
                raise BertkitError(
                    f"invalid UTF-8 ({exc.reason}) at byte {exc.start + 1} of the line; fix the file "
                    "or pass --encoding-errors replace",
                    path=self.name,
                    line=self.number,
                ) from None
            text = line_bytes.decode("utf-8", errors="replace")
            self.stats.undecodable_lines += 1
        if self.number == 1 and text.startswith("\ufeff"):
            text = text[1:]  # byte-order mark
        return text.strip()

    def report_progress(self) -> None:
        if self.on_bytes is not None:
            self.on_bytes(self.hashing.bytes_read - self.reported)
            self.reported = self.hashing.bytes_read


def _line_pieces(text: str, max_line_chars: int, stats: CorpusStats) -> list[str] | tuple[str]:
    """A line, or its pieces of at most max_line_chars where it is longer."""
    if len(text) > max_line_chars:
        stats.long_lines_split += 1
        return _split_long_text(text, max_line_chars)
    return (text,)


def _sentence_documents(lines: _DecodedLines, builder: _DocumentBuilder, stats: CorpusStats,
                        max_line_chars: int) -> Iterator[list[str]]:
    """One sentence per line, a blank line between documents (the paper's corpus format)."""
    for text in lines:
        if not text:
            done = builder.finish()
            if done:
                yield done
            continue
        for piece in _line_pieces(text, max_line_chars, stats):
            done = builder.add(piece)
            if done:
                yield done
    done = builder.finish()
    if done:
        yield done


def _paragraph_documents(lines: _DecodedLines, builder: _DocumentBuilder, stats: CorpusStats, max_line_chars: int,
                         break_lines: int) -> Iterator[list[str]]:
    """Raw text: the lines between blank lines make a paragraph (split where it passes
    max_line_chars), `break_lines` blank lines in a row end a document."""
    paragraph: list[str] = []  # the lines of the paragraph under construction
    chars = 0
    blank_run = 0

    def end_paragraph() -> list[str] | None:
        nonlocal paragraph, chars
        text = " ".join(paragraph)
        paragraph, chars = [], 0
        return builder.add(text)

    for text in lines:
        if not text:
            blank_run += 1
            done = end_paragraph() if paragraph else None
            if done:
                yield done
            continue
        pieces = _line_pieces(text, max_line_chars, stats)
        if blank_run >= break_lines:
            done = builder.finish()
            if done:
                yield done
        for piece in pieces:
            if paragraph and chars + len(piece) > max_line_chars:
                stats.long_paragraphs_split += 1
                done = end_paragraph()
                if done:
                    yield done
            paragraph.append(piece)
            chars += len(piece) + 1
        blank_run = 0
    for done in (end_paragraph() if paragraph else None, builder.finish()):
        if done:
            yield done


def _record_file(stats: CorpusStats, name: str, hashing: _HashingReader, lines: _DecodedLines,
                 documents: int) -> None:
    """The file read to its end: its lines counted, progress finished, its record (size, SHA-256)."""
    stats.lines += lines.number
    if documents == 0:
        logger.warning("%s: input file has no text; skipped", name)
        stats.empty_files.append(name)
    lines.report_progress()
    stats.input_files.append(InputFileRecord(path=name, size=hashing.bytes_read, sha256=hashing.sha256.hexdigest(),
                                             lines=lines.number, documents=documents))


def iter_documents(paths: Iterable[str | os.PathLike], **kwargs) -> Iterator[list[str]]:
    """Documents of all files in order; keyword arguments as for :func:`read_corpus_file`."""
    for path in expand_inputs(paths):
        yield from read_corpus_file(path, **kwargs)


def document_chars(document: list[str]) -> int:
    return sum(map(len, document))


def iter_document_blocks(documents: Iterable, block_chars: int,
                         chars: Callable[[Any], int] = document_chars) -> Iterator[list]:
    """Group consecutive documents into blocks of at least `block_chars` characters.

    Blocks are the unit of parallel work (and, with ``--not-next-partners block``, of NotNext
    sampling); their boundaries depend only on the text, so the output is the same whatever the
    number of workers. A short remainder (under half a block) joins the block before it, so that no
    block is left with one or two documents. `chars(item)` measures an item (default: a document,
    a list of sentences).
    """
    finished: list | None = None  # held back in case the remainder must join it
    block: list = []
    size = 0
    for document in documents:
        block.append(document)
        size += chars(document)
        if size >= block_chars:
            if finished is not None:
                yield finished
            finished, block, size = block, [], 0
    if block and finished is not None and size < block_chars / 2:
        finished.extend(block)
        block = []
    if finished is not None:
        yield finished
    if block:
        yield block


_SEGMENTER = None


def split_sentences(paragraph: str) -> list[str]:
    """Split one paragraph of running text into sentences (pysbd, English rules).

    pysbd keeps abbreviations ("Mr. Smith", "e.g."), decimals ("3.14") and quoted speech
    intact, which a full-stop regex does not.
    """
    global _SEGMENTER
    if _SEGMENTER is None:
        _SEGMENTER = pysbd.Segmenter(language="en", clean=False)
    sentences = [s.strip() for s in _SEGMENTER.segment(paragraph)]
    return [s for s in sentences if s]
