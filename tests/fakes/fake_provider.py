"""The fault-injecting provider for tests and benchmarks: a real aiohttp server on 127.0.0.1.

Wire formats are pluggable. A *responder* is a pure function from the parsed request JSON to the
response JSON; ``ROUTES`` maps each POST path to a responder factory
``factory(model) -> Responder``:

* ``/v1/systemone``: ``systemone`` (System One decision models, ``shared/PROTOCOLS.md`` §A);
* ``/v1/chat/completions``, ``/v1/messages``, ``/v1/decisions``,
  ``/v1beta/models/{model}:generateContent``, ``/v1beta/decisions``: the language-model and
  decision-API responders of ``tests.fakes.wire_formats`` (OpenAI-compatible Chat Completions,
  structured or logprob; Anthropic Messages; OpenAI Decisions; Gemini; the Gemini Decisions API), as
  the providers document them. A request a responder refuses (``wire_formats.Refused``: a model that
  refuses a parameter, an unknown model) is answered with that status and error body.

The batch APIs (OpenAI's Files and Batches, Anthropic's Message Batches, the Gemini Batch API and
its Files API) are served beside them by ``tests.fakes.fake_batches`` (``batch={...}`` configures
them; every batch line is answered by the same responder as its synchronous route).

To serve another format, add a route: ``ROUTES["/v1/messages"] = my_factory`` (every server made
afterwards has it), or pass ``routes={path: responder}`` to one server, or
``--route PATH=module:factory`` to the server process. Answers are deterministic: seeded by the
request's content (and the model), so a resumed run gets exactly the answers an uninterrupted one
gets, from any server instance.

Behaviour of each request, in order:

1. ``rpm`` (optional) is enforced like a provider: a token bucket of ``burst`` requests refilled at
   ``rpm``/60 per second; over it, 429 with ``Retry-After`` (decimal seconds) and, unless
   ``rate_headers=False``, ``x-ratelimit-limit-requests`` / ``-remaining-requests`` /
   ``-reset-requests``. With ``window_s`` (e.g. 10) it is enforced per window instead, as providers
   that count requests per interval do: at most ``rpm × window_s / 60`` requests let in within any
   ``window_s`` seconds (a sliding window over the arrivals let in; over it, the same 429).
   ``stats()["window_peak"]`` is then the most arrivals (let in or not) seen within any ``window_s``
   seconds: the aggregate a set of clients sent.
2. The next entry of ``script`` if any, else a fault drawn with the probabilities of ``faults``
   (seeded by the request content, the seed and how many times that content arrived, so a rerun
   draws the same sequence), else ``default``. Behaviours:

   * ``"ok"``: the responder's reply, after the ``latency``;
   * ``"429"`` / ``"429:<wait>"``: rate limited; ``<wait>`` is ``N`` (``Retry-After: N``),
     ``date:N`` (an HTTP date N seconds ahead), ``ms:N`` (``retry-after-ms: N``) or
     ``reset:<duration>`` (``x-ratelimit-reset-requests`` with
     ``x-ratelimit-remaining-requests: 0``);
   * ``"500"``, ``"503"``, ``"400"``, ``"401"``, ``"422"``, ...: that status with a small JSON error
     body;
   * ``"malformed"``: 200 with a body that is not the wire format (HTML, or the reply cut in half);
   * the hostile replies, in the format of the route (``tests.fakes.wire_formats``): ``"quota"``
     (429 with the provider's exhausted-quota body: OpenAI ``insufficient_quota``, Anthropic
     ``enforced_spend_limit_reached``, Gemini's per-day ``QuotaFailure``), ``"error200"`` (an error
     inside a 200), ``"gzip_cut"`` (the reply gzip-compressed, its 8-byte trailer missing),
     ``"gzip"`` (the whole gzip reply; ``"gzip:<n>"`` / ``"gzip_cut:<n>"``: in ``n`` members,
     ``gzip_members``), ``"duplicate"`` (an answer named twice), ``"nan"`` (``NaN``/``Infinity`` in
     a decision reply), ``"huge:<bytes>"`` (a reply of that many bytes, streamed, never held in
     memory), ``"noretry:<status>"`` (that status with ``x-should-retry: false``), ``"unsupported"``
     (a 400 refusing the request's form: an unsupported parameter or schema);
   * ``"sleep:<seconds>"``: wait, then reply ok; ``"hang"``: never reply (until the client gives up
     or ``hang_s`` passes): a timeout;
   * ``"drop"``: close the connection without a reply; ``"reset"``: reset it (TCP RST).

``latency`` is ``"0"``, ``"<seconds>"``, ``"uniform:<lo>:<hi>"``, ``"lognormal:<median>:<sigma>"``
or ``"exp:<mean>"`` (seconds; drawn per request, seeded like the faults). ``date`` (Unix seconds)
stands the server's clock still: every reply's ``Date`` header states that time, so what a client
computes from it (a quota's reset) is exact.

Counters (``stats()``, or ``GET /stats`` on a served process): ``arrivals``; ``ok`` (replies written
out whole to the socket); ``aborted`` (the client was gone before the reply was written); each fault
kind; ``keys_ok`` (distinct request contents answered ok); ``duplicates`` (ok replies beyond the
first per content: requests answered twice); ``peak_concurrency``; ``first_arrival`` /
``last_reply``: the ``time.monotonic()`` of the first request's arrival and of the last ok reply
written (None before; the clock is system-wide, so another process's timings compare with them:
``benchmarks/bench_process.py``). ``requests`` / ``headers`` record every request (``record=False``
turns that off for long benchmarks).

Run in-process (``async with FakeProvider(...) as server``) or as its own process, which keeps its
CPU off the client's event loop and survives the client being killed: ``with serve(...) as server``,
or ``python -m tests.fakes.fake_provider --port 8091 --config '{"faults": {"rate_limit": 0.1}}'``
(prints the URL, serves until Ctrl-C or SIGTERM, also in the background; ``serve`` adds
``--until-stdin-closes``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import importlib
import math
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

import orjson
from aiohttp import web

from dxi.adapters import Request
from dxi.adapters.systemone import SystemOne

from . import wire_formats
from .fake_batches import BatchServer

Responder = Callable[[dict], dict]


def content_seed(payload: dict, model: str = "") -> int:
    """A seed from the request's content: the same request gets the same answer from any server."""
    return int.from_bytes(
        hashlib.sha256(model.encode() + b"\0" + orjson.dumps(payload)).digest()[:8], "big"
    )


def systemone(
    model: str | None = "fake-decider", p_first: float | None = None, p_yes: float | None = None
) -> Responder:
    """A System One server's replies, as ``model`` (None: as the model each request names, like a
    proxy serving many models). ``p_first`` puts that probability on each choice's first option (the
    rest spread evenly); ``p_yes`` answers every yes/no question; None (the default): both drawn
    from the request's content (probabilities rounded to 4 decimals, like the real servers). Usage:
    ``len(state) // 4 + 8 × questions`` input tokens, one output token per question."""

    def respond(payload: dict) -> dict:
        served = model or str(payload.get("model") or "fake-decider")
        rng = random.Random(content_seed(payload, served))
        answers = {}
        questions = payload["questions"]
        for name, q in questions.items():
            if q.get("type") == "choice":
                options = list(q["criteria"])
                if p_first is not None:
                    rest = round((1 - p_first) / (len(options) - 1), 4)
                    probs = [p_first if i == 0 else rest for i in range(len(options))]
                else:
                    weights = [rng.random() ** 3 + 1e-3 for _ in options]
                    probs = [round(w / sum(weights), 4) for w in weights]
                best = max(range(len(options)), key=lambda i: probs[i])
                n = len(options)
                answers[name] = {
                    "type": "choice",
                    "choice": options[best],
                    "probabilities": dict(zip(options, probs, strict=True)),
                    "confidence": round((n * probs[best] - 1) / (n - 1), 4),
                }
            else:
                answers[name] = {
                    "type": "noul",
                    "noul": p_yes if p_yes is not None else round(rng.random(), 4),
                }
        state = payload.get("state")
        tokens = len(state) // 4 + 8 * len(questions) if isinstance(state, str) else 10
        return {
            "model": served,
            "answers": answers,
            "usage": {"input_tokens": tokens, "output_tokens": len(questions)},
            "latency_ms": 1.0,
        }

    return respond


def swapping(after: int, first: str | None, then: str):
    """A System One responder that answers its first ``after`` requests as ``first`` (None: as the
    model each request names, like a proxy), then every one as ``then``: a server restarted with
    another model mid-run."""
    before, later, count = systemone(first, 0.7, 0.8), systemone(then, 0.7, 0.8), [0]

    def respond(payload: dict) -> dict:
        count[0] += 1
        return (before if count[0] <= after else later)(payload)

    return respond


def wire_format(respond: Callable[[dict], dict]) -> Callable[[str], Responder]:
    """A responder factory for one of ``tests.fakes.wire_formats``' responders (their model is
    fixed)."""
    return lambda model: respond


GEMINI = "/v1beta/models/{name}"  # {name} is MODEL:generateContent

# POST path -> responder factory(model)
ROUTES: dict[str, Callable[[str], Responder]] = {
    "/v1/systemone": systemone,
    "/v1/chat/completions": wire_format(wire_formats.openai_chat),
    "/v1/messages": wire_format(wire_formats.anthropic_messages),
    "/v1/decisions": wire_format(wire_formats.openai_decisions),
    GEMINI: wire_format(wire_formats.gemini_generate),
    "/v1beta/decisions": wire_format(wire_formats.gemini_decisions),
}
# POST path -> the wire format's name in tests.fakes.wire_formats (its error bodies and hostile
# replies)
FORMATS = {
    "/v1/systemone": "systemone",
    "/v1/chat/completions": "openai",
    "/v1/messages": "anthropic",
    "/v1/decisions": "openai-decisions",
    GEMINI: "gemini",
    "/v1beta/decisions": "gemini-decisions",
}


@dataclass
class Faults:
    """Probabilities (0-1) of each injected fault per request, and the wait a 429 states
    (``retry_after``: as in the ``"429:<wait>"`` behaviour, e.g. ``"0.02"``, ``"date:1"``,
    ``"ms:20"``, ``"reset:20ms"``; ``""`` for none). ``hang`` is a timeout: no reply until the
    client gives up."""

    rate_limit: float = 0.0
    server_error: float = 0.0
    hang: float = 0.0
    reset: float = 0.0
    malformed: float = 0.0
    retry_after: str = "0.02"

    def draw(self, rng: random.Random) -> str:
        u = rng.random()
        for behaviour, p in (
            (f"429:{self.retry_after}" if self.retry_after else "429", self.rate_limit),
            ("5xx", self.server_error),
            ("hang", self.hang),
            ("reset", self.reset),
            ("malformed", self.malformed),
        ):
            if u < p:
                return behaviour
            u -= p
        return "ok"


def gzip_members(data: bytes, n: int) -> bytes:
    """``data`` gzip-compressed as ``n`` members one after another (RFC 1952 §2.2), each holding a
    part of ``data`` of about equal length (the last may be empty)."""
    size = -(-len(data) // n) if data else 0
    return b"".join(gzip.compress(data[i * size : (i + 1) * size]) for i in range(n))


def _latency(spec: str, rng: random.Random) -> float:
    kind, _, rest = spec.partition(":")
    if not rest:
        return float(kind)
    args = [float(a) for a in rest.split(":")]
    if kind == "fixed":
        return args[0]
    if kind == "uniform":
        return rng.uniform(args[0], args[1])
    if kind == "lognormal":
        return args[0] * math.exp(rng.gauss(0, args[1]))
    if kind == "exp":
        return rng.expovariate(1 / args[0])
    raise ValueError(f"unknown latency distribution {spec!r}")


def _wait_headers(spec: str) -> dict[str, str]:
    """The headers of a 429 stating ``spec`` (see ``Faults.retry_after``)."""
    kind, _, arg = spec.partition(":")
    if not spec:
        return {}
    if kind == "date":
        return {"Retry-After": formatdate(time.time() + float(arg), usegmt=True)}
    if kind == "ms":
        return {"retry-after-ms": arg}
    if kind == "reset":
        return {"x-ratelimit-reset-requests": arg, "x-ratelimit-remaining-requests": "0"}
    return {"Retry-After": spec}


class FakeProvider:
    """The server (see the module docstring). ``url`` is set once started; ``stats()`` returns the
    counters. ``model`` is the one model it serves (reported by ``GET /health``); None serves every
    model a request names, like a proxy (``/health`` then reports none)."""

    def __init__(
        self,
        script: list[str] | None = None,
        default: str = "ok",
        model: str | None = "fake-decider",
        p_first: float | None = 0.7,
        p_yes: float | None = 0.8,
        *,
        seed: int = 0,
        latency: str = "0",
        faults: Faults | dict | None = None,
        rpm: float | None = None,
        burst: float | None = None,
        rate_headers: bool = True,
        hang_s: float = 30.0,
        record: bool = True,
        window_s: float | None = None,
        routes: dict[str, Responder] | None = None,
        route_factories: dict[str, str] | None = None,
        batch: dict | None = None,
        question_types: list[str] | None = None,
        date: float | None = None,
    ):
        self.script = deque(script or [])
        self.date = date  # Unix seconds every reply's Date header states (None: the real clock's)
        self.question_types = question_types  # declared by /health: it answers these types only
        self.default, self.model, self.seed, self.latency = default, model, seed, latency
        self.faults = Faults(**faults) if isinstance(faults, dict) else faults
        self.rpm, self.rate_headers, self.hang_s, self.record = rpm, rate_headers, hang_s, record
        self.burst = burst if burst is not None else (max(1.0, rpm / 60) if rpm else 1.0)
        self.routes: dict[str, Responder] = {
            path: factory(model) for path, factory in ROUTES.items()
        }
        self.routes["/v1/systemone"] = systemone(model, p_first, p_yes)
        for path, ref in (route_factories or {}).items():
            module, _, name = ref.partition(":")
            self.routes[path] = getattr(importlib.import_module(module), name)(model)
        self.routes.update(routes or {})
        self.batch = BatchServer(
            batch,
            {
                "openai": self.routes["/v1/chat/completions"],
                "anthropic": self.routes["/v1/messages"],
                "gemini": self.routes[GEMINI],
            },
            seed,
        )
        self.requests: list[tuple[float, dict]] = []
        self.headers: list[dict[str, str]] = []
        self.quota_at: float | None = None  # monotonic time the first quota 429 was written out
        self.counts: Counter[str] = Counter()
        self._arrived: Counter[bytes] = Counter()
        self._answered: Counter[bytes] = Counter()
        self._concurrent = 0
        self.first_arrival: float | None = (
            None  # time.monotonic() of the first request (a system-wide clock)
        )
        self.last_reply: float | None = None  # ... and of the last ok reply written out
        self._bucket_at = 0.0  # token bucket as a theoretical arrival time (GCRA)
        self.window_s = window_s
        self._let_in: deque[float] = (
            deque()
        )  # arrivals let in within the last window_s (window mode)
        self._seen: deque[float] = (
            deque()
        )  # every arrival within the last window_s (for window_peak)
        self.arrival_times: list[float] = []  # every arrival's time.monotonic() (window mode)
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ---- behaviour ------------------------------------------------------------------------------
    def _admit(self) -> float:
        """0 when the rate limit lets this request in (and counts it), else seconds until it
        would."""
        now = time.monotonic()
        if self.window_s:
            limit = self.rpm * self.window_s / 60
            self.arrival_times.append(now)
            for q in (self._let_in, self._seen):
                while q and q[0] <= now - self.window_s:
                    q.popleft()
            self._seen.append(now)
            self.counts["window_peak"] = max(self.counts["window_peak"], len(self._seen))
            if len(self._let_in) + 1 > limit + 1e-9:
                return self._let_in[0] + self.window_s - now
            self._let_in.append(now)
            return 0.0
        interval = 60.0 / self.rpm
        at = max(self._bucket_at, now)
        wait = at - now - (self.burst - 1) * interval
        if wait > 1e-9:
            return wait
        self._bucket_at = at + interval
        return 0.0

    def _rate_headers(self, wait: float | None) -> dict[str, str]:
        if not (self.rpm and self.rate_headers):
            return {}
        h = {"x-ratelimit-limit-requests": f"{self.rpm:g}"}
        if wait is not None:
            h |= {
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": f"{max(1, round(wait * 1000))}ms",
            }
        return h

    async def _reply(
        self,
        request: web.Request,
        key: bytes,
        body: bytes,
        status: int = 200,
        headers: dict[str, str] | None = None,
        kind: str = "ok",
    ) -> web.StreamResponse:
        """Write a reply out whole; count it as ``kind`` only if it was (else as ``aborted``)."""
        if self.date is not None:  # a server clock that stands still: replies a test can compute
            headers = (headers or {}) | {"Date": formatdate(self.date, usegmt=True)}
        resp = web.Response(
            body=body, status=status, content_type="application/json", headers=headers
        )
        try:
            await resp.prepare(request)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            self.counts["aborted"] += 1
            return resp
        self.counts[kind] += 1
        if kind == "ok":
            self._answered[key] += 1
            self.last_reply = time.monotonic()
        return resp

    async def _post(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith(
            ":batchGenerateContent"
        ):  # Gemini's batch create shares generateContent's route
            return await self.batch.create_gemini(request, request.match_info["name"].split(":")[0])
        self._concurrent += 1
        self.counts["peak_concurrency"] = max(self.counts["peak_concurrency"], self._concurrent)
        try:
            return await self._handle(request)
        finally:
            self._concurrent -= 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.first_arrival is None:
            self.first_arrival = time.monotonic()
        raw = await request.read()
        self.counts["arrivals"] += 1
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return await self._reply(
                request, b"", b'{"error": "request body is not JSON"}', 400, kind="fatal"
            )
        if self.record:
            self.requests.append((time.monotonic(), payload))
            self.headers.append(dict(request.headers))
        key = hashlib.sha256(raw).digest()
        self._arrived[key] += 1
        rng = random.Random(f"{self.seed}:{key.hex()}:{self._arrived[key]}")
        if self.rpm and (wait := self._admit()) > 0:
            headers = {"Retry-After": f"{wait:.3f}"} | self._rate_headers(wait)
            return await self._reply(
                request, key, b'{"error": "rate limit exceeded"}', 429, headers, "rate_limited"
            )
        if self.script:
            behaviour = self.script.popleft()
        elif self.faults is not None:
            behaviour = self.faults.draw(rng)
            if behaviour == "ok":
                behaviour = self.default
        else:
            behaviour = self.default
        kind, _, arg = behaviour.partition(":")
        route = (
            request.match_info.route.resource.canonical
            if request.match_info.route.resource
            else request.path
        )
        fmt = FORMATS.get(route, "openai")
        if kind == "quota":
            response = await self._reply(
                request, key, orjson.dumps(wire_formats.quota_body(fmt)), 429, kind="quota"
            )
            if self.quota_at is None:
                self.quota_at = time.monotonic()
            return response
        if kind == "huge":
            return await self._huge(request, int(arg))
        if kind == "unsupported":  # a 400 refusing the form of the request
            return await self._reply(
                request, key, orjson.dumps(wire_formats.unsupported_body(fmt)), 400, kind="fatal"
            )
        if kind == "noretry":  # a retryable status the provider says not to retry
            return await self._reply(
                request,
                key,
                orjson.dumps(wire_formats.error_body(fmt, int(arg))),
                int(arg),
                {"x-should-retry": "false"},
                kind="server_error",
            )
        if kind == "429":
            headers = _wait_headers(arg) | self._rate_headers(None)
            return await self._reply(
                request, key, b'{"error": "rate limited"}', 429, headers, "rate_limited"
            )
        if kind == "reset":
            self.counts["reset"] += 1
            sock = request.transport.get_extra_info("socket") if request.transport else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                request.transport.abort()
            return web.Response()
        if kind == "drop":
            self.counts["drop"] += 1
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        if kind == "hang":
            self.counts["hang"] += 1
            deadline = time.monotonic() + self.hang_s
            while (
                time.monotonic() < deadline
                and request.transport is not None
                and not request.transport.is_closing()
            ):
                await asyncio.sleep(0.02)
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        delay = float(arg) if kind == "sleep" else _latency(self.latency, rng)
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == "5xx" or kind.isdigit():
            status = rng.choice((500, 502, 503)) if kind == "5xx" else int(kind)
            return await self._reply(
                request,
                key,
                orjson.dumps(wire_formats.error_body(fmt, status)),
                status,
                kind="server_error" if status >= 500 else "fatal",
            )
        responder = self.routes.get(route)
        if responder is None:
            return await self._reply(request, key, b'{"error": "no such route"}', 404, kind="fatal")
        try:
            answer = responder(payload)
        except (
            wire_formats.Refused
        ) as refused:  # the provider refuses this request (its status and error body)
            return await self._reply(
                request, key, orjson.dumps(refused.body), refused.status, kind="fatal"
            )
        reply = orjson.dumps(answer)
        if kind in ("error200", "duplicate", "nan"):
            body = {
                "error200": lambda: orjson.dumps(wire_formats.error_in_200(fmt, answer)),
                "duplicate": lambda: wire_formats.duplicate_key(fmt, answer),
                "nan": lambda: wire_formats.with_nan(fmt, answer),
            }[kind]()
            return await self._reply(request, key, body, kind=kind)
        if kind in ("gzip", "gzip_cut"):
            packed = gzip_members(reply, int(arg or 1))
            return await self._reply(
                request,
                key,
                packed[:-8] if kind == "gzip_cut" else packed,
                headers={"Content-Encoding": "gzip"},
                kind=kind,
            )
        if kind == "malformed":
            body = rng.choice(
                (b"<html><body>502 upstream error</body></html>", reply[: len(reply) // 2])
            )
            return await self._reply(request, key, body, kind="malformed")
        if kind not in ("ok", "sleep"):
            raise ValueError(f"unknown behaviour {behaviour!r}")
        return await self._reply(request, key, reply, headers=self._rate_headers(None) or None)

    async def _huge(self, request: web.Request, size: int) -> web.StreamResponse:
        """A JSON reply of ``size`` bytes (a long string field), written in 64 KiB chunks."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        head, tail = b'{"padding": "', b'"}'
        chunk = b"x" * (64 << 10)
        try:
            await resp.prepare(request)
            await resp.write(head)
            left = size - len(head) - len(tail)
            while left > 0:
                await resp.write(chunk[:left])
                left -= len(chunk)
            await resp.write(tail)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            self.counts["aborted"] += 1
            return resp
        self.counts["huge"] += 1
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        declared = {"question_types": list(self.question_types)} if self.question_types else {}
        return web.json_response(
            {"status": "ok"} | ({"model": self.model} if self.model else {}) | declared
        )

    def stats(self) -> dict[str, int]:
        """The counters (see the module docstring)."""
        out = {
            k: 0
            for k in (
                "arrivals",
                "ok",
                "aborted",
                "rate_limited",
                "server_error",
                "hang",
                "reset",
                "drop",
                "malformed",
                "fatal",
                "peak_concurrency",
            )
        }
        out.update(self.counts)
        out["keys_ok"] = len(self._answered)
        out["duplicates"] = sum(n - 1 for n in self._answered.values())
        out["first_arrival"], out["last_reply"] = self.first_arrival, self.last_reply
        out.update(self.batch.stats())
        return out

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    # ---- lifecycle ------------------------------------------------------------------------------
    async def __aenter__(self) -> FakeProvider:
        await self.start()
        return self

    async def start(self, port: int = 0) -> None:
        app = web.Application(client_max_size=1 << 30)
        self.batch.add_routes(app)
        for path in self.routes:
            app.router.add_post(path, self._post)
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, backlog=1024)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.batch.url = self.url

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class InProcess(SystemOne):
    """A System One adapter answered by ``systemone(model)`` in-process, without HTTP: the runner's
    own cost, for benchmarks of a million requests (``InProcess(ModelSpec("systemone", "m"))``)."""

    own_timeout = True  # answers at once

    async def start(self) -> None:
        self._respond = systemone(self.model or "fake-decider", None, None)

    async def close(self) -> None:
        return None

    async def send(self, request: Request) -> bytes:
        return orjson.dumps(self._respond(orjson.loads(request.body)))


@dataclass
class Served:
    """A provider running in its own process: ``url``, ``stats()`` (over HTTP), ``process``."""

    url: str
    process: subprocess.Popen
    config: dict = field(default_factory=dict)

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as resp:  # 127.0.0.1 only
            return orjson.loads(resp.read())


@contextlib.contextmanager
def serve(port: int = 0, **config: object) -> Iterator[Served]:
    """Run ``FakeProvider(**config)`` in its own process (JSON-able options only; plug wire formats
    in with ``route_factories={path: "module:factory"}``) on ``port`` (0: a free one) and stop it on
    exit (if it is still running: a test may kill it, and serve again on the same port)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.fake_provider",
            "--config",
            orjson.dumps(config).decode(),
            "--port",
            str(port),
            "--until-stdin-closes",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=root,
        env=env,
    )
    try:
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"the fake provider did not start (said {line!r})")
        yield Served(line, proc, dict(config))
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _main(config: dict, port: int, until_stdin_closes: bool) -> None:
    server = FakeProvider(**config)
    await server.start(port)
    print(server.url, flush=True)
    if until_stdin_closes:  # a child of ``serve``: dies with its parent
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    else:  # until Ctrl-C or SIGTERM
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
    await server.__aexit__()


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m tests.fakes.fake_provider", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--config", default="{}", help="FakeProvider options as JSON")
    p.add_argument("--port", type=int, default=0)
    p.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="PATH=module:factory",
        help="serve another wire format at PATH",
    )
    p.add_argument(
        "--until-stdin-closes",
        action="store_true",
        help="stop when standard input closes (how tests run it); default: until Ctrl-C or SIGTERM",
    )
    args = p.parse_args()
    config = orjson.loads(args.config)
    for item in args.route:
        path, _, ref = item.partition("=")
        config.setdefault("route_factories", {})[path] = ref
    import uvloop

    uvloop.run(_main(config, args.port, args.until_stdin_closes))


if __name__ == "__main__":
    main()
