"""NotNext partners as the original create_pretraining_data.py draws them: a random document of the
whole corpus (every input file), never A's own, on half of the chunks that have a choice.

The corpus is synthetic so that every token names its document and sentence: sentence j of
document k is "dk sj" four times, with a vocabulary holding exactly those words. Four input files
of unequal size, in blocks of ~10 documents, so that a draw from the block (bertkit's earlier
scheme) and a draw from the corpus are told apart.
"""

import json

import numpy as np
import pytest
from pretraining_helpers import load_shard_arrays
from scipy import stats

from bertkit.pretraining import create_pretraining_data

DOCUMENTS_PER_FILE = (10, 20, 30, 40)
SENTENCES = 6
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
NUM_DOCUMENTS = sum(DOCUMENTS_PER_FILE)


def _document_and_sentence(token_id: int) -> tuple[str, int]:
    """('d', document) or ('s', sentence) for a corpus token id."""
    word_index = token_id - len(SPECIALS)
    if word_index < NUM_DOCUMENTS:
        return "d", word_index
    return "s", word_index - NUM_DOCUMENTS


@pytest.fixture(scope="module")
def synthetic_corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("partners")
    vocab = directory / "vocab.txt"
    words = [f"d{k}" for k in range(NUM_DOCUMENTS)] + [f"s{j}" for j in range(SENTENCES)]
    vocab.write_text("\n".join(SPECIALS + words) + "\n", encoding="utf-8")
    files, document = [], 0
    for file_index, count in enumerate(DOCUMENTS_PER_FILE):
        documents = []
        for _ in range(count):
            documents.append("\n".join(" ".join([f"d{document} s{j}"] * 4) for j in range(SENTENCES)))
            document += 1
        path = directory / f"part{file_index}.txt"
        path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
        files.append(path)
    file_of_document = np.repeat(np.arange(len(DOCUMENTS_PER_FILE)), DOCUMENTS_PER_FILE)
    return files, vocab, file_of_document


def _build(synthetic_corpus, output, **options):
    files, vocab, _ = synthetic_corpus
    summary = create_pretraining_data(files, vocab, output, max_seq_length=32, short_seq_prob=0.0, dupe_factor=10,
                                      masking="dynamic", seed=11, block_chars=2_000, progress=False, **options)
    return summary, load_shard_arrays(output)


def _rows(arrays):
    """Per instance: A's document, the sentences A holds, B's document, the NotNext label."""
    for ids, length, b_start, label in zip(arrays["input_ids"], arrays["lengths"], arrays["b_starts"],
                                           arrays["next_sentence_labels"]):
        a = [_document_and_sentence(int(t)) for t in ids[1 : int(b_start) - 1]]
        b = [_document_and_sentence(int(t)) for t in ids[int(b_start) : int(length) - 1]]
        a_documents = {v for kind, v in a if kind == "d"}
        b_documents = {v for kind, v in b if kind == "d"}
        assert len(a_documents) == 1 and len(b_documents) <= 1, "a segment mixes documents"
        # A segment of one token may be a sentence word alone; its document is then unknown.
        yield (a_documents.pop(), {v for kind, v in a if kind == "s"},
               b_documents.pop() if b_documents else None, int(label))


def _partner_file_test(rows, file_of_document):
    """Chi-square of (A's input file, the NotNext partner's input file) against the original's draw:
    for A in file f, the partner is uniform over the corpus's documents other than A's own, so it is
    in file g with probability (documents of g - [g == f]) / (documents - 1). Conditioning on A's
    file is what tells a draw from the whole corpus from one within a stretch of one file (both
    give the same marginal)."""
    sizes = np.asarray(DOCUMENTS_PER_FILE, dtype=float)
    observed = np.zeros((len(sizes), len(sizes)))
    for a_document, _, b_document, label in rows:
        if label == 1 and b_document is not None:
            observed[file_of_document[a_document], file_of_document[b_document]] += 1
    expected = (sizes[None, :] - np.eye(len(sizes))) / (NUM_DOCUMENTS - 1) * observed.sum(1, keepdims=True)
    assert expected.min() >= 5  # the chi-square approximation holds
    # The row totals are given, so (files - 1) fewer degrees of freedom.
    return observed.sum(0), stats.chisquare(observed.ravel(), expected.ravel(), ddof=len(sizes) - 1).pvalue


def test_partners_come_from_the_whole_corpus_as_its_documents_are_distributed(synthetic_corpus, tmp_path):
    summary, arrays = _build(synthetic_corpus, tmp_path / "corpus")
    _, _, file_of_document = synthetic_corpus
    rows = list(_rows(arrays))
    observed, pvalue = _partner_file_test(rows, file_of_document)
    assert observed.sum() > 1000
    assert pvalue > 1e-3, (observed, pvalue)

    # Never A's own document; IsNext B continues A's document.
    for a_document, _, b_document, label in rows:
        if b_document is not None:
            assert (b_document != a_document) if label else (b_document == a_document)
    assert summary["random_next_from_same_document"] == 0

    # The coin: a chunk of one sentence (here only a document's last, s5, alone in A) is always
    # NotNext; every other chunk is NotNext with probability 1/2.
    forced = [label for _, a_sentences, _, label in rows if SENTENCES - 1 in a_sentences]
    assert forced and all(forced)
    coin = [label for _, a_sentences, _, label in rows if SENTENCES - 1 not in a_sentences]
    assert stats.binomtest(sum(coin), len(coin), 0.5).pvalue > 1e-3

    # The manifest states the scheme and the per-file counts the test just measured.
    manifest = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    assert manifest["config"]["not_next_partners"] == "corpus"
    assert summary["documents_used_per_file"] == list(DOCUMENTS_PER_FILE)
    labels = arrays["next_sentence_labels"].astype(bool)
    assert sum(summary["not_next_partners_per_file"]) == labels.sum() == summary["not_next"]
    assert not (tmp_path / "corpus" / "corpus_index.tmp").exists()


def test_the_block_scheme_fails_the_partner_test(synthetic_corpus, tmp_path):
    """The same statistic rejects bertkit's earlier draw (the same block of ~10 documents), so the
    test above can fail."""
    summary, arrays = _build(synthetic_corpus, tmp_path / "block", not_next_partners="block")
    _, _, file_of_document = synthetic_corpus
    _, pvalue = _partner_file_test(list(_rows(arrays)), file_of_document)
    assert pvalue < 1e-6
    manifest = json.loads((tmp_path / "block" / "manifest.json").read_text())
    assert manifest["config"]["not_next_partners"] == "block"


def test_same_seed_same_data_whatever_the_workers(synthetic_corpus, tmp_path):
    _, one = _build(synthetic_corpus, tmp_path / "w1")
    _, two = _build(synthetic_corpus, tmp_path / "w2", workers=2)
    assert one.keys() == two.keys()
    for key in one:
        np.testing.assert_array_equal(one[key], two[key])


def test_the_loader_states_the_scheme_and_reads_older_data_as_block(synthetic_corpus, tmp_path):
    from bertkit.pretraining.shards import PretrainingDataset

    _build(synthetic_corpus, tmp_path / "data")
    assert PretrainingDataset(tmp_path / "data").not_next_partners == "corpus"
    manifest_path = tmp_path / "data" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["config"]["not_next_partners"]  # as data made before the choice existed
    manifest_path.write_text(json.dumps(manifest))
    assert PretrainingDataset(tmp_path / "data").not_next_partners == "block"
