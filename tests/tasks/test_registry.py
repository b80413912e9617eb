"""The task table: every entry is one Task class with its command line, the names agree across modules,
and every task's result has one shape (fractions, whatever unit the official scorer prints)."""

import argparse

import pytest

from bertkit.errors import BertkitError
from bertkit.metrics.glue import canonical_task_name
from bertkit.reproduce import available_tasks, load_budget
from bertkit.tasks.examples import subsample
from bertkit.tasks.results import TaskResult
from bertkit.tasks.glue import GLUE_TASKS, glue_task
from bertkit.tasks import registry
from bertkit.tasks.registry import BENCHMARKS, TASKS, benchmark
from bertkit.tasks.task import Task
from bertkit.tasks.squad import headline_metrics

@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_entry_is_one_task_class_with_its_command_line(name):
    task = TASKS[name].task
    assert issubclass(task, Task) and task is not Task
    # what the runner calls is the class's own, not the interface's NotImplementedError
    for method in ("read", "encode"):
        assert getattr(task, method) is not getattr(Task, method), (name, method)
    assert task.evaluate is not Task.evaluate or Task.predict is not task.predict, name
    assert task.from_args is not Task.from_args or task.run_finetune is not Task.run_finetune, name
    parser = argparse.ArgumentParser()
    task.add_finetune_arguments(parser)
    assert {"model", "output", "overwrite"} <= {a.dest for a in parser._actions}
    assert TASKS[name].summary == task.__doc__.strip().splitlines()[0] and TASKS[name].summary


def test_one_class_named_task_and_no_module_surfaces():
    from bertkit.tasks import custom, glue, multiple_choice, ner, paws, squad

    assert not hasattr(registry, "Task") or registry.Task is Task
    for module in (glue, multiple_choice, squad, ner, paws, custom):
        left = [a for a in ("HEAD", "read", "featurize", "postprocess", "score", "finetune", "BENCHMARKS",
                            "add_finetune_arguments", "run_finetune") if hasattr(module, a)]
        if module is custom:  # bertkit.finetune(task, ...), the Python call of the own-data commands
            left.remove("finetune")
        assert not left, (module.__name__, left)


def test_benchmark_names_are_unique_and_cover_every_shipped_budget():
    names = [b.name for t in TASKS.values() for b in t.task.benchmarks()]
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
