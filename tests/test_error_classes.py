"""The retry classification, per HTTP status, as adapters/errors.py's tree states it: one table
(``errors.status_kind``) that ``http.error_for`` and ``http.post`` follow, and the runner's two
re-classifications (``runner.sending.retry.reclassify``), asserted one status at a time."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from dxi.adapters import errors
from dxi.adapters.errors import WAIT, Fatal, ProviderStop, RateLimited, Transient
from dxi.adapters.http import error_for, post
from dxi.runner.sending.retry import reclassify

# The tree's words, written out by hand: 429 and 529 rate limits; 408, 409, 425 and every 5xx
# transient; 401/403 (key), 402 (quota), 404 (model) stop; every other 4xx fatal.
STOPS = {401: errors.KEY, 402: errors.QUOTA, 403: errors.KEY, 404: errors.MODEL}


def expected(status: int) -> type:
    if status in STOPS:
        return ProviderStop
    if status in (429, 529):
        return RateLimited
    if status in (408, 409, 425) or status >= 500:
        return Transient
    return Fatal


@pytest.mark.parametrize("status", range(400, 600))
def test_each_status_is_the_class_the_tree_names(status: int):
    error = error_for(status, b'{"error": {"message": "no"}}', {}, "m")
    assert type(error) is expected(status)
    assert error.status == status
    if status in STOPS:
        assert error.cause == STOPS[status]


def test_the_counts_per_class_over_4xx_and_5xx():
    kinds = [type(error_for(s, b"", {}, "m")).__name__ for s in range(400, 600)]
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "ProviderStop": 4,
        "RateLimited": 2,
        "Transient": 102,
        "Fatal": 92,
    }


def test_a_503_with_a_stated_wait_is_a_rate_limit_with_that_wait():
    error = error_for(503, b"", {"Retry-After": "7"}, "m")
    assert type(error) is RateLimited and error.retry_after == 7.0
    assert type(error_for(503, b"", {}, "m")) is Transient


@pytest.mark.parametrize(
    ("status", "header", "kind", "retried"),
    [
        (400, "true", Transient, True),
        (418, "true", Transient, True),
        (409, "false", Transient, False),
        (500, "false", Transient, False),
        (429, "false", RateLimited, False),
        (422, "false", Fatal, True),
    ],
)
def test_x_should_retry_moves_a_status_as_the_tree_says(status, header, kind, retried):
    error = error_for(status, b"", {"x-should-retry": header}, "m")
    assert type(error) is kind
    assert getattr(error, "should_retry", True) is retried


def test_the_tree_names_every_transient_status():
    tree = errors.__doc__.split("├── Fatal")[0]
    assert errors.TRANSIENT_STATUSES == {408, 409, 425} and errors.RATE_LIMIT_STATUSES == {429, 529}
    assert all(
        str(status) in tree for status in (*errors.TRANSIENT_STATUSES, *errors.RATE_LIMIT_STATUSES)
    )
    assert "runner.sending.retry.reclassify" in errors.__doc__


@pytest.mark.parametrize("status", [409, 425, 408, 529, 422, 418])
async def test_post_raises_the_class_over_a_real_connection(status: int):
    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=status, text="busy")

    app = web.Application()
    app.router.add_post("/v1", busy)
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as client:
        with pytest.raises(errors.AdapterError) as caught:
            await post(client, server.make_url("/v1"), b"{}", {}, "m")
    assert type(caught.value) is expected(status) and caught.value.status == status


def test_the_runner_re_classifies_a_wait_too_long_and_a_refusal_after_answers():
    long = RateLimited("m: HTTP 429", retry_after=600.0)
    stop = reclassify(long, 300.0, model_answered=False)
    assert (
        type(stop) is ProviderStop
        and stop.cause == WAIT
        and stop.resets_in_s == 600.0
        and stop.status == 429
    )
    short = RateLimited("m: HTTP 429", retry_after=300.0)
    assert reclassify(short, 300.0, model_answered=False) is short  # at the bound: waited
    refused = ProviderStop("m: HTTP 400 unsupported parameter", errors.REQUEST, 400)
    assert (
        reclassify(refused, 300.0, model_answered=False) is refused
    )  # the model's first: stops the model
    kept = reclassify(refused, 300.0, model_answered=True)
    assert type(kept) is Fatal and kept.status == 400 and str(kept) == str(refused)
    key = ProviderStop("m: HTTP 401", errors.KEY, 401)
    assert (
        reclassify(key, 300.0, model_answered=True) is key
    )  # only a refused form becomes this request's own
    transient = Transient("m: HTTP 409", 409)
    assert reclassify(transient, 0.0, model_answered=True) is transient


@pytest.mark.parametrize(
    "error",
    [
        {  # OpenAI
            "message": "This model's maximum context length is 8192 tokens. However, your "
            "messages resulted in 9000 tokens",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        },
        {"type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000"},
        {  # Google
            "code": 400,
            "message": "The input token count (1200000) exceeds the maximum number of tokens "
            "allowed (1048576).",
            "status": "INVALID_ARGUMENT",
        },
        {  # llama.cpp's server
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
        },
    ],
)
def test_a_prompt_longer_than_the_context_is_told_so(error: dict):
    payload = orjson.dumps({"error": error})
    failure = error_for(400, payload, {}, "m")
    assert type(failure) is Fatal
    assert str(failure) == (
        "m: HTTP 400 (the prompt, with the output budget it asks for, is longer than the model's "
        "context: a model or server with a longer context, or a smaller output budget (max_tokens, "
        f"max_completion_tokens, maxOutputTokens)): {payload.decode()}"
    )
    # another 400 keeps what to check
    assert str(error_for(400, b'{"error": {"message": "no"}}', {}, "m")).startswith(
        "m: HTTP 400 (check the model's parameters and that the server supports this request)"
    )
