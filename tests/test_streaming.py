"""Streamed replies (``adapters.streaming``, ``adapters.http.post_stream``): real server-sent events
from a loopback server whose events are built from the official SDKs' stream event types
(``tests/fakes/sse_streams.py``), for OpenAI Chat Completions, Anthropic Messages and Gemini; the
assembled reply is the non-streamed one (the cache rows of a streamed and a non-streamed answer
differ only in their timing columns); the idle timeout and the total bound; a stream cut mid-way, a
stall, an error event; a reply slower than any timeout but steadily arriving is stored once; every
request the anthropic SDK refuses unstreamed is streamed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import anthropic
import orjson
import polars as pl
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from dxi import adapters
from dxi.adapters import llm
from dxi.adapters.anthropic import decode_messages
from dxi.adapters.streaming import (
    LONG_REPLY_TOKENS,
    MODEL_NONSTREAMING_TOKENS,
    ChatAssembler,
    GenerateAssembler,
    MessagesAssembler,
    SSEParser,
    anthropic_sdk_refuses,
)
from dxi.evals import Suite, discover
from dxi.runner.cli import main

from .fakes import sse_streams, wire_formats
from .fakes.fake_llm_server import FakeLLM
from .helpers.runs import FAST, run_model
from .helpers.sdk_types import reply_problems

NAMES = {"openai": "gpt-6-luna", "anthropic": "claude-sonnet-5-5", "gemini": "gemini-3.5-flash"}
TIMING = ("created_at", "latency_ms", "ttft_s", "retry_waits_s")


def tasks(data_dir: Path) -> list:
    return list(Suite(discover(data_dir)).tasks())


def body(kind: str, task, model: str | None = None, **params) -> dict:
    spec = adapters.ModelSpec(kind, model or NAMES[kind], "http://127.0.0.1:1", params)
    return orjson.loads(adapters.get(spec).encode(task).body)


def events_of(frames: list[bytes]) -> list[tuple[str, str]]:
    parser = SSEParser()
    return [e for f in frames for e in parser.feed(f)]


def assemble(assembler, frames: list[bytes]):
    for event, data in events_of(frames):
        assembler.feed(event, data)
    return assembler


# ---- pure: the SSE parser and the assemblers -----------------------------------------------------
def test_the_sse_parser_reads_events_cut_anywhere():
    stream = (
        b': a comment\r\nevent: message_start\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
        b"id: 7\nretry: 100\ndata: [DONE]\n\nevent: ping\ndata: {}\n\n"
    )
    expected = [("message_start", '{"a":\n1}'), ("", "[DONE]"), ("ping", "{}")]
    for size in (1, 2, 5, len(stream)):
        parser = SSEParser()
        got = [e for at in range(0, len(stream), size) for e in parser.feed(stream[at : at + size])]
        assert got == expected, size
    parser = SSEParser()
    assert parser.feed(b'data: {"last": true}') == [] and parser.close() == [("", '{"last": true}')]


OPENAI_MODES = (
    "ok",
    "fenced",
    "refusal",
    "reasoning",
    "truncated",
    "truncated_empty",
    "empty",
    "cached",
    "content_filter",
)
ANTHROPIC_MODES = (
    "ok",
    "fenced",
    "refusal",
    "truncated",
    "truncated_empty",
    "thinking",
    "text",
    "empty",
    "cached",
)
GEMINI_MODES = (
    "ok",
    "fenced",
    "truncated",
    "truncated_empty",
    "thought",
    "safety",
    "blocked",
    "cached",
)


@pytest.mark.parametrize("pieces", [1, 4])
def test_each_stream_assembles_into_the_non_streamed_reply(data_dir: Path, pieces: int):
    for task in tasks(data_dir)[:6]:
        for model in ("gpt-6-luna", "gpt-fake"):
            chat = (
                body("openai", task, model, reasoning_effort="high")
                if model == "gpt-6-luna"
                else body("openai", task, model)
            )
            for mode in OPENAI_MODES:
                reply = wire_formats.openai_chat(chat, mode)
                got = assemble(ChatAssembler(), sse_streams.openai_events(reply, pieces))
                assert got.complete and orjson.loads(got.body()) == reply, (model, mode)
        for model in ("claude-sonnet-5-5", "claude-fake"):
            for options in ({}, {"structured": "tool"}):
                spec = adapters.ModelSpec("anthropic", model, "http://127.0.0.1:1", options=options)
                messages = orjson.loads(adapters.get(spec).encode(task).body)
                for mode in ANTHROPIC_MODES:
                    reply = wire_formats.anthropic_messages(messages, mode)
                    got = assemble(MessagesAssembler(), sse_streams.anthropic_events(reply, pieces))
                    assert got.complete and orjson.loads(got.body()) == reply, (
                        model,
                        options,
                        mode,
                    )
        for level in (None, "HIGH"):
            generate = body(
                "gemini", task, **({"thinkingConfig": {"thinkingLevel": level}} if level else {})
            )
            for mode in GEMINI_MODES:
                reply = wire_formats.gemini_generate(generate, mode, "gemini-3.5-flash")
                got = assemble(GenerateAssembler(), sse_streams.gemini_events(reply, pieces))
                assert got.complete and orjson.loads(got.body()) == reply, (level, mode)


def test_the_assemblers_agree_with_the_sdks_own_accumulators(data_dir: Path):
    """openai's ``ChatCompletionStreamState`` and anthropic's ``accumulate_event``, fed the same
    events, build the same reply as ours."""
    task = tasks(data_dir)[0]
    reply = wire_formats.openai_chat(body("openai", task, reasoning_effort="low"), "cached")
    frames = sse_streams.openai_events(reply, 5)
    state = ChatCompletionStreamState()
    for _, data in events_of(frames):
        if data != "[DONE]":
            state.handle_chunk(ChatCompletionChunk.model_validate_json(data))
    final = state.get_final_completion()
    ours = orjson.loads(assemble(ChatAssembler(), frames).body())
    assert (final.choices[0].message.content, final.choices[0].finish_reason) == (
        ours["choices"][0]["message"]["content"],
        ours["choices"][0]["finish_reason"],
    )
    assert final.usage.model_dump(exclude_none=True) == ours["usage"]

    for options in ({}, {"structured": "tool"}):
        spec = adapters.ModelSpec(
            "anthropic", "claude-sonnet-5-5", "http://127.0.0.1:1", options=options
        )
        reply = wire_formats.anthropic_messages(
            orjson.loads(adapters.get(spec).encode(task).body), "cached"
        )
        frames = sse_streams.anthropic_events(reply, 4)
        snapshot, bufs = None, {}
        adapter = anthropic._models.construct_type  # the SDK's own event parsing
        for _, data in events_of(frames):
            event = adapter(type_=RawMessageStreamEvent, value=orjson.loads(data))
            if event.type != "ping":
                snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
        ours = orjson.loads(assemble(MessagesAssembler(), frames).body())
        sdk = snapshot.to_dict()
        blocks = [{k: v for k, v in b.items() if k != "parsed_output"} for b in sdk["content"]]
        assert blocks == ours["content"] and sdk["stop_reason"] == ours["stop_reason"]
        assert sdk["usage"] == ours["usage"]


def test_a_stream_without_its_stop_is_not_complete_and_an_error_event_is_kept(data_dir: Path):
    task = tasks(data_dir)[0]
    reply = wire_formats.anthropic_messages(body("anthropic", task))
    frames = sse_streams.anthropic_events(reply)
    cut = assemble(MessagesAssembler(), frames[:-2])  # message_delta and message_stop lost
    assert (cut.began, cut.complete) == (True, False)
    errored = assemble(MessagesAssembler(), [frames[0], sse_streams.error_event("anthropic")])
    assert errored.began and orjson.loads(errored.body())["error"]["type"] == "overloaded_error"
    first = assemble(ChatAssembler(), [sse_streams.error_event("openai")])
    assert (first.began, first.complete, first.error is not None) == (False, False, True)
    chat = wire_formats.openai_chat(body("openai", task, "gpt-fake"))
    frames = sse_streams.openai_events(chat)
    assert not assemble(ChatAssembler(), frames[:2]).complete
    assert assemble(
        ChatAssembler(), frames[:-2]
    ).complete  # the finish_reason came; the usage chunk did not


# ---- when a request is streamed ------------------------------------------------------------------
def streams_with(task):
    def streams(model: str, mode: str = "auto", **params) -> bool:
        kind, _, name = model.partition(":")
        a = adapters.get(
            adapters.ModelSpec(kind, name, "http://127.0.0.1:1", params), replace(FAST, stream=mode)
        )
        return a.streams(a.encode(task))

    return streams


def _fed(assembler, events: list[tuple[str, dict]]) -> dict:
    for event, doc in events:
        assembler.feed(event, orjson.dumps(doc).decode())
    return orjson.loads(assembler.body())


@pytest.mark.parametrize("falls", [False, True], ids=["growing", "falling"])
def test_every_assembler_keeps_no_usage_whose_counts_fall(falls: bool):
    """One rule for every stream that states its usage in several events (``Assembler._usage``):
    cumulative counts, the last kept, unless a count falls. Gemini: 500 input / 40 output, then
    500 / 45 (kept) or 1 / 0 (none kept: the old code kept 1 / 0, $0); Anthropic: message_start's
    500 / 1, message_delta's 45 output, then a message_delta of 0 / 0 (none kept: the old code kept
    0 / 0); OpenAI: 100 / 50 then 1 / 0 (none, as before)."""
    text = {"content": {"parts": [{"text": "{}"}], "role": "model"}}
    first = {"promptTokenCount": 500, "candidatesTokenCount": 40, "totalTokenCount": 540}
    last = {"promptTokenCount": 1, "candidatesTokenCount": 0, "totalTokenCount": 1}
    last = last if falls else first | {"candidatesTokenCount": 45, "totalTokenCount": 545}
    gemini = _fed(
        GenerateAssembler(),
        [
            ("", {"candidates": [text], "usageMetadata": first}),
            ("", {"candidates": [{"finishReason": "STOP"}], "usageMetadata": last}),
        ],
    )
    assert gemini.get("usageMetadata") == (None if falls else last)
    start = {"id": "m", "type": "message", "role": "assistant", "content": []}
    start |= {"model": "claude-fake", "usage": {"input_tokens": 500, "output_tokens": 1}}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        ("message_delta", delta | {"usage": {"output_tokens": 45}}),
    ]
    if falls:
        events.append(("message_delta", delta | {"usage": {"input_tokens": 0, "output_tokens": 0}}))
    events.append(("message_stop", {"type": "message_stop"}))
    anthropic_ = _fed(MessagesAssembler(), events)
    assert anthropic_.get("usage") == (
        None if falls else {"input_tokens": 500, "output_tokens": 45}
    )
    chunk = {"object": "chat.completion.chunk", "choices": []}
    usages = [{"prompt_tokens": 100, "completion_tokens": 50}]
    usages.append({"prompt_tokens": 1, "completion_tokens": 0} if falls else usages[0])
    chat = _fed(ChatAssembler(), [("", chunk | {"usage": u}) for u in usages])
    assert chat.get("usage") == (None if falls else usages[0])


def test_auto_streams_where_a_reply_can_be_long(data_dir: Path):
    streams = streams_with(tasks(data_dir)[0])
    assert [
        streams(m)
        for m in (
            "openai:gpt-6-luna",
            "anthropic:claude-sonnet-5-5",
            "gemini:gemini-3.5-flash",
            "gemini:gemini-2.5-pro",
        )
    ] == [True] * 4  # they think by default
    assert [
        streams(m)
        for m in (
            "openai:gpt-4.1-mini",
            "anthropic:claude-3-5-haiku-20241022",
            "gemini:gemini-2.0-flash",
            "gemini:gemini-2.5-flash-lite",
        )
    ] == [False] * 4
    assert streams("openai:gpt-6-luna", reasoning_effort="none") is False
    assert streams("openai:gpt-4.1-mini", reasoning_effort="low") is True
    assert streams("openai:gpt-4.1-mini", max_completion_tokens=LONG_REPLY_TOKENS) is False
    assert streams("openai:gpt-4.1-mini", max_completion_tokens=LONG_REPLY_TOKENS + 1) is True
    assert streams("anthropic:claude-sonnet-5-5", thinking={"type": "disabled"}) is False
    assert (
        streams(
            "anthropic:claude-3-5-haiku-20241022",
            thinking={"type": "enabled", "budget_tokens": 2000},
        )
        is True
    )
    assert streams("anthropic:claude-opus-4-1@20250805", max_tokens=8192) is False
    assert (
        streams("anthropic:claude-opus-4-1@20250805", max_tokens=8193) is True
    )  # the SDK's per-model limit
    assert streams("gemini:gemini-3.5-flash", thinkingConfig={"thinkingBudget": 0}) is False
    assert streams("gemini:gemini-2.0-flash", thinkingConfig={"thinkingLevel": "LOW"}) is True
    assert streams("gemini:gemini-2.0-flash", maxOutputTokens=30_000) is True
    assert streams("openai:gpt-4.1-mini", "always") and not streams("openai:gpt-6-luna", "never")
    assert not streams("logprobs:gpt-4.1-mini", "always")  # no streamed form: one token a question
    assert not streams("openai-decisions:luna", "always")


def test_every_request_the_anthropic_sdk_refuses_unstreamed_is_streamed(data_dir: Path):
    """The anthropic SDK's own check (``_calculate_nonstreaming_timeout``, which raises "Streaming
    is required ...") on the body we build, for every model, effort and budget: whatever it refuses,
    auto streams; the rule we copied (``anthropic_sdk_refuses``) says the same as the SDK."""
    client = anthropic.Anthropic(api_key="sk-ant-test-0123456789")
    task = tasks(data_dir)[0]
    models = (
        "claude-sonnet-5-5",
        "claude-opus-5-5",
        "claude-fake",
        "claude-3-5-haiku-20241022",
        *MODEL_NONSTREAMING_TOKENS,
    )
    refused = 0
    for model in models:
        for effort in (None, "low", "high", "xhigh", "max"):
            for cap in (None, 1024, 8192, 8193, 16_000, 21_333, 21_334, 64_000, 128_000):
                spec = adapters.ModelSpec(
                    "anthropic",
                    model,
                    "http://127.0.0.1:1",
                    {"max_tokens": cap} if cap else {},
                    effort=effort,
                )
                a = adapters.get(spec, replace(FAST, stream="auto"))
                request = a.encode(task)
                sent = orjson.loads(request.body)
                try:
                    client._calculate_nonstreaming_timeout(
                        sent["max_tokens"], MODEL_NONSTREAMING_TOKENS.get(model)
                    )
                    sdk_refuses = False
                except ValueError as exc:
                    assert "Streaming is required" in str(exc)
                    sdk_refuses = True
                assert anthropic_sdk_refuses(model, sent["max_tokens"]) == sdk_refuses, (
                    model,
                    effort,
                    cap,
                )
                if sdk_refuses:
                    refused += 1
                    assert a.streams(request), (model, effort, cap)
    assert refused > 20  # (the default 64,000 at xhigh and max among them)
    default_max = orjson.loads(
        adapters.get(adapters.ModelSpec("anthropic", "claude-sonnet-5-5", effort="max"))
        .encode(task)
        .body
    )["max_tokens"]
    assert default_max == 64_000 and anthropic_sdk_refuses("claude-sonnet-5-5", default_max)


def test_the_stream_switch_is_never_in_the_request_or_its_key(data_dir: Path):
    task = tasks(data_dir)[0]
    made = {
        m: adapters.get(
            adapters.ModelSpec("openai", "gpt-6-luna", "http://127.0.0.1:1"),
            replace(FAST, stream=m),
        ).encode(task)
        for m in ("always", "never")
    }
    assert made["always"].key == made["never"].key and made["always"].body == made["never"].body
    assert b"stream" not in made["always"].body
    with pytest.raises(ValueError, match="set by the adapter itself"):
        adapters.get(
            adapters.ModelSpec("openai", "gpt-6-luna", "http://127.0.0.1:1", {"stream": True})
        )


# ---- over HTTP -----------------------------------------------------------------------------------
def model_string(kind: str, server: FakeLLM, name: str | None = None) -> str:
    return f"{kind}:{name or NAMES[kind]}@{server.base_url(kind)}"


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_a_streamed_and_a_whole_answer_give_the_same_cache_rows(
    data_dir: Path, tmp_path: Path, kind: str
):
    rows = {}
    async with FakeLLM() as server:  # one server: one endpoint, so the same keys
        server.pieces = 4
        for mode in ("always", "never"):
            server.requests.clear()
            server.streamed.clear()
            _, stats, rows[mode] = await run_model(
                model_string(kind, server),
                data_dir,
                tmp_path / mode,
                replace(FAST, stream=mode),
                limit=None,
                evals=None,
            )
            assert server.streamed == [mode == "always"] * len(tasks(data_dir))
            sent = [b for _, b in server.requests]
            if kind == "gemini":
                assert {p.rsplit(":", 1)[1] for p, _ in server.requests} == {
                    "streamGenerateContent" if mode == "always" else "generateContent"
                }
            elif mode == "always":
                assert all(b["stream"] is True for b in sent)
                assert all(
                    b.get("stream_options")
                    == ({"include_usage": True} if kind == "openai" else None)
                    for b in sent
                )
            else:
                assert all("stream" not in b for b in sent)
            assert (stats.ok, stats.failed, stats.attempts) == (
                len(tasks(data_dir)),
                0,
                len(tasks(data_dir)),
            )
    streamed, whole = (rows[m].sort("key") for m in ("always", "never"))
    assert streamed.drop(*TIMING, "raw_reply").rows() == whole.drop(*TIMING, "raw_reply").rows()
    assert [orjson.loads(r) for r in streamed["raw_reply"]] == [
        orjson.loads(r) for r in whole["raw_reply"]
    ]
    assert whole["ttft_s"].null_count() == whole.height and streamed["ttft_s"].null_count() == 0
    pairs = zip(streamed["ttft_s"], streamed["latency_ms"], strict=True)
    assert all(0 < t * 1000 <= ms for t, ms in pairs)
    thinking = streamed.filter(
        pl.col("output_tokens") > 1000
    ).height  # the thinking spent, from the last event
    assert thinking == (len(tasks(data_dir)) if kind in ("openai", "anthropic") else 0)


async def test_thinking_deltas_and_the_final_usage_reach_the_cache(data_dir: Path, tmp_path: Path):
    async with FakeLLM() as server:
        spec = adapters.ModelSpec("anthropic", "claude-sonnet-5-5", server.url, effort="low")
        _, stats, rows = await run_model(
            spec, data_dir, tmp_path / "a", replace(FAST, stream="auto"), limit=1
        )
        (b,) = [b for _, b in server.requests]
    row = rows.row(0, named=True)
    reply = orjson.loads(row["raw_reply"])
    assert [c["type"] for c in reply["content"]] == ["thinking", "text"]
    assert reply["content"][0] == {
        "type": "thinking",
        "thinking": "Weighing each option in turn...",
        "signature": "sig",
    }
    n = len(next(iter(Suite(discover(data_dir), limit=1, evals=("when2call",)).tasks())).questions)
    assert (
        row["output_tokens"]
        == wire_formats.THINKING_TOKENS["low"] + wire_formats.OUTPUT_TOKENS_PER_QUESTION * n
    )
    assert (row["status"], b["stream"], stats.ok) == ("ok", True, 1)


@pytest.fixture
def one_request(data_dir: Path, tmp_path: Path):
    """``run_model`` of the first task (``limit=1``) for the model ``kind`` at ``server``, into the
    cache ``tmp_path / "c"``, with ``FAST``'s limits, streamed (``stream="always"``) unless the
    keyword ``limits`` say otherwise: ``(plan, stats, rows)``."""

    async def run(kind: str, server: FakeLLM, **limits):
        limits = {"stream": "always", **limits}
        return await run_model(
            model_string(kind, server), data_dir, tmp_path / "c", replace(FAST, **limits), limit=1
        )

    return run


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_a_stream_cut_mid_way_is_a_transient_failure_not_sent_again_in_the_run(
    one_request, kind: str
):
    async with FakeLLM(["cut:3"]) as server:
        server.pieces = 6
        _, stats, rows = await one_request(kind, server)
        assert len(server.requests) == 1  # part of it arrived (billed): not resent in this run
        row = rows.row(0, named=True)
        assert (row["status"], row["error_kind"], row["attempts"], row["answers"]) == (
            "failed",
            "transient",
            1,
            None,
        )
        assert "the streamed reply was cut after" in row["error"] and "never scored" in row["error"]
        assert row["raw_reply"] is None  # the partial text is not kept as a reply
        # the next run requests it again
        _, again, rows = await one_request(kind, server)
        assert (again.sent, again.ok, len(server.requests)) == (1, 1, 2)


@pytest.mark.parametrize("fault", ["cut:0", "error_first"])
async def test_a_stream_that_fails_before_any_of_its_reply_is_retried(one_request, fault: str):
    async with FakeLLM([fault]) as server:
        _, stats, rows = await one_request("anthropic", server)
        assert (stats.ok, stats.attempts, len(server.requests)) == (1, 2, 2)


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_an_error_event_mid_stream_is_final_for_the_run(one_request, kind: str):
    async with FakeLLM(["error_event"]) as server:
        _, stats, rows = await one_request(kind, server)
        assert (stats.failed, stats.attempts, len(server.requests)) == (1, 1, 1)
    error = rows["error"][0]
    assert "an error event" in error and (
        "Overloaded" in error or "overloaded" in error or "error" in error
    )


async def test_an_idle_stall_ends_the_attempt_after_the_idle_timeout(one_request):
    async with FakeLLM(["stall:3"]) as server:
        began = time.monotonic()
        _, stats, rows = await one_request("openai", server, attempt_timeout_s=0.5)
        took = time.monotonic() - began
        assert (stats.failed, len(server.requests)) == (1, 1)
    # part of it arrived: the idle timeout is no further byte (not "no byte of the reply")
    assert "(no further byte within the idle timeout (--timeout))" in rows["error"][0]
    assert "sent whole" not in rows["error"][0]  # streamed: the reply was arriving
    assert took < 2.5  # the 3 s stall was not waited out


async def test_a_whole_reply_slower_than_the_idle_timeout_is_sent_again(one_request):
    """Not streamed, nothing of a reply arrives while it is generated: the idle timeout ends the
    attempt and, nothing having arrived, the request is sent again (as the issue's capture server
    saw). Streamed, the same slow reply arrives steadily and is stored once (the next test)."""
    async with FakeLLM(["delay:1.2", "delay:1.2"]) as server:
        _, stats, rows = await one_request(
            "anthropic", server, stream="never", attempt_timeout_s=0.4, max_attempts=3
        )
        assert (stats.ok, stats.attempts, len(server.requests), server.streamed) == (
            1,
            3,
            3,
            [False] * 3,
        )
    assert rows["ttft_s"][0] is None


async def test_a_whole_reply_past_the_idle_timeout_says_to_raise_it_or_stream(one_request):
    # --stream never: the idle timeout bounds the model's whole thinking, and the failure says so
    # in docs/limits.md's words ("Long replies"); a streamed stall does not (the test before)
    async with FakeLLM(["delay:1.2"]) as server:
        _, stats, rows = await one_request(
            "anthropic", server, stream="never", attempt_timeout_s=0.4, max_attempts=1
        )
        assert (stats.failed, len(server.requests)) == (1, 1)
    assert rows["error"][0].endswith(
        ": no byte of the reply within the idle timeout (--timeout): a reply sent whole (not "
        "streamed) arrives only once generated, so the timeout bounds the model's whole "
        "thinking: give a --timeout longer than its longest thinking, or stream it (--stream "
        "always): streaming is the way to let a model think longer than --timeout"
    )


@pytest.mark.slow
async def test_a_reply_slower_than_any_timeout_but_steadily_arriving_is_stored_once(
    data_dir: Path, tmp_path: Path
):
    """The issue's 30 s reply at ``--timeout 2``, faster: ``--timeout 1``, a reply taking over 4 s
    with an event every 0.3 s, ``--max-attempts 3``: stored once, the server asked exactly once."""
    async with FakeLLM(default="slow:0.3") as server:
        server.pieces = 5
        args = [
            "run",
            "--model",
            model_string("anthropic", server),
            "--data-dir",
            str(data_dir),
            "--evals",
            "when2call",
            "--limit",
            "1",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
            "--timeout",
            "1",
            "--max-attempts",
            "3",
            "-q",
        ]
        began = time.monotonic()
        code = await asyncio.to_thread(main, args)
        took = time.monotonic() - began
        assert (code, len(server.requests), server.streamed) == (0, 1, [True])
    rows = pl.read_parquet(sorted((tmp_path / "cache" / "shards").glob("*.parquet")))
    assert rows.height == 1 and rows["status"][0] == "ok" and rows["attempts"][0] == 1
    assert rows["latency_ms"][0] > 4000 and took > 4
    # the first thinking delta is the fourth event (after message_start, ping, content_block_start)
    assert 0.85 <= rows["ttft_s"][0] and rows["ttft_s"][0] * 1000 < rows["latency_ms"][0] - 3000


async def test_the_total_bound_ends_a_reply_that_is_still_arriving(one_request):
    async with FakeLLM(default="slow:0.3") as server:
        server.pieces = 8
        _, stats, rows = await one_request(
            "gemini", server, attempt_timeout_s=1, max_reply_time_s=1.0
        )
        assert (stats.failed, len(server.requests)) == (1, 1)
    assert "the reply took longer than --max-reply-time 1 s" in rows["error"][0]


async def test_a_server_that_answers_a_streamed_request_whole_is_read_whole(one_request):
    """An OpenAI-compatible server that ignores ``stream`` and replies with one JSON body."""
    async with FakeLLM() as server:
        original = server._stream

        async def whole(request, payload, fmt, mode, fault="", arg=""):
            from aiohttp import web

            return web.json_response(wire_formats.openai_chat(payload, mode))

        server._stream = whole
        _, stats, rows = await one_request("openai", server)
        server._stream = original
    assert (stats.ok, rows["ttft_s"][0]) == (1, None)


def test_the_cli_takes_stream_and_max_reply_time_and_refuses_bad_values(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    base = [
        "estimate",
        "--model",
        "openai:gpt-6-luna@http://127.0.0.1:9/v1",
        "--data-dir",
        str(data_dir),
        "--limit",
        "1",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main([*base, "--stream", "sometimes"]) == 2
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err
    assert main([*base, "--max-reply-time", "0"]) == 2
    assert "argument --max-reply-time: expected a number above 0" in capsys.readouterr().err
    run = tmp_path / "run.toml"
    run.write_text(
        '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'stream = "sometimes"\n\n'
        '[[models]]\nprovider = "p"\nmodel = "gpt-6-luna"\n'
    )
    assert main(["estimate", str(run), "--data-dir", str(data_dir), "--limit", "1"]) == 2
    assert "stream" in capsys.readouterr().err


def test_a_run_file_and_the_flags_set_the_stream_mode(data_dir: Path, tmp_path: Path):
    from dxi.runner.planning.inputs import PlanInputs
    from dxi.runner.planning.plan import from_inputs

    run = tmp_path / "run.toml"
    run.write_text(
        '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nstream = "never"\n'
        'max_reply_time_s = 900\n\n[[models]]\nprovider = "p"\nmodel = "gpt-6-luna"\n'
    )
    plan = from_inputs(PlanInputs(run_file=run, data_dir=data_dir, limit=1))
    (m,) = plan.models
    assert (m.adapter.limits.stream, m.adapter.limits.max_reply_time_s) == ("never", 900)
    plan = from_inputs(
        PlanInputs(run_file=run, data_dir=data_dir, limit=1, limits={"stream": "always"})
    )
    assert plan.models[0].adapter.limits.stream == "always"  # the flag over the file


# ---- Anthropic's thinking tokens -----------------------------------------------------------------
def test_a_max_tokens_stop_spent_thinking_is_cut_off_while_thinking_not_empty(data_dir: Path):
    """The thinking is not returned (no thinking block), but
    ``usage.output_tokens_details.thinking_tokens`` counts it: the reply was cut off while
    thinking."""
    task = tasks(data_dir)[0]
    reply = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-opus-5-5",
        "content": [],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "output_tokens": 1024,
            "output_tokens_details": {"thinking_tokens": 1024},
        },
    }
    assert reply_problems(Message, reply) == []  # the field as the anthropic SDK declares it
    decoded = decode_messages(task, orjson.dumps(reply))
    assert decoded.cut_off == "thinking"
    assert decoded.answers[0].error == llm.TRUNCATED_THINKING.format(
        "stop_reason max_tokens", "max_tokens"
    )
    reply["usage"].pop("output_tokens_details")
    decoded = decode_messages(task, orjson.dumps(reply))
    assert decoded.answers[0].error == llm.TRUNCATED_EMPTY.format(
        "stop_reason max_tokens", "max_tokens"
    )


async def test_the_final_events_usage_is_charged_and_a_cut_stream_its_reservation(
    data_dir: Path, tmp_path: Path
):
    """Under a cost bound, a streamed reply costs what its final event's usage says (as a whole
    reply's would); a stream cut mid-way, whose usage never came, is charged the attempt's
    reservation (its bound)."""
    from dxi.cache import Cache
    from dxi.runner.planning.plan import ModelRun
    from dxi.runner.sending.cost import Budget
    from dxi.runner.sending.scheduler import run

    price = (1000.0, 2000.0)  # USD per million input / output tokens
    spent = {}
    async with FakeLLM() as server:
        for fault in ("ok", "cut:4"):
            server.script.append(fault)
            spec = adapters.ModelSpec(
                "anthropic", "claude-sonnet-5-5", server.url, {"max_tokens": 8000}
            )
            a = adapters.get(spec, replace(FAST, stream="always"))
            await a.start()
            budget = Budget(100.0)
            try:
                with Cache(tmp_path / fault) as cache:
                    await run(
                        [ModelRun(a, price=price)],
                        Suite(discover(data_dir), limit=1, evals=("when2call",)),
                        cache,
                        budget=budget,
                    )
                    row = cache.scan().collect().row(0, named=True)
            finally:
                await a.close()
            spent[fault] = (budget.spent, row)
    ok_spent, ok_row = spent["ok"]
    assert ok_row["status"] == "ok"
    assert ok_spent == pytest.approx(
        (ok_row["input_tokens"] * 1000.0 + ok_row["output_tokens"] * 2000.0) / 1e6
    )
    cut_spent, cut_row = spent["cut:4"]
    assert cut_row["status"] == "failed" and cut_row["http_status"] is None
    assert (
        cut_spent > 8000 * 2000.0 / 1e6
    )  # the reservation: at least max_tokens at the output price


def test_the_streamed_bodies_conform_to_the_sdks_streaming_request_types(data_dir: Path):
    """The body sent when streaming: the canonical body (which conforms to the non-streaming request
    type) plus the switch, each of whose fields has the type the SDK's streaming request TypedDict
    declares."""
    import typing

    from anthropic.types import message_create_params
    from openai.types.chat import completion_create_params

    from .helpers.sdk_types import conforms

    for task in tasks(data_dir)[:4]:
        for kind, model, params in (
            ("openai", "gpt-6-luna", completion_create_params),
            ("anthropic", "claude-sonnet-5-5", message_create_params),
        ):
            a = adapters.get(adapters.ModelSpec(kind, model, "http://127.0.0.1:1"))
            canonical = orjson.loads(a.encode(task).body)
            sent = orjson.loads(a.stream_body(a.encode(task).body))
            switch = {k: v for k, v in sent.items() if k not in canonical}
            name = "CompletionCreateParams" if kind == "openai" else "MessageCreateParams"
            hints = typing.get_type_hints(getattr(params, name + "Streaming"), include_extras=True)
            assert switch == (
                {"stream": True, "stream_options": {"include_usage": True}}
                if kind == "openai"
                else {"stream": True}
            )
            assert all(conforms(v, hints[k]) == [] for k, v in switch.items())
            assert conforms(canonical, getattr(params, name + "NonStreaming")) == []
    g = adapters.get(adapters.ModelSpec("gemini", "gemini-3.5-flash", "http://127.0.0.1:1"))
    assert g.stream_url == (
        "http://127.0.0.1:1/v1beta/models/gemini-3.5-flash:streamGenerateContent?alt=sse"
    )


async def test_a_stream_larger_than_max_reply_bytes_is_read_no_further_and_stored_invalid(
    data_dir: Path, tmp_path: Path
):
    async with FakeLLM() as server:
        limits = replace(FAST, stream="always", max_reply_bytes=600)
        _, stats, rows = await run_model(
            model_string("anthropic", server), data_dir, tmp_path / "c", limits, limit=1
        )
        assert (stats.invalid, stats.attempts, len(server.requests)) == (1, 1, 1)
    row = rows.row(0, named=True)
    assert row["status"] == "invalid"
    assert row["answers"][0]["error"] == "reply larger than 600 bytes"
    assert row["raw_reply"].startswith("event: message_start\ndata: ")
    assert len(row["raw_reply"]) <= 2000


async def test_a_stream_silent_past_the_idle_timeout_before_its_first_byte_says_so(one_request):
    # streamed, nothing of the reply (not even its headers) within --timeout: a model that thinks
    # before its first token (OpenAI's Chat Completions streams no reasoning) is silent that long,
    # and streaming does not help there; the failure says what to raise, in docs/limits.md's words
    async with FakeLLM(["delay:1.2"]) as server:
        _, stats, rows = await one_request("openai", server, attempt_timeout_s=0.4, max_attempts=1)
        assert (stats.failed, len(server.requests), server.streamed) == (1, 1, [True])
    assert rows["error"][0] == (
        "openai:gpt-6-luna: no byte of the reply within the idle timeout (--timeout): streamed, "
        "nothing of the reply arrived: a model may send nothing while it thinks before its first "
        "token (OpenAI's Chat Completions streams no reasoning), so give a --timeout longer than "
        "its longest time to first token at the effort you run"
    )
