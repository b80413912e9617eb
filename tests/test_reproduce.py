"""`bertkit reproduce --budget smoke` end to end on the shared data: every stage, the report, caching, resume."""

import contextlib
import json
import logging
import re

import pytest

from bertkit.errors import BertkitError
from bertkit.reproduce import load_budget, plan, reproduce


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
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
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
    for name in ("smoke", "demo", "cpu-day", "paper"):
        budget = load_budget(name)
        assert budget["name"] == name and budget["tasks"] and budget["variants"]
    with pytest.raises(BertkitError, match="unknown budget"):
        load_budget("nope")


def test_reference_section_sets_minilm_beside_bert_and_random_init():
    from bertkit.reproduce import _reference_section

    budget = {"finetune": {"learning_rates": [1e-4], "epochs": [2], "seeds": [1]},
              "tasks": {"mrpc": {"max_train_examples": 2000}, "ner": {"max_train_sentences": 1500}, "rte": {}},
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
