"""The one runner every fine-tuning task goes through (tasks/runner.py) and what an own-data command
does as a Trainer user expects: one run at a stated learning rate unless `--grid paper`, dev held
out with --dev-fraction, no dev data -> one run trained and saved without selection, micro-batches
(--grad-accum) and early stopping that keeps the best evaluation's weights. Also a task added as one
file plus one registry line (tasks/paws.py).

Models are tiny (random weights, all-MiniLM-L6-v2's vocabulary) and runs take a few steps."""

import argparse
import json
import logging

import pytest
import torch

from bertkit import BertForSequenceClassification
from bertkit.cli import main
from bertkit.tasks.registry import TASKS
from bertkit.tasks.settings import RunSettings
from bertkit.tasks.sweep import Sweep, run_protocol

QUICK = ["--epochs", "1", "--batch-size", "4", "--precision", "fp32", "--device", "cpu"]




def _reviews(path, n):
    words = [("a wonderful film", "positive"), ("a dull mess", "negative"), ("truly great", "positive"),
             ("I hated it", "negative")]
    lines = ["text,label"] + [f"{words[i % 4][0]} {i},{words[i % 4][1]}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(base_model, tmp_path, *flags):
    out = tmp_path / "out"
    code = main(["finetune", "text-classification", "--model", str(base_model), "--output", str(out), *QUICK, *flags])
    results = json.loads((out / "results.json").read_text()) if code == 0 else None
    return code, out, results


def test_own_data_makes_one_run_at_the_stated_rate_and_the_papers_grid_on_request(base_model, tmp_path):
    train, dev = _reviews(tmp_path / "train.csv", 16), _reviews(tmp_path / "dev.csv", 8)
    code, _, one = _run(base_model, tmp_path / "one", "--train-file", str(train), "--dev-file", str(dev))
    assert code == 0 and [r["config"]["learning_rate"] for r in one["runs"]] == [5e-5]  # transformers' Trainer's
    code, _, paper = _run(base_model, tmp_path / "paper", "--train-file", str(train), "--dev-file", str(dev),
                          "--grid", "paper")
    assert code == 0 and [r["config"]["learning_rate"] for r in paper["runs"]] == [5e-5, 4e-5, 3e-5, 2e-5]
    assert paper["best"]["score"] == max(r["score"] for r in paper["runs"])


def test_dev_fraction_holds_out_part_of_train_and_no_dev_trains_and_saves(base_model, tmp_path, capsys):
    train = _reviews(tmp_path / "train.csv", 20)
    code, out, held = _run(base_model, tmp_path / "held", "--train-file", str(train), "--dev-fraction", "0.25")
    assert code == 0 and (held["num_train_examples"], held["num_dev_examples"]) == (15, 5)
    assert held["dev_fraction"] == 0.25 and len((out / "dev_predictions.tsv").read_text().splitlines()) == 6

    code, out, alone = _run(base_model, tmp_path / "alone", "--train-file", str(train))
    assert code == 0 and alone["selection"].startswith("none") and alone["metrics"] == {}
    assert (out / "model" / "model.safetensors").is_file() and not (out / "dev_predictions.tsv").exists()
    # A grid without dev has nothing to choose by: refused before any training, in one line.
    code, _, _ = _run(base_model, tmp_path / "grid", "--train-file", str(train), "--learning-rate", "1e-3,1e-4")
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert code == 2 and len(errors) == 1 and "without dev data there is nothing to choose" in errors[0]


def test_grad_accum_on_every_own_data_command(base_model, tmp_path, capsys):
    train, dev = _reviews(tmp_path / "train.csv", 16), _reviews(tmp_path / "dev.csv", 8)
    code, _, results = _run(base_model, tmp_path / "ok", "--train-file", str(train), "--dev-file", str(dev),
                            "--grad-accum", "2")
    assert code == 0 and results["grad_accum"] == 2
    code, _, _ = _run(base_model, tmp_path / "odd", "--train-file", str(train), "--dev-file", str(dev),
                      "--grad-accum", "3")
    assert code == 2 and "--batch-size 4 is not a multiple of --grad-accum 3" in capsys.readouterr().err
    for name in ("text-classification", "token-classification", "multiple-choice", "question-answering", "glue",
                 "swag", "ner", "paws"):
        parser = argparse.ArgumentParser()
        TASKS[name].task.add_finetune_arguments(parser)
        options = {a.dest for a in parser._actions}
        assert {"grad_accum", "early_stopping_patience"} <= options, name
        if name in ("text-classification", "token-classification", "multiple-choice", "swag"):
            assert "dev_fraction" in options, name


def test_early_stopping_keeps_the_best_evaluations_weights(tiny_model, tmp_path):
    # Dev "scores" fall after the first epoch: with patience 2 the run stops after the third epoch's
    # evaluation (of 6 epochs) and ends on the weights of the first, the best.
    directory = tiny_model(BertForSequenceClassification, tmp_path / "tiny")
    generator = torch.Generator().manual_seed(0)
    features = [{"input_ids": [101, *torch.randint(1000, 2000, (5,), generator=generator).tolist(), 102],
                 "token_type_ids": [0] * 7, "attention_mask": [1] * 7, "labels": i % 2} for i in range(8)]
    seen = []

    def evaluate(model):
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"accuracy": [0.9, 0.5, 0.4, 0.8, 0.8, 0.8][len(seen) - 1]}, {"dev": len(seen)}

    config = dict(learning_rate=1e-2, epochs=6, batch_size=4, seed=1)
    settings = RunSettings(precision="fp32", device="cpu", early_stopping_patience=2)
    best, runs = run_protocol(Sweep([config], lambda: BertForSequenceClassification.from_pretrained(directory),
                                    features, evaluate, lambda m: m["accuracy"], settings))
    model, outputs = best.artifacts
    assert len(seen) == 3 and outputs == {"dev": 1} and best.metrics == {"accuracy": 0.9}
    assert all(torch.equal(v, seen[0][k]) for k, v in model.state_dict().items())
    assert not torch.equal(seen[0]["classifier.weight"], seen[2]["classifier.weight"])  # it did train on


def test_a_new_task_is_one_file_and_one_registry_line(base_model, tmp_path):
    # tasks/paws.py: PAWS's TSV layout (id, sentence1, sentence2, label), the runner does the rest.
    folder = tmp_path / "data" / "paws"
    folder.mkdir(parents=True)
    pairs = [("the cat sat on the mat", "the mat sat on the cat", 0), ("he ran fast", "he ran quickly", 1)]
    for split, n in (("train", 12), ("dev", 4), ("test", 4)):
        rows = ["id\tsentence1\tsentence2\tlabel"] + [f"{i}\t{a} {i}\t{b}\t{y}" for i, (a, b, y) in
                                                      ((i, pairs[i % 2]) for i in range(n))]
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["finetune", "paws", "--model", str(base_model), "--data-dir", str(tmp_path / "data"),
                 "--output", str(out), "--learning-rate", "1e-3", *QUICK]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "paws" and set(results["metrics"]) == {"accuracy", "f1"}
    assert set(results["test_metrics"]) == {"accuracy", "f1"} and (out / "model" / "config.json").is_file()
    assert len((out / "dev_predictions.tsv").read_text().splitlines()) == 5


def test_a_tab_separates_a_pair_in_every_text_input():
    from bertkit.features import parse_text

    assert parse_text("a b\tc d") == ("a b", "c d") and parse_text("a ||| b") == ("a", "b")
    assert parse_text("one text") == ("one text", None)


def test_token_classification_holds_out_dev_stops_early_and_trains_without_dev(base_model, tmp_path):
    sentences = ["Take O\naspirin B-DRUG\ndaily O", "Stop O\nibuprofen B-DRUG\nsodium I-DRUG\nnow O"]
    (tmp_path / "train.conll").write_text("\n\n".join(sentences * 4) + "\n", encoding="utf-8")  # 8 sentences
    common = ["finetune", "token-classification", "--model", str(base_model), "--train-file",
              str(tmp_path / "train.conll"), "--learning-rate", "1e-3", *QUICK]
    held = tmp_path / "held"
    assert main([*common, "--output", str(held), "--dev-fraction", "0.25", "--epochs", "4",
                 "--early-stopping-patience", "1", "--grad-accum", "2"]) == 0
    results = json.loads((held / "results.json").read_text())
    assert results["sentences"] == {"train": 6, "valid": 2} and results["best"]["dev"] is not None
    evaluations = [r for r in map(json.loads, (held / "metrics.jsonl").read_text().splitlines()) if r.get("eval")]
    assert 2 <= len(evaluations) <= 4  # one per epoch until the patience runs out
    alone = tmp_path / "alone"
    assert main([*common, "--output", str(alone)]) == 0
    results = json.loads((alone / "results.json").read_text())
    assert results["selection"].startswith("none") and results["best"]["dev"] is None
    assert (alone / "model" / "model.safetensors").is_file()


def test_conll_ner_runs_through_the_runner_and_resumes(base_model, tmp_path, caplog):
    # CoNLL NER is a task object like the others: its sweep is the runner's (runs/<run>/result.json,
    # --resume keeps finished runs), its test file is scored every run beside dev without selecting,
    # and its results.json keeps NER's layout (best / runs with dev and test conlleval scores).
    from bertkit.tasks import ner

    assert not hasattr(ner, "run_sweep") and issubclass(ner.NerTask, ner.Task)
    data = tmp_path / "conll"
    data.mkdir()
    sentence = ("-DOCSTART- -X- O O\n\nTake X X O\naspirin X X B-DRUG\n\n"
                "Stop X X O\nibuprofen X X B-DRUG\nsodium X X I-DRUG\n\n")
    for split, copies in (("train", 3), ("valid", 1), ("test", 1)):
        (data / f"{split}.txt").write_text(sentence * copies, encoding="utf-8")
    out = tmp_path / "out"
    argv = ["finetune", "ner", "--model", str(base_model), "--data-dir", str(data), "--output", str(out),
            "--learning-rate", "1e-3,1e-4", "--max-seq-length", "32", *QUICK]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["config"]["learning_rate"] for r in results["runs"]] == [1e-3, 1e-4]
    assert all({"f1", "accuracy"} <= set(r["dev"]) and {"f1", "accuracy"} <= set(r["test"]) for r in results["runs"])
    best = max(results["runs"], key=lambda r: r["dev"]["f1"])
    assert results["best"]["dev"] == best["dev"] and results["best"]["test"] == best["test"]
    assert results["sentences"] == {"train": 6, "valid": 2, "test": 2}
    assert results["labels"] == ["O", "B-DRUG", "I-DRUG"]
    assert {"dev_f1", "test_f1"} <= set(results["summary"][0])
    for run in ("lr0.001_ep1_bs4_seed42", "lr0.0001_ep1_bs4_seed42"):
        assert (out / "runs" / run / "result.json").is_file()
    assert (out / "test_predictions.txt").is_file() and (out / "dev_predictions.txt").is_file()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bertkit"):
        assert main([*argv, "--resume"]) == 0
    # a finished sweep keeps its records but not the best model (saved in OUTPUT/model): the best run runs again
    assert "1 finished run(s) kept" in caplog.text
    resumed = json.loads((out / "results.json").read_text())
    assert [r["dev"] for r in resumed["runs"]] == [r["dev"] for r in results["runs"]]
    assert resumed["best"] == results["best"]
