"""GLUE readers: every real file against the data README's counts and an independent csv-module
parse; MNLI / QQP / QNLI-train on files written here in the official layout; BOMs, literal quotes,
malformed rows (error naming file:line, or skipped and counted), task names and folder layouts."""

import csv
import io

import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.glue import (GLUE_TASKS, glue_task, load_glue_split, load_glue_task, read_glue_file,
                                task_folder)

# (train, dev) counts from shared/data/README.md (checked there against the official numbers).
README_COUNTS = {"cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408), "stsb": (5749, 1500),
                 "rte": (2490, 277), "wnli": (635, 71)}


def reference_rows(path, header: bool):
    """The file as Python's csv module reads it with quoting off (independent of bertkit's reader)."""
    text = path.read_text(encoding="utf-8-sig")
    rows = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
    rows = [r for r in rows if r]
    return (rows[0], rows[1:]) if header else (None, rows)


@pytest.mark.parametrize("task", sorted(README_COUNTS))
def test_real_files_match_readme_counts_and_csv_parse(data_dir, task):
    train, dev, test = load_glue_task(task, data_dir)
    assert (len(train), len(dev)) == README_COUNTS[task]
    spec = glue_task(task)
    for split, examples in (("train", train), ("dev", dev), ("test", test)):
        path = task_folder(spec, data_dir) / f"{split}.tsv"
        has_header = not (spec.name == "cola" and split != "test")
        header, rows = reference_rows(path, has_header)
        assert len(examples) == len(rows), split
        if header is None:  # CoLA train/dev: source, label, original mark, sentence
            expected = [(r[3], None, r[1]) for r in rows]
        else:
            col = {name: header.index(name) for name in header}
            label_column = None if split == "test" else spec.label
            expected = [(r[col[spec.text_a]], r[col[spec.text_b]] if spec.text_b else None,
                         r[col[label_column]] if label_column else None) for r in rows]
        got = [(e.text_a, e.text_b, None if e.label is None else
                (f"{e.label:.3f}" if spec.is_regression else e.label)) for e in examples]
        if spec.is_regression and split != "test":
            expected = [(a, b, f"{float(s):.3f}") for a, b, s in expected]
        assert got == expected, split
        if split == "test":  # test files carry the index the GLUE server expects
            assert [e.index for e in examples] == [r[header.index("index")] for r in rows]


def test_label_vocabularies_on_real_dev_sets(data_dir):
    assert {e.label for e in load_glue_split("rte", data_dir, "dev")} == {"entailment", "not_entailment"}
    assert {e.label for e in load_glue_split("qnli", data_dir, "dev")} == {"entailment", "not_entailment"}
    for task in ("cola", "sst-2", "mrpc", "wnli"):
        assert {e.label for e in load_glue_split(task, data_dir, "dev")} == {"0", "1"}
    scores = [e.label for e in load_glue_split("sts-b", data_dir, "dev")]
    assert min(scores) == 0.0 and max(scores) == 5.0
    # The first STS-B dev row, read by hand from the file.
    first = load_glue_split("sts-b", data_dir, "dev")[0]
    assert (first.text_a, first.text_b, first.label) == (
        "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)


def test_qnli_and_diagnostic_real_files(data_dir):
    assert len(load_glue_split("qnli", data_dir, "dev")) == 5463
    assert len(load_glue_split("qnli", data_dir, "test")) == 5463
    ax = load_glue_split("ax", data_dir, "test")
    # diagnostic.tsv: 1,105 lines = a header + 1,104 sentence pairs indexed 0..1103.
    assert len(ax) == 1104 and ax[0].index == "0" and ax[-1].index == "1103"
    assert ax[0].text_a == "The cat sat on the mat." and ax[0].text_b == "The cat did not sit on the mat."
    assert all(e.label is None for e in ax)


def test_cola_has_no_header_but_its_test_file_does(data_dir):
    train, dev, test = load_glue_task("CoLA", data_dir)
    # The first line of train.tsv is data, not a header: it must not be lost.
    assert train[0].text_a == "Our friends won't buy this analysis, let alone the next one we propose."
    assert train[0].line == 1 and train[0].label == "1"
    assert test[0].index == "0" and test[0].text_a == "Bill whistled past the house."


def test_mrpc_bom_and_literal_quotes(data_dir):
    path = task_folder(glue_task("mrpc"), data_dir) / "train.tsv"
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")  # the real file starts with a BOM
    train = load_glue_split("mrpc", data_dir, "train")
    assert train[0].label == "1" and train[0].text_a.startswith("Amrozi accused his brother")
    # A quote opens no quoted field: the text keeps it and the row keeps its 5 columns.
    assert train[0].text_a.count('"') == 2
    dev = load_glue_split("mrpc", data_dir, "dev")
    assert dev[0].text_b.startswith('" The foodservice pie business')


# ---- tasks not obtainable here: files in the official layout written by the test

MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                     "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:10] + ["label1", "label2", "label3", "label4", "label5", "gold_label"]


def mnli_row(i, s1, s2, labels):
    return [str(i), str(1000 + i), f"{1000 + i}e", "fiction", f"( {s1} )", f"( {s2} )", f"(ROOT {s1})",
            f"(ROOT {s2})", s1, s2] + labels


def write_tsv(path, header, rows, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(r) for r in rows]
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def mnli_dir(tmp_path):
    folder = tmp_path / "glue" / "MNLI"
    write_tsv(folder / "train.tsv", MNLI_TRAIN_HEADER, [
        mnli_row(0, 'He said "hi.', "He spoke.", ["entailment", "entailment"]),
        mnli_row(1, "The cat sleeps.", "The cat runs.", ["contradiction", "contradiction"]),
        mnli_row(2, "It rains.", "It is Monday.", ["neutral", "neutral"])])
    write_tsv(folder / "dev_matched.tsv", MNLI_DEV_HEADER, [
        mnli_row(0, "A man eats.", "Someone eats.", ["entailment"] * 5 + ["entailment"]),
        mnli_row(1, "A man eats.", "Nobody eats.", ["contradiction", "neutral", "contradiction", "contradiction",
                                                    "contradiction", "contradiction"])])
    write_tsv(folder / "dev_mismatched.tsv", MNLI_DEV_HEADER, [
        mnli_row(0, "Prices rose.", "Prices fell.", ["contradiction"] * 5 + ["contradiction"])])
    write_tsv(folder / "test_matched.tsv", MNLI_TRAIN_HEADER[:10], [mnli_row(7, "a b.", "c d.", [])])
    write_tsv(folder / "test_mismatched.tsv", MNLI_TRAIN_HEADER[:10], [mnli_row(9, "e f.", "g h.", [])])
    return tmp_path


def test_mnli_official_layout(mnli_dir):
    train, dev, test = load_glue_task("MNLI", mnli_dir)
    assert [(e.text_a, e.text_b, e.label) for e in train] == [
        ('He said "hi.', "He spoke.", "entailment"), ("The cat sleeps.", "The cat runs.", "contradiction"),
        ("It rains.", "It is Monday.", "neutral")]
    assert [e.label for e in dev] == ["entailment", "contradiction"]  # gold_label, not label1..5
    mismatched = load_glue_split("mnli", mnli_dir, "dev_mismatched")
    assert [(e.text_a, e.label) for e in mismatched] == [("Prices rose.", "contradiction")]
    assert [(e.index, e.text_a, e.label) for e in test] == [("7", "a b.", None)]
    assert [e.index for e in load_glue_split("mnli", mnli_dir, "test_mismatched")] == ["9"]


def test_mnli_bad_gold_label(mnli_dir):
    path = mnli_dir / "glue" / "MNLI" / "train.tsv"
    with path.open("a") as f:
        f.write("\t".join(mnli_row(3, "x.", "y.", ["neutral", "-"])) + "\n")  # '-': no annotator consensus
    with pytest.raises(BertkitError) as err:
        load_glue_split("mnli", mnli_dir, "train")
    assert err.value.path == str(path) and err.value.line == 5 and "'-'" in str(err.value)
    examples = load_glue_split("mnli", mnli_dir, "train", skip_bad_rows=True)
    assert len(examples) == 3 and len(examples.skipped) == 1 and examples.skipped[0].startswith(f"{path}:5:")


def test_qqp_official_layout_and_malformed_row(tmp_path):
    folder = tmp_path / "QQP"  # DATA_DIR/<Task> is accepted as well as DATA_DIR/glue/<Task>
    write_tsv(folder / "train.tsv", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], [
        ["133273", "213221", "213222", "How is the life of a math student?", "Which is the best book?", "0"],
        ["402555", "536040", "536041", "How do I control my horny emotions?", "How do you control your horniness?", "1"],
        ["7", "8", "9", "A question with no pair and no label"],
        ["3", "4", "5", "Why?", "Why not?", "0"]])
    write_tsv(folder / "dev.tsv", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
              [["1", "2", "3", "Is it?", "Is it so?", "1"]])
    write_tsv(folder / "test.tsv", ["id", "question1", "question2"], [["0", "Where?", "Here?"], ["1", "Who?", "You?"]])
    with pytest.raises(BertkitError) as err:
        load_glue_task("qqp", tmp_path)
    assert err.value.path == str(folder / "train.tsv") and err.value.line == 4
    assert "expected 6 tab-separated fields" in str(err.value) and "found 4" in str(err.value)
    train, dev, test = load_glue_task("qqp", tmp_path, skip_bad_rows=True)
    assert [e.index for e in train] == ["133273", "402555", "3"] and len(train.skipped) == 1
    assert train[1].text_b == "How do you control your horniness?" and train[1].label == "1"
    assert [(e.index, e.text_a, e.text_b, e.label) for e in test] == [("0", "Where?", "Here?", None),
                                                                      ("1", "Who?", "You?", None)]


def test_qnli_train_layout_with_bom(tmp_path):
    path = tmp_path / "train.tsv"
    write_tsv(path, ["index", "question", "sentence", "label"], [
        ["0", "When did it open?", "It opened in 1901.", "entailment"],
        ["1", "Who built it?", "The roof is red.", "not_entailment"]], bom=True)
    examples = read_glue_file(path, "qnli", "train")
    assert [(e.index, e.text_a, e.text_b, e.label) for e in examples] == [
        ("0", "When did it open?", "It opened in 1901.", "entailment"),
        ("1", "Who built it?", "The roof is red.", "not_entailment")]


def test_stsb_unparsable_or_out_of_range_score(tmp_path):
    header = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
              "score"]
    row = ["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none", "A plane.", "A jet."]
    path = tmp_path / "dev.tsv"
    write_tsv(path, header, [row + ["3.800"], row + ["high"], row + ["7.5"], row + ["nan"]])
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, "sts-b", "dev")
    assert (err.value.path, err.value.line) == (str(path), 3) and "'high'" in str(err.value)
    examples = read_glue_file(path, "stsb", "dev", skip_bad_rows=True)
    assert [e.label for e in examples] == [3.8]
    assert [s.split(": ")[0] for s in examples.skipped] == [f"{path}:3", f"{path}:4", f"{path}:5"]


def test_missing_column_and_missing_files(tmp_path):
    path = tmp_path / "RTE" / "train.tsv"
    write_tsv(path, ["index", "premise", "hypothesis", "label"], [["0", "a", "b", "entailment"]])
    with pytest.raises(BertkitError) as err:
        read_glue_file(path, "rte", "train")
    assert err.value.line == 1 and "sentence1" in str(err.value)
    with pytest.raises(BertkitError, match="file not found"):
        load_glue_split("rte", tmp_path, "dev")
    with pytest.raises(BertkitError, match="no MRPC folder"):
        load_glue_task("mrpc", tmp_path)


def test_task_names_are_case_insensitive():
    assert glue_task("sst2") is glue_task("SST-2") is GLUE_TASKS["sst-2"]
    assert glue_task("STS-B") is glue_task("stsb") is GLUE_TASKS["sts-b"]
    assert glue_task("Mnli").folder == "MNLI" and glue_task("cola").folder == "CoLA"
    with pytest.raises(BertkitError, match="unknown GLUE task"):
        glue_task("squad")
