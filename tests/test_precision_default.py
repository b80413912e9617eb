"""One precision default on every door: predict, pipeline and serve answer in fp32 unless bf16 is
asked for (also where the hardware has native bf16, CPU or GPU), so one model and one input give
one answer; the precision in use is in the first log line and in serve's /info."""

import json
import logging
import os
import subprocess
import sys
import time

import pytest

import bertkit
from bertkit import device
from bertkit.cli import build_parser, main
from bertkit.heads import BertForSequenceClassification
from bertkit.inference import InferenceEngine
from http_server import free_port, request

TEXTS = ["a gripping film", "Dull and far too long, I left early.", "ok"]


@pytest.fixture(scope="module")
def classifier_dir(tiny_model, tmp_path_factory):
    return tiny_model(BertForSequenceClassification, tmp_path_factory.mktemp("cls"), max_positions=64,
                      id2label={0: "neg", 1: "pos", 2: "mid"})


def _pipeline_scores(classifier_dir, **options) -> list[dict]:
    classify = bertkit.pipeline("text-classification", model=classifier_dir, top_k=None, **options)
    return [{s["label"]: s["score"] for s in row} for row in classify(TEXTS)]


def _predict_scores(classifier_dir, tmp_path, caplog, *extra) -> list[dict]:
    source, out = tmp_path / "in.txt", tmp_path / f"out{len(extra)}.jsonl"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="bertkit"):
        assert main(["predict", "text-classification", "--model", str(classifier_dir), "--input", str(source),
                     "--output", str(out), *extra]) == 0
    return [json.loads(line)["scores"] for line in out.read_text(encoding="utf-8").splitlines()]


def _close(a: list[dict], b: list[dict], tolerance: float) -> bool:
    return all(abs(x[label] - y[label]) <= tolerance for x, y in zip(a, b, strict=True) for label in x)


def test_predict_pipeline_and_serve_agree_by_default(classifier_dir, tmp_path, caplog):
    reference = _pipeline_scores(classifier_dir)
    predicted = _predict_scores(classifier_dir, tmp_path, caplog)
    assert _close(predicted, reference, 1e-6)
    first = next(r.getMessage() for r in caplog.records if r.name == "bertkit")
    assert first.startswith("predict text-classification:") and first.endswith("on cpu, fp32")

    port, banner = free_port(), tmp_path / "banner.txt"
    with open(banner, "w") as stdout:  # serve with its own defaults (no --precision)
        server = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(classifier_dir),
                                   "--port", str(port)], stdout=stdout, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 300
        while not banner.read_text() and time.time() < deadline and server.poll() is None:
            time.sleep(0.2)
        assert "(cpu, fp32) on http://" in banner.read_text()
        status, info = request(port, "/info")
        assert status == 200 and info["model_dtype"] == "fp32"
        status, served = request(port, "/predict", {"inputs": TEXTS})
        assert status == 200
        assert _close([{s["label"]: s["score"] for s in row} for row in served], reference, 1e-6)
    finally:
        server.terminate()
        server.wait(300)


def test_bf16_when_asked(classifier_dir, tmp_path, caplog):
    fp32 = _pipeline_scores(classifier_dir)
    bf16 = _pipeline_scores(classifier_dir, precision="bf16")
    assert not _close(bf16, fp32, 1e-5)  # bf16 matmuls round: the scores move
    assert _close(bf16, fp32, 0.05)
    predicted = _predict_scores(classifier_dir, tmp_path, caplog, "--precision", "bf16")
    assert _close(predicted, bf16, 1e-6)
    assert any(r.getMessage().endswith("on cpu, bf16") for r in caplog.records)


@pytest.mark.parametrize("command", [
    ["predict", "text-classification", "--model", "m", "--input", "i", "--output", "o"],
    ["serve", "--model", "m"],
    ["finetune", "text-classification", "--model", "m", "--train-file", "t.csv", "--output", "o"],
    ["finetune", "glue", "--task", "SST-2", "--model", "m", "--output", "o"],
])
def test_every_command_defaults_to_fp32_even_with_native_bf16(command, classifier_dir, monkeypatch):
    monkeypatch.setattr(device, "bf16_supported", lambda _device: True)  # a bf16 CPU, or a GPU
    args = build_parser({command[0]}).parse_args(command)
    if command[0] == "finetune":  # a run setting: the default is RunSettings' field, read with the task's
        from bertkit.tasks.registry import TASKS

        precision = TASKS[command[1]].task.settings_from_args(args).precision
    else:
        precision = args.precision
    assert precision == "fp32"
    assert device.resolve_precision(precision, device.pick_device("cpu")) == "fp32"
    assert device.resolve_precision("auto", device.pick_device("cpu")) == "bf16"  # what the old default did


def test_engine_and_runner_default_to_fp32_with_native_bf16(classifier_dir, monkeypatch):
    from bertkit.inference import engine
    from bertkit.tasks.settings import RunSettings

    monkeypatch.setattr(engine, "resolve_precision",
                        lambda precision, _device: "bf16" if precision == "auto" else precision)
    assert InferenceEngine(classifier_dir).precision == "fp32"
    assert RunSettings().precision == "fp32"
