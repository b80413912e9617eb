"""Issue 15, one test per defect: what used to destroy a file, hang, train on random weights or end in a
traceback now stops before any work with one `error:` line and exit status 2 (or works as asked)."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fuzz.fuzz_strategies import run_cli, run_cli_stderr, write_tiny_model

from bertkit.errors import BertkitError
from bertkit.pretraining import PretrainingDataset, create_pretraining_data
from bertkit.pretraining.corpus import read_corpus_file
from bertkit.tasks.squad import SquadPredictions

CORPUS = "the cat sat on the mat .\na dog is on the mat .\n\nwhat is a cat ?\nthe dog sat .\n\na cat is a cat .\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    glue = root / "data" / "glue" / "RTE"
    glue.mkdir(parents=True)
    header = "index\tsentence1\tsentence2\tlabel\n"
    glue.joinpath("train.tsv").write_text(header + "".join(
        f"{i}\tthe cat sat\ta dog\t{'entailment' if i % 2 else 'not_entailment'}\n" for i in range(4)))
    glue.joinpath("dev.tsv").write_text(header + "0\tthe cat\ta cat\tentailment\n")
    (root / "corpus.txt").write_text(CORPUS)
    return {"root": root, "model": write_tiny_model(root / "model"), "qa": write_tiny_model(root / "qa", qa_head=True),
            "data": root / "data", "corpus": root / "corpus.txt"}


def glue_argv(tiny, out, *extra):
    return ["finetune", "glue", "--task", "rte", "--model", tiny["model"], "--data-dir", tiny["data"], "--output", out,
            "--epochs", "1", "--max-seq-length", "16", "--precision", "fp32", *extra]


# ---- item 2: fine-tuning never overwrites a previous run's results


@pytest.mark.parametrize("command", [
    ["finetune", "glue", "--task", "rte", "--model", "M"],
    ["finetune", "swag", "--train-file", "T", "--model", "M"],
    ["finetune", "ner", "--model", "M"],
    ["finetune", "squad", "--train-file", "T", "--model", "M"],
    ["predict", "squad", "--input", "T", "--model", "M"],
])
def test_finetune_into_a_folder_with_results_refuses_before_any_work(command, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"precious": true}')
    # The model and data paths do not exist: the output check comes first, before any reading.
    code, err = run_cli_stderr(command + ["--output", out], capsys)
    assert code == 2 and "already holds" in err and "--overwrite" in err
    assert (out / "results.json").read_text() == '{"precious": true}'


def test_squad_resume_continues_in_its_own_folder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")
    code, err = run_cli_stderr(["finetune", "squad", "--model", tmp_path / "missing", "--train-file", "T",
                                "--output", out, "--resume"], capsys)
    assert code == 2 and "already holds" not in err  # it got past the output check (then found no model)


def test_finetune_overwrite_replaces_results(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(glue_argv(tiny, out), capsys) == 0
    first = (out / "RTE" / "results.json").read_text()
    assert run_cli(glue_argv(tiny, out), capsys) == 2
    assert run_cli(glue_argv(tiny, out, "--overwrite", "--seed", "7"), capsys) == 0
    assert (out / "RTE" / "results.json").read_text() != first


# ---- item 3: never clobber a file


def test_dump_jsonl_never_replaces_an_input_a_link_or_a_device(tiny, tmp_path, capsys):
    corpus, vocab = tiny["corpus"], tiny["model"] / "vocab.txt"
    link = tmp_path / "link.jsonl"
    link.symlink_to(corpus)
    base = ["create-pretraining-data", "--input", corpus, "--vocab", vocab, "--no-progress", "--overwrite"]
    for target in (corpus, link, vocab, Path("/dev/null"), tmp_path):
        assert run_cli(base + ["--output", tmp_path / "data", "--dump-jsonl", target], capsys) == 2
    assert corpus.read_text() == CORPUS and link.is_symlink()
    existing = tmp_path / "old.jsonl"
    existing.write_text("old\n")
    assert run_cli(base[:-1] + ["--output", tmp_path / "d2", "--dump-jsonl", existing], capsys) == 2
    assert existing.read_text() == "old\n"
    assert run_cli(base + ["--output", tmp_path / "d3", "--dump-jsonl", existing], capsys) == 0
    assert json.loads(existing.read_text().splitlines()[0])["tokens"][0] == "[CLS]"


def test_extract_features_output_equal_to_input_is_refused(tiny, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\n")
    code, err = run_cli_stderr(["extract-features", "--input", texts, "--model", tiny["model"], "--output", texts],
                               capsys)
    assert code == 2 and "also an input" in err
    assert texts.read_text() == "the cat sat\n"
    out = tmp_path / "f.jsonl"
    assert run_cli(["extract-features", "--input", texts, "--model", tiny["model"], "--output", out], capsys) == 0
    assert run_cli(["extract-features", "--input", texts, "--model", tiny["model"], "--output", out], capsys) == 2


def test_train_tokenizer_into_a_model_folder_keeps_its_vocabulary(tiny, tmp_path, capsys):
    model = tmp_path / "model"
    write_tiny_model(model)
    before = (model / "vocab.txt").read_bytes()
    argv = ["train-tokenizer", "--input", tiny["corpus"], "--vocab-size", "40", "--min-frequency", "1",
            "--output", model]
    assert run_cli(argv, capsys) == 2
    assert (model / "vocab.txt").read_bytes() == before
    assert run_cli(argv + ["--overwrite"], capsys) == 0
    assert (model / "vocab.txt").read_bytes() != before


# ---- item 4: no hangs


def test_max_line_chars_zero_or_negative_stops_at_once(tiny, tmp_path, capsys):
    signal.alarm(60)  # the old splitter looped forever: fail rather than hang the suite
    try:
        for value in ("0", "-5"):
            assert run_cli(["create-pretraining-data", "--input", tiny["corpus"], "--vocab", tiny["model"],
                            "--output", tmp_path / value, f"--max-line-chars={value}"], capsys) == 2
        with pytest.raises(BertkitError, match="max_line_chars"):
            list(read_corpus_file(tiny["corpus"], max_line_chars=0))
    finally:
        signal.alarm(0)


# ---- item 5: what belongs together is checked


@pytest.fixture
def pretraining_data(tiny, tmp_path):
    out = tmp_path / "data"
    create_pretraining_data(tiny["corpus"], tiny["model"], out, max_seq_length=16, max_predictions_per_seq=2,
                            dupe_factor=1, progress=False)
    return out


def test_data_vocabulary_must_match_the_manifest(pretraining_data):
    PretrainingDataset(pretraining_data)  # intact: loads
    vocab = pretraining_data / "vocab.txt"
    tokens = vocab.read_text().splitlines()
    vocab.write_text("\n".join(tokens[:-1] + ["zzz"]) + "\n")  # same size, another vocabulary
    with pytest.raises(BertkitError, match="SHA-256"):
        PretrainingDataset(pretraining_data)


def test_shard_ids_beyond_the_vocabulary_and_corrupt_shards_are_errors(pretraining_data):
    ids_path = pretraining_data / "shard_00000" / "input_ids.npy"
    ids = np.load(ids_path)
    bad = ids.copy()
    bad[0, 1] = 60000
    np.save(ids_path, bad)
    with pytest.raises(BertkitError, match="token id 60000"):
        PretrainingDataset(pretraining_data)
    ids_path.write_bytes(ids_path.read_bytes()[:40])  # truncated
    with pytest.raises(BertkitError, match="corrupt shard"):
        PretrainingDataset(pretraining_data)


def test_model_vocabulary_larger_than_its_embeddings_is_refused(tiny, tmp_path, capsys):
    model = tmp_path / "model"
    write_tiny_model(model)
    with open(model / "vocab.txt", "a") as handle:
        handle.write("".join(f"extra{i}\n" for i in range(10)))
    out = tmp_path / "out"
    assert run_cli(["finetune", "glue", "--task", "rte", "--model", model, "--data-dir", tiny["data"],
                    "--output", out, "--epochs", "1"], capsys) == 2
    assert not out.exists()


# ---- item 6: no silent random weights


def test_predict_with_a_checkpoint_without_the_span_head(tiny, tmp_path, capsys):
    data = tmp_path / "q.json"
    data.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "the cat sat on the mat", "qas": [{"id": "q1", "question": "what sat?", "answers": [
            {"text": "the cat", "answer_start": 0}]}]}]}]}))
    argv = ["predict", "squad", "--input", data, "--max-seq-length", "32", "--doc-stride", "8",
            "--max-query-length", "8"]
    code, err = run_cli_stderr(argv + ["--model", tiny["model"], "--output", tmp_path / "a"], capsys)
    assert code == 2 and "no task head" in err
    assert not (tmp_path / "a" / "predictions.json").exists()
    assert run_cli(argv + ["--model", tiny["model"], "--output", tmp_path / "b", "--allow-missing-weights"],
                   capsys) == 0
    assert run_cli(argv + ["--model", tiny["qa"], "--output", tmp_path / "c"], capsys) == 0


@pytest.mark.parametrize("layers", [2, 4])  # the checkpoint holds 3
def test_encoder_with_other_layer_count_than_config(tiny, tmp_path, capsys, layers):
    model = tmp_path / "model"
    write_tiny_model(model)
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (model / "config.json").write_text(json.dumps(config))
    texts = tmp_path / "t.txt"
    texts.write_text("the cat\n")
    argv = ["extract-features", "--input", texts, "--model", model, "--layers", "-1"]
    code, err = run_cli_stderr(argv + ["--output", tmp_path / "a.jsonl"], capsys)
    assert code == 2 and f"config.json's {layers} layers" in err
    assert run_cli(argv + ["--output", tmp_path / "b.jsonl", "--allow-missing-weights"], capsys) == 0


# ---- item 7: flags are checked before work


@pytest.mark.parametrize("flag", ["--batch-size=0", "--learning-rate=-1e-5", "--learning-rate=nan", "--epochs=0",
                                  "--epochs=-1", "--device=gpu", "--seed=-3", "--warmup-ratio=2",
                                  "--max-train-examples=0", "--eval-batch-size=0"])
def test_bad_finetune_flags_stop_before_training(tiny, tmp_path, capsys, flag):
    out = tmp_path / "out"
    code, err = run_cli_stderr(glue_argv(tiny, out, flag), capsys)
    assert code == 2 and f"argument {flag.split('=')[0]}" in err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--grad-accum=0", "--batch-size=0", "--n-best-size=0", "--epochs=0",
                                  "--learning-rate=inf", "--doc-stride=0", "--article-split=1"])
def test_bad_squad_flags_stop_before_training(tiny, tmp_path, capsys, flag):
    assert run_cli(["finetune", "squad", "--model", tiny["qa"], "--train-file", tiny["corpus"],
                    "--output", tmp_path / "out", flag], capsys) == 2
    assert not (tmp_path / "out").exists()


def test_output_path_that_is_a_file_fails_before_training(tiny, tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    code, err = run_cli_stderr(glue_argv(tiny, target), capsys)
    assert code == 2 and "existing file, not a folder" in err
    assert target.read_text() == "x"


# ---- item 8: operating-system failures are one line


def test_disk_full_is_one_line_and_leaves_no_partial_output(tiny, tmp_path, capsys, monkeypatch):
    import bertkit.features

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "f.jsonl"))

    monkeypatch.setattr(bertkit.features, "_jsonl_record", disk_full)
    texts = tmp_path / "t.txt"
    texts.write_text("the cat\n")
    code, err = run_cli_stderr(["extract-features", "--input", texts, "--model", tiny["model"], "--output",
                                tmp_path / "f.jsonl"], capsys)
    assert code == 2 and err.strip() == f"error: {tmp_path / 'f.jsonl'}: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]  # no f.jsonl, no temp file


def test_broken_pipe_is_quiet(tiny):
    process = subprocess.Popen([sys.executable, "-m", "bertkit", "tokenize", "--vocab", str(tiny["model"])],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # as `| head -0` would: the reader is gone before the first line
    _, err = process.communicate(b"the cat sat\n" * 20000)
    assert b"Traceback" not in err and err.strip() == b""
    assert process.returncode == 141


# ---- item 9: structure errors


@pytest.mark.parametrize("paragraphs", ["not a list", [{"context": "a b", "qas": None}]])
def test_squad_structure_errors_in_predict(tiny, tmp_path, capsys, paragraphs):
    data = tmp_path / "q.json"
    data.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
    assert run_cli(["predict", "squad", "--model", tiny["qa"], "--input", data, "--output", tmp_path / "o"],
                   capsys) == 2


def test_config_with_a_string_where_a_number_belongs(tiny, tmp_path, capsys):
    model = tmp_path / "model"
    write_tiny_model(model)
    config = json.loads((model / "config.json").read_text())
    config["hidden_size"] = "16"
    (model / "config.json").write_text(json.dumps(config))
    texts = tmp_path / "t.txt"
    texts.write_text("the cat\n")
    code, err = run_cli_stderr(["extract-features", "--input", texts, "--model", model, "--output",
                                tmp_path / "f.jsonl"], capsys)
    assert code == 2 and "hidden_size must be a whole number" in err and "config.json" in err


def test_swag_invalid_utf8_names_the_line(tiny, tmp_path, capsys):
    train = tmp_path / "train.csv"
    train.write_bytes(b",sent1,sent2,ending0,ending1,label\n0,a,b,c,d,0\n1,a,\xff,c,d,1\n")
    code, err = run_cli_stderr(["finetune", "swag", "--model", tiny["model"], "--train-file", train,
                                "--dev-fraction", "0.5", "--output", tmp_path / "o"], capsys)
    assert code == 2 and f"{train}:3: not valid UTF-8" in err


def test_plot_rejects_a_non_object_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n[1, 2]\n')
    code, err = run_cli_stderr(["plot", tmp_path], capsys)
    assert code == 2 and "metrics.jsonl:2: expected a JSON object" in err


def test_nan_no_answer_scores_never_reach_a_json_file(tmp_path):
    predictions = SquadPredictions(predictions={"q1": ""}, nbest={"q1": []}, version_2_with_negative=True,
                                   null_odds={"q1": math.nan}, best_non_null={"q1": "a"})
    with pytest.raises(BertkitError, match="non-finite"):
        predictions.write(tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.json"))


def test_results_json_is_strict_json(tmp_path):
    from bertkit.outputs import write_json

    write_json(tmp_path / "r.json", {"pearson": math.nan, "runs": [{"f1": math.inf}, 0.5]})
    text = (tmp_path / "r.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"pearson": None, "runs": [{"f1": None}, 0.5]}


# ---- item 10: saved models are readable by others


def test_saved_model_files_are_readable_by_others(tmp_path):
    old = os.umask(0o022)
    try:
        model = write_tiny_model(tmp_path / "m")
    finally:
        os.umask(old)
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE(os.stat(model / name).st_mode) == 0o644, name


# ---- issue 41: inputs that are pipes (`--input <(cmd)`, a FIFO) are read


def _fifo(tmp_path, name: str, text: str) -> Path:
    """A named pipe that hands out `text` once to the first reader, as `<(printf ...)` would."""
    import threading

    path = tmp_path / name
    os.mkfifo(path)

    def write():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    threading.Thread(target=write, daemon=True).start()
    return path


def test_predict_reads_a_pipe(tiny, tmp_path, capsys):
    fifo = _fifo(tmp_path, "texts", "the cat sat\na dog\n")
    code, err = run_cli_stderr(["predict", "embeddings", "--model", tiny["model"], "--input", fifo, "--output",
                                tmp_path / "e.jsonl", "--precision", "fp32"], capsys)
    assert code == 0, err
    assert len((tmp_path / "e.jsonl").read_text().splitlines()) == 2
    (tmp_path / "folder").mkdir()  # what is not a file or a pipe is still refused by name
    code, err = run_cli_stderr(["predict", "embeddings", "--model", tiny["model"], "--input", tmp_path / "folder",
                                "--output", tmp_path / "f.jsonl"], capsys)
    assert code == 2 and err.strip() == f"error: {tmp_path / 'folder'}: not a file"


def test_train_tokenizer_and_pretraining_data_read_a_pipe(tiny, tmp_path, capsys):
    assert run_cli(["train-tokenizer", "--input", _fifo(tmp_path, "corpus", CORPUS), "--vocab-size", "40",
                    "--output", tmp_path / "tok", "--min-frequency", "1"], capsys) == 0
    words = (tmp_path / "tok" / "vocab.txt").read_text().split()
    assert {"cat", "dog", "mat"} <= set(words)  # the pipe's text was read, not an empty stream
    assert run_cli(["create-pretraining-data", "--input", _fifo(tmp_path, "corpus2", CORPUS), "--vocab",
                    tiny["model"] / "vocab.txt", "--output", tmp_path / "data", "--max-seq-length", "16", "--max-predictions-per-seq", "2",
                    "--dupe-factor", "1"], capsys) == 0
    assert sum(s["instances"] for s in json.loads((tmp_path / "data" / "manifest.json").read_text())["shards"]) > 0


# ---- issue 41: a full disk while a checkpoint is written is one line; the last good checkpoint stays


class _FullDisk:
    """A file that takes `room` bytes, then fails as a full disk does (OSError ENOSPC on write)."""

    def __init__(self, path, mode, room):
        self.handle, self.room = open(path, mode), room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


def _pretrain(data, out, capsys, *extra):
    return run_cli_stderr(["pretrain", "--train-data", data, "--output", out, "--max-steps", "6", "--save-steps", "2",
                           "--batch-size", "4", "--precision", "fp32", "--device", "cpu", "--no-progress", *extra],
                          capsys)


def test_full_disk_mid_pretraining_and_on_resume_keeps_the_last_checkpoint(pretraining_data, tmp_path, capsys,
                                                                          monkeypatch):
    import safetensors

    import bertkit.hub.checkpoints
    import bertkit.train.checkpoint

    out = tmp_path / "run"
    written = []

    def state_file(path, mode="r", *args, **kwargs):  # torch.save's zip writer sees a full disk at checkpoint-4
        written.append(Path(path).parent.name)
        return _FullDisk(path, mode, room=100 if len(written) == 2 else 1 << 40)  # fails inside the zip writer

    monkeypatch.setattr(bertkit.train.checkpoint, "open", state_file, raising=False)
    code, err = _pretrain(pretraining_data, out, capsys)
    # torch.save raised "RuntimeError: [enforce fail at inline_container.cc:672]": now the OSError it was
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: {out / 'checkpoint-4' / 'training_state.pt'}: No space left on device")
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]  # no half folder
    monkeypatch.undo()

    real_save_file = bertkit.hub.checkpoints.save_file

    def weights_full(tensors, path, metadata=None):  # safetensors' own error, as its Rust writer raises it
        real_save_file(tensors, path, metadata=metadata)
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(bertkit.hub.checkpoints, "save_file", weights_full)
    code, err = _pretrain(pretraining_data, out, capsys, "--resume")
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"error: {out / 'checkpoint-4' / 'model.safetensors'}: No space left on device")
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]
    monkeypatch.undo()

    code, err = _pretrain(pretraining_data, out, capsys, "--resume")  # room again: the run goes on from step 2
    assert code == 0, err
    assert "resuming from" in err and "checkpoint-2" in err and (out / "model.safetensors").is_file()


def test_full_disk_while_finetune_saves_its_model(tiny, tmp_path, capsys, monkeypatch):
    import safetensors

    import bertkit.hub.checkpoints

    def full(tensors, path, metadata=None):
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(bertkit.hub.checkpoints, "save_file", full)
    code, err = run_cli_stderr(glue_argv(tiny, tmp_path / "out"), capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith(f"error: {tmp_path / 'out'}") and last.endswith(
        "model.safetensors: No space left on device") and "Traceback" not in err
    assert not list((tmp_path / "out").rglob("*.tmp"))  # no temporary file left behind
