"""Reading a request body safely: size and nesting limits checked on the bytes before any parsing,
TEI's error body for every refusal, typed access to the fields.

The nesting limit is serde_json's default (128, what text-embeddings-inference's parser allows):
Python's json module recurses per level and a 200,000-deep body would raise RecursionError.
"""

from __future__ import annotations

import json
import re

import numpy as np
from starlette.requests import ClientDisconnect, Request

MAX_BODY_BYTES = 2 * 1024 * 1024  # TEI's default payload limit
MAX_JSON_DEPTH = 128
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that closed the connection before the answer

# A JSON string literal (escapes included), matched the way the JSON scanner reads one.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)


class RequestError(Exception):
    """A request the server refuses: HTTP status, TEI error type, message."""

    def __init__(self, status: int, message: str, error_type: str = "validation"):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


class ClientDisconnected(RequestError):
    """The client closed the connection before its body was whole: not a fault of the server, so no
    traceback; the access log's one line says status 499, as nginx logs it, and nothing is answered."""

    def __init__(self):
        super().__init__(CLIENT_CLOSED_REQUEST, "client disconnected before the whole body was sent",
                         "client_disconnected")


def nesting_depth(body: bytes) -> int:
    """Deepest [ / { nesting of a JSON text, brackets inside strings not counted (vectorised: a
    2 MB body takes milliseconds)."""
    structure = np.frombuffer(_STRING.sub(b"", body), np.uint8)
    steps = np.isin(structure, _OPEN).astype(np.int32) - np.isin(structure, _CLOSE).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused with 413 past max_bytes: at once when Content-Length says so, else
    as soon as the streamed body passes the limit (it is never held whole in memory)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"request body of {int(declared)} bytes is over the limit of {max_bytes} bytes",
                           "payload_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise RequestError(413, f"request body is over the limit of {max_bytes} bytes", "payload_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected() from None
    return b"".join(chunks)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_json_object(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict:
    """The body as a JSON object; 400 when it is not JSON, 422 when too deep or not an object."""
    # No body can nest deeper than it has opening brackets: a typical request has a handful, and
    # counting them costs a fraction of the regex-and-numpy scan.
    if body.count(b"[") + body.count(b"{") > max_depth:
        depth = nesting_depth(body)
        if depth > max_depth:
            raise RequestError(422, f"request body nests {depth} levels deep, more than the limit of {max_depth}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"request body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        document = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"request body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:  # NaN / Infinity, or an integer of more than 4300 digits
        raise RequestError(400, f"request body is not valid JSON ({e})") from None
    except RecursionError:  # cannot happen below the depth limit; kept so it can never be a 500
        raise RequestError(422, "request body nests too deeply") from None
    if "\\u" in text and _has_lone_surrogate(document):
        # An escaped half of a surrogate pair ("\ud800") is no character: JSON parsers such as TEI's
        # refuse it, and the tokenizer could not encode it.
        raise RequestError(400, "request body is not valid JSON (a \\u escape is half of a surrogate pair)")
    if not isinstance(document, dict):
        raise RequestError(422, "request body must be a JSON object")
    return document


def _has_lone_surrogate(document) -> bool:
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES) -> dict:
    return parse_json_object(await read_body(request, max_bytes))


def option(document: dict, name: str, kind, default):
    """A typed optional field; null means the default."""
    value = document.get(name, default)
    if value is None:
        return default
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise RequestError(422, f"{name!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


def bounded_int(document: dict, name: str, default: int | None, low: int, high: int | None = None,
                high_reason: str = "") -> int | None:
    """An optional integer field within [low, high]; `high_reason` says where the ceiling comes from."""
    value = option(document, name, int, default)
    if value is not None and value < low:
        raise RequestError(422, f"{name!r} must be at least {low}, not {value}")
    if value is not None and high is not None and value > high:
        raise RequestError(422, f"{name!r} must be at most {high}{high_reason}, not {value}")
    return value


def truncation_direction(document: dict) -> None:
    """TEI's `truncation_direction`: bertkit cuts the end of a text (Right), as the original does."""
    direction = option(document, "truncation_direction", str, "Right")
    if direction.lower() != "right":
        raise RequestError(422, f"truncation_direction {direction!r} is not supported: only 'Right'")


def is_token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
