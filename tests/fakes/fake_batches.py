"""The batch endpoints of ``tests.fakes.fake_provider.FakeProvider``: OpenAI's Files and Batches,
Anthropic's Message Batches and the Gemini Batch API (with its Files API upload and download), as
the official SDKs declare them (``openai`` ``types/batch*.py``, ``file_object.py``; ``anthropic``
``types/messages/message_batch*.py``; ``google-genai`` ``batches.py``, ``files.py``, ``types.py``).
Each batch line is answered by the same responder as the synchronous route of its format
(``tests.fakes.wire_formats``), so a batch answer and a synchronous answer of one request are the
same. The answers are made when a batch is created (as a provider's are while it runs); the status
read that ends it only writes the result lines.

Behaviour (``FakeProvider(batch={...})``, JSON-able):

* ``polls`` (default 1): the status reads a batch answers "running" before it ends (deterministic,
  no clock);
* ``outcome``: how each batch ends, or ``script``, a list used batch by batch (then ``outcome``):
  ``completed``; ``expired`` (the first half of its requests answered, the rest expired); ``failed``
  (the input refused whole); ``lost`` (404 for it from the first status read on); a cancel makes it
  end ``cancelled`` at the next read, the first half answered;
* ``line_faults``: probabilities per request line of ``transient`` (a 500 inside the results),
  ``rate_limited`` (a 429), ``fatal`` (a 400), ``malformed`` (a 200 whose body is not the wire
  format) and ``error200`` (OpenAI: a 200 whose chat completion carries a top-level ``error`` beside
  its answer and usage, as a gateway's partial failure), drawn from the request's key and how many
  times it was submitted (a rerun draws the same);
* ``shuffle`` (default True): results in an order of their own (matching by position would fail);
* ``hold``: seconds to stall the first arrival at ``upload``, ``create``, ``poll``, ``list`` or
  ``download`` (``download``: after half the lines), for kills at a given step; ``arrived_<step>``
  counts the arrivals;
* ``validate`` (default True): every request body and every reply is checked against the SDKs' types
  (``tests.helpers.sdk_types``); problems are counted (``sdk_problems``) and their first lines kept;
* ``inline_metadata`` (default True): Gemini's inline responses carry their request's ``metadata``;
  False: they do not, and come in an order of their own, as python-genai #2008 and #1909 report of
  the backend;
* ``gone`` (default 0): the results of the first N batches created are gone when read (404: past the
  provider's retention: OpenAI's output files after 30 days, Anthropic's results after 29, Gemini's
  files after 48 hours);
* ``extra_results``: ``{"unknown": N, "duplicate": M, "garbled": G, "omitted": O}``: each batch's
  results end with N lines whose id is none of its requests' and M lines repeating a request's id
  with another answer (a 400 error); the lines of its first G requests (input order) at their first
  submission are cut short (not JSON: their answers were made, and billed, but cannot be read;
  ``batch_line_garbled``); the lines of its last O requests (input order) at their first submission
  are left out of the results altogether, in a batch that says it completed (their answers were
  made, and billed; ``batch_line_omitted``);
* ``no_files`` (default False): the host has no Files endpoint (``/v1/files`` answers 404, as a
  server that implements Chat Completions only does);
* ``cancel_polls`` (default 0): the status reads a cancelled batch stays ``cancelling`` before it
  ends;
* ``clock_offset`` (default 0): seconds the provider's clock is ahead of this machine's (negative:
  behind): the ``created_at`` (``createTime``) of every batch it makes;
* ``old_batches`` (default 0): Gemini batches of another client, created two hours before the server
  started; ``list_oldest_first`` (default False): Gemini's listing oldest first (its order is not
  documented).

Input files are listed and deleted as the providers' Files APIs do (OpenAI ``GET /v1/files``,
``DELETE /v1/files/{id}``; Gemini ``GET /v1beta/files``, ``DELETE /v1beta/files/{name}``);
``input_files`` lists the names of the input files still held.

Counters (in ``FakeProvider.stats()``): ``batch_creates``, ``batch_uploads``, ``batch_polls``,
``batch_lists``, ``batch_cancels``, ``batch_downloads``, ``batch_lines`` (requests received in
batches), ``batch_keys`` (distinct keys), ``batch_resubmitted`` (submissions beyond the first per
key: requests submitted twice), ``batch_answers`` (answers produced), ``batch_file_deletes``,
``input_files`` (the names of the input files held), ``batch_line_<fault>`` (result lines of each
kind: ok, transient, rate_limited, fatal, malformed), ``arrived_<step>``, ``sdk_problems`` and
``sdk_problem_lines``.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson
from aiohttp import web

from . import wire_formats

OPENAI, ANTHROPIC, GEMINI = "openai", "anthropic", "gemini"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Batch:
    """One batch the fake holds: ``lines`` (key, request body as parsed) in input order."""

    id: str
    fmt: str
    lines: list[tuple[str, dict]]
    created: float
    tag: str | None = None
    model: str | None = None
    input_file: str | None = None
    inline: bool = False
    outcome: str = "completed"
    polls: int = 0
    cancelled: bool = False
    cancel_reads: int = 0  # status reads since the cancel
    gone: bool = False  # its results are past the provider's retention (404)
    ended_as: str | None = None  # completed, expired, cancelled, failed
    results: list[bytes] = field(default_factory=list)  # the result lines, once ended
    output_file: str | None = None
    error_file: str | None = None
    counts: dict = field(default_factory=dict)
    malformed: set[str] = field(
        default_factory=set
    )  # keys answered, on purpose, with a body not the wire format
    answers: dict[int, dict] = field(
        default_factory=dict
    )  # id of a line's body -> its answer, made while it runs


class BatchServer:
    """The batch endpoints and state of one FakeProvider (see the module docstring). ``responders``
    maps each format to its synchronous responder (the FakeProvider's routes)."""

    def __init__(
        self, config: dict | None, responders: dict[str, Callable[[dict], dict]], seed: int = 0
    ):
        config = dict(config or {})
        self.polls = int(config.get("polls", 1))
        self.outcome = str(config.get("outcome", "completed"))
        self.script = list(config.get("script", []))
        self.line_faults = dict(config.get("line_faults", {}))
        self.shuffle = bool(config.get("shuffle", True))
        self.hold = {k: float(v) for k, v in (config.get("hold") or {}).items()}
        self.validate = bool(config.get("validate", True))
        self.inline_metadata = bool(config.get("inline_metadata", True))
        self.gone = int(config.get("gone", 0))
        self.extra_results = {k: int(v) for k, v in (config.get("extra_results") or {}).items()}
        self.no_files = bool(config.get("no_files", False))
        self.cancel_polls = int(config.get("cancel_polls", 0))
        self.list_oldest_first = bool(config.get("list_oldest_first", False))
        self.old_batches = int(config.get("old_batches", 0))
        self.clock_offset = float(config.get("clock_offset", 0))
        self.responders, self.seed = responders, seed
        self.batches: dict[str, Batch] = {}
        self.files: dict[str, bytes] = {}
        self.gone_files: set[str] = set()  # output files past their retention (``gone``)
        self.file_meta: dict[str, dict] = {}
        self.uploads: dict[str, dict] = {}  # Gemini resumable uploads in progress
        self.submissions: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.problems: list[str] = []
        self.url = ""
        for n in range(
            self.old_batches
        ):  # another client's Gemini batches, made two hours ago, ended
            old = Batch(
                f"batches/old{n:06d}",
                GEMINI,
                [(f"old-{n}", {})],
                time.time() - 7200,
                model="models/other",
                inline=True,
                ended_as="completed",
                counts={"ok": 1},
            )
            self.batches[old.id] = old

    # ---- routes ---------------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/files", self._openai_upload)
        r.add_get("/v1/files/{file_id}/content", self._openai_content)
        r.add_get("/v1/files/{file_id}", self._openai_file)
        r.add_get("/v1/files", self._openai_files)
        r.add_delete("/v1/files/{file_id}", self._openai_delete)
        r.add_post("/v1/batches", self._openai_create)
        r.add_get("/v1/batches", self._openai_list)
        r.add_get("/v1/batches/{batch_id}", self._openai_get)
        r.add_post("/v1/batches/{batch_id}/cancel", self._openai_cancel)
        r.add_post("/v1/messages/batches", self._anthropic_create)
        r.add_get("/v1/messages/batches", self._anthropic_list)
        r.add_get("/v1/messages/batches/{batch_id}", self._anthropic_get)
        r.add_post("/v1/messages/batches/{batch_id}/cancel", self._anthropic_cancel)
        r.add_get("/v1/messages/batches/{batch_id}/results", self._anthropic_results)
        r.add_get("/v1beta/batches", self._gemini_list)
        r.add_get("/v1beta/batches/{name}", self._gemini_get)
        r.add_post("/v1beta/batches/{name}", self._gemini_cancel)
        r.add_post("/upload/v1beta/files", self._gemini_upload)
        r.add_get("/download/v1beta/files/{name}", self._gemini_download)
        r.add_get(
            "/v1beta/files/{name}", self._gemini_download
        )  # where google-genai's files.download asks
        r.add_get("/v1beta/files", self._gemini_files)
        r.add_delete("/v1beta/files/{name}", self._gemini_delete)

    async def _stall(self, step: str) -> None:
        """Count an arrival at ``step``; the first one stalls ``hold[step]`` seconds (a kill lands
        there)."""
        self.counts[f"arrived_{step}"] += 1
        if self.hold.get(step) and self.counts[f"arrived_{step}"] == 1:
            await asyncio.sleep(self.hold[step])

    def _problem(self, where: str, problems: list[str]) -> None:
        if problems:
            self.counts["sdk_problems"] += len(problems)
            self.problems += [f"{where}: {p}" for p in problems[:5]][
                : max(0, 50 - len(self.problems))
            ]

    def stats(self) -> dict:
        out = {
            k: 0
            for k in (
                "batch_creates",
                "batch_uploads",
                "batch_polls",
                "batch_lists",
                "batch_cancels",
                "batch_downloads",
                "batch_lines",
                "batch_answers",
                "sdk_problems",
                # every line fault's count, even when the dice gave none
                *(f"batch_line_{f}" for f in ("transient", "rate_limited", "fatal", "malformed")),
            )
        }
        out.update(self.counts)
        out["batch_keys"] = len(self.submissions)
        out["batch_resubmitted"] = sum(n - 1 for n in self.submissions.values())
        out["sdk_problem_lines"] = list(self.problems)
        out["input_files"] = sorted(
            m["filename"] for f, m in self.file_meta.items() if m.get("input")
        )
        return out

    # ---- the batches' course ---------------------------------------------------------------------
    def _new(self, fmt: str, lines: list[tuple[str, dict]], **kw: object) -> Batch:
        prefix = {OPENAI: "batch_", ANTHROPIC: "msgbatch_", GEMINI: "batches/"}[fmt]
        created = time.time() + self.clock_offset
        batch = Batch(prefix + uuid.uuid4().hex[:24], fmt, lines, created, **kw)
        batch.outcome = self.script.pop(0) if self.script else self.outcome
        batch.gone = self.counts["batch_creates"] < self.gone
        self.batches[batch.id] = batch
        self.counts["batch_creates"] += 1
        self.counts["batch_lines"] += len(lines)
        for key, _ in lines:
            self.submissions[key] += 1
        # the answers are made now, while the batch "runs", as a provider's are: the status read
        # that ends it only writes the result lines (the fake shares the runner's machine; ending
        # twenty batches at once would otherwise take its CPU from the collections the batch
        # benchmark times)
        batch.answers = {id(body): self.responders[fmt](body) for _, body in lines}
        return batch

    def _advance(self, batch: Batch) -> None:
        """One status read: a running batch ends after ``polls`` reads (a cancelled one at the
        next)."""
        if batch.ended_as is not None:
            return
        batch.polls += 1
        if batch.cancelled:
            batch.cancel_reads += 1
            if batch.cancel_reads > self.cancel_polls:
                self._end(batch, "cancelled")
        elif batch.outcome == "failed":
            self._end(batch, "failed")
        elif batch.polls > self.polls:
            self._end(batch, "expired" if batch.outcome == "expired" else "completed")

    def _fault(self, key: str) -> str:
        rng = random.Random(f"{self.seed}:{key}:{self.submissions[key]}")
        u = rng.random()
        for kind in ("transient", "rate_limited", "fatal", "malformed", "error200"):
            p = float(self.line_faults.get(kind, 0))
            if u < p:
                return kind
            u -= p
        return "ok"

    def _end(self, batch: Batch, how: str) -> None:
        batch.ended_as = how
        answered = (
            len(batch.lines)
            if how == "completed"
            else 0
            if how == "failed"
            else len(batch.lines) // 2
        )
        order = list(range(len(batch.lines)))
        # Gemini keeps the input order (but without its inline metadata, #1909); the others promise
        # none
        if self.shuffle and (batch.fmt != GEMINI or batch.inline and not self.inline_metadata):
            random.Random(f"{self.seed}:{batch.id}").shuffle(order)
        ok = errored = not_run = 0
        output, errors = [], []
        for i in order:
            key, body = batch.lines[i]
            if i >= answered:
                not_run += 1
                errors.append(
                    self._line(
                        batch, key, None, "expired" if how in ("expired", "failed") else "cancelled"
                    )
                )
                continue
            fault = self._fault(key)
            self.counts[f"batch_line_{fault}"] += 1
            if fault == "malformed":
                batch.malformed.add(key)
            line = self._line(batch, key, body, fault)
            if self.validate and batch.fmt == OPENAI and fault not in ("malformed", "error200"):
                self._validate_openai_line(line)
            if i < self.extra_results.get("garbled", 0) and self.submissions[key] == 1:
                self.counts["batch_line_garbled"] += 1
                line = line[: len(line) // 2]  # a line cut short: not JSON, its id unreadable
            omitted = self.extra_results.get("omitted", 0)
            if i >= len(batch.lines) - omitted and self.submissions[key] == 1:
                self.counts["batch_line_omitted"] += 1
                continue  # answered (and billed), but no line for it in either file
            if fault in ("ok", "malformed", "error200"):
                ok += 1
                output.append(line)
            else:
                errored += 1
                errors.append(line)
        batch.counts = {"ok": ok, "errored": errored, "not_run": not_run}
        if how == "failed":
            batch.results = []
            return
        keys = [key for key, _ in batch.lines]
        for n in range(self.extra_results.get("unknown", 0)):  # an id none of its requests has
            errors.append(self._line(batch, f"{n:064x}", None, "fatal"))
        for key in keys[
            : self.extra_results.get("duplicate", 0)
        ]:  # an id read already, another answer
            errors.append(self._line(batch, key, {}, "fatal"))
        batch.results = output + errors
        if batch.fmt == OPENAI:
            batch.output_file = self._store(
                b"".join(x + b"\n" for x in output), "batch_output", f"{batch.id}_output.jsonl"
            )
            batch.error_file = self._store(
                b"".join(x + b"\n" for x in errors), "batch_output", f"{batch.id}_error.jsonl"
            )
        elif batch.fmt == GEMINI and not batch.inline:
            batch.output_file = self._store(
                b"".join(x + b"\n" for x in batch.results), None, f"{batch.id}.jsonl", gemini=True
            )
        if batch.gone:
            self.gone_files |= {f for f in (batch.output_file, batch.error_file) if f}

    def _validate_openai_line(self, line: bytes) -> None:
        """An output or error line: its response body a ChatCompletion, or an error object
        (``ErrorObject``)."""
        from openai.types import ErrorObject
        from openai.types.chat import ChatCompletion

        from ..helpers.sdk_types import reply_problems

        doc = orjson.loads(line)
        self._problem(
            "openai batch line",
            [
                f"$.{k}: not a field of a batch output line"
                for k in doc
                if k not in ("id", "custom_id", "response", "error")
            ],
        )
        response = doc.get("response")
        if response is None:
            self._problem(
                "openai batch line error",
                [] if set(doc["error"]) == {"code", "message"} else ["$.error"],
            )
        elif response["status_code"] == 200:
            self._problem("openai ChatCompletion", reply_problems(ChatCompletion, response["body"]))
        else:
            self._problem(
                "openai ErrorObject", reply_problems(ErrorObject, response["body"]["error"])
            )

    def _answer(self, batch: Batch, body: dict) -> dict:
        self.counts["batch_answers"] += 1
        answer = batch.answers.pop(id(body), None)
        return answer if answer is not None else self.responders[batch.fmt](body)

    def _line(self, batch: Batch, key: str, body: dict | None, fault: str) -> bytes:
        """The result line of one request (its own format), ``fault`` one of ok, malformed,
        transient, rate_limited, fatal, expired, cancelled."""
        status = {"transient": 500, "rate_limited": 429, "fatal": 400}.get(fault)
        if batch.fmt == OPENAI:
            if body is None:
                error = {
                    "code": f"batch_{fault}",
                    "message": f"This request was not run: the batch {fault}.",
                }
                return orjson.dumps(
                    {
                        "id": f"batch_req_{uuid.uuid4().hex[:16]}",
                        "custom_id": key,
                        "response": None,
                        "error": error,
                    }
                )
            reply = (
                {"unexpected": "not a chat completion"}
                if fault == "malformed"
                else self._answer(batch, body)
                if status is None
                else wire_formats.error_body("openai", status)
            )
            if fault == "error200":  # billed: its usage stated beside the error
                reply = {
                    **reply,
                    "error": {"message": "upstream failed mid-generation", "code": 502},
                }
            return orjson.dumps(
                {
                    "id": f"batch_req_{uuid.uuid4().hex[:16]}",
                    "custom_id": key,
                    "response": {
                        "status_code": status or 200,
                        "request_id": f"req_{uuid.uuid4().hex[:12]}",
                        "body": reply,
                    },
                    "error": None,
                }
            )
        if batch.fmt == ANTHROPIC:
            if body is None:
                result: dict = {"type": "canceled" if fault == "cancelled" else "expired"}
            elif status is not None:
                result = {
                    "type": "errored",
                    "error": {
                        **wire_formats.error_body("anthropic", status),
                        "request_id": "req_x",
                    },
                }
            else:
                message = self._answer(batch, body)
                if fault == "malformed":
                    message = {**message, "content": "not a list of blocks"}
                result = {"type": "succeeded", "message": message}
            return orjson.dumps({"custom_id": key, "result": result})
        if body is None:
            item: dict = {
                "error": {"code": 4, "message": f"not run: the batch {fault}", "details": []}
            }
        elif status is not None:
            item = {
                "error": {
                    "code": {500: 13, 429: 8, 400: 3}[status],
                    "message": f"injected {status}",
                    "details": [],
                }
            }
        else:
            item = {
                "response": {"unexpected": 1} if fault == "malformed" else self._answer(batch, body)
            }
        if (
            batch.inline
        ):  # the request's metadata comes back with its response (unless the backend drops it)
            keep = key is not None and self.inline_metadata
            return orjson.dumps({**item, **({"metadata": {"key": key}} if keep else {})})
        return orjson.dumps({"key": key, **item})

    def _store(
        self, data: bytes, purpose: str | None, name: str, gemini: bool = False, input: bool = False
    ) -> str:
        file_id = f"files/{uuid.uuid4().hex[:16]}" if gemini else f"file-{uuid.uuid4().hex[:24]}"
        self.files[file_id] = data
        self.file_meta[file_id] = {
            "purpose": purpose,
            "filename": name,
            "created": time.time(),
            "input": input,
        }
        return file_id

    def _delete(self, file_id: str) -> bool:
        if file_id not in self.files:
            return False
        del self.files[file_id]
        del self.file_meta[file_id]
        self.counts["batch_file_deletes"] += 1
        return True

    # ---- OpenAI ----------------------------------------------------------------------------------
    def _openai_file_object(self, file_id: str) -> dict:
        meta = self.file_meta[file_id]
        doc = {
            "id": file_id,
            "object": "file",
            "bytes": len(self.files[file_id]),
            "created_at": int(meta["created"]),
            "filename": meta["filename"],
            "purpose": meta["purpose"],
            "status": "processed",
        }
        if self.validate:
            from openai.types import FileObject

            from ..helpers.sdk_types import reply_problems

            self._problem("openai FileObject", reply_problems(FileObject, doc))
        return doc

    def _openai_batch(self, batch: Batch) -> dict:
        done = batch.ended_as is not None
        status = (
            batch.ended_as
            if done
            else (
                "cancelling"
                if batch.cancelled
                else "validating"
                if batch.polls == 0
                else "in_progress"
            )
        )
        c = batch.counts
        doc = {
            "id": batch.id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "errors": None,
            "input_file_id": batch.input_file,
            "completion_window": "24h",
            "status": status,
            "output_file_id": batch.output_file if done else None,
            "error_file_id": batch.error_file if done else None,
            "created_at": int(batch.created),
            "in_progress_at": int(batch.created) if batch.polls else None,
            "expires_at": int(batch.created) + 86400,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {
                "total": len(batch.lines),
                "completed": c.get("ok", 0),
                "failed": c.get("errored", 0),
            },
            "metadata": {"dxi_entry": batch.tag} if batch.tag else None,
        }
        if done:
            doc[
                {
                    "completed": "completed_at",
                    "expired": "expired_at",
                    "cancelled": "cancelled_at",
                    "failed": "failed_at",
                }[status]
            ] = int(time.time())
        if status == "failed":
            doc["errors"] = {
                "object": "list",
                "data": [
                    {
                        "code": "invalid_file",
                        "message": "the input was refused",
                        "line": 1,
                        "param": None,
                    }
                ],
            }
        if self.validate:
            from openai.types import Batch as SDKBatch

            from ..helpers.sdk_types import reply_problems

            self._problem("openai Batch", reply_problems(SDKBatch, doc))
        return doc

    async def _openai_upload(self, request: web.Request) -> web.Response:
        if self.no_files:  # as OpenAI answers a route it does not have
            return web.json_response(
                wire_formats.error_body("openai", 404, message="Invalid URL (POST /v1/files)"),
                status=404,
            )
        await self._stall("upload")
        form = await request.post()
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or purpose != "batch":
            return web.json_response(
                wire_formats.error_body(
                    "openai", 400, message="file and purpose=batch are required"
                ),
                status=400,
            )
        data = upload.file.read()
        file_id = self._store(data, "batch", upload.filename or "input.jsonl", input=True)
        self.counts["batch_uploads"] += 1
        return web.json_response(self._openai_file_object(file_id))

    async def _openai_files(self, request: web.Request) -> web.Response:
        """``GET /v1/files`` (``purpose``, ``limit``, ``after``; newest first), a
        ``SyncCursorPage[FileObject]``."""
        purpose = request.query.get("purpose")
        found = sorted(
            (
                f
                for f, m in self.file_meta.items()
                if not f.startswith("files/") and (purpose is None or m["purpose"] == purpose)
            ),
            key=lambda f: self.file_meta[f]["created"],
            reverse=True,
        )
        after, limit = request.query.get("after"), int(request.query.get("limit", 10000))
        if after:
            found = found[found.index(after) + 1 :] if after in found else []
        page = found[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": [self._openai_file_object(f) for f in page],
                "first_id": page[0] if page else None,
                "last_id": page[-1] if page else None,
                "has_more": len(found) > limit,
            }
        )

    async def _openai_delete(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if not self._delete(file_id):
            return web.json_response(
                wire_formats.error_body("openai", 404, message="No such File object"), status=404
            )
        doc = {"id": file_id, "object": "file", "deleted": True}
        if self.validate:
            from openai.types import FileDeleted

            from ..helpers.sdk_types import reply_problems

            self._problem("openai FileDeleted", reply_problems(FileDeleted, doc))
        return web.json_response(doc)

    async def _openai_file(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if file_id not in self.files:
            return web.json_response(
                wire_formats.error_body("openai", 404, message="No such File object"), status=404
            )
        return web.json_response(self._openai_file_object(file_id))

    async def _openai_content(self, request: web.Request) -> web.StreamResponse:
        return await self._download(request, request.match_info["file_id"], "openai")

    async def _openai_create(self, request: web.Request) -> web.Response:
        await self._stall("create")
        body = orjson.loads(await request.read())
        if self.validate:
            from openai.types import batch_create_params

            from ..helpers.sdk_types import conforms

            self._problem(
                "openai BatchCreateParams", conforms(body, batch_create_params.BatchCreateParams)
            )
        data = self.files.get(body.get("input_file_id"))
        if data is None:
            return web.json_response(
                wire_formats.error_body("openai", 400, message="unknown input_file_id"), status=400
            )
        lines = []
        for raw in data.splitlines():
            if raw.strip():
                line = orjson.loads(raw)
                if self.validate:
                    from openai.types.chat import completion_create_params

                    from ..helpers.sdk_types import conforms

                    self._problem(
                        "openai batch line",
                        [
                            f"$.{k}: not a field of a batch input line"
                            for k in line
                            if k not in ("custom_id", "method", "url", "body")
                        ]
                        + conforms(
                            line["body"],
                            completion_create_params.CompletionCreateParamsNonStreaming,
                        ),
                    )
                lines.append((line["custom_id"], line["body"]))
        tag = (body.get("metadata") or {}).get("dxi_entry")
        batch = self._new(OPENAI, lines, tag=tag, input_file=body["input_file_id"])
        return web.json_response(self._openai_batch(batch))

    def _get(self, request: web.Request, key: str = "batch_id") -> Batch | None:
        name = request.match_info[key]
        batch = self.batches.get(name) or self.batches.get(f"batches/{name.split(':')[0]}")
        if batch is not None and batch.outcome == "lost":
            return None
        return batch

    async def _openai_get(self, request: web.Request) -> web.Response:
        await self._stall("poll")
        self.counts["batch_polls"] += 1
        batch = self._get(request)
        if batch is None:
            return web.json_response(
                wire_formats.error_body("openai", 404, message="No such Batch object"), status=404
            )
        self._advance(batch)
        return web.json_response(self._openai_batch(batch))

    async def _openai_list(self, request: web.Request) -> web.Response:
        await self._stall("list")
        self.counts["batch_lists"] += 1
        found = sorted(
            (b for b in self.batches.values() if b.fmt == OPENAI and b.outcome != "lost"),
            key=lambda b: b.created,
            reverse=True,
        )
        after, limit = request.query.get("after"), int(request.query.get("limit", 20))
        if after:
            ids = [b.id for b in found]
            found = found[ids.index(after) + 1 :] if after in ids else []
        page = found[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": [self._openai_batch(b) for b in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(found) > limit,
            }
        )

    async def _openai_cancel(self, request: web.Request) -> web.Response:
        self.counts["batch_cancels"] += 1
        batch = self._get(request)
        if batch is None:
            return web.json_response(
                wire_formats.error_body("openai", 404, message="No such Batch object"), status=404
            )
        if batch.ended_as is None:
            batch.cancelled = True
        return web.json_response(self._openai_batch(batch))

    async def _download(self, request: web.Request, file_id: str, fmt: str) -> web.StreamResponse:
        data = self.files.get(file_id)
        if data is None or file_id in self.gone_files:
            return web.json_response(
                wire_formats.error_body(fmt, 404, message="no such file"), status=404
            )
        self.counts["batch_downloads"] += 1
        resp = web.StreamResponse(
            headers={
                "Content-Type": "application/jsonl" if fmt != ANTHROPIC else "application/binary"
            }
        )
        await resp.prepare(request)
        lines = data.splitlines(keepends=True)
        half = len(lines) // 2
        try:
            await resp.write(b"".join(lines[:half]))
            if lines[:half]:
                await self._stall("download")
            await resp.write(b"".join(lines[half:]))
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            self.counts["aborted_downloads"] += 1
        return resp

    # ---- Anthropic -------------------------------------------------------------------------------
    def _anthropic_batch(self, batch: Batch) -> dict:
        done = batch.ended_as is not None
        n, c = len(batch.lines), batch.counts
        counts = {
            "processing": 0 if done else n,
            "succeeded": c.get("ok", 0) if done else 0,
            "errored": c.get("errored", 0) if done else 0,
            "canceled": c.get("not_run", 0) if done and batch.ended_as == "cancelled" else 0,
            "expired": c.get("not_run", 0) if done and batch.ended_as != "cancelled" else 0,
        }
        doc = {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended"
            if done
            else "canceling"
            if batch.cancelled
            else "in_progress",
            "request_counts": counts,
            "created_at": _iso(batch.created),
            "expires_at": _iso(batch.created + 86400),
            "ended_at": _iso(time.time()) if done else None,
            "archived_at": None,
            "cancel_initiated_at": _iso(batch.created) if batch.cancelled else None,
            "results_url": f"{self.url}/v1/messages/batches/{batch.id}/results" if done else None,
        }
        if self.validate:
            from anthropic.types.messages import MessageBatch

            from ..helpers.sdk_types import reply_problems

            self._problem("anthropic MessageBatch", reply_problems(MessageBatch, doc))
        return doc

    async def _anthropic_create(self, request: web.Request) -> web.Response:
        await self._stall("create")
        body = orjson.loads(await request.read())
        if self.validate:
            from anthropic.types.messages import batch_create_params

            from ..helpers.sdk_types import conforms

            self._problem(
                "anthropic BatchCreateParams", conforms(body, batch_create_params.BatchCreateParams)
            )
        lines = [(r["custom_id"], r["params"]) for r in body.get("requests") or []]
        if not lines or len({k for k, _ in lines}) != len(lines):
            return web.json_response(
                wire_formats.error_body(
                    "anthropic", 400, message="requests: empty, or a custom_id used twice"
                ),
                status=400,
            )
        return web.json_response(self._anthropic_batch(self._new(ANTHROPIC, lines)))

    async def _anthropic_get(self, request: web.Request) -> web.Response:
        await self._stall("poll")
        self.counts["batch_polls"] += 1
        batch = self._get(request)
        if batch is None:
            return web.json_response(
                wire_formats.error_body("anthropic", 404, message="batch not found"), status=404
            )
        self._advance(batch)
        return web.json_response(self._anthropic_batch(batch))

    async def _anthropic_list(self, request: web.Request) -> web.Response:
        await self._stall("list")
        self.counts["batch_lists"] += 1
        found = sorted(
            (b for b in self.batches.values() if b.fmt == ANTHROPIC and b.outcome != "lost"),
            key=lambda b: b.created,
            reverse=True,
        )
        after, limit = request.query.get("after_id"), int(request.query.get("limit", 20))
        if after:
            ids = [b.id for b in found]
            found = found[ids.index(after) + 1 :] if after in ids else []
        page = found[:limit]
        return web.json_response(
            {
                "data": [self._anthropic_batch(b) for b in page],
                "has_more": len(found) > limit,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )

    async def _anthropic_cancel(self, request: web.Request) -> web.Response:
        self.counts["batch_cancels"] += 1
        batch = self._get(request)
        if batch is None:
            return web.json_response(
                wire_formats.error_body("anthropic", 404, message="batch not found"), status=404
            )
        if batch.ended_as is None:
            batch.cancelled = True
        return web.json_response(self._anthropic_batch(batch))

    async def _anthropic_results(self, request: web.Request) -> web.StreamResponse:
        batch = self._get(request)
        if batch is None or batch.ended_as is None or batch.gone:
            return web.json_response(
                wire_formats.error_body("anthropic", 404, message="no results"), status=404
            )
        if self.validate:
            from anthropic.types.messages import MessageBatchIndividualResponse

            from ..helpers.sdk_types import reply_problems

            for line in batch.results:
                doc = orjson.loads(line)
                if (
                    doc["custom_id"] not in batch.malformed
                ):  # (those are not the wire format on purpose)
                    self._problem(
                        "anthropic MessageBatchIndividualResponse",
                        reply_problems(MessageBatchIndividualResponse, doc),
                    )
        file_id = f"anthropic-results-{batch.id}"
        self.files[file_id] = b"".join(x + b"\n" for x in batch.results)
        return await self._download(request, file_id, ANTHROPIC)

    # ---- Gemini ----------------------------------------------------------------------------------
    def _gemini_op(self, batch: Batch, with_output: bool = True) -> dict:
        done = batch.ended_as is not None
        state = {
            "completed": "BATCH_STATE_SUCCEEDED",
            "expired": "BATCH_STATE_EXPIRED",
            "failed": "BATCH_STATE_FAILED",
            "cancelled": "BATCH_STATE_CANCELLED",
        }.get(
            batch.ended_as or "",
            "BATCH_STATE_PENDING" if batch.polls == 0 else "BATCH_STATE_RUNNING",
        )
        c, n = batch.counts, len(batch.lines)
        stats = {
            "requestCount": str(n),
            "successfulRequestCount": str(c.get("ok", 0)),
            "failedRequestCount": str(c.get("errored", 0) + c.get("not_run", 0)),
            "pendingRequestCount": str(0 if done else n),
        }
        meta = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "model": batch.model,
            "displayName": batch.tag,
            "createTime": _iso(batch.created),
            "updateTime": _iso(time.time()),
            "batchStats": stats,
            "state": state,
            "name": batch.id,
        }
        op: dict = {"name": batch.id, "metadata": meta}
        if done:
            meta["endTime"] = _iso(time.time())
            output: dict = {
                "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"
            }
            if batch.ended_as != "failed":
                if batch.inline:
                    output["inlinedResponses"] = (
                        {"inlinedResponses": [orjson.loads(x) for x in batch.results]}
                        if with_output
                        else {"inlinedResponses": []}
                    )
                else:
                    output["responsesFile"] = batch.output_file
            meta["output"] = {k: v for k, v in output.items() if k != "@type"}
            op |= {"done": True, "response": output}
        if self.validate:
            self._validate_gemini_op(op)
        return op

    def _validate_gemini_op(self, op: dict) -> None:
        from google.genai import batches as sdk_batches
        from google.genai import types as genai

        from ..helpers.sdk_types import reply_problems

        try:
            genai.BatchJob.model_validate(sdk_batches._BatchJob_from_mldev(op))
        except (
            Exception
        ) as exc:  # pydantic's ValidationError, or a converter error on a shape it does not know
            self._problem("gemini BatchJob", [str(exc)[:300]])
        output = op.get("metadata", {}).get("output") or {}
        for item in (output.get("inlinedResponses") or {}).get("inlinedResponses") or []:
            if isinstance(item.get("response"), dict) and "unexpected" not in item["response"]:
                self._problem(
                    "gemini GenerateContentResponse",
                    reply_problems(genai.GenerateContentResponse, item["response"]),
                )

    def _gemini_lines(self, items: list[dict], inline: bool) -> list[tuple[str, dict]]:
        lines = []
        for item in items:
            if self.validate:
                from ..helpers.sdk_types import gemini_problems

                allowed = ("request", "metadata") if inline else ("key", "request")
                self._problem(
                    "gemini batch request",
                    [f"$.{k}: not a field of a batch request" for k in item if k not in allowed]
                    + gemini_problems(item["request"]),
                )
            key = (item.get("metadata") or {}).get("key") if inline else item.get("key")
            lines.append((key, item["request"]))
        return lines

    async def create_gemini(self, request: web.Request, model: str) -> web.Response:
        """``POST /v1beta/models/{model}:batchGenerateContent`` (routed here by FakeProvider)."""
        await self._stall("create")
        body = orjson.loads(await request.read())
        batch_doc = body.get("batch") or {}
        if self.validate:
            self._problem(
                "gemini batchGenerateContent",
                [
                    f"$.batch.{k}: not a field the SDK sends"
                    for k in batch_doc
                    if k not in ("displayName", "inputConfig", "webhookConfig")
                ]
                + [
                    f"$.{k}: not a field of BatchGenerateContentRequest"
                    for k in body
                    if k != "batch"
                ],
            )
        source = batch_doc.get("inputConfig") or {}
        if "fileName" in source:
            data = self.files.get(source["fileName"])
            if data is None:
                return web.json_response(
                    wire_formats.error_body("gemini", 400, message="unknown file"), status=400
                )
            lines = self._gemini_lines(
                [orjson.loads(x) for x in data.splitlines() if x.strip()], inline=False
            )
            inline = False
        else:
            lines = self._gemini_lines(
                (source.get("requests") or {}).get("requests") or [], inline=True
            )
            inline = True
        batch = self._new(
            GEMINI,
            lines,
            tag=batch_doc.get("displayName"),
            model=f"models/{model}",
            inline=inline,
            input_file=source.get("fileName"),
        )
        return web.json_response(self._gemini_op(batch))

    async def _gemini_get(self, request: web.Request) -> web.Response:
        await self._stall("poll")
        self.counts["batch_polls"] += 1
        batch = self._get(request, "name")
        if batch is None:
            return web.json_response(
                wire_formats.error_body("gemini", 404, message="batch not found"), status=404
            )
        self._advance(batch)
        return web.json_response(self._gemini_op(batch))

    async def _gemini_list(self, request: web.Request) -> web.Response:
        await self._stall("list")
        self.counts["batch_lists"] += 1
        found = sorted(
            (b for b in self.batches.values() if b.fmt == GEMINI and b.outcome != "lost"),
            key=lambda b: b.created,
            reverse=not self.list_oldest_first,
        )
        start, size = (
            int(request.query.get("pageToken") or 0),
            int(request.query.get("pageSize", 20)),
        )
        page = found[start : start + size]
        doc: dict = {"operations": [self._gemini_op(b, with_output=False) for b in page]}
        if start + size < len(found):
            doc["nextPageToken"] = str(start + size)
        return web.json_response(doc)

    async def _gemini_cancel(self, request: web.Request) -> web.Response:
        if not request.match_info["name"].endswith(":cancel"):
            return web.json_response(
                wire_formats.error_body("gemini", 404, message="no such method"), status=404
            )
        self.counts["batch_cancels"] += 1
        batch = self._get(request, "name")
        if batch is None:
            return web.json_response(
                wire_formats.error_body("gemini", 404, message="batch not found"), status=404
            )
        if batch.ended_as is None:
            batch.cancelled = True
        return web.json_response({})

    async def _gemini_upload(self, request: web.Request) -> web.Response:
        command = request.headers.get("X-Goog-Upload-Command", "")
        if command == "start":
            await self._stall("upload")
            doc = orjson.loads(await request.read() or b"{}")
            upload_id = uuid.uuid4().hex[:16]
            self.uploads[upload_id] = {
                "name": ((doc.get("file") or {}).get("displayName") or upload_id),
                "size": int(request.headers.get("X-Goog-Upload-Header-Content-Length", 0)),
                "data": bytearray(),
            }
            return web.json_response(
                {},
                headers={
                    "X-Goog-Upload-URL": f"{self.url}/upload/v1beta/files?upload_id={upload_id}",
                    "X-Goog-Upload-Status": "active",
                },
            )
        upload = self.uploads.get(request.query.get("upload_id", ""))
        if upload is None:
            return web.json_response(
                wire_formats.error_body("gemini", 404, message="unknown upload"), status=404
            )
        upload["data"] += await request.read()
        if "finalize" not in command:
            return web.json_response({}, headers={"X-Goog-Upload-Status": "active"})
        file_id = self._store(bytes(upload["data"]), None, upload["name"], gemini=True, input=True)
        self.counts["batch_uploads"] += 1
        meta = self.file_meta[file_id]
        doc = {
            "file": {
                "name": file_id,
                "displayName": upload["name"],
                "mimeType": "application/jsonl",
                "sizeBytes": str(len(self.files[file_id])),
                "createTime": _iso(meta["created"]),
                "updateTime": _iso(meta["created"]),
                "state": "ACTIVE",
                "source": "UPLOADED",
                "uri": f"{self.url}/v1beta/{file_id}",
            }
        }
        if self.validate:
            from google.genai import types as genai

            from ..helpers.sdk_types import unknown_keys

            try:  # as the SDK reads it (lax: int64 as a string, as the REST API writes it)
                genai.File.model_validate(doc["file"])
            except ValueError as exc:
                self._problem("gemini File", [str(exc)[:300]])
            self._problem("gemini File", unknown_keys(doc["file"], genai.File))
        return web.json_response(doc, headers={"X-Goog-Upload-Status": "final"})

    async def _gemini_files(self, request: web.Request) -> web.Response:
        """``GET /v1beta/files`` (``pageSize``, ``pageToken``), a ``ListFilesResponse``."""
        found = sorted(
            (f for f in self.file_meta if f.startswith("files/")),
            key=lambda f: self.file_meta[f]["created"],
        )
        start, size = (
            int(request.query.get("pageToken") or 0),
            int(request.query.get("pageSize", 10)),
        )
        page = found[start : start + size]
        doc: dict = {
            "files": [
                {
                    "name": f,
                    "displayName": self.file_meta[f]["filename"],
                    "mimeType": "application/jsonl",
                    "sizeBytes": str(len(self.files[f])),
                    "state": "ACTIVE",
                    "source": "UPLOADED",
                    "createTime": _iso(self.file_meta[f]["created"]),
                }
                for f in page
            ]
        }
        if start + size < len(found):
            doc["nextPageToken"] = str(start + size)
        return web.json_response(doc)

    async def _gemini_delete(self, request: web.Request) -> web.Response:
        if not self._delete("files/" + request.match_info["name"]):
            return web.json_response(
                wire_formats.error_body("gemini", 404, message="no such file"), status=404
            )
        return web.json_response({})

    async def _gemini_download(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if not name.endswith(":download"):
            return web.json_response(
                wire_formats.error_body("gemini", 404, message="no such method"), status=404
            )
        return await self._download(request, "files/" + name.removesuffix(":download"), GEMINI)
