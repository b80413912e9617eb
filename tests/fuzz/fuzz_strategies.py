"""Generators of hostile input for the fuzz layer, and the one property every command must keep.

The property (issue 15): a command either succeeds (exit 0) or stops with exit status 2 and exactly
one stderr line, `error: ...` -- never a traceback, a hang or another status.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from bertkit.cli import main
from bertkit.config import BertConfig
from bertkit.heads import BertForQuestionAnswering
from bertkit.model import BertModel

# Bounded and derandomized so the layer is repeatable and stays well under 90 s on one core.
# BERTKIT_FUZZ_EXAMPLES=N (or `pytest --fuzz-long`, conftest.py: 500) runs N random examples per test
# instead (a deeper hunt, new ones each time).
DEEP = int(os.environ.get("BERTKIT_FUZZ_EXAMPLES", "0"))
# A command that runs longer than this on the fuzz layer's tiny inputs is taken to hang.
HANG_SECONDS = 120


class Hang(BaseException):
    """Raised by the alarm inside a hung command (a BaseException: the CLI's handlers must not catch it)."""
FUZZ = settings(max_examples=DEEP or 30, deadline=None, derandomize=not DEEP, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
FUZZ_SLOW = settings(FUZZ, max_examples=DEEP or 15)

# Field values that break naive parsers: empty, signs, non-finite, huge, non-ASCII digits, NUL, BOM,
# quotes, separators, control characters.
NASTY_FIELDS = ["", " ", "0", "1", "2", "-1", "3.5", "nan", "NaN", "inf", "-inf", "1e400", "9" * 30, "²", "٣",
                "\x00", "\ufeff", '"', '""', "'", ",", "\t", "\r", "\u2028", "a b", "label", "entailment",
                "not_entailment", "sentence1", "O", "B-PER", "I-LOC", "-DOCSTART-", "[CLS]", "##", "null", "{}"]

nasty_field = st.one_of(st.sampled_from(NASTY_FIELDS), st.text(max_size=12))


def rows_of(separator: str, header: list[str] | None = None):
    """Text made of rows of nasty fields joined by `separator` (optionally under a good header)."""
    row = st.lists(nasty_field, min_size=0, max_size=len(header or []) + 3).map(separator.join)
    body = st.lists(row, max_size=6).map("\n".join)
    if header is None:
        return body
    return body.map(lambda text: separator.join(header) + "\n" + text)


def as_bytes(text_strategy):
    return text_strategy.map(lambda t: t.encode("utf-8", "surrogatepass"))


def hostile_file(structured_text):
    """Bytes: structured nasty text (half the time), random bytes, or invalid UTF-8 inside such text."""
    return st.one_of(
        as_bytes(structured_text),
        as_bytes(structured_text),
        as_bytes(structured_text),
        st.binary(max_size=200),
        st.tuples(as_bytes(structured_text), st.binary(min_size=1, max_size=4)).map(lambda p: p[0] + b"\xff" + p[1]),
    )


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                         st.sampled_from(NASTY_FIELDS))
json_values = st.recursive(json_scalars, lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(st.sampled_from(NASTY_FIELDS), children, max_size=3), max_leaves=12)


def either(good, bad=json_values):
    return st.one_of(good, bad)


squad_answer = st.fixed_dictionaries({"text": either(st.sampled_from(["a", "b c", ""])),
                                      "answer_start": either(st.integers(-3, 30))})
squad_question = st.fixed_dictionaries(
    {"id": either(st.sampled_from(["q1", "q2", "q3"])), "question": either(st.just("what is a?")),
     "answers": either(st.lists(squad_answer, max_size=2))},
    optional={"is_impossible": either(st.booleans())})
squad_paragraph = st.fixed_dictionaries({"context": either(st.just("a b c d e f")),
                                         "qas": either(st.lists(squad_question, max_size=3))})
squad_article = st.fixed_dictionaries({"title": either(st.just("t")),
                                       "paragraphs": either(st.lists(squad_paragraph, max_size=2))})
squad_json = st.fixed_dictionaries({"version": either(st.sampled_from(["1.1", "v2.0"])),
                                    "data": either(st.lists(squad_article, max_size=2))})


def json_text(value) -> str:
    return json.dumps(value)  # NaN / Infinity are written bare: readers must cope with them too


# ---- the property


def run_cli(argv: list[str], capsys, stdin: bytes | None = None) -> int:
    """Run `bertkit argv` in-process and check the outcome: 0, or 2 with one `error:` line, the last
    on stderr (progress lines of the "bertkit" log may come before it)."""
    return run_cli_stderr(argv, capsys, stdin)[0]


def run_cli_stderr(argv: list[str], capsys, stdin: bytes | None = None) -> tuple[int, str]:
    """run_cli, also returning what went to stderr."""
    saved = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")

    def hung(signum, frame):
        raise Hang(f"no answer in {HANG_SECONDS} s: {argv}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_SECONDS)
    try:
        code = main([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        sys.stdin = saved
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, (argv, err)
    if code != 0:
        assert code == 2, (argv, code, err)
        errors = [line for line in lines if line.startswith("error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], (argv, err)
    if os.environ.get("BERTKIT_FUZZ_LOG"):  # to see what the generated runs did: exit status and error
        with open(os.environ["BERTKIT_FUZZ_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{argv[0]} {argv[1] if len(argv) > 1 else ''}\t{code}\t{lines[-1][:150] if lines else ''}\n")
    return code, err


# ---- a tiny model with a small vocabulary of its own (no data needed)

WORDS = ["the", "a", "is", "what", "b", "c", "d", "e", "f", "cat", "dog", "sat", "on", "mat", "."]


def tiny_vocab() -> list[str]:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    return (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + letters + ["##" + c for c in letters]
            + [w for w in WORDS if w not in letters] + list("0123456789,!?'\"-"))


def write_tiny_model(directory: Path, qa_head: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocab()
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    model = BertForQuestionAnswering(config) if qa_head else BertModel(config)
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text('{"do_lower_case": true}\n', encoding="utf-8")
    return directory
