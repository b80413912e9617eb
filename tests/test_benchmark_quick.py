"""benchmarks/run_all.py --quick: its arguments, where results go per CPU class, and the comparison
with the class's table (the benchmarks themselves are timed, so they are not run here)."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import run_all  # noqa: E402


def test_quick_mode_is_the_one_minute_check_unless_cases_are_given():
    args = run_all.parse_args(["--quick"])
    assert args.quick and args.engines and args.cases == "b" and args.sizes == "mini"
    longer = run_all.parse_args(["--quick", "--cases", "a,b,c,o"])
    assert not longer.engines and longer.sizes == "mini,base"
    assert run_all.parse_args(["--quick", "--cases", "b", "--engines"]).engines
    full = run_all.parse_args([])
    assert full.cases == ",".join(run_all.ALL_CASES) and "tiny" in full.sizes and not full.engines
    explicit = run_all.parse_args(["--quick", "--cases", "a", "--sizes", "mini", "--threads", "2"])
    assert (explicit.cases, explicit.sizes, explicit.threads) == ("a", "mini", 2)


def test_kernel_choice_arguments_parse():
    import kernel_choice

    args = kernel_choice.parse_args(["--sizes", "base", "--cases", "train", "--rounds", "2"])
    assert (args.sizes, args.cases, args.rounds) == ("base", "train", 2)


def _row(case, size, precision, speedup):
    return {"case": case, "size": size, "precision": precision, "speedup": speedup}


def test_quick_run_is_compared_with_its_class_table(tmp_path):
    table = tmp_path / "results.json"
    table.write_text(json.dumps({"date": "then", "machine": {"cpu": "Some CPU", "cpu_class": "avx512"},
                                 "rows": [_row("a: pre-training step", "mini", "fp32", 3.0),
                                          _row("b: inference", "base", "fp32", 2.0)]}))
    quick = {"machine": {"cpu_class": "avx512"},
             "rows": [_row("a: pre-training step", "mini", "fp32", 2.9), _row("b: inference", "base", "fp32", 1.2),
                      _row("c: SQuAD", "mini", "fp32", 1.3)]}
    text = run_all.compare_with_table(quick, table)
    lines = [line for line in text.splitlines() if line.startswith(("| a:", "| b:", "| c:"))]
    assert len(lines) == 2  # the SQuAD row has no counterpart in the table
    assert "slower than the table" not in lines[0] and "0.97" in lines[0]
    assert "slower than the table" in lines[1] and "0.60" in lines[1]


def test_quick_run_without_a_table_says_how_to_make_one(tmp_path):
    text = run_all.compare_with_table({"machine": {"cpu_class": "avx2"}, "rows": []}, tmp_path / "none.json")
    assert "No results table for CPU class avx2" in text


@pytest.mark.parametrize("cls", ["avx2", "avx512", "avx512-bf16"])
def test_committed_tables_record_their_class(cls):
    """Every committed class table says which class (and any emulation) it was measured on."""
    machine = json.loads((BENCHMARKS / "results" / cls / "results.json").read_text())["machine"]
    assert machine["cpu_class"] == cls
