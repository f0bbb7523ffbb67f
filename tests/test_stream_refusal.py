"""A server that refuses the streamed form of request
(``adapters.provider_errors.streaming_refused``): an OpenAI-compatible server without
``stream_options`` answers a streamed request 400 with ``"param": "stream_options"`` (``"code":
null``; OpenAI's own ``"unsupported_parameter"``). That stops the model, as any refused form of
request does, saying to run it with ``--stream never``; nothing is stored, so a ``--stream never``
run sends every request (never "cached" failures).

The runs are ``dxi run`` in this process against ``FakeLLM`` (``"nostreamopt"``) on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from dxi.adapters.errors import REQUEST, Fatal, ProviderStop
from dxi.adapters.provider_errors import streaming_refused
from dxi.cache import Cache
from dxi.runner.cli import main
from dxi.runner.errors import EXIT_PROVIDER_STOPPED
from dxi.runner.sending.retry import reclassify

from .fakes.fake_llm_server import FakeLLM
from .helpers.synthetic import data_dir

TASKS = 3
ADVICE = (
    "the server refuses the streamed form of request (stream_options): run this model with "
    '--stream never (a run file\'s provider table: stream = "never")'
)


def _args(tmp_path: Path, model: str, stream: str) -> list[str]:
    return [
        "run",
        "--model",
        model,
        "--data-dir",
        str(tmp_path / "data"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--stream",
        stream,
        "--max-in-flight",
        "1",
        "--evals",
        "when2call",  # the synthetic data: When2Call only
        "-q",
    ]


@pytest.mark.parametrize("code", ["", "coded"])
async def test_a_server_refusing_stream_options_stops_the_model_and_stream_never_sends_all(
    tmp_path: Path, capsys: pytest.CaptureFixture, code: str
):
    """The trial's server (``code: null``) had every request sent and stored as a deterministic
    failure (exit 1), and a rerun with ``--stream never`` found them all cached; with OpenAI's
    ``code: unsupported_parameter`` the model stopped but the message said only "Fix the cause"."""
    data_dir(tmp_path / "data", TASKS)
    async with FakeLLM(default=f"nostreamopt:{code}") as server:
        model = f"openai:plain@{server.url}/v1"
        assert await asyncio.to_thread(main, _args(tmp_path, model, "always")) == (
            EXIT_PROVIDER_STOPPED
        )
        assert [("stream_options" in body) for _, body in server.requests] == [True]
        err = capsys.readouterr()
        s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
        (stop,) = s["stopped_providers"]
        assert (
            stop["scope"],
            stop["models"],
            stop["cause"],
            stop["refused"],
            stop["not_sent"],
        ) == (
            "model",
            ["openai:plain"],
            REQUEST,
            1,
            TASKS - 1,
        )
        assert stop["message"].endswith(
            f"Unrecognized request argument supplied: stream_options — {ADVICE}"
        )
        assert "run this model with --stream never" in err.out + err.err
        with Cache(tmp_path / "cache") as cache:
            assert cache.scan().collect().height == 0  # nothing stored: the next run sends them
        # the advice followed: every request sent whole, answered
        assert await asyncio.to_thread(main, _args(tmp_path, model, "never")) == 0
        assert [("stream" in body) for _, body in server.requests[1:]] == [False] * TASKS
    with Cache(tmp_path / "cache") as cache:
        rows = cache.scan().collect()
    assert rows["status"].to_list() == ["ok"] * TASKS


def test_a_refusal_of_the_streamed_form_is_a_stop_whatever_the_model_answered_before():
    """The refusal is the form's, never this request's own: even once the model has answered others
    in the run (a REQUEST stop becomes a stored Fatal then), it stays a stop; a 422 whose words name
    ``stream_options`` (a server validating its fields) is one too; a 400 for the content is not."""
    said = "openai:m: HTTP 400 request refused (...): Unrecognized request argument supplied: stream_options"
    stop = ProviderStop(said, REQUEST, 400, field="stream_options")
    refused = streaming_refused(stop)
    assert (refused.cause, refused.field, str(refused)) == (
        REQUEST,
        "stream_options",
        f"{said} — {ADVICE}",
    )
    assert reclassify(refused, 600, model_answered=True) is refused
    other = ProviderStop("openai:m: HTTP 400 request refused: bad", REQUEST, 400, field="seed")
    assert streaming_refused(other) is None
    assert isinstance(reclassify(other, 600, model_answered=True), Fatal)
    extra = Fatal(
        'openai:m: HTTP 422 (check the request and model): {"detail":[{"loc":["body","stream_options"],'
        '"msg":"Extra inputs are not permitted"}]}',
        422,
    )
    assert streaming_refused(extra).field == "stream_options"
    content = Fatal("openai:m: HTTP 400 (...): maximum context length is 8192 tokens", 400)
    assert streaming_refused(content) is None
    assert streaming_refused(Fatal("openai:gpt-stream: HTTP 404 (...): no", 404)) is None
