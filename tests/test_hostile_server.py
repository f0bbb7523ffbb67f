"""The runner against a provider's server that is hostile or broken, on real HTTP on 127.0.0.1
(``tests/fakes/fake_llm_server.py``): what it must never do (send the key to another address) and
what it must always do (stop, and say so clearly)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from dxi.adapters.errors import ProviderStop
from dxi.adapters.http import error_for

from .fakes.fake_llm_server import FakeLLM
from .helpers.runs import FAST, run_model

NAMES = {"openai": "gpt-fake", "anthropic": "claude-fake", "gemini": "gemini-fake"}
KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
PATHS = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "gemini": "/v1beta/models/gemini-fake:generateContent",
}
STREAM_PATHS = PATHS | {"gemini": "/v1beta/models/gemini-fake:streamGenerateContent?alt=sse"}


@contextlib.asynccontextmanager
async def served(method: str, path: str, handler: Callable[..., Awaitable]) -> AsyncIterator[str]:
    """One aiohttp ``handler`` for ``method`` ``path`` on 127.0.0.1 (a port of its own): yields
    its base URL ``http://127.0.0.1:PORT``; stopped on leaving."""
    from aiohttp import web

    app = web.Application()
    app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("stream", ["never", "always"])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_a_redirect_is_never_followed_and_stops_the_provider_naming_its_target(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    status: int,
    stream: str,
):
    """A server that redirects elsewhere (another port: another origin) is not followed: aiohttp
    drops ``Authorization`` on a cross-origin redirect but sends ``x-api-key`` and
    ``x-goog-api-key`` on, so following would hand the Anthropic and Gemini keys to the other
    address. Nothing reaches it; the provider stops (cause ``redirected``), naming the target."""
    secret = "sk-test-key-never-sent-elsewhere-42"
    monkeypatch.setenv(KEY_ENV[kind], secret)
    limiters: dict = {}
    async with FakeLLM() as elsewhere:
        async with FakeLLM(default=f"redirect{status}:{elsewhere.url}") as server:
            base = server.url + ("/v1" if kind == "openai" else "")
            _, stats, rows = await run_model(
                f"{kind}:{NAMES[kind]}@{base}",
                data_dir,
                tmp_path / "c",
                limits=replace(FAST, stream=stream),
                limiters=limiters,
            )
    assert (len(elsewhere.requests), len(server.requests)) == (0, 1)
    assert (stats.refused, stats.attempts, rows.height) == (1, 1, 0)
    (limiter,) = limiters.values()
    path = (STREAM_PATHS if stream == "always" else PATHS)[kind]
    assert (limiter.halted.cause, limiter.halted.status) == ("redirected", status)
    assert str(limiter.halted) == (
        f"{kind}:{NAMES[kind]}: HTTP {status}: the server redirects to {elsewhere.url}{path}; not "
        "followed (a request, and its API key, is only sent to the base URL named); if that "
        "address is the API's, name it as the base URL"
    )


def test_a_redirect_target_that_carries_the_key_is_redacted():
    secret = "sk-test-key-in-the-location-42"
    error = error_for(
        302,
        b"",
        {"location": f"http://127.0.0.1:1/v1?key={secret}"},
        "m",
        secrets=(secret.encode(),),
    )
    assert (type(error), error.cause, error.status) == (ProviderStop, "redirected", 302)
    assert str(error) == (
        "m: HTTP 302: the server redirects to http://127.0.0.1:1/v1?key=[REDACTED]; not followed "
        "(a request, and its API key, is only sent to the base URL named); if that address is "
        "the API's, name it as the base URL"
    )


async def test_a_batch_never_sends_the_key_to_an_address_the_provider_names_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A batch's results URL (Anthropic ``results_url``) and upload URL (Gemini
    ``X-Goog-Upload-URL``) come from the provider's replies: one at another address is never sent
    the key. Anthropic's results are read at the documented path on the base URL instead; a Gemini
    upload URL elsewhere stops the provider (cause ``redirected``), naming it."""
    from aiohttp import web

    from dxi import adapters
    from dxi.adapters.anthropic_batch import AnthropicBatch
    from dxi.adapters.batches import BatchStatus
    from dxi.adapters.gemini_batch import GeminiBatch

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-never-elsewhere-42")
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-never-elsewhere-42")
    seen: list[tuple[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.host, request.path))
        if request.path.startswith("/upload/"):
            upload = f"{elsewhere}/upload/v1beta/files?upload_id=1"
            return web.Response(headers={"X-Goog-Upload-URL": upload})
        return web.Response(body=b'{"custom_id": "k", "result": {"type": "canceled"}}\n')

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runners = [web.AppRunner(app), web.AppRunner(app)]
    ports = []
    for runner in runners:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ports.append(runner.addresses[0][1])
    base, elsewhere = (f"http://127.0.0.1:{p}" for p in ports)
    anthropic = adapters.get(f"anthropic:claude-fake@{base}")
    gemini = adapters.get(f"gemini:gemini-fake@{base}")
    file = tmp_path / "in.jsonl"
    file.write_bytes(b"{}\n")
    try:
        await anthropic.start()
        await gemini.start()
        status = BatchStatus("b1", "ended", output={"results_url": f"{elsewhere}/results/b1"})
        lines = [
            line async for group in AnthropicBatch(anthropic).results(status) for line in group
        ]
        with pytest.raises(ProviderStop) as stop:
            await GeminiBatch(gemini).upload("e1", file, 1, 3)
    finally:
        await anthropic.close()
        await gemini.close()
        for runner in runners:
            await runner.cleanup()
    assert [line.key for line in lines] == ["k"]
    assert seen == [
        (f"127.0.0.1:{ports[0]}", "/v1/messages/batches/b1/results"),
        (f"127.0.0.1:{ports[0]}", "/upload/v1beta/files"),
    ]
    assert stop.value.cause == "redirected"
    assert str(stop.value) == (
        f"gemini:gemini-fake (batch): the upload URL: HTTP 200: the server redirects to "
        f"{elsewhere}/upload/v1beta/files?upload_id=1; not followed (a request, and its API key, is "
        "only sent to the base URL named); if that address is the API's, name it as the base URL"
    )


@pytest.mark.parametrize("count", [10**12, 2**64 - 1])
async def test_usage_no_request_could_have_used_is_not_kept_and_its_cost_is_unknown(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
):
    """A server that reports more tokens than a request can hold (input: more than its body's bytes;
    output: past its own cap) is not believed: the usage is not kept (the cost is unknown, charged
    at most its reservation, as a reply without usage) rather than recording $80,000,000 for two
    requests; 2**64 - 1 tokens no longer crash the cache (a 64-bit column)."""
    import asyncio

    import orjson
    import polars as pl

    from dxi.runner.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    cache, out = tmp_path / "cache", tmp_path / "out"
    async with FakeLLM(default=f"usage:{count}") as server:
        argv = ["run", "--model", f"openai:gpt-fake@{server.url}/v1", "--evals", "when2call"]
        argv += ["--limit", "2", "--max-cost", "1", "--price", "openai:gpt-fake=10/30"]
        argv += ["--param", "max_completion_tokens=100", "--data-dir", str(data_dir)]
        argv += ["--cache-dir", str(cache), "--out", str(out), "-q"]
        assert await asyncio.to_thread(main, argv) == 0
        sizes = [len(orjson.dumps(body)) for _, body in server.requests]
    (model,) = orjson.loads((out / "summary.json").read_bytes())["models"]
    requests = model["requests"]
    reserved = sum(size * 10 + 100 * 30 for size in sizes) / 1e6  # input bound, output cap: USD
    assert (requests["sent"], requests["input_tokens"], requests["output_tokens"]) == (2, 0, 0)
    assert requests["cost_usd"] == requests["cost_at_reservation_usd"] == pytest.approx(reserved)
    rows = pl.read_parquet(next(cache.rglob("*.parquet")))
    assert rows.select("status", "input_tokens", "output_tokens").rows() == [("ok", None, None)] * 2


async def test_an_uncapped_output_count_past_what_any_model_writes_is_not_kept(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """Nothing caps the output (no ``max_completion_tokens``, no ``--max-cost``) and the server
    states 10 input and 10**9 output tokens per reply, below 2**63: more than any model writes in
    one reply (``MAX_REPLY_OUTPUT``, 1,048,576). Expected, by hand: the usage is not kept (the old
    code: $60,000.0002 for the two replies, at $30 per million output tokens), the cost is unknown
    with no upper bound (``cost_usd`` null, ``cost_reason`` for 2 requests), warned of once.
    The same with 1,048,576 output tokens is believed: $62.91476 for the two."""
    import asyncio
    import logging

    import orjson

    from dxi.runner.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    for output, cache in ((10**9, "absurd"), (1_048_576, "largest")):
        out = tmp_path / f"out-{cache}"
        async with FakeLLM(default=f"usage:[10,{output}]") as server:
            argv = ["run", "--model", f"openai:gpt-fake@{server.url}/v1", "--evals", "when2call"]
            argv += [
                "--limit",
                "2",
                "--price",
                "openai:gpt-fake=10/30",
                "--data-dir",
                str(data_dir),
            ]
            argv += ["--cache-dir", str(tmp_path / cache), "--out", str(out), "-q"]
            with caplog.at_level(logging.WARNING, "dxi.cost"):
                assert await asyncio.to_thread(main, argv) == 0
        (model,) = orjson.loads((out / "summary.json").read_bytes())["models"]
        requests = model["requests"]
        if output == 10**9:
            assert (requests["input_tokens"], requests["output_tokens"]) == (0, 0)
            assert requests["cost_usd"] is None
            assert requests["cost_reason"].startswith("the cost of 2 request(s) is unknown")
            warned = [r.getMessage() for r in caplog.records if "not credible" in r.getMessage()]
            assert (
                warned
                == [
                    "openai:gpt-fake: a reply's usage is not credible (output_tokens 1000000000 > "
                    "1,048,576, more than any provider's model writes in one reply (nothing caps this "
                    "request's output)): not kept, its cost is unknown"
                ]  # once per model (runner.sending.cost._warn), not once a reply
            )
        else:
            assert (requests["input_tokens"], requests["output_tokens"]) == (20, 2 * 1_048_576)
            assert requests["cost_usd"] == round((20 * 10 + 2 * 1_048_576 * 30) / 1e6, 6)


async def test_a_streamed_gzip_bomb_is_decoded_no_further_than_the_reply_bound(
    data_dir: Path, tmp_path: Path
):
    """256 MiB of blank lines gzipped (about 250 KiB on the wire) as a streamed reply: each piece
    read is decoded no further than ``--max-reply-bytes`` leaves, so memory stays within the bound
    (here 1 MiB) rather than a piece's whole expansion (a 64 KiB piece is 64 MiB decoded); the reply
    is stored invalid, "reply larger than 1048576 bytes"."""
    import tracemalloc

    limits = replace(FAST, stream="always", max_reply_bytes=1 << 20, max_attempts=1)
    async with FakeLLM(default="bomb:256") as server:
        tracemalloc.start()
        try:
            _, stats, rows = await run_model(
                f"openai:gpt-fake@{server.url}/v1", data_dir, tmp_path / "c", limits=limits
            )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (stats.attempts, rows["status"].to_list()) == (1, ["invalid"])
    (answer, *_) = rows["answers"].to_list()[0]
    assert answer["error"] == "reply larger than 1048576 bytes"
    assert peak < 16 << 20, peak


@pytest.mark.parametrize(
    ("retry_after", "resets_at"),
    [
        ("99999999999999999999999999999999", None),
        ("Fri, 31 Dec 9999 23:59:59 GMT", "9999-12-31T23:59:59Z"),
    ],
)
async def test_a_retry_after_past_any_date_stops_the_provider_without_a_crash(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_after: str, resets_at
):
    """``Retry-After: 1e32`` seconds (delay-seconds, any length of digits) or the last HTTP date
    there is: a wait longer than ``--max-stated-wait``, so the provider stops (exit 6, cause ``wait
    too long``), at once and without waiting; a wait past any date a clock can write has no
    ``resets_at`` (it crashed writing one, exit 70, no summary)."""
    import asyncio

    import orjson

    from dxi.runner.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    async with FakeLLM(default=f"429:{retry_after}") as server:
        argv = ["run", "--model", f"openai:gpt-fake@{server.url}/v1", "--evals", "when2call"]
        argv += ["--limit", "1", "--data-dir", str(data_dir), "-q"]
        argv += ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o")]
        assert await asyncio.to_thread(main, argv) == 6
        assert len(server.requests) == 1
    (stop,) = orjson.loads((tmp_path / "o" / "summary.json").read_bytes())["stopped_providers"]
    assert (stop["cause"], stop["http_status"], stop["resets_at"]) == (
        "wait too long",
        429,
        resets_at,
    )


@pytest.mark.parametrize("stream", ["never", "always"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_key_across_the_cut_of_a_reply_too_large_is_redacted(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, stream: str
):
    """A reply too large is kept as its first 2000 bytes: a server that echoes the key at byte 1990
    had its first 10 bytes kept in the cache (``x``*1990 + ``sk-test-ke``), as near the cut as it
    likes (all but the key's last byte); the part before the cut is redacted too."""
    secret = "sk-test-key-across-the-cut-42"
    monkeypatch.setenv(KEY_ENV[kind], secret)
    limits = replace(FAST, stream=stream, max_reply_bytes=1 << 20, max_attempts=1)
    async with FakeLLM(default="echobig:1990") as server:
        base = server.url + ("/v1" if kind == "openai" else "")
        _, _, rows = await run_model(
            f"{kind}:{NAMES[kind]}@{base}", data_dir, tmp_path / "c", limits=limits
        )
    assert rows["status"].to_list() == ["invalid"]
    assert rows["raw_reply"].to_list() == ["x" * 1990 + "[REDACTED]"]
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file():
            assert secret[:4].encode() not in path.read_bytes()


async def test_a_stated_limit_that_would_pace_past_the_longest_wait_stops_the_provider(
    data_dir: Path, tmp_path: Path
):
    """A 429 stating ``x-ratelimit-limit-requests: 0.001`` (one request every 60,000 s) made the
    pacing wait 16 hours before each next request: the run hung. A limit whose pace passes
    ``--max-stated-wait`` stops the provider (cause ``wait too long``), as a longer stated wait
    does; the other requests are not sent (the next run sends them)."""
    import asyncio

    limiters: dict = {}
    limits = replace(FAST, max_in_flight=1)
    async with FakeLLM(script=["429limit:0.001"]) as server:
        async with asyncio.timeout(20):
            _, stats, rows = await run_model(
                f"openai:gpt-fake@{server.url}/v1",
                data_dir,
                tmp_path / "c",
                limits=limits,
                limit=3,
                limiters=limiters,
            )
    assert (len(server.requests), stats.refused, rows.height) == (1, 1, 0)
    (limiter,) = limiters.values()
    assert limiter.halted.cause == "wait too long"
    assert str(limiter.halted).endswith(
        " (the provider states a limit of 0.001 requests per minute: one request every 60000 s, longer "
        "than the 600 s the run waits: --max-stated-wait)"
    )


def test_a_stated_token_limit_stops_the_provider_when_one_request_would_wait_too_long():
    """``x-ratelimit-limit-tokens: 10`` with a request of about 2,000 tokens: 12,000 s for each;
    a stop. ``rpm`` 1 (60 s a request) is within ``--max-stated-wait`` 600: honoured, no stop."""
    from dxi.adapters.errors import RateLimited
    from dxi.runner.sending.retry import reclassify

    slow = RateLimited("m: HTTP 429", 0.0, tpm=10)
    stop = reclassify(slow, 600.0, model_answered=True, tokens=2000)
    assert (type(stop), stop.cause) == (ProviderStop, "wait too long")
    assert str(stop) == (
        "m: HTTP 429 (the provider states a limit of 10 tokens per minute: one request every "
        "12000 s, longer than the 600 s the run waits: --max-stated-wait)"
    )
    fine = RateLimited("m: HTTP 429", 0.0, rpm=1, tpm=1_000_000)
    assert reclassify(fine, 600.0, model_answered=True, tokens=2000) is fine


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pw-secret-42@127.0.0.1:1/v1",
        "https://127.0.0.1:1/v1beta?key=pw-secret-42",
        "http://127.0.0.1:1/v1#pw-secret-42",
        "http://127.0.0.1:1/v1;key=pw-secret-42",
        "http://127.0.0.1:1/v1%3Fkey=pw-secret-42",
        "http://127.0.0.1:1/v1?#pw-secret-42",
        "http://127.0.0.1:1/v1?",
    ],
)
def test_a_base_url_that_carries_a_secret_is_refused_without_quoting_it(url: str):
    """Credentials in the base URL (user:password@, ?key=) crashed the run (aiohttp refuses
    userinfo beside an Authorization header: exit 70) after writing them to runs.jsonl as the
    endpoint; the model string is refused before anything starts, without quoting the secret. A
    fragment (#KEY), parameters (;key=), an empty query (?) or a percent escape (%3Fkey=) were
    taken (trial 9): the key went to runs.jsonl, summary.json and run-history.jsonl, and the
    requests to another path."""
    from dxi import adapters

    with pytest.raises(ValueError) as refused:
        adapters.parse_model(f"openai:gpt-fake@{url}")
    assert "pw-secret-42" not in str(refused.value)
    assert str(refused.value) == (
        "model openai:gpt-fake: its base URL carries credentials, a query, parameters or a "
        f"fragment ({url[: url.index(':')]}://127.0.0.1...: user:password@, ?key=..., ;key=..., #... "
        "or a percent escape); give the API key in its environment variable (or --option "
        "api_key_env=NAME, api_key_command): the base URL is written to the cache, runs.jsonl "
        "and the outputs"
    )


def test_a_run_files_base_url_that_carries_a_secret_is_refused(tmp_path: Path):
    """A run file's provider table names its base URL apart from the model string: refused too."""
    from dxi.adapters import ModelSpec

    with pytest.raises(ValueError, match="its base URL carries credentials") as refused:
        ModelSpec("anthropic", "claude-fake", "https://u:pw-secret-42@127.0.0.1:1")
    assert "pw-secret-42" not in str(refused.value)


async def test_a_key_echoed_in_an_error_event_mid_stream_is_redacted(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A stream cut by an error event after its first event is stored as a transient failure
    quoting the event: a server that echoes the key there had it stored in the cache's ``error``
    (and printed among the first errors)."""
    import orjson
    from aiohttp import web

    from .fakes import sse_streams

    secret = "sk-test-key-in-an-error-event-42"
    monkeypatch.setenv("OPENAI_API_KEY", secret)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-fake"}
        chunk["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": "{"}}]
        await response.write(sse_streams.frame(chunk))
        said = request.headers["Authorization"]
        await response.write(b"data: " + orjson.dumps({"error": {"message": said}}) + b"\n\n")
        await response.write_eof()
        return response

    async with served("POST", "/v1/chat/completions", handler) as url:
        limits = replace(FAST, stream="always", max_attempts=1)
        _, _, rows = await run_model(
            f"openai:gpt-fake@{url}/v1", data_dir, tmp_path / "c", limits=limits
        )
    (error,) = rows["error"].to_list()
    assert error.startswith("openai:gpt-fake: the streamed reply was cut after ")
    assert "(an error event: Bearer [REDACTED])" in error
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


async def test_a_key_echoed_in_a_first_event_that_is_not_json_is_redacted(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A stream whose first event is not JSON fails before any of the reply (retried, then stored
    as a transient failure with the text received as its raw reply): the key it echoes is
    redacted there."""
    from aiohttp import web

    secret = "sk-test-key-in-a-broken-event-42"
    monkeypatch.setenv("OPENAI_API_KEY", secret)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(
            b"data: {not json " + request.headers["Authorization"].encode() + b"\n\n"
        )
        await response.write_eof()
        return response

    async with served("POST", "/v1/chat/completions", handler) as url:
        limits = replace(FAST, stream="always", max_attempts=1)
        _, _, rows = await run_model(
            f"openai:gpt-fake@{url}/v1", data_dir, tmp_path / "c", limits=limits
        )
    assert rows.select("status", "raw_reply").rows() == [("failed", "{not json Bearer [REDACTED]")]
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"HTTP/1.1 2x0 KEY\r\n\r\n", "ClientResponseError: Bad status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nBad\x01Header: KEY\r\n\r\n{}", "Invalid header"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzzKEY\r\n", "chunk size"),
    ],
)
async def test_a_key_echoed_in_broken_http_framing_is_redacted(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reply: bytes, said: str
):
    """aiohttp quotes the bytes it cannot parse (a status line, a header, a chunk size): a server
    that writes the key there had it stored in the cache's ``error`` and printed."""
    import asyncio

    secret = "sk-test-key-in-the-framing-42"
    monkeypatch.setenv("OPENAI_API_KEY", secret)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (more := await reader.read(65536)):
            head += more
        if head:
            writer.write(reply.replace(b"KEY", secret.encode()))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        limits = replace(FAST, max_attempts=1)
        _, _, rows = await run_model(
            f"openai:gpt-fake@{url}", data_dir, tmp_path / "c", limits=limits
        )
    finally:
        server.close()
        await server.wait_closed()
    (error,) = rows["error"].to_list()
    assert said in error and "[REDACTED]" in error and secret not in error
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


@pytest.mark.parametrize(
    ("status", "cause", "message"),
    [
        (
            302,
            "redirected",
            "{url}/health: HTTP 302: the server redirects to {elsewhere}/health; not followed (a "
            "request, and its API key, is only sent to the base URL named); if that address is the "
            "API's, name it as the base URL",
        ),
        (
            404,
            None,
            "{url}/health did not report a model name (it answered HTTP 404); name the model in "
            "the model string: systemone:NAME@{url}",
        ),
    ],
    ids=["redirect", "not-found"],
)
async def test_a_system_one_health_that_redirects_or_fails_is_named_so(
    status: int, cause: str | None, message: str, monkeypatch: pytest.MonkeyPatch
):
    """``systemone:URL`` (no model name) asks ``GET /health`` for the name. A redirect there is not
    followed (the key would go along) and stops the provider as ``redirected``, naming the target,
    not as "did not report a model name"; any other status is named in that message."""
    from aiohttp import web

    from dxi import adapters
    from dxi.adapters.errors import Fatal

    reached = []

    async def elsewhere_health(request: web.Request) -> web.Response:
        reached.append(request.headers.get("x-api-key"))
        return web.json_response({"model": "elsewhere"})

    async def health(request: web.Request) -> web.Response:
        if status == 302:
            raise web.HTTPFound(f"{elsewhere_url}/health")
        raise web.HTTPNotFound()

    monkeypatch.setenv("SYSTEMONE_API_KEY", "sk-hostile-health-0123456789")
    async with (
        served("GET", "/health", elsewhere_health) as elsewhere_url,
        served("GET", "/health", health) as url,
    ):
        adapter = adapters.get(f"systemone:{url}")
        with pytest.raises((Fatal, ProviderStop)) as raised:
            await adapter.start()
    error = raised.value
    assert (type(error) is ProviderStop, getattr(error, "cause", None)) == (
        cause is not None,
        cause,
    )
    assert str(error) == message.format(url=url, elsewhere=elsewhere_url)
    assert reached == []


@pytest.mark.parametrize(
    ("timeout", "max_reply", "why"),
    [
        (0.5, 60.0, "no further byte within the idle timeout (--timeout)"),
        (60.0, 0.5, "the reply took longer than --max-reply-time 0.5 s"),
    ],
    ids=["idle-timeout", "max-reply-time"],
)
async def test_a_whole_reply_cut_after_its_body_began_is_not_sent_again_in_the_run(
    data_dir: Path, tmp_path: Path, timeout: float, max_reply: float, why: str
):
    """A reply sent whole (not streamed) whose body began to arrive (50 bytes after the headers)
    and then stopped (silence past ``--timeout``, or ``--max-reply-time`` passing) was generated,
    and billed: it is not sent again in the run (it was sent 6 times), charged its reservation,
    stored as a transient failure that says how much arrived (it said "no byte of the reply within
    the idle timeout"), and sent again by the next run, as a cut stream is."""
    import asyncio
    import re

    from aiohttp import web

    from dxi import adapters
    from dxi.cache import Cache
    from dxi.evals import Suite, discover
    from dxi.runner.planning.plan import ModelRun
    from dxi.runner.sending.cost import Budget
    from dxi.runner.sending.scheduler import run

    arrivals: list[float] = []
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        arrivals.append(asyncio.get_running_loop().time())
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"id": "chatcmpl-1", "object": "chat.completion", ')  # 50 bytes
        await release.wait()
        return response

    price = (1000.0, 2000.0)  # USD per million input / output tokens
    limits = replace(FAST, attempt_timeout_s=timeout, max_reply_time_s=max_reply, max_attempts=6)
    outcomes = []
    async with served("POST", "/v1/chat/completions", handler) as url:
        try:
            for _ in range(2):  # the run, then the next run
                spec = adapters.ModelSpec(
                    "openai", "gpt-fake", f"{url}/v1", {"max_completion_tokens": 8000}
                )
                adapter = adapters.get(spec, replace(limits, stream="never"))
                await adapter.start()
                budget = Budget(100.0)
                try:
                    with Cache(tmp_path / "c") as cache:
                        await run(
                            [ModelRun(adapter, price=price)],
                            Suite(discover(data_dir), limit=1, evals=("when2call",)),
                            cache,
                            budget=budget,
                        )
                        rows = cache.scan().collect()
                finally:
                    await adapter.close()
                outcomes.append((len(arrivals), budget, rows))
        finally:
            release.set()
    (sent, budget, rows), (sent_again, _, rows_again) = outcomes
    assert (sent, sent_again) == (1, 2)  # not resent in the run; sent again by the next run
    row = rows.row(0, named=True)
    assert (row["status"], row["error_kind"], row["attempts"], row["http_status"]) == (
        "failed",
        "transient",
        1,
        None,
    )
    assert (row["answers"], row["raw_reply"]) == (None, None)
    assert re.fullmatch(
        r"openai:gpt-fake: the reply was cut after 50 bytes had arrived, (\d+\.\d) s after it "
        rf"was sent \({re.escape(why)}\); its partial text is never scored\. Not sent again in "
        r"this run \(the part that arrived was billed\): the next run requests it again",
        row["error"],
    )
    assert float(re.search(r"arrived, (\S+) s", row["error"])[1]) >= 0.5
    # charged its reservation: at least max_completion_tokens at the output price, all of it kept
    assert budget.spent == budget.spent_at_reservation > 8000 * 2000.0 / 1e6
    assert rows_again.height == 2  # the next run's row beside it (the cache is append-only)


def _first_answers(body: dict) -> bytes:
    """The answer JSON a model would write to a Chat Completions request ``body``: each question
    the first value its schema allows."""
    import orjson

    schema = body["response_format"]["json_schema"]["schema"]
    return orjson.dumps({q: s["enum"][0] for q, s in schema["properties"].items()})


def _usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@pytest.mark.parametrize(
    ("tail", "tokens", "stored"),
    [
        # after [DONE]: text that would make the answer invalid, and a usage of 1 and 0 tokens
        ("after-done", (100, 50), (100, 50)),
        # two usage chunks whose counts fall (100/50, then 1/0): no usage believed, none kept
        ("falling-usage", (None, None), None),
        # counts that grow from one usage chunk to the next: cumulative, the last kept
        ("growing-usage", (100, 50), (100, 50)),
    ],
)
async def test_a_streams_usage_is_read_to_done_and_only_when_its_counts_never_fall(
    data_dir: Path, tmp_path: Path, tail: str, tokens: tuple, stored: tuple | None
):
    """An OpenAI stream is read to ``data: [DONE]`` and no further (as the openai SDK's
    ``Stream``): a chunk after it (more text, another usage) was joined in, making the answer
    invalid and the reply's cost $0. Usage stated in several chunks is kept only while its counts
    never fall (the last one silently won: 100/50 then 1/0 cost $0)."""
    import orjson
    from aiohttp import web

    from .fakes import sse_streams

    async def handler(request: web.Request) -> web.StreamResponse:
        answers = _first_answers(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-fake"}

        async def chunk(choices: list, usage: dict | None = None) -> None:
            await response.write(sse_streams.frame(base | {"choices": choices, "usage": usage}))

        delta = {"role": "assistant", "content": answers.decode()}
        await chunk([{"index": 0, "delta": delta, "finish_reason": None}])
        await chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if tail == "growing-usage":
            await chunk([], _usage(100, 10))
        await chunk([], _usage(100, 50))
        if tail == "falling-usage":
            await chunk([], _usage(1, 0))
        await response.write(b"data: [DONE]\n\n")
        if tail == "after-done":
            garbage = [{"index": 0, "delta": {"content": "garbage"}, "finish_reason": None}]
            await chunk(garbage, _usage(1, 0))
        await response.write_eof()
        return response

    async with served("POST", "/v1/chat/completions", handler) as url:
        limits = replace(FAST, stream="always", max_attempts=1)
        _, stats, rows = await run_model(
            f"openai:gpt-fake@{url}/v1", data_dir, tmp_path / "c", limits=limits
        )
    row = rows.row(0, named=True)
    assert (stats.sent, stats.ok, row["status"], row["attempts"]) == (1, 1, "ok", 1)
    assert {a["status"] for a in row["answers"]} == {"ok"}
    assert (row["input_tokens"], row["output_tokens"]) == tokens
    reply = orjson.loads(row["raw_reply"])
    assert b"garbage" not in row["raw_reply"].encode()
    assert reply.get("usage") == (None if stored is None else _usage(*stored))


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("usage-twice", "reply names the key 'usage' twice: which value is meant is ambiguous"),
        ("choices-twice", "reply names the key 'choices' twice: which value is meant is ambiguous"),
        (
            "content-twice",
            "reply names the key 'content' twice in choices[0].message: which value is meant is "
            "ambiguous",
        ),
        ("error-beside-choices", "an error inside a 200 reply: partial failure"),
    ],
    ids=["usage-twice", "choices-twice", "content-twice", "error-beside-choices"],
)
async def test_a_reply_that_names_a_key_twice_or_an_error_beside_its_answer_is_not_stored(
    data_dir: Path, tmp_path: Path, fault: str, error: str
):
    """A Chat Completions body that names a key twice anywhere (``"usage"`` twice: 100/10 then
    1/0; ``"choices"`` twice: the first's answers invalid, the second's valid) is a malformed reply,
    retried, never stored as an answer: the last of each silently won (the second ``choices``
    scored). So is a 200 whose valid ``choices`` come with a top-level ``error`` (stored as an
    answer before), as ``finish_reason: "error"`` is."""
    import orjson
    from aiohttp import web

    arrivals = []

    async def handler(request: web.Request) -> web.Response:
        arrivals.append(1)
        answers = _first_answers(await request.json()).decode()
        message = {"role": "assistant", "content": answers}
        choices = [{"index": 0, "message": message, "finish_reason": "stop"}]
        doc = {"id": "c", "object": "chat.completion", "model": "gpt-fake"}
        body = orjson.dumps(doc | {"choices": choices, "usage": _usage(100, 10)})
        if fault == "usage-twice":
            body = body[:-1] + b',"usage":' + orjson.dumps(_usage(1, 0)) + b"}"
        elif fault == "choices-twice":
            invalid = orjson.dumps({"q": "not-an-option"}).decode()
            first = [
                {"index": 0, "message": message | {"content": invalid}, "finish_reason": "stop"}
            ]
            body = orjson.dumps(doc | {"choices": first, "usage": _usage(100, 10)})
            body = body[:-1] + b',"choices":' + orjson.dumps(choices) + b"}"
        elif fault == "content-twice":
            body = body.replace(b'"role":"assistant"', b'"role":"assistant","content":"x"')
        else:
            body = body[:-1] + b',"error":{"message":"partial failure"}}'
        return web.Response(body=body, content_type="application/json")

    async with served("POST", "/v1/chat/completions", handler) as url:
        limits = replace(FAST, stream="never", max_attempts=2)
        _, stats, rows = await run_model(
            f"openai:gpt-fake@{url}/v1", data_dir, tmp_path / "c", limits=limits
        )
    row = rows.row(0, named=True)
    assert (len(arrivals), stats.ok, stats.failed) == (2, 0, 1)  # retried, as any malformed reply
    assert (row["status"], row["error_kind"], row["attempts"], row["answers"]) == (
        "failed",
        "transient",
        2,
        None,
    )
    assert (row["input_tokens"], row["output_tokens"]) == (None, None)
    assert row["error"] == error


HOSTILE = "nope\x1b]0;PWNED-TITLE\x07\nFORGED: all good, exit 0\r\x9b2K\u202eevil"
HOSTILE_SHOWN = r"nope\x1b]0;PWNED-TITLE\x07\nFORGED: all good, exit 0\r\x9b2K\u202eevil"


def test_text_from_outside_is_shown_with_its_control_characters_escaped():
    """``dxi.shown``: ESC, BEL, newline, CR, a C1 control (CSI, 0x9b) and a bidirectional override
    written as Python's escapes; ``keep`` leaves the console's own line breaks and tabs."""
    from dxi.shown import shown

    assert shown(HOSTILE) == HOSTILE_SHOWN
    assert shown("a\tb\nc\x1bd\u2028\x7f", keep="\n\t") == "a\tb\nc\\x1bd\\u2028\\x7f"
    assert shown("gpt-4o (ünïcode, 模型)") == "gpt-4o (ünïcode, 模型)"


@pytest.mark.parametrize("where", ["stop", "served"])
async def test_a_hostile_servers_text_reaches_the_terminal_escaped(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    where: str,
):
    """A 401 whose message holds an ESC sequence and a line break (trial 9) printed them raw in the
    stop line, setting the terminal's title and forging a line ``FORGED: all good, exit 0``; a
    reply whose ``model`` holds them did the same in the ``answered by`` note. Both are shown
    escaped: no ESC, no C1 control, no line of the server's own."""
    import asyncio

    import orjson
    from aiohttp import web

    from dxi.runner.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")

    async def handler(request: web.Request) -> web.Response:
        if where == "stop":
            return web.json_response({"error": {"message": HOSTILE}}, status=401)
        body = await request.json()
        schema = body["response_format"]["json_schema"]["schema"]["properties"]
        answer = {k: (v.get("enum") or ["A"])[0] for k, v in schema.items()}
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": HOSTILE,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": orjson.dumps(answer).decode()},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
            }
        )

    async with served("POST", "/v1/chat/completions", handler) as url:
        argv = ["run", "--model", f"openai:gpt-fake@{url}/v1", "--evals", "when2call"]
        argv += ["--limit", "1", "--data-dir", str(data_dir)]
        argv += ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o")]
        assert await asyncio.to_thread(main, argv) == (6 if where == "stop" else 0)
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert not [c for c in said if c == "\x1b" or c == "\r" or "\x7f" <= c <= "\x9f"]
    assert "\u202e" not in said
    assert not [line for line in said.splitlines() if line.startswith("FORGED")]
    if where == "stop":
        assert (
            "Provider's message: openai:gpt-fake: HTTP 401 API key refused (check the API key's "
            f"environment variable and its permissions): {HOSTILE_SHOWN}\n"
        ) in said
    else:
        assert (
            f"  openai:gpt-fake: answered by {HOSTILE_SHOWN} (1 answers), not gpt-fake as asked: "
            "the provider served another model, and its answers are scored under this name\n"
        ) in captured.out


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (
            {"model": "ok\x1b]0;X\x07\nFORGED"},
            r"model openai:ok\x1b]0;X\x07\nFORGED: its model holds a control character",
        ),
        (
            {"model": "ok", "name": "nice\u202e\nFORGED"},
            r"model nice\u202e\nFORGED: its name holds a control character",
        ),
    ],
)
def test_a_model_name_that_holds_a_control_character_is_refused(fields: dict, said: str):
    """A run file's ``name`` or ``model`` (TOML writes ``\\u001b`` and ``\\n``) was printed raw in
    every line and table naming the model (trial 9): refused, shown escaped."""
    from dxi.adapters import ModelSpec

    with pytest.raises(ValueError) as refused:
        ModelSpec("openai", **fields)
    assert str(refused.value) == (
        f"{said} (ESC, a line break, a bidirectional override: shown escaped here); a model's "
        "names are printed and written to the cache and the outputs"
    )


def test_the_console_shows_control_characters_escaped_but_its_line_breaks(
    capsys: pytest.CaptureFixture,
):
    """Every line ``dxi`` prints goes through ``make_console``: whatever a message quotes, an ESC
    sequence, CR, C1 control or bidirectional override is shown escaped; its own line breaks
    stay."""
    from dxi.runner.commands import make_console

    make_console(stderr=True).print("a\x1b]0;T\x07b\rc\x9bd\u202ee\ng", markup=False)
    assert capsys.readouterr().err == "a\\x1b]0;T\\x07b\\rc\\x9bd\\u202ee\ng\n"


def test_a_warning_that_quotes_a_provider_is_logged_escaped():
    """``dxi``'s warnings (``runner.commands.log_handler``) hold to the console's rule: a line
    quoting a provider's text has its control characters shown escaped."""
    import logging

    from dxi.runner.commands import log_handler, make_console

    handler = log_handler(make_console(stderr=True))  # not a terminal here: the plain form
    record = logging.LogRecord(
        "dxi.cache", logging.WARNING, __file__, 1, "served by %s", (HOSTILE,), None
    )
    assert handler.format(record) == f"WARNING served by {HOSTILE_SHOWN}"


def test_a_distributed_note_shows_control_characters_escaped(capsys: pytest.CaptureFixture):
    """The notes of a sharded or coordinated run (``runner.distributed.setup``) are written to
    standard error apart from the console: held to its rule too (a remote's or shard's name)."""
    from dxi.runner.distributed.setup import _note

    _note("shard 1/2 (from s3://b\x1b]0;T\x07)\n  next")
    assert capsys.readouterr().err == "shard 1/2 (from s3://b\\x1b]0;T\\x07)\n  next\n"


def test_a_crash_line_shows_control_characters_escaped(tmp_path: Path):
    """The one line of an unexpected error (``runner.crash.report``, printed by ``dxi`` and its
    entry) quotes the exception, which may quote a provider: an ESC sequence in it is shown
    escaped."""
    from dxi.runner.crash import report

    said = report(ValueError("bad \x1b]0;T\x07 reply"), ["dxi"], tmp_path)
    assert said.startswith("unexpected error: ValueError: bad \\x1b]0;T\\x07 reply at ")


def test_a_progress_bar_shows_a_model_named_by_its_server_escaped():
    """The live bars (a terminal) render each label as Rich ``Text``, not through the console's
    rule: a model a System One server named (``/health``) with an ESC sequence is shown escaped."""
    from rich.console import Console

    from dxi.runner.sending.progress import _Bars

    console = Console(width=200, record=True)
    bars = _Bars(console)
    bars.add_task("systemone:m\x1b]0;T\x07", total=2, detail="")
    console.print(bars.make_tasks_table(bars.tasks))
    said = console.export_text()
    assert said.startswith("systemone:m\\x1b]0;T\\x07 ") and "\x1b" not in said


async def test_a_system_one_health_naming_a_model_with_control_characters_is_refused():
    """``systemone:URL`` takes the model's name from ``GET /health``. A name holding ESC, BEL and a
    line break was taken as it was: the terminal printed a forged line ("FORGED-HEALTH") in the
    header, the progress and the tables, and the cache and run history stored it raw (trial 10).
    It is refused as a model string's name is, the name shown escaped."""
    from aiohttp import web

    from dxi import adapters
    from dxi.adapters.errors import Fatal

    name = "robo\x1b]0;PWNED\x07\nFORGED-HEALTH"

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"model": name})

    async with served("GET", "/health", health) as url:
        adapter = adapters.get(f"systemone:{url}")
        with pytest.raises(Fatal) as raised:
            await adapter.start()
    assert str(raised.value) == (
        f"{url}/health reported the model name 'robo\\x1b]0;PWNED\\x07\\nFORGED-HEALTH', which "
        "holds a control character (ESC, a line break, a bidirectional override: shown escaped "
        f"here); name the model in the model string: systemone:NAME@{url}"
    )
    assert adapter.model == ""  # not taken
