"""The promise of docs/reference/command-line.md ("Bad input stops with one line"), for every command
`bertkit --help` lists (cli.COMMANDS): bad input stops with one `error:` line and exit status 2, no
traceback; an input named as the output is never replaced, with --overwrite or without. A command
added to cli.COMMANDS without a case here fails this file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fuzz.fuzz_strategies import run_cli_stderr, write_tiny_model

from bertkit import cli


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("promise")
    model = write_tiny_model(root / "model")
    (root / "corpus.txt").write_text("the cat sat on the mat .\na dog is on the mat .\n\nwhat is a cat ?\n")
    (root / "junk.bin").write_bytes(b"\xff\xfe\x00garbage\x00" * 8)
    (root / "train.csv").write_text("text,label\nthe cat,a\na dog,b\n")
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    data = root / "pt"
    data.mkdir()
    (data / "manifest.json").write_text("{not json")
    tok = root / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text((model / "vocab.txt").read_text())
    return {"root": root, "model": model, "corpus": root / "corpus.txt", "junk": root / "junk.bin",
            "train": root / "train.csv", "run": run, "data": data, "tok": tok}


# command -> (argv with bad input, argv naming an input as the output (None: writes no file), the input)
def cases(ws):
    m, c, j, r = ws["model"], ws["corpus"], ws["junk"], ws["root"]
    return {
        "train-tokenizer": (["train-tokenizer", "--input", j, "--output", r / "t1", "--vocab-size", "50"],
                            ["train-tokenizer", "--input", ws["tok"] / "vocab.txt", "--output", ws["tok"],
                             "--vocab-size", "50", "--overwrite"], ws["tok"] / "vocab.txt"),
        "tokenize": (["tokenize", "--vocab", j], None, None),
        "create-pretraining-data": (["create-pretraining-data", "--input", j, "--vocab", m / "vocab.txt", "--output",
                                     r / "cpd1", "--no-progress"],
                                    ["create-pretraining-data", "--input", c, "--vocab", m / "vocab.txt", "--output",
                                     r / "cpd2", "--dump-jsonl", c, "--overwrite", "--no-progress"], c),
        "pretrain": (["pretrain", "--train-data", ws["data"], "--output", r / "pt1", "--max-steps", "1"],
                     ["pretrain", "--train-data", ws["data"], "--init-from", m, "--output", m, "--overwrite"],
                     m / "model.safetensors"),
        "finetune": (["finetune", "text-classification", "--model", m, "--train-file", j, "--dev-file", j,
                      "--output", r / "ft1"],
                     ["finetune", "text-classification", "--model", m, "--train-file", ws["train"], "--dev-file",
                      ws["train"], "--test-file", ws["train"], "--output", r / "ft2", "--text-column", "label",
                      "--label-column", "label"], ws["train"]),
        "predict": (["predict", "text-classification", "--model", m, "--input", j, "--output", r / "p1.jsonl"],
                    ["predict", "embeddings", "--model", m, "--input", c, "--output", c, "--overwrite"], c),
        "serve": (["serve", "--model", j], None, None),
        "export": (["export", "--model", j, "--output", r / "e1.onnx"],
                   ["export", "--model", m, "--output", m / "model.safetensors", "--overwrite"],
                   m / "model.safetensors"),
        "evaluate": (["evaluate", "squad", j, j], None, None),
        "extract-features": (["extract-features", "--model", m, "--input", j, "--output", r / "f1.jsonl"],
                             ["extract-features", "--model", m, "--input", c, "--output", c, "--overwrite"], c),
        "reproduce": (["reproduce", "--budget", j, "--output", r / "rep1"],
                      ["reproduce", "--budget", "smoke", "--data-dir", r, "--vocab", ws["tok"] / "vocab.txt",
                       "--output", ws["tok"], "--dry-run"], ws["tok"] / "vocab.txt"),
        "plot": (["plot", r / "missing-run"],
                 ["plot", ws["run"], "--output", m, "--overwrite"], m / "model.safetensors"),
        "mine-hard-negatives": (["mine-hard-negatives", "--model", m, "--train-file", j, "--output", r / "mh1.csv"],
                                ["mine-hard-negatives", "--model", m, "--train-file", ws["train"], "--output",
                                 ws["train"], "--overwrite"], ws["train"]),
        "convert": (["convert", "--from-tf", j, "--output", r / "c1"],
                    ["convert", "--from-tf", Path(__file__).parent / "fixtures" / "tf" / "pretrained", "--output",
                     Path(__file__).parent / "fixtures" / "tf" / "pretrained", "--overwrite"],
                    Path(__file__).parent / "fixtures" / "tf" / "pretrained" / "vocab.txt"),
    }


def test_every_listed_command_has_a_case(ws):
    assert set(cases(ws)) == set(cli.COMMANDS)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_bad_input_stops_with_one_line(ws, capsys, command):
    bad, _, _ = cases(ws)[command]
    code, err = run_cli_stderr(bad, capsys)  # asserts: no traceback; exit 2 with one `error:` line, the last
    assert code == 2, err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_inputs_are_never_replaced(ws, capsys, command):
    _, argv, source = cases(ws)[command]
    if argv is None:  # a command that writes no file (stdout, a server) takes no --output to misuse
        sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices[command]
        assert "--output" not in sub._option_string_actions
        return
    before = digest(source)
    code, err = run_cli_stderr(argv, capsys)  # refused (2), or (plot: PNGs beside the model) nothing replaced
    assert code in (0, 2), err
    assert digest(source) == before
