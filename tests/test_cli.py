"""The command line: every command listed, tokenize on stdin, one-line errors with exit status 2."""

import subprocess
import sys

from bertkit.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for name in ("train-tokenizer", "tokenize", "create-pretraining-data", "pretrain", "finetune", "evaluate",
                 "extract-features", "reproduce", "plot"):
        assert name in out and name in COMMANDS


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
