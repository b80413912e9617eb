"""The command line: every command listed, tokenize on stdin, one-line errors with exit status 2."""

import subprocess
import sys

import pytest

from bertkit.cli import COMMANDS, build_parser, main
from bertkit.errors import BertkitError
from bertkit.tasks.registry import TASKS


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0  # main turns argparse's SystemExit into a return code
    out = capsys.readouterr().out
    for name in ("train-tokenizer", "tokenize", "create-pretraining-data", "pretrain", "finetune", "evaluate",
                 "extract-features", "reproduce", "plot"):
        assert name in out and name in COMMANDS
    with pytest.raises(SystemExit) as exit_info:  # the parser itself exits, as argparse does
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0


def test_every_task_of_the_table_has_its_commands(capsys):
    for verb in ("finetune", "predict", "evaluate"):
        assert main([verb, "--help"]) == 0
        listed = capsys.readouterr().out
        for task in TASKS.values():
            name = task.evaluate if verb == "evaluate" else task.name
            if name and hasattr(task.task, f"run_{verb}"):
                assert name in listed, (verb, name)


@pytest.mark.parametrize("argv, old", [
    (["finetune", "ner", "--model", "m", "--output", "o", "--max-train-sentences", "5"], "--max-train-sentences"),
    (["finetune", "squad", "--model", "m", "--output", "o", "--train-file", "t", "--max-dev-examples", "5"],
     "--max-dev-examples"),
    (["predict", "squad", "--model", "m", "--output", "o", "--input", "i", "--data-file", "d"], "--data-file"),
    (["pretrain", "--train-data", "t", "--data", "d", "--output", "o", "--max-steps", "1"], "--data"),
])
def test_the_old_spellings_of_renamed_flags_are_gone(argv, old):
    """bertkit was never released: a renamed flag has one spelling."""
    with pytest.raises(BertkitError, match=f"unrecognized arguments: {old} "):
        build_parser().parse_args(argv)


def test_tokenize_reads_stdin_lines(uncased_vocab):
    run = subprocess.run([sys.executable, "-m", "bertkit", "tokenize", "--vocab", str(uncased_vocab), "--tokens"],
                         input="Hello, World!\n\nunaffable\n", capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["hello , world !", "", "una ##ffa ##ble"]
    ids = subprocess.run([sys.executable, "-m", "bertkit", "tokenize", "--vocab", str(uncased_vocab)],
                         input="hello\n", capture_output=True, text=True)
    assert ids.stdout.split() == ["7592"]  # no [CLS] / [SEP]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope" / "vocab.txt"
    assert main(["tokenize", "--vocab", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(missing) in err and "\n" not in err
