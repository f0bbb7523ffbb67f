"""Language models over the Google Gemini API: generateContent with a JSON response schema
(PROTOCOLS.md §C).

``POST {base_url}/v1beta/models/{model}:generateContent`` (default
https://generativelanguage.googleapis.com) with header ``x-goog-api-key: $GEMINI_API_KEY``. Body::

    {"systemInstruction": {"parts": [{"text": <adapters.llm.SYSTEM_PROMPT>}]},
     "contents": [{"role": "user", "parts": [{"text": <adapters.llm.render>}]}],
     "generationConfig": {"responseMimeType": "application/json",
                          "responseJsonSchema": <adapters.llm.answer_schema>, **params}}

``responseJsonSchema`` takes standard JSON Schema (``additionalProperties`` included, which the
older OpenAPI-subset ``responseSchema`` rejects). ``params`` are ``generationConfig`` fields sent as
given (``maxOutputTokens``, ``thinkingConfig``, ...; Google no longer recommends setting
``temperature`` on Gemini 3 models). No ``maxOutputTokens`` is sent unless given: the model's own
maximum then leaves room for thinking. ``--effort LEVEL`` is ``thinkingConfig.thinkingLevel``
(Gemini 3 and later; minimal, low, medium, high, xhigh: the SDK's ``ThinkingLevel``, sent as its
enum value, ``"LOW"``); a user's ``thinkingConfig.thinkingBudget`` (Gemini 2.5) is sent as given and
does not combine with ``--effort``. The key is ``GOOGLE_API_KEY`` or ``GEMINI_API_KEY`` (the first,
as the SDK, when both are set). Reply: the text parts of ``candidates[0].content`` (parts marked
``thought`` are reasoning, never answers) parsed by ``adapters.llm.decode_text``; ``finishReason``
"MAX_TOKENS" (cut off: while thinking when no answer text came and thoughts were counted) or a
safety/recitation stop, and a prompt blocked by ``promptFeedback.blockReason``, make every answer
invalid; an error body in a 200 is a transient failure. Usage: ``promptTokenCount``
(``cachedContentTokenCount`` of them cached), and ``candidatesTokenCount`` + ``thoughtsTokenCount``
as output (as billed). A 429 without Retry-After is retried after the ``google.rpc.RetryInfo``
``retryDelay`` of its body, when given; a per-day quota (``QuotaFailure``) stops the provider
(``adapters.provider_errors``).

A reply names the model that answered in ``modelVersion`` (a retired model's requests are rerouted
to its replacement: ``Reply.served_model``).

Model strings: ``gemini:gemini-3.5-flash``, ``gemini:NAME@https://proxy.example``.
"""

from __future__ import annotations

import re
from typing import Any

from dxi.evals import Task

from . import llm, provider_errors
from .base import Reply, Request
from .errors import ErrorIn200, MalformedReply
from .http import HTTPAdapter, as_count, load_reply, not_counts
from .provider_errors import body_error
from .streaming import LONG_REPLY_TOKENS, GenerateAssembler, gemini_stream_path


def retry_delay(body: bytes) -> float | None:
    """Seconds from a Google error body's ``RetryInfo`` detail (``"retryDelay": "32s"``), else None
    (also for a negative or non-finite delay)."""
    return provider_errors.retry_delay(provider_errors.error_doc(body))


def billed_output(usage: dict, answer: str, thoughts: str) -> int | None:
    """The output tokens billed for a Gemini reply whose usage block is ``usage``: its answer tokens
    (the count named ``answer``, ``candidatesTokenCount``) plus its thoughts (``thoughts``,
    ``thoughtsTokenCount``, billed as output and not counted within the answer tokens: google-genai
    ``GenerateContentResponseUsageMetadata``). The API leaves a count of 0 out of its JSON, so a
    count left out is 0 (a reply cut off while thinking gives ``thoughtsTokenCount`` alone,
    python-genai #811: its thoughts are its output), and so is thoughts that are ``null`` (the SDK's
    ``Optional[int]``); None without a usage block, or when either is stated but is not a count
    (``not_counts`` names it: its cost is then unknown, never priced as 0 output)."""
    out = as_count(usage.get(answer, 0))
    thought = as_count(0 if usage.get(thoughts) is None else usage[thoughts])
    return None if not usage or out is None or thought is None else out + thought


COUNTS = (
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
)
"""The counts of a generateContent reply's ``usageMetadata`` that price it (the last two are parts
of the others: ``null`` there states nothing, ``adapters.http.not_counts``)."""


def _usage(doc: dict) -> tuple[int | None, int | None, int | None, str | None]:
    usage = doc.get("usageMetadata") if isinstance(doc.get("usageMetadata"), dict) else {}
    prompt = as_count(usage.get("promptTokenCount"))
    cached = as_count(usage.get("cachedContentTokenCount"))  # within promptTokenCount
    return (
        prompt,
        billed_output(usage, "candidatesTokenCount", "thoughtsTokenCount"),
        (cached or 0) if prompt is not None else None,
        "; ".join(not_counts(usage, COUNTS, "usageMetadata", COUNTS[2:])) or None,
    )


def _stated(doc: dict) -> Reply | None:
    """The usage a generateContent reply states, as a ``Reply`` without answers (None: it has no
    ``usageMetadata``): what an error inside a 200 is charged (``ErrorIn200``)."""
    if not isinstance(doc.get("usageMetadata"), dict):
        return None
    tokens_in, tokens_out, cached, problem = _usage(doc)
    return Reply((), tokens_in, tokens_out, cached_input_tokens=cached, usage_problem=problem)


def decode_generate(task: Task, body: bytes, doc: Any = None) -> Reply:
    """Parse a generateContent reply (see the module docstring); ``doc``: ``body`` parsed already
    (``Adapter.decode_parsed``), else None."""
    doc = load_reply(body) if doc is None else doc
    if (error := body_error(doc)) is not None:
        raise ErrorIn200(error, _stated(doc))  # billed: the usage it states (runner.sending.cost)
    if not isinstance(doc, dict):
        raise MalformedReply("reply is not a JSON object", body[:2000].decode("utf-8", "replace"))
    tokens_in, tokens_out, cached, problem = _usage(doc)
    meta = {
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "cached_input_tokens": cached,
        "usage_problem": problem,
        "served_model": doc.get("modelVersion")
        if isinstance(doc.get("modelVersion"), str)
        else None,
    }
    candidates = doc.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        feedback = doc.get("promptFeedback") if isinstance(doc.get("promptFeedback"), dict) else {}
        if feedback.get("blockReason"):
            return llm.invalid_reply(
                task,
                f"prompt blocked (promptFeedback.blockReason {feedback['blockReason']})",
                **meta,
            )
        raise MalformedReply("reply has no 'candidates'", body[:2000].decode("utf-8", "replace"))
    candidate = candidates[0] if isinstance(candidates[0], dict) else {}
    finish = candidate.get("finishReason")
    content = candidate.get("content") if isinstance(candidate.get("content"), dict) else {}
    parts = [
        p
        for p in content.get("parts") or []
        if isinstance(p, dict) and isinstance(p.get("text"), str)
    ]
    text = "".join(p["text"] for p in parts if not p.get("thought"))
    reasoning = any(p.get("thought") and p["text"].strip() for p in parts)
    problem = cut_off = None
    if (
        finish == "MAX_TOKENS"
    ):  # cut off while thinking: no answer text, the limit spent on thoughts
        thoughts = (
            usage.get("thoughtsTokenCount")
            if isinstance(usage := doc.get("usageMetadata"), dict)
            else None
        )
        problem, cut_off = llm.truncated(
            "finishReason MAX_TOKENS",
            "maxOutputTokens",
            bool(text.strip()),
            reasoning or bool(as_count(thoughts)),
        )
    elif finish not in (None, "STOP", "FINISH_REASON_UNSPECIFIED"):
        problem = f"no usable answer (finishReason {finish})"
    return llm.decode_text(
        task, text, problem=problem, reasoning=reasoning, cut_off=cut_off, **meta
    )


_VERSION = re.compile(r"gemini-(\d+)(?:\.(\d+))?")


def gemini_thinks_by_default(model: str) -> bool:
    """Whether the Gemini ``model`` thinks when the request sets no ``thinkingConfig``: Gemini 3 and
    later, and 2.5 Pro and Flash (not 2.5 Flash-Lite, whose thinking is off by default: the Gemini
    API's thinking page)."""
    m = _VERSION.search(model)
    if m is None:
        return False
    version = (int(m.group(1)), int(m.group(2) or 0))
    return version >= (3, 0) or (version == (2, 5) and "flash-lite" not in model)


# The Gemini API's key: GOOGLE_API_KEY wins when both are set, as in the google-genai SDK
# (``_api_client.py``)
API_KEY_ENVS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")


class Gemini(HTTPAdapter):
    """Gemini generateContent with ``responseMimeType`` application/json and
    ``responseJsonSchema``."""

    kind = "gemini"
    default_base_url = "https://generativelanguage.googleapis.com"
    api_key_env = "GEMINI_API_KEY"
    API_KEY_ENVS = API_KEY_ENVS
    RESERVED = frozenset({"responseMimeType", "responseJsonSchema", "responseSchema"})
    EFFORT_FIELD = "thinkingConfig.thinkingLevel"
    EFFORT_LEVELS = (
        "minimal",
        "low",
        "medium",
        "high",
        "xhigh",
    )  # google-genai 3.6.1 types.ThinkingLevel

    @classmethod
    def effort_hint(cls, effort: str) -> str:
        return (
            "; on a Gemini 2.5 model, thinking is set by a budget: --param thinkingConfig='{\"thinkingBudget\": 0}'"
            if effort == "none"
            else ""
        )

    @classmethod
    def _with_effort(cls, params: dict, effort: str) -> dict:
        thinking = (
            params.get("thinkingConfig") if isinstance(params.get("thinkingConfig"), dict) else {}
        )
        if "thinkingBudget" in thinking:
            raise ValueError(
                f"--effort {effort} and thinkingConfig.thinkingBudget do not combine (Gemini refuses a "
                "request with both thinkingLevel and thinkingBudget): give one"
            )
        given = thinking.get("thinkingLevel")
        if isinstance(given, str) and given.lower() != effort:
            raise ValueError(
                f"--effort {effort} and the parameter thinkingConfig.thinkingLevel={given} disagree: give one"
            )
        # the enum's own value, as the SDK sends it ("LOW"; the API reads it in any case)
        return params | {"thinkingConfig": {**thinking, "thinkingLevel": effort.upper()}}

    @classmethod
    def effort_of(cls, params: dict) -> str | None:
        thinking = params.get("thinkingConfig")
        value = thinking.get("thinkingLevel") if isinstance(thinking, dict) else None
        return value.lower() if isinstance(value, str) else None

    @property
    def path(self) -> str:  # type: ignore[override]
        return f"/v1beta/models/{self.model.removeprefix('models/')}:generateContent"

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-goog-api-key": key}

    def retry_after_from_body(self, body: bytes) -> float | None:
        return retry_delay(body)

    def encode(self, task: Task, sample: int = 0) -> Request:
        payload = {
            "systemInstruction": {"parts": [{"text": llm.SYSTEM_PROMPT}]},
            "contents": [{"role": "user", "parts": [{"text": llm.render(task)}]}],
            "generationConfig": {
                "responseMimeType": "application/json",
                "responseJsonSchema": llm.answer_schema(task),
                **self.params,
            },
        }
        return self.request(payload, sample)

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_generate(task, body)

    def decode_parsed(self, task: Task, body: bytes, doc: Any) -> Reply:
        return decode_generate(task, body, doc)

    def assembler(self) -> GenerateAssembler:
        return GenerateAssembler()

    @property
    def stream_url(self) -> str:
        """``:streamGenerateContent?alt=sse`` (server-sent events), the body unchanged."""
        return self.base_url + gemini_stream_path(self.path)

    def long_reply(self, request: Request) -> bool:
        """The model thinks (a ``thinkingLevel``, a ``thinkingBudget`` other than 0; without either,
        a model that thinks by default, ``gemini_thinks_by_default``), or ``maxOutputTokens`` is
        above ``adapters.streaming.LONG_REPLY_TOKENS``."""
        given = self.params.get("thinkingConfig")
        thinking = given if isinstance(given, dict) else {}
        if thinking.get("thinkingLevel") is not None:
            thinks = True
        elif "thinkingBudget" in thinking:
            thinks = thinking["thinkingBudget"] != 0
        else:
            thinks = gemini_thinks_by_default(self.model)
        cap = llm.token_cap(self.params, "maxOutputTokens")
        return thinks or (cap is not None and cap > LONG_REPLY_TOKENS)

    def output_tokens_bound(self, task: Task) -> int | None:
        """``maxOutputTokens`` plus ``thinkingConfig.thinkingBudget`` (thoughts are billed as
        output), once per candidate the request asks for (``candidateCount``: each is billed its
        output); None when ``maxOutputTokens`` is unset, or thinking is on without a budget."""
        one = self._one_candidate_bound()
        n = llm.choices(self.params, "candidateCount")
        return None if one is None or n is None else one * n

    def _one_candidate_bound(self) -> int | None:
        cap = llm.token_cap(self.params, "maxOutputTokens")
        thinking = self.params.get("thinkingConfig")
        if cap is None or not isinstance(thinking, dict) or "thinkingBudget" not in thinking:
            return cap
        budget = llm.token_cap(thinking, "thinkingBudget")
        return None if budget is None and thinking["thinkingBudget"] != 0 else cap + (budget or 0)

    def cost_bound_problem(self) -> str | None:
        """A ``maxOutputTokens`` below 1, or a ``candidateCount`` that is not a positive integer
        (``llm.cost_bound_problem``)."""
        return llm.cost_bound_problem(self.params, ("maxOutputTokens",), "candidateCount")
