"""Shared fixtures for the pre-training data tests: a slice of the real corpus and datasets built from it."""

import gzip
from pathlib import Path

import pytest
from pretraining_helpers import read_bert_format

from bertkit.pretraining import create_pretraining_data

# The slice: the first 300 documents of nltk2008 (books, speeches, Brown texts), each cut to its
# first 40 sentences, so tests see real document structure at a size that builds in ~1 s.
SLICE_DOCUMENTS = 300
SLICE_SENTENCES = 40
MAX_SEQ_LENGTH = 128


@pytest.fixture(scope="session")
def tokenizer(uncased_vocab):
    from bertkit.tokenizer import BertTokenizer

    return BertTokenizer.from_pretrained(str(uncased_vocab))


@pytest.fixture(scope="session")
def corpus_slice(data_dir, tmp_path_factory) -> Path:
    documents = []
    with gzip.open(data_dir / "corpus" / "nltk2008.txt.gz", "rt", encoding="utf-8") as f:
        current: list[str] = []
        for line in f:
            line = line.strip()
            if line:
                current.append(line)
                continue
            if current:
                documents.append(current[:SLICE_SENTENCES])
                current = []
                if len(documents) == SLICE_DOCUMENTS:
                    break
    path = tmp_path_factory.mktemp("corpus") / "slice.txt"
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def mini_corpus(corpus_slice, tmp_path_factory) -> Path:
    """A smaller slice (60 documents x 20 sentences) for end-to-end checks that need no statistics."""
    documents = [d[:20] for d in read_bert_format(corpus_slice)[:60]]
    path = tmp_path_factory.mktemp("mini") / "mini.txt"
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def source_token_documents(corpus_slice, tokenizer) -> list[list[list[int]]]:
    """The slice's documents as token ids per sentence (empty sentences dropped, as the original does)."""
    documents = read_bert_format(corpus_slice)
    sentences = [s for d in documents for s in d]
    encoded = iter(tokenizer.encode_ids_batch(sentences))
    out = []
    for document in documents:
        ids = [next(encoded) for _ in document]
        ids = [s for s in ids if s]
        if ids:
            out.append(ids)
    return out


def _build(corpus_slice, uncased_vocab, tmp_path_factory, name, **options):
    output = tmp_path_factory.mktemp(name)
    options.setdefault("dupe_factor", 2)
    options.setdefault("block_chars", 400_000)  # several blocks, so block handling is exercised
    summary = create_pretraining_data(
        [corpus_slice], uncased_vocab, output, max_seq_length=MAX_SEQ_LENGTH, seed=7, progress=False,
        overwrite=True, **options
    )
    return output, summary


@pytest.fixture(scope="session")
def static_dataset(corpus_slice, uncased_vocab, tmp_path_factory):
    """(directory, summary, dump path) of a statically masked dataset with its JSONL dump."""
    dump = tmp_path_factory.mktemp("dump") / "instances.jsonl"
    output, summary = _build(corpus_slice, uncased_vocab, tmp_path_factory, "static", dump_jsonl=dump)
    return output, summary, dump


@pytest.fixture(scope="session")
def dynamic_dataset(corpus_slice, uncased_vocab, tmp_path_factory):
    return _build(corpus_slice, uncased_vocab, tmp_path_factory, "dynamic", masking="dynamic")
