"""The HTTP server behind `bertkit serve`: routes (routes.py), request limits and parsing
(requests.py), the batching worker (batcher.py), metrics, the access log, the OpenAPI document."""

from .requests import MAX_BODY_BYTES, MAX_JSON_DEPTH, RequestError
from .routes import Server

__all__ = ["Server", "RequestError", "MAX_BODY_BYTES", "MAX_JSON_DEPTH"]
