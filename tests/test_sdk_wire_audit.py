"""The adapters' reading of replies, streams, usage and error statuses held against the official
SDKs (``openai``, ``anthropic``, ``google-genai``: test-only dependencies) as the oracle: each reply
here is built with, or validated by, the SDK's own response models, each stream assembled by the
SDK's own accumulator too, and each retry decision compared with the SDK's ``_should_retry``.
``test_sdk_conformance.py`` holds the fakes' replies and the request bodies against the same types;
this file covers what a real server can send that the fakes do not."""

from __future__ import annotations

import typing

import anthropic
import httpx2
import openai
import orjson
import pydantic
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent, StopReason
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from anthropic.types.messages import batch_create_params as anthropic_batch_params
from anthropic.types.shared import ErrorResponse
from google.genai import _api_client as genai_client
from google.genai import types as genai
from google.genai.decisions import CreateDecisionResponse
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import BatchCreateParams, CompletionUsage, Decision
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion import Choice as ChatCompletionChoice
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from openai.types.shared import ErrorObject

from dxi import adapters
from dxi.adapters.anthropic import Anthropic, decode_messages
from dxi.adapters.anthropic_batch import AnthropicBatch
from dxi.adapters.errors import KEY, QUOTA, Fatal, ProviderStop, RateLimited, Transient
from dxi.adapters.gemini import decode_generate
from dxi.adapters.gemini_batch import GeminiBatch
from dxi.adapters.gemini_decisions import decode_decision
from dxi.adapters.http import TOO_LONG, error_for, rate_limit_wait
from dxi.adapters.openai import decode_chat
from dxi.adapters.openai_batch import OpenAIBatch
from dxi.adapters.openai_decisions import decode_decisions
from dxi.adapters.provider_errors import body_error
from dxi.adapters.streaming import (
    ChatAssembler,
    GenerateAssembler,
    MessagesAssembler,
    SSEParser,
)
from dxi.evals.task import Option, Question, Task
from dxi.scoring.cost import batch_price, request_cost

from .helpers.sdk_types import OPENAI_BODY, conforms, gemini_problems

TASK = Task(
    "when2call/1",
    "when2call",
    "the state",
    (
        Question("q1", "yes_no", "Is it?"),
        Question("q2", "choice", "Which?", (Option("A", "a"), Option("B", "b"))),
    ),
    {"q1": "yes", "q2": "A"},
)
ANSWER = '{"q1": "yes", "q2": "A"}'
OPENAI_STREAMED = CompletionCreateParamsStreaming
ANTHROPIC_STREAMED = MessageCreateParamsStreaming


def gemini_json(reply: genai.GenerateContentResponse) -> bytes:
    """A GenerateContentResponse as the REST API sends it: camelCase, fields unset or None left
    out."""
    return orjson.dumps(reply.model_dump(mode="json", by_alias=True, exclude_none=True))


def usage_of(reply) -> dict:
    return {
        c: getattr(reply, c)
        for c in (
            "input_tokens",
            "output_tokens",
            "cached_input_tokens",
            "cache_write_tokens",
            "cache_write_1h_tokens",
        )
    }


# ---- Gemini: thoughts are billed as output, outside candidatesTokenCount ------------------------


def cut_while_thinking() -> genai.GenerateContentResponse:
    """A Gemini reply cut off at maxOutputTokens while thinking, as the API sends it: no answer
    parts, ``thoughtsTokenCount`` 256 and no ``candidatesTokenCount`` (a count of 0 is left out of
    the JSON: python-genai #811 shows ``thoughts_token_count=256`` and no candidates count for
    ``max_output_tokens=256``)."""
    return genai.GenerateContentResponse(
        candidates=[
            genai.Candidate(
                content=genai.Content(role="model", parts=[]),
                finish_reason=genai.FinishReason.MAX_TOKENS,
                index=0,
            )
        ],
        usage_metadata=genai.GenerateContentResponseUsageMetadata(
            prompt_token_count=180, thoughts_token_count=256, total_token_count=436
        ),
        model_version="gemini-3.5-flash",
    )


def test_a_gemini_reply_cut_off_while_thinking_bills_its_thoughts_as_output():
    body = gemini_json(cut_while_thinking())
    assert b"candidatesTokenCount" not in body
    reply = decode_generate(TASK, body)
    assert (reply.input_tokens, reply.output_tokens, reply.cached_input_tokens) == (180, 256, 0)
    assert reply.cut_off == "thinking"
    # at $1 / $10 per million: 180 input + 256 output tokens, not the input alone
    assert round(request_cost(usage_of(reply), (1.0, 10.0)), 9) == round(
        (180 * 1 + 256 * 10) / 1e6, 9
    )


def test_a_streamed_gemini_reply_cut_off_while_thinking_bills_its_thoughts():
    chunks = [
        genai.GenerateContentResponse(
            candidates=[
                genai.Candidate(
                    content=genai.Content(
                        role="model", parts=[genai.Part(text="Weighing it", thought=True)]
                    ),
                    index=0,
                )
            ],
            usage_metadata=genai.GenerateContentResponseUsageMetadata(
                prompt_token_count=180, thoughts_token_count=100, total_token_count=280
            ),
            model_version="gemini-3.5-flash",
        ),
        cut_while_thinking(),
    ]
    assembler = GenerateAssembler()
    for chunk in chunks:
        assembler.feed("", gemini_json(chunk).decode())
    assert assembler.complete
    reply = decode_generate(TASK, assembler.body())
    assert (reply.input_tokens, reply.output_tokens, reply.cut_off) == (180, 256, "thinking")


def test_gemini_usage_counts_cached_tokens_within_the_prompt_and_thoughts_beside_the_answer():
    reply = genai.GenerateContentResponse(
        candidates=[
            genai.Candidate(
                content=genai.Content(
                    role="model",
                    parts=[
                        genai.Part(text="Weighing it", thought=True),
                        genai.Part(text=ANSWER, thought_signature=b"sig"),
                    ],
                ),
                finish_reason=genai.FinishReason.STOP,
                index=0,
            )
        ],
        usage_metadata=genai.GenerateContentResponseUsageMetadata(
            prompt_token_count=1000,
            cached_content_token_count=768,
            candidates_token_count=12,
            thoughts_token_count=300,
            total_token_count=1312,
        ),
    )
    decoded = decode_generate(TASK, gemini_json(reply))
    assert [a.predicted for a in decoded.answers] == ["yes", "A"]
    assert (decoded.input_tokens, decoded.cached_input_tokens, decoded.output_tokens) == (
        1000,
        768,
        312,
    )
    # the total the SDK reports is prompt + answer + thoughts: nothing counted twice
    usage = reply.usage_metadata
    assert decoded.input_tokens + decoded.output_tokens == usage.total_token_count


def test_gemini_decisions_bill_thought_tokens_given_without_output_tokens():
    doc = CreateDecisionResponse.model_validate(
        {
            "answers": {
                "q1": {"type": "noul", "noul": 0.8, "confidence": 0.8},
                "q2": {
                    "type": "choice",
                    "choice": "A",
                    "probabilities": {"A": 0.7, "B": 0.3},
                    "confidence": 0.7,
                },
            },
            "usage": {"total_input_tokens": 412, "total_thought_tokens": 40},
        }
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    reply = decode_decision(TASK, orjson.dumps(doc))
    assert (reply.input_tokens, reply.output_tokens) == (412, 40)


def test_a_gemini_batch_result_cut_off_while_thinking_bills_its_thoughts():
    """The Gemini Batch API's result line (``{"key", "response"}``) is read as the synchronous
    reply: the same usage."""
    adapter = adapters.get("gemini:gemini-3.5-flash@http://127.0.0.1:1")
    line = orjson.dumps(
        {"key": "k" * 64, "response": orjson.loads(gemini_json(cut_while_thinking()))}
    )
    result = GeminiBatch(adapter).result(orjson.loads(line), line)
    reply = adapter.decode_parsed(TASK, result.body, result.doc)
    assert (result.key, reply.input_tokens, reply.output_tokens) == ("k" * 64, 180, 256)


# ---- Anthropic: stop reasons, cache usage, streams against the SDK's accumulate_event ----------


def anthropic_message(content: list[dict], stop: str, usage: dict | None = None) -> dict:
    """A Messages reply validated by the anthropic SDK's ``Message`` model, as JSON."""
    return Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5-5",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage or {"input_tokens": 300, "output_tokens": 40},
        }
    ).model_dump(mode="json", exclude_none=True)


def test_an_anthropic_turn_paused_unfinished_is_no_answer():
    """``pause_turn`` ("we paused a long-running turn. You may provide the response back as-is in a
    subsequent request to let the model continue": ``Message.stop_reason``) is not a final reply,
    even when its text parses: every answer invalid, its usage kept."""
    doc = anthropic_message([{"type": "text", "text": ANSWER}], "pause_turn")
    reply = decode_messages(TASK, orjson.dumps(doc))
    paused = (
        "the provider paused the turn unfinished (stop_reason pause_turn: a long-running turn, to "
        "be sent back to continue): no final answer"
    )
    assert [(a.status, a.error) for a in reply.answers] == [("invalid", paused)] * 2
    assert (reply.input_tokens, reply.output_tokens) == (300, 40)


def test_anthropic_cache_tokens_are_outside_input_tokens_and_priced_by_its_rule():
    usage = {
        "input_tokens": 50,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 400,
        "cache_creation": {"ephemeral_5m_input_tokens": 300, "ephemeral_1h_input_tokens": 100},
        "output_tokens": 70,
        "output_tokens_details": {"thinking_tokens": 60},
    }
    doc = anthropic_message([{"type": "text", "text": ANSWER}], "end_turn", usage)
    reply = decode_messages(TASK, orjson.dumps(doc))
    assert usage_of(reply) == {
        "input_tokens": 1450,
        "output_tokens": 70,  # thinking within output_tokens, not added again
        "cached_input_tokens": 1000,
        "cache_write_tokens": 300,
        "cache_write_1h_tokens": 100,
    }
    # $3 / $15 per million, Anthropic's cache rule: reads 0.1x, 5-minute writes 1.25x, 1-hour 2x
    rule = Anthropic.CACHE_PRICES
    price = (
        3.0,
        15.0,
        3 * rule["cached_input"],
        3 * rule["cache_write"],
        3 * rule["cache_write_1h"],
    )
    expected = (50 * 3 + 1000 * 0.3 + 300 * 3.75 + 100 * 6 + 70 * 15) / 1e6
    assert round(request_cost(usage_of(reply), price), 12) == round(expected, 12)
    # in a batch, half of every part (the discounts stack)
    assert round(request_cost(usage_of(reply), batch_price(price)), 12) == round(expected / 2, 12)


def sse(events: list[dict]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def anthropic_stream(events: list[dict]) -> tuple[bytes, dict]:
    """(the reply our assembler builds from ``events`` sent as server-sent events, the message the
    anthropic SDK's ``accumulate_event`` builds from them as JSON)."""
    parse = pydantic.TypeAdapter(RawMessageStreamEvent).validate_python
    snapshot, buffers = None, {}
    for event in events:
        if event["type"] == "ping":  # the SDK's Stream skips them (anthropic/_streaming.py)
            continue
        snapshot = accumulate_event(
            event=parse(event), current_snapshot=snapshot, json_bufs=buffers
        )
    assembler, parser = MessagesAssembler(), SSEParser()
    for name, data in parser.feed(sse(events)):
        assembler.feed(name, data)
    assert assembler.complete and assembler.error is None
    return assembler.body(), snapshot.model_dump(mode="json", exclude_none=True)


def start(usage: dict) -> dict:
    message = anthropic_message([], "end_turn", usage)
    return {"type": "message_start", "message": message | {"stop_reason": None}}


def test_a_streamed_anthropic_reply_with_thinking_is_read_as_the_sdk_accumulates_it():
    """Thinking split over ``thinking_delta`` events with its ``signature_delta``, a
    ``redacted_thinking`` block, the answer split over ``text_delta`` events, and cumulative usage
    in ``message_delta`` (the cache counts given at the start kept)."""
    events = [
        start({"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 500}),
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },  # noqa: E501
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Weigh"},
        },  # noqa: E501
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "ing it"},
        },  # noqa: E501
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "EqQBCgIYAh"},
        },  # noqa: E501
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "EmwKAhgB"},
        },  # noqa: E501
        {"type": "content_block_stop", "index": 1},
        {"type": "ping"},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "text_delta", "text": ANSWER[:9]},
        },  # noqa: E501
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "text_delta", "text": ANSWER[9:]},
        },  # noqa: E501
        {"type": "content_block_stop", "index": 2},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 310},
        },  # noqa: E501
        {"type": "message_stop"},
    ]
    ours, sdks = anthropic_stream(events)
    blocks = orjson.loads(ours)["content"]
    assert blocks == sdks["content"]
    assert (blocks[0]["thinking"], blocks[0]["signature"], blocks[1]["type"]) == (
        "Weighing it",
        "EqQBCgIYAh",
        "redacted_thinking",
    )
    reply = decode_messages(TASK, ours)
    assert reply == decode_messages(TASK, orjson.dumps(sdks))
    assert [a.predicted for a in reply.answers] == ["yes", "A"]
    assert (reply.input_tokens, reply.cached_input_tokens, reply.output_tokens) == (520, 500, 310)


def test_a_streamed_forced_tool_call_split_over_json_deltas_is_read_as_the_sdk_accumulates_it():
    events = [
        start({"input_tokens": 20, "output_tokens": 1}),
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "answer", "input": {}},
        },  # noqa: E501
        *(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": part},
            }  # noqa: E501
            for part in ("", '{"q1": "y', 'es", "q2"', ': "B"}')
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 25},
        },  # noqa: E501
        {"type": "message_stop"},
    ]
    ours, sdks = anthropic_stream(events)
    assert orjson.loads(ours)["content"] == sdks["content"]
    reply = decode_messages(TASK, ours, "tool")
    assert reply == decode_messages(TASK, orjson.dumps(sdks), "tool")
    assert [a.predicted for a in reply.answers] == ["yes", "B"]


def test_an_overloaded_error_event_inside_a_200_stream_ends_it_as_an_error():
    """Anthropic may send an ``error`` event (``overloaded_error``) after the stream began: the
    assembler keeps it (``adapters.http.post_stream`` ends the attempt as a cut stream), never a
    complete reply."""
    error = ErrorResponse.model_validate(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    ).model_dump(mode="json", exclude_none=True)
    events = [
        start({"input_tokens": 20, "output_tokens": 1}),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "{"}},
        error,
    ]
    assembler, parser = MessagesAssembler(), SSEParser()
    for name, data in parser.feed(sse(events)):
        assembler.feed(name, data)
    assert (assembler.began, assembler.complete, assembler.error) == (True, False, error)
    assert body_error(orjson.loads(assembler.body())) == "Overloaded"


# ---- OpenAI: streamed chunks against the SDK's ChatCompletionStreamState, usage ------------------


CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-6-luna"}


def chat_stream(deltas: list[tuple[dict, str | None]], usage: dict) -> tuple[bytes, bytes]:
    """(our assembled reply, the SDK's) for a stream of ``(delta, finish_reason)`` chunks, then the
    usage-only chunk (``choices: []``) that ``stream_options.include_usage`` asks for, then
    ``[DONE]``; each chunk validated by the SDK's ``ChatCompletionChunk``."""
    chunks = [
        CHUNK | {"choices": [{"index": 0, "delta": d, "finish_reason": f}], "usage": None}
        for d, f in deltas
    ] + [CHUNK | {"choices": [], "usage": usage}]
    state, assembler = ChatCompletionStreamState(), ChatAssembler()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
        assembler.feed("", orjson.dumps(chunk).decode())
    assembler.feed("", "[DONE]")
    assert assembler.complete
    sdks = state.current_completion_snapshot.model_dump(mode="json", exclude_none=True)
    return assembler.body(), orjson.dumps(sdks)


REASONED = {
    "prompt_tokens": 900,
    "completion_tokens": 300,
    "total_tokens": 1200,
    "prompt_tokens_details": {"cached_tokens": 768},
    "completion_tokens_details": {"reasoning_tokens": 250},
}


def test_a_streamed_chat_reply_is_read_as_the_sdk_accumulates_it_reasoning_counted_once():
    ours, sdks = chat_stream(
        [
            ({"role": "assistant", "content": ""}, None),
            ({"content": ANSWER[:7]}, None),
            ({"content": ANSWER[7:]}, None),
            ({}, "stop"),
        ],
        REASONED,
    )
    reply = decode_chat(TASK, ours)
    assert reply == decode_chat(TASK, sdks)
    assert [a.predicted for a in reply.answers] == ["yes", "A"]
    # reasoning tokens are within completion_tokens (CompletionTokensDetails), cached within prompt
    assert (reply.input_tokens, reply.cached_input_tokens, reply.output_tokens) == (900, 768, 300)
    assert round(request_cost(usage_of(reply), (2.0, 8.0, 0.5)), 9) == round(
        (132 * 2 + 768 * 0.5 + 300 * 8) / 1e6, 9
    )


def test_a_streamed_refusal_split_over_chunks_is_read_whole():
    ours, sdks = chat_stream(
        [
            ({"role": "assistant", "refusal": "I can't help"}, None),
            ({"refusal": " with that."}, "stop"),
        ],
        {"prompt_tokens": 900, "completion_tokens": 6, "total_tokens": 906},
    )
    assert orjson.loads(sdks)["choices"][0]["message"]["refusal"] == "I can't help with that."
    reply = decode_chat(TASK, ours)
    assert reply == decode_chat(TASK, sdks)
    assert {a.error for a in reply.answers} == {"refusal: I can't help with that."}


def test_a_chat_reply_cut_off_while_reasoning_or_filtered_is_no_answer():
    ours, sdks = chat_stream([({"role": "assistant", "content": ""}, "length")], REASONED)
    reply = decode_chat(TASK, ours)
    assert reply == decode_chat(TASK, sdks)
    assert (reply.cut_off, reply.output_tokens) == ("thinking", 300)
    assert {a.error for a in reply.answers} == {
        "cut off at the token limit while thinking (finish_reason length), before any answer: "
        "raise max_completion_tokens or lower --effort"
    }
    ours, _ = chat_stream(
        [({"role": "assistant", "content": '{"q1": '}, "content_filter")], REASONED
    )
    assert {a.error for a in decode_chat(TASK, ours).answers} == {
        "blocked by the provider's content filter (finish_reason content_filter)"
    }


# ---- retries: the SDKs' own policy as the oracle -------------------------------------------------

STATUSES = (400, 401, 403, 404, 408, 409, 413, 422, 425, 429, 500, 502, 503, 504, 529)
# where the runner parts from the openai and anthropic SDKs' ``_should_retry`` on purpose: a key
# refused or an unknown model stops the provider (or the model) whatever x-should-retry says, as
# every request would meet it alike; 425 Too Early is retried (RFC 8470)
DEVIATIONS = {
    (401, "true"): False,
    (403, "true"): False,
    (404, "true"): False,
    (425, ""): True,
}


def retried(status: int, should_retry: str, body: bytes) -> bool:
    headers = {"x-should-retry": should_retry} if should_retry else {}
    error = error_for(status, body, headers, "m")
    return isinstance(error, (RateLimited, Transient)) and error.should_retry is not False


def test_the_statuses_retried_are_those_the_sdks_retry():
    """Every status, with and without ``x-should-retry``, retried exactly when the openai and
    anthropic SDKs retry it (``_base_client._should_retry``: 408, 409, 429, every 5xx, the header
    first), but for ``DEVIATIONS``; and every status google-genai retries
    (``_api_client._RETRY_HTTP_STATUS_CODES``) retried too."""
    clients = (
        anthropic.Anthropic(api_key="sk-test", max_retries=0),
        openai.OpenAI(api_key="sk-test", max_retries=0),
    )
    body = orjson.dumps({"type": "error", "error": {"type": "api_error", "message": "m"}})
    for status in STATUSES:
        for header in ("", "true", "false"):
            response = httpx2.Response(status, headers={"x-should-retry": header} if header else {})
            sdk = {c._should_retry(response) for c in clients}
            assert len(sdk) == 1
            expected = DEVIATIONS.get((status, header), sdk.pop())
            assert retried(status, header, body) == expected, (status, header)
    for status in genai_client._RETRY_HTTP_STATUS_CODES:
        assert retried(status, "", b"{}"), status


def test_a_529_overloaded_is_a_rate_limit_and_the_wait_headers_read_as_the_sdk_reads_them():
    overloaded = ErrorResponse.model_validate(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    error = error_for(529, overloaded.model_dump_json().encode(), {"retry-after": "4"}, "m")
    assert (type(error), error.retry_after) == (RateLimited, 4.0)
    client = anthropic.Anthropic(api_key="sk-test")
    for headers in (
        {"retry-after-ms": "1500"},
        {"retry-after": "7"},
        {"retry-after": "1.5"},
        {"retry-after-ms": "250", "retry-after": "30"},
    ):
        assert rate_limit_wait(headers) == client._parse_retry_after_header(httpx2.Headers(headers))


def test_a_key_refused_a_prompt_too_long_and_a_request_too_large_are_never_retried():
    key = error_for(
        401,
        orjson.dumps(
            {"type": "error", "error": {"type": "authentication_error", "message": "bad"}}
        ),
        {},
        "m",
    )
    assert (type(key), key.cause) == (ProviderStop, KEY)
    too_long = openai_error(
        "This model's maximum context length is 8192 tokens", "context_length_exceeded", "messages"
    )
    error = error_for(400, too_long, {}, "m")
    assert type(error) is Fatal and TOO_LONG in str(error)
    large = orjson.dumps(
        {"type": "error", "error": {"type": "request_too_large", "message": "big"}}
    )
    assert type(error_for(413, large, {}, "m")) is Fatal


def openai_error(message: str, code: str, param: str) -> bytes:
    error = ErrorObject(message=message, type="invalid_request_error", code=code, param=param)
    return orjson.dumps({"error": error.model_dump(mode="json")})


# ---- streamed request bodies against the SDKs' streaming request types ---------------------------


def test_every_streamed_request_body_conforms_to_the_sdk_streaming_types():
    """The streamed form of each body (``stream_body``: ``stream`` and ``stream_options``) against
    ``CompletionCreateParamsStreaming`` / ``MessageCreateParamsStreaming``, over the effort
    levels and thinking settings each adapter sends; Gemini's body is unchanged (its stream is
    ``:streamGenerateContent?alt=sse``)."""
    for effort in ("none", "low", "xhigh", "max"):
        for params in ({}, {"max_completion_tokens": 2000, "seed": 1}):
            spec = adapters.ModelSpec("openai", "gpt-6-luna", params=params, effort=effort)
            a = adapters.get(spec)
            body = orjson.loads(a.stream_body(a.encode(TASK).body))
            assert body["stream_options"] == {"include_usage": True}
            assert conforms(body, OPENAI_STREAMED) == [], (effort, params)
    for effort, params, options in (
        ("low", {}, {}),
        ("max", {}, {}),
        (None, {"thinking": {"type": "enabled", "budget_tokens": 4000}}, {"structured": "tool"}),
        (None, {"thinking": {"type": "disabled"}}, {}),
        ("high", {"thinking": {"type": "adaptive"}}, {}),
    ):
        spec = adapters.ModelSpec(
            "anthropic", "claude-sonnet-5-5", params=params, options=options, effort=effort
        )
        a = adapters.get(spec)
        body = orjson.loads(a.stream_body(a.encode(TASK).body))
        assert conforms(body, ANTHROPIC_STREAMED) == [], (effort, params)
        thinking = body.get("thinking") or {}
        assert thinking.get("budget_tokens", 0) < body["max_tokens"]  # the API requires it
    for effort, params in (
        ("minimal", {}),
        ("xhigh", {"maxOutputTokens": 9000}),
        (None, {"thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True}}),
    ):
        spec = adapters.ModelSpec("gemini", "gemini-3.5-flash", params=params, effort=effort)
        assert gemini_problems(orjson.loads(adapters.get(spec).encode(TASK).body)) == []


def test_openai_decisions_usage_counts_its_prompt_cache_reads_and_writes():
    """The Decisions format's usage (the openai SDK's ``types/decision.py`` ``Usage``) details its
    input as ``input_tokens_details``: cached and written tokens are recorded, and priced, as the
    Chat Completions ones are."""
    doc = Decision.model_validate(
        {
            "model": "gpt-6-luna",
            "answers": [
                {"type": "predicate", "name": "q1", "probability": 0.8},
                {
                    "type": "choice",
                    "name": "q2",
                    "choice": "A",
                    "probabilities": [
                        {"value": "A", "probability": 0.7},
                        {"value": "B", "probability": 0.3},
                    ],
                    "confidence": 0.6,
                },
            ],
            "usage": {
                "input_tokens": 2000,
                "input_tokens_details": {"cached_tokens": 1536, "cache_write_tokens": 200},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 2000,
            },
        }
    ).model_dump(mode="json", exclude_none=True)
    reply = decode_decisions(TASK, orjson.dumps(doc))
    assert [a.predicted for a in reply.answers] == ["yes", "A"]
    assert usage_of(reply) == {
        "input_tokens": 2000,
        "output_tokens": 0,
        "cached_input_tokens": 1536,
        "cache_write_tokens": 200,
        "cache_write_1h_tokens": None,
    }
    # $0.10 input, $0.01 cached: 264 fresh + 200 written (at input: no write price) + 1536 cached
    assert round(request_cost(usage_of(reply), (0.10, 0.0, 0.01)), 12) == round(
        (464 * 0.10 + 1536 * 0.01) / 1e6, 12
    )


def test_every_batch_input_line_conforms_to_the_sdk_batch_request_types():
    """An Anthropic Message Batches request (``custom_id``, ``params``: the synchronous body)
    against the SDK's ``batch_create_params.Request``; an OpenAI batch line's ``url`` one of
    ``BatchCreateParams.endpoint`` and its body the synchronous one."""
    for options in ({}, {"structured": "tool"}):
        a = adapters.get(
            adapters.ModelSpec("anthropic", "claude-sonnet-5-5", options=options, effort="low")
        )
        line = orjson.loads(AnthropicBatch(a).line(a.encode(TASK)))
        assert conforms(line, anthropic_batch_params.Request) == []
    a = adapters.get(adapters.ModelSpec("openai", "gpt-6-luna", effort="high"))
    request = a.encode(TASK)
    line = orjson.loads(OpenAIBatch(a).line(request))
    endpoints = typing.get_args(
        typing.get_type_hints(BatchCreateParams, include_extras=True)["endpoint"].__args__[0]
    )
    assert (line["custom_id"], line["method"], line["url"] in endpoints) == (
        request.key,
        "POST",
        True,
    )
    assert conforms(line["body"], OPENAI_BODY) == []


def test_an_anthropic_credit_balance_used_up_stops_the_provider_not_each_request():
    """Anthropic answers every request with HTTP 400 ``invalid_request_error`` "Your credit
    balance is too low to access the Anthropic API ..." once a prepaid balance is used up
    (anthropics/claude-code #4684): a stop of the provider for quota, not a deterministic failure
    stored for each request of the run."""
    body = (
        ErrorResponse.model_validate(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "Your credit balance is too low to access the Anthropic API. Please go "
                    "to Plans & Billing to upgrade or purchase credits.",
                },
                "request_id": "req_011CbrFTcXhtiMzr3s6EocF7",
            }
        )
        .model_dump_json()
        .encode()
    )
    error = error_for(400, body, {}, "anthropic:claude-sonnet-5-5")
    assert (type(error), error.cause, error.scope) == (ProviderStop, QUOTA, "provider")
    assert str(error) == (
        "anthropic:claude-sonnet-5-5: HTTP 400 quota exhausted (credit balance): Your credit balance "
        "is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase "
        "credits."
    )


# ---- every stop signal the SDKs declare is read on purpose ---------------------------------------


def test_every_stop_signal_the_sdks_declare_has_a_reading():
    """Each value of the SDKs' stop enums (anthropic ``StopReason``, openai ``finish_reason``,
    google-genai ``FinishReason``) on a reply whose text is a valid answer: read as an answer only
    where the stop is a natural one, else every answer invalid with its reason. A value the SDK
    adds later fails here until it is given a reading."""
    anthropic_expected = {
        "end_turn": None,
        "stop_sequence": None,
        "tool_use": None,
        "max_tokens": "cut off at the token limit (stop_reason max_tokens)",
        "model_context_window_exceeded": "cut off at the token limit (stop_reason "
        "model_context_window_exceeded)",
        "pause_turn": "the provider paused the turn unfinished",
        "refusal": "refusal (stop_reason refusal)",
    }
    assert set(typing.get_args(StopReason)) == set(anthropic_expected)
    for stop, reason in anthropic_expected.items():
        doc = anthropic_message([{"type": "text", "text": ANSWER}], stop)
        errors = {a.error for a in decode_messages(TASK, orjson.dumps(doc)).answers}
        assert errors == {None} if reason is None else errors.pop().startswith(reason), stop
    openai_expected = {
        "stop": None,
        "length": "cut off at the token limit (finish_reason length)",
        "content_filter": "blocked by the provider's content filter",
        "tool_calls": None,  # no tools are sent: a reply that says so still holds its content
        "function_call": None,
    }
    finish = ChatCompletionChoice.model_fields["finish_reason"].annotation
    assert set(typing.get_args(finish)) == set(openai_expected)
    for stop, reason in openai_expected.items():
        reply = ChatCompletion.model_validate(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "gpt-6-luna",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": ANSWER},
                        "finish_reason": stop,
                    }
                ],
            }
        ).model_dump(mode="json", exclude_none=True)
        errors = {a.error for a in decode_chat(TASK, orjson.dumps(reply)).answers}
        assert errors == {None} if reason is None else errors.pop().startswith(reason), stop
    for stop in genai.FinishReason:
        reply = genai.GenerateContentResponse(
            candidates=[
                genai.Candidate(
                    content=genai.Content(role="model", parts=[genai.Part(text=ANSWER)]),
                    finish_reason=stop,
                )
            ]
        )
        errors = {a.error for a in decode_generate(TASK, gemini_json(reply)).answers}
        if stop in (genai.FinishReason.STOP, genai.FinishReason.FINISH_REASON_UNSPECIFIED):
            assert errors == {None}, stop
        elif stop is genai.FinishReason.MAX_TOKENS:
            assert errors.pop().startswith("cut off at the token limit (finishReason MAX_TOKENS)")
        else:
            assert errors == {f"no usable answer (finishReason {stop.value})"}, stop
    for blocked in genai.BlockedReason:
        reply = genai.GenerateContentResponse(
            prompt_feedback=genai.GenerateContentResponsePromptFeedback(block_reason=blocked)
        )
        errors = {a.error for a in decode_generate(TASK, gemini_json(reply)).answers}
        assert errors == {f"prompt blocked (promptFeedback.blockReason {blocked.value})"}


def test_a_gateway_that_leaves_the_reasoning_out_of_completion_tokens_is_billed_for_it():
    """An OpenAI-compatible gateway in front of Gemini reported ``completion_tokens`` 0 with
    ``reasoning_tokens`` 60 and ``total_tokens`` 81 for a 21-token prompt (CLIProxyAPI #5733): the
    60 thought tokens are billed as output. A consistent usage (OpenAI's: ``total_tokens`` =
    prompt + completion, reasoning within) is read as given."""

    def output(prompt: int, completion: int, total: int, reasoning: int) -> int | None:
        usage = CompletionUsage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=total,
            completion_tokens_details={"reasoning_tokens": reasoning},
        )
        reply = ChatCompletion.model_validate(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "gemini-3.5-flash",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": ANSWER},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage.model_dump(mode="json"),
            }
        ).model_dump(mode="json", exclude_none=True)
        return decode_chat(TASK, orjson.dumps(reply)).output_tokens

    assert output(21, 0, 81, 60) == 60
    assert output(20, 151, 553, 382) == 533  # answer 151 + thoughts 382 (mozilla-ai/any-llm #1290)
    assert output(900, 300, 1200, 250) == 300  # OpenAI's: reasoning within completion_tokens
    assert output(900, 300, 1200, 0) == 300


def test_a_tool_call_split_over_chat_chunks_is_assembled_as_the_sdk_assembles_it():
    """No adapter asks for tools, but a server may answer with a tool call: its pieces
    (``delta.tool_calls`` by ``index``, ``function.arguments`` a few characters at a time) are
    joined into the stored reply as the openai SDK's ``ChatCompletionStreamState`` joins them, two
    calls apart, not each piece replacing the last."""
    calls = [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "answer", "arguments": ""},
        },  # noqa: E501
        {
            "index": 1,
            "id": "call_2",
            "type": "function",
            "function": {"name": "note", "arguments": "{}"},
        },  # noqa: E501
        {"index": 0, "function": {"arguments": '{"q1": '}},
        {"index": 0, "function": {"arguments": '"yes"}'}},
    ]
    ours, sdks = chat_stream(
        [({"role": "assistant", "content": None, "tool_calls": [calls[0]]}, None)]
        + [({"tool_calls": [c]}, None) for c in calls[1:]]
        + [({}, "tool_calls")],
        {"prompt_tokens": 900, "completion_tokens": 12, "total_tokens": 912},
    )
    message = orjson.loads(ours)["choices"][0]["message"]
    assert message["tool_calls"] == orjson.loads(sdks)["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("call_1", '{"q1": "yes"}'),
        ("call_2", "{}"),
    ]
