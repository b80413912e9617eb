"""`bertkit serve --model DIR`: an HTTP JSON API (Starlette on uvicorn) with dynamic batching.

Routes and bodies follow Hugging Face's text-embeddings-inference (TEI) where it has them, so its
clients work unchanged:
  POST /embed       {"inputs", "normalize": true, "truncate": false, "prompt_name", "dimensions"} -> [[float]]
  POST /embed_all   {"inputs", "truncate", "prompt_name"} -> [[[float]]] (every token's vector)
  POST /similarity  {"inputs": {"source_sentence", "sentences"}, "prompt_name"} -> [float]
  POST /rerank      {"query", "texts", "raw_scores", "return_text", "truncate"} -> [{"index", "score"}]
  POST /predict     {"inputs": str | [str] | [[str, str]], "raw_scores": false, "truncate": false}
  POST /tokenize    {"inputs", "add_special_tokens": true, "prompt_name"} -> [[{"id", "text", "special", "start", "stop"}]]
  POST /decode      {"ids": [int] | [[int]], "skip_special_tokens": true} -> [str]
  GET /health, /info, /metrics (Prometheus), /openapi.json, /docs
OpenAI's POST /v1/embeddings ({"input", "model", "encoding_format": float | base64, "dimensions"}),
and, in transformers' pipeline shapes, POST /token-classification, /question-answering, /fill-mask.
Embedding inputs are texts or lists of token ids. Errors are {"error", "error_type"} (OpenAI's
{"error": {"message", "type", "code"}} on /v1/): 400 unreadable body, 413 too many inputs or a
body over --max-body-bytes, 422 invalid request (a body nested deeper than 128 levels included:
both limits are checked before parsing), 424 model failure, 429 past --max-concurrent-requests
(answered at once); a 500 only for a fault of the server, logged with its traceback. One
access-log line per request goes to stderr (logfmt, or JSON lines with --log-format json).

SIGTERM: uvicorn stops accepting, the accepted requests finish, the process exits 0.
"""

from __future__ import annotations

import errno
import gc
import logging
import signal
import socket
import time

import torch

from ..device import DEFAULT_PRECISION, add_precision_argument, precision_label
from ..errors import BertkitError
from ..inference.engine import InferenceEngine
from ..kernels.int8 import QUANTIZE_CHOICES
from . import MAX_BODY_BYTES, RequestError, Server  # noqa: F401  (bertkit.serving.command.Server)
from .access_log import LOG_FORMATS

log = logging.getLogger("bertkit")


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening; a bad --host or --port, or a port in use, is one
    BertkitError (exit 2) before the model loads, not uvicorn's own message and exit status."""
    if not 0 <= port <= 65535:
        raise BertkitError(f"--port must be between 0 and 65535, not {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError, ValueError) as e:
        reason = e.strerror if isinstance(e, socket.gaierror) else str(e)
        raise BertkitError(f"--host {host!r} is not an address or a name of this machine ({reason})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts reuse the port
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        reason = "the port is in use (another server?)" if e.errno == errno.EADDRINUSE else e.strerror
        raise BertkitError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8080, max_concurrent_requests: int = 512,
          max_client_batch_size: int = 32, max_batch_tokens: int = 16384, model_id: str | None = None,
          max_body_bytes: int = MAX_BODY_BYTES, log_format: str = "text", compute: dict | None = None) -> int:
    """Load the model and serve until SIGTERM / Ctrl-C; returns 0 after a graceful shutdown.
    `compute`: how the engine computes, InferenceEngine's device, precision, quantize and compile
    (default: "auto", fp32, none, False)."""
    compute = {"device": "auto", "precision": DEFAULT_PRECISION, "quantize": "none", "compile": False, **(compute or {})}
    import uvicorn  # the server only: importing bertkit.serving.command for its Server class (tests, apps) needs none

    if log_format not in LOG_FORMATS:
        raise BertkitError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    sock = listening_socket(host, port)
    # One OpenMP thread team in the process, the batcher's: a team made by a second calling thread
    # has libgomp manage more threads than there are CPUs, and it then stops spinning between
    # parallel regions (a lone MiniLM forward pass took 7 ms in the server, 4 ms once its only team
    # was the batcher's, on 2 cores). This thread (loading, then the event loop's parsing, pooling
    # and answers) keeps to one torch thread, and never makes a team.
    compute_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        try:
            engine = InferenceEngine(model_dir, max_batch_tokens=max_batch_tokens, **compute)
            warm_up_started = time.perf_counter()
            # The kernels of the common shapes made now, not during the first requests.
            server = Server(engine, max_concurrent_requests, max_client_batch_size, max_batch_tokens, model_id,
                            max_body_bytes, log_format, warm_up=True, compute_threads=compute_threads)
            warm_up_s = time.perf_counter() - warm_up_started
            # What is loaded by now (torch, the model, the server: ~170k objects for MiniLM) lives as
            # long as the process: kept out of the collector's sight, so that a full collection
            # during a request scans the requests' objects only (a full one took 80 ms on 2 cores).
            gc.collect()
            gc.freeze()
        except BaseException:
            sock.close()
            raise
        if log_format == "json":  # the server's and uvicorn's own messages (faults with tracebacks) as JSON lines too
            handler = server.access_log.handler()
            for name in ("bertkit", "uvicorn", "uvicorn.error"):
                logging.getLogger(name).handlers[:] = [handler]
                logging.getLogger(name).propagate = False
        config = uvicorn.Config(server.app(), log_level="warning", lifespan="on", access_log=False,
                                log_config=None if log_format == "json" else uvicorn.config.LOGGING_CONFIG)
        # uvicorn re-raises the signal it caught once it has shut down; with this handler in place the
        # re-raised SIGTERM is a no-op and the process exits 0 after finishing the accepted requests.
        signal.signal(signal.SIGTERM, lambda *_: None)
        bound_port = sock.getsockname()[1]
        running_on = precision_label(engine.device, engine.precision, engine.quantize) + (", compiled" if engine.compile else "")
        print(f"bertkit serve: {engine.task} model {model_dir} ({running_on}) on http://{host}:{bound_port} "
              f"(warmed up in {warm_up_s:.1f} s)", flush=True)
        uvicorn.Server(config).run(sockets=[sock])
    finally:  # a Python caller's thread gets its threads back
        torch.set_num_threads(compute_threads)
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
    add_precision_argument(parser)
    parser.add_argument("--quantize", default="none", choices=QUANTIZE_CHOICES,
                        help="int8: the encoder's Linear layers in dynamic int8 (CPU)")
    parser.add_argument("--compile", action="store_true",
                        help="a lone request (at bf16 and int8 up to four) through a graph compiled ahead for this model and "
                             "CPU (fp32, bf16, or int8 with --quantize int8 on a CPU with VNNI, AMX or AVX2; compiled once before listening, tens of seconds, then "
                             "cached: docs/speed.md)")
    parser.add_argument("--model-id", default=None, help="name reported by GET /info (default: the folder)")
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                        help="access log on stderr, one line per request: text (logfmt key=value) or json (JSON lines)")


def run_from_args(args) -> int:
    if min(args.max_concurrent_requests, args.max_client_batch_size, args.max_batch_tokens, args.max_body_bytes) < 1:
        raise BertkitError("--max-concurrent-requests, --max-client-batch-size, --max-batch-tokens and "
                           "--max-body-bytes must be positive")
    return serve(args.model, args.host, args.port, args.max_concurrent_requests, args.max_client_batch_size,
                 args.max_batch_tokens, args.model_id, args.max_body_bytes, args.log_format,
                 {"device": args.device, "precision": args.precision, "quantize": args.quantize, "compile": args.compile})
