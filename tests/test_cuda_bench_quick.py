"""benchmarks/cuda_bench.py --device cpu --quick: the CUDA table's Python runs (and cannot rot) here."""

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import cuda_bench  # noqa: E402


def test_quick_cpu_run_writes_the_table(tmp_path):
    result = cuda_bench.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "cuda.json").read_text())
    assert saved["pretraining"]["rounds"] == 2 and saved["pretraining"]["tokens_per_s"] > 0
    assert saved["inference"]["bertkit_s"] > 0 and saved["published"] == cuda_bench.PUBLISHED
    table = (tmp_path / "cuda.md").read_text()
    assert "pre-training step (batch 2 x 128)" in table and "not filled" in table
    assert result["precision"] == "fp32"
