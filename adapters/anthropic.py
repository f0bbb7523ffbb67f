"""Language models over the Anthropic Messages API, structured output by a forced tool (PROTOCOLS.md §C).

``POST {base_url}/v1/messages`` (default https://api.anthropic.com) with headers ``x-api-key:
$ANTHROPIC_API_KEY`` and ``anthropic-version: 2023-06-01``. Body::

    {"model", "max_tokens": 1024, **params, "system": <adapters.llm.SYSTEM_PROMPT>,
     "messages": [{"role": "user", "content": <adapters.llm.render>}],
     "tools": [{"name": "answer", "description", "input_schema": <adapters.llm.answer_schema>}],
     "tool_choice": {"type": "tool", "name": "answer"}}

``params`` are Messages fields sent as given (``max_tokens``, default 1024, ``temperature``, ``top_p``, ...;
extended thinking cannot be combined with a forced tool). Reply: the ``tool_use`` block named "answer"
carries the answers as ``input`` (an object, so it is never "repaired"); ``stop_reason`` "max_tokens" or
"model_context_window_exceeded" (cut off) and "refusal" make every answer invalid, as does a reply
without the tool call (text only, or thinking only). Usage: ``input_tokens``, ``output_tokens``.
Errors: 429 and 529 (overloaded) are retried, honouring ``retry-after``.

Model strings: ``anthropic:claude-sonnet-4-5``, ``anthropic:NAME@https://proxy.example/anthropic``.
"""
from __future__ import annotations

from dxi.evals import Task

from . import llm
from .base import Reply, Request
from .errors import MalformedReply
from .http import HTTPAdapter, as_count, load_json

TOOL = "answer"
API_VERSION = "2023-06-01"


def decode_messages(task: Task, body: bytes) -> Reply:
    """Parse a Messages reply to a forced-tool request (see the module docstring)."""
    doc = load_json(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("content"), list):
        raise MalformedReply("reply has no 'content' list", body[:2000].decode("utf-8", "replace"))
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    meta = {"input_tokens": as_count(usage.get("input_tokens")), "output_tokens": as_count(usage.get("output_tokens")),
            "served_model": doc.get("model") if isinstance(doc.get("model"), str) else None}
    blocks = [b for b in doc["content"] if isinstance(b, dict)]
    stop = doc.get("stop_reason")
    if stop == "refusal":
        return llm.invalid_reply(task, "refusal (stop_reason refusal)", **meta)
    if stop in ("max_tokens", "model_context_window_exceeded"):
        return llm.invalid_reply(task, llm.TRUNCATED.format(f"stop_reason {stop}"), **meta)
    tool = next((b for b in blocks if b.get("type") == "tool_use" and b.get("name") == TOOL), None)
    if tool is not None:
        return Reply(llm.answers_from_object(task, tool.get("input")), **meta)
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
    if text.strip():
        return llm.invalid_reply(task, f"no '{TOOL}' tool call: the model replied in text", **meta)
    thinking = any(b.get("type") in ("thinking", "redacted_thinking") for b in blocks)
    return llm.invalid_reply(task, llm.REASONING_ONLY if thinking else llm.EMPTY, **meta)


class Anthropic(HTTPAdapter):
    """The Anthropic Messages API with the answer schema as a forced tool's ``input_schema``."""

    kind = "anthropic"
    default_base_url = "https://api.anthropic.com"
    path = "/v1/messages"
    api_key_env = "ANTHROPIC_API_KEY"
    DEFAULT_PARAMS = {"max_tokens": 1024}
    RESERVED = frozenset({"model", "system", "messages", "tools", "tool_choice"})
    # Anthropic adds a tool-use system prompt to every request with tools, billed as input; the largest its
    # pricing page lists is 530 tokens (Claude 3 Opus, tool_choice auto; 313-340 for a forced tool): 600 bounds it.
    HIDDEN_INPUT_TOKENS = 600

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    def extra_headers(self) -> dict[str, str]:
        return {"anthropic-version": API_VERSION}

    def encode(self, task: Task, sample: int = 0) -> Request:
        payload = {"model": self.model, **self.params, "system": llm.SYSTEM_PROMPT,
                   "messages": [{"role": "user", "content": llm.render(task)}],
                   "tools": [{"name": TOOL, "description": "Record the answer picked for every question.",
                              "input_schema": llm.answer_schema(task)}],
                   "tool_choice": {"type": "tool", "name": TOOL}}
        return self.request(payload, sample)

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_messages(task, body)

    def output_tokens_bound(self, task: Task) -> int | None:
        """``max_tokens`` (always sent; thinking tokens count within it)."""
        return llm.token_cap(self.params, "max_tokens")
