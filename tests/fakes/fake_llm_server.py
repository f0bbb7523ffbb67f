"""A scriptable fake of the language-model and OpenAI Decisions APIs on 127.0.0.1: real HTTP, the
pure responders of ``tests/fakes/wire_formats.py``, injected faults.

Routes (one server speaks every format; the path picks it): ``POST /v1/chat/completions`` (OpenAI),
``POST /v1/messages`` (Anthropic), ``POST /v1beta/models/{model}:generateContent`` (Gemini; the
model from the path, so a retired one is rerouted), ``POST /v1/decisions`` (OpenAI Decisions),
``POST /v1beta/decisions`` (the Gemini Decisions API). A request the responder refuses
(``wire_formats.Refused``) is answered with its status and error body. Each POST takes the next
behaviour from ``script`` (then ``default``):

* a responder mode (``"ok"``, ``"fenced"``, ``"refusal"``, ... see ``tests/fakes/wire_formats.py``):
  200 with that reply;
* ``"429"`` / ``"429:<seconds>"`` (or any status): rate limited, with ``Retry-After`` when given;
  ``"429body:<seconds>"``: the wait only in the error body (Gemini ``RetryInfo``); ``"529"``,
  ``"500"``, ``"503"``, ``"400"``, ``"401"``: that status with the format's error body;
  ``"429limit:N"``: a 429 with ``Retry-After: 0`` stating ``x-ratelimit-limit-requests: N``;
* ``"malformed"``: 200 with a body that is not JSON; ``"drop"``: the connection closed without a
  reply;
* ``"echo401"``: 401 whose message quotes the key the request carried, as providers do;
* ``"redirect:URL"`` (``"redirect301:URL"``, ``302``, ``308``): a 307 (or that status) whose
  ``Location`` is URL followed by the request's path and query, as a server moved elsewhere;
* ``"nousage"`` (Chat Completions): the ok reply without its ``usage`` (whole, or streamed without
  the usage chunk), as a server that reports none;
* ``"usage:N"`` (Chat Completions, not streamed): the ok reply whose ``usage`` states N (JSON:
  ``1000000000000``, ``-5``, ``1.5``, ``"12"``, ``null``) input and output tokens, as a broken or
  hostile server might (``"usage:[IN,OUT]"``: IN input and OUT output tokens);
* ``"usageof:JSON"`` (Chat Completions, Messages, generateContent; whole or streamed): the ok reply
  whose usage block (``usage``, Gemini's ``usageMetadata``) is the JSON object given, as a broken or
  hostile server might state it (``{"prompt_tokens": 10, "completion_tokens": 0,
  "prompt_tokens_details": {"cached_tokens": 900}}``);
* ``"error200of:JSON"`` (Chat Completions, not streamed): the ok reply with its choice's
  ``finish_reason`` ``"error"`` and an ``error`` object (OpenRouter's error mid-generation), its
  ``usage`` the JSON object given (``null``: none);
* ``"echobig:N"``: 200 (``text/event-stream`` when streamed, else JSON): N bytes of ``x``, the key
  the request carried, then 5 MiB of ``y`` (a reply too large, with the key across where it is cut);
* ``"bomb:N"``: 200, ``text/event-stream`` in ``Content-Encoding: gzip``, N MiB of blank lines
  (a gzip bomb: about N KiB on the wire), sent in one write;
* ``"nostreamopt"`` (Chat Completions): a 400 refusing ``stream_options`` when the request carries
  it (``"param": "stream_options"``, ``"code": null``, as OpenAI-compatible servers answer;
  ``"nostreamopt:coded"``: ``"code": "unsupported_parameter"``, as OpenAI's), else the ok reply.

A streamed request (``"stream": true``, or Gemini's ``:streamGenerateContent``) is answered with the
reply's server-sent events (``tests/fakes/sse_streams.py``: each text in ``pieces`` pieces,
``pace_s`` seconds between two events), or with a stream fault: ``"cut:N"`` (the connection closed
after N events), ``"stall:S"`` (S seconds of silence after the first two events, then the rest),
``"slow:T"`` (T seconds between events), ``"error_event"`` (the provider's error event after the
first event), ``"error_first"`` (the error event and nothing else). ``"delay:S"``: the reply (mode
ok, streamed or not) after S seconds of silence.

``requests`` records ``(path, parsed body)`` of every POST, ``times`` their arrival
(``time.monotonic()``), ``headers`` their headers. ``auth`` (optional) decides from a request's
headers whether its key or token is accepted; a refused one is answered 401 quoting the credential
sent, as providers do (before any behaviour).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import deque
from collections.abc import Callable
from functools import partial

import orjson
from aiohttp import web

from . import sse_streams
from .wire_formats import (
    Refused,
    anthropic_messages,
    error_body,
    gemini_decisions,
    gemini_generate,
    openai_chat,
    openai_decisions,
)


def _refusing(param: str, code: str | None, said: str) -> dict:
    """An OpenAI error body refusing the request field ``param`` (``error.param``), with
    ``code``."""
    return {
        "error": {
            "message": said + param,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }


class FakeLLM:
    def __init__(
        self,
        script: list[str] | None = None,
        default: str = "ok",
        auth: Callable[[dict[str, str]], bool] | None = None,
    ):
        self.script = deque(script or [])
        self.default = default
        self.auth = auth
        self.requests: list[tuple[str, dict]] = []
        self.times: list[float] = []
        self.headers: list[dict[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.pieces = 3
        self.pace_s = 0.0
        self.streamed: list[bool] = []  # per POST: answered with a stream

    async def _handle(self, request: web.Request, fmt: str) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        self.requests.append((request.path, payload))
        self.times.append(time.monotonic())
        self.headers.append(dict(request.headers))
        if self.auth is not None and not self.auth(dict(request.headers)):
            sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
            return web.json_response(
                error_body(fmt, 401, message=f"Incorrect API key provided: {sent}"), status=401
            )
        behaviour = self.script.popleft() if self.script else self.default
        kind, _, arg = behaviour.partition(":")
        stream = payload.get("stream") is True if isinstance(payload, dict) else False
        if fmt == "gemini":
            stream = request.match_info["name"].endswith(":streamGenerateContent")
        self.streamed.append(stream)
        if kind == "delay":  # the reply (mode ok) after S seconds of silence
            await asyncio.sleep(float(arg))
            kind = "ok"
        if stream and kind in ("cut", "stall", "slow", "error_event", "error_first"):
            return await self._stream(request, payload, fmt, "ok", kind, arg)
        if kind.startswith("redirect"):
            status = int(kind.removeprefix("redirect") or 307)
            location = arg + request.path_qs
            return web.Response(status=status, headers={"Location": location})
        if kind == "429limit":
            headers = {"Retry-After": "0", "x-ratelimit-limit-requests": arg}
            return web.json_response(error_body(fmt, 429), status=429, headers=headers)
        if kind.isdigit():
            status = int(kind)
            headers = {"Retry-After": arg} if arg else {}
            return web.json_response(error_body(fmt, status), status=status, headers=headers)
        if kind == "echo401":  # as providers do: "Incorrect API key provided: <the key>"
            sent = " ".join(
                v
                for k, v in request.headers.items()
                if k.lower() in ("authorization", "x-api-key", "x-goog-api-key")
            )
            return web.json_response(
                error_body(fmt, 401, message=f"Incorrect API key provided: {sent}"), status=401
            )
        if kind == "nostreamopt":
            if "stream_options" not in payload:
                kind = "ok"
            else:
                code = "unsupported_parameter" if arg == "coded" else None
                return web.json_response(
                    _refusing("stream_options", code, "Unrecognized request argument supplied: "),
                    status=400,
                )
        if kind == "nousage" and fmt == "openai":
            reply = openai_chat(payload, "ok")
            del reply["usage"]
            if not stream:
                return web.json_response(reply)
            return await self._send(request, sse_streams.openai_events(reply, self.pieces))
        if kind == "usage" and fmt == "openai":
            reply = openai_chat(payload, "ok")
            count = orjson.loads(arg)
            given = count if isinstance(count, list) and len(count) == 2 else [count, count]
            reply["usage"] = {"prompt_tokens": given[0], "completion_tokens": given[1]}
            return web.Response(body=orjson.dumps(reply), content_type="application/json")
        if kind == "usageof" and fmt in ("openai", "anthropic", "gemini"):
            name = request.match_info.get("name", "").partition(":")[0]
            reply = (
                openai_chat(payload, "ok")
                if fmt == "openai"
                else anthropic_messages(payload, "ok")
                if fmt == "anthropic"
                else gemini_generate(payload, "ok", name)
            )
            reply["usageMetadata" if fmt == "gemini" else "usage"] = orjson.loads(arg)
            if not stream:
                return web.json_response(reply)
            events = (
                sse_streams.openai_events
                if fmt == "openai"
                else sse_streams.anthropic_events
                if fmt == "anthropic"
                else sse_streams.gemini_events
            )
            return await self._send(request, events(reply, self.pieces))
        if kind == "error200of" and fmt == "openai":
            reply = openai_chat(payload, "ok")
            reply["choices"][0] |= {"finish_reason": "error", "error": {"message": "upstream died"}}
            reply["usage"] = orjson.loads(arg)
            if reply["usage"] is None:
                del reply["usage"]
            return web.json_response(reply)
        if kind == "echobig":
            sent = request.headers.get("x-api-key") or request.headers.get("Authorization", "")
            body = b"x" * int(arg) + sent.removeprefix("Bearer ").encode() + b"y" * (5 << 20)
            kind_ = "text/event-stream" if stream else "application/json"
            return web.Response(body=body, content_type=kind_)
        if kind == "bomb":
            packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
            mib = b"\n" * (1 << 20)
            bomb = b"".join(packer.compress(mib) for _ in range(int(arg))) + packer.flush()
            headers = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
            return web.Response(body=bomb, headers=headers)
        if kind == "429body":
            return web.json_response(error_body(fmt, 429, float(arg)), status=429)
        if kind == "malformed":
            return web.Response(body=b"<html>502 upstream error</html>", content_type="text/html")
        if kind == "drop":
            request.transport.close()
            return web.Response()
        if stream and fmt in ("openai", "anthropic", "gemini"):
            try:
                return await self._stream(request, payload, fmt, kind)
            except Refused as refused:
                return web.json_response(refused.body, status=refused.status)
        try:
            if fmt == "openai":
                return web.json_response(openai_chat(payload, kind))
            if fmt == "anthropic":
                return web.json_response(anthropic_messages(payload, kind))
            if fmt == "gemini":
                model = request.match_info["name"].removesuffix(":generateContent")
                return web.json_response(gemini_generate(payload, kind, model))
            if fmt == "gemini-decisions":
                return web.json_response(gemini_decisions(payload, kind))
            return web.json_response(openai_decisions(payload, kind))
        except Refused as refused:
            return web.json_response(refused.body, status=refused.status)

    async def _stream(
        self,
        request: web.Request,
        payload: dict,
        fmt: str,
        mode: str,
        fault: str = "",
        arg: str = "",
    ) -> web.StreamResponse:
        """The reply to ``payload`` in ``mode`` as server-sent events, with the stream ``fault``
        (``arg``)."""
        if fmt == "openai":
            events = sse_streams.openai_events(openai_chat(payload, mode), self.pieces)
        elif fmt == "anthropic":
            events = sse_streams.anthropic_events(anthropic_messages(payload, mode), self.pieces)
        else:
            model = request.match_info["name"].removesuffix(":streamGenerateContent")
            events = sse_streams.gemini_events(gemini_generate(payload, mode, model), self.pieces)
        if fault == "error_first":
            events = [sse_streams.error_event(fmt)]
        elif fault == "error_event":
            events = [events[0], sse_streams.error_event(fmt)]
        return await self._send(request, events, fault, arg)

    async def _send(
        self, request: web.Request, events: list[bytes], fault: str = "", arg: str = ""
    ) -> web.StreamResponse:
        """The server-sent ``events``, with the stream ``fault`` (``arg``)."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        pace = float(arg) if fault == "slow" else self.pace_s
        for n, event in enumerate(events):
            if fault == "cut" and n == int(arg):
                request.transport.close()  # mid-way: no end of the chunked body
                return response
            if fault == "stall" and n == 2:
                await asyncio.sleep(float(arg))
            elif n and pace:
                await asyncio.sleep(pace)
            await response.write(event)
        await response.write_eof()
        return response

    async def __aenter__(self) -> FakeLLM:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", partial(self._handle, fmt="openai"))
        app.router.add_post("/v1/messages", partial(self._handle, fmt="anthropic"))
        app.router.add_post("/v1beta/models/{name}", partial(self._handle, fmt="gemini"))
        app.router.add_post("/v1/decisions", partial(self._handle, fmt="openai-decisions"))
        app.router.add_post("/v1beta/decisions", partial(self._handle, fmt="gemini-decisions"))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def base_url(self, kind: str) -> str:
        """The base URL a model string of adapter ``kind`` needs to reach this server."""
        return self.url + ("/v1" if kind in ("openai", "logprobs", "openai-decisions") else "")
