"""Language models over OpenAI-compatible Chat Completions with structured outputs: OpenAI, vLLM,
SGLang, llama.cpp server, Ollama, LiteLLM, OpenRouter, Together, Groq, Fireworks, DeepSeek
(PROTOCOLS.md §C).

``POST {base_url}/chat/completions`` with ``Authorization: Bearer $OPENAI_API_KEY`` (not needed for
a loopback base URL; ``--option api_key_env=NAME`` reads another variable). Body::

    {"model", "messages": [system, user], "response_format": {"type": "json_schema",
     "json_schema": {"name": "answers", "strict": true, "schema": <adapters.llm.answer_schema>}}, **params}

``params`` are the provider's own sampling fields, sent as given (``max_completion_tokens``,
``reasoning_effort``, ...; OpenAI's API deprecates ``max_tokens``, which its reasoning models
refuse). No cap is sent unless given: the model's own output maximum then leaves room for its
reasoning (``adapters.budgets``). ``--effort LEVEL`` is ``reasoning_effort``. Reply:
``choices[0].message.content`` parsed by ``adapters.llm.decode_text``; ``message.refusal``
(structured-outputs refusal) and ``finish_reason`` "length" (cut off: while thinking when no content
came and reasoning tokens were spent, ``usage.completion_tokens_details.reasoning_tokens``) or
"content_filter" make every answer invalid; content only in ``reasoning_content``/``reasoning`` is
invalid too; an error inside a 200 (an ``error`` body, a choice with ``finish_reason: "error"``, as
OpenRouter sends) is a transient failure with the provider's message. Usage: ``prompt_tokens``
(``prompt_tokens_details.cached_tokens`` of them read from the prompt cache and
``cache_write_tokens`` written to it, each at its price when the run file gives one: OpenAI prices
them per model), ``completion_tokens`` (reasoning tokens included, as billed; a gateway that leaves
them out of it, its ``total_tokens`` saying so, has them added: ``usage_of``).

Model strings: ``openai:gpt-6.1-terra`` (https://api.openai.com/v1),
``openai:qwen2.5@http://127.0.0.1:8080/v1``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import orjson

from dxi.evals import Task

from . import llm
from .base import EFFORTS, Reply, Request
from .errors import ErrorIn200, MalformedReply
from .http import HTTPAdapter, as_count, load_reply, not_counts
from .provider_errors import body_error
from .streaming import LONG_REPLY_TOKENS, ChatAssembler


def raise_body_error(doc: Any) -> None:
    """Raise ErrorIn200 with the provider's message when a 200 reply carries an error instead of an
    answer (``provider_errors.body_error``: an ``error`` body, a choice with
    ``finish_reason: "error"``): a gateway's failure is retried and sent again by the next run,
    never stored as an answer; the usage it states goes with it (``stated_usage``: billed)."""
    if (error := body_error(doc)) is not None:
        raise ErrorIn200(error, stated_usage(doc))


def stated_usage(doc: dict) -> Reply | None:
    """The usage a Chat Completions reply states, as a ``Reply`` without answers (None: it has no
    ``usage`` object): what an error inside a 200 is charged (``ErrorIn200``)."""
    if not isinstance(doc.get("usage"), dict):
        return None
    input_tokens, output_tokens = usage_of(doc)
    return Reply(
        (),
        input_tokens,
        output_tokens,
        cached_input_tokens=cached_of(doc),
        cache_write_tokens=cache_writes_of(doc),
        usage_problem=usage_problem_of(doc),
    )


def choice_of(doc: Any, body: bytes) -> dict:
    """``choices[0]`` of a Chat Completions reply; raises MalformedReply when the reply has none."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedReply("reply has no 'choices'", body[:2000].decode("utf-8", "replace"))
    return choices[0]


def usage_of(doc: dict) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) of a Chat Completions reply: the output tokens billed,
    reasoning included (``CompletionTokensDetails``: reasoning tokens are counted within
    ``completion_tokens``). A gateway in front of Gemini that leaves the thoughts out of
    ``completion_tokens`` while giving them as ``reasoning_tokens`` and in ``total_tokens``
    (``total_tokens == prompt + completion + reasoning``, reasoning above 0: CLIProxyAPI #5733,
    ``completion_tokens`` 0 with ``reasoning_tokens`` 60) has them added, as they are billed; a
    consistent usage (``total_tokens == prompt + completion``) is read as given."""
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    prompt = as_count(usage.get("prompt_tokens"))
    completion = as_count(usage.get("completion_tokens"))
    reasoning = reasoning_tokens_of(doc) or 0
    total = as_count(usage.get("total_tokens"))
    if prompt is not None and completion is not None and reasoning:
        if total == prompt + completion + reasoning:  # the reasoning left out of completion_tokens
            completion += reasoning
    return prompt, completion


CAPS = ("max_completion_tokens", "max_tokens")
"""The output caps of a Chat Completions request, the first given the one that holds (OpenAI's,
reasoning tokens included; ``max_tokens``, deprecated there, elsewhere)."""
PROMPT_DETAILS = "prompt_tokens_details"
"""Where Chat Completions usage details its prompt tokens (the openai SDK's
``types/completion_usage.py``); the Decisions format's is ``input_tokens_details``
(``types/decision.py``), read by the same two functions below."""


def _input_details(doc: dict, details: str) -> dict:
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    return usage.get(details) if isinstance(usage.get(details), dict) else {}


def cached_of(doc: dict, details: str = PROMPT_DETAILS) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a Chat Completions reply (``details``:
    another usage field holding ``cached_tokens``): the prompt tokens read from OpenAI's prompt
    cache (counted within ``prompt_tokens``, billed at the cached-input price); None if absent."""
    return as_count(_input_details(doc, details).get("cached_tokens"))


def cache_writes_of(doc: dict, details: str = PROMPT_DETAILS) -> int | None:
    """``usage.prompt_tokens_details.cache_write_tokens`` of a Chat Completions reply (the openai
    SDK's ``types/completion_usage.py``; ``details`` as for ``cached_of``): the prompt tokens
    written to OpenAI's prompt cache (within ``prompt_tokens``; priced at a run file's
    ``cache_write`` price, else as input); None if absent."""
    return as_count(_input_details(doc, details).get("cache_write_tokens"))


_INPUT_PARTS = ("cached_tokens", "cache_write_tokens")


def usage_problem_of(
    doc: dict,
    counts: tuple[str, str] = ("prompt_tokens", "completion_tokens"),
    details: str = PROMPT_DETAILS,
) -> str | None:
    """``Reply.usage_problem`` of a Chat Completions reply (``counts``, ``details``: the Decisions
    format's names, ``input_tokens`` / ``output_tokens`` and ``input_tokens_details``): the counts
    of its ``usage`` that are stated but are not counts of tokens (``adapters.http.not_counts``),
    joined; None when there are none. A sub-count that is ``null`` (``cached_tokens``,
    ``cache_write_tokens``, ``reasoning_tokens``: ``Optional[int]`` in the openai SDK, and LiteLLM
    writes ``"cached_tokens": null``) states nothing, as one left out."""
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    found = [
        *not_counts(usage, counts, "usage"),
        *not_counts(usage.get(details), _INPUT_PARTS, f"usage.{details}", _INPUT_PARTS),
        *not_counts(
            usage.get("completion_tokens_details"),
            ("reasoning_tokens",),
            "usage.completion_tokens_details",
            ("reasoning_tokens",),
        ),
    ]
    return "; ".join(found) or None


def reasoning_tokens_of(doc: dict) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens`` of a Chat Completions reply (the openai
    SDK's ``types/completion_usage.py``): the completion tokens spent reasoning; None if absent."""
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    details = usage.get("completion_tokens_details")
    return as_count(details.get("reasoning_tokens")) if isinstance(details, dict) else None


def decode_chat(
    task: Task, body: bytes, cap: str = "max_completion_tokens", doc: Any = None
) -> Reply:
    """Parse a Chat Completions reply to a structured request (see the module docstring); ``cap``
    names the request's token cap in the reason of a reply cut off at it; ``doc``: ``body`` parsed
    already (``Adapter.decode_parsed``), else None."""
    doc = load_reply(body) if doc is None else doc
    raise_body_error(doc)
    choice = choice_of(doc, body)
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    finish = choice.get("finish_reason")
    content = message.get("content")
    content = content if isinstance(content, str) else None
    reasoning = any(
        isinstance(message.get(f), str) and message[f].strip()
        for f in ("reasoning_content", "reasoning")
    )
    problem = cut_off = None
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        problem = f"refusal: {message['refusal'][:200]}"
    elif (
        finish == "length"
    ):  # cut off while thinking: no answer text, the completion spent on reasoning
        problem, cut_off = llm.truncated(
            "finish_reason length",
            cap,
            bool((content or "").strip()),
            reasoning or bool(reasoning_tokens_of(doc)),
        )
    elif finish == "content_filter":
        problem = "blocked by the provider's content filter (finish_reason content_filter)"
    served = doc.get("model") if isinstance(doc.get("model"), str) else None
    input_tokens, output_tokens = usage_of(doc)
    return llm.decode_text(
        task,
        content,
        problem=problem,
        reasoning=reasoning,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        served_model=served,
        cached_input_tokens=cached_of(doc),
        cache_write_tokens=cache_writes_of(doc),
        cut_off=cut_off,
        usage_problem=usage_problem_of(doc),
    )


_AZURE_SUFFIXES = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")
# OpenAI's reasoning models: the o-series and GPT-5 and later (not their -chat variants)
_REASONS = re.compile(r"^(?:o\d+(?:-|$)|gpt-(?:[5-9]|\d{2,})(?:[.-]|$))")


def is_openai_host(url: str) -> bool:
    """Whether ``url`` is served by OpenAI (``api.openai.com`` and its regional hosts
    ``eu.api.openai.com``, ``us.api.openai.com``) or Azure OpenAI (``*.openai.azure.com``,
    ``*.cognitiveservices.azure.com``, ``*.services.ai.azure.com``): the servers where
    ``max_tokens`` is deprecated for ``max_completion_tokens`` and refused by reasoning models."""
    host = (urlsplit(url).hostname or "").lower()
    return (
        host == "api.openai.com"
        or host.endswith(".api.openai.com")
        or host.endswith(_AZURE_SUFFIXES)
    )


def reasons_by_default(model: str) -> bool:
    """Whether the OpenAI ``model`` reasons unless told otherwise (the o-series, GPT-5 and later:
    ``gpt-5-mini``, ``gpt-6-luna``, ``gpt-6.1-terra``); not ``gpt-4.1-mini`` or ``gpt-4o``, nor the
    ``-chat`` variants."""
    name = model.lower()
    return _REASONS.match(name) is not None and "-chat" not in name


class ReasoningEffort:
    """The effort setting of the OpenAI-compatible adapters: ``reasoning_effort``, whose levels are
    the openai SDK's ``ReasoningEffort`` (none, minimal, low, medium, high, xhigh, max; "Not all
    reasoning models support every value": a level the model refuses stops it with the provider's
    message)."""

    EFFORT_FIELD = "reasoning_effort"
    EFFORT_LEVELS = EFFORTS

    @classmethod
    def _with_effort(cls, params: dict, effort: str) -> dict:
        given = params.get("reasoning_effort")
        if given is not None and given != effort:
            raise ValueError(
                f"--effort {effort} and the parameter reasoning_effort={given} disagree: give one"
            )
        return params | {"reasoning_effort": effort}

    @classmethod
    def effort_of(cls, params: dict) -> str | None:
        value = params.get("reasoning_effort")
        return value if isinstance(value, str) else None


class OpenAI(ReasoningEffort, HTTPAdapter):
    """OpenAI-compatible Chat Completions with ``response_format`` json_schema, strict."""

    kind = "openai"
    default_base_url = "https://api.openai.com/v1"
    path = "/chat/completions"
    api_key_env = "OPENAI_API_KEY"
    RESERVED = frozenset({"model", "messages", "response_format", "stream", "stream_options"})
    STREAMED = {"stream": True, "stream_options": {"include_usage": True}}

    def encode(self, task: Task, sample: int = 0) -> Request:
        payload = {
            "model": self.model,
            "messages": llm.messages(task),
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": llm.SCHEMA_NAME,
                    "strict": True,
                    "schema": llm.answer_schema(task),
                },
            },
            **self.params,
        }
        return self.request(payload, sample)

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_chat(task, body, self.cap_field)

    def decode_parsed(self, task: Task, body: bytes, doc: Any) -> Reply:
        return decode_chat(task, body, self.cap_field, doc)

    def assembler(self) -> ChatAssembler:
        return ChatAssembler()

    def stream_body(self, body: bytes) -> bytes:
        """The body with ``"stream": true, "stream_options": {"include_usage": true}`` (usage in the
        last chunk)."""
        return orjson.dumps(orjson.loads(body) | self.STREAMED)

    def long_reply(self, request: Request) -> bool:
        """The model reasons (an effort other than none; without one, a model that reasons by
        default, ``reasons_by_default``), or its cap (``max_completion_tokens``, ``max_tokens``) is
        above ``adapters.streaming.LONG_REPLY_TOKENS``."""
        effort = self.effort
        thinks = effort != "none" if effort is not None else reasons_by_default(self.model)
        cap = llm.token_cap(self.params, "max_completion_tokens", "max_tokens")
        return thinks or (cap is not None and cap > LONG_REPLY_TOKENS)

    @property
    def cap_field(self) -> str:
        """The token cap the requests carry (named in the reason of a reply cut off at it):
        ``max_tokens`` when that is the one given, else ``max_completion_tokens`` (OpenAI's,
        reasoning tokens included)."""
        return (
            "max_tokens"
            if "max_tokens" in self.params and "max_completion_tokens" not in self.params
            else "max_completion_tokens"
        )

    def output_tokens_bound(self, task: Task) -> int | None:
        """``max_completion_tokens`` (reasoning tokens included), else ``max_tokens``, once per
        choice the request asks for (``n``: each is billed its output); None when unset."""
        cap = llm.token_cap(self.params, *CAPS)
        n = llm.choices(self.params, "n")
        return None if cap is None or n is None else cap * n

    def cost_bound_problem(self) -> str | None:
        """A cap below 1, or an ``n`` that is not a positive integer
        (``llm.cost_bound_problem``)."""
        return llm.cost_bound_problem(self.params, CAPS, "n")
