"""The real providers' failure modes, served per wire format by the fault-injecting provider
(``tests/fakes/fake_provider.py``) over real HTTP on 127.0.0.1: exhausted quotas and dead keys stop
the provider, errors inside a 200 are retried, gzip bodies cut before their trailer are transport
errors, duplicate keys and NaN make the answers they touch invalid, huge replies are read no further
than the bound, and the providers' stated waits are read as documented."""

from __future__ import annotations

import asyncio
import calendar
import time
import tracemalloc
from dataclasses import replace
from email.utils import formatdate
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.adapters import Limits, ProviderStop
from dxi.adapters.errors import KEY, MODEL, QUOTA, REQUEST, WAIT
from dxi.adapters.http import parse_reset, parse_retry_after, rate_limit_wait
from dxi.adapters.provider_errors import provider_stop
from dxi.runner import session
from dxi.runner.cli import main
from dxi.runner.errors import EXIT_PROVIDER_STOPPED
from dxi.runner.planning import plan

from .fakes import wire_formats
from .fakes.fake_llm_server import FakeLLM
from .fakes.fake_provider import FakeProvider, serve
from .helpers import synthetic
from .helpers.runs import FAST, ONE, run_model

KINDS = (
    "openai",
    "anthropic",
    "gemini",
    "openai-decisions",
    "logprobs",
    "systemone",
    "gemini-decisions",
)
KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "openai-decisions": "OPENAI_API_KEY",
    "logprobs": "OPENAI_API_KEY",
    "systemone": "SYSTEMONE_API_KEY",
    "gemini-decisions": "GEMINI_API_KEY",
}


def model(kind: str, url: str) -> str:
    """The model string of ``kind`` on the fake provider at ``url``."""
    return {
        "openai": f"openai:gpt-fake@{url}/v1",
        "anthropic": f"anthropic:claude-fake@{url}",
        "gemini": f"gemini:gemini-fake@{url}",
        "openai-decisions": f"openai-decisions:luna-fake@{url}/v1",
        "logprobs": f"logprobs:qwen-fake@{url}/v1",
        "systemone": f"systemone:{url}",
        "gemini-decisions": f"gemini-decisions:gemini-decision-1@{url}",
    }[kind]


async def run_on(
    kind: str,
    server: FakeProvider,
    data_dir: Path,
    tmp_path: Path,
    limits: Limits = FAST,
    limit: int = 1,
):
    limiters: dict = {}
    _, stats, rows = await run_model(
        model(kind, server.url), data_dir, tmp_path / "c", limits, limit=limit, limiters=limiters
    )
    return stats, rows, next(iter(limiters.values()))


# ---- 2. an exhausted quota stops the provider ----------------------------------------------------
SERVER_NOW = (
    1_771_074_030.0  # 2026-02-14 13:00:30 UTC: the fake's Date (its clock stands still there)
)
QUOTA_MESSAGE = {"anthropic": "Your organization has reached its monthly usage limit."}


@pytest.mark.parametrize("kind", KINDS)
async def test_an_exhausted_quota_stops_the_provider(data_dir: Path, tmp_path: Path, kind: str):
    async with FakeProvider(default="quota", date=SERVER_NOW) as server:
        stats, rows, limiter = await run_on(kind, server, data_dir, tmp_path, ONE, limit=3)
    assert server.stats()["arrivals"] == 1  # one request met the quota; nothing more was sent
    assert (stats.refused, stats.not_sent, stats.sent, stats.attempts, rows.height) == (
        1,
        2,
        0,
        1,
        0,
    )
    stop = limiter.halted
    assert isinstance(stop, ProviderStop) and (stop.cause, stop.status) == (QUOTA, 429)
    said = QUOTA_MESSAGE.get(
        kind, "You exceeded your current quota, please check your plan and billing details."
    )
    assert str(stop).endswith(f": {said}")
    if kind in ("gemini", "gemini-decisions"):
        assert stop.resets_in_s == 43200.0  # its RetryInfo
        assert "GenerateRequestsPerDayPerProjectPerModel" in str(stop)
    elif (
        kind == "anthropic"
    ):  # enforced_spend_limit_reached: 00:00 UTC on the first of next month, from Date
        assert (
            stop.resets_in_s == 14 * 86400 + 11 * 3600 - 30
        )  # from 2026-02-14 13:00:30 to 2026-03-01
    else:
        assert stop.resets_in_s is None


async def test_the_progress_counts_as_retries_only_the_requests_sent_again(tmp_path: Path):
    """Five requests one at a time: the 1st fails (503) and is sent again (answered), the 2nd is
    answered, the 3rd fails (503) and its retry meets the exhausted quota (refused: the provider
    stops), the last two are not sent. 5 attempts, 2 sent, 1 refused: 2 retries (the 1st's and the
    3rd's second attempts), not 3 (attempts minus the requests stored, which counted the refused
    request's first attempt as one)."""
    from rich.console import Console

    from dxi.runner.sending.progress import RunProgress

    data = synthetic.data_dir(tmp_path / "data", 5)
    async with FakeProvider(script=["503", "ok", "ok", "503", "quota"]) as server:
        _, stats, rows = await run_model(
            f"systemone:fake-decider@{server.url}", data, tmp_path / "cache", ONE, limit=5
        )
    assert server.stats()["arrivals"] == 5
    progress = RunProgress(Console(), {"systemone:fake-decider": 5}, started=100.0)
    assert progress.line("systemone:fake-decider", stats, now=110.0) == (
        "2/5 40% 0.2 req/s stopped no price retries 2 429s 0 invalid replies 0 failed 0 cached 0 "
        "not sent 2 refused 1"
    )
    assert (stats.sent, stats.attempts, stats.retries, stats.refused, stats.not_sent) == (
        2,
        5,
        2,
        1,
        2,
    )
    assert rows["attempts"].to_list() == [2, 1]  # the two stored: the 1st after its retry, the 2nd


async def test_a_quota_429_for_100_tasks_stops_within_max_in_flight_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-quota-0123456789")
    data = synthetic.data_dir(tmp_path / "data", 100)
    out = tmp_path / "out"
    async with FakeProvider(default="quota", latency="0.02") as server:
        started = time.monotonic()
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--model",
                f"openai:gpt-fake@{server.url}/v1",
                "--data-dir",
                str(data),
                "--cache-dir",
                str(tmp_path / "c"),
                "--out",
                str(out),
                "--max-in-flight",
                "4",
                "--evals",
                "when2call",  # the synthetic data: When2Call only
                "-q",
            ],
        )
        elapsed = time.monotonic() - started
    assert code == EXIT_PROVIDER_STOPPED == 6
    assert elapsed < 10
    after = [t for t, _ in server.requests if t > server.quota_at]
    assert len(after) <= 4  # at most max_in_flight sent after the first quota 429 was written
    n = len(server.requests)
    (block,) = orjson.loads((out / "summary.json").read_bytes())["stopped_providers"]
    provider = f"openai@{server.url}/v1"
    assert block | {"stopped_at": None} == {
        "provider": provider,
        "scope": "provider",
        "models": ["openai:gpt-fake"],
        "cause": "quota exhausted",
        "http_status": 429,
        "message": "openai:gpt-fake: HTTP 429 quota exhausted (insufficient_quota): You exceeded your current quota, "
        "please check your plan and billing details.",
        "stopped_at": None,
        "resets_at": None,
        "refused": n,
        "not_sent": 100 - n,
    }
    when = block["stopped_at"].replace("T", " ").removesuffix("Z")
    printed = capsys.readouterr().out.replace("\n", " ")
    assert (
        f"Provider stopped: {provider} stopped at {when} UTC: quota exhausted. {n} request(s) refused, {100 - n} "
        "not sent (openai:gpt-fake); the next run sends them. Add credit or raise the limit, then rerun. Provider's "
        "message: openai:gpt-fake: HTTP 429 quota exhausted (insufficient_quota): You exceeded your current quota, "
        "please check your plan and billing details."
    ) in " ".join(printed.split())


async def test_a_stopped_providers_rest_is_counted_not_sent_in_batches_beside_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # the requests left when a provider stops are counted (each encoded and looked up) DRAIN_BATCH
    # per event-loop turn, not all in one turn with requests in flight (seconds for a big suite)
    from dxi.runner.sending import scheduler as run_module

    monkeypatch.setattr(run_module, "DRAIN_BATCH", 50)
    data = synthetic.data_dir(tmp_path / "data", 2_000)
    limiters: dict = {}
    turns_after_stop = []

    async def ticker():
        while True:
            await asyncio.sleep(0)
            if limiters and next(iter(limiters.values())).halted is not None:
                turns_after_stop.append(1)

    async with FakeProvider(default="quota") as server:
        tick = asyncio.create_task(ticker())
        _, stats, rows = await run_model(
            f"systemone:fake-decider@{server.url}",
            data,
            tmp_path / "c",
            ONE,
            limit=None,
            limiters=limiters,
        )
        tick.cancel()
    assert (stats.refused, stats.not_sent, stats.sent, rows.height) == (1, 1_999, 0, 0)
    assert (
        len(turns_after_stop) >= 1_999 // 50
    )  # the loop went on turning while the rest was counted


@pytest.mark.parametrize(
    "behaviour, cause, scope",
    [("401", KEY, "provider"), ("403", KEY, "provider"), ("404", MODEL, "model")],
)
async def test_a_dead_key_stops_the_provider_and_an_unknown_model_itself(
    data_dir: Path, tmp_path: Path, behaviour: str, cause: str, scope: str
):
    async with FakeProvider(default=behaviour) as server:
        stats, rows, limiter = await run_on("openai", server, data_dir, tmp_path, ONE, limit=3)
    assert (server.stats()["arrivals"], stats.refused, stats.not_sent, rows.height) == (1, 1, 2, 0)
    if scope == "provider":
        assert limiter.halted.cause == cause and limiter.stopped_models == {}
    else:  # the model alone: the provider is not halted
        ((label, (stop, _)),) = limiter.stopped_models.items()
        assert (limiter.halted, label, stop.cause, stop.scope) == (
            None,
            "openai:gpt-fake",
            cause,
            "model",
        )


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_a_refused_form_of_request_stops_the_model_unless_others_were_answered(
    data_dir: Path, tmp_path: Path, kind: str
):
    async with FakeProvider(default="unsupported") as server:
        stats, rows, limiter = await run_on(kind, server, data_dir, tmp_path, ONE, limit=3)
    assert (server.stats()["arrivals"], stats.refused, stats.not_sent, rows.height) == (1, 1, 2, 0)
    ((stop, _),) = limiter.stopped_models.values()
    assert (limiter.halted, stop.cause, stop.scope) == (None, REQUEST, "model")
    # after a reply, the same refusal is that request's own: kept as a deterministic failure, the
    # others go on
    async with FakeProvider(script=["ok", "unsupported"]) as server:
        stats, rows, limiter = await run_on(
            kind, server, data_dir, tmp_path / "again", ONE, limit=3
        )
    assert limiter.halted is None and limiter.stopped_models == {}
    assert (stats.ok, stats.failed_fatal, stats.refused) == (2, 1, 0)


def test_what_stops_a_provider_is_read_from_the_documented_bodies():
    now = float(calendar.timegm((2026, 12, 1, 12, 0, 0)))

    def stop(status: int, body: dict) -> ProviderStop | None:
        return provider_stop(status, orjson.dumps(body), "m", "snippet", now)

    # Gemini: a schema it does not support (400 INVALID_ARGUMENT) stops it; so does an Anthropic 400
    # for tool_choice
    assert (
        stop(
            400,
            {
                "error": {
                    "code": 400,
                    "status": "INVALID_ARGUMENT",
                    "message": "Invalid JSON payload received. "
                    "Unknown name \"responseJsonSchema\" at 'generation_config'",
                }
            },
        ).cause
        == REQUEST
    )
    assert (
        stop(
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "tool_choice of type 'tool' is not supported with this model",
                },
            },
        ).cause
        == REQUEST
    )
    assert (
        stop(
            400,
            {
                "error": {
                    "message": "Unsupported parameter: 'max_tokens'",
                    "type": "invalid_request_error",
                    "param": "max_tokens",
                    "code": "unsupported_parameter",
                }
            },
        ).cause
        == REQUEST
    )
    # Gemini says a key is not valid in a 400 (its ErrorInfo reason)
    assert (
        stop(
            400,
            {
                "error": {
                    "code": 400,
                    "status": "INVALID_ARGUMENT",
                    "message": "API key not valid. Please pass a valid API key.",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                            "domain": "googleapis.com",
                        }
                    ],
                }
            },
        ).cause
        == KEY
    )
    # a prompt too long is this request's own failure (Fatal, kept), not the provider's
    assert (
        stop(
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens. However, your "
                    "messages resulted in 9000 tokens",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
        )
        is None
    )
    # Anthropic: a spend limit the user set (400) states when access resumes
    limit = stop(
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "You have reached your "
                "specified API usage limits. You will regain access on 2027-01-15 at 00:00 UTC.",
            },
        },
    )
    assert (limit.cause, limit.resets_in_s) == (
        QUOTA,
        calendar.timegm((2027, 1, 15, 0, 0, 0)) - now,
    )
    # Gemini: a per-minute quota is a rate limit (retried), a per-day one stops
    per_minute = {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "message": "quota",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}
                    ],
                }
            ],
        }
    }
    assert stop(429, per_minute) is None
    # OpenAI: a plain rate limit is retried; every billing code stops
    assert (
        stop(
            429,
            {
                "error": {
                    "message": "Rate limit reached",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            },
        )
        is None
    )
    for code in (
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
    ):
        assert (
            stop(
                429, {"error": {"message": "billing", "type": "insufficient_quota", "code": code}}
            ).cause
            == QUOTA
        )


# ---- stated waits --------------------------------------------------------------------------------
def test_stated_waits_are_read_as_documented():
    for bad in ("-5", "inf", "nan", "Infinity", "1e3", "", "soon", "12abc"):
        assert parse_retry_after(bad) is None, bad
        assert rate_limit_wait({"Retry-After": bad}) is None, bad
    assert (
        rate_limit_wait({"retry-after-ms": "-1"}) is None
        and rate_limit_wait({"retry-after-ms": "nan"}) is None
    )
    assert [parse_retry_after(v) for v in ("7", "1.5", " 30 ")] == [7.0, 1.5, 30.0]
    # an absolute time is measured against the reply's Date, not the local clock (here an hour
    # behind)
    server_now = time.time() - 3600
    headers = {
        "Retry-After": formatdate(server_now + 30, usegmt=True),
        "Date": formatdate(server_now, usegmt=True),
    }
    assert rate_limit_wait(headers) == 30.0
    reset = {
        "x-ratelimit-reset-requests": str(int(server_now) + 90),
        "x-ratelimit-remaining-requests": "0",
        "Date": formatdate(int(server_now), usegmt=True),
    }
    assert rate_limit_wait(reset) == 90.0
    assert parse_reset("-3") is None and parse_reset("inf") is None


async def test_x_should_retry_false_is_not_retried(data_dir: Path, tmp_path: Path):
    async with FakeProvider(script=["noretry:503"]) as server:
        stats, rows, _ = await run_on("openai", server, data_dir, tmp_path)
    row = rows.row(0, named=True)
    assert (server.stats()["arrivals"], stats.attempts, row["status"], row["error_kind"]) == (
        1,
        1,
        "failed",
        "transient",
    )
    assert "(x-should-retry: false: not retried in this run)" in row["error"]


async def test_a_stated_wait_within_the_bound_is_honoured_exactly(data_dir: Path, tmp_path: Path):
    limits = replace(FAST, max_wait_s=0.05, max_stated_wait_s=5)
    async with FakeProvider(script=["429:0.6"]) as server:
        stats, rows, _ = await run_on("openai", server, data_dir, tmp_path, limits)
    (first, _), (second, _) = server.requests
    assert second - first >= 0.6  # not cut to max_wait_s
    assert (stats.ok, stats.attempts) == (1, 2)


async def test_a_stated_wait_longer_than_the_bound_stops_the_provider(
    data_dir: Path, tmp_path: Path
):
    limits = replace(ONE, max_stated_wait_s=1)
    async with FakeProvider(script=["429:7200"]) as server:
        stats, rows, limiter = await run_on("openai", server, data_dir, tmp_path, limits, limit=3)
    assert (server.stats()["arrivals"], stats.refused, stats.not_sent, rows.height) == (1, 1, 2, 0)
    assert (limiter.halted.cause, limiter.halted.resets_in_s) == (WAIT, 7200.0)
    assert "asks to wait 7200 s, longer than the 1 s the run waits: --max-stated-wait" in str(
        limiter.halted
    )


# ---- 3. an error inside a 200 --------------------------------------------------------------------
ERROR_200 = {
    "openai": "502: Upstream provider returned an error",
    "anthropic": "Overloaded",
    "gemini": "503: The model is overloaded.",
    "openai-decisions": "502: Upstream provider returned an error",
    "logprobs": "502: Upstream provider returned an error",
    "systemone": "502: Upstream provider returned an error",
    "gemini-decisions": "503: The model is overloaded.",
}


@pytest.mark.parametrize("kind", KINDS)
async def test_an_error_inside_a_200_is_a_transient_failure(
    data_dir: Path, tmp_path: Path, kind: str
):
    async with FakeProvider(script=["error200"]) as server:
        stats, rows, _ = await run_on(kind, server, data_dir, tmp_path)
    assert (stats.ok, stats.attempts) == (1, 2)  # retried, then answered
    async with FakeProvider(default="error200") as server:
        stats, rows, _ = await run_on(
            kind, server, data_dir, tmp_path / "again", replace(FAST, max_attempts=1)
        )
    row = rows.row(0, named=True)
    assert (row["status"], row["error_kind"], row["answers"]) == ("failed", "transient", None)
    assert row["error"] == f"an error inside a 200 reply: {ERROR_200[kind]}"


# ---- 4. damaged, ambiguous and huge replies ------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
async def test_a_gzip_body_cut_before_its_trailer_is_retried(
    data_dir: Path, tmp_path: Path, kind: str
):
    async with FakeProvider(script=["gzip_cut", "gzip"]) as server:
        stats, rows, _ = await run_on(kind, server, data_dir, tmp_path)
    assert (stats.ok, stats.attempts) == (1, 2)  # the cut body retried; the whole gzip body read
    assert rows["status"].to_list() == ["ok"]
    async with FakeProvider(default="gzip_cut") as server:
        _, rows, _ = await run_on(
            kind, server, data_dir, tmp_path / "again", replace(FAST, max_attempts=1)
        )
    assert rows["error"][0].endswith(
        "the gzip body ended before its end (its trailer is missing): a transport error"
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_a_gzip_body_of_several_members_is_read_whole(
    data_dir: Path, tmp_path: Path, kind: str
):
    """A reply gzip-compressed as three members, one after another (RFC 1952 §2.2), is decoded
    whole: read once, ok (it was cut to its first member, "not JSON", and sent again on every run);
    with its last member's trailer missing it is still a transport error."""
    async with FakeProvider(default="gzip:3") as server:
        stats, rows, _ = await run_on(kind, server, data_dir, tmp_path, limit=2)
    assert (stats.ok, stats.attempts, server.stats()["arrivals"]) == (2, 2, 2)
    assert rows["status"].to_list() == ["ok", "ok"]
    async with FakeProvider(default="gzip_cut:3") as server:
        _, rows, _ = await run_on(
            kind, server, data_dir, tmp_path / "cut", replace(FAST, max_attempts=1)
        )
    assert rows["error"][0].endswith(
        "the gzip body ended before its end (its trailer is missing): a transport error"
    )


async def _read_served(body: bytes, chunk: int, max_bytes: int) -> bytes:
    """``read_body`` of a gzip ``body`` served by a real aiohttp server on 127.0.0.1, written
    ``chunk`` bytes at a time (so member boundaries fall inside the chunks the client reads)."""
    import aiohttp
    from aiohttp import web

    from dxi.adapters.http import read_body

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Encoding": "gzip"})
        await resp.prepare(request)
        for i in range(0, len(body), chunk):
            await resp.write(body[i : i + chunk])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with (
            aiohttp.ClientSession(auto_decompress=False) as client,
            client.get(f"http://127.0.0.1:{port}/") as resp,
        ):
            return await read_body(resp, max_bytes, "m")
    finally:
        await runner.cleanup()


async def test_read_body_decodes_every_gzip_member_across_chunks_and_bounds_them_together():
    import gzip

    from dxi.adapters import ReplyTooLarge, Transient

    from .fakes.fake_provider import gzip_members

    data = bytes(range(256)) * 40  # 10,240 bytes
    packed = gzip_members(data, 7)
    assert len(gzip.decompress(packed)) == len(data) and packed.count(b"\x1f\x8b\x08") >= 7
    for chunk in (1, 13, 4096, len(packed)):
        assert await _read_served(packed, chunk, 1 << 20) == data
    assert (
        await _read_served(gzip.compress(b"") + gzip.compress(b"{}"), 5, 100) == b"{}"
    )  # an empty member first
    with pytest.raises(
        ReplyTooLarge
    ) as too_large:  # the bound counts every member's bytes, not the first's
        await _read_served(packed, 100, len(data) - 1)
    assert too_large.value.prefix == data[:2000]
    with pytest.raises(
        Transient, match="the gzip body is damaged"
    ):  # bytes after a member that start none
        await _read_served(packed + b"not gzip", 64, 1 << 20)
    with pytest.raises(Transient, match="its trailer is missing"):
        await _read_served(packed[:-8], 64, 1 << 20)


DUPLICATE = {
    "openai": "duplicate key 'answer' in the reply",
    "anthropic": "duplicate key 'answer' in the reply",
    "gemini": "duplicate key 'answer' in the reply",
    "systemone": "duplicate key 'answer' in answers",
    "openai-decisions": "probabilities: option(s) 'A' named more than once",
    "gemini-decisions": "duplicate key 'answer' in answers",
}


@pytest.mark.parametrize("kind", list(DUPLICATE))
async def test_an_answer_named_twice_is_invalid_naming_the_key(
    data_dir: Path, tmp_path: Path, kind: str
):
    async with FakeProvider(default="duplicate") as server:
        stats, rows, _ = await run_on(kind, server, data_dir, tmp_path)
    row = rows.row(0, named=True)
    assert (stats.invalid, stats.attempts, row["status"]) == (1, 1, "invalid")
    (answer,) = row["answers"]
    assert answer["status"] == "invalid" and answer["error"].startswith(DUPLICATE[kind])


def test_a_key_named_twice_in_a_reply_body_is_malformed_outside_a_decision_models_answers():
    """``load_reply``: a key named twice anywhere in a provider's body refuses it, naming the key
    and where; inside a decision model's ``answers`` it is that answer's failure (above), and
    inside the model's own text (a string of the body) the answers' too."""
    from dxi.adapters.errors import MalformedReply
    from dxi.adapters.json_body import duplicates, load_reply

    answered_twice = b'{"answers": {"q1": {"noul": 0.5}, "q1": {"noul": 0.9}}, "usage": {}}'
    assert duplicates(load_reply(answered_twice, answers="answers")["answers"]) == ("q1",)
    refused = {
        b'{"answers": {}, "usage": {"input_tokens": 1, "input_tokens": 2}}': (
            "reply names the key 'input_tokens' twice in usage"
        ),
        b'{"answers": {}, "answers": {}}': "reply names the key 'answers' twice",
        b'[{"a": 1}, {"b": [{"c": 1, "c": 2}]}]': "reply names the key 'c' twice in [1].b[0]",
    }
    for body, words in refused.items():
        with pytest.raises(MalformedReply) as raised:
            load_reply(body, answers="answers")
        assert str(raised.value) == f"{words}: which value is meant is ambiguous"
        assert raised.value.raw == body.decode()
    text = b'{"content": "{\\"a\\": 1, \\"a\\": 2}"}'
    assert load_reply(text) == {"content": '{"a": 1, "a": 2}'}


@pytest.mark.parametrize("kind", ["systemone", "openai-decisions", "gemini-decisions"])
async def test_nan_in_a_decision_reply_makes_the_answers_it_touches_invalid(
    data_dir: Path, tmp_path: Path, kind: str
):
    async with FakeProvider(default="nan") as server:
        stats, rows, _ = await run_on(kind, server, data_dir, tmp_path, limit=3)
    assert (stats.invalid, stats.failed, stats.attempts) == (
        3,
        0,
        3,
    )  # stored, not retried as transient
    errors = [a["error"] for answers in rows["answers"] for a in answers]
    assert errors == ["probabilities.A: nan is not a number in [0, 1]"] * 3


@pytest.mark.parametrize("kind", ["systemone", "openai", "anthropic"])
async def test_a_reply_larger_than_the_bound_is_invalid_with_a_bounded_prefix(
    data_dir: Path, tmp_path: Path, kind: str
):
    limits = replace(FAST, max_reply_bytes=256 << 10)
    async with FakeProvider(default=f"huge:{5 << 20}") as server:
        stats, rows, _ = await run_on(kind, server, data_dir, tmp_path, limits)
    row = rows.row(0, named=True)
    assert (stats.invalid, stats.attempts, row["status"]) == (1, 1, "invalid")
    assert row["error"] == "answer: reply larger than 262144 bytes"
    assert row["raw_reply"] == '{"padding": "' + "x" * (2000 - 13)


@pytest.mark.process
def test_peak_memory_does_not_grow_with_the_size_of_a_reply(data_dir: Path, tmp_path: Path):
    with serve(default=f"huge:{30 << 20}") as server:
        tracemalloc.start()
        try:
            _, stats, rows = asyncio.run(
                run_model(f"systemone:{server.url}", data_dir, tmp_path / "c")
            )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert rows["error"].to_list() == [f"answer: reply larger than {4 << 20} bytes"]
    assert peak < 12 << 20  # the 4 MiB bound (and its copies), not the 30 MiB reply


@pytest.mark.process
def test_picks_decided_by_a_tie_are_counted_per_model_and_evaluation(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    # every When2Call question has 4 options at 0.25 each; WildGuardTest's P(yes) is 0.5: all ties
    out = tmp_path / "out"
    with serve(p_first=0.25, p_yes=0.5) as server:
        code = main(
            [
                "run",
                "--model",
                f"systemone:{server.url}",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(tmp_path / "c"),
                "--out",
                str(out),
                "--evals",
                "when2call,wildguardtest",
                "-q",
            ]
        )
    assert code == 0
    summary = orjson.loads((out / "summary.json").read_bytes())
    answers = pl.read_parquet(out / "answers.parquet")
    wildguard = answers.filter(pl.col("eval") == "wildguardtest").height
    (m,) = summary["models"]
    assert {e: b["ties"] for e, b in m["evals"].items()} == {
        "aa_omniscience_decision": 0,
        "hle_multichoice": 0,
        "when2call": 3,
        "wildguardtest": wildguard,
    }
    assert set(answers.filter(pl.col("eval") == "when2call")["predicted"]) == {
        "A"
    }  # the returned choice, the first
    assert (
        f"systemone:fake-decider: {3 + wildguard} pick(s) decided by a tie of the highest probabilities (scored: "
        "the returned choice when tied, else the first tied option in option order)"
    ) in capsys.readouterr().out


# ---- 5. prompt-cache reads and writes, recorded and priced ---------------------------------------
# the run file's prompt-cache prices (USD per million tokens), or none: each provider's own rule
# then
GIVEN = {"cached_input": 0.5, "cache_write": 2.5, "cache_write_1h": 4.5}
RULES = {
    "openai": {},
    "gemini": {},  # per model: priced as input unless the run file says
    "anthropic": {"cached_input": 0.2, "cache_write": 2.5, "cache_write_1h": 4.0},
}  # 0.1x, 1.25x, 2x of 2.0


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("given", [True, False])
async def test_prompt_cache_reads_and_writes_are_recorded_and_priced(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, given: bool
):
    monkeypatch.setenv(KEY_ENV[kind], "sk-test-cached-0123456789")
    price = "input = 2.0, output = 8.0" + "".join(f", {k} = {v}" for k, v in GIVEN.items() if given)
    async with FakeLLM(default="cached") as server:
        (tmp_path / "run.toml").write_text(f"""
data_dir = "{data_dir}"
[evals]
select = ["when2call"]
[providers.fake]
kind = "{kind}"
base_url = "{server.base_url(kind)}"
[[models]]
provider = "fake"
model = "m"
price = {{ {price} }}
params = {{ {"max_tokens = 64" if kind != "gemini" else "maxOutputTokens = 64"} }}
""")
        code = await asyncio.to_thread(
            main, ["run", str(tmp_path / "run.toml"), "-q", "--max-cost", "5"]
        )
    assert code == 0
    words = [wire_formats.prompt_tokens(body) for _, body in server.requests]
    assert len(words) == 3  # the fixture's 3 When2Call tasks, one request each
    if kind == "openai":  # within prompt_tokens: half read from the cache, a quarter written to it
        tokens_in, cached, written, written_1h = (
            sum(words),
            sum(w // 2 for w in words),
            sum(w // 4 for w in words),
            0,
        )
    elif (
        kind == "anthropic"
    ):  # outside input_tokens: 100 read, 15 written for 5 minutes, 5 for an hour
        tokens_in, cached, written, written_1h = sum(words) + 120 * 3, 100 * 3, 15 * 3, 5 * 3
    else:  # within promptTokenCount: half read from the cache; Gemini reports no writes
        tokens_in, cached, written, written_1h = sum(words), sum(w // 2 for w in words), 0, 0
    tokens_out = wire_formats.OUTPUT_TOKENS_PER_QUESTION * 3
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    (m,) = summary["models"]
    usage = m["usage"]
    writes = {
        k: n
        for k, n in (("cache_write_tokens", written), ("cache_write_1h_tokens", written_1h))
        if n
    }
    assert {k: usage[k] for k in ("input_tokens", "cached_input_tokens", "output_tokens")} | {
        k: usage[k] for k in ("cache_write_tokens", "cache_write_1h_tokens") if k in usage
    } == {
        "input_tokens": tokens_in,
        "cached_input_tokens": cached,
        "output_tokens": tokens_out,
    } | writes
    rates = {"cached_input": 2.0, "cache_write": 2.0, "cache_write_1h": 2.0} | (
        GIVEN if given else RULES[kind]
    )
    assert usage["price"] == {"input": 2.0, "output": 8.0} | (GIVEN if given else RULES[kind])
    fresh = tokens_in - cached - written - written_1h
    expected = (
        fresh * 2.0
        + cached * rates["cached_input"]
        + written * rates["cache_write"]
        + written_1h * rates["cache_write_1h"]
        + tokens_out * 8.0
    ) / 1e6
    assert usage["cost_usd"] == round(expected, 6) and m["requests"]["cost_usd"] == round(
        expected, 6
    )
    if (
        kind == "anthropic" and not given
    ):  # by hand: 3 requests of 100 read at $0.2, 15 at $2.5, 5 at $4 per million
        assert round(expected - (sum(words) * 2.0 + tokens_out * 8.0) / 1e6, 9) == round(
            3 * (100 * 0.2 + 15 * 2.5 + 5 * 4.0) / 1e6, 9
        )


def test_the_bounds_come_from_flags_or_a_run_file(tmp_path: Path, data_dir: Path):
    from dxi.runner.cli import parser
    from dxi.runner.planning import plan

    args = parser().parse_args(
        [
            "run",
            "--model",
            "openai:m@http://127.0.0.1:1/v1",
            "--data-dir",
            str(data_dir),
            "--max-stated-wait",
            "1200",
            "--max-reply-bytes",
            "1048576",
        ]
    )
    (m,) = plan.from_args(args).models
    assert (m.adapter.limits.max_stated_wait_s, m.adapter.limits.max_reply_bytes) == (1200, 1 << 20)
    (tmp_path / "run.toml").write_text(
        f'data_dir = "{data_dir}"\n[providers.p]\nkind = "openai"\nbase_url = '
        '"http://127.0.0.1:1/v1"\nmax_stated_wait_s = 900\nmax_reply_bytes = 65536\n'
        '[[models]]\nprovider = "p"\nmodel = "m"\n'
    )
    (m,) = plan.from_args(parser().parse_args(["run", str(tmp_path / "run.toml")])).models
    assert (m.adapter.limits.max_stated_wait_s, m.adapter.limits.max_reply_bytes) == (900, 65536)
    assert (Limits().max_stated_wait_s, Limits().max_reply_bytes) == (
        600.0,
        4 << 20,
    )  # the defaults: 10 min, 4 MiB


@pytest.mark.process
def test_a_server_that_stops_answering_mid_run_leaves_a_provisional_result_that_the_rerun_completes(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    # the first WildGuardTest request is answered, then every one gets a 503 (a server going down):
    # the two rows left unanswered are failed answers, not correct and not hallucinations, and every
    # figure they touch is provisional; exit code 1; the rerun, with the server back, sends exactly
    # those
    common = [
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(tmp_path / "c"),
        "--evals",
        "wildguardtest",
        "--max-attempts",
        "1",
        "--max-in-flight",
        "1",
        "-q",
    ]
    with serve(script=["ok", "503", "503"]) as server:  # then "ok" again: the server is back
        model = f"systemone:{server.url}"
        assert main(["run", "--model", model, "--out", str(tmp_path / "first"), *common]) == 1
        out = capsys.readouterr().out
        again = session.run(
            plan.build(
                models=[model],
                out=tmp_path / "again",
                data_dir=data_dir,
                cache_dir=tmp_path / "c",
                evals=["wildguardtest"],
                limits={"max_attempts": 1, "max_in_flight": 1},
            )
        )
        assert again.exit_code == 0
    first = orjson.loads((tmp_path / "first" / "summary.json").read_bytes())
    (m,) = first["models"]
    block = m["evals"]["wildguardtest"]
    assert (block["n"], block["failed"], block["missing"], block["complete"], block["rerun"]) == (
        3,
        6,
        0,
        False,
        6,
    )
    assert block["mean_f1"] is not None and (m["complete"], first["accepted"]) == (False, False)
    assert "6 failed answer(s) in WildGuardTest" in out and "asks for 6 of them again" in out
    assert f"{block['mean_f1']:.1f}*" in out  # marked in the table
    again = orjson.loads((tmp_path / "again" / "summary.json").read_bytes())
    assert again["models"][0]["requests"]["sent"] == 2 and again["complete"] is True
