"""Helpers for the server tests: a real `bertkit serve` (a subprocess, or uvicorn in a thread of this
process) on a free port, and one HTTP call that returns (status, parsed body)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, path, body=None, raw: bytes | None = None, timeout=300, method: str | None = None):
    """(status, parsed JSON or text) of one HTTP call."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"},
                                 method=method or ("POST" if data is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    text = payload.decode()
    try:
        return status, json.loads(text) if text else None
    except json.JSONDecodeError:
        return status, text


class ServerProcess:
    """`python -m bertkit serve` in a subprocess; its stderr (the access log) goes to a file, so a
    long test never blocks the server on a full pipe."""

    def __init__(self, model_dir, *extra):
        self.port = free_port()
        self.log = tempfile.TemporaryFile(prefix="bertkit-serve-", suffix=".log")  # gone once closed
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(model_dir),
                                         "--port", str(self.port), "--precision", "fp32", *extra],
                                        env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 300  # a loaded machine can take a minute just to import torch
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.stderr())
            with contextlib.suppress(urllib.error.URLError, ConnectionError, OSError):
                if request(self.port, "/health", timeout=2)[0] == 200:
                    return
            time.sleep(0.2)
        self.process.kill()
        raise RuntimeError("server did not start")

    def stderr(self) -> str:
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

    def stop(self) -> int:
        self.process.terminate()
        status = self.process.wait(300)
        self.log.close()
        return status


@contextlib.contextmanager
def server_in_thread(server):
    """A bertkit.serving.command.Server's app under uvicorn in a thread of this process; yields the port."""
    port = free_port()
    runner = uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        if not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield port
    finally:
        runner.should_exit = True
        thread.join(30)
