"""The hosted adapters' request bodies and the replies the fakes serve, held against the official
SDKs' types (``openai``, ``anthropic``, ``google-genai``: test-only dependencies;
``tests/helpers/sdk_types.py``), so a fake that drifts from the provider, or a body the provider
would not accept, fails here."""

from __future__ import annotations

import typing
from pathlib import Path

import orjson
import pydantic
import pytest
from anthropic.types import Message
from anthropic.types.shared import ErrorResponse
from anthropic.types.shared.error_details import ErrorDetails
from google.genai import types as genai
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject

from dxi import adapters
from dxi.evals import Suite, discover

from .fakes import wire_formats
from .helpers.sdk_types import (
    ANTHROPIC_BODY,
    OPENAI_BODY,
    conforms,
    gemini_problems,
    reply_problems,
)

# a field servers add that the SDK does not declare: vLLM/DeepSeek reasoning
GATEWAY_EXTRAS = ("$.choices[0].message.reasoning_content",)

PARAMS = {
    "openai": {
        "temperature": 0,
        "max_completion_tokens": 400,
        "seed": 1,
        "reasoning_effort": "low",
    },
    "anthropic": {"max_tokens": 512, "stop_sequences": ["\n\n\n"]},
    "gemini": {"temperature": 0, "maxOutputTokens": 256, "thinkingConfig": {"thinkingBudget": 0}},
    "logprobs": {},
}


def all_tasks(data_dir: Path) -> list:
    return list(Suite(discover(data_dir)).tasks())


def adapter(kind: str, base_url: str, options: dict | None = None) -> adapters.Adapter:
    real = "anthropic" if kind.startswith("anthropic") else kind
    return adapters.get(
        adapters.ModelSpec(real, "model-x", base_url, dict(PARAMS[real]), options or {})
    )


@pytest.mark.parametrize(
    "kind, options",
    [
        ("openai", None),
        ("anthropic", None),
        ("anthropic", {"structured": "tool"}),
        ("gemini", None),
        ("logprobs", None),
    ],
)
@pytest.mark.parametrize("base_url", ["https://api.example.test", "http://127.0.0.1:8080"])
def test_every_request_body_conforms_to_the_sdk_request_types(
    data_dir: Path, kind: str, options: dict | None, base_url: str
):
    url = base_url + ("/v1" if kind in ("openai", "logprobs") else "")
    a = adapter(kind, url, options)
    for task in all_tasks(data_dir):
        body = orjson.loads(a.encode(task).body)
        if kind == "openai":
            assert conforms(body, OPENAI_BODY) == []
        elif kind == "anthropic":
            assert conforms(body, ANTHROPIC_BODY) == []
            assert ("output_config" in body) == (options is None) and ("tool_choice" in body) == (
                options is not None
            )
        elif kind == "gemini":
            assert gemini_problems(body) == []
        else:
            for one in body:
                assert conforms(one, OPENAI_BODY) == []


def test_the_anthropic_version_is_the_sdks_and_the_sampling_fields_it_refuses_are_undeclared(
    data_dir: Path,
):
    """The default ``anthropic-version`` is the one the SDK sends (``ANTHROPIC_API_VERSION``), and
    the fields refused at it (``SAMPLING``) are the ones the SDK's request types no longer declare:
    a body carrying one does not conform."""
    from anthropic._constants import ANTHROPIC_API_VERSION
    from anthropic.types.messages.batch_create_params import Request as BatchRequest

    from dxi.adapters.anthropic import API_VERSION, SAMPLING

    a = adapter("anthropic", "https://api.example.test")
    assert (a.extra_headers(), API_VERSION) == (
        {"anthropic-version": ANTHROPIC_API_VERSION},
        "2026-10-21",
    )
    declared = typing.get_type_hints(ANTHROPIC_BODY)
    assert [f for f in SAMPLING if f in declared] == [] and "max_tokens" in declared
    body = orjson.loads(a.encode(all_tasks(data_dir)[0]).body)
    assert conforms(body | {"temperature": 0}, ANTHROPIC_BODY) == [
        "$.temperature: not a field of MessageCreateParamsNonStreaming"
    ]
    assert conforms({"custom_id": "k", "params": body}, BatchRequest) == []


def test_the_logprobs_cap_is_the_field_each_server_honours(data_dir: Path):
    task = all_tasks(data_dir)[0]
    hosted = orjson.loads(adapters.get("logprobs:gpt-4.1-mini").encode(task).body)[0]
    local = orjson.loads(adapters.get("logprobs:qwen@http://127.0.0.1:8080/v1").encode(task).body)[
        0
    ]
    assert (hosted.get("max_completion_tokens"), "max_tokens" in hosted) == (
        1,
        False,
    )  # max_tokens is deprecated there
    assert (local.get("max_tokens"), "max_completion_tokens" in local) == (
        1,
        False,
    )  # what llama.cpp honours
    assert adapters.get("logprobs:gpt-4.1-mini").output_tokens_bound(task) == len(task.questions)


def test_the_checker_refuses_what_the_sdk_does_not_declare():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "strict": True, "schema": {}, "extra": 1},
        },
        "max_tokenz": 3,
    }
    assert conforms(body, OPENAI_BODY) == [
        "$.max_tokenz: not a field of CompletionCreateParamsNonStreaming",
        "$.response_format.json_schema.extra: not a field of JSONSchema",
    ]
    assert conforms({"model": "m", "messages": []}, ANTHROPIC_BODY) == [
        "$.max_tokens: required by MessageCreateParamsNonStreaming"
    ]
    reply = wire_formats.openai_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"properties": {}}},
            },
        }
    )
    reply["choices"][0]["message"]["surprise"] = 1
    assert reply_problems(ChatCompletion, reply) == [
        "$.choices[0].message.surprise: not a field of ChatCompletionMessage"
    ]


OPENAI_MODES = (
    "ok",
    "fenced",
    "prose",
    "truncated",
    "truncated_empty",
    "refusal",
    "empty",
    "reasoning",
    "missing",
    "outside",
    "content_filter",
    "cached",
)
ANTHROPIC_MODES = (
    "ok",
    "fenced",
    "prose",
    "empty",
    "refusal",
    "truncated",
    "truncated_empty",
    "text",
    "thinking",
    "missing",
    "outside",
    "cached",
)
GEMINI_MODES = (
    "ok",
    "fenced",
    "prose",
    "truncated",
    "truncated_empty",
    "safety",
    "blocked",
    "thought",
    "missing",
    "outside",
    "cached",
)


def test_every_reply_the_fakes_serve_conforms_to_the_sdk_response_models(data_dir: Path):
    checked = 0
    for task in all_tasks(data_dir):
        chat = orjson.loads(adapter("openai", "http://127.0.0.1:1/v1").encode(task).body)
        for mode in OPENAI_MODES:
            assert (
                reply_problems(ChatCompletion, wire_formats.openai_chat(chat, mode), GATEWAY_EXTRAS)
                == []
            ), mode
        # OpenRouter's mid-generation error: a ChatCompletion but for its two gateway fields
        gateway = wire_formats.error_in_200("openai", wire_formats.openai_chat(chat))
        choice = gateway["choices"][0]
        assert (choice.pop("finish_reason"), sorted(choice.pop("error"))) == (
            "error",
            ["code", "message"],
        )
        assert (
            reply_problems(
                ChatCompletion, {**gateway, "choices": [{**choice, "finish_reason": "stop"}]}
            )
            == []
        )
        for one in orjson.loads(adapter("logprobs", "http://127.0.0.1:1/v1").encode(task).body):
            for mode in ("ok", "no_logprobs", "off_answers"):
                assert reply_problems(ChatCompletion, wire_formats.openai_chat(one, mode)) == [], (
                    mode
                )
        for options in (None, {"structured": "tool"}):
            messages = orjson.loads(
                adapter("anthropic", "http://127.0.0.1:1", options).encode(task).body
            )
            for mode in ANTHROPIC_MODES:
                assert (
                    reply_problems(Message, wire_formats.anthropic_messages(messages, mode)) == []
                ), mode
        generate = orjson.loads(adapter("gemini", "http://127.0.0.1:1").encode(task).body)
        for mode in GEMINI_MODES:
            assert (
                reply_problems(
                    genai.GenerateContentResponse, wire_formats.gemini_generate(generate, mode)
                )
                == []
            ), mode
        checked += 1
    assert checked == len(all_tasks(data_dir)) > 0


def test_the_error_bodies_conform_to_the_sdk_error_models():
    for status in (400, 401, 429, 500, 529):
        assert reply_problems(ErrorResponse, wire_formats.error_body("anthropic", status)) == []
    # a spend limit: the SDK reads error.details with its ErrorDetails union
    # (anthropic/_exceptions.py)
    quota = wire_formats.quota_body("anthropic")
    details = quota["error"].pop("details")
    assert reply_problems(ErrorResponse, quota) == []
    parsed = pydantic.TypeAdapter(ErrorDetails).validate_python(details)
    assert type(parsed).__name__ == "EnforcedSpendLimitReachedErrorDetails"
    assert reply_problems(ErrorResponse, wire_formats.error_in_200("anthropic", {})) == []
    assert reply_problems(ErrorResponse, wire_formats.unsupported_body("anthropic")) == []
    # OpenAI's error object (the proxies in front of System One and Decisions servers forward it
    # too)
    for body in (
        wire_formats.quota_body("openai"),
        wire_formats.unsupported_body("openai"),
        *(wire_formats.error_body("openai", status) for status in (400, 401, 429, 500, 503)),
    ):
        assert reply_problems(ErrorObject, body["error"]) == []


def test_todays_model_replies_and_refusals_conform_to_the_sdk_models(data_dir: Path):
    """The fakes of today's models (thinking within the budget, reasoning tokens, a rerouted model,
    the refusals of reasoning models) serve what the SDKs declare."""
    task = all_tasks(data_dir)[0]
    for effort, cap in (
        (None, 16_000),
        ("max", 64_000),
        ("high", 1024),
    ):  # the last one is cut off while thinking
        spec = adapters.ModelSpec(
            "anthropic", "claude-sonnet-5-5", params={"max_tokens": cap}, effort=effort
        )
        body = orjson.loads(adapters.get(spec).encode(task).body)
        reply = wire_formats.anthropic_messages(body)
        assert reply_problems(Message, reply) == [] and reply["content"][0]["type"] == "thinking"
    for params in ({}, {"max_completion_tokens": 100}):
        chat = orjson.loads(
            adapters.get(adapters.ModelSpec("openai", "gpt-6-luna", params=params))
            .encode(task)
            .body
        )
        reply = wire_formats.openai_chat(chat)
        assert (
            reply_problems(ChatCompletion, reply) == []
            and reply["usage"]["completion_tokens_details"]["reasoning_tokens"]
        )
    for cap in (None, 100):
        spec = adapters.ModelSpec(
            "gemini",
            "gemini-2.5-flash",
            params={"maxOutputTokens": cap} if cap else {},
            effort="low",
        )
        reply = wire_formats.gemini_generate(
            orjson.loads(adapters.get(spec).encode(task).body), model="gemini-2.5-flash"
        )
        assert (
            reply_problems(genai.GenerateContentResponse, reply) == []
            and reply["modelVersion"] == "gemini-3.5-flash-lite"
        )
    refusals = []
    for model, params in (
        ("gpt-6-luna", {"max_tokens": 5}),
        ("gpt-5-mini", {"reasoning_effort": "none"}),
        ("gpt-4-retired", {}),
    ):
        with pytest.raises(wire_formats.Refused) as refused:
            wire_formats.openai_chat({"model": model, "messages": [], **params})
        refusals.append(refused.value.body["error"])
    with pytest.raises(wire_formats.Refused) as refused:
        wire_formats.openai_chat({"model": "m", "messages": []}, "invalid_schema")
    refusals.append(refused.value.body["error"])
    assert [reply_problems(ErrorObject, e) for e in refusals] == [[]] * 4
    with pytest.raises(wire_formats.Refused) as refused:
        wire_formats.anthropic_messages(
            {"model": "claude-opus-5-5", "thinking": {"type": "disabled"}, "max_tokens": 9}
        )
    assert reply_problems(ErrorResponse, refused.value.body) == []
