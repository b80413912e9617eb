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
    from bertkit.train.plot import plot_run

    fit(tiny_model(), Phase(ToySource(n_batches=4), steps=4),
        TrainArgs(output_dir=str(tmp_path), precision="fp32", logging_steps=1, progress=False))
    written = plot_run(tmp_path)
    assert {p.name for p in written} == {"loss.png", "learning_rate.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


# -- wall-clock budgets ------------------------------------------------------------------------

from bertkit.errors import BertkitError  # noqa: E402
from bertkit.train.plan import (Calibration, Plan, off_pace, parse_duration, plan_for_budget, replan,  # noqa: E402
                                steps_cost, warmup_for)


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("15m", 900), ("1h", 3600), ("1h30m", 5400),
                                          ("1.5h", 5400), (120, 120)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15 minutes", "-5m", "0", "m", "nan"])
def test_parse_duration_rejects(text):
    with pytest.raises(BertkitError):
        parse_duration(text)


def test_plan_for_budget_pays_for_evaluations_and_saves_first():
    cal = Calibration(seconds_per_step=[0.5, 2.0], eval_seconds=3.0, save_seconds=1.0, calibration_seconds=5.0,
                      steps_measured=[6, 6])
    plan = plan_for_budget(600, elapsed=20, fractions=[0.9, 0.1], calibration=cal, warmup_ratio=0.06,
                           eval_points=10, save_points=4, margin=6)
    # 600 - 20 - 6 - 10 x 3 - 5 x 1 = 539 s at 0.9 x 0.5 + 0.1 x 2 = 0.65 s per step -> 829 steps
    assert plan.total_steps == 829
    assert plan.steps_per_phase == [829 - 83, 83]
    assert plan.warmup_steps == round(0.06 * 829) and plan.eval_steps == 83 and plan.save_steps == 166
    with pytest.raises(BertkitError, match="no time to train"):
        plan_for_budget(30, elapsed=25, fractions=[1.0], calibration=cal, warmup_ratio=0.0, eval_points=1,
                        save_points=0, margin=1)


def test_replan_prices_each_phase_at_its_own_step_time_and_keeps_finished_phases():
    # A fast first phase (short sequences, 0.2 s) and a slow second one (1.0 s), 50/50.
    cal = Calibration(seconds_per_step=[0.2, 1.0], eval_seconds=0.0, save_seconds=0.0, calibration_seconds=0.0,
                      steps_measured=[4, 4])
    plan = plan_for_budget(600, elapsed=0, fractions=[0.5, 0.5], calibration=cal, warmup_ratio=0.0, eval_points=1,
                           save_points=0, margin=0)
    assert plan.steps_per_phase == [500, 500] and steps_cost(plan.steps_per_phase, 0, 1000, [0.2, 1.0]) == 600
    assert steps_cost([500, 500], 400, 600, [0.2, 1.0]) == 100 * 0.2 + 100 * 1.0
    # At step 600 (phase 1 over), 150 s late: 600 - 270 = 330 s left at the slow phase's pace
    # (scale 1.0) -> 330 more steps, all in phase 2; phase 1 keeps its 500.
    late = replan(plan, step=600, elapsed=270, scale=1.0, eval_points_left=0, saves_left=0, margin=0)
    assert late.steps_per_phase == [500, 430] and late.replanned_at == 600
    # Inside phase 1, a machine 1.2x slower than calibrated: the rest is priced per phase at 1.2x.
    early = replan(plan, step=100, elapsed=24, scale=1.2, eval_points_left=0, saves_left=0, margin=0)
    rest = 1.2 * steps_cost(early.steps_per_phase, 100, early.total_steps, [0.2, 1.0])
    assert 576 - 1.2 <= rest <= 576 and abs(early.steps_per_phase[0] - early.steps_per_phase[1]) <= 1


def test_a_replan_inside_the_warmup_keeps_its_share_and_one_after_it_keeps_it_as_it_was():
    cal = Calibration(seconds_per_step=[0.2], eval_seconds=0.0, save_seconds=0.0, calibration_seconds=0.0,
                      steps_measured=[4])
    # 2,000 steps planned, 120 of them warm-up (6%).
    plan = plan_for_budget(400, elapsed=0, fractions=[1.0], calibration=cal, warmup_ratio=0.06, eval_points=1,
                           save_points=0, margin=0)
    assert (plan.total_steps, plan.warmup_steps) == (2000, 120)
    # At step 60 the steps turn out to take half the calibrated time: twice the steps, and twice the warm-up.
    grown = replan(plan, step=60, elapsed=6, scale=0.5, eval_points_left=0, saves_left=0, margin=0)
    assert grown.total_steps == 4000 and grown.warmup_steps == 240
    # After the warm-up ended it stays as it was.
    later = replan(plan, step=150, elapsed=15, scale=0.5, eval_points_left=0, saves_left=0, margin=0)
    assert later.warmup_steps == 120


def test_a_short_budgets_warmup_has_a_floor_while_under_a_third_of_the_steps():
    assert warmup_for(700, 0.06) == 42
    assert warmup_for(700, 0.06, minimum=150) == 150  # 6% would be 42
    assert warmup_for(3000, 0.06, minimum=150) == 180  # the share, once larger
    assert warmup_for(300, 0.06, minimum=150) == 100  # never more than a third
    cal = Calibration(seconds_per_step=[0.2], eval_seconds=0.0, save_seconds=0.0, calibration_seconds=0.0,
                      steps_measured=[4])
    plan = plan_for_budget(140, elapsed=0, fractions=[1.0], calibration=cal, warmup_ratio=0.06, eval_points=1,
                           save_points=0, margin=0, min_warmup_steps=150)
    assert (plan.total_steps, plan.warmup_steps) == (700, 150)
    # A re-plan inside it that shrinks the run keeps the floor (scaled, 6% share would give 75 + ...).
    shrunk = replan(plan, step=40, elapsed=8, scale=2.0, eval_points_left=0, saves_left=0, margin=0)
    assert shrunk.total_steps == 370 and shrunk.warmup_steps == 123  # a third of 370; 150 x 370 / 700 = 79
    assert Plan.from_dict({k: v for k, v in plan.to_dict().items() if k != "min_warmup_steps"}).min_warmup_steps == 0


def test_off_pace_when_late_or_clearly_early():
    cal = Calibration(seconds_per_step=[0.2, 1.0], eval_seconds=0.0, save_seconds=0.0, calibration_seconds=0.0,
                      steps_measured=[4, 4])
    plan = plan_for_budget(600, elapsed=0, fractions=[0.5, 0.5], calibration=cal, warmup_ratio=0.0, eval_points=1,
                           save_points=0, margin=0)
    # At step 500 on schedule (100 s spent): the 500 slow steps left end exactly at 600 s.
    assert not off_pace(plan, 500, 100, 1.0)
    assert off_pace(plan, 500, 100, 1.05)  # 5% slower: 625 s
    assert not off_pace(plan, 500, 100, 0.985)  # 1.5% faster: within the tolerance
    assert off_pace(plan, 500, 100, 0.8)  # phase 2 faster than calibrated: ends at 500 s
    # Re-planned at that pace, the rest fills the budget again: phase 2 grows.
    grown = replan(plan, 500, 100, 0.8, eval_points_left=0, saves_left=0, margin=0)
    assert grown.steps_per_phase == [500, 625] and not off_pace(grown, 500, 100, 0.8)
    # A later re-plan keeps the evaluation grid, so the evaluation due at its step still runs.
    again = replan(grown, 700, 260, 1.1, eval_points_left=0, saves_left=0, margin=0)
    assert again.replanned_at == 700 and (again.eval_steps, again.save_steps) == (grown.eval_steps, grown.save_steps)


class SlowSource(ToySource):
    """Every batch costs `delay` seconds more, so that a tiny model's step time is stable."""

    def __init__(self, delay=0.02, **kw):
        super().__init__(**kw)
        self.delay = delay

    def batches(self, epoch, start=0):
        import time as _time

        for batch in super().batches(epoch, start):
            _time.sleep(self.delay)
            yield batch


def _budget_args(out, **kw):
    kw.setdefault("time_budget", 6.0)
    return TrainArgs(output_dir=str(out), learning_rate=1e-3, warmup_ratio=0.1, precision="fp32", logging_steps=1,
                     progress=False, seed=3, **kw)


def test_budgeted_run_ends_on_time_with_the_schedule_at_zero(tmp_path):
    import time as _time

    evaluations = []
    started = _time.time()
    result = fit(tiny_model(), Phase(SlowSource(n_batches=20)), _budget_args(tmp_path, clock_start=started),
                 evaluate=lambda m: evaluations.append(1) or {"score": 1.0})
    wall = _time.time() - started
    assert wall < 6.0 + 2.0, wall  # the budget, plus scheduling noise on a loaded machine
    assert not result.stopped_early and result.global_step == result.plan.total_steps > 20
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if not r.get("eval")]
    assert train[-1]["learning_rate"] == 0.0 and train[-1]["step"] == result.plan.total_steps
    assert max(r["learning_rate"] for r in train) == pytest.approx(1e-3, rel=0.05)
    evals = [r for r in records if r.get("eval")]
    # ~10 on the grid plus step 0; a run that re-plans longer later keeps the grid's spacing, so on a
    # loaded machine (steps faster than the first, busy ones measured) it may evaluate a few more times.
    assert evals[0]["step"] == 0 and evals[-1]["step"] == result.plan.total_steps and 8 <= len(evaluations) <= 14
    assert all(r["elapsed_s"] <= 8.0 for r in records)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["time_budget_seconds"] == 6.0 and summary["calibration"]["seconds_per_step"][0] > 0.02


def test_budgeted_run_resumes_on_the_recorded_plan(tmp_path):
    def explode(batch, out):  # the interruption: right after the first checkpoint
        if latest_checkpoint(tmp_path) is not None:
            raise Crash()
        return {}

    with pytest.raises(Crash):
        fit(tiny_model(), Phase(SlowSource(n_batches=20)), _budget_args(tmp_path, save_points=9),
            batch_metrics=explode)
    checkpoint = latest_checkpoint(tmp_path)
    state = torch.load(checkpoint / "training_state.pt", weights_only=True)
    planned = state["plan"]["steps_per_phase"][0]
    # The resumed run follows the recorded plan even on a machine twice as slow.
    result = fit(tiny_model(), Phase(SlowSource(delay=0.04, n_batches=20)), _budget_args(tmp_path, resume=True,
                                                                                       save_points=9))
    assert result.resumed_from == state["global_step"] and result.plan.total_steps == planned
    train = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if not r.get("eval")]
    assert [r["step"] for r in train] == list(range(1, planned + 1)) and train[-1]["learning_rate"] == 0.0


def test_existing_run_is_refused_and_resume_checks_identity(tmp_path):
    common = dict(output_dir=str(tmp_path), precision="fp32", logging_steps=1, progress=False, save_steps=2)
    fit(tiny_model(), Phase(ToySource(n_batches=4), steps=4), TrainArgs(identity={"seed": 1}, **common))
    with pytest.raises(BertkitError, match="already holds a run"):
        fit(tiny_model(), Phase(ToySource(n_batches=4), steps=4),
            TrainArgs(identity={"seed": 1}, existing_output="refuse", **common))
    with pytest.raises(BertkitError, match="another run.*seed"):
        fit(tiny_model(), Phase(ToySource(n_batches=4), steps=4),
            TrainArgs(identity={"seed": 2}, resume=True, **common))
    with pytest.raises(BertkitError, match="beyond this run's 1 steps"):
        fit(tiny_model(), Phase(ToySource(n_batches=4), steps=1),
            TrainArgs(identity={"seed": 1}, resume=True, **common))
    # Overwriting clears the old run's checkpoints, so a later --resume cannot pick them up.
    fit(tiny_model(), Phase(ToySource(n_batches=4), steps=1), TrainArgs(identity={"seed": 3}, **common))
    assert latest_checkpoint(tmp_path) is None
