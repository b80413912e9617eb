"""One settings object per fine-tuning run: every `bertkit finetune TASK` flag of a run setting is exactly
one RunSettings field, its default stated once (the field's, or the task's Defaults for the grid and
the lengths), read back whole by RunSettings.from_args, and passed whole down to the training loop."""

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from bertkit import settings as setting_flags
from bertkit.cli import build_parser
from bertkit.tasks.registry import TASKS
from bertkit.tasks.settings import FROM_TASK, RunSettings

FIELDS = {f.name: f for f in setting_flags.cli_fields(RunSettings)}
FLAGS = {setting_flags.flag_of(f): name for name, f in FIELDS.items()}
REQUIRED = {"glue": ["--task", "mrpc"], "ner": [], "paws": []}  # the others: --train-file
PACKAGE = Path(__file__).resolve().parents[2] / "bertkit"


def finetune_parser(name):
    parser = argparse.ArgumentParser()
    TASKS[name].task.add_finetune_arguments(parser)
    return parser


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_settings_flag_is_one_field_with_no_default_of_its_own(name):
    task = TASKS[name].task
    actions = [a for a in finetune_parser(name)._actions if a.option_strings]
    by_dest = {}
    for action in actions:
        for flag in action.option_strings:
            if flag in FLAGS:  # a settings flag's spelling is only ever that field's
                assert action.dest == FLAGS[flag], (name, flag, action.dest)
        if action.dest in FIELDS:
            assert action.dest not in by_dest, (name, action.dest)  # one flag per field
            by_dest[action.dest] = action
            assert action.default is argparse.SUPPRESS, (name, action.dest)  # the default lives in the field
    assert set(by_dest) == set(FIELDS) - set(task.skipped_settings), name


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_defaults_come_from_the_field_or_the_task(name):
    task = TASKS[name].task
    argv = ["finetune", name, "--model", "m", "--output", "o", *REQUIRED.get(name, ["--train-file", "t"])]
    args = build_parser({"finetune"}).parse_args(argv)
    got = RunSettings.from_args(args, task.defaults)
    expected = task.defaults.settings(paper=not task.own_data)
    for field in dataclasses.fields(RunSettings):
        want = expected[field.name] if field.name in FROM_TASK else field.default
        assert getattr(got, field.name) == want, (name, field.name)


def test_a_flag_given_lands_in_its_field_and_only_there():
    argv = ["finetune", "text-classification", "--model", "m", "--output", "o", "--train-file", "t",
            "--warmup-ratio", "0.25", "--learning-rate", "1e-4,2e-5", "--seed", "3", "--dropout", "0",
            "--skip-bad-rows", "--save-steps", "7", "--grid", "paper"]
    task = TASKS["text-classification"].task
    args = build_parser({"finetune"}).parse_args(argv)
    got = RunSettings.from_args(args, task.defaults)
    assert (got.warmup_ratio, got.learning_rates, got.seeds, got.dropout, got.skip_bad_rows, got.save_steps) == \
        (0.25, (1e-4, 2e-5), (3,), 0.0, True, 7)
    assert got.batch_sizes == task.defaults.batch_sizes  # --grid paper: the rest of the paper's grid
    assert setting_flags.given(args, RunSettings).keys() == {"warmup_ratio", "learning_rates", "seeds", "dropout",
                                                              "skip_bad_rows", "save_steps"}


def test_help_states_each_default_once():
    text = " ".join(finetune_parser("squad").format_help().split("run settings:")[1].split())
    assert text.count("--warmup-ratio") == 1 and "fraction of the steps (default 0.1)" in text
    assert "word pieces per sequence (default 384)" in text  # squad's, from its Defaults


def test_each_default_is_written_once_in_the_fine_tuning_code():
    # The fine-tuning path's defaults are RunSettings' fields: no function on it restates one as a parameter.
    for module in ("runner.py", "sweep.py", "task.py", "arguments.py"):
        tree = ast.parse((PACKAGE / "tasks" / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                positional = a.posonlyargs + a.args
                defaulted = {x.arg for x in positional[len(positional) - len(a.defaults):]}
                defaulted |= {x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
                assert not defaulted & set(FIELDS), (module, node.name, defaulted & set(FIELDS))


def test_a_grid_point_is_the_settings_with_one_value_each():
    s = RunSettings(learning_rates=(5e-5, 3e-5), seeds=(1, 2), warmup_ratio=0.2)
    point = s.point({"learning_rate": 3e-5, "epochs": 2, "batch_size": 16, "seed": 2})
    assert (point.learning_rate, point.num_epochs, point.batch_size, point.seed, point.warmup_ratio) == \
        (3e-5, 2, 16, 2, 0.2)
    with pytest.raises(ValueError, match="learning_rates holds a grid"):
        s.learning_rate


def test_no_function_on_the_fine_tuning_path_takes_more_than_eight_parameters():
    for module in ("runner.py", "sweep.py", "settings.py"):
        tree = ast.parse((PACKAGE / "tasks" / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                count = len([x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")])
                assert count <= 8, (module, node.name, count)
