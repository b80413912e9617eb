"""Reading corpora: BERT format, raw text with sentence splitting, and bad input."""

import gzip
import logging

import pytest
from pretraining_helpers import read_bert_format

from bertkit.errors import BertkitError
from bertkit.pretraining.corpus import (
    CorpusStats,
    iter_document_blocks,
    iter_documents,
    read_corpus_file,
    split_sentences,
)


def test_bert_format_documents_match_reference_reader(corpus_slice):
    stats = CorpusStats()
    documents = list(read_corpus_file(corpus_slice, stats=stats))
    assert documents == read_bert_format(corpus_slice)
    assert stats.documents == len(documents) == 300
    # The bracketed title line is kept as the first sentence, as the original does.
    assert documents[0][0] == "[Emma by Jane Austen 1816]"
    assert stats.input_files[0].size == corpus_slice.stat().st_size


def test_real_gzip_file_streams_with_hash(data_dir):
    import hashlib

    path = data_dir / "corpus" / "nltk2008.txt.gz"
    stats = CorpusStats()
    first_three = []
    for document in read_corpus_file(path, stats=stats):
        if len(first_three) < 3:
            first_three.append(document[0])
    assert first_three[0] == "[Emma by Jane Austen 1816]"
    assert first_three[1].startswith("[Persuasion")
    assert stats.documents == 635  # the data README's count
    assert stats.input_files[0].sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_plain_and_gzip_crlf_bom_blank_runs(tmp_path):
    text = "\ufeffFirst sentence.\r\nSecond one.\r\n\r\n\r\n\r\n[Title]\r\nThird.\r\n   \r\n"
    plain = tmp_path / "a.txt"
    plain.write_bytes(text.encode("utf-8"))
    packed = tmp_path / "b.bin"  # gzip recognised by content, not by name
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    expected = [["First sentence.", "Second one."], ["[Title]", "Third."]]
    assert list(read_corpus_file(plain)) == expected
    assert list(read_corpus_file(packed)) == expected
    # The end of one file ends its document; it never merges with the next file's first one.
    assert list(iter_documents([plain, packed])) == expected + expected


def test_split_sentences_keeps_abbreviations_decimals_and_quotes():
    assert split_sentences("Mr. Smith paid 3.14 dollars, e.g. for tea. He left.") == [
        "Mr. Smith paid 3.14 dollars, e.g. for tea.",
        "He left.",
    ]
    assert split_sentences('"Stop!" she said. "Why?" he asked. It was 2.5 km away.') == [
        '"Stop!" she said.',
        '"Why?" he asked.',
        "It was 2.5 km away.",
    ]
    assert split_sentences("Dr. J. R. Smith Jr. arrived. The U.S. grew 3.5% in Q1.") == [
        "Dr. J. R. Smith Jr. arrived.",
        "The U.S. grew 3.5% in Q1.",
    ]


def test_raw_paragraphs_join_hard_breaks_and_three_blank_lines_end_a_document(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(
        "CHAPTER I\n\nIt was a dark\nand stormy night. Mr. Brown\nslept.\n\n\nStill chapter one.\n"
        "\n\n\nCHAPTER II\n\nMorning came.\n",
        encoding="utf-8",
    )
    documents = list(read_corpus_file(path, raw=True))
    assert documents == [
        ["CHAPTER I", "It was a dark and stormy night. Mr. Brown slept.", "Still chapter one."],
        ["CHAPTER II", "Morning came."],
    ]
    assert split_sentences(documents[0][1]) == ["It was a dark and stormy night.", "Mr. Brown slept."]


def test_raw_gutenberg_book_is_split_into_chapters(data_dir):
    documents = list(read_corpus_file(data_dir / "corpus" / "raw" / "carroll-alice.txt", raw=True))
    # Title + chapter I, then one document per further chapter (XII chapters in the book).
    assert len(documents) == 12
    assert documents[0][0].startswith("[Alice's Adventures in Wonderland")
    assert documents[1][0] == "CHAPTER II. The Pool of Tears"
    assert all(d[0].startswith("CHAPTER") for d in documents[1:])
    # Hard line breaks are gone from paragraphs.
    assert all("\n" not in paragraph for d in documents for paragraph in d)


def test_missing_file_is_an_error_before_reading(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("A.\n", encoding="utf-8")
    with pytest.raises(BertkitError) as info:
        list(iter_documents([good, tmp_path / "nope.txt"]))
    assert info.value.path == str(tmp_path / "nope.txt")
    assert "not found" in str(info.value)


def test_empty_file_warns_and_counts(tmp_path, caplog):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    stats = CorpusStats()
    with caplog.at_level(logging.WARNING, logger="bertkit.pretraining"):
        assert list(read_corpus_file(empty, stats=stats)) == []
    assert stats.empty_files == [str(empty)]
    assert any(str(empty) in record.getMessage() for record in caplog.records)


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine line\n\nanother fine line\nbroken \xff\xfe here\n")
    with pytest.raises(BertkitError) as info:
        list(read_corpus_file(path))
    assert info.value.path == str(path) and info.value.line == 4
    assert str(info.value).startswith(f"{path}:4: invalid UTF-8")

    stats = CorpusStats()
    documents = list(read_corpus_file(path, stats=stats, encoding_errors="replace"))
    assert stats.undecodable_lines == 1
    assert documents[1][1] == "broken \ufffd\ufffd here"


def test_corrupt_gzip_is_reported(tmp_path):
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(gzip.compress(("sentence number one.\n" * 5000).encode())[:300])
    with pytest.raises(BertkitError) as info:
        list(read_corpus_file(path))
    assert info.value.path == str(path) and "gzip" in str(info.value)


def test_overlong_lines_are_split_at_whitespace_and_counted(tmp_path):
    words = [f"w{i}" for i in range(30_000)]
    long_line = " ".join(words)  # ~200k characters
    path = tmp_path / "long.txt"
    path.write_text(f"short.\n{long_line}\nend.\n", encoding="utf-8")
    stats = CorpusStats()
    [document] = list(read_corpus_file(path, stats=stats, max_line_chars=50_000))
    assert stats.long_lines_split == 1
    pieces = document[1:-1]
    assert len(pieces) >= 4 and all(len(p) <= 50_000 for p in pieces)
    assert " ".join(pieces).split() == words  # nothing lost, no word cut


def test_huge_documents_are_cut_and_blocks_group_documents(tmp_path):
    path = tmp_path / "docs.txt"
    text = "\n\n".join("\n".join(f"doc{d} sentence {s}." for s in range(50)) for d in range(6))
    path.write_text(text, encoding="utf-8")
    stats = CorpusStats()
    documents = list(read_corpus_file(path, stats=stats, max_document_chars=400))
    assert stats.documents_split > 0
    assert all(sum(map(len, d)) <= 400 + 30 for d in documents)
    flat = [s for d in documents for s in d]
    assert flat == [f"doc{d} sentence {s}." for d in range(6) for s in range(50)]
    blocks = list(iter_document_blocks(documents, block_chars=1000))
    assert [d for b in blocks for d in b] == documents


def test_blocks_reach_the_size_and_a_small_remainder_joins_the_last_block():
    def sizes(document_sizes, block_chars=1000):
        documents = [["x" * n] for n in document_sizes]
        return [[len(d[0]) for d in block] for block in iter_document_blocks(documents, block_chars)]

    assert sizes([600, 600, 600, 100]) == [[600, 600], [600, 100]]  # 700 >= half a block: kept
    assert sizes([600, 600, 600, 600, 100]) == [[600, 600], [600, 600, 100]]  # 100 joins
    assert sizes([300]) == [[300]]
    assert sizes([1200, 300]) == [[1200, 300]]
