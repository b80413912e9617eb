"""Issues 26 (item 3) and 30: every command's output goes through one check and one atomic writer, tables
through one reader, numeric flags through one validation, weights and losses through finite checks.
One test per defect class of the audit; each failed before the fix (exit 0 with a destroyed input, a
hang, a silent wrong result or a traceback)."""

from __future__ import annotations

import csv
import errno
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from fuzz.fuzz_strategies import run_cli, run_cli_stderr, tiny_vocab, write_tiny_model

from bertkit import flags
from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.heads import BertForMaskedLM, BertForSequenceClassification
from bertkit.outputs import atomic_folder, check_output, output_format


def _save(cls, directory: Path, **config) -> Path:
    vocab = tiny_vocab()
    torch.manual_seed(0)
    model = cls(BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=64, **config))
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text('{"do_lower_case": true}\n', encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs_models")
    nan = _save(BertForMaskedLM, root / "nan")
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(nan / "model.safetensors"))
    key = next(k for k in tensors if k.endswith("attention.self.query.weight"))
    tensors[key][0, 0] = float("nan")
    save_file(tensors, str(nan / "model.safetensors"), metadata={"format": "pt"})
    return {"enc": write_tiny_model(root / "enc"), "qa": write_tiny_model(root / "qa", qa_head=True),
            "cls": _save(BertForSequenceClassification, root / "cls", num_labels=2),
            "mlm": _save(BertForMaskedLM, root / "mlm"), "nan": nan, "nan_key": key}


def predict(models, tmp_path, task, text, name="in.jsonl", output="out.jsonl", *extra, model=None):
    source = tmp_path / name
    source.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    target = output if output == "-" else tmp_path / output
    argv = ["predict", task, "--model", model or models["cls"], "--input", source, "--output", target, *extra]
    return source, target, argv


TWO = '{"id": "a", "text": "the cat"}\n{"id": "b", "text": "a dog"}\n'


# ---- outputs: never an input, never an existing file unasked, format from the extension


def test_predict_output_equal_to_its_input_directly_or_by_link_is_refused(models, tmp_path, capsys):
    source, _, argv = predict(models, tmp_path, "text-classification", TWO)
    (tmp_path / "link.jsonl").symlink_to(source)
    os.link(source, tmp_path / "hard.jsonl")
    for target in (source, tmp_path / "link.jsonl", tmp_path / "hard.jsonl"):
        argv[argv.index("--output") + 1] = target
        code, err = run_cli_stderr(argv + ["--overwrite"], capsys)
        assert code == 2 and ("also an input" in err or "symbolic link" in err), err
    assert source.read_text() == TWO


def test_predict_refuses_an_existing_output_unless_overwrite(models, tmp_path, capsys):
    _, target, argv = predict(models, tmp_path, "text-classification", TWO)
    target.write_text("keep\n")
    code, err = run_cli_stderr(argv, capsys)
    assert code == 2 and "already exists; pass --overwrite" in err and target.read_text() == "keep\n"
    assert run_cli(argv + ["--overwrite"], capsys) == 0
    assert [json.loads(line)["id"] for line in target.read_text().splitlines()] == ["a", "b"]


def test_predict_with_an_empty_input_leaves_the_existing_output(models, tmp_path, capsys):
    _, target, argv = predict(models, tmp_path, "text-classification", "\n\n")
    target.write_text("keep\n")
    code, err = run_cli_stderr(argv + ["--overwrite"], capsys)
    assert code == 2 and "no inputs found" in err
    assert target.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no temporary left


def test_predict_to_stdout_writes_no_file_named_dash(models, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, _, argv = predict(models, tmp_path, "text-classification", TWO, "in.jsonl", "-")
    assert run_cli(argv, capsys) == 0 or True
    assert not (tmp_path / "-").exists()


def test_predict_stdout_content(models, tmp_path, capfd):
    from bertkit.cli import main
    _, _, argv = predict(models, tmp_path, "text-classification", TWO, "in.jsonl", "-")
    assert main([str(a) for a in argv]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]


def test_embeddings_to_npy_and_safetensors_match_the_jsonl_vectors(models, tmp_path, capsys):
    _, jsonl, argv = predict(models, tmp_path, "embeddings", TWO, model=models["enc"])
    assert run_cli(argv, capsys) == 0
    expected = np.array([json.loads(line)["embedding"] for line in jsonl.read_text().splitlines()], dtype=np.float32)
    argv[argv.index("--output") + 1] = tmp_path / "emb.npy"
    assert run_cli(argv, capsys) == 0
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), expected, rtol=1e-6)
    argv[argv.index("--output") + 1] = tmp_path / "emb.safetensors"
    assert run_cli(argv, capsys) == 0
    from safetensors.numpy import load_file
    np.testing.assert_allclose(load_file(str(tmp_path / "emb.safetensors"))["embeddings"], expected, rtol=1e-6)


@pytest.mark.parametrize("task,name", [("text-classification", "out.npy"), ("text-classification", "out.parquet"),
                                       ("embeddings", "out.txt")])
def test_an_extension_naming_another_format_is_refused(models, tmp_path, capsys, task, name):
    _, target, argv = predict(models, tmp_path, task, TWO, output=name,
                              model=models["enc"] if task == "embeddings" else None)
    code, err = run_cli_stderr(argv, capsys)
    assert code == 2 and not target.exists()


def test_output_format_rules():
    assert output_format("a.jsonl", ("jsonl", "tsv")) == "jsonl"
    assert output_format("-", ("jsonl", "npy"), default="jsonl") == "jsonl"
    with pytest.raises(BertkitError, match="binary"):
        output_format("-", ("npy",), given="npy")
    with pytest.raises(BertkitError, match="names jsonl"):
        output_format("a.jsonl", ("jsonl", "tsv"), given="tsv")
    assert check_output("-", inputs=["-"]) is None  # stdout is never an input file


def test_export_into_the_model_folder_is_refused_and_existing_needs_overwrite(models, tmp_path, capsys):
    weights = models["enc"] / "model.safetensors"
    before = weights.read_bytes()
    for target in (weights, models["enc"] / "vocab.txt"):
        code, err = run_cli_stderr(["export", "--model", models["enc"], "--output", target, "--overwrite"], capsys)
        assert code == 2
    assert weights.read_bytes() == before
    existing = tmp_path / "model.onnx"
    existing.write_text("keep")
    code, err = run_cli_stderr(["export", "--model", models["enc"], "--output", existing], capsys)
    assert code == 2 and "--overwrite" in err and existing.read_text() == "keep"


def test_plot_twice_needs_overwrite_and_an_empty_metrics_file_is_an_error(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1.0 / i}) + "\n" for i in (1, 2)))
    assert run_cli(["plot", run], capsys) == 0
    first = (run / "loss.png").read_bytes()
    code, err = run_cli_stderr(["plot", run], capsys)
    assert code == 2 and "--overwrite" in err and (run / "loss.png").read_bytes() == first
    assert run_cli(["plot", run, "--overwrite"], capsys) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    code, err = run_cli_stderr(["plot", empty], capsys)
    assert code == 2 and "empty" in err


def test_convert_refuses_a_short_vocabulary_and_converting_in_place(tmp_path, capsys):
    import shutil
    source = tmp_path / "tf"
    shutil.copytree(Path(__file__).parent / "fixtures" / "tf" / "pretrained", source)
    vocab = (source / "vocab.txt").read_text()
    code, err = run_cli_stderr(["convert", "--from-tf", source, "--output", source, "--overwrite"], capsys)
    assert code == 2 and "also an input" in err and (source / "vocab.txt").read_text() == vocab
    assert run_cli(["convert", "--from-tf", source, "--output", tmp_path / "hf"], capsys) == 0
    code, err = run_cli_stderr(["convert", "--from-tf", source, "--output", tmp_path / "hf"], capsys)
    assert code == 2 and "--overwrite" in err
    (source / "vocab.txt").write_text("".join(line + "\n" for line in vocab.splitlines()[:-3]))
    code, err = run_cli_stderr(["convert", "--from-tf", source, "--output", tmp_path / "hf2"], capsys)
    assert code == 2 and "vocab_size" in err


# ---- one table reader


@pytest.mark.parametrize("name,content,ids", [
    ("quoted.csv", 'id,text\n1,"the cat\nsat"\n2,a dog\n', ["1", "2"]),
    ("bom.csv", "\ufeffid,text\n1,the cat\n2,a dog\n", ["1", "2"]),
    ("cr.csv", "id,text\r1,the cat\r2,a dog\r", ["1", "2"]),
    ("crlf.tsv", "id\ttext\r\n1\tthe cat\r\n2\ta dog\r\n", ["1", "2"]),
])
def test_csv_semantics_in_predict(models, tmp_path, capsys, name, content, ids):
    _, target, argv = predict(models, tmp_path, "text-classification", content, name)
    assert run_cli(argv, capsys) == 0
    assert [json.loads(line)["id"] for line in target.read_text().splitlines()] == ids


@pytest.mark.parametrize("content,message", [("text,text\na,b\n", "names column 'text' twice"),
                                             ("id,words\n1,a\n", "no column 'text'")])
def test_duplicate_and_missing_columns_are_refused_by_name(models, tmp_path, capsys, content, message):
    _, _, argv = predict(models, tmp_path, "text-classification", content, "in.csv")
    code, err = run_cli_stderr(argv, capsys)
    assert code == 2 and message in err and "in.csv:1" in err


def test_tsv_output_quotes_tabs_and_line_breaks(models, tmp_path, capsys):
    _, target, argv = predict(models, tmp_path, "text-classification",
                              'id,text\n"a\rb",the cat\n"c\td",a dog\n"e\nf",the mat\n', "in.csv", "out.tsv")
    assert run_cli(argv, capsys) == 0
    with open(target, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    assert [r[0] for r in rows] == ["id", "a\rb", "c\td", "e\nf"]
    assert len(target.read_bytes().replace(b"\r", b"\n").split(b"\n")) == 4 + 3  # only inside quoted fields


def test_finetune_reader_refusals(tmp_path):
    from bertkit.tasks.user_files import is_regression, read_text_file
    (tmp_path / "dup.csv").write_text("text,text,label\na,b,c\n")
    with pytest.raises(BertkitError, match="twice"):
        read_text_file(tmp_path / "dup.csv", "text", "label")
    (tmp_path / "ok.csv").write_text("text,label\nthe cat,0.5\na dog,nan\nthe mat,inf\n")
    with pytest.raises(BertkitError, match="--text-column and --label-column both name column 'label'"):
        read_text_file(tmp_path / "ok.csv", "label", "label")
    with pytest.raises(BertkitError, match="no column 'nope'"):
        read_text_file(tmp_path / "ok.csv", "text", "label", id_column="nope")
    train = read_text_file(tmp_path / "ok.csv", "text", "label")
    with pytest.raises(BertkitError, match=r"ok.csv:3: label 'nan' is not a finite number"):
        is_regression(train, None)
    (tmp_path / "words.csv").write_text("text,label\nthe cat,nan\na dog,good\n")  # a class called "nan" is fine
    assert is_regression(read_text_file(tmp_path / "words.csv", "text", "label"), None) is False


# ---- numeric flags


@pytest.mark.parametrize("flag,value", [("--doc-stride", "0"), ("--doc-stride", "-5"), ("--max-answer-length", "0"),
                                        ("--top-k", "0"), ("--max-batch-tokens", "0")])
def test_question_answering_numeric_flags_refused_while_parsing(models, tmp_path, capsys, flag, value):
    _, target, argv = predict(models, tmp_path, "question-answering",
                              '{"question": "what sat", "context": "the cat sat on the mat"}\n', model=models["qa"])
    code, err = run_cli_stderr(argv + [f"{flag}={value}"], capsys)
    assert code == 2 and flag in err and not target.exists()


def test_fill_mask_top_k_beyond_the_vocabulary_lists_every_token(models, tmp_path, capsys):
    _, target, argv = predict(models, tmp_path, "fill-mask", "the [MASK] sat\n", "in.txt", model=models["mlm"])
    assert run_cli(argv + ["--top-k", "100000"], capsys) == 0
    predictions = json.loads(target.read_text())["predictions"]
    assert len(predictions) == len(tiny_vocab())
    assert abs(sum(p["score"] for p in predictions) - 1) < 1e-4


def test_a_context_without_tokens_is_one_line(models, tmp_path, capsys):
    _, _, argv = predict(models, tmp_path, "question-answering",
                         '{"question": "what", "context": "\\u0001\\u0002 \\u0003"}\n', model=models["qa"])
    code, err = run_cli_stderr(argv, capsys)
    assert code == 2 and "in.jsonl:1" in err and "nothing to answer" in err


@pytest.mark.parametrize("text,seconds", [("900", 900), ("90s", 90), ("15m", 900), ("1.5m", 90), ("2h", 7200),
                                          ("1h30m", 5400), (" 1H ", 3600), ("168h", 604800)])
def test_time_budget_parser_accepts(text, seconds):
    assert flags.duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["1.5.5m", "100000000000h", "1e9h", "169h", "0", "-1m", "1h70m", "1m30s", "h",
                                  "", "nan", "inf", "1.5h30m", "15 m", "١٥m"])
def test_time_budget_parser_refuses(text):
    with pytest.raises(ValueError):
        flags.duration_seconds(text)


# ---- finite weights and losses


def test_nan_weights_are_refused_at_load_by_every_command(models, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("the cat\n")
    for argv in (["extract-features", "--model", models["nan"], "--input", tmp_path / "in.txt", "--output",
                  tmp_path / "f.jsonl", "--layers", "-1"],
                 ["predict", "fill-mask", "--model", models["nan"], "--input", tmp_path / "in.txt", "--output",
                  tmp_path / "p.jsonl"]):
        code, err = run_cli_stderr(argv, capsys)
        assert code == 2 and models["nan_key"].removeprefix("bert.") in err and "NaN" in err, err
    assert not (tmp_path / "f.jsonl").exists() and not (tmp_path / "p.jsonl").exists()


def test_training_stops_at_the_first_non_finite_loss_and_keeps_the_checkpoint(tmp_path):
    from bertkit.train import Phase, TrainArgs, fit
    from bertkit.train.loop import latest_checkpoint

    class Batches:
        def __init__(self):
            self.calls = 0

        def num_batches(self, epoch):
            return 4

        def batches(self, epoch, start=0):
            for i in range(start, 4):
                yield {"input_ids": torch.full((2, 6), 5), "attention_mask": torch.ones(2, 6, dtype=torch.long),
                       "labels": torch.tensor([0, 1])}

    model = BertForSequenceClassification(BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=16, num_labels=2))
    forward = model.forward
    step = {"n": 0}

    def poisoned(**batch):
        out = forward(**batch)
        step["n"] += 1
        if step["n"] == 3:
            out["loss"] = out["loss"] * float("nan")
        return out

    model.forward = poisoned
    args = TrainArgs(output_dir=str(tmp_path), learning_rate=1e-3, save_steps=1, logging_steps=1, device="cpu",
                     precision="fp32", progress=False)
    with pytest.raises(BertkitError, match="training loss is nan at step 3"):
        fit(model, [Phase(Batches(), epochs=1, name="p")], args)
    last = latest_checkpoint(tmp_path)
    assert last is not None and last.name == "checkpoint-2"
    from safetensors.torch import load_file
    assert all(torch.isfinite(t).all() for t in load_file(str(last / "model.safetensors")).values())


# ---- operating-system failures: one line, exit 2, no temporary left


def test_disk_full_while_writing_predictions_and_checkpoints(models, tmp_path, capsys, monkeypatch):
    _, target, argv = predict(models, tmp_path, "embeddings", TWO, output="emb.npy", model=models["enc"])

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    code, err = run_cli_stderr(argv, capsys)
    assert code == 2 and "No space left on device" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError):
        with atomic_folder(tmp_path / "checkpoint-1") as folder:
            (folder / "config.json").write_text("{}")
            torch.save({}, folder / "state.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_atomic_files_and_folders_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_folder(tmp_path / "run") as folder:
            (folder / "a").write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o750


def test_version(capsys):
    from bertkit import __version__
    from bertkit.cli import main
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bertkit {__version__}"
