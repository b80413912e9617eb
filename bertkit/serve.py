"""`bertkit serve --model DIR`: an HTTP JSON API (Starlette on uvicorn) with dynamic batching.

Routes and bodies follow Hugging Face's text-embeddings-inference (TEI) where it has them, so its
clients work unchanged:
  POST /embed     {"inputs": str | [str], "normalize": true, "truncate": false} -> [[float]]
  POST /predict   {"inputs": str | [str] | [[str, str]], "raw_scores": false, "truncate": false}
                  -> [{"label", "score"}] for one input, a list of those for a list
  POST /tokenize  {"inputs": str | [str], "add_special_tokens": true}
                  -> [[{"id", "text", "special", "start", "stop"}]]
  GET /health, GET /info, GET /metrics (Prometheus text)
and, in transformers' pipeline shapes:
  POST /token-classification {"inputs": str | [str], "aggregation_strategy": "simple" | "none"}
  POST /question-answering   {"inputs": {"question", "context"} | [...], "top_k": 1}
  POST /fill-mask            {"inputs": str | [str], "top_k": 5}
Errors are {"error": str, "error_type": str}: 400 unreadable body, 413 too many inputs or a body
over --max-body-bytes, 422 invalid request, 424 model failure, 429 past --max-concurrent-requests
(answered at once).

Requests are tokenized as they arrive and queued; one worker thread takes everything queued (up
to the token budget) and runs it through the engine's length-grouped, unpadded batches, so
concurrent requests share forward passes. SIGTERM: uvicorn stops accepting, the accepted requests
finish, the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import signal
import threading
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from . import __version__
from .errors import BertkitError
from .inference import InferenceEngine, release_free_memory
from .kernels.int8 import QUANTIZE_CHOICES
from .pipelines import (fill_mask_results, label_scores, mask_row, qa_answers, qa_windows, score_function,
                        token_entities)

log = logging.getLogger("bertkit")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_BODY_BYTES = 2 * 1024 * 1024  # TEI's default payload limit
TRIM_EVERY = 32  # forward rounds between returning freed memory to the system under constant load
IDLE_SECONDS = 0.05  # no request for this long after a batch: the server is idle, trim then


class RequestError(Exception):
    """A request the server refuses: HTTP status, TEI error type, message."""

    def __init__(self, status: int, message: str, error_type: str = "validation"):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


# ---------------------------------------------------------------- metrics


class Histogram:
    def __init__(self, buckets):
        self.buckets, self.counts, self.total, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.total}" if labels else f"{name}_sum {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.count}" if labels else f"{name}_count {self.count}")
        return out


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self.batch_tokens = 0
        self.queue_depth = 0  # inputs waiting for the worker
        self.in_flight = 0

    def request(self, route: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
            self.latency.observe(seconds)

    def batch(self, rows: int, tokens: int) -> None:
        with self.lock:
            self.batch_rows.observe(rows)
            self.batch_tokens += tokens

    def text(self) -> str:
        with self.lock:
            lines = ["# HELP bertkit_requests_total HTTP requests by route and status.",
                     "# TYPE bertkit_requests_total counter"]
            lines += [f'bertkit_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())]
            lines += ["# HELP bertkit_request_duration_seconds Request latency.",
                      "# TYPE bertkit_request_duration_seconds histogram"]
            lines += self.latency.lines("bertkit_request_duration_seconds")
            lines += ["# HELP bertkit_batch_size Rows per forward pass.", "# TYPE bertkit_batch_size histogram"]
            lines += self.batch_rows.lines("bertkit_batch_size")
            lines += ["# HELP bertkit_batch_tokens_total Padded tokens run.", "# TYPE bertkit_batch_tokens_total counter",
                      f"bertkit_batch_tokens_total {self.batch_tokens}",
                      "# HELP bertkit_queue_size Inputs waiting for the model.", "# TYPE bertkit_queue_size gauge",
                      f"bertkit_queue_size {self.queue_depth}",
                      "# HELP bertkit_requests_in_flight Requests being served.", "# TYPE bertkit_requests_in_flight gauge",
                      f"bertkit_requests_in_flight {self.in_flight}"]
            return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the batching worker


@dataclass
class Job:
    rows: list[dict]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    tokens: int = field(init=False)

    def __post_init__(self):
        self.tokens = sum(len(r["input_ids"]) for r in self.rows)


class Batcher:
    """One thread runs the model: it gathers queued jobs up to the token budget and runs them together."""

    def __init__(self, engine: InferenceEngine, metrics: Metrics, max_batch_tokens: int):
        self.engine, self.metrics, self.max_batch_tokens = engine, metrics, max_batch_tokens
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="bertkit-batcher", daemon=True)
        self.thread.start()

    def submit(self, rows: list[dict]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        job = Job(rows, loop.create_future(), loop)
        with self.metrics.lock:
            self.metrics.queue_depth += len(rows)
        self.jobs.put(job)
        return job.future

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=30)

    def _work(self) -> None:
        rounds = 0
        job = self.jobs.get()
        while True:
            if job is None:
                return
            jobs, tokens = [job], job.tokens
            while tokens < self.max_batch_tokens:
                try:
                    more = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.jobs.put(None)  # finish this round, then stop
                    break
                jobs.append(more)
                tokens += more.tokens
            self._run(jobs)
            rounds += 1
            if rounds % TRIM_EVERY == 0:  # busy for a while
                release_free_memory()
            try:
                # Under load the next request comes within milliseconds of the last answer; trimming
                # then would hand back pages the next batch faults in again.
                job = self.jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:  # idle: give the freed memory back, then wait
                release_free_memory()
                job = self.jobs.get()

    def _run(self, jobs: list[Job]) -> None:
        rows = [row for job in jobs for row in job.rows]
        with self.metrics.lock:
            self.metrics.queue_depth -= len(rows)
        try:
            outputs = self.engine.forward(rows, on_batch=self.metrics.batch)
        except Exception as e:  # the model failed: every waiting request gets a 424, the server lives on
            log.exception("forward pass failed")
            for job in jobs:
                job.loop.call_soon_threadsafe(_settle, job.future, None, e)
            return
        start = 0
        for job in jobs:
            job.loop.call_soon_threadsafe(_settle, job.future, outputs[start:start + len(job.rows)], None)
            start += len(job.rows)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# ---------------------------------------------------------------- request parsing


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused with 413 past max_bytes: at once when Content-Length says so, else
    as soon as the streamed body passes the limit (it is never held whole in memory)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"request body of {int(declared)} bytes is over the limit of {max_bytes} bytes",
                           "payload_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(413, f"request body is over the limit of {max_bytes} bytes", "payload_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES) -> dict:
    body = await read_body(request, max_bytes)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"request body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"request body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(document, dict):
        raise RequestError(422, "request body must be a JSON object")
    return document


def option(document: dict, name: str, kind, default):
    value = document.get(name, default)
    if value is None:
        return default
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise RequestError(422, f"{name!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


class Server:
    """The routes, around one engine and one batcher."""

    def __init__(self, engine: InferenceEngine, max_concurrent_requests: int = 512, max_client_batch_size: int = 32,
                 max_batch_tokens: int = 16384, model_id: str | None = None, max_body_bytes: int = MAX_BODY_BYTES):
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.metrics = Metrics()
        self.batcher = Batcher(engine, self.metrics, max_batch_tokens)
        self.max_concurrent_requests = max_concurrent_requests
        self.max_client_batch_size = max_client_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.model_id = model_id or str(engine.model_dir)

    # ---- plumbing shared by the inference routes

    def texts(self, document: dict, allow_pairs: bool = False) -> tuple[list, bool]:
        """The "inputs" field as a list, and whether it was a single input."""
        if "inputs" not in document:
            raise RequestError(422, "missing field 'inputs'")
        inputs = document["inputs"]
        single = isinstance(inputs, str)
        items = [inputs] if single else inputs
        if not isinstance(items, list):
            raise RequestError(422, f"'inputs' must be a string or a list, not {type(inputs).__name__}")
        if not items:
            raise RequestError(422, "'inputs' must not be empty")
        if len(items) > self.max_client_batch_size:
            raise RequestError(413, f"batch size {len(items)} > maximum allowed batch size {self.max_client_batch_size}")
        for number, item in enumerate(items):
            if isinstance(item, str) or (allow_pairs and _is_pair(item)):
                if (item if isinstance(item, str) else "".join(item)) == "":
                    raise RequestError(422, f"input {number} is empty")
                continue
            expected = "a string or a [text, text_pair] list" if allow_pairs else "a string"
            raise RequestError(422, f"input {number} must be {expected}, not {type(item).__name__}")
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

    async def run(self, rows: list[dict]) -> list[dict]:
        try:
            return await self.batcher.submit(rows)
        except Exception as e:
            raise RequestError(424, f"model failed: {e}", "backend") from None

    def require(self, *tasks: str) -> None:
        if self.engine.task not in tasks:
            raise RequestError(424, f"this route needs a {' or '.join(tasks)} model; the server holds a "
                                    f"{type(self.engine.model).__name__} ({self.engine.task})", "backend")

    # ---- routes

    async def embed(self, document: dict):
        self.require("feature-extraction", "sentence-embeddings")
        texts, _ = self.texts(document)
        normalize = option(document, "normalize", bool, True)
        rows = self.encode(texts, option(document, "truncate", bool, False))
        outputs = await self.run(rows)
        return [self.engine.pool(out["last_hidden_state"], normalize).tolist() for out in outputs]

    async def predict(self, document: dict):
        self.require("text-classification")
        texts, single = self.texts(document, allow_pairs=True)
        raw = option(document, "raw_scores", bool, False)
        rows = self.encode(texts, option(document, "truncate", bool, False))
        outputs = await self.run(rows)
        function = "none" if raw else score_function(self.engine.config)
        results = [label_scores(out["logits"], self.engine.id2label, function, None) for out in outputs]
        return results[0] if single else results

    async def tokenize(self, document: dict):
        texts, single = self.texts(document)
        specials = option(document, "add_special_tokens", bool, True)
        rows = self.engine.tokenizer.encode_batch(texts, return_offsets=True)
        results = []
        for text, row in zip(texts, rows):
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

    async def token_classification(self, document: dict):
        self.require("token-classification")
        texts, single = self.texts(document)
        strategy = option(document, "aggregation_strategy", str, "simple")
        if strategy not in ("none", "simple"):
            raise RequestError(422, "aggregation_strategy must be 'none' or 'simple'")
        rows = self.encode(texts, option(document, "truncate", bool, False), return_offsets=True)
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
        if not isinstance(items, list) or not items:
            raise RequestError(422, "'inputs' must be a {question, context} object or a non-empty list of them")
        if len(items) > self.max_client_batch_size:
            raise RequestError(413, f"batch size {len(items)} > maximum allowed batch size {self.max_client_batch_size}")
        for number, item in enumerate(items):
            if not (isinstance(item, dict) and isinstance(item.get("question"), str) and isinstance(item.get("context"), str)):
                raise RequestError(422, f"input {number} must have string fields 'question' and 'context'")
            if not item["question"].strip() or not item["context"].strip():
                raise RequestError(422, f"input {number} has an empty question or context")
        top_k = option(document, "top_k", int, 1)
        if top_k < 1:
            raise RequestError(422, "top_k must be at least 1")
        max_answer_len = option(document, "max_answer_len", int, 15)
        truncate = option(document, "truncate", bool, True)
        try:
            windows = [qa_windows(self.engine, item["question"], item["context"], truncate=truncate) for item in items]
        except BertkitError as e:
            raise RequestError(422, str(e)) from None
        outputs = await self.run([w for ws in windows for w in ws])
        results, start = [], 0
        for item, ws in zip(items, windows):
            answers = qa_answers(ws, outputs[start:start + len(ws)], item["context"], top_k, max_answer_len,
                                 option(document, "handle_impossible_answer", bool, False))
            start += len(ws)
            results.append(answers[0] if top_k == 1 else answers)
        return results[0] if single else results

    async def fill_mask(self, document: dict):
        self.require("fill-mask")
        texts, single = self.texts(document)
        top_k = option(document, "top_k", int, 5)
        if not 1 <= top_k <= self.engine.tokenizer.vocab_size:
            raise RequestError(422, "top_k must be between 1 and the vocabulary size")
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
        elif engine.task in ("feature-extraction", "sentence-embeddings"):
            model_type = {"embedding": {"pooling": (engine.pooling.mode if engine.pooling else "mean")}}
        else:
            model_type = {engine.task.replace("-", "_"): {}}
        return {"model_id": self.model_id, "model_sha": None, "model_dtype": "int8" if engine.quantize == "int8" else engine.precision,
                "model_type": model_type, "architecture": type(engine.model).__name__, "task": engine.task,
                "max_concurrent_requests": self.max_concurrent_requests, "max_input_length": engine.max_length,
                "max_batch_tokens": self.max_batch_tokens, "max_batch_requests": engine.max_batch_size,
                "max_client_batch_size": self.max_client_batch_size, "max_body_bytes": self.max_body_bytes,
                "tokenization_workers": 1,
                "version": __version__}

    # ---- the application

    def app(self) -> Starlette:
        routes = [Route(path, self._inference(path, handler), methods=["POST"]) for path, handler in (
            ("/embed", self.embed), ("/predict", self.predict), ("/tokenize", self.tokenize),
            ("/token-classification", self.token_classification),
            ("/question-answering", self.question_answering), ("/fill-mask", self.fill_mask))]
        routes += [Route("/health", self._health, methods=["GET"]), Route("/info", self._info, methods=["GET"]),
                   Route("/metrics", self._metrics, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed},
                         lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        yield
        self.batcher.stop()  # after uvicorn has finished the accepted requests

    def _inference(self, path: str, handler):
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
                    response = JSONResponse(await handler(await read_json(request, self.max_body_bytes)))
                finally:
                    with self.metrics.lock:
                        self.metrics.in_flight -= 1
            except RequestError as e:
                response = JSONResponse({"error": e.message, "error_type": e.error_type}, status_code=e.status)
            self.metrics.request(path, response.status_code, time.perf_counter() - started)
            return response

        return endpoint

    async def _health(self, request: Request):
        return Response(status_code=200 if self.batcher.thread.is_alive() else 503)

    async def _info(self, request: Request):
        return JSONResponse(self.info())

    async def _metrics(self, request: Request):
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")


async def _not_found(request, exc):
    return JSONResponse({"error": f"no route {request.url.path}", "error_type": "not_found"}, status_code=404)


async def _not_allowed(request, exc):
    return JSONResponse({"error": f"{request.method} is not allowed on {request.url.path}", "error_type": "validation"},
                        status_code=405)


def _is_pair(item) -> bool:
    return isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8080, max_concurrent_requests: int = 512,
          max_client_batch_size: int = 32, max_batch_tokens: int = 16384, device: str = "auto",
          precision: str = "auto", model_id: str | None = None, quantize: str = "none",
          max_body_bytes: int = MAX_BODY_BYTES) -> int:
    """Load the model and serve until SIGTERM / Ctrl-C; returns 0 after a graceful shutdown."""
    import uvicorn  # the server only: importing bertkit.serve for its Server class (tests, apps) needs none

    engine = InferenceEngine(model_dir, device, precision, max_batch_tokens, quantize=quantize)
    server = Server(engine, max_concurrent_requests, max_client_batch_size, max_batch_tokens, model_id, max_body_bytes)
    config = uvicorn.Config(server.app(), host=host, port=port, log_level="warning", lifespan="on")
    # uvicorn re-raises the signal it caught once it has shut down; with this handler in place the
    # re-raised SIGTERM is a no-op and the process exits 0 after finishing the accepted requests.
    signal.signal(signal.SIGTERM, lambda *_: None)
    print(f"bertkit serve: {engine.task} model {model_dir} on http://{host}:{port}", flush=True)
    uvicorn.Server(config).run()
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="model folder (Hugging Face layout)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--max-concurrent-requests", type=int, default=512,
                        help="requests served at once; more are answered 429 at once (default 512)")
    parser.add_argument("--max-client-batch-size", type=int, default=32, help="inputs per request (default 32)")
    parser.add_argument("--max-batch-tokens", type=int, default=16384,
                        help="padded tokens per forward pass (default 16384)")
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                        help=f"largest request body; larger ones are answered 413 (default {MAX_BODY_BYTES})")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--quantize", default="none", choices=QUANTIZE_CHOICES,
                        help="int8: the encoder's Linear layers in dynamic int8 (CPU)")
    parser.add_argument("--model-id", default=None, help="name reported by GET /info (default: the folder)")


def run_from_args(args) -> int:
    if min(args.max_concurrent_requests, args.max_client_batch_size, args.max_batch_tokens, args.max_body_bytes) < 1:
        raise BertkitError("--max-concurrent-requests, --max-client-batch-size, --max-batch-tokens and "
                           "--max-body-bytes must be positive")
    return serve(args.model, args.host, args.port, args.max_concurrent_requests, args.max_client_batch_size,
                 args.max_batch_tokens, args.device, args.precision, args.model_id, args.quantize,
                 args.max_body_bytes)
