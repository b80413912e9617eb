"""The OpenAPI 3 description of the routes (GET /openapi.json) and a self-contained page that shows
it (GET /docs: no script, no CDN, so it works on a machine without internet)."""

from __future__ import annotations

import html
import json

from ..inference.answer_defaults import AGGREGATION_STRATEGIES, FILL_MASK, QUESTION_ANSWERING, TOKEN_CLASSIFICATION

STRING = {"type": "string"}
BOOL_FALSE = {"type": "boolean", "default": False}
IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "description": "token ids, taken as they are"}
TEXT_OR_IDS = {"oneOf": [STRING, IDS]}
EMBED_INPUT = {"oneOf": [STRING, IDS, {"type": "array", "items": TEXT_OR_IDS}],
               "description": "a text, a list of token ids, or a batch of those", "example": "What is Deep Learning?"}
TEXTS_INPUT = {"oneOf": [STRING, {"type": "array", "items": STRING}], "example": "What is Deep Learning?"}
TRUNCATE = {"type": "boolean", "default": False, "description": "cut inputs longer than the model's positions"}
DIRECTION = {"type": "string", "enum": ["Right"], "default": "Right"}
PROMPT_NAME = {"type": "string", "nullable": True,
               "description": "a prompt of the model's config_sentence_transformers.json, put before each text"}
DIMENSIONS = {"type": "integer", "minimum": 1, "nullable": True,
              "description": "Matryoshka: keep the first N values (then renormalise); at most the embedding size"}
VECTOR = {"type": "array", "items": {"type": "number"}}
SCORE = {"type": "object", "properties": {"label": STRING, "score": {"type": "number"}}}
TOKEN = {"type": "object", "properties": {"id": {"type": "integer"}, "text": STRING, "special": {"type": "boolean"},
                                          "start": {"type": "integer", "nullable": True},
                                          "stop": {"type": "integer", "nullable": True}}}


def _body(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required}


# path -> (summary, request schema, answer schema)
ROUTE_SCHEMAS: dict[str, tuple[str, dict, dict]] = {
    "/embed": ("Sentence embeddings (TEI).", _body(
        {"inputs": EMBED_INPUT, "normalize": {"type": "boolean", "default": True}, "truncate": TRUNCATE,
         "truncation_direction": DIRECTION, "prompt_name": PROMPT_NAME, "dimensions": DIMENSIONS}, ["inputs"]),
        {"type": "array", "items": VECTOR}),
    "/embed_all": ("Every token's last-layer vector, special tokens included (TEI).", _body(
        {"inputs": EMBED_INPUT, "truncate": TRUNCATE, "truncation_direction": DIRECTION, "prompt_name": PROMPT_NAME},
        ["inputs"]), {"type": "array", "items": {"type": "array", "items": VECTOR}}),
    "/similarity": ("Similarity of a source sentence to each sentence, by the model's similarity function (TEI).",
                    _body({"inputs": _body({"source_sentence": STRING, "sentences": {"type": "array", "items": STRING}},
                                           ["source_sentence", "sentences"]),
                           "truncate": TRUNCATE, "truncation_direction": DIRECTION, "prompt_name": PROMPT_NAME},
                          ["inputs"]), {"type": "array", "items": {"type": "number"}}),
    "/rerank": ("A cross-encoder's relevance of each text to the query, best first (TEI).", _body(
        {"query": STRING, "texts": {"type": "array", "items": STRING}, "truncate": TRUNCATE,
         "truncation_direction": DIRECTION, "raw_scores": BOOL_FALSE, "return_text": BOOL_FALSE}, ["query", "texts"]),
        {"type": "array", "items": {"type": "object", "properties": {
            "index": {"type": "integer"}, "score": {"type": "number"}, "text": STRING}}}),
    "/predict": ("Sequence classification of texts or [text, text_pair] pairs (TEI).", _body(
        {"inputs": {"oneOf": [STRING, {"type": "array", "items": {"oneOf": [STRING, {
            "type": "array", "items": STRING, "minItems": 2, "maxItems": 2}]}}]},
         "truncate": TRUNCATE, "truncation_direction": DIRECTION, "raw_scores": BOOL_FALSE}, ["inputs"]),
        {"oneOf": [{"type": "array", "items": SCORE}, {"type": "array", "items": {"type": "array", "items": SCORE}}]}),
    "/tokenize": ("WordPiece tokens with character offsets (TEI).", _body(
        {"inputs": TEXTS_INPUT, "add_special_tokens": {"type": "boolean", "default": True},
         "prompt_name": PROMPT_NAME}, ["inputs"]), {"type": "array", "items": {"type": "array", "items": TOKEN}}),
    "/decode": ("Token ids back to text (TEI).", _body(
        {"ids": {"oneOf": [IDS, {"type": "array", "items": IDS}]},
         "skip_special_tokens": {"type": "boolean", "default": True}}, ["ids"]), {"type": "array", "items": STRING}),
    "/v1/embeddings": ("OpenAI-compatible embeddings (unit length).", _body(
        {"input": EMBED_INPUT, "model": STRING, "user": STRING, "dimensions": DIMENSIONS,
         "encoding_format": {"type": "string", "enum": ["float", "base64"], "default": "float",
                             "description": "base64: the little-endian float32 bytes"}}, ["input"]),
        {"type": "object", "properties": {
            "object": {"type": "string", "enum": ["list"]}, "model": STRING,
            "data": {"type": "array", "items": {"type": "object", "properties": {
                "object": {"type": "string", "enum": ["embedding"]}, "index": {"type": "integer"},
                "embedding": {"oneOf": [VECTOR, STRING]}}}},
            "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                       "total_tokens": {"type": "integer"}}}}}),
    "/token-classification": ("Entities, transformers' token-classification pipeline.", _body(
        {"inputs": TEXTS_INPUT, "truncate": TRUNCATE,
         "aggregation_strategy": {"type": "string", "enum": list(AGGREGATION_STRATEGIES),
                                  "default": TOKEN_CLASSIFICATION["aggregation_strategy"]}}, ["inputs"]),
        {"type": "array"}),
    "/question-answering": ("Extractive answers, transformers' question-answering pipeline.", _body(
        {"inputs": {"oneOf": [_body({"question": STRING, "context": STRING}, ["question", "context"]),
                              {"type": "array", "items": _body({"question": STRING, "context": STRING},
                                                               ["question", "context"])}]},
         "top_k": {"type": "integer", "minimum": 1, "default": QUESTION_ANSWERING["top_k"]},
         "max_answer_len": {"type": "integer", "minimum": 1, "default": QUESTION_ANSWERING["max_answer_len"]},
         "handle_impossible_answer": BOOL_FALSE, "truncate": {"type": "boolean", "default": True}}, ["inputs"]),
        {"type": "object", "properties": {"score": {"type": "number"}, "start": {"type": "integer"},
                                          "end": {"type": "integer"}, "answer": STRING}}),
    "/fill-mask": ("Best tokens for each [MASK], transformers' fill-mask pipeline.", _body(
        {"inputs": TEXTS_INPUT, "top_k": {"type": "integer", "minimum": 1, "default": FILL_MASK["top_k"]}}, ["inputs"]),
        {"type": "array"}),
}

ERROR = {"type": "object", "properties": {"error": STRING, "error_type": STRING}, "required": ["error", "error_type"]}
ERROR_ANSWERS = {"400": "unreadable body (not UTF-8 or not JSON)",
                 "413": "body over --max-body-bytes, or more inputs than --max-client-batch-size",
                 "422": "invalid request (missing or mistyped field, too deep, too long, out of range)",
                 "424": "the model cannot answer this route, or it failed", "429": "past --max-concurrent-requests"}
GET_ROUTES = {"/health": "200 while the model worker runs, else 503", "/info": "the model and the server's limits",
              "/metrics": "Prometheus metrics", "/openapi.json": "this document", "/docs": "this document as a page"}


def openapi_document(version: str, paths: list[str]) -> dict:
    document = {"openapi": "3.0.3", "info": {
        "title": "bertkit serve", "version": version,
        "description": "text-embeddings-inference's routes and OpenAI's /v1/embeddings over a BERT model folder."},
        "paths": {}}
    for path in paths:
        summary, request, answer = ROUTE_SCHEMAS[path]
        error = ({"type": "object", "properties": {"error": {"type": "object", "properties": {
            "message": STRING, "type": STRING, "code": {"type": "integer"}}}}} if path.startswith("/v1/") else ERROR)
        responses = {"200": {"description": "OK", "content": {"application/json": {"schema": answer}}}}
        responses.update({status: {"description": text, "content": {"application/json": {"schema": error}}}
                          for status, text in ERROR_ANSWERS.items()})
        document["paths"][path] = {"post": {"summary": summary, "requestBody": {
            "required": True, "content": {"application/json": {"schema": request}}}, "responses": responses}}
    for path, text in GET_ROUTES.items():
        document["paths"][path] = {"get": {"summary": text, "responses": {"200": {"description": text}}}}
    return document


def docs_page(document: dict) -> str:
    """One HTML page: every route with its summary, request schema and answers."""
    esc = html.escape
    sections = []
    for path, methods in document["paths"].items():
        for method, spec in methods.items():
            parts = [f'<h2 id="{esc(path)}"><code>{method.upper()} {esc(path)}</code></h2>', f"<p>{esc(spec['summary'])}</p>"]
            request = spec.get("requestBody")
            if request:
                schema = request["content"]["application/json"]["schema"]
                parts.append("<h3>Request body</h3><pre>" + esc(json.dumps(schema, indent=2)) + "</pre>")
            rows = "".join(f"<tr><td>{esc(code)}</td><td>{esc(answer['description'])}</td></tr>"
                           for code, answer in spec["responses"].items())
            parts.append(f"<h3>Answers</h3><table>{rows}</table>")
            if request:
                answer = spec["responses"]["200"]["content"]["application/json"]["schema"]
                parts.append("<details><summary>200 answer schema</summary><pre>" + esc(json.dumps(answer, indent=2))
                             + "</pre></details>")
            sections.append("<section>" + "".join(parts) + "</section>")
    index = "".join(f'<li><a href="#{esc(p)}"><code>{esc(p)}</code></a></li>' for p in document["paths"])
    info = document["info"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(info['title'])} {esc(info['version'])}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:auto;padding:1rem}}pre{{background:#f4f4f4;padding:.5rem;
overflow:auto}}td{{padding:0 1rem 0 0}}section{{border-top:1px solid #ccc}}</style></head><body>
<h1>{esc(info['title'])} {esc(info['version'])}</h1><p>{esc(info['description'])}</p>
<p>Machine-readable: <a href="/openapi.json">/openapi.json</a> (OpenAPI {esc(document['openapi'])}).</p>
<ul>{index}</ul>{''.join(sections)}</body></html>
"""
