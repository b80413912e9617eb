"""`bertkit pretrain`'s flags become one PretrainOptions value (pretraining/run.py), which `pretrain`
takes beside the data and the output folder; its fields as keywords still work."""

import dataclasses

import pytest

from bertkit.cli import build_parser
from bertkit.pretraining.run import PretrainOptions


def test_every_pretrain_flag_is_one_option_field_with_one_default():
    import argparse

    from bertkit import settings
    from bertkit.pretraining.run import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # besides the data, the output and --vocab (a check only)
    actions = [a for a in parser._actions if a.option_strings and a.dest not in ("help", "train_data", "output", "vocab")]
    assert sorted(a.dest for a in actions) == sorted(f.name for f in dataclasses.fields(PretrainOptions))
    fields = {f.name: f for f in dataclasses.fields(PretrainOptions)}
    for action in actions:
        assert action.option_strings[0] == settings.flag_of(fields[action.dest])
        assert action.default is argparse.SUPPRESS, action.dest  # the default is the field's alone
    args = build_parser().parse_args(["pretrain", "--train-data", "D", "--output", "O"])
    assert PretrainOptions.from_args(args) == PretrainOptions()


def test_flags_map_onto_the_options():
    args = build_parser().parse_args(["pretrain", "--train-data", "D", "--output", "O", "--no-nsp", "--max-steps",
                                      "7", "--time-budget", "15m", "--objective", "ltr", "--phase2-fraction", "0.2"])
    options = PretrainOptions.from_args(args)
    assert (options.nsp, options.max_steps, options.objective, options.phase2_fraction) == (False, 7, "ltr", 0.2)
    assert options.time_budget == args.time_budget


def test_an_unknown_keyword_is_refused_before_any_work(tmp_path):
    from bertkit.pretraining.run import pretrain

    with pytest.raises(TypeError, match="max_step"):
        pretrain(str(tmp_path / "missing"), str(tmp_path / "out"), max_step=3)
