"""Streamed forms of the fakes' replies (``tests/fakes/wire_formats.py``), as the providers send
them: server-sent events whose every event is built and validated with the official SDKs' stream
event types, so a stream that drifts from the provider fails here.

* OpenAI Chat Completions: ``chat.completion.chunk`` events (openai ``ChatCompletionChunk``): the
  first carries the message's fields empty, then the text in pieces (reasoning first, then a refusal
  or the content), a chunk with the ``finish_reason``, the last one ``choices: []`` with the
  ``usage`` (``stream_options.include_usage``), then ``data: [DONE]``.
* Anthropic Messages: ``message_start`` (the message without content, ``output_tokens`` 1),
  ``ping``, for each block ``content_block_start`` / ``content_block_delta`` (``text_delta``,
  ``thinking_delta`` then ``signature_delta``, ``input_json_delta``) / ``content_block_stop``,
  ``message_delta`` (the stop reason and the final usage) and ``message_stop`` (anthropic
  ``RawMessageStreamEvent``).
* Gemini ``streamGenerateContent?alt=sse``: ``GenerateContentResponse`` chunks (google-genai), each
  with a piece of one part's text and the usage so far; the last with the ``finishReason`` and the
  final ``usageMetadata``.

``split(text, n)`` cuts a text into ``n`` pieces (fewer for a short text); joined, they are the
text.
"""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
from anthropic.types import RawMessageStreamEvent
from google.genai import types as genai
from openai.types.chat import ChatCompletionChunk

_ANTHROPIC_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def split(text: str, n: int) -> list[str]:
    """``text`` in at most ``n`` pieces of (nearly) equal length, none empty; [] for an empty
    text."""
    if not text:
        return []
    n = max(1, min(n, len(text)))
    size, extra = divmod(len(text), n)
    out, at = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(text[at : at + step])
        at += step
    return out


def frame(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: ``event: NAME`` (when given), ``data: JSON``, a blank line."""
    body = data if isinstance(data, bytes) else orjson.dumps(data)
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + body + b"\n\n"


def _openai(chunk: dict) -> dict:
    return ChatCompletionChunk.model_validate(chunk).model_dump(mode="json", exclude_unset=True)


def openai_events(reply: dict, pieces: int = 3) -> list[bytes]:
    """The ``chat.completion.chunk`` frames of the Chat Completions ``reply`` (see the module
    docstring)."""
    head = {k: v for k, v in reply.items() if k not in ("choices", "usage", "object")}
    head = {"id": head.pop("id"), "object": "chat.completion.chunk", **head}

    def chunk(choices: list[dict], usage: Any = None) -> dict:
        return _openai({**head, "choices": choices, "usage": usage})

    out = []
    for choice in reply["choices"]:
        message, index = choice["message"], choice["index"]
        first = {
            k: (v if k == "role" else ("" if isinstance(v, str) else v)) for k, v in message.items()
        }
        out.append(
            chunk([{"index": index, "delta": first, "logprobs": None, "finish_reason": None}])
        )
        for key in ("reasoning_content", "reasoning", "refusal", "content"):
            for piece in split(message.get(key) or "", pieces):
                out.append(
                    chunk(
                        [
                            {
                                "index": index,
                                "delta": {key: piece},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                )
        out.append(
            chunk(
                [
                    {
                        "index": index,
                        "delta": {},
                        "logprobs": choice.get("logprobs"),
                        "finish_reason": choice["finish_reason"],
                    }
                ]
            )
        )
    if "usage" in reply:  # (a server that ignores ``include_usage`` sends none)
        out.append(chunk([], reply["usage"]))
    return [frame(c) for c in out] + [b"data: [DONE]\n\n"]


def _anthropic(event: dict) -> bytes:
    parsed = _ANTHROPIC_EVENT.validate_python(event)
    return frame(parsed.model_dump(mode="json", exclude_unset=True), event["type"])


def anthropic_events(reply: dict, pieces: int = 3) -> list[bytes]:
    """The Messages stream events of ``reply`` (see the module docstring)."""
    usage = dict(reply["usage"])
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens_details"} | {
        "output_tokens": 1
    }
    message = {
        **reply,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    out = [
        _anthropic({"type": "message_start", "message": message}),
        frame({"type": "ping"}, "ping"),
    ]
    for i, block in enumerate(reply["content"]):
        kind = block["type"]
        empty = {
            "text": {"text": ""},
            "thinking": {"thinking": "", "signature": ""},
            "tool_use": {"input": {}},
        }.get(kind, {})
        out.append(
            _anthropic(
                {"type": "content_block_start", "index": i, "content_block": {**block, **empty}}
            )
        )
        if kind == "text":
            deltas = [{"type": "text_delta", "text": p} for p in split(block["text"], pieces)]
        elif kind == "thinking":
            deltas = [
                {"type": "thinking_delta", "thinking": p} for p in split(block["thinking"], pieces)
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            text = orjson.dumps(block["input"]).decode() if block["input"] else ""
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in split(text, pieces)]
        else:
            deltas = []
        out += [_anthropic({"type": "content_block_delta", "index": i, "delta": d}) for d in deltas]
        out.append(_anthropic({"type": "content_block_stop", "index": i}))
    final = {
        k: v
        for k, v in usage.items()
        if k
        in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
            "output_tokens_details",
        )
    }
    out.append(
        _anthropic(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": reply["stop_reason"],
                    "stop_sequence": reply["stop_sequence"],
                },
                "usage": final,
            }
        )
    )
    out.append(_anthropic({"type": "message_stop"}))
    return out


def _gemini(chunk: dict) -> bytes:
    parsed = genai.GenerateContentResponse.model_validate(chunk)
    return frame(parsed.model_dump(mode="json", by_alias=True, exclude_none=True))


def gemini_events(reply: dict, pieces: int = 3) -> list[bytes]:
    """The ``streamGenerateContent?alt=sse`` chunks of the generateContent ``reply`` (see the module
    docstring)."""
    rest = {k: v for k, v in reply.items() if k not in ("candidates", "usageMetadata")}
    usage = reply.get("usageMetadata") or {}
    partial = {k: v for k, v in usage.items() if k == "promptTokenCount"}
    if not reply.get("candidates"):
        return [_gemini(reply)]
    (candidate,) = reply["candidates"]
    content = candidate.get("content") or {}
    steps = [
        (part, piece)
        for part in content.get("parts") or []
        for piece in split(part.get("text") or "", pieces)
    ]
    out = []
    for n, (part, piece) in enumerate(steps):
        chunk_candidate = {
            "content": {"role": content.get("role", "model"), "parts": [{**part, "text": piece}]},
            "index": candidate.get("index", 0),
        }
        last = n == len(steps) - 1
        if last:
            chunk_candidate |= {k: v for k, v in candidate.items() if k not in ("content", "index")}
        out.append(
            _gemini(
                {
                    "candidates": [chunk_candidate],
                    "usageMetadata": usage if last else partial,
                    **rest,
                }
            )
        )
    if not steps:  # no text: one chunk with the stop
        out.append(_gemini({"candidates": [candidate], "usageMetadata": usage, **rest}))
    return out


def error_event(fmt: str) -> bytes:
    """The provider's error sent inside a stream: Anthropic's ``error`` event
    (``overloaded_error``), an OpenAI-compatible gateway's ``error`` chunk, Google's error
    object."""
    if fmt == "anthropic":
        return frame(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            "error",
        )
    if fmt == "gemini":
        return frame(
            {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
        )
    return frame(
        {
            "error": {
                "message": "The server had an error while processing your request.",
                "type": "server_error",
                "code": None,
            }
        }
    )
