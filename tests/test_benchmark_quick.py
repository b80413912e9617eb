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


class _Stop(Exception):
    pass


@pytest.mark.parametrize("quick, rounds, expected", [(False, None, 4), (True, None, 2), (True, 9, 9)])
def test_rounds_override_the_plan_of_the_training_cases(monkeypatch, quick, rounds, expected):
    import bench_model
    asked = []

    def alternate(steps, warmup, repeats, **_):
        asked.append(repeats)
        raise _Stop  # the steps are timed, not run here: only the plan is checked

    monkeypatch.setattr(bench_model.C, "alternate", alternate)
    with pytest.raises(_Stop):
        bench_model.squad_case("tiny", "fp32", quick, log=lambda *_: None, rounds=rounds)
    assert asked == [expected] and bench_model.SQUAD_PLAN["tiny"][1:] == (4, 2)
    assert run_all.parse_args(["--cases", "c", "--rounds", "16"]).rounds == 16
    with pytest.raises(SystemExit):
        run_all.parse_args(["--rounds", "0"])


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


# ---------------------------------------------------------------- benchmarks/bench_engines.py


def _engines_result(cls, ratios: dict[str, float], date="then"):
    """A bench_engines result with bertkit at 10 seq/s and each other engine at 10 / ratio."""
    import bench_engines

    engines = {"bertkit_fp32": {"seq_per_s": 10.0}, "bertkit_int8": {"seq_per_s": 12.0}}
    for name, ratio in ratios.items():
        engines[name] = {"seq_per_s": (12.0 if name.endswith("int8") else 10.0) / ratio}
    for name, e in engines.items():
        precision = name.rsplit("_", 1)[1]
        ours = engines[f"bertkit_{precision}"]["seq_per_s"]
        e.update(label=bench_engines.LABELS[name], precision=precision, bertkit_speedup=ours / e["seq_per_s"],
                 bertkit_speedup_paired=ours / e["seq_per_s"],
                 check=None if name == "bertkit_fp32" else {"max_abs_diff": 1e-6, "mean_cosine": 1.0,
                                                            **({"within_tolerance": True} if precision == "fp32" else {})})
    verdict = {}
    for precision in ("fp32", "int8"):
        others = {n: e for n, e in engines.items() if e["precision"] == precision and not n.startswith("bertkit")}
        fastest = max(others, key=lambda n: others[n]["seq_per_s"])
        verdict[precision] = {"fastest_other": fastest, "bertkit_vs_fastest": others[fastest]["bertkit_speedup"],
                              "bertkit_vs_fastest_paired": others[fastest]["bertkit_speedup_paired"]}
    return {"machine": {"cpu": "Some CPU", "cpu_class": cls, "logical_cpus": 2, "isa": ["avx2"], "torch": "2.13",
                        "load_average_at_start": [0.1]}, "command": "bench_engines.py", "date": date, "minutes": 1,
            "quick": False, "threads": 2, "versions": {"ctranslate2": "4"}, "load_average_at_end": [0.1],
            "rows": [{"size": "minilm", "engines": engines, "verdict": verdict}], "levers": []}


def test_engines_arguments_sizes_and_the_reference_engine():
    import bench_engines

    quick = bench_engines.parse_args(["--quick", "--engines", "ctranslate2_fp32"])
    assert quick.sizes == ["minilm"] and quick.engines == ["bertkit_fp32", "ctranslate2_fp32"]
    assert bench_engines.parse_args([]).sizes == ["minilm", "base"]
    with pytest.raises(SystemExit):
        bench_engines.parse_args(["--engines", "tensorrt_fp32"])
    levers = bench_engines.parse_args(["--levers", "--lever", "packed_weights=mkl,attention_bucket=16"])
    assert levers.lever_changes == {"packed_weights=mkl,attention_bucket=16": {"packed_weights": "mkl",
                                                                              "attention_bucket": "16"}}
    assert bench_engines.parse_args(["--levers"]).lever_changes == bench_engines.LEVERS
    for bad in ("packed_weights=blas", "no_such_option=1", "packed_weights"):
        with pytest.raises(SystemExit):
            bench_engines.parse_args(["--levers", "--lever", bad])


def test_engines_report_names_the_fastest_engine_per_precision(tmp_path):
    import bench_engines

    result = _engines_result("avx2", {"onnxruntime_fp32": 1.3, "ctranslate2_fp32": 0.8, "ctranslate2_int8": 0.9})
    text = bench_engines.markdown(result)
    assert "| minilm | fp32 | CTranslate2 fp32 | 0.80x / 0.80x |" in text
    assert "| minilm | int8 | CTranslate2 int8 | 0.90x / 0.90x |" in text
    assert "| all-MiniLM-L6-v2 (real weights) | 10 | 7.69 | **12.5** | 12 | **13.3** |" in text  # fastest in bold
    table = tmp_path / "engines.json"
    table.write_text(json.dumps(_engines_result("avx2", {"onnxruntime_fp32": 1.3, "ctranslate2_fp32": 1.1,
                                                         "ctranslate2_int8": 1.0})))
    lines = [line for line in bench_engines.compare_with_table(result, table).splitlines() if line.startswith("| minilm")]
    assert len(lines) == 3
    assert "slower than the table" not in lines[0] and "1.00" in lines[0]  # ONNX Runtime: as in the table
    assert "slower than the table" in lines[1]  # CTranslate2 fp32: 0.80x against 1.10x
    missing = bench_engines.compare_with_table(result, tmp_path / "none.json")
    assert "No engines table for CPU class avx2" in missing


def test_engines_rows_compare_the_compiled_graph_when_the_eager_engine_was_left_out():
    # `--engines bertkit-compiled_int8,onnxruntime_int8`: the run's table is made (not a KeyError after
    # minutes of timing), the other engines measured against the graph
    import types

    import bench_engines

    times = {"bertkit-compiled_int8": [0.002, 0.002, 0.003], "onnxruntime_int8": [0.004, 0.004, 0.006]}
    row = bench_engines.size_rows("minilm", times, {}, {}, [types.SimpleNamespace(lengths=[8])], 1, (8, 64))
    assert row["engines"]["onnxruntime_int8"]["bertkit_speedup"] == 2.0
    assert "int8" not in row["verdict"] and row["verdict"]["int8 compiled"]["bertkit_vs_fastest"] == 2.0


def test_profile_op_classes():
    """profile_engines sorts torch ops and perf symbols of both engines into the same classes."""
    import profile_engines as P

    torch_ops = {"aten::addmm": "GEMM", "mkldnn::_linear_pointwise": "GEMM", "quantized::linear_dynamic": "GEMM",
                 "aten::_scaled_dot_product_flash_attention_for_cpu": "attention", "aten::native_layer_norm": "LayerNorm",
                 "aten::gelu": "GELU", "aten::index_select": "layout / copies", "aten::tanh": "other ops"}
    for name, cls in torch_ops.items():
        assert P.classify(name, P.TORCH_OPS) == cls, name
    symbols = {"libtorch_cpu.so [.] mkl_blas_def_sgemm_kernel_0_zen": "GEMM",
               "libctranslate2.so [.] ctranslate2::cpu::softmax<(ctranslate2::cpu::CpuIsa)2>": "attention",
               "libctranslate2.so [.] ctranslate2::cpu::gelu<(ctranslate2::cpu::CpuIsa)2>": "GELU",
               "libctranslate2.so [.] ctranslate2::cpu::vec_erf<(ctranslate2::cpu::CpuIsa)2>": "GELU",
               "libgomp.so.1 [.] 0x000000000001de62": "threading (OpenMP)",
               "[JIT] tid 26874 [.] 0x00007fc072a754b4": "GEMM",
               "libpython3.11.so.1.0 [.] _PyEval_EvalFrameDefault": "Python / framework",
               "libc.so.6 [.] __memmove_avx_unaligned_erms": "layout / copies",
               "libtorch_cpu.so [.] c10::impl::OperatorEntry::lookup": "Python / framework",
               "libtorch_cpu.so [.] at::native::AVX2::VectorizedLoop2d<add_kernel>": "other ops"}
    for name, cls in symbols.items():
        assert P.classify(name, P.PERF_SYMBOLS) == cls, name


def test_alternation_shuffled_each_round_varies_who_runs_after_whom():
    """bench_engines' order: every engine once per round; with a seed, a fresh permutation each round
    (a rotation keeps each engine behind the same one, e.g. behind an engine whose threads spin)."""
    import bench_common

    def predecessors(shuffle_seed):
        calls = []
        steps = {name: (lambda name=name: calls.append(name)) for name in "abcde"}
        times = bench_common.alternate(steps, warmup=1, repeats=12, shuffle_seed=shuffle_seed)
        assert all(len(t) == 12 for t in times.values())
        rounds = [calls[i:i + 5] for i in range(0, len(calls), 5)]
        assert all(sorted(r) == list("abcde") for r in rounds)
        return {pair for r in rounds for pair in zip(r, r[1:])}, rounds

    rotated, _ = predecessors(None)
    shuffled, rounds = predecessors(0)
    assert len({prev for prev, name in rotated if name == "a"}) == 1  # always the same one
    assert len({prev for prev, name in shuffled if name == "a"}) >= 3
    assert predecessors(0)[1] == rounds  # seeded: the same orders every run


def test_serve_latency_report_compares_every_door_with_the_engine():
    import serve_latency

    row = lambda median: {"median_ms": median, "p90_ms": median * 1.5, "calls": 10}  # noqa: E731
    result = {"machine": {"cpu_class": "avx2", "cpu": "Some CPU"}, "command": "serve_latency.py", "date": "then",
              "model": "all-MiniLM-L6-v2", "requests": 10, "block": 5, "precision": "fp32",
              "load_average_at_start": [0.1], "cold_start_s": 3.2, "first_request_ms": 9.0,
              "first_request_access_log": {"queue_ms": 0.1, "compute_ms": 7.5, "duration_ms": 8.4},
              "calls": {"engine": row(6.0), "pipeline": row(6.3), "serve /embed": row(6.5),
                        "serve /v1/embeddings": row(6.8)},
              "access_log_embed": {"serve": {"queue_ms": 0.05, "compute_ms": 5.8, "duration_ms": 6.2}}}
    text = serve_latency.markdown(result)
    assert "after a rest" not in text  # results from before the rested pass still render
    result["calls_after_rest"] = {"engine": row(8.0), "pipeline": row(8.4), "serve /embed": row(9.1)}
    text = serve_latency.markdown(result)
    assert "| serve /embed | 9.10 | 13.65 | +1.10 ms |" in text and "| pipeline | 8.40 | 12.60 | 1.05x |" in text
    assert "| pipeline (in process) | 6.30 | 9.45 | 1.05x |" in text
    assert "| serve /embed (HTTP, client side) | 6.50 | 9.75 | +0.50 ms |" in text
    assert "serve: queue 0.05 ms, compute 5.80 ms, whole request 6.20 ms" in text
    assert "first answer 3.20 s" in text and "9.0 ms, 1.38x the steady /embed median" in text
    assert "queue 0.10 ms, compute 7.50 ms, whole request 8.40 ms." in text
    assert len(serve_latency.texts(5)) == 5 and serve_latency.texts(5) == serve_latency.texts(5)


def test_serve_latency_rests_before_every_call_of_the_rested_pass(monkeypatch):
    import serve_latency

    slept, seen = [], []
    monkeypatch.setattr(serve_latency.time, "sleep", lambda s: slept.append(s) or seen.append("rest"))
    calls = {name: (lambda text, name=name: seen.append((name, text))) for name in "ab"}
    times = serve_latency.after_rest(calls, ["t0", "t1", "t2"])
    assert {name: len(ms) for name, ms in times.items()} == {"a": 3, "b": 3}
    assert seen == ["rest", ("a", "t0"), "rest", ("b", "t0"), "rest", ("b", "t1"), "rest", ("a", "t1"),
                    "rest", ("a", "t2"), "rest", ("b", "t2")]
    assert set(slept) == {serve_latency.REST_BEFORE_CALL_S}


def test_serve_latency_alternates_blocks_each_kind_timing_every_input(monkeypatch):
    import serve_latency

    monkeypatch.setattr(serve_latency, "REST_S", 0)
    seen = []
    calls = {name: (lambda text, name=name: seen.append((name, text))) for name in "abc"}
    times = serve_latency.alternated(calls, [f"t{i}" for i in range(6)], block=3)
    assert {name: len(ms) for name, ms in times.items()} == {"a": 6, "b": 6, "c": 6}
    # a block: one untimed call, then the block's inputs back to back; the order reversed each round
    blocks = [seen[i:i + 4] for i in range(0, len(seen), 4)]
    assert [b[0][0] for b in blocks] == list("abc") + list("cba")
    assert all(len({name for name, _ in b}) == 1 for b in blocks)
    assert [text for _, text in blocks[0][1:]] == ["t0", "t1", "t2"] and blocks[3][1][1] == "t3"


def test_run_all_engines_report_prints_the_batch1_row(tmp_path):
    import bench_engines
    import run_all

    result = _engines_result("avx2", {"onnxruntime_fp32": 1.3, "ctranslate2_fp32": 0.8, "ctranslate2_int8": 0.9})
    single = _engines_result("avx2", {"onnxruntime_fp32": 0.5, "ctranslate2_fp32": 0.6, "ctranslate2_int8": 0.4})
    for name, e in single["rows"][0]["engines"].items():
        e.update(median_s=1 / e["seq_per_s"], p90_s=1.5 / e["seq_per_s"])
    single["rows"][0].update(batch_size=1, lengths=[8, 64])
    result["batch1_rows"] = single["rows"]
    text = run_all.engines_report(result, tmp_path, tmp_path)
    assert "## Batch 1" in text and "| median ms per call (p90) |" in text
    assert (tmp_path / "engines_batch1.md").is_file()
    assert "| minilm | fp32 | ONNX Runtime fp32 (BERT fusions) | 0.50x / 0.50x |" in bench_engines.markdown(
        {**result, "rows": single["rows"]})
