"""The tokenized corpus on disk, so that a NotNext partner can come from any document of any input.

The original create_pretraining_data.py holds every document of every input file in memory and
draws a NotNext segment B from a random one of them. To do the same with memory bounded whatever
the corpus size, `create-pretraining-data` first tokenizes the corpus block by block into this
index, then builds each block's instances with partners drawn from the whole index, which it
reads memory-mapped (the operating system keeps in memory what fits and drops the rest).

Four flat files in a temporary folder of the output directory, removed when the data is made:

    tokens.bin            the token ids of every kept sentence, in corpus order (uint16 or int32)
    sentence_starts.bin   int64, S + 1 entries: sentence s is tokens[starts[s]:starts[s + 1]]
    document_starts.bin   int64, D + 1 entries: document d is sentences [starts[d], starts[d + 1])
    (document files)      the documents of input file f are [file_ends[f - 1], file_ends[f]); kept
                          in memory (one number per file) and written to the manifest's counts

Disk: ~2 bytes per token (4 with a vocabulary of over 65,536 pieces) plus 8 per sentence and per
document. Empty sentences and documents are not indexed, as the original drops them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

TOKENS = "tokens.bin"
SENTENCE_STARTS = "sentence_starts.bin"
DOCUMENT_STARTS = "document_starts.bin"


class CorpusIndexWriter:
    """Appends tokenized documents in corpus order; `close()` returns the document count."""

    def __init__(self, directory: str | os.PathLike, token_dtype: np.dtype, num_files: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.token_dtype = np.dtype(token_dtype)
        self._tokens = open(self.directory / TOKENS, "wb")
        self._sentences = open(self.directory / SENTENCE_STARTS, "wb")
        self._documents = open(self.directory / DOCUMENT_STARTS, "wb")
        self._sentences.write(np.zeros(1, dtype=np.int64).tobytes())
        self._documents.write(np.zeros(1, dtype=np.int64).tobytes())
        self.num_tokens = 0
        self.num_sentences = 0
        self.num_documents = 0
        self.documents_per_file = [0] * num_files

    def add(self, tokens: np.ndarray, sentence_lengths: np.ndarray, sentences_per_document: np.ndarray,
            document_files: np.ndarray) -> tuple[int, int]:
        """Append documents (their tokens, each kept sentence's length, each document's sentence
        count and input file); returns the global index range [first, end) they received."""
        sentence_lengths = np.asarray(sentence_lengths, dtype=np.int64)
        sentences_per_document = np.asarray(sentences_per_document, dtype=np.int64)
        self._tokens.write(np.ascontiguousarray(tokens, dtype=self.token_dtype).tobytes())
        self._sentences.write((self.num_tokens + np.cumsum(sentence_lengths)).tobytes())
        self._documents.write((self.num_sentences + np.cumsum(sentences_per_document)).tobytes())
        for file_index, count in zip(*np.unique(np.asarray(document_files, dtype=np.int64), return_counts=True)):
            self.documents_per_file[int(file_index)] += int(count)
        first = self.num_documents
        self.num_tokens += int(sentence_lengths.sum())
        self.num_sentences += len(sentence_lengths)
        self.num_documents += len(sentences_per_document)
        return first, self.num_documents

    def close(self) -> int:
        for handle in (self._tokens, self._sentences, self._documents):
            handle.close()
        return self.num_documents


class CorpusIndex:
    """A written index, memory-mapped: the documents' sentence lengths and token offsets by number."""

    def __init__(self, directory: str | os.PathLike, token_dtype: np.dtype, file_ends: Sequence[int] = ()):
        directory = Path(directory)
        self.tokens = _map(directory / TOKENS, token_dtype)
        self.sentence_starts = _map(directory / SENTENCE_STARTS, np.int64)
        self.document_starts = _map(directory / DOCUMENT_STARTS, np.int64)
        self.file_ends = np.asarray(file_ends, dtype=np.int64)  # end document of each input file

    def __len__(self) -> int:
        return len(self.document_starts) - 1

    def token_offsets(self, document: int) -> np.ndarray:
        """Global token offsets of the document's sentence boundaries (its sentences + 1 entries)."""
        return self.sentence_starts[self.document_starts[document] : self.document_starts[document + 1] + 1]

    def file_of(self, documents: np.ndarray) -> np.ndarray:
        """The input file (index into the inputs) of each document number."""
        return np.searchsorted(self.file_ends, documents, side="right")


def _map(path: Path, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if path.stat().st_size == 0:  # np.memmap refuses an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class DocumentsView:
    """Documents of a :class:`CorpusIndex` as `plan_instances_from_document` reads them.

    `documents` lists the global numbers of the view's documents (view index -> document); None
    means the whole corpus in index order. ``lengths[i]`` and ``offsets[i]`` are document i's
    sentence lengths and their prefix sums; ``base(i)`` its first token's global offset. Documents
    are read when first asked for and kept (a block's own documents and its partners' few).
    """

    def __init__(self, index: CorpusIndex, documents: Sequence[int] | None = None):
        self.index = index
        self.documents = documents
        self._offsets: dict[int, list[int]] = {}
        self.lengths = _Lengths(self)
        self.offsets = _Offsets(self)

    def __len__(self) -> int:
        return len(self.index) if self.documents is None else len(self.documents)

    def document(self, view_index: int) -> int:
        return view_index if self.documents is None else self.documents[view_index]

    def base(self, view_index: int) -> int:
        return int(self.index.sentence_starts[self.index.document_starts[self.document(view_index)]])

    def _relative_offsets(self, view_index: int) -> list[int]:
        if view_index not in self._offsets:
            offsets = self.index.token_offsets(self.document(view_index))
            self._offsets[view_index] = (offsets - offsets[0]).tolist()
        return self._offsets[view_index]


class _Offsets:
    def __init__(self, view: DocumentsView):
        self._view = view

    def __len__(self) -> int:
        return len(self._view)

    def __getitem__(self, view_index: int) -> list[int]:
        return self._view._relative_offsets(view_index)


class _Lengths(_Offsets):
    def __getitem__(self, view_index: int) -> list[int]:
        offsets = self._view._relative_offsets(view_index)
        return [b - a for a, b in zip(offsets, offsets[1:])]


__all__ = ["CorpusIndexWriter", "CorpusIndex", "DocumentsView"]
