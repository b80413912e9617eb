"""`bertkit reproduce --budget curves`: the learning curve of pre-trained BERT against random init.

The statistics and verdicts against hand computations; a test-sized curve end to end (a tiny model,
an SST-2 of 20 training sentences, sizes 8 and 32) whose table is recomputed from its raw runs;
the seeded subsets; the budget's checks and its stated wall-time estimate."""

import json
import re
import statistics

import pytest
import torch
from safetensors.torch import load_file

from bertkit import BertConfig, BertForPreTraining, BertTokenizer
from bertkit.errors import BertkitError
from bertkit.reproduce.learning_curve import check_curve_budget, estimate_seconds, learning_curve
from bertkit.reproduce.learning_curve_report import curve_points, curve_verdict
from bertkit.reproduce import load_budget


def _curve(points):
    """{model: {size: {"used", "runs": {lr: scores}}}} from (size, used, bert runs by lr, random runs by lr)."""
    out = {"bert": {}, "random-init": {}}
    for size, used, bert, random_init in points:
        out["bert"][size] = {"used": used, "runs": bert}
        out["random-init"][size] = {"used": used, "runs": random_init}
    return out


def test_points_take_each_models_best_rate_and_the_noise_rule_of_the_ablation_report():
    # 250: BERT at 1e-3 (mean 70, sd 2) beats its 3e-4 (60); random init at 3e-4: 60, 61, 62 (mean 61, sd 1).
    # threshold = 2 x max(2, 1) = 4; diff 9.0 > 4: not within noise.
    by_model = _curve([(250, 250, {3e-4: [59.0, 60.0, 61.0], 1e-3: [68.0, 70.0, 72.0]},
                        {3e-4: [60.0, 61.0, 62.0], 1e-3: [50.0, 55.0, 57.0]})])
    (point,) = curve_points(by_model)
    assert point.bert_learning_rate == 1e-3 and point.random_learning_rate == 3e-4
    assert point.bert.mean == 70.0 and point.bert.sd == pytest.approx(2.0)
    assert point.random.mean == 61.0 and point.random.sd == pytest.approx(1.0)
    assert point.difference == pytest.approx(9.0)
    assert point.threshold == pytest.approx(4.0)
    assert point.within_noise is False
    # between sd and 2 sd (diff 3, sds 1 and 2: threshold 4) is within noise here as in the ablation report
    (gray,) = curve_points(_curve([(250, 250, {3e-4: [84.0, 85.0, 86.0]}, {3e-4: [80.0, 82.0, 84.0]})]))
    assert gray.within_noise is True


def test_verdict_from_which_size_on_the_two_are_within_noise():
    grid = lambda *xs: {1e-3: list(xs)}  # noqa: E731
    # 250: +10 (sd 1 / 1: threshold 2) ahead; 1,000: -5 (random ahead); 4,000: +0.5 <= 2; 16,000: -0.9 <= 2.
    by_model = _curve([(250, 250, grid(70, 71, 72), grid(60, 61, 62)), (1000, 1000, grid(70, 71, 72), grid(75, 76, 77)),
                       (4000, 4000, grid(80.5, 81.5, 82.5), grid(80, 81, 82)),
                       (16000, 16000, grid(80.1, 81.1, 82.1), grid(81, 82, 83))])
    points = curve_points(by_model)
    assert [p.within_noise for p in points] == [False, False, True, True]
    assert curve_verdict(points) == ("from 4,000 examples on the two are within noise (|diff| <= 2 x the larger "
                                     "sd); below that pre-training is ahead at 250; and random init is ahead at 1,000")
    # A point below that size within noise is said to be, not counted for the model ahead on its mean
    # (250: +5 against a threshold of 8.3, as in a measured SST-2 curve; 1,000: random init ahead).
    mixed = curve_points(_curve([(250, 250, grid(51, 55, 59), grid(49.5, 50.5, 51)),
                                 (1000, 1000, grid(70, 71, 72), grid(75, 76, 77)),
                                 (4000, 4000, grid(80.5, 81.5, 82.5), grid(80, 81, 82))]))
    assert [p.within_noise for p in mixed] == [True, False, True]
    assert curve_verdict(mixed) == ("from 4,000 examples on the two are within noise (|diff| <= 2 x the larger "
                                    "sd); below that random init is ahead at 1,000; and the two are within noise "
                                    "at 250")


def test_verdict_when_pretraining_is_still_ahead_at_the_largest_size():
    grid = lambda *xs: {3e-4: list(xs)}  # noqa: E731
    # 16,000: 84, 85, 86 (sd 1) against 78, 79.5, 81 (sd 1.5): threshold 3.0, diff +5.5.
    by_model = _curve([(250, 250, grid(60, 61, 62), grid(60, 61, 62)), (16000, 16000, grid(84, 85, 86),
                                                                         grid(78, 79.5, 81))])
    points = curve_points(by_model)
    assert curve_verdict(points) == ("pre-training still ahead at 16,000 examples (|diff| 5.5 > 2 x the larger sd "
                                     "3.0)")
    behind = curve_points(_curve([(16000, 16000, grid(78, 79.5, 81), grid(84, 85, 86))]))
    assert curve_verdict(behind).startswith("random init still ahead at 16,000 examples")
    within_everywhere = curve_points(_curve([(250, 250, grid(60, 61, 62), grid(60.5, 61.5, 62.5)),
                                             (1000, 900, grid(70, 71, 72), grid(70, 71, 72))]))
    assert curve_verdict(within_everywhere) == ("from 250 examples on the two are within noise (|diff| <= 2 x "
                                                "the larger sd)")
    single = curve_points(_curve([(250, 250, grid(60), grid(61))]))
    assert curve_verdict(single).startswith("no verdict")


# ---------------------------------------------------------------- end to end on a test-sized budget


@pytest.fixture
def tiny_curve(tmp_path, data_dir):
    """A data folder with an SST-2 of 20 training and 40 dev sentences, a tiny model, a curve budget."""
    rows = [line for line in (data_dir / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()]
    folder = tmp_path / "data" / "glue" / "SST-2"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("\n".join(rows[:21]) + "\n", encoding="utf-8")
    (folder / "dev.tsv").write_text("\n".join([rows[0]] + rows[100:140]) + "\n", encoding="utf-8")
    # "pre-trained": the tiny model drawn with another seed than random init's, so that the two differ
    torch.manual_seed(123)
    tokenizer = BertTokenizer.from_pretrained(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    model = tmp_path / "pretrained"
    BertForPreTraining(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                  initializer_range=0.2)).save_pretrained(model, tokenizer=tokenizer)
    budget = {"name": "tiny-curve", "kind": "learning-curve", "about": "test-sized", "sizes": [8, 32],
              "seeds": [1, 2], "finetune": {"learning_rates": [1e-4, 1e-2], "epochs": [1], "batch_size": 4,
                                             "max_seq_length": 32},
              "tasks": {"sst-2": {}}}
    path = tmp_path / "tiny-curve.json"
    path.write_text(json.dumps(budget))
    return path, tmp_path / "data", model


@pytest.mark.slow
def test_tiny_curve_runs_end_to_end_and_its_table_follows_its_runs(tiny_curve, tmp_path):
    path, data, model = tiny_curve
    out = tmp_path / "out"
    report = learning_curve(str(path), str(data), str(out), model=str(model), precision="fp32")
    runs = report["runs"]["sst-2"]
    # 8 examples, then the whole 20-sentence set for 32; two rates x two seeds each
    assert list(runs["bert"]) == ["8", "32"] and runs["bert"]["32"]["used"] == 20
    assert all(len(v) == 2 for m in runs.values() for p in m.values() for v in p["runs"].values())
    assert not list(out.rglob("model.safetensors"))[2:], "fine-tuned models are not kept"
    text = (out / "report.md").read_text()
    for size, label in (("8", "8"), ("32", "20 (all)")):
        chosen = {}
        for model_name in ("bert", "random-init"):
            by_lr = runs[model_name][size]["runs"]
            lr = max(by_lr, key=lambda k: statistics.fmean(by_lr[k]))
            chosen[model_name] = (float(lr), by_lr[lr])
        (bert_lr, b), (random_lr, r) = chosen["bert"], chosen["random-init"]
        threshold = 2 * max(statistics.stdev(b), statistics.stdev(r))  # the ablation report's rule
        diff = statistics.fmean(b) - statistics.fmean(r)
        row = (f"| {label} | {statistics.fmean(b):.1f} | {statistics.stdev(b):.2f} | {bert_lr:g} | "
               f"{statistics.fmean(r):.1f} | {statistics.stdev(r):.2f} | {random_lr:g} | {diff:+.1f} | "
               f"{threshold:.2f} | {'yes' if abs(diff) <= threshold else 'no'} |")
        assert row in text, (row, text)
    verdict = report["verdicts"]["sst-2"]
    assert f"Verdict (SST-2): {verdict}." in text and f"- SST-2: {verdict}." in text
    assert re.match(r"(from [\d,]+ examples?( \(the whole training set\))? on the two are within noise|"
                    r"(pre-training|random init) still ahead at)", verdict)
    # the random-init model is the pre-trained one's architecture and vocabulary, not its weights
    mine = json.loads((model / "config.json").read_text())
    rand = json.loads((out / "stages" / "model-random-init" / "config.json").read_text())
    assert all(mine[k] == rand[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size"))
    a, b = load_file(model / "model.safetensors"), load_file(out / "stages" / "model-random-init" / "model.safetensors")
    assert a.keys() == b.keys() and not torch.equal(a["bert.embeddings.word_embeddings.weight"],
                                                    b["bert.embeddings.word_embeddings.weight"])
    again = learning_curve(str(path), str(data), str(out), model=str(model), precision="fp32")
    assert again["stages_run_this_time"] == [] and again["curves"] == report["curves"]


def test_each_seed_draws_its_own_subset_the_same_for_both_models(tiny_curve, tmp_path, monkeypatch):
    from bertkit.reproduce.learning_curve import finetune_point
    from bertkit.tasks import runner

    path, data, model = tiny_curve
    drawn = []
    real = runner.subsample

    def recording(examples, n, seed=0, contiguous=False):
        picked = real(examples, n, seed, contiguous)
        drawn.append((n, seed, [e.text_a for e in picked]))
        return picked

    monkeypatch.setattr(runner, "subsample", recording)
    budget = load_budget(str(path))
    random_dir = tmp_path / "random"
    from bertkit.reproduce.learning_curve import make_random_like

    random_dir.mkdir()
    make_random_like(model, random_dir)
    for name, folder in (("bert", model), ("random", random_dir)):
        for seed in (1, 2):
            d = tmp_path / f"{name}{seed}"
            d.mkdir()
            finetune_point(budget, data, folder, "sst-2", 8, 1e-4, seed, "fp32", d)
    train = [(n, seed, texts) for n, seed, texts in drawn if n == 8]
    assert [(n, seed) for n, seed, _ in train] == [(8, 1), (8, 2), (8, 1), (8, 2)]
    assert train[0][2] != train[1][2]  # another seed, another subset
    assert train[0][2] == train[2][2] and train[1][2] == train[3][2]  # the same subset for both models
    assert all(n is None for n, _, _ in drawn if n != 8)  # dev whole, the same for every run


def test_ner_subsets_drawn_by_seed_are_whole_documents(data_dir):
    from bertkit.tasks.conll_data import read_conll
    from bertkit.tasks.ner import _limit

    data = read_conll(data_dir / "conll2003" / "train.txt")
    first = _limit(data, 250, None)
    assert first == data.sentences[:250]
    a, again, b = _limit(data, 250, 1), _limit(data, 250, 1), _limit(data, 250, 2)
    assert len(a) == len(b) == 250 and a == again and a != b
    documents = {}
    for s in a:
        documents.setdefault(s.document, []).append(s)
    whole = [d for d in documents.values() if len(d) == sum(1 for s in data.sentences if s.document == d[0].document)]
    assert len(whole) >= len(documents) - 1  # every document whole but the one cut at 250
    index = {id(s): i for i, s in enumerate(data.sentences)}
    assert [index[id(s)] for s in a] == sorted(index[id(s)] for s in a)  # file order


# ---------------------------------------------------------------- the budget


def test_curves_budget_is_checked_and_its_estimate_is_the_one_it_states():
    budget = load_budget("curves")
    check_curve_budget(budget)
    assert budget["sizes"] == [250, 1000, 4000, 16000] and len(budget["seeds"]) >= 3
    assert set(budget["tasks"]) == {"sst-2", "mrpc", "ner", "squad"}
    assert budget["pretrained"]["budget"] == "cpu-hour"
    stated = re.search(r"Estimated: ([\d.]+) hours", budget["about"])
    assert stated and float(stated.group(1)) == round(estimate_seconds(budget, list(budget["tasks"])) / 3600, 1)


@pytest.mark.parametrize("change, message", [
    ({"sizes": [1000, 250]}, "sizes: positive example counts in increasing order"),
    ({"seeds": [1]}, "seeds: at least two"),
    ({"tasks": {"sst-2": {"max_train_examples": 10}}}, "tasks.sst-2.max_train_examples: the learning curve sets it"),
    ({"finetune": {"learning_rates": [1e-4], "seeds": [1]}}, "unknown: seeds"),
    ({"tasks": {"glue-x": {}}}, "tasks.glue-x: unknown task"),
    ({"pretrained": {"budget": "cpu-hours"}}, "unknown budget 'cpu-hours'"),
    ({"pretrained": {"budget": "curves"}}, "pretrained.budget 'curves' is a learning curve"),
])
def test_curve_budgets_that_would_fail_or_be_ignored_are_refused(tmp_path, change, message):
    budget = {k: v for k, v in load_budget("curves").items() if k != "_path"}
    budget.update(change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(budget))
    with pytest.raises(BertkitError, match=re.escape(message)):
        learning_curve(str(path), str(tmp_path), str(tmp_path / "out"), model=str(tmp_path))


def test_command_line_refuses_flags_a_curve_would_ignore(tmp_path, capsys, data_dir):
    from bertkit.cli import main

    rc = main(["reproduce", "--budget", "curves", "--data-dir", str(data_dir), "--output", str(tmp_path / "o"),
               "--variants", "bert"])
    assert rc == 2 and "--variants has no effect with the learning-curve budget 'curves'" in capsys.readouterr().err
    rc = main(["reproduce", "--budget", "smoke", "--data-dir", str(data_dir), "--output", str(tmp_path / "o"),
               "--model", str(tmp_path)])
    assert rc == 2 and "--model is for learning-curve budgets" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    rc = main(["reproduce", "--budget", "curves", "--data-dir", str(data_dir), "--output", str(tmp_path / "o"),
               "--dry-run"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and plan["model"] == "cpu-hour / bert" and plan["sizes"]["mrpc"] == [250, 1000, 3668]
    assert plan["fine_tuning_runs"] == 15 * 2 * 2 * 3
    assert "curve-bert-mrpc-4000-lr0.001-s3" in plan["stages"] and "curve-bert-mrpc-16000-lr0.001-s3" not in \
        plan["stages"]  # named by the size asked, as the run names them; past the set, once


@pytest.mark.slow
def test_without_a_model_the_curve_pretrains_with_the_budget_it_names(tiny_curve, tmp_path, data_dir):
    """The chained budget's corpus, vocab, data and pretrain-bert stages run in the curve's own cache."""
    path, data, _ = tiny_curve
    (data / "corpus").symlink_to(data_dir / "corpus")
    smoke = load_budget("smoke")
    smoke = {k: v for k, v in smoke.items() if k != "_path"}
    smoke["pretrain"] = {**smoke["pretrain"], "max_steps": 6, "eval_steps": 6, "save_steps": 6}
    (tmp_path / "pre.json").write_text(json.dumps(smoke))
    budget = json.loads(path.read_text())
    budget.update(pretrained={"budget": str(tmp_path / "pre.json")}, sizes=[8], seeds=[1, 2],
                  finetune={**budget["finetune"], "learning_rates": [1e-3]})
    path.write_text(json.dumps(budget))
    out = tmp_path / "chained"
    report = learning_curve(str(path), str(data), str(out), precision="fp32")
    assert {"corpus", "vocab", "data", "pretrain-bert", "model-random-init"} <= set(report["stages_run_this_time"])
    assert report["model"] == str(out / "stages" / "pretrain-bert")
    assert report["pretraining"]["steps"] == 6
    text = (out / "report.md").read_text()
    assert "budget's BERT variant, pre-trained in this run's stages (held-out MLM" in text
    rand = json.loads((out / "stages" / "model-random-init" / "config.json").read_text())
    pretrained = json.loads((out / "stages" / "pretrain-bert" / "config.json").read_text())
    assert rand["vocab_size"] == pretrained["vocab_size"]
    assert "bertkit_pretraining" not in rand


def test_squad_runs_draw_training_questions_by_seed_and_score_one_dev_subset(tmp_path, monkeypatch, data_dir):
    from bertkit.tasks import squad
    from bertkit.tasks.benchmarks import BenchmarkSettings

    seen = []
    monkeypatch.setattr(squad, "finetune_squad", lambda *args, **kwargs: seen.append(kwargs))
    for seed in (1, 2):
        squad.run_benchmark("1.1", BenchmarkSettings(
            model_dir=tmp_path, data_dir=data_dir, output_dir=tmp_path, precision="fp32",
            finetune={"learning_rates": [1e-3], "epochs": [2], "batch_size": 32, "seeds": [seed],
                      "max_seq_length": 128},
            task={"max_train_examples": 250, "max_eval_examples": 800, "subset_seed": seed, "eval_subset_seed": 0}))
    assert [(k["subset_seed"], k["eval_subset_seed"], k["seed"]) for k in seen] == [(1, 0, 1), (2, 0, 2)]


@pytest.mark.parametrize("eval_subset_seed, dev_seed", [(0, 0), (None, 2)])  # None: the subset seed, as before
def test_finetune_squad_draws_dev_with_its_own_seed(tmp_path, monkeypatch, data_dir, eval_subset_seed, dev_seed):
    from bertkit.tasks import squad

    draws = []
    real = squad.subsample
    monkeypatch.setattr(squad, "subsample", lambda ex, n, seed=0: draws.append((n, seed)) or real(ex, n, seed))

    class Drawn(Exception):
        pass

    def stop(*args, **kwargs):
        raise Drawn

    monkeypatch.setattr(squad, "training_windows", stop)
    monkeypatch.setattr(squad, "model_tokenizer", lambda *a, **k: None)
    with pytest.raises(Drawn):
        squad.finetune_squad(tmp_path, data_dir / "squad" / "dev-v1.1.json", tmp_path,
                             dev_file=data_dir / "squad" / "dev-v1.1.json", max_train_examples=5, max_eval_examples=3,
                             subset_seed=2, eval_subset_seed=eval_subset_seed)
    assert draws == [(5, 2), (3, dev_seed)]
