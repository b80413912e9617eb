"""The shared training loop: schedule, accumulation, exact resume, atomic checkpoints."""

import json

import pytest
import torch

from bertkit import BertConfig, BertForSequenceClassification
from bertkit.train import Phase, TrainArgs, build_optimizer, fit, linear_schedule
from bertkit.train.loop import latest_checkpoint


class ToySource:
    """Deterministic per (seed, epoch): a learnable rule (label = which cue token is at position 1)."""

    def __init__(self, n_batches=5, batch_size=8, seed=0, vocab=50, length=12):
        self.n, self.bs, self.seed, self.vocab, self.length = n_batches, batch_size, seed, vocab, length

    def num_batches(self, epoch):
        return self.n

    def batches(self, epoch, start=0):
        g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        for i in range(self.n):
            ids = torch.randint(5, self.vocab, (self.bs, self.length), generator=g)
            ids[:, 1] = torch.randint(3, 5, (self.bs,), generator=g)  # the cue: token 3 or 4
            if i < start:
                continue
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": (ids[:, 1] == 4).long()}


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=50, num_labels=2))


def read_losses(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and not r.get("eval")]


def test_linear_schedule_shape():
    opt = build_optimizer(torch.nn.Linear(2, 2), lr=1.0)
    sched = linear_schedule(opt, warmup_steps=10, total_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.5) and lrs[10] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.5) and sched.get_last_lr()[0] == 0.0


def test_weight_decay_skips_bias_and_layernorm():
    from bertkit.train.optim import param_groups

    model = tiny_model()
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all("LayerNorm" not in names[id(p)] and not names[id(p)].endswith("bias") for p in decay["params"])
    assert any("LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01


def test_loop_learns_and_writes_outputs(tmp_path):
    model = tiny_model()
    args = TrainArgs(output_dir=str(tmp_path), learning_rate=1e-3, warmup_ratio=0.1, precision="fp32",
                     logging_steps=1, progress=False)
    result = fit(model, Phase(ToySource(n_batches=10), epochs=6), args)
    assert result.global_step == 60
    losses = read_losses(tmp_path / "metrics.jsonl")
    assert len(losses) == 60
    first, last = sum(l for _, l in losses[:10]) / 10, sum(l for _, l in losses[-10:]) / 10
    assert last < first * 0.7, (first, last)
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "config.json").exists()


def test_grad_accumulation_matches_large_batch():
    """2 micro-batches of 4 accumulate to the same update as one batch of 8 (dropout off)."""

    class Split(ToySource):
        def batches(self, epoch, start=0):
            for i, b in enumerate(ToySource(self.n, 8, self.seed).batches(epoch)):
                for j in range(2):
                    if 2 * i + j >= start:
                        yield {k: v[4 * j: 4 * j + 4] for k, v in b.items()}

        def num_batches(self, epoch):
            return 2 * self.n

    config = BertConfig.preset("tiny", vocab_size=50, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    a = BertForSequenceClassification(config)
    b = BertForSequenceClassification(config)
    b.load_state_dict(a.state_dict())
    common = dict(learning_rate=1e-3, precision="fp32", progress=False, warmup_steps=0)
    fit(a, Phase(ToySource(n_batches=3), steps=3), TrainArgs(**common))
    fit(b, Phase(Split(n_batches=3), steps=3), TrainArgs(grad_accum=2, **common))
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-5), n


class Crash(Exception):
    pass


def test_resume_reproduces_uninterrupted_run(tmp_path):
    common = dict(learning_rate=1e-3, warmup_steps=2, precision="fp32", logging_steps=1, progress=False,
                  save_steps=4, seed=7)
    phases = lambda: [Phase(ToySource(n_batches=5, seed=1), steps=7, name="p1"),
                      Phase(ToySource(n_batches=3, seed=2, length=20), steps=5, name="p2")]
    full = tmp_path / "full"
    fit(tiny_model(), phases(), TrainArgs(output_dir=str(full), **common))

    broken = tmp_path / "broken"
    calls = {"n": 0}

    def explode(batch, out):
        calls["n"] += 1
        if calls["n"] == 10:  # mid-way between the checkpoints at steps 8 and 12
            raise Crash()
        return {}

    with pytest.raises(Crash):
        fit(tiny_model(), phases(), TrainArgs(output_dir=str(broken), **common), batch_metrics=explode)
    assert latest_checkpoint(broken).name == "checkpoint-8"
    # A half-written checkpoint (no training state) is never picked.
    (broken / "checkpoint-9").mkdir()
    fit(tiny_model(seed=123), phases(), TrainArgs(output_dir=str(broken), resume=True, **common))
    want, got = read_losses(full / "metrics.jsonl"), read_losses(broken / "metrics.jsonl")
    assert [s for s, _ in got] == list(range(1, 13))
    for (s1, l1), (s2, l2) in zip(want, got):
        assert s1 == s2 and l1 == pytest.approx(l2, abs=1e-6), (s1, l1, l2)


def test_plot_writes_pngs(tmp_path):
    from bertkit.plot import plot_run

    fit(tiny_model(), Phase(ToySource(n_batches=4), steps=4),
        TrainArgs(output_dir=str(tmp_path), precision="fp32", logging_steps=1, progress=False))
    written = plot_run(tmp_path)
    assert {p.name for p in written} == {"loss.png", "learning_rate.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
