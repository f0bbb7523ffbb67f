"""The batch protocols against the official SDKs: the fake batch servers
(``tests.fakes.fake_batches``) driven by the ``openai``, ``anthropic`` and ``google-genai`` clients
themselves (so the fake speaks the real protocol), and ``adapters.batches``' reading of every kind
of result line, classified as the synchronous reply would be."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
import pytest

from dxi import adapters
from dxi.adapters import Fatal, MalformedReply, ProviderStop, RateLimited, Transient
from dxi.adapters.anthropic_batch import AnthropicBatch
from dxi.adapters.anthropic_batch import status_of as anthropic_status
from dxi.adapters.batches import CANCELLED, COMPLETED, EXPIRED, FAILED, batch_api
from dxi.adapters.gemini_batch import GeminiBatch
from dxi.adapters.gemini_batch import status_of as gemini_status
from dxi.adapters.openai_batch import OpenAIBatch
from dxi.adapters.openai_batch import status_of as openai_status
from dxi.evals import Suite, discover

from .fakes import wire_formats
from .fakes.fake_provider import serve


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list:
    from .conftest import fixture_data

    return list(Suite(discover(fixture_data(tmp_path_factory.mktemp("data")))).tasks())


@pytest.mark.process
def test_the_official_clients_drive_the_fake_batch_servers(tasks: list):
    import anthropic
    import openai
    from google import genai
    from google.genai import types

    with serve(model=None, record=False, batch={"polls": 1}) as server:
        # OpenAI: upload, create with metadata, retrieve until it ends, read the output file, list,
        # cancel
        a = adapters.get(adapters.ModelSpec("openai", "m", server.url + "/v1", {}, {}))
        lines = [OpenAIBatch(a).line(a.encode(t)) for t in tasks]
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test-0123456789")
        uploaded = client.files.create(file=("in.jsonl", b"\n".join(lines)), purpose="batch")
        assert (uploaded.purpose, uploaded.bytes) == ("batch", len(b"\n".join(lines)))
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"dxi_entry": "dxi-test"},
        )
        assert (batch.status, batch.metadata) == ("validating", {"dxi_entry": "dxi-test"})
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            batch = client.batches.retrieve(batch.id)
        assert (batch.status, batch.request_counts.completed, batch.request_counts.total) == (
            "completed",
            12,
            12,
        )
        output = [
            orjson.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()
        ]
        assert sorted(x["custom_id"] for x in output) == sorted(a.encode(t).key for t in tasks)
        assert {x["response"]["status_code"] for x in output} == {200}
        assert [b.id for b in client.batches.list(limit=10)] == [batch.id]
        second = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert client.batches.cancel(second.id).status == "cancelling"
        assert client.batches.retrieve(second.id).status == "cancelled"
        # Anthropic: create, retrieve until ended, stream the results, list, cancel
        aa = adapters.get(adapters.ModelSpec("anthropic", "m", server.url, {}, {}))
        ac = anthropic.Anthropic(base_url=server.url, api_key="sk-ant-test-0123456789")
        mb = ac.messages.batches.create(
            requests=[
                {"custom_id": aa.encode(t).key, "params": orjson.loads(aa.encode(t).body)}
                for t in tasks
            ]
        )
        while mb.processing_status != "ended":
            mb = ac.messages.batches.retrieve(mb.id)
        assert mb.request_counts.succeeded == 12
        results = list(ac.messages.batches.results(mb.id))
        assert {r.result.type for r in results} == {"succeeded"} and len(results) == 12
        assert [b.id for b in ac.messages.batches.list(limit=5)] == [mb.id]
        other = ac.messages.batches.create(
            requests=[{"custom_id": "k1", "params": orjson.loads(aa.encode(tasks[0]).body)}]
        )
        assert ac.messages.batches.cancel(other.id).processing_status == "canceling"
        assert ac.messages.batches.retrieve(other.id).request_counts.canceled == 1
        # Gemini: inline requests, then a JSONL file through the Files API, download, list, cancel
        g = genai.Client(
            api_key="gk-test-0123456789",
            http_options=types.HttpOptions(base_url=server.url, api_version="v1beta"),
        )
        schema = {
            "type": "object",
            "properties": {"q": {"type": "string", "enum": ["A", "B"]}},
            "required": ["q"],
            "additionalProperties": False,
        }
        job = g.batches.create(
            model="gemini-x",
            src=[
                {
                    "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                    "config": {
                        "response_mime_type": "application/json",
                        "response_json_schema": schema,
                    },
                }
            ],
            config={"display_name": "dxi-inline"},
        )
        while not job.done:
            job = g.batches.get(name=job.name)
        assert (job.state.name, job.display_name) == ("JOB_STATE_SUCCEEDED", "dxi-inline")
        assert orjson.loads(job.dest.inlined_responses[0].response.text) == {"q": "B"}
        ga = adapters.get(adapters.ModelSpec("gemini", "gemini-x", server.url, {}, {}))
        path = Path(tempfile.mkdtemp()) / "in.jsonl"
        path.write_bytes(b"\n".join(GeminiBatch(ga).line(ga.encode(t)) for t in tasks))
        up = g.files.upload(
            file=str(path), config={"mime_type": "application/jsonl", "display_name": "in"}
        )
        job = g.batches.create(model="gemini-x", src=up.name, config={"display_name": "dxi-file"})
        while not job.done:
            job = g.batches.get(name=job.name)
        got = [orjson.loads(x) for x in g.files.download(file=job.dest.file_name).splitlines()]
        assert sorted(x["key"] for x in got) == sorted(ga.encode(t).key for t in tasks)
        assert [j.display_name for j in g.batches.list(config={"page_size": 10})] == [
            "dxi-file",
            "dxi-inline",
        ]
        third = g.batches.create(
            model="gemini-x", src=up.name, config={"display_name": "dxi-cancel"}
        )
        g.batches.cancel(name=third.name)
        assert g.batches.get(name=third.name).state.name == "JOB_STATE_CANCELLED"
        stats = server.stats()
    assert stats["sdk_problems"] == 0, stats["sdk_problem_lines"]
    assert stats["batch_creates"] == 7 and stats["batch_uploads"] == 2


def test_only_the_providers_with_a_batch_api_have_one():
    assert isinstance(batch_api(adapters.get("openai:m@http://127.0.0.1:1/v1")), OpenAIBatch)
    assert isinstance(batch_api(adapters.get("anthropic:m@http://127.0.0.1:1")), AnthropicBatch)
    assert isinstance(batch_api(adapters.get("gemini:m@http://127.0.0.1:1")), GeminiBatch)
    for model in (
        "embedded",
        "systemone:m@http://127.0.0.1:1",
        "openai-decisions:m@http://127.0.0.1:1",
        "logprobs:m@http://127.0.0.1:1/v1",
        "llamacpp:qwen2.5-coder-0.5b",
    ):
        assert batch_api(adapters.get(model)) is None, model


def test_a_line_carries_the_synchronous_body_byte_for_byte_and_the_key_as_its_id(tasks: list):
    for kind, url, api_cls in (
        ("openai", "http://127.0.0.1:1/v1", OpenAIBatch),
        ("anthropic", "http://127.0.0.1:1", AnthropicBatch),
        ("gemini", "http://127.0.0.1:1", GeminiBatch),
    ):
        a = adapters.get(f"{kind}:m@{url}")
        for task in tasks:
            request = a.encode(task)
            line = api_cls(a).line(request)
            doc = orjson.loads(line)
            assert request.body in line  # the very bytes a synchronous call sends
            body = doc.get("body") or doc.get("params") or doc.get("request")
            assert orjson.dumps(body) == request.body
            ident = doc.get("custom_id") or doc.get("key")
            assert (
                ident == request.key and len(ident) == 64 and ident.isalnum()
            )  # Anthropic: [A-Za-z0-9_-]{1,64}


def test_openai_result_lines_are_classified_as_their_synchronous_replies_would_be():
    api = OpenAIBatch(adapters.get("openai:m@http://127.0.0.1:1/v1"))
    key = "a" * 64

    def line(status: int | None, body: dict | None = None, error: dict | None = None) -> bytes:
        response = (
            None if status is None else {"status_code": status, "request_id": "req", "body": body}
        )
        return orjson.dumps(
            {"id": "batch_req_1", "custom_id": key, "response": response, "error": error}
        )

    ok = api.result(line(200, {"id": "x"}))
    assert (ok.key, ok.body, ok.error) == (key, b'{"id":"x"}', None)
    assert isinstance(
        api.result(line(500, wire_formats.error_body("openai", 500))).error, Transient
    )
    assert isinstance(
        api.result(line(429, wire_formats.error_body("openai", 429))).error, RateLimited
    )
    fatal = api.result(
        line(400, wire_formats.error_body("openai", 400, message="max_tokens is too large: 99999"))
    )
    assert isinstance(fatal.error, Fatal) and "max_tokens is too large" in str(fatal.error)
    assert isinstance(api.result(line(429, wire_formats.quota_body("openai"))).error, ProviderStop)
    for code in ("batch_expired", "batch_cancelled"):  # not run: given back, not an error
        got = api.result(line(None, error={"code": code, "message": "not run"}))
        assert (got.key, got.body, got.error) == (key, None, None)
    assert isinstance(
        api.result(line(None, error={"code": "server_error", "message": "x"})).error, Transient
    )
    bad = api.result(b'{"not": "a result line"}')
    assert bad.key == "" and isinstance(bad.error, MalformedReply)


def test_anthropic_and_gemini_result_lines_are_classified_alike():
    api = AnthropicBatch(adapters.get("anthropic:m@http://127.0.0.1:1"))
    key = "b" * 64

    def result(value: dict) -> bytes:
        return orjson.dumps({"custom_id": key, "result": value})

    assert (
        api.result(result({"type": "succeeded", "message": {"id": "msg"}})).body == b'{"id":"msg"}'
    )
    for kind, expected in (
        ("invalid_request_error", Fatal),
        ("api_error", Transient),
        ("overloaded_error", RateLimited),
        ("rate_limit_error", RateLimited),
        ("authentication_error", ProviderStop),
    ):
        error = {"type": "error", "error": {"type": kind, "message": "m"}}
        assert type(api.result(result({"type": "errored", "error": error})).error) is expected, kind
    for kind in ("canceled", "expired"):
        assert (
            api.result(result({"type": kind})).error is None
            and api.result(result({"type": kind})).body is None
        )
    gemini = GeminiBatch(adapters.get("gemini:m@http://127.0.0.1:1"))
    assert (
        gemini.result({"key": key, "response": {"candidates": []}}, b"").body
        == b'{"candidates":[]}'
    )
    for code, expected in (
        (3, Fatal),
        (13, Transient),
        (14, Transient),
        (8, RateLimited),
        (4, Transient),
    ):
        assert (
            type(gemini.result({"key": key, "error": {"code": code, "message": "m"}}, b"").error)
            is expected
        ), code
    assert isinstance(gemini.result({"no": "key"}, b"{}").error, MalformedReply)


def test_an_anthropic_errored_result_is_classified_by_its_error_code_then_its_type():
    """Each error type of the SDK, each ``details.error_code`` of the Messages API, and one neither
    knows: classified as the synchronous reply with its status (the old code: the three types the
    memory stores added read as HTTP 500, and a code was read only for a spend limit, so a
    ``storage_not_ready``, 503 "try again", under an ``invalid_request_error`` was kept as a
    deterministic failure)."""
    api = AnthropicBatch(adapters.get("anthropic:m@http://127.0.0.1:1"))

    def errored(kind: str, code: str | None = None, message: str = "m") -> Exception | None:
        inner = {"type": kind, "message": message} | (
            {"details": {"error_code": code}} if code else {}
        )
        line = {
            "custom_id": "c" * 64,
            "result": {"type": "errored", "error": {"type": "error", "error": inner}},
        }
        return api.result(orjson.dumps(line)).error

    for kind, code, expected, status in (
        ("timeout_error", None, Transient, 504),
        ("billing_error", None, ProviderStop, 402),
        ("memory_precondition_failed_error", None, Transient, 409),
        ("memory_path_conflict_error", None, Transient, 409),
        ("conflict_error", None, Transient, 409),
        ("request_too_large", None, Fatal, 413),
        ("a_type_added_later_error", None, Transient, 500),  # unknown: given back, bounded
        ("invalid_request_error", "storage_not_ready", Transient, 503),
        ("api_error", "request_body_too_large_after_decoding", Fatal, 413),
        ("rate_limit_error", "ramp_limit_exceeded", RateLimited, 429),
        ("rate_limit_error", "a_code_added_later", RateLimited, 429),  # unknown: the bare type
        ("api_error", "linked_organization_spend_limit_reached", ProviderStop, 402),
    ):
        error = errored(kind, code)
        assert (type(error), error.status) == (expected, status), (kind, code)
    # the type before the words: a billing_error is a billing stop whatever its message says
    said = str(errored("billing_error", message="Your credit balance is too low to access the API"))
    assert "HTTP 402 quota exhausted (billing)" in said
    # a used-up balance has no type nor code of its own (a 400): its words are the fallback
    said = str(errored("invalid_request_error", message="Your credit balance is too low to access"))
    assert "HTTP 400 quota exhausted (credit balance)" in said


def test_the_anthropic_error_tables_cover_the_installed_sdks_types_and_codes():
    """``STATUS_OF`` names every ``ErrorType`` of the SDK (``types/shared/error_type.py``), and
    ``STATUS_OF_CODE`` is, for each ``error_code`` the Messages API raises (the exceptions listed
    under ``Raises:`` in ``resources/messages/messages.py``), the status of its exception
    (``_error_classes.ERROR_CLASSES``): a newer SDK that adds one fails here."""
    import inspect
    import re
    from typing import get_args

    from anthropic._error_classes import ERROR_CLASSES
    from anthropic.resources.messages import messages
    from anthropic.types.shared.error_type import ErrorType

    from dxi.adapters.anthropic_batch import STATUS_OF, STATUS_OF_CODE

    assert set(get_args(ErrorType)) - set(STATUS_OF) == set()
    raised = {
        name
        for block in re.findall(r"Raises:\n(.*?)\"\"\"", inspect.getsource(messages), re.S)
        for name in re.findall(r"(\w+Error):", block)
    }
    coded = {cls.__name__: key for key, cls in ERROR_CLASSES.items() if key[1] is not None}
    assert {coded[name][1]: coded[name][0] for name in raised} == STATUS_OF_CODE


def test_each_providers_batch_states_map_to_one_outcome():
    assert openai_status({"id": "b", "status": "in_progress"}).outcome is None
    assert [
        openai_status({"id": "b", "status": s}).outcome
        for s in ("completed", "expired", "cancelled", "failed")
    ] == [COMPLETED, EXPIRED, CANCELLED, FAILED]
    tagged = openai_status(
        {
            "id": "b",
            "status": "validating",
            "metadata": {"dxi_entry": "dxi-1"},
            "request_counts": {"total": 3, "completed": 0, "failed": 0},
        }
    )
    assert (tagged.tag, tagged.total) == ("dxi-1", 3)
    counts = {"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0, "expired": 1}
    assert (
        anthropic_status(
            {"id": "m", "processing_status": "ended", "request_counts": counts}
        ).outcome
        == EXPIRED
    )
    assert (
        anthropic_status(
            {
                "id": "m",
                "processing_status": "ended",
                "cancel_initiated_at": "2026-01-01T00:00:00Z",
                "request_counts": counts,
            }
        ).outcome
        == CANCELLED
    )
    assert (
        anthropic_status(
            {"id": "m", "processing_status": "ended", "request_counts": dict(counts, expired=0)}
        ).outcome
        == COMPLETED
    )
    assert (
        anthropic_status(
            {"id": "m", "processing_status": "canceling", "request_counts": counts}
        ).outcome
        is None
    )
    assert (
        anthropic_status({"id": "m", "processing_status": "ended", "request_counts": counts}).tag
        is None
    )  # no tag
    op = {
        "name": "batches/1",
        "metadata": {
            "state": "BATCH_STATE_SUCCEEDED",
            "displayName": "dxi-2",
            "batchStats": {"requestCount": "4"},
            "output": {"responsesFile": "files/9"},
        },
    }
    status = gemini_status(op)
    assert (status.outcome, status.tag, status.total, status.output) == (
        COMPLETED,
        "dxi-2",
        4,
        {"responses_file": "files/9"},
    )
    assert (
        gemini_status({"name": "batches/2", "metadata": {"state": "BATCH_STATE_RUNNING"}}).outcome
        is None
    )


def test_a_results_file_is_read_a_piece_at_a_time_as_it_arrives(monkeypatch: pytest.MonkeyPatch):
    """``BatchAPI.lines`` over a real server on loopback that sends the file in pieces, each only
    once the reader has handed on the lines of the one before: every piece's complete lines come as
    one list before the next piece is sent (what ``runner.batch.driver`` appends in one write). A
    line cut between pieces is joined, blank lines are left out, a line longer than ``LINE_BYTES``
    comes as ``b""``, the API key is redacted, and the last line needs no newline."""
    import asyncio

    from aiohttp import web

    from dxi.adapters import batches

    monkeypatch.setattr(batches, "LINE_BYTES", 20)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-key")
    pieces = [
        b'{"a":1}\n{"b":',
        b'2}\n\n  \r\n{"c":"sk-secret-key"}\r\n' + b"y" * 30,
        b'yyy\n{"e":5}',
    ]
    expected = [[b'{"a":1}'], [b'{"b":2}', b'{"c":"[REDACTED]"}\r'], [b""], [b'{"e":5}']]

    async def scenario() -> list[list[bytes]]:
        handed = [asyncio.Event() for _ in pieces]

        async def handler(request: web.Request) -> web.StreamResponse:
            assert request.headers["Authorization"] == "Bearer sk-secret-key"
            resp = web.StreamResponse()
            await resp.prepare(request)
            for i, piece in enumerate(pieces):
                if i:
                    await asyncio.wait_for(handed[i - 1].wait(), 10)
                await resp.write(piece)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/v1/files/f/content", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        adapter = adapters.get(f"openai:m@http://127.0.0.1:{port}/v1")
        await adapter.start()
        got: list[list[bytes]] = []
        try:
            async for group in OpenAIBatch(adapter).lines(
                f"http://127.0.0.1:{port}/v1/files/f/content"
            ):
                got.append(group)
                if len(got) <= len(handed):
                    handed[len(got) - 1].set()
        finally:
            await adapter.close()
            await runner.cleanup()
        return got

    assert asyncio.run(scenario()) == expected


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_a_result_line_that_names_a_key_twice_is_a_malformed_reply_not_an_answer(provider):
    """A batch's result line whose reply names ``usage`` twice (100/50, then 1/0) was read with the
    last value kept, silently: the request cost its last usage (1/0). Read through ``results`` (the
    lines of the results file), it is now that request's MalformedReply, naming the key and where,
    as the synchronous endpoint's reply would be; a clean line beside it is its body."""
    from dxi.adapters.batches import BatchStatus

    twice = b'"usage": {"prompt_tokens": 100, "completion_tokens": 50}, '
    twice += b'"usage": {"prompt_tokens": 1, "completion_tokens": 0}'
    clean = b'"usage": {"prompt_tokens": 100, "completion_tokens": 50}'
    if provider == "openai":
        api, output = OpenAIBatch(adapters.get("openai:m@http://127.0.0.1:1/v1")), "output_file_id"
        where = "response.body"

        def line(key: str, usage: bytes) -> bytes:
            body = b'{"id": "x", ' + usage + b"}"
            return (
                b'{"custom_id": "%s", "response": {"status_code": 200, "body": %s}, "error": null}'
                % (
                    key.encode(),
                    body,
                )
            )
    elif provider == "anthropic":
        api, output = AnthropicBatch(adapters.get("anthropic:m@http://127.0.0.1:1")), "results_url"
        where = "result.message"

        def line(key: str, usage: bytes) -> bytes:
            message = b'{"id": "msg", ' + usage + b"}"
            return b'{"custom_id": "%s", "result": {"type": "succeeded", "message": %s}}' % (
                key.encode(),
                message,
            )
    else:
        api, output = GeminiBatch(adapters.get("gemini:m@http://127.0.0.1:1")), "responses_file"
        where = "response"

        def line(key: str, usage: bytes) -> bytes:
            return b'{"key": "%s", "response": {"candidates": [], %s}}' % (key.encode(), usage)

    raws = [line("a" * 64, twice), line("b" * 64, clean)]

    async def lines(url: str, headers: dict | None = None):
        yield raws

    api.lines = lines  # the results file's lines, as read from the network
    status = BatchStatus("batch_1", "ended", output={output: "/results"})
    got = [r async for piece in api.results(status) for r in piece]
    assert [r.key for r in got] == ["a" * 64, "b" * 64]
    assert isinstance(got[0].error, MalformedReply) and got[0].body is None
    assert str(got[0].error) == (
        f"reply names the key 'usage' twice in {where}: which value is meant is ambiguous"
    )
    assert got[1].error is None and orjson.loads(got[1].body)["usage"]["prompt_tokens"] == 100
