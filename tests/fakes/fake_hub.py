"""A Hugging Face hub on 127.0.0.1 for the fetch tests: the few routes huggingface_hub's own client
(the real one, ``HfApi(endpoint=...)`` and ``hf_hub_download``) calls to resolve a revision, list a
dataset's files and download one, as huggingface_hub 2.x calls them (``hf_api.py``:
``dataset_info``, ``list_repo_tree``; ``file_download.py``: ``get_hf_file_metadata``, a HEAD, then
the GET).

* ``GET /api/datasets/{repo}`` and ``.../revision/{rev}``: ``{"id", "sha"}`` of the revision's
  commit;
* ``GET /api/datasets/{repo}/tree/{rev}``: the commit's files, ``[{"type": "file", "path", "size",
  "oid"}]``;
* ``HEAD`` / ``GET /datasets/{repo}/resolve/{rev}/{path}``: the file, with ``X-Repo-Commit`` and
  ``ETag``.

A revision is a branch or tag name (``refs``) or a commit sha; an unknown one is a 404 with
``X-Error-Code: RevisionNotFound``, as the hub answers. ``requests`` records each path asked for.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import orjson


@dataclass
class Repo:
    """A dataset repository: ``commits`` maps a commit sha to its files (path -> bytes); ``refs``
    maps a branch or tag to a commit sha (``main`` is the default branch)."""

    commits: dict[str, dict[str, bytes]]
    refs: dict[str, str]

    def commit(self, revision: str) -> str | None:
        return self.refs.get(revision) or (revision if revision in self.commits else None)


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    url: str = ""
    requests: list[str] = field(default_factory=list)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(
            self,
            status: int,
            body: bytes,
            headers: dict[str, str] | None = None,
            head: bool = False,
        ) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _not_found(self, code: str, head: bool = False) -> None:
            self._send(
                404,
                orjson.dumps({"error": code}),
                {"X-Error-Code": code, "Content-Type": "application/json"},
                head,
            )

        def _route(self, head: bool) -> None:
            path = urlparse(self.path).path
            hub.requests.append(f"{self.command} {path}")
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if parts[:2] == ["api", "datasets"]:
                repo = hub.repos.get("/".join(parts[2:4]))
                if repo is None:
                    return self._not_found("RepoNotFound", head)
                rest = parts[4:]
                revision = "main" if not rest else rest[1] if len(rest) > 1 else None
                commit = repo.commit(revision) if revision else None
                if commit is None:
                    return self._not_found("RevisionNotFound", head)
                if not rest or rest[0] == "revision":
                    return self._send(
                        200,
                        orjson.dumps(
                            {
                                "id": "/".join(parts[2:4]),
                                "sha": commit,
                                "private": False,
                                "siblings": [{"rfilename": p} for p in repo.commits[commit]],
                            }
                        ),
                        {"Content-Type": "application/json"},
                        head,
                    )
                if rest[0] == "tree":
                    files = [
                        {
                            "type": "file",
                            "path": p,
                            "size": len(b),
                            "oid": hashlib.sha1(b).hexdigest(),
                        }
                        for p, b in sorted(repo.commits[commit].items())
                    ]
                    return self._send(
                        200, orjson.dumps(files), {"Content-Type": "application/json"}, head
                    )
            if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
                repo = hub.repos.get("/".join(parts[1:3]))
                commit = repo.commit(parts[4]) if repo else None
                if commit is None:
                    return self._not_found("RevisionNotFound" if repo else "RepoNotFound", head)
                body = repo.commits[commit].get("/".join(parts[5:]))
                if body is None:
                    return self._not_found("EntryNotFound", head)
                return self._send(
                    200,
                    body,
                    {
                        "X-Repo-Commit": commit,
                        "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
                        "Content-Type": "application/octet-stream",
                    },
                    head,
                )
            self._not_found("NotFound", head)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

    return Handler


@contextmanager
def fake_hub(repos: dict[str, Repo]) -> Iterator[FakeHub]:
    """Serve ``repos`` on a free port of 127.0.0.1 until the block ends; ``FakeHub.url`` is its
    endpoint."""
    hub = FakeHub(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
