"""Fuzz the commands in-process through bertkit.cli.main with hostile flag values, hostile files and
hostile output paths: each run exits 0, or exits 2 with exactly one `error:` line on stderr."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from fuzz_strategies import (FUZZ, FUZZ_SLOW, hostile_file, json_text, rows_of, run_cli, squad_json, tiny_vocab,
                             write_tiny_model)
from hypothesis import given
from hypothesis import strategies as st

# Values that are wrong for most numeric flags, plus a few that are right.
NASTY_FLAG_VALUES = ["0", "-1", "-0", "1", "2", "0.5", "nan", "inf", "-inf", "1e400", "abc", "", " ", "1,0", "2,,",
                     ",", "0x10", "²", "99999999999999999999"]
# For flags whose large values are legitimate but would make the run long (epochs, passes).
BOUNDED_FLAG_VALUES = [v for v in NASTY_FLAG_VALUES if v not in ("99999999999999999999", "0x10")]
DEVICES = ["cpu", "auto", "cuda", "cuda:7", "gpu", "", "cpu:0", "mps"]

_counter = itertools.count()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_commands")
    model = write_tiny_model(root / "model")
    qa_model = write_tiny_model(root / "qa_model", qa_head=True)
    glue = root / "data" / "glue" / "RTE"
    glue.mkdir(parents=True)
    header = "index\tsentence1\tsentence2\tlabel\n"
    glue.joinpath("train.tsv").write_text(header + "".join(
        f"{i}\tthe cat sat\ta dog is on the mat\t{'entailment' if i % 2 else 'not_entailment'}\n" for i in range(6)))
    glue.joinpath("dev.tsv").write_text(header + "0\tthe cat\ta cat\tentailment\n1\ta dog\tthe mat\tnot_entailment\n")
    corpus = root / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\na dog is on the mat .\n\nwhat is a cat ?\nthe dog sat .\n\n"
                      "a cat is a cat .\nthe mat is on the dog .\n")
    return {"root": root, "model": model, "qa_model": qa_model, "data": root / "data", "corpus": corpus}


def fresh(workspace, name="out") -> Path:
    return workspace["root"] / f"{name}{next(_counter)}"


def flag_pairs(flags: dict[str, tuple[list[str], list[str]]], max_size: int = 2):
    """A few (flag, value) pairs; each value is good two times in three (so runs get past the parser
    and the hostile values meet working code too), else drawn from the flag's hostile values."""
    def value(flag):
        good, bad = flags[flag]
        return st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(bad))

    return st.lists(st.sampled_from(sorted(flags)).flatmap(lambda f: st.tuples(st.just(f), value(f))),
                    max_size=max_size, unique_by=lambda pair: pair[0])


def flatten(pairs) -> list[str]:
    return [f"{flag}={value}" for flag, value in pairs]  # "--flag=-1": a value may start with "-"


GLUE_FLAGS = {"--batch-size": (["1", "2", "3,4", "1000"], NASTY_FLAG_VALUES),
              "--learning-rate": (["1e-3", "1e-4,1e-5", "10"], NASTY_FLAG_VALUES),
              "--epochs": (["1", "0.5", "2", "0.01"], BOUNDED_FLAG_VALUES),
              "--seed": (["0", "1,2", "4294967295"], NASTY_FLAG_VALUES),
              "--warmup-ratio": (["0", "1", "0.5"], NASTY_FLAG_VALUES),
              "--weight-decay": (["0", "0.01", "10"], NASTY_FLAG_VALUES),
              "--max-seq-length": (["8", "9", "64", "100000"], NASTY_FLAG_VALUES + ["4"]),
              "--eval-batch-size": (["1", "1000"], NASTY_FLAG_VALUES),
              "--max-train-examples": (["1", "2", "100000"], NASTY_FLAG_VALUES),
              "--device": (["cpu", "auto"], DEVICES), "--precision": (["fp32", "bf16", "auto"], ["fp16"])}


@FUZZ_SLOW
@given(pairs=flag_pairs(GLUE_FLAGS))
def test_finetune_glue_flags(workspace, capsys, pairs):
    out = fresh(workspace)
    run_cli(["finetune", "glue", "--task", "rte", "--model", workspace["model"], "--data-dir", workspace["data"],
             "--output", out, "--epochs", "1", "--max-seq-length", "16", *flatten(pairs)], capsys)


CREATE_FLAGS = {"--max-seq-length": (["5", "6", "8", "64", "65535"], NASTY_FLAG_VALUES),
                "--max-predictions-per-seq": (["1", "2", "20", "255"], NASTY_FLAG_VALUES),
                "--masked-lm-prob": (["0.15", "1", "0.001"], NASTY_FLAG_VALUES),
                "--short-seq-prob": (["0", "1", "0.5"], NASTY_FLAG_VALUES),
                "--dupe-factor": (["1", "3"], BOUNDED_FLAG_VALUES),
                "--seed": (["0", "4294967295"], NASTY_FLAG_VALUES),
                "--shard-size": (["1", "2", "100000"], NASTY_FLAG_VALUES),
                "--block-chars": (["1", "10", "100000"], NASTY_FLAG_VALUES),
                "--max-line-chars": (["1", "2", "5", "1000"], NASTY_FLAG_VALUES),
                "--raw-document-break-lines": (["1", "2"], NASTY_FLAG_VALUES),
                "--mask-mix": (["80,10,10", "100,0,0", "0,0,100"], ["1,2", "a,b,c", "-10,100,10", "nan,0,100", ""]),
                "--masking": (["static", "dynamic"], ["none"]),
                "--workers": (["1", "2"], ["0", "-1", "abc", "100000"])}


@FUZZ
@given(pairs=flag_pairs(CREATE_FLAGS, max_size=3), dump=st.sampled_from([None, None, "fresh", "fresh", "input", "vocab",
                                                                         "folder", "/dev/null", "under-a-file"]),
       raw=st.booleans())
def test_create_pretraining_data_flags_and_dump_path(workspace, capsys, pairs, dump, raw):
    corpus, vocab = workspace["corpus"], workspace["model"] / "vocab.txt"
    before = (corpus.read_bytes(), vocab.read_bytes())
    dump_path = {None: None, "fresh": fresh(workspace, "dump"), "input": corpus, "vocab": vocab,
                 "folder": workspace["root"], "/dev/null": Path("/dev/null"),
                 "under-a-file": corpus / "dump.jsonl"}[dump]
    argv = ["create-pretraining-data", "--input", corpus, "--vocab", vocab, "--output", fresh(workspace),
            "--no-progress", "--dupe-factor", "1", *flatten(pairs)] + (["--raw"] if raw else [])
    if dump_path is not None:
        argv += ["--dump-jsonl", dump_path, "--overwrite"]
    run_cli(argv, capsys)
    assert (corpus.read_bytes(), vocab.read_bytes()) == before  # inputs are never touched


@FUZZ
@given(content=hostile_file(st.lists(st.sampled_from(["the cat", "a ||| b", "|||", "", " ", "\t"]), max_size=4)
                            .map("\n".join)),
       pairs=flag_pairs({"--layers": (["-1", "0", "1", "-2", "0,-1"], ["-3", "abc", "", "-1,,-1", "99"]),
                         "--max-seq-length": (["3", "4", "16", "100000"], NASTY_FLAG_VALUES),
                         "--eval-batch-size": (["1", "2", "1000"], NASTY_FLAG_VALUES),
                         "--pool": (["none", "concat", "first", "sum", "mean"], ["max"]),
                         "--device": (["cpu"], DEVICES), "--format": (["jsonl", "npy", "safetensors"], ["csv"]),
                         "--dtype": (["float16"], ["int8"])}, max_size=3),
       output=st.sampled_from(["fresh.jsonl", "fresh.jsonl", "fresh.npy", "fresh.npy", "input", "model-weights",
                               "folder", "under-a-file"]))
def test_extract_features(workspace, capsys, content, pairs, output):
    source = fresh(workspace, "input")
    source.write_bytes(content)
    weights = workspace["model"] / "model.safetensors"
    weights_before = weights.read_bytes()
    target = {"fresh.jsonl": fresh(workspace).with_suffix(".jsonl"), "fresh.npy": fresh(workspace).with_suffix(".npy"),
              "input": source, "model-weights": weights, "folder": workspace["root"],
              "under-a-file": source / "x.jsonl"}[output]
    run_cli(["extract-features", "--input", source, "--model", workspace["model"], "--output", target,
             *flatten(pairs)], capsys)
    assert source.read_bytes() == content and weights.read_bytes() == weights_before


SQUAD_FLAGS = {"--n-best-size": (["1", "2", "1000"], NASTY_FLAG_VALUES),
               "--max-seq-length": (["8", "12", "64", "100000"], NASTY_FLAG_VALUES),
               "--doc-stride": (["1", "2", "1000"], NASTY_FLAG_VALUES),
               "--max-query-length": (["1", "2", "1000"], NASTY_FLAG_VALUES),
               "--max-answer-length": (["1", "1000"], NASTY_FLAG_VALUES),
               "--null-score-diff-threshold": (["0", "-1e30", "5"], NASTY_FLAG_VALUES),
               "--eval-batch-size": (["1", "1000"], NASTY_FLAG_VALUES), "--version": (["1.1", "2.0"], ["3"]),
               "--device": (["cpu"], DEVICES)}


@FUZZ_SLOW
@given(data=squad_json, pairs=flag_pairs(SQUAD_FLAGS))
def test_predict_squad(workspace, capsys, data, pairs):
    data_file = fresh(workspace, "squad")
    data_file.write_text(json_text(data))
    run_cli(["predict", "squad", "--model", workspace["qa_model"], "--input", data_file, "--output",
             fresh(workspace), *flatten(pairs)], capsys)


@FUZZ
@given(stdin=st.one_of(st.binary(max_size=100), st.text(max_size=50).map(str.encode)),
       vocab=st.sampled_from(["model", "vocab.txt", "missing", "corpus"]), tokens=st.booleans())
def test_tokenize_stdin(workspace, capsys, stdin, vocab, tokens):
    path = {"model": workspace["model"], "vocab.txt": workspace["model"] / "vocab.txt",
            "missing": workspace["root"] / "missing", "corpus": workspace["corpus"]}[vocab]
    run_cli(["tokenize", "--vocab", path] + (["--tokens"] if tokens else []), capsys, stdin=stdin)


@FUZZ
@given(content=st.one_of(st.sampled_from([b"the cat sat\n\na dog\n", b"\xc3\xa9t\xc3\xa9 na\xc3\xafve\n"]),
                         hostile_file(rows_of(" "))),
       size=st.sampled_from(["6", "7", "30", "100", "30", "100"] + NASTY_FLAG_VALUES),
       min_frequency=st.sampled_from(["1", "1", "2", "0", "-1", "x"]),
       output=st.sampled_from(["fresh", "fresh", "model", "input-folder", "under-a-file"]), overwrite=st.booleans())
def test_train_tokenizer(workspace, capsys, content, size, min_frequency, output, overwrite):
    corpus = fresh(workspace, "corpus")
    corpus.write_bytes(content)
    model_vocab = workspace["model"] / "vocab.txt"
    before = model_vocab.read_bytes()
    target = {"fresh": fresh(workspace), "model": workspace["model"], "input-folder": corpus.parent,
              "under-a-file": corpus / "sub"}[output]
    code = run_cli(["train-tokenizer", "--input", corpus, "--vocab-size", size, "--min-frequency", min_frequency,
                    "--output", target] + (["--overwrite"] if overwrite else []), capsys)
    if not overwrite or output != "model" or code != 0:
        assert model_vocab.read_bytes() == before  # a model's vocabulary is replaced only when asked
    assert corpus.read_bytes() == content


@FUZZ
@given(data=st.one_of(squad_json, st.binary(max_size=30)), predictions=st.one_of(
    st.dictionaries(st.sampled_from(["q1", "q2"]), st.sampled_from(["a", "", 1, None, float("nan")])),
    st.binary(max_size=10)), conll=hostile_file(rows_of(" ")))
def test_evaluate_commands(workspace, capsys, data, predictions, conll):
    files = {}
    for name, value in (("data", data), ("pred", predictions), ("conll", conll)):
        files[name] = fresh(workspace, name)
        files[name].write_bytes(value if isinstance(value, bytes) else json_text(value).encode())
    run_cli(["evaluate", "squad", files["data"], files["pred"]], capsys)
    run_cli(["evaluate", "conll", files["conll"]], capsys)


@FUZZ_SLOW
@given(records=st.lists(st.one_of(st.fixed_dictionaries({"step": st.sampled_from([1, 2, "x", None, 1e400, True]),
                                                          "loss": st.sampled_from([0.5, float("nan"), "x", None])}),
                                  st.sampled_from([[], 3, "s", None])), max_size=4), tail=st.binary(max_size=4))
def test_plot(workspace, capsys, records, tail):
    run = fresh(workspace, "run")
    run.mkdir()
    (run / "metrics.jsonl").write_bytes("\n".join(json.dumps(r) for r in records).encode() + tail)
    run_cli(["plot", run], capsys)


CONLL_GOOD = "-DOCSTART- -X- O O\n\nthe DT B-NP O\ncat NN I-NP B-PER\nsat VB B-VP O\n\na DT B-NP B-LOC\n"
SWAG_GOOD = ",sent1,sent2,ending0,ending1,label\n" + "".join(f"{i},the cat,sat,on the mat,a dog,{i % 2}\n"
                                                             for i in range(6))
TRAIN_FLAGS = {"--batch-size": (["1", "4"], NASTY_FLAG_VALUES), "--learning-rate": (["1e-3"], NASTY_FLAG_VALUES),
               "--epochs": (["1", "0.5"], BOUNDED_FLAG_VALUES), "--max-seq-length": (["8", "16"], NASTY_FLAG_VALUES),
               "--device": (["cpu"], DEVICES)}


@FUZZ_SLOW
@given(train=st.one_of(st.none(), hostile_file(rows_of(" "))), pairs=flag_pairs(TRAIN_FLAGS),
       feature_based=st.booleans())
def test_finetune_ner_with_hostile_files_and_flags(workspace, capsys, train, pairs, feature_based):
    data = fresh(workspace, "conll")
    data.mkdir()
    for split in ("train", "valid", "test"):
        (data / f"{split}.txt").write_bytes(train if split == "train" and train is not None else CONLL_GOOD.encode())
    extra = ["--feature-based", "--layers", "last", "--lstm-size", "4"] if feature_based else []
    run_cli(["finetune", "ner", "--model", workspace["model"], "--data-dir", data, "--output", fresh(workspace),
             "--epochs", "1", *extra, *flatten(pairs)], capsys)


@FUZZ_SLOW
@given(train=st.one_of(st.none(), hostile_file(rows_of(",", ["", "sent1", "sent2", "ending0", "ending1", "label"]))),
       pairs=flag_pairs({**TRAIN_FLAGS, "--dev-fraction": (["0.5", "0.2"], NASTY_FLAG_VALUES)}))
def test_finetune_swag_with_hostile_files_and_flags(workspace, capsys, train, pairs):
    train_file = fresh(workspace, "swag").with_suffix(".csv")
    train_file.write_bytes(train if train is not None else SWAG_GOOD.encode())
    run_cli(["finetune", "swag", "--model", workspace["model"], "--train-file", train_file, "--dev-fraction", "0.5",
             "--output", fresh(workspace), "--epochs", "1", *flatten(pairs)], capsys)


def test_tiny_vocabulary_is_valid():
    vocab = tiny_vocab()
    assert len(vocab) == len(set(vocab)) and vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
