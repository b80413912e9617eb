"""`bertkit reproduce --budget smoke` end to end on the shared data: every stage, the report, caching, resume."""

import contextlib
import json
import logging
import re

import pytest

from bertkit.errors import BertkitError
from bertkit.reproduce import load_budget, plan, reproduce
from bertkit.train.checkpoint import latest_checkpoint, read_training_state
from bertkit.train.plan import Plan


@contextlib.contextmanager
def bertkit_messages():
    """The progress lines the "bertkit" logger gives while the block runs."""
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("bertkit")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def smoke_run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    with bertkit_messages() as messages:
        report = reproduce("smoke", str(data_dir), str(out), precision="fp32")
    return out, report, messages


@pytest.mark.slow
def test_smoke_runs_every_stage_and_writes_the_report(smoke_run):
    out, report, messages = smoke_run
    budget = load_budget("smoke")
    ran = set(report["stages_run_this_time"])
    assert {"corpus", "vocab", "data", "pretrain-bert", "pretrain-no-nsp", "pretrain-ltr", "model-ltr+bilstm",
            "model-random-init"} <= ran
    models = ["bert", "no-nsp", "ltr", "ltr+bilstm", "random-init"]
    for model in models:
        for task in budget["tasks"]:
            assert f"finetune-{model}-{task}" in ran
            value = report["finetune"][model][task]["value"]
            assert isinstance(value, float) and 0.0 <= value <= 100.0, (model, task, value)

    text = (out / "report.md").read_text()
    for heading in ("## Environment and command", "## Pre-training", "Table 5", "## Wall time per stage",
                    "## What this budget can and cannot show"):
        assert heading in text
    # The fine-tuning table: a header with every task, one row per model, numbers that parse.
    table = text.split("Table 5", 1)[1].split("\n\n", 2)[2].split("\n\n")[0].splitlines()
    assert len(table) == 2 + len(models)
    for row in table[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")][2:]  # after the model and its number of runs
        assert len(cells) == len(budget["tasks"])
        assert all(re.fullmatch(r"\d+\.\d", c) for c in cells), row
    # Pre-training curves exist and are embedded.
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (out / link).is_file()
    assert len(re.findall(r"!\[", text)) >= 3
    data = json.loads((out / "report.json").read_text())
    assert data["pretraining"]["bert"]["final_eval"]["mlm_perplexity"] > 1.0
    assert 0.0 <= data["pretraining"]["bert"]["final_eval"]["nsp_accuracy"] <= 1.0


@pytest.mark.slow
def test_second_run_redoes_nothing(smoke_run, data_dir):
    out, _, _ = smoke_run
    with bertkit_messages() as messages:
        report = reproduce("smoke", str(data_dir), str(out), precision="fp32")
    assert report["stages_run_this_time"] == []
    assert all("cached" in m for m in messages if m.startswith("["))


@pytest.mark.slow
def test_interrupted_pretraining_stage_resumes(smoke_run, data_dir):
    out, _, _ = smoke_run
    stage = out / "stages" / "pretrain-no-nsp"
    # As if the run had been killed after its last checkpoint: no completion marker, no final model.
    (stage / "stage.json").unlink()
    (stage / "model.safetensors").unlink()
    assert any(stage.glob("checkpoint-*"))
    with bertkit_messages() as messages:
        report = reproduce("smoke", str(data_dir), str(out), precision="fp32")
    # Only the interrupted stage reran; its result equals the first run's, so nothing downstream did.
    assert report["stages_run_this_time"] == ["pretrain-no-nsp"]
    assert any("resuming from" in m for m in messages)


def test_paper_budget_dry_run(data_dir):
    p = plan(load_budget("paper"), data_dir, ["bert", "no-nsp", "ltr", "ltr+bilstm"], ["mnli", "squad"])
    assert p["model"]["hidden_size"] == 768 and p["model"]["num_hidden_layers"] == 12
    assert p["pretrain_steps"] == 1_000_000 and p["sequences_seen"] == 256_000_000
    assert p["phase2"] == 0.1


def test_budgets_are_plain_config_files():
    for name in ("smoke", "demo", "cpu-hour", "cpu-day", "paper"):
        budget = load_budget(name)
        assert budget["name"] == name and budget["tasks"] and budget["variants"]
    with pytest.raises(BertkitError, match="unknown budget"):
        load_budget("nope")


def test_reference_section_sets_minilm_beside_bert_and_random_init():
    from bertkit.reproduce.report import _reference_section

    budget = {"finetune": {"learning_rates": [1e-4], "epochs": [2], "seeds": [1]},
              "tasks": {"mrpc": {"max_train_examples": 2000}, "ner": {"max_train_examples": 1500}, "rte": {}},
              "reference_model": {"enabled": True, "learning_rates": [5e-5],
                                  "tasks": {"mrpc": {"max_train_examples": 500}}}}
    results = {"bert": {"mrpc": {"value": 68.4}, "ner": {"value": 10.0}, "rte": {"value": 52.0}},
               "random-init": {"mrpc": {"value": 66.0}, "ner": {"value": 2.5}},
               "reference": {"mrpc": {"value": 80.1}, "ner": {"value": 71.25}, "rte": {"value": None}}}
    lines = _reference_section(budget, ["mrpc", "ner", "rte"], results)
    rows = {line.split(" | ")[0].strip("| "): [c.strip(" |") for c in line.split(" | ")] for line in lines
            if line.startswith("| ") and not line.startswith("| task")}
    assert rows["MRPC"] == ["MRPC", "68.4", "66.0", "80.1", "+11.7", "500 examples"]  # the reference's own subset
    assert rows["CoNLL NER F1"][1:] == ["10.0", "2.5", "71.2", "+61.2", "1,500 sentences"]
    assert rows["RTE"][1:] == ["52.0", "-", "-", "-", "all"]
    assert "learning rate(s) 5e-05, epochs 2, seeds 1" in lines[-1]


def test_budget_longer_than_the_model_positions_is_refused_before_any_work(tmp_path):
    from bertkit.reproduce import BUDGET_DIR

    for shipped in BUDGET_DIR.glob("*.json"):
        load_budget(str(shipped))  # every shipped budget passes the check
    budget = json.loads((BUDGET_DIR / "smoke.json").read_text())
    budget["tasks"]["squad"]["max_seq_length"] = 192  # the model has 128 positions
    path = tmp_path / "long.json"
    path.write_text(json.dumps(budget))
    with pytest.raises(BertkitError, match=r"long\.json: tasks\.squad\.max_seq_length is 192, more than the "
                                           r"model's max_position_embeddings 128"):
        load_budget(str(path))


# ---------------------------------------------------------------- budgets with a time budget per variant


def _budget_file(tmp_path, name="timed", **changes):
    """The smoke budget with `changes` applied (a value of None removes the key), as a file."""
    from bertkit.reproduce import BUDGET_DIR

    budget = json.loads((BUDGET_DIR / "smoke.json").read_text())
    budget["name"] = name
    for key, value in changes.items():
        if value is None:
            budget.pop(key, None)
        else:
            budget[key] = value
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(budget, indent=2))
    return path


def test_budget_with_time_budget_and_max_steps_is_refused_in_one_line(tmp_path, capsys):
    from bertkit.cli import main

    path = _budget_file(tmp_path, pretrain={"time_budget": "90s", "max_steps": 100, "batch_size": 16})
    rc = main(["reproduce", "--budget", str(path), "--data-dir", str(tmp_path), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    line = next(i for i, text in enumerate(path.read_text().splitlines(), start=1) if '"max_steps"' in text)
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (f"error: {path}:{line}: pretrain gives both time_budget and max_steps: give one (a time budget "
                      "sets the step count)")
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("pretrain, message", [
    ({"time_budget": "soon"}, r"pretrain.time_budget: time budget 'soon' is not a duration"),
    ({"time_budget": "90s", "warmup_steps": 10}, r"pretrain.warmup_steps has no effect with time_budget .*warmup_ratio"),
    ({"time_budget": "90s", "eval_steps": 10}, r"pretrain.eval_steps has no effect with time_budget"),
    ({"time_budget": "90s", "learning_rte": 1e-3}, r"pretrain.learning_rte is not a setting of a budgeted run"),
    ({"batch_size": 16}, r"pretrain needs time_budget, or max_steps .*missing: max_steps, learning_rate, warmup_steps"),
])
def test_pretrain_sections_that_would_fail_or_be_ignored_are_refused(tmp_path, pretrain, message):
    with pytest.raises(BertkitError, match=message):
        load_budget(str(_budget_file(tmp_path, pretrain=pretrain)))


def test_finetune_by_model_names_models_and_settings(tmp_path):
    with pytest.raises(BertkitError, match=r"timed\.json:\d+: finetune_by_model.bart: not a model"):
        load_budget(str(_budget_file(tmp_path, finetune_by_model={"bart": {"seeds": [1, 2]}})))
    with pytest.raises(BertkitError, match=r"finetune_by_model.bert: unknown setting\(s\) seed "):
        load_budget(str(_budget_file(tmp_path, finetune_by_model={"bert": {"seed": [1, 2]}})))


def test_without_a_model_section_a_timed_budget_takes_the_recipes_model(tmp_path, data_dir):
    from bertkit.pretraining.recipe import recipe_for_budget
    from bertkit.reproduce import finetune_settings, model_config

    with pytest.raises(BertkitError, match="lacks the section.s. model"):  # a fixed-step budget needs one
        load_budget(str(_budget_file(tmp_path, model=None)))
    budget = load_budget(str(_budget_file(tmp_path, model=None, pretrain={"time_budget": "15m"},
                                          finetune_by_model={"random-init": {"seeds": [1, 2, 3]}})))
    assert recipe_for_budget(900).model_config == "tiny"
    assert model_config(budget).to_dict() == model_config({"model": {"preset": "tiny"}}).to_dict()
    assert finetune_settings(budget, "random-init")["seeds"] == [1, 2, 3]
    assert finetune_settings(budget, "bert")["seeds"] == [1]
    p = plan(budget, data_dir, ["bert"], ["sst-2"])
    assert p["pretrain_time_budget_seconds"] == 900 and p["pretrain_steps"] is None
    assert p["finetune_seeds"] == {"bert": [1], "random-init": [1, 2, 3]}


def test_cpu_hour_budget_compares_bert_and_random_init_over_seeds_at_equal_pretraining_time():
    budget = load_budget("cpu-hour")
    assert "time_budget" in budget["pretrain"] and budget["vocab"]["vocab_size"] == 8192
    assert {"sst-2", "sts-b", "ner", "squad"} <= set(budget["tasks"])
    for model in ("bert", "random-init"):
        assert len(budget["finetune_by_model"][model]["seeds"]) >= 3
    measured = re.search(r"Measured: ([\d.]+) minutes end to end", budget["about"])  # a measured run, stated
    assert measured and float(measured.group(1)) <= 75
    demo = load_budget("demo")
    assert "time_budget" in demo["pretrain"] and len(demo["finetune_by_model"]["bert"]["seeds"]) >= 3


@pytest.mark.slow
def test_timed_budget_runs_and_its_pretraining_resumes(tmp_path, data_dir):
    """Each variant under a few seconds of pre-training (the recipe's model, no "model" section), BERT and
    random init fine-tuned with 3 seeds; an interrupted budgeted pre-training stage resumes on its plan."""
    corpus = {**load_budget("smoke")["corpus"], "heldout_documents": 3}  # a small held-out set: cheap evaluations
    path = _budget_file(tmp_path, model=None, variants=["bert"], corpus=corpus,
                        pretrain={"time_budget": "30s", "batch_size": 8, "eval_batches": 1, "logging_steps": 5},
                        tasks={"sst-2": {"max_train_examples": 64}},
                        finetune_by_model={"bert": {"seeds": [1, 2, 3]}, "random-init": {"seeds": [1, 2, 3]}})
    out = tmp_path / "out"
    report = reproduce(str(path), str(data_dir), str(out), precision="fp32")
    stage = out / "stages" / "pretrain-bert"
    args = json.loads((stage / "pretrain_args.json").read_text())
    assert args["time_budget_seconds"] == 30 and args["plan"]["time_budget"] == 30
    from bertkit.pretraining.recipe import recipe_for_budget

    # the batch the budget names; the rest the recipe's for 30 s
    assert args["recipe"]["batch_size"] == 8 and args["recipe"]["learning_rate"] == recipe_for_budget(30).learning_rate
    pre = report["pretraining"]["bert"]
    assert pre["time_budget_seconds"] == 30 and pre["elapsed_seconds"] < 30 + 45  # the loop's hard stop
    assert pre["sequences"] == pre["steps"] * 8
    assert 0.0 <= pre["final_eval"]["mlm_accuracy"] <= 1.0 and 0.0 <= pre["final_eval"]["nsp_accuracy"] <= 1.0
    assert any("wall-clock budget" in d for d in pre["deviations_from_paper"])
    # random init is the same architecture as the pre-trained model (the recipe's tiny)
    mine = json.loads((stage / "config.json").read_text())
    rand = json.loads((out / "stages" / "model-random-init" / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "vocab_size"):
        assert mine[key] == rand[key], key
    for model in ("bert", "random-init"):
        assert len(report["finetune"][model]["sst-2"]["run_scores"]) == 3
    gap = report["pretrained_vs_random_init"]["sst-2"]
    assert gap["bert"]["n"] == 3 and gap["random_init"]["n"] == 3
    text = (out / "report.md").read_text()
    assert "under the same wall-clock budget of 30 s" in text and "## What the numbers say" in text
    assert "| SST-2 |" in text and "Does pre-training beat random initialisation" in text

    (stage / "stage.json").unlink()
    (stage / "model.safetensors").unlink()
    checkpoint = latest_checkpoint(stage)
    recorded = Plan.from_dict(read_training_state(checkpoint)["plan"])
    with bertkit_messages() as messages:
        again = reproduce(str(path), str(data_dir), str(out), precision="fp32")
    assert again["stages_run_this_time"] == ["pretrain-bert"]
    assert any("resuming from" in m for m in messages)
    # the schedule recorded in the checkpoint, not a new measurement
    assert again["pretraining"]["bert"]["steps"] == recorded.total_steps
    assert again["pretraining"]["bert"]["time_budget_seconds"] == 30
    assert again["pretraining"]["bert"]["sequences"] == recorded.total_steps * 8  # both segments counted


def _summary(scores, metric="accuracy", configs=None):
    """A fine-tuning stage's summary as reproduce keeps it (percent)."""
    configs = configs or [{"learning_rate": 3e-4, "epochs": 3, "batch_size": 32, "seed": i + 1}
                          for i in range(len(scores))]
    return {"metric": metric, "value": max(scores), "run_scores": scores, "run_configs": configs}


def test_report_shows_mean_sd_and_gap_from_the_seeds_and_says_what_they_mean(tmp_path):
    """The comparison table's numbers against a hand computation; the findings follow the numbers."""
    import types

    from bertkit.reproduce.report import seed_values, write_report

    results = {
        # SST-2: 80, 82, 84 (mean 82, sd 2) vs 70, 71, 75 (mean 72, sd 2.65): +10.0 > 5.29, beyond the noise
        # SQuAD: 10, 12, 14 (mean 12, sd 2) vs 9, 11, 13 (mean 11, sd 2): +1.0 < 4.00, within the noise
        "bert": {"sst-2": _summary([80.0, 82.0, 84.0]), "squad": _summary([10.0, 12.0, 14.0], "f1")},
        # No NSP ahead of BERT on SST-2 beyond BERT's noise (one run: 90 - 82 = 8 > 4); LTR far behind on SQuAD
        "no-nsp": {"sst-2": _summary([90.0]), "squad": _summary([12.5], "f1")},
        "ltr": {"sst-2": _summary([81.0]), "squad": _summary([2.0], "f1")},
        "random-init": {"sst-2": _summary([70.0, 71.0, 75.0]), "squad": _summary([9.0, 11.0, 13.0], "f1")},
    }
    pre = {v: {"steps": 100, "seq_per_s": 50.0, "sequences": 3200, "batch_size": 32, "time_budget_seconds": 480,
               "final_eval": {"mlm_accuracy": acc, "mlm_perplexity": 300.0, "nsp_accuracy": nsp}, "plots": []}
           for v, acc, nsp in (("bert", 0.243, 0.551), ("no-nsp", 0.25, None), ("ltr", 0.301, None))}
    stages = types.SimpleNamespace(records={f"pretrain-{v}": {"result": r, "seconds": 480.0, "key": v}
                                            for v, r in pre.items()}, ran=[])
    budget = {"name": "t", "about": "", "_path": "t.json", "finetune": {}}
    corpus = {"train_documents": 10, "train_words": 1000, "heldout_documents": 2}
    data = {"train_counts": {"instances": 50}, "heldout_counts": {"instances": 5, "not_next_fraction": 0.48}}
    models = {m: tmp_path / m for m in ("bert", "no-nsp", "ltr", "random-init")}
    report = write_report(tmp_path, budget, tmp_path, stages, corpus, data, models, ["sst-2", "squad"], results,
                          60.0, "fp32")
    text = (tmp_path / "report.md").read_text()
    assert "| SST-2 | 82.0 | 2.00 | 3 | 72.0 | 2.65 | 3 | +10.0 | 5.29 | yes, BERT ahead |" in text
    assert "| SQuAD v1.1 F1 | 12.0 | 2.00 | 3 | 11.0 | 2.00 | 3 | +1.0 | 4.00 | no |" in text
    assert "2 x max(sd_a, sd_b)" in text
    # The Table-5 layout: means over seeds, sd with more than one run.
    assert "| BERT (MLM + NSP) | 3 | 82.0 ± 2.0 | 12.0 ± 2.0 |" in text
    assert "| No NSP | 1 | 90.0 | 12.5 |" in text
    assert "under the same wall-clock budget of 8 min" in text
    said = " ".join(report["findings"])
    assert "BERT is ahead beyond the noise on SST-2 (by 10.0; noise 5.3)" in said
    assert "the gap is within the noise on SQuAD v1.1 F1 (+1.0 for BERT; noise 4.0)" in said
    assert "Verdict: holds on 1 of 2 tasks." in said
    # NSP does not help here: No NSP's one run is 8 above BERT's mean, beyond 2 x BERT's sd
    assert "No NSP is ahead beyond the noise on SST-2 (by 8.0; noise 4.0); the gap is within the noise on " \
           "SQuAD v1.1 F1 (-0.5 for BERT; noise 4.0). Verdict: reversed." in said
    # two single runs (No NSP, LTR) take the largest seed sd on the task (2.0)
    assert "On SQuAD, No NSP (MLM) is ahead beyond the noise on SQuAD v1.1 F1 (by 10.5; noise 4.0)" in said
    assert "held-out NSP accuracy is 55.1%; always answering the held-out data's majority class scores 52.0%" in said
    assert "BERT 24.3%, No NSP 25.0% (LTR's next-token accuracy, another task: 30.1%)" in said
    assert report["pretrained_vs_random_init"]["sst-2"]["beyond_noise"] is True
    # Seeds are taken at the setting with the best mean when a grid ran.
    grid = _summary([60.0, 62.0, 70.0, 74.0], configs=[{"learning_rate": lr, "seed": s} for lr in (1e-4, 3e-4)
                                                       for s in (1, 2)])
    assert seed_values(grid) == [70.0, 74.0]


def test_findings_change_with_the_numbers():
    from bertkit.reproduce.report import findings

    equal = {"bert": {"sst-2": _summary([80.0, 81.0, 82.0])}, "random-init": {"sst-2": _summary([80.5, 81.5, 79.5])}}
    assert "Not measurably" in findings(equal, {}, ["sst-2"])[0]
    assert "Verdict: not visible." in findings(equal, {}, ["sst-2"])[0]
    behind = {"bert": {"sst-2": _summary([60.0, 61.0, 62.0])}, "random-init": {"sst-2": _summary([80.0, 81.0, 82.0])}}
    assert "Verdict: reversed." in findings(behind, {}, ["sst-2"])[0]
    ahead = {"bert": {"sst-2": _summary([90.0, 91.0, 92.0])}, "random-init": {"sst-2": _summary([80.0, 81.0, 82.0])}}
    assert findings(ahead, {}, ["sst-2"])[0].startswith("Does pre-training beat random initialisation")
    assert "Yes:" in findings(ahead, {}, ["sst-2"])[0] and "Verdict: holds on every task." in findings(ahead, {}, ["sst-2"])[0]
