"""conlleval chunk scoring: hand-computed cases for IOB1/IOB2/IOBES, the counting pass against
chunk-set intersection, and the real CoNLL-2003 dev set with an independently counted corruption."""

import random

import pytest

from bertkit.errors import BertkitError
from bertkit.metrics import conll_chunks, evaluate_conll, evaluate_conll_file
from bertkit.metrics.conll import split_tag


def test_split_tag():
    assert split_tag("B-PER") == ("B", "PER")
    assert split_tag("I-ADJ-P") == ("I", "ADJ-P")  # types may contain hyphens
    assert split_tag("O") == ("O", "")


def test_iob1_chunks():
    # IOB1: I-X opens a chunk after O or another type; B-X only splits two adjacent same-type chunks.
    assert conll_chunks(["I-PER", "I-PER", "B-PER"]) == [("PER", 0, 2), ("PER", 2, 3)]
    assert conll_chunks(["O", "I-LOC", "I-LOC", "O"]) == [("LOC", 1, 3)]
    assert conll_chunks(["I-ORG", "I-LOC", "I-LOC"]) == [("ORG", 0, 1), ("LOC", 1, 3)]


def test_iob2_chunks():
    assert conll_chunks(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]
    assert conll_chunks(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 1), ("PER", 1, 3)]
    # An I- tag of another type does not continue the chunk: it starts its own.
    assert conll_chunks(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 3)]
    # A stray I- after O starts a chunk (conlleval does not repair it away).
    assert conll_chunks(["O", "I-PER", "I-PER"]) == [("PER", 1, 3)]
    assert conll_chunks(["O", "O"]) == []


def test_iobes_and_ioe_chunks():
    tags = ["S-PER", "S-PER", "B-LOC", "E-LOC", "B-LOC", "I-LOC", "E-LOC", "O", "S-ORG"]
    assert conll_chunks(tags) == [("PER", 0, 1), ("PER", 1, 2), ("LOC", 2, 4), ("LOC", 4, 7), ("ORG", 8, 9)]
    # IOE1: E-X marks the end of a chunk only when the next chunk has the same type.
    assert conll_chunks(["I-NP", "E-NP", "I-NP", "O"]) == [("NP", 0, 2), ("NP", 2, 3)]


def test_evaluate_conll_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-MISC", "O"]]
    # Gold chunks PER(0,2) LOC(3,4) ORG(0,1); predicted PER(0,1) LOC(3,4) MISC(0,1): only LOC is right.
    # Tags right: B-PER, O, B-LOC, O -> 4 of 6 tokens.
    result = evaluate_conll(gold, pred)
    assert (result["precision"], result["recall"], result["f1"]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert result["accuracy"] == pytest.approx(4 / 6)
    counts = (result["tokens"], result["gold_chunks"], result["predicted_chunks"], result["correct_chunks"])
    assert counts == (6, 3, 3, 1)
    per_type = result["per_type"]
    assert list(per_type) == ["LOC", "MISC", "ORG", "PER"]
    assert per_type["LOC"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1, "predicted": 1, "correct": 1}
    assert per_type["PER"]["f1"] == 0.0 and per_type["PER"]["support"] == 1
    assert per_type["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1, "predicted": 0, "correct": 0}
    assert per_type["MISC"]["support"] == 0 and per_type["MISC"]["predicted"] == 1


def test_partial_overlaps_are_wrong():
    gold = [["B-PER", "I-PER", "I-PER", "O"]]
    for pred in (["B-PER", "I-PER", "O", "O"], ["O", "B-PER", "I-PER", "O"], ["B-PER", "I-PER", "I-PER", "I-PER"],
                 ["B-PER", "I-PER", "B-PER", "O"], ["B-PER", "I-LOC", "I-PER", "O"]):
        assert evaluate_conll(gold, [pred])["correct_chunks"] == 0, pred
    result = evaluate_conll([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "B-LOC", "I-LOC"]])
    # PER right; LOC(2,4) vs LOC(3,4) wrong: P = 1/2, R = 1/2.
    assert (result["precision"], result["recall"]) == (0.5, 0.5)


def test_iob1_scheme_scored_like_iob2():
    iob1 = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]
    iob2 = [["B-PER", "I-PER", "B-PER", "O", "B-LOC"]]
    result = evaluate_conll(iob1, iob2)
    assert result["f1"] == 1.0 and result["correct_chunks"] == 3
    assert result["accuracy"] == pytest.approx(3 / 5)  # the tags themselves differ at 0 and 4


def test_sentences_are_separated():
    # After a sentence boundary, I-PER starts a new chunk: two gold chunks, not one.
    assert evaluate_conll([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]])["gold_chunks"] == 2


def test_bad_sequences():
    with pytest.raises(BertkitError, match="sentence 1: 2 gold tags but 1 predicted"):
        evaluate_conll([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(BertkitError, match="1 gold sentences but 2 predicted"):
        evaluate_conll([["O"]], [["O"], ["O"]])
    with pytest.raises(BertkitError, match="no tokens"):
        evaluate_conll([], [])


def test_counting_pass_equals_chunk_intersection_on_random_tags():
    # conlleval counts correct chunks in one streaming pass; the same number must come out of
    # intersecting the chunk sets that conll_chunks reads from each sentence.
    rng = random.Random(0)
    tag_sets = {
        "iob": ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
        "iobes": ["O", "O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "E-LOC", "S-LOC", "I-LOC"],
    }
    for tags in tag_sets.values():
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(300)]
        pred = [[t if rng.random() < 0.7 else rng.choice(tags) for t in sentence] for sentence in gold]
        expected_correct = expected_gold = expected_predicted = 0
        for gold_tags, pred_tags in zip(gold, pred):
            gold_chunks, pred_chunks = set(conll_chunks(gold_tags)), set(conll_chunks(pred_tags))
            expected_correct += len(gold_chunks & pred_chunks)
            expected_gold += len(gold_chunks)
            expected_predicted += len(pred_chunks)
        result = evaluate_conll(gold, pred)
        assert (result["correct_chunks"], result["gold_chunks"], result["predicted_chunks"]) == (
            expected_correct, expected_gold, expected_predicted)
        assert 0 < expected_correct < expected_gold


# --------------------------------------------------------------------------- files


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_file_format(tmp_path):
    lines = [
        "-DOCSTART- -X- O O",  # an ordinary token for conlleval: counted, tags O/O
        "",
        "John NNP B-PER B-PER",
        "Smith NNP I-PER O",
        "-X- -X- B-PER B-PER",  # a boundary line: its tags are ignored
        "Paris NNP B-LOC B-LOC",
    ]
    result = evaluate_conll_file(_write_lines(tmp_path / "out.txt", lines))
    assert result["tokens"] == 4 and result["accuracy"] == pytest.approx(3 / 4)
    assert (result["gold_chunks"], result["predicted_chunks"], result["correct_chunks"]) == (2, 2, 1)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("\r\n".join(lines).encode("utf-8"))
    assert evaluate_conll_file(crlf) == result


def test_file_errors(tmp_path):
    with pytest.raises(BertkitError) as err:
        evaluate_conll_file(_write_lines(tmp_path / "short.txt", ["John B-PER B-PER", "", "Smith B-PER"]))
    assert err.value.line == 3 and "short.txt:3:" in str(err.value) and "at least 3 columns" in str(err.value)
    with pytest.raises(BertkitError, match="expected 3 columns like line 1, found 4") as err:
        evaluate_conll_file(_write_lines(tmp_path / "ragged.txt", ["John B-PER B-PER", "Smith NNP I-PER I-PER"]))
    assert err.value.line == 2
    with pytest.raises(BertkitError, match="not found"):
        evaluate_conll_file(tmp_path / "nothing.txt")
    with pytest.raises(BertkitError, match="no tokens"):
        evaluate_conll_file(_write_lines(tmp_path / "blank.txt", ["", ""]))


# --------------------------------------------------------------------------- CoNLL-2003 dev


@pytest.fixture(scope="module")
def conll_dev(data_dir):
    """Lines of valid.txt as lists of columns ([] for blank lines)."""
    with open(data_dir / "conll2003" / "valid.txt", encoding="utf-8") as handle:
        return [line.split() for line in handle]


def _iob2_entities(lines):
    """(line index of each tag, list of entities as (type, [line indices])) for valid IOB2 data."""
    entities, current = [], None
    for index, fields in enumerate(lines):
        tag = fields[-1] if fields else "O"
        if tag.startswith("B-"):
            current = (tag[2:], [index])
            entities.append(current)
        elif tag.startswith("I-"):
            assert current is not None and current[0] == tag[2:], f"not IOB2 at line {index + 1}"
            current[1].append(index)
        else:
            current = None
    return entities


def test_conll2003_dev_gold_against_itself(conll_dev, tmp_path):
    path = _write_lines(tmp_path / "dev_gold.txt", [" ".join(f + f[-1:]) for f in conll_dev])
    result = evaluate_conll_file(path)
    assert result["f1"] == 1.0 and result["accuracy"] == 1.0
    # 51,362 words + 216 -DOCSTART- lines, which conlleval counts as tokens.
    assert result["tokens"] == 51578
    # The official CoNLL-2003 English dev entity counts.
    supports = {t: v["support"] for t, v in result["per_type"].items()}
    assert supports == {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}
    assert result["gold_chunks"] == 5942


def test_conll2003_dev_corrupted_counts(conll_dev, tmp_path):
    gold_tags = [f[-1] if f else None for f in conll_dev]
    predicted = list(gold_tags)
    entities = _iob2_entities(conll_dev)
    types = ["LOC", "MISC", "ORG", "PER"]
    deleted = 0
    for number, (entity_type, indices) in enumerate(entities):
        if number % 5 == 0:  # wrong type, same span
            new_type = types[(types.index(entity_type) + 1) % 4]
            for k, index in enumerate(indices):
                predicted[index] = ("B-" if k == 0 else "I-") + new_type
        elif number % 5 == 1:  # last token dropped (a one-token entity disappears)
            predicted[indices[-1]] = "O"
            deleted += len(indices) == 1
    # Spurious one-token MISC entities on every 40th O token whose neighbours are O or boundaries.
    spurious = 0
    outside = [i for i, tag in enumerate(gold_tags) if tag == "O" and conll_dev[i][0] != "-DOCSTART-"]
    for i in outside[::40]:
        if all(j < 0 or j >= len(gold_tags) or predicted[j] in (None, "O") for j in (i - 1, i + 1)):
            predicted[i] = "B-MISC"
            spurious += 1
    changed_tokens = sum(1 for g, p in zip(gold_tags, predicted) if g != p)

    lines = [" ".join(f + [p]) if f else "" for f, p in zip(conll_dev, predicted)]
    result = evaluate_conll_file(_write_lines(tmp_path / "dev_corrupted.txt", lines))
    untouched = sum(1 for number in range(len(entities)) if number % 5 not in (0, 1))
    assert result["gold_chunks"] == len(entities) == 5942
    assert result["predicted_chunks"] == len(entities) - deleted + spurious
    assert result["correct_chunks"] == untouched
    assert result["accuracy"] == pytest.approx((51578 - changed_tokens) / 51578)
    precision = untouched / (len(entities) - deleted + spurious)
    recall = untouched / len(entities)
    assert result["f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    assert spurious > 500 and deleted > 100


def test_conll2003_dev_noisy_counts_pinned_from_conlleval_pl(conll_dev, tmp_path):
    # 10% of predicted tags replaced at random, 5% of gold B- tags turned into I- (IOB1-style).
    # The expected counts come from running conlleval.pl (version 2004-01-26) on this file.
    rng = random.Random(3)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    lines = []
    for fields in conll_dev:
        if not fields:
            lines.append("")
            continue
        gold = fields[-1]
        predicted = gold if rng.random() < 0.9 else rng.choice(tags)
        if rng.random() < 0.05 and gold.startswith("B-"):
            gold = "I" + gold[1:]
        lines.append(" ".join(fields[:-1] + [gold, predicted]))
    result = evaluate_conll_file(_write_lines(tmp_path / "dev_noisy.txt", lines))
    counts = (result["tokens"], result["gold_chunks"], result["predicted_chunks"], result["correct_chunks"])
    assert counts == (51578, 5942, 9811, 5213)
    assert result["accuracy"] == 46930 / 51578
    assert {t: (v["support"], v["predicted"], v["correct"]) for t, v in result["per_type"].items()} == {
        "LOC": (1837, 2765, 1664), "MISC": (922, 1927, 829), "ORG": (1341, 2316, 1155), "PER": (1842, 2803, 1565)}
    # conlleval prints: precision 53.13%; recall 87.73%; FB1 66.18
    assert round(100 * result["precision"], 2) == 53.13
    assert round(100 * result["recall"], 2) == 87.73
    assert round(100 * result["f1"], 2) == 66.18
