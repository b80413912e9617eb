"""The task table: every task module offers the same surface, the names agree across modules, and
every task's result has one shape (fractions, whatever unit the official scorer prints)."""

import pytest

from bertkit.errors import BertkitError
from bertkit.metrics.glue import canonical_task_name
from bertkit.reproduce import available_tasks, load_budget
from bertkit.tasks.examples import subsample
from bertkit.tasks.results import TaskResult
from bertkit.tasks.glue import GLUE_TASKS, glue_task
from bertkit.tasks.registry import BENCHMARKS, TASKS, benchmark
from bertkit.tasks.squad import headline_metrics

SURFACE = ("read", "featurize", "HEAD", "postprocess", "score", "finetune", "BENCHMARKS",
           "add_finetune_arguments", "run_finetune")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_module_has_the_surface(name):
    module = TASKS[name].module
    missing = [attr for attr in SURFACE if not hasattr(module, attr)]
    assert not missing, (name, missing)
    assert all(callable(getattr(module, attr)) for attr in SURFACE if attr not in ("HEAD", "BENCHMARKS"))
    assert TASKS[name].summary and TASKS[name].summary == module.__doc__.strip().splitlines()[0]


def test_benchmark_names_are_unique_and_cover_every_shipped_budget():
    names = [b.name for t in TASKS.values() for b in t.module.BENCHMARKS]
    assert len(names) == len(set(names)) == len(BENCHMARKS)
    for budget in ("smoke", "demo", "cpu-hour", "cpu-day", "paper"):
        assert set(load_budget(budget)["tasks"]) <= set(BENCHMARKS), budget
    with pytest.raises(BertkitError, match="unknown task 'nope'"):
        benchmark("nope")


def test_glue_names_come_from_one_list():
    # mnli-mm is its own metric task (the mismatched dev set) and MNLI's data for reading.
    assert canonical_task_name("MNLI-mm") == "mnli-mm" and glue_task("MNLI-mm") is GLUE_TASKS["mnli"]
    for alias, name in (("sst2", "sst-2"), ("STS_B", "sts-b"), ("diagnostic", "ax"), ("mnli-matched", "mnli")):
        assert glue_task(alias) is GLUE_TASKS[name] and canonical_task_name(alias) == name
    with pytest.raises(BertkitError, match="unknown GLUE task 'nope'.*or 'all'"):
        glue_task("nope")
    assert {t.folder for t in GLUE_TASKS.values()} >= {BENCHMARKS[n].label for n in BENCHMARKS if n in GLUE_TASKS}


def test_available_tasks_asks_each_benchmark_for_its_data(tmp_path):
    (tmp_path / "glue" / "MRPC").mkdir(parents=True)
    for split in ("train", "dev"):
        (tmp_path / "glue" / "MRPC" / f"{split}.tsv").write_text("x\n")
    (tmp_path / "multiple-choice").mkdir()
    (tmp_path / "multiple-choice" / "codah.csv").write_text("x\n")
    budget_tasks = {"mrpc": {}, "sst-2": {}, "codah": {}, "ner": {}, "squad": {}, "unknown": {}}
    assert available_tasks(budget_tasks, tmp_path) == ["mrpc", "codah"]


def test_squad_results_become_fractions_at_the_applied_threshold():
    v1 = {"exact_match": 50.0, "f1": 62.5}
    assert headline_metrics(v1) == {"exact_match": 0.5, "f1": 0.625}
    v2 = {"null_score_diff_threshold": -1.5,
          "default_threshold": {"null_score_diff_threshold": 0.0, "exact": 40.0, "f1": 45.0, "total": 30},
          "best_threshold": {"null_score_diff_threshold": -1.5, "exact": 50.0, "f1": 55.0, "total": 30,
                             "HasAns_f1": 70.0}}
    assert headline_metrics(v2) == {"exact": 0.5, "f1": 0.55, "HasAns_f1": 0.7}
    assert headline_metrics(None) == {}


def test_task_result_values_are_the_headline_metric():
    result = TaskResult(task="mrpc", metric="accuracy", metrics={"accuracy": 0.75, "f1": 0.8},
                        run_metrics=[{"accuracy": 0.7, "f1": 0.8}, {"accuracy": 0.75}, {"f1": 0.1}])
    assert result.value == 0.75 and result.run_values == [0.7, 0.75]
    assert TaskResult(task="x", metric="f1", metrics={}).value is None


def test_subsample_is_one_rule_for_every_task():
    items = list(range(50))
    assert subsample(items, None) is items and subsample(items, 50) is items
    assert subsample(items, 5, contiguous=True) == [0, 1, 2, 3, 4]  # NER: whole documents stay together
    sample = subsample(items, 5, seed=3)
    assert sample == sorted(sample) and sample == subsample(items, 5, seed=3) and sample != subsample(items, 5, seed=4)
    with pytest.raises(BertkitError, match="must be positive"):
        subsample(items, 0)
