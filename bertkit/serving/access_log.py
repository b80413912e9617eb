"""One access-log line per request on stderr: method, route, status, inputs, tokens, queue and compute
time. `text` is logfmt (key=value, what log shippers such as Vector, Loki or Fluent Bit parse),
`json` one JSON object per line. Server faults are logged the same way, with their traceback."""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
import time
import traceback
from dataclasses import dataclass

LOG_FORMATS = ("text", "json")
MAX_LOGGED_PATH = 200  # a hostile client's 8 KB path is not copied into the log whole


@dataclass
class RequestStats:
    """Filled in by the handler (inputs, tokens) and the batcher (queue, compute seconds)."""

    inputs: int = 0
    tokens: int = 0
    queue_seconds: float = 0.0
    compute_seconds: float = 0.0


CURRENT_REQUEST: contextvars.ContextVar[RequestStats | None] = contextvars.ContextVar("bertkit_request", default=None)


def current_stats() -> RequestStats:
    stats = CURRENT_REQUEST.get()
    return stats if stats is not None else RequestStats()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _logfmt(fields: dict) -> str:
    def value(v):
        if isinstance(v, str) and (not v or any(c in v for c in ' ="\\') or not v.isprintable()):
            return json.dumps(v)
        return str(v)
    return " ".join(f"{key}={value(v)}" for key, v in fields.items())


class AccessLog:
    def __init__(self, log_format: str = "text", stream=None):
        if log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {LOG_FORMATS}, not {log_format!r}")
        self.log_format, self.stream = log_format, stream

    def format(self, fields: dict) -> str:
        return json.dumps(fields, ensure_ascii=False) if self.log_format == "json" else _logfmt(fields)

    def write(self, fields: dict) -> None:
        stream = self.stream or sys.stderr
        try:
            stream.write(self.format(fields) + "\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed: serving goes on without the log
            pass

    def request(self, method: str, path: str, status: int, stats: RequestStats, seconds: float) -> None:
        self.write({"time": _now(), "method": method, "route": path[:MAX_LOGGED_PATH], "status": status,
                    "inputs": stats.inputs, "tokens": stats.tokens,
                    "queue_ms": round(stats.queue_seconds * 1000, 3),
                    "compute_ms": round(stats.compute_seconds * 1000, 3), "duration_ms": round(seconds * 1000, 3)})

    def handler(self) -> logging.Handler:
        """A logging handler writing the server's own messages (faults with tracebacks) in this format."""
        access_log = self

        class Handler(logging.Handler):
            def emit(self, record):
                fields = {"time": _now(), "level": record.levelname.lower(), "message": record.getMessage()}
                trace = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""
                if access_log.log_format == "json":
                    access_log.write({**fields, "traceback": trace} if trace else fields)
                else:  # the line, then the traceback as Python prints it
                    access_log.write(fields)
                    if trace:
                        (access_log.stream or sys.stderr).write(trace)

        return Handler()


class AccessLogMiddleware:
    """ASGI middleware: times the request, hands the route a RequestStats, writes one line at the end."""

    def __init__(self, app, access_log: AccessLog):
        self.app, self.access_log = app, access_log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        stats, status, started = RequestStats(), [500], time.perf_counter()
        token = CURRENT_REQUEST.set(stats)

        async def send_and_note_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            CURRENT_REQUEST.reset(token)
            self.access_log.request(scope.get("method", ""), scope.get("path", ""), status[0], stats,
                                    time.perf_counter() - started)
