"""Fuzz every route of `bertkit serve` over HTTP with hostile JSON bodies: random JSON, wrong types,
numeric extremes, deep nesting, huge strings within the body limit, broken bytes. The property
(issue 30): every answer is 2xx or 4xx -- a 4xx with TEI's error body -- and the server stays
healthy. Bounded for `make test`; `pytest --fuzz-long tests/fuzz/test_fuzz_http.py` hunts longer.
"""

from __future__ import annotations

import io
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertkit.heads import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                           BertForTokenClassification)
from bertkit.inference import InferenceEngine
from bertkit.model import BertModel
from bertkit.serving.command import Server

from http_server import request, server_in_thread  # noqa: E402  (tests/ is on the path)

MAX_BODY = 256 * 1024
PROMPTS = {"query": "query: ", "doc": "passage: "}

# ---- values

INTS = st.one_of(st.integers(-3, 600), st.sampled_from([0, -1, 2**31, 2**63, -2**63, 10**30, 10**100]))
NASTY_TEXTS = ["", " ", "\x00\x01\x02\x7f", "\u200b\u2028", "[MASK]", "[MASK] [MASK]", "[CLS] [SEP] [PAD]", "##",
               "word " * 300, "a" * 5000, "é" * 700, "[MASK] " * 80, "🙂" * 50, "\t\r\n", "?" * 100]
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(NASTY_TEXTS))
JSON = st.recursive(st.none() | st.booleans() | INTS | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
IDS = st.lists(st.one_of(st.integers(0, 30521), INTS), max_size=80)
TEXTS_OR_IDS = st.one_of(TEXT, IDS, st.lists(st.one_of(TEXT, IDS), max_size=6))
TEXTS = st.one_of(TEXT, st.lists(TEXT, max_size=6))
BOOL = st.booleans()
PROMPT = st.one_of(st.sampled_from(sorted(PROMPTS)), st.sampled_from(sorted(PROMPTS)), st.text(max_size=8))
SMALL = st.one_of(st.integers(1, 40), st.integers(1, 40), INTS)  # dimensions, top_k, lengths: mostly valid
MASKED = st.one_of(TEXT.map(lambda t: t + " [MASK]"), st.lists(TEXT.map(lambda t: "[MASK] " + t), max_size=4), TEXTS)
QA_ITEM = st.fixed_dictionaries({"question": TEXT, "context": TEXT})

# route -> the fields a good body has; each example keeps, breaks (a random JSON value) or drops each.
FIELDS = {
    "/embed": {"inputs": TEXTS_OR_IDS, "normalize": BOOL, "truncate": BOOL, "dimensions": SMALL, "prompt_name": PROMPT,
               "truncation_direction": st.sampled_from(["Right", "Left", "right"])},
    "/embed_all": {"inputs": TEXTS_OR_IDS, "truncate": BOOL, "prompt_name": PROMPT},
    "/similarity": {"inputs": st.fixed_dictionaries({"source_sentence": TEXT, "sentences": st.lists(TEXT, max_size=6)}),
                    "truncate": BOOL, "prompt_name": PROMPT},
    "/tokenize": {"inputs": TEXTS, "add_special_tokens": BOOL, "prompt_name": PROMPT},
    "/decode": {"ids": st.one_of(IDS, st.lists(IDS, max_size=4)), "skip_special_tokens": BOOL},
    "/v1/embeddings": {"input": TEXTS_OR_IDS, "model": TEXT, "encoding_format": st.sampled_from(["float", "base64", "x"]),
                       "dimensions": SMALL, "user": TEXT},
    "/rerank": {"query": TEXT, "texts": st.lists(TEXT, max_size=6), "raw_scores": BOOL, "return_text": BOOL,
                "truncate": BOOL},
    "/predict": {"inputs": st.one_of(TEXTS, st.lists(st.lists(TEXT, min_size=1, max_size=3), max_size=4)),
                 "raw_scores": BOOL, "truncate": BOOL},
    "/token-classification": {"inputs": TEXTS, "truncate": BOOL,
                              "aggregation_strategy": st.sampled_from(["simple", "none", "first", "x"])},
    "/question-answering": {"inputs": st.one_of(QA_ITEM, st.lists(QA_ITEM, max_size=3)), "top_k": SMALL,
                            "max_answer_len": SMALL, "handle_impossible_answer": BOOL, "truncate": BOOL},
    "/fill-mask": {"inputs": MASKED, "top_k": SMALL},
}
# route -> the server (head) that answers it
HEADS = {"/rerank": "reranker", "/predict": "reranker", "/token-classification": "ner",
         "/question-answering": "qa", "/fill-mask": "mlm"}

# Whole bodies that are not JSON objects or that break a parser.
RAW_BODIES = [b"", b"{", b"null", b"[]", b'"inputs"', b"\xff\xfe{}", b'{"inputs": "caf\xe9"}', b"[" * 200_000,
              b'{"inputs":' * 5_000, b'{"inputs": "\\ud800"}', b'{"inputs": NaN}', b'{"top_k": 1' + b"0" * 5000 + b"}",
              b'{"inputs": "' + b"x" * (MAX_BODY + 10) + b'"}', b'{"inputs": ' + b"[" * 127 + b"]" * 127 + b"}",
              b'{"inputs": "\\u0000"}', b'{"inputs": 1e999}']


def body_for(route: str):
    def assemble(choices):
        body = {}
        for name, (mode, good, bad) in choices.items():
            if mode == "keep":
                body[name] = good
            elif mode == "break":
                body[name] = bad
        return json.dumps(body).encode()

    fields = st.fixed_dictionaries({name: st.tuples(st.sampled_from(["keep"] * 6 + ["break", "drop"]), good, JSON)
                                    for name, good in FIELDS[route].items()})
    return st.one_of(fields.map(assemble), fields.map(assemble), fields.map(assemble),
                     JSON.map(lambda value: json.dumps(value).encode()), st.sampled_from(RAW_BODIES))


# ---- servers


@pytest.fixture(scope="module")
def ports(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("fuzz_http")
    folders = {
        "embedding": tiny_model(BertModel, root / "embedding", max_positions=64),
        "reranker": tiny_model(BertForSequenceClassification, root / "reranker", max_positions=64,
                               id2label={0: "LABEL_0"}),
        "ner": tiny_model(BertForTokenClassification, root / "ner", max_positions=64,
                          id2label=dict(enumerate(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]))),
        "qa": tiny_model(BertForQuestionAnswering, root / "qa", max_positions=64),
        "mlm": tiny_model(BertForMaskedLM, root / "mlm", max_positions=64),
    }
    (folders["embedding"] / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    with_servers = {}
    stack = []
    for name, folder in folders.items():
        server = Server(InferenceEngine(folder, precision="fp32"), max_client_batch_size=8, max_body_bytes=MAX_BODY)
        server.access_log.stream = io.StringIO()  # the access log is not what this test reads
        context = server_in_thread(server)
        with_servers[name] = context.__enter__()
        stack.append(context)
    yield with_servers
    for context in stack:
        context.__exit__(None, None, None)


def check_answer(port: int, route: str, body: bytes) -> None:
    status, answer = request(port, route, raw=body, timeout=120)
    if os.environ.get("BERTKIT_FUZZ_LOG"):  # to see what the generated requests got
        with open(os.environ["BERTKIT_FUZZ_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{route}\t{status}\t{json.dumps(answer)[:150]}\n")
    assert 200 <= status < 300 or 400 <= status < 500, (route, body[:300], status, answer)
    if status >= 400:
        error = answer["error"]["message"] if route.startswith("/v1/") else answer["error"]
        assert isinstance(error, str) and error, (route, body[:300], answer)
    assert request(port, "/health", timeout=60)[0] == 200


@pytest.mark.parametrize("route", sorted(FIELDS))
def test_every_route_answers_2xx_or_4xx_and_stays_healthy(ports, route, pytestconfig):
    long = pytestconfig.getoption("--fuzz-long")
    port = ports[HEADS.get(route, "embedding")]

    @settings(max_examples=600 if long else 15, deadline=None, derandomize=not long, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=body_for(route))
    def property_holds(body):
        check_answer(port, route, body)

    property_holds()
