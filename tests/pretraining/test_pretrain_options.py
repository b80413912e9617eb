"""`bertkit pretrain`'s flags become one PretrainOptions value (pretraining/run.py), which `pretrain`
takes beside the data and the output folder; its fields as keywords still work."""

import dataclasses

import pytest

from bertkit.cli import build_parser
from bertkit.pretraining.run import PretrainOptions


def test_every_pretrain_flag_is_one_option_field():
    args = build_parser().parse_args(["pretrain", "--train-data", "D", "--output", "O"])
    # besides the data, the output, --vocab (a check only), --no-nsp (nsp=False) and the CLI's own
    flags = set(vars(args)) - {"train_data", "output", "vocab", "no_nsp", "command", "_run", "verbose", "revision"}
    assert flags == {f.name for f in dataclasses.fields(PretrainOptions)} - {"nsp"}
    assert PretrainOptions.from_args(args) == PretrainOptions()  # the flags' defaults are the options'


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
