"""`bertkit.finetune(task, ...)`: the Python call of `bertkit finetune TASK` on your own files, with
the command line's defaults (one run as transformers' Trainer: lr 5e-5, batch 8, 3 epochs; the
paper's grid with grid="paper") and the same results.json for the same data and settings."""

import dataclasses
import json

import pytest

import bertkit
from bertkit.cli import build_parser, main
from bertkit.errors import BertkitError
from bertkit.tasks import custom
from bertkit.tasks.settings import RunSettings

OWN_DATA = {"text-classification": custom.TEXT_DEFAULTS, "token-classification": custom.TOKEN_DEFAULTS,
            "multiple-choice": custom.MC_DEFAULTS, "question-answering": custom.QA_DEFAULTS}




def _reviews(path, n):
    words = [("a wonderful film", "positive"), ("a dull mess", "negative"), ("truly great", "positive"),
             ("I hated it", "negative")]
    path.write_text("text,label\n" + "".join(f"{words[i % 4][0]} {i},{words[i % 4][1]}\n" for i in range(n)),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("task", OWN_DATA)
def test_the_python_defaults_are_the_command_lines(task):
    args = build_parser({"finetune"}).parse_args(["finetune", task, "--model", "m", "--train-file", "t",
                                                  "--output", "o"])
    defaults = OWN_DATA[task]
    from_flags = RunSettings.from_args(args, defaults)
    assert from_flags == custom.own_data_settings(defaults)
    assert (from_flags.learning_rates, from_flags.batch_sizes, from_flags.epochs) == ((5e-5,), (8,), (3,))
    paper = build_parser({"finetune"}).parse_args(["finetune", task, "--model", "m", "--train-file", "t",
                                                   "--output", "o", "--grid", "paper"])
    assert RunSettings.from_args(paper, defaults) == \
        custom.own_data_settings(defaults, grid="paper")
    assert custom.own_data_settings(defaults, grid="paper").batch_sizes == defaults.batch_sizes


def test_one_value_or_a_list_and_unknown_names_refused():
    s = custom.own_data_settings(custom.TEXT_DEFAULTS, learning_rate=3e-5, epochs=1, batch_size=[4, 8], seed=7)
    assert (s.learning_rates, s.epochs, s.batch_sizes, s.seeds) == ((3e-5,), (1,), (4, 8), (7,))
    assert custom.own_data_settings(custom.TEXT_DEFAULTS, num_train_epochs=2).epochs == (2,)
    with pytest.raises(TypeError, match="learning_rat"):
        custom.own_data_settings(custom.TEXT_DEFAULTS, learning_rat=1e-4)
    with pytest.raises(BertkitError, match="grid"):
        custom.own_data_settings(custom.TEXT_DEFAULTS, grid="small")


def test_python_call_writes_what_the_command_writes(base_model, tmp_path):
    train, dev = _reviews(tmp_path / "train.csv", 16), _reviews(tmp_path / "dev.csv", 8)
    flags = ["--epochs", "1", "--batch-size", "4", "--device", "cpu"]
    assert main(["finetune", "text-classification", "--model", str(base_model), "--train-file", str(train),
                 "--dev-file", str(dev), "--output", str(tmp_path / "cli"), *flags]) == 0
    result = bertkit.finetune("text-classification", model=str(base_model), train_file=train, dev_file=dev,
                              output=tmp_path / "api", epochs=1, batch_size=4, device="cpu")
    by_cli, by_call = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("cli", "api"))
    assert by_call["metrics"] == by_cli["metrics"] == result.metrics
    assert [r["config"] for r in by_call["runs"]] == [r["config"] for r in by_cli["runs"]]
    assert by_call["runs"][0]["config"]["learning_rate"] == 5e-5 and len(by_call["runs"]) == 1
    assert (tmp_path / "api" / "model" / "model.safetensors").is_file()
    # The same through one RunSettings value (issue 42's shape): identical again.
    settings = dataclasses.replace(custom.own_data_settings(custom.TEXT_DEFAULTS), epochs=(1,), batch_sizes=(4,),
                                   device="cpu")
    again = custom.finetune("text-classification", str(base_model), train, dev_file=dev, settings=settings)
    assert again.metrics == result.metrics


def test_unknown_task_is_one_line():
    with pytest.raises(BertkitError, match="unknown task 'ner'"):
        bertkit.finetune("ner", model="m", train_file="t")
