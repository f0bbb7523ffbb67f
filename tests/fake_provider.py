"""A scriptable System One server on 127.0.0.1 for tests: real HTTP, injected faults.

Each POST to ``/v1/systemone`` takes the next behaviour from ``script`` (then ``default``):

* ``"ok"``: a valid reply; each choice puts probability ``p_first`` on the first option and spreads the
  rest evenly; each yes/no question answers P(yes) = ``p_yes``;
* ``"429"`` / ``"429:<seconds>"``: rate limited, with ``Retry-After: <seconds>`` when given;
* ``"500"``, ``"503"``, ``"400"``, ``"401"``, ``"422"``: that status with a small JSON error body;
* ``"malformed"``: 200 with a body that is not JSON;
* ``"sleep:<seconds>"``: wait, then reply ok (for timeouts);
* ``"drop"``: close the connection without a reply.

``requests`` records every body received with its arrival time (``time.monotonic()``).
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

import orjson
from aiohttp import web


class FakeSystemOne:
    def __init__(self, script: list[str] | None = None, default: str = "ok", model: str = "fake-decider",
                 p_first: float = 0.7, p_yes: float = 0.8):
        self.script = deque(script or [])
        self.default, self.model, self.p_first, self.p_yes = default, model, p_first, p_yes
        self.requests: list[tuple[float, dict]] = []
        self.headers: list[dict[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    def answer(self, payload: dict) -> dict:
        answers = {}
        for name, q in payload["questions"].items():
            if q["type"] == "choice":
                options = list(q["criteria"])
                rest = round((1 - self.p_first) / (len(options) - 1), 4)
                probs = {o: (self.p_first if i == 0 else rest) for i, o in enumerate(options)}
                answers[name] = {"type": "choice", "choice": options[0], "probabilities": probs, "confidence": 0.5}
            else:
                answers[name] = {"type": "noul", "noul": self.p_yes}
        return {"model": self.model, "answers": answers, "usage": {"input_tokens": 10, "output_tokens": 1},
                "latency_ms": 1.0}

    async def _post(self, request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        self.requests.append((time.monotonic(), payload))
        self.headers.append(dict(request.headers))
        behaviour = self.script.popleft() if self.script else self.default
        kind, _, arg = behaviour.partition(":")
        if kind == "ok":
            return web.json_response(self.answer(payload))
        if kind == "429":
            headers = {"Retry-After": arg} if arg else {}
            return web.json_response({"error": "rate limited"}, status=429, headers=headers)
        if kind.isdigit():
            return web.json_response({"error": f"injected {kind}"}, status=int(kind))
        if kind == "malformed":
            return web.Response(body=b"<html>upstream error", content_type="text/html")
        if kind == "sleep":
            await asyncio.sleep(float(arg))
            return web.json_response(self.answer(payload))
        if kind == "drop":
            request.transport.close()
            return web.Response()
        raise ValueError(f"unknown behaviour {behaviour!r}")

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": self.model})

    async def __aenter__(self) -> FakeSystemOne:
        app = web.Application()
        app.router.add_post("/v1/systemone", self._post)
        app.router.add_get("/health", self._get)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
