"""A local stand-in for the Hugging Face Hub: the URLs and headers huggingface_hub's snapshot_download
uses, served from folders on this machine, so tests resolve Hub ids without a network.

Routes (as the Hub answers them):
  GET  /api/models/{repo}/revision/{rev}      repo info: {"id", "sha", "siblings": [{"rfilename"}]}
  GET  /api/models/{repo}/tree/{rev}          the file listing: [{"type": "file", "path", "size", "oid"}]
  HEAD /{repo}/resolve/{rev}/{file}           X-Repo-Commit, ETag, Content-Length
  GET  /{repo}/resolve/{rev}/{file}           the bytes; `Range: bytes=N-` answers 206 from N (resumes)
Errors carry the Hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo), which
huggingface_hub turns into its typed errors. `cut` makes the next GETs of a file stop half-way (the
connection closes mid-body), as a dropped network does.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> {path: content}
    refs: dict[str, str] = field(default_factory=dict)  # branch / tag -> sha
    gated: bool = False


def read_folder(folder: str | Path) -> dict[str, bytes]:
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


class HubServer:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.cut: dict[str, int] = {}  # file path -> how many more GETs to cut half-way
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()

    def add(self, repo_id: str, files: dict[str, bytes] | str | Path, revision: str = "main",
            gated: bool = False) -> str:
        """Publish `files` (or a folder's files) as a new commit of `repo_id` on branch/tag `revision`;
        returns the commit hash."""
        files = files if isinstance(files, dict) else read_folder(files)
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name])
        sha = digest.hexdigest()
        repo = self.repos.setdefault(repo_id, Repo())
        repo.commits[sha] = dict(files)
        repo.refs[revision] = sha
        repo.gated = repo.gated or gated
        return sha

    def downloads(self, name: str) -> list[str | None]:
        """The Range headers of every GET of file `name` (None: from the start)."""
        return [r for m, p, r in self.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + name)]

    # ---------------------------------------------------------------- HTTP

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _error(self, status: int, code: str):
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                data = json.dumps({"error": code}).encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

            def _json(self, value):
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

            def _commit(self, repo_id: str, revision: str):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._error(401, "RepoNotFound")  # the Hub answers 401 for unknown and private repos
                if repo.gated and not self.headers.get("Authorization"):
                    return self._error(403, "GatedRepo")
                sha = repo.refs.get(revision, revision if revision in repo.commits else None)
                if sha is None:
                    return self._error(404, "RevisionNotFound")
                return sha, repo.commits[sha]

            def _answer(self, body: bool):
                path = unquote(urlsplit(self.path).path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if m := re.fullmatch(r"/api/models/(.+)/revision/([^/]+)", path):
                    found = self._commit(m.group(1), m.group(2))
                    if isinstance(found, tuple):
                        sha, files = found
                        self._json({"id": m.group(1), "modelId": m.group(1), "sha": sha, "private": False,
                                    "siblings": [{"rfilename": name} for name in files]})
                elif m := re.fullmatch(r"/api/models/(.+)/tree/([^/]+)(/.*)?", path):
                    found = self._commit(m.group(1), m.group(2))
                    if isinstance(found, tuple):
                        self._json([{"type": "file", "path": name, "size": len(data),
                                     "oid": hashlib.sha1(data).hexdigest()} for name, data in found[1].items()])
                elif m := re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path):
                    found = self._commit(m.group(1), m.group(2))
                    if isinstance(found, tuple):
                        self._file(found[0], found[1], m.group(3), body)
                else:
                    self._error(404, "RepoNotFound")

            def _file(self, sha: str, files: dict[str, bytes], name: str, body: bool):
                if name not in files:
                    return self._error(404, "EntryNotFound")
                data = files[name]
                start = 0
                if body and (rng := self.headers.get("Range")):
                    start = int(re.fullmatch(r"bytes=(\d+)-\d*", rng).group(1))
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", sha)
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                if hub.cut.get(name, 0) > 0:
                    hub.cut[name] -= 1
                    self.wfile.write(data[start:start + max(1, (len(data) - start) // 2)])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)  # the body stops half-way
                    return
                self.wfile.write(data[start:])

        return Handler
