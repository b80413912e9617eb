"""The routes of `bertkit serve`, around one inference engine and one batcher.

Bodies and answers follow text-embeddings-inference (TEI) where it has the route, OpenAI's for
/v1/embeddings, and transformers' pipelines for the heads TEI does not serve. A client's bad
input is always a 4xx with TEI's body {"error", "error_type"} (OpenAI's {"error": {...}} on /v1/);
a 5xx means a fault of the server, logged with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..version import __version__
from ..inference.answer_defaults import AGGREGATION_STRATEGIES, FILL_MASK, QUESTION_ANSWERING, TOKEN_CLASSIFICATION
from ..errors import BertkitError
from ..hub.resolve import hub_id_of
from ..inference.engine import InferenceEngine
from ..inference.pipelines import fill_mask_results, label_scores, mask_row, qa_answers, qa_windows, score_function, token_entities
from .access_log import AccessLog, AccessLogMiddleware, current_stats
from .batcher import Batcher
from .embeddings import (base64_floats, finish_embedding, json_with_vectors, read_sentence_transformer_config,
                         similarities)
from .metrics import Metrics
from .openapi import docs_page, openapi_document
from .requests import (MAX_BODY_BYTES, RequestError, bounded_int, is_token_ids, option, read_json,
                       truncation_direction)

log = logging.getLogger("bertkit")

EMBEDDING_TASKS = ("feature-extraction", "sentence-embeddings")
QA_MAX_ANSWER_LEN = QUESTION_ANSWERING["max_answer_len"]  # the defaults every door shares


class Server:
    """The routes, around one engine and one batcher."""

    def __init__(self, engine: InferenceEngine, max_concurrent_requests: int = 512, max_client_batch_size: int = 32,
                 max_batch_tokens: int = 16384, model_id: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 log_format: str = "text", warm_up: bool = False, compute_threads: int | None = None):
        """warm_up: the engine's kernels made before the server returns, as `serve` does;
        compute_threads: torch's threads on the batcher's thread (`Batcher`)."""
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.metrics = Metrics()
        self.batcher = Batcher(engine, self.metrics, max_batch_tokens, warm_up, compute_threads)
        self.max_concurrent_requests = max_concurrent_requests
        self.max_client_batch_size = max_client_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.model_id = model_id or hub_id_of(engine.model_dir) or str(engine.model_dir)
        self.sentence_transformer = read_sentence_transformer_config(engine.model_dir)
        self.access_log = AccessLog(log_format)

    # ---- plumbing shared by the inference routes

    def check_batch_size(self, count: int, what: str = "inputs") -> None:
        if count == 0:
            raise RequestError(422, f"{what!r} must not be empty", "empty")
        if count > self.max_client_batch_size:
            raise RequestError(413, f"batch size {count} > maximum allowed batch size {self.max_client_batch_size}")
        current_stats().inputs = count

    def texts(self, document: dict, allow_pairs: bool = False) -> tuple[list, bool]:
        """The "inputs" field as a list, and whether it was a single input."""
        if "inputs" not in document:
            raise RequestError(422, "missing field 'inputs'")
        inputs = document["inputs"]
        single = isinstance(inputs, str)
        items = [inputs] if single else inputs
        if not isinstance(items, list):
            raise RequestError(422, f"'inputs' must be a string or a list, not {type(inputs).__name__}")
        self.check_batch_size(len(items))
        for number, item in enumerate(items):
            if isinstance(item, str) or (allow_pairs and _is_pair(item)):
                if (item if isinstance(item, str) else "".join(item)) == "":
                    raise RequestError(422, f"input {number} is empty", "empty")
                continue
            expected = "a string or a [text, text_pair] list" if allow_pairs else "a string"
            raise RequestError(422, f"input {number} must be {expected}, not {type(item).__name__}")
        return items, single

    def embedding_inputs(self, document: dict, name: str = "inputs") -> tuple[list, bool]:
        """TEI's and OpenAI's embedding input: a text, a list of token ids, or a list of either."""
        if name not in document:
            raise RequestError(422, f"missing field {name!r}")
        inputs = document[name]
        single = isinstance(inputs, str) or is_token_ids(inputs)
        items = [inputs] if single else inputs
        if not isinstance(items, list):
            raise RequestError(422, f"{name!r} must be a string, a list of token ids or a list of those, "
                                    f"not {type(inputs).__name__}")
        self.check_batch_size(len(items), name)
        for number, item in enumerate(items):
            if item == "" or item == []:
                raise RequestError(422, f"input {number} is empty", "empty")
            if not (isinstance(item, str) or is_token_ids(item)):
                raise RequestError(422, f"input {number} must be a string or a list of token ids, not "
                                        f"{type(item).__name__}")
        return items, single

    def encode(self, texts: list, truncate: bool, return_offsets: bool = False) -> list[dict]:
        first = [t if isinstance(t, str) else t[0] for t in texts]
        pairs = [t[1] for t in texts] if all(isinstance(t, list) for t in texts) else None
        if pairs is None and any(isinstance(t, list) for t in texts):
            raise RequestError(422, "mix of single texts and pairs in one request")
        try:
            return self.engine.encode(first, pairs, truncate=truncate, return_offsets=return_offsets)
        except BertkitError as e:
            raise RequestError(422, str(e)) from None

    def embedding_rows(self, items: list, truncate: bool, prompt: str) -> list[dict]:
        """Model rows: texts after the prompt, tokenized; token ids taken as they are (as TEI does)."""
        texts = [(number, prompt + item) for number, item in enumerate(items) if isinstance(item, str)]
        rows: list[dict | None] = [None] * len(items)
        if texts:
            for (number, _), row in zip(texts, self.encode([text for _, text in texts], truncate)):
                rows[number] = row
        limit, vocab_size = self.engine.max_length, self.engine.tokenizer.vocab_size
        for number, item in enumerate(items):
            if isinstance(item, str):
                continue
            bad = next((i for i in item if not 0 <= i < vocab_size), None)
            if bad is not None:
                raise RequestError(422, f"input {number}: token id {bad} is outside the vocabulary (size {vocab_size})")
            if len(item) > limit and not truncate:
                raise RequestError(422, f"input {number} has {len(item)} tokens, more than the model's {limit}: "
                                        "shorten it or ask for truncation")
            ids = item[:limit]
            rows[number] = {"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)}
        return rows

    def prompt(self, document: dict) -> str:
        return self.sentence_transformer.prompt(option(document, "prompt_name", str, None))

    def dimensions(self, document: dict) -> int | None:
        size = self.engine.config.hidden_size
        return bounded_int(document, "dimensions", None, 1, size, " (the model's embedding size)")

    def truncate(self, document: dict, default: bool = False) -> bool:
        truncation_direction(document)
        return option(document, "truncate", bool, default)

    async def run(self, rows: list[dict]) -> list[dict]:
        stats = current_stats()
        stats.tokens += sum(len(row["input_ids"]) for row in rows)
        try:
            return await self.batcher.submit(rows, stats)
        except Exception as e:
            raise RequestError(424, f"model failed: {e}", "backend") from None

    def require(self, *tasks: str) -> None:
        if self.engine.task not in tasks:
            raise RequestError(424, f"this route needs a {' or '.join(tasks)} model; the server holds a "
                                    f"{type(self.engine.model).__name__} ({self.engine.task})", "backend")

    async def sentence_vectors(self, document: dict, name: str = "inputs") -> tuple[list[torch.Tensor], bool]:
        """Pooled, not yet normalised sentence vectors of the embedding inputs."""
        self.require(*EMBEDDING_TASKS)
        items, single = self.embedding_inputs(document, name)
        prompt = self.prompt(document)
        outputs = await self.run(self.embedding_rows(items, self.truncate(document), prompt))
        skip = self.prompt_positions(prompt)
        return [self.pool(out["last_hidden_state"], skip if isinstance(item, str) else 0, normalize=False)
                for item, out in zip(items, outputs)], single

    def prompt_positions(self, prompt: str) -> int:
        """Leading positions left out of the pooling: none, unless the model's Pooling has
        include_prompt false (INSTRUCTOR-style models): then [CLS] and the prompt's tokens."""
        if not prompt or self.sentence_transformer.include_prompt:
            return 0
        return 1 + len(self.engine.tokenizer.encode_ids_batch([prompt])[0])

    def pool(self, tokens: torch.Tensor, skip: int = 0, normalize: bool | None = None) -> torch.Tensor:
        if skip and (self.engine.pooling is None or self.engine.pooling.mode != "cls"):
            tokens = tokens[skip:]
            if len(tokens) == 0:  # nothing but the prompt is left: sentence-transformers' zero vector
                return torch.zeros(self.engine.config.hidden_size)
        return self.engine.pool(tokens, normalize)

    # ---- TEI's routes

    async def embed(self, document: dict):
        normalize = option(document, "normalize", bool, True)
        dimensions = self.dimensions(document)
        vectors, _ = await self.sentence_vectors(document)
        return _vectors_response([finish_embedding(v, dimensions, normalize) for v in vectors])

    async def embed_all(self, document: dict):
        """Every token's last-layer vector, [CLS] and [SEP] included (TEI's raw embeddings)."""
        self.require(*EMBEDDING_TASKS)
        items, _ = self.embedding_inputs(document)
        rows = self.embedding_rows(items, self.truncate(document), self.prompt(document))
        return _vectors_response([out["last_hidden_state"] for out in await self.run(rows)])

    async def similarity(self, document: dict):
        """TEI's /similarity: the similarity of a source sentence to each candidate, by the model's
        similarity function (sentence-transformers' `similarity`; cosine unless its config says)."""
        self.require(*EMBEDDING_TASKS)
        inputs = document.get("inputs")
        if not (isinstance(inputs, dict) and isinstance(inputs.get("source_sentence"), str)
                and isinstance(inputs.get("sentences"), list)):
            raise RequestError(422, "'inputs' must be {\"source_sentence\": str, \"sentences\": [str]}")
        sentences = inputs["sentences"]
        if not all(isinstance(s, str) for s in sentences):
            raise RequestError(422, "'sentences' must be a list of strings")
        self.check_batch_size(len(sentences), "sentences")
        texts = [inputs["source_sentence"], *sentences]
        if "" in texts:
            raise RequestError(422, "the source sentence and the sentences must not be empty", "empty")
        current_stats().inputs = len(texts)
        prompt = self.prompt(document)
        outputs = await self.run(self.encode([prompt + t for t in texts], self.truncate(document)))
        skip = self.prompt_positions(prompt)
        vectors = torch.stack([self.pool(out["last_hidden_state"], skip) for out in outputs])
        return similarities(vectors[0], vectors[1:], self.sentence_transformer.similarity_fn_name)

    async def rerank(self, document: dict):
        """TEI's /rerank: a cross-encoder (a sequence classifier with one output) scores each
        (query, text) pair; sigmoid of the logit (sentence-transformers' CrossEncoder), the logit
        itself with raw_scores; best first."""
        self.require("text-classification")
        if self.engine.config.num_labels != 1:
            raise RequestError(424, f"/rerank needs a cross-encoder (a classifier with one label); this model has "
                                    f"{self.engine.config.num_labels} labels: use /predict", "backend")
        query, texts = document.get("query"), document.get("texts")
        if not isinstance(query, str) or not query:
            raise RequestError(422, "'query' must be a non-empty string")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError(422, "'texts' must be a list of strings")
        self.check_batch_size(len(texts), "texts")
        if "" in texts:
            raise RequestError(422, f"text {texts.index('')} is empty", "empty")
        raw = option(document, "raw_scores", bool, False)
        return_text = option(document, "return_text", bool, False)
        outputs = await self.run(self.encode([[query, t] for t in texts], self.truncate(document)))
        logits = torch.stack([out["logits"].reshape(-1)[0] for out in outputs])
        scores = (logits if raw else torch.sigmoid(logits)).tolist()
        ranks = [{"index": i, "score": s, **({"text": texts[i]} if return_text else {})} for i, s in enumerate(scores)]
        return sorted(ranks, key=lambda rank: (-rank["score"], rank["index"]))

    async def predict(self, document: dict):
        self.require("text-classification")
        texts, single = self.texts(document, allow_pairs=True)
        raw = option(document, "raw_scores", bool, False)
        rows = self.encode(texts, self.truncate(document))
        outputs = await self.run(rows)
        function = "none" if raw else score_function(self.engine.config)
        results = [label_scores(out["logits"], self.engine.id2label, function, None) for out in outputs]
        return results[0] if single else results

    async def tokenize(self, document: dict):
        texts, _ = self.texts(document)
        specials = option(document, "add_special_tokens", bool, True)
        prompt = self.prompt(document)
        rows = self.engine.tokenizer.encode_batch([prompt + t for t in texts], return_offsets=True)
        current_stats().tokens = sum(len(row["input_ids"]) for row in rows)
        results = []
        for row in rows:
            tokens = []
            for token_id, (start, stop), sequence in zip(row["input_ids"], row["offsets"], row["sequence_ids"]):
                special = sequence is None
                if special and not specials:
                    continue
                tokens.append({"id": token_id, "text": self.engine.tokenizer.ids_to_tokens[token_id],
                               "special": special, "start": None if special else start,
                               "stop": None if special else stop})
            results.append(tokens)
        return results

    async def decode(self, document: dict):
        """TEI's /decode: token ids (one list or a list of lists) back to text."""
        ids = document.get("ids")
        batch = [ids] if is_token_ids(ids) else ids
        if not isinstance(batch, list) or not all(isinstance(row, list) and (row == [] or is_token_ids(row))
                                                  for row in batch):
            raise RequestError(422, "'ids' must be a list of token ids or a list of such lists")
        self.check_batch_size(len(batch), "ids")
        skip = option(document, "skip_special_tokens", bool, True)
        vocab_size = self.engine.tokenizer.vocab_size
        for number, row in enumerate(batch):
            bad = next((i for i in row if not 0 <= i < vocab_size), None)
            if bad is not None:
                raise RequestError(422, f"ids {number}: token id {bad} is outside the vocabulary (size {vocab_size})")
        current_stats().tokens = sum(map(len, batch))
        return [self.engine.tokenizer.decode(row, skip_special_tokens=skip) for row in batch]

    # ---- OpenAI's embeddings API

    async def openai_embeddings(self, document: dict):
        encoding = option(document, "encoding_format", str, "float")
        if encoding not in ("float", "base64"):
            raise RequestError(422, f"encoding_format must be 'float' or 'base64', not {encoding!r}")
        model = option(document, "model", str, None)
        option(document, "user", str, None)  # OpenAI's abuse-tracking id: accepted, not used
        dimensions = self.dimensions(document)
        vectors, _ = await self.sentence_vectors(document, "input")
        data = []
        for index, vector in enumerate(vectors):
            vector = finish_embedding(vector, dimensions, True)  # OpenAI's embeddings are unit length
            data.append({"object": "embedding", "index": index,
                         "embedding": base64_floats(vector) if encoding == "base64" else vector})
        tokens = current_stats().tokens
        return _vectors_response({"object": "list", "data": data, "model": model or self.model_id,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    # ---- transformers' pipelines for the other heads

    async def token_classification(self, document: dict):
        self.require("token-classification")
        texts, single = self.texts(document)
        strategy = option(document, "aggregation_strategy", str, TOKEN_CLASSIFICATION["aggregation_strategy"])
        if strategy not in AGGREGATION_STRATEGIES:
            raise RequestError(422, f"aggregation_strategy must be one of {', '.join(AGGREGATION_STRATEGIES)}")
        rows = self.encode(texts, self.truncate(document), return_offsets=True)
        outputs = await self.run(rows)
        results = [token_entities(t, out["logits"], row, self.engine.tokenizer, self.engine.id2label, strategy)
                   for t, row, out in zip(texts, rows, outputs)]
        return results[0] if single else results

    async def question_answering(self, document: dict):
        self.require("question-answering")
        if "inputs" not in document and "question" in document:
            document = {**document, "inputs": {"question": document.get("question"), "context": document.get("context")}}
        inputs = document.get("inputs")
        single = isinstance(inputs, dict)
        items = [inputs] if single else inputs
        if not isinstance(items, list):
            raise RequestError(422, "'inputs' must be a {question, context} object or a non-empty list of them")
        self.check_batch_size(len(items))
        for number, item in enumerate(items):
            if not (isinstance(item, dict) and isinstance(item.get("question"), str) and isinstance(item.get("context"), str)):
                raise RequestError(422, f"input {number} must have string fields 'question' and 'context'")
            if not item["question"].strip() or not item["context"].strip():
                raise RequestError(422, f"input {number} has an empty question or context", "empty")
        top_k = bounded_int(document, "top_k", QUESTION_ANSWERING["top_k"], 1)
        max_answer_len = bounded_int(document, "max_answer_len", QA_MAX_ANSWER_LEN, 1)
        handle_impossible = option(document, "handle_impossible_answer", bool,
                                   QUESTION_ANSWERING["handle_impossible_answer"])
        truncate = option(document, "truncate", bool, True)
        try:
            windows = [qa_windows(self.engine, item["question"], item["context"], truncate=truncate) for item in items]
        except BertkitError as e:
            raise RequestError(422, str(e)) from None
        for number, ws in enumerate(windows):
            if all(len(w["input_ids"]) - w["context_start"] - 1 == 0 for w in ws):
                raise RequestError(422, f"input {number}: the context has no tokens (only spaces, control or "
                                        "unknown characters)", "empty")
        outputs = await self.run([w for ws in windows for w in ws])
        results, start = [], 0
        for item, ws in zip(items, windows):
            # A window has fewer spans than max_length squared: larger values change nothing, and are
            # clamped so that no tensor index overflows.
            limit = self.engine.max_length
            answers = qa_answers(ws, outputs[start:start + len(ws)], item["context"], min(top_k, limit * limit),
                                 min(max_answer_len, limit), handle_impossible)
            start += len(ws)
            # No span can come back when every best span sits where another window sees more context.
            results.append((answers[0] if answers else None) if top_k == 1 else answers)
        return results[0] if single else results

    async def fill_mask(self, document: dict):
        self.require("fill-mask")
        texts, single = self.texts(document)
        top_k = bounded_int(document, "top_k", FILL_MASK["top_k"], 1, self.engine.tokenizer.vocab_size,
                            " (the vocabulary size)")
        try:
            rows = [mask_row(self.engine.tokenizer, t, self.engine.max_length) for t in texts]
        except BertkitError as e:
            raise RequestError(422, str(e)) from None
        outputs = await self.run(rows)
        results = []
        for row, out in zip(rows, outputs):
            per_mask = fill_mask_results(self.engine.tokenizer, row, out["logits"], top_k)
            results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return results[0] if single else results

    def info(self) -> dict:
        engine = self.engine
        if engine.task == "text-classification":
            model_type = {"classifier": {"id2label": {str(k): v for k, v in engine.id2label.items()},
                                         "label2id": {v: k for k, v in engine.id2label.items()}}}
            if engine.config.num_labels == 1:
                model_type = {"reranker": model_type["classifier"]}
        elif engine.task in EMBEDDING_TASKS:
            model_type = {"embedding": {"pooling": (engine.pooling.mode if engine.pooling else "mean")}}
        else:
            model_type = {engine.task.replace("-", "_"): {}}
        st = self.sentence_transformer
        return {"model_id": self.model_id, "model_sha": None, "model_dtype": "int8" if engine.quantize == "int8" else engine.precision,
                "model_type": model_type, "architecture": type(engine.model).__name__, "task": engine.task,
                "prompts": st.prompts or None, "default_prompt_name": st.default_prompt_name,
                "max_concurrent_requests": self.max_concurrent_requests, "max_input_length": engine.max_length,
                "max_batch_tokens": self.max_batch_tokens, "max_batch_requests": engine.max_batch_size,
                "max_client_batch_size": self.max_client_batch_size, "max_body_bytes": self.max_body_bytes,
                "tokenization_workers": 1,
                "version": __version__}

    # ---- the application

    ROUTES = (("/embed", "embed"), ("/embed_all", "embed_all"), ("/similarity", "similarity"), ("/rerank", "rerank"),
              ("/predict", "predict"), ("/tokenize", "tokenize"), ("/decode", "decode"),
              ("/v1/embeddings", "openai_embeddings"), ("/token-classification", "token_classification"),
              ("/question-answering", "question_answering"), ("/fill-mask", "fill_mask"))

    def app(self) -> Starlette:
        routes = [Route(path, self._inference(path, getattr(self, name)), methods=["POST"]) for path, name in self.ROUTES]
        routes += [Route("/health", self._health, methods=["GET"]), Route("/info", self._info, methods=["GET"]),
                   Route("/metrics", self._metrics, methods=["GET"]),
                   Route("/openapi.json", self._openapi, methods=["GET"]), Route("/docs", self._docs, methods=["GET"])]
        app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed},
                        lifespan=self._lifespan)
        app.add_middleware(AccessLogMiddleware, access_log=self.access_log)
        return app

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        yield
        self.batcher.stop()  # after uvicorn has finished the accepted requests

    def _inference(self, path: str, handler):
        error_body = _openai_error if path.startswith("/v1/") else _tei_error

        async def endpoint(request: Request):
            started = time.perf_counter()
            with self.metrics.lock:
                admitted = self.metrics.in_flight < self.max_concurrent_requests
                if admitted:
                    self.metrics.in_flight += 1
            try:
                if not admitted:
                    raise RequestError(429, "Model is overloaded", "overloaded")
                try:
                    answer = await handler(await read_json(request, self.max_body_bytes))
                    response = answer if isinstance(answer, Response) else JSONResponse(answer)
                finally:
                    with self.metrics.lock:
                        self.metrics.in_flight -= 1
            except RequestError as e:
                response = JSONResponse(error_body(e.message, e.error_type, e.status), status_code=e.status)
            except Exception:  # a fault of the server, not of the request: logged whole, answered 500
                log.exception("%s %s failed", request.method, path)
                response = JSONResponse(error_body("internal server error (logged on the server)", "backend", 500),
                                        status_code=500)
            self.metrics.request(path, response.status_code, time.perf_counter() - started)
            return response

        return endpoint

    async def _health(self, request: Request):
        return Response(status_code=200 if self.batcher.thread.is_alive() else 503)

    async def _info(self, request: Request):
        return JSONResponse(self.info())

    async def _metrics(self, request: Request):
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    async def _openapi(self, request: Request):
        return JSONResponse(openapi_document(__version__, [path for path, _ in self.ROUTES]))

    async def _docs(self, request: Request):
        return HTMLResponse(docs_page(openapi_document(__version__, [path for path, _ in self.ROUTES])))


def _vectors_response(content) -> Response:
    """An answer holding embedding tensors, written by json_with_vectors."""
    return Response(json_with_vectors(content), media_type="application/json")


def _tei_error(message: str, error_type: str, status: int) -> dict:
    return {"error": message, "error_type": error_type}


def _openai_error(message: str, error_type: str, status: int) -> dict:
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


async def _not_found(request, exc):
    return JSONResponse({"error": f"no route {request.url.path[:200]}", "error_type": "not_found"}, status_code=404)


async def _not_allowed(request, exc):
    return JSONResponse({"error": f"{request.method} is not allowed on {request.url.path[:200]}", "error_type": "validation"},
                        status_code=405)


def _is_pair(item) -> bool:
    return isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
