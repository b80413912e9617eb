"""`bertkit pretrain` end to end: it learns, it resumes exactly after SIGKILL, DDP matches one process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertkit.config import BertConfig
from bertkit.pretraining import create_pretraining_data
from bertkit.pretraining.run import pretrain

REPO = Path(__file__).resolve().parents[2]


def losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if not r.get("eval")}


def no_dropout_config(path: Path, **overrides) -> str:
    config = BertConfig.preset("tiny", max_position_embeddings=64, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0, **overrides)
    path.mkdir(parents=True, exist_ok=True)
    config.save(path)
    return str(path / "config.json")


@pytest.fixture(scope="module")
def small_static_data(mini_corpus, uncased_vocab, tmp_path_factory):
    out = tmp_path_factory.mktemp("static32")
    create_pretraining_data([mini_corpus], uncased_vocab, out, max_seq_length=32, max_predictions_per_seq=5,
                            dupe_factor=1, seed=3, progress=False, overwrite=True)
    return out


def test_tiny_model_overfits_tiny_corpus(tmp_path):
    """A few dozen fixed instances (static masks): MLM loss goes near zero and NSP accuracy near one."""
    animals = ["cat", "dog", "bird", "fox", "cow", "pig", "hen", "owl"]
    sentences = [f"the {w} sat on the mat number {i} today ." for i, w in enumerate(animals * 4)]
    words = sorted({w for s in sentences for w in s.split()})
    vocab = tmp_path / "vocab.txt"  # a vocabulary of just these words keeps the model small and fast
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    corpus = tmp_path / "tiny.txt"
    # 8 documents of 4 sentences
    corpus.write_text("\n\n".join("\n".join(sentences[4 * d:4 * d + 4]) for d in range(8)) + "\n")
    data = tmp_path / "data"
    summary = create_pretraining_data([corpus], vocab, data, max_seq_length=32, max_predictions_per_seq=5,
                                      dupe_factor=2, seed=1, progress=False)
    n = summary["instances"]
    result = pretrain(str(data), str(tmp_path / "run"), model_config="tiny", max_steps=150,
                      batch_size=n, learning_rate=3e-3, warmup_steps=10, precision="fp32",
                      logging_steps=25, save_steps=0, eval_data=str(data), eval_batches=4, progress=False, seed=0)
    final = result.eval_history[-1]
    assert final["mlm_loss"] < 0.3, final
    assert final["mlm_accuracy"] > 0.9, final
    assert final["nsp_accuracy"] > 0.95, final
    assert (tmp_path / "run" / "model.safetensors").is_file() and (tmp_path / "run" / "vocab.txt").is_file()


def _pretrain_cmd(data, out, config, steps, extra=()):
    return [sys.executable, "-m", "bertkit", "pretrain", "--train-data", str(data), "--output", str(out),
            "--model-config", config, "--max-steps", str(steps), "--batch-size", "8", "--warmup-steps", "3",
            "--learning-rate", "1e-3", "--precision", "fp32", "--logging-steps", "1", "--save-steps", "5",
            "--seed", "5", "--no-progress", *extra]


def test_sigkill_then_resume_reproduces_losses(small_static_data, tmp_path):
    config = BertConfig.preset("tiny", max_position_embeddings=64)  # dropout on: RNG state must be restored
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    config.save(config_dir)
    cfg = str(config_dir / "config.json")
    steps = 40
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    data = small_static_data
    # The dynamic-masking path too: masks must come out the same after resume.
    extra = ["--masking", "dynamic"]
    subprocess.run(_pretrain_cmd(data, tmp_path / "full", cfg, steps, extra), check=True, env=env,
                   capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_pretrain_cmd(data, killed, cfg, steps, extra), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if any((d / "training_state.pt").is_file() for d in killed.glob("checkpoint-*")):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "train_summary.json").exists()

    resumed = subprocess.run(_pretrain_cmd(data, killed, cfg, steps, [*extra, "--resume"]), env=env,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stderr
    want, got = losses(tmp_path / "full"), losses(killed)
    assert sorted(got) == list(range(1, steps + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], abs=1e-5), step


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(small_static_data, tmp_path):
    """Same global batch (2 x 4 vs 1 x 8), static masks, dropout off: the same training curve."""
    cfg = no_dropout_config(tmp_path / "cfg")
    steps = 8
    common = ["--train-data", str(small_static_data), "--model-config", cfg, "--max-steps", str(steps), "--batch-size", "8",
              "--warmup-steps", "2", "--learning-rate", "1e-3", "--precision", "fp32", "--logging-steps", "1",
              "--save-steps", "0", "--seed", "11", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, "-m", "bertkit", "pretrain", "--output", str(tmp_path / "one"), *common],
                            env=env, capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-2000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          "29531", "-m", "bertkit", "pretrain", "--output", str(tmp_path / "two"), *common],
                         env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(two) == list(range(1, steps + 1))
    # MLM loss is a mean over masked positions: per-rank means averaged differ slightly from one global mean.
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=0.03), (step, one[step], two[step])
    from bertkit import BertForPreTraining

    a = BertForPreTraining.from_pretrained(tmp_path / "one")
    b = BertForPreTraining.from_pretrained(tmp_path / "two")
    diffs = [float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters())]
    assert max(diffs) < 5e-3, max(diffs)
    assert torch.isfinite(torch.tensor(diffs)).all()
