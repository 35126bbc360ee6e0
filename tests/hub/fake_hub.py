"""A local stand-in for the Hugging Face Hub (``HF_ENDPOINT=http://127.0.0.1:PORT``) that
answers exactly the routes ``huggingface_hub`` uses to create a repo, upload a folder in one
commit (regular uploads, no LFS/Xet) and download a snapshot:

=======  ==============================================  ======================================
GET      /api/agent-harnesses                            the user-agent's registry (best effort)
POST     /api/repos/create                               HfApi.create_repo (409 when it exists)
POST     /api/validate-yaml                              create_commit with a README.md
POST     /api/models/{ns}/{name}/preupload/{rev}         create_commit: upload modes ("regular")
POST     /api/models/{ns}/{name}/commit/{rev}            create_commit: the NDJSON commit
GET      /api/models/{ns}/{name}/revision/{rev}          repo_info (snapshot_download: the sha)
GET      /api/models/{ns}/{name}/tree/{rev}[/{path}]     list_repo_tree (snapshot_download)
HEAD|GET /{ns}/{name}/resolve/{rev}/{path}               hf_hub_download: metadata, then bytes
=======  ==============================================  ======================================

Repos live in memory; every request is recorded in ``hub.requests`` as (method, route), and a
request on another route is answered 501 and recorded in ``hub.unknown``. A missing repo,
revision or file is answered 404 with the ``X-Error-Code`` the real Hub sends
(``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_REPO = r"(?P<repo>[^/]+/[^/]+)"
ROUTES = [
    ("GET", "agent-harnesses", re.compile(r"^/api/agent-harnesses$")),
    ("POST", "create", re.compile(r"^/api/repos/create$")),
    ("POST", "validate-yaml", re.compile(r"^/api/validate-yaml$")),
    ("POST", "preupload", re.compile(rf"^/api/models/{_REPO}/preupload/(?P<rev>[^/]+)$")),
    ("POST", "commit", re.compile(rf"^/api/models/{_REPO}/commit/(?P<rev>[^/]+)$")),
    ("GET", "revision", re.compile(rf"^/api/models/{_REPO}/revision/(?P<rev>[^/]+)$")),
    ("GET", "tree", re.compile(rf"^/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")),
    ("HEAD", "resolve", re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")),
    ("GET", "resolve", re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")),
]


def git_blob_sha(data: bytes) -> str:
    """The git object id of a blob (what the Hub reports as a file's oid)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """A model repo: its commits, newest last, each a full file table."""

    commits: list[tuple[str, dict[str, bytes]]] = field(default_factory=list)

    def at(self, rev: str) -> tuple[str, dict[str, bytes]] | None:
        if not self.commits:
            return None
        if rev == "main":
            return self.commits[-1]
        return next((c for c in self.commits if c[0] == rev), None)


class FakeHub:
    """The server (module docstring); ``url`` is its endpoint."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unknown: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub.handle(self, "GET")

            def do_HEAD(self) -> None:
                hub.handle(self, "HEAD")

            def do_POST(self) -> None:
                hub.handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    # ---------------------------------------------------------------------------- dispatch
    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(urlsplit(h.path).path)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        for m, name, pattern in ROUTES:
            match = pattern.match(path) if m == method else None
            if match:
                with self.lock:
                    self.requests.append((method, name))
                    status, headers, payload = getattr(self, "_" + name.replace("-", "_"))(
                        match.groupdict(), body, h
                    )
                break
        else:
            with self.lock:
                self.unknown.append((method, path))
            status, headers, payload = 501, {}, {"error": f"fake hub: no route {method} {path}"}
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        h.send_response(status)
        if not isinstance(payload, bytes):
            h.send_header("Content-Type", "application/json")
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(data)

    @staticmethod
    def _missing(code: str, text: str) -> tuple[int, dict[str, str], Any]:
        return 404, {"X-Error-Code": code, "X-Error-Message": text}, {"error": text}

    # ------------------------------------------------------------------------------ routes
    def _create(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        p = json.loads(body)
        rid = f"{p['organization']}/{p['name']}" if p.get("organization") else p["name"]
        if rid in self.repos:
            return (
                409,
                {},
                {"error": "You already created this model repo", "url": f"{self.url}/{rid}"},
            )
        self.repos[rid] = Repo()
        return 200, {}, {"url": f"{self.url}/{rid}", "name": rid, "id": rid}

    def _agent_harnesses(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        return 200, {}, {"standardEnvVars": [], "harnesses": {}}

    def _validate_yaml(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        return 200, {}, {"errors": [], "warnings": []}

    def _preupload(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        if g["repo"] not in self.repos:
            return self._missing("RepoNotFound", "Repository not found")
        files = json.loads(body)["files"]
        modes = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
            for f in files
        ]
        return 200, {}, {"files": modes}

    def _commit(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        repo = self.repos.get(g["repo"])
        if repo is None:
            return self._missing("RepoNotFound", "Repository not found")
        files = dict(repo.commits[-1][1]) if repo.commits else {}
        header: dict = {}
        for line in body.splitlines():
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "header":
                header = value
            elif item["key"] == "file":
                assert value["encoding"] == "base64", value
                files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "deletedFile":
                files.pop(value["path"], None)
            else:
                return 400, {}, {"error": f"fake hub: commit item {item['key']} not supported"}
        sha = hashlib.sha1(
            json.dumps([header, len(repo.commits), sorted(files)]).encode()
        ).hexdigest()
        repo.commits.append((sha, files))
        return (
            200,
            {},
            {
                "commitUrl": f"{self.url}/{g['repo']}/commit/{sha}",
                "commitOid": sha,
                "success": True,
            },
        )

    def _snapshot(self, g: dict) -> tuple[str, dict[str, bytes]] | tuple[int, dict, Any]:
        repo = self.repos.get(g["repo"])
        if repo is None:
            return self._missing("RepoNotFound", "Repository not found")
        snap = repo.at(g["rev"])
        if snap is None:
            return self._missing("RevisionNotFound", f"Invalid rev id: {g['rev']}")
        return snap

    def _revision(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        snap = self._snapshot(g)
        if len(snap) == 3:
            return snap  # type: ignore[return-value]
        sha, files = snap
        return 200, {}, {
            "id": g["repo"], "modelId": g["repo"], "sha": sha, "private": False,
            "siblings": [{"rfilename": p} for p in sorted(files)], "tags": [],
        }  # fmt: skip

    def _tree(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        snap = self._snapshot(g)
        if len(snap) == 3:
            return snap  # type: ignore[return-value]
        _, files = snap
        prefix = (g.get("path") or "").strip("/")
        entries, dirs = [], set()
        for p, data in sorted(files.items()):
            if prefix and not p.startswith(prefix + "/"):
                continue
            parts = p.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            entries.append(
                {"type": "file", "oid": git_blob_sha(data), "size": len(data), "path": p}
            )
        entries += [
            {"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)
        ]
        return 200, {}, entries

    def _resolve(self, g: dict, body: bytes, h: Any) -> tuple[int, dict, Any]:
        snap = self._snapshot(g)
        if len(snap) == 3:
            return snap  # type: ignore[return-value]
        sha, files = snap
        data = files.get(g["path"])
        if data is None:
            return self._missing("EntryNotFound", f"{g['path']} does not exist")
        headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_sha(data)}"'}
        return 200, headers, data
