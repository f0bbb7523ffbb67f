"""Streamed replies: when a request is streamed, reading its server-sent events, and assembling them
into the reply the same request sends whole, so that decoding, the cache, scoring and rescoring see
one form.

A streamed request is the non-streamed request with the provider's streaming switch (OpenAI Chat
Completions ``"stream": true, "stream_options": {"include_usage": true}``; Anthropic Messages
``"stream": true``; Gemini ``:streamGenerateContent?alt=sse`` for ``:generateContent``, the body
unchanged). The cache key, the stored request body and the stored reply are those of the
non-streamed request (``Request.key`` is computed from the canonical body, the switch is added when
it is sent): a streamed and a non-streamed answer to one request are interchangeable.

When a request is streamed (``--stream``, ``Limits.stream``): ``never``; ``always`` (the adapters
that have a streamed form: ``openai``, ``llamacpp``, ``anthropic``, ``gemini``); ``auto`` (the
default) when its reply can be long (``Adapter.long_reply``): the model thinks (a reasoning effort
other than none, a thinking configuration, a model that thinks by default), or its output budget is
larger than ``LONG_REPLY_TOKENS``, or, for Anthropic, the official SDK would refuse it unstreamed
(``anthropic_sdk_refuses``).

The wire formats (each ``feed`` reads one event's JSON; ``body`` returns the assembled reply as JSON
bytes):

* ``ChatAssembler``: OpenAI ``chat.completion.chunk`` events (the openai SDK's
  ``ChatCompletionChunk``), then ``data: [DONE]``; the deltas' ``content``, ``refusal`` and
  reasoning text (``reasoning_content``, ``reasoning``) are joined per choice, a tool call's pieces
  by its ``index`` (its ``function.arguments`` joined, as the SDK does), the last chunk
  (``choices: []``) carries ``usage``. The result is a ``chat.completion`` object, as the openai
  SDK's ``ChatCompletionStreamState`` builds it.
* ``MessagesAssembler``: Anthropic ``message_start``, ``content_block_start`` / ``_delta``
  (``text_delta``, ``thinking_delta``, ``signature_delta``, ``input_json_delta``) / ``_stop``,
  ``message_delta`` (the stop reason and the cumulative usage, which overwrites the start's),
  ``message_stop``, ``ping`` (ignored) and ``error`` (the anthropic SDK's ``RawMessageStreamEvent``
  and its ``accumulate_event``).
* ``GenerateAssembler``: Gemini ``GenerateContentResponse`` chunks; consecutive text parts of one
  kind (thought or answer) are joined, the last ``usageMetadata`` and ``finishReason`` kept.

Every assembler reads a usage stated in several events as cumulative counts (the last kept, an
Anthropic ``message_delta``'s counts over its ``message_start``'s) while no count falls or goes
missing; a stream whose counts fall (100 output tokens, then 0; Gemini's 500 input tokens, then 1)
states no usage that can be believed: the reply keeps none (``Assembler._usage``,
``usage_conflict``), so its cost is unknown, as a reply without usage.

A stream is whole once its stop is given (a ``finish_reason``, ``stop_reason`` or ``finishReason``,
or a blocked prompt); one that ends before is cut (``complete`` False): a transient failure whose
partial text is never scored. ``data: [DONE]`` ends the stream (``done``): nothing after it is read,
as the openai SDK's ``Stream`` stops there. ``began`` says whether any event of the reply arrived
(an error event before any does not count): a stream that began is never sent again in the same run
(``adapters.http``).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from .json_body import load_json, load_reply
from .provider_errors import body_error

# The Anthropic SDK's rule for a request it refuses without streaming (anthropic 2.16.0,
# ``_base_client.py`` ``_calculate_nonstreaming_timeout``): the expected time, an hour for 128,000
# output tokens, over ten minutes, or ``max_tokens`` above the model's own non-streaming limit
# (``_constants.py`` ``MODEL_NONSTREAMING_TOKENS``).
SDK_HOUR_TOKENS = 128_000
SDK_NONSTREAMING_S = 600.0
MODEL_NONSTREAMING_TOKENS = {
    "claude-opus-4-20250514": 8_192,
    "claude-opus-4-0": 8_192,
    "claude-4-opus-20250514": 8_192,
    "anthropic.claude-opus-4-20250514-v1:0": 8_192,
    "claude-opus-4@20250514": 8_192,
    "anthropic.claude-opus-4-1-20250805-v1:0": 8_192,
    "claude-opus-4-1@20250805": 8_192,
}
LONG_REPLY_TOKENS = int(SDK_HOUR_TOKENS * SDK_NONSTREAMING_S / 3600)
"""21,333: an output budget above it may take longer than ten minutes at the Anthropic SDK's rate
(128,000 tokens an hour); ``auto`` streams such requests on every provider."""

STREAM_MODES = ("auto", "always", "never")


def anthropic_sdk_refuses(model: str, max_tokens: int) -> bool:
    """Whether the anthropic SDK refuses ``messages.create`` for ``model`` with ``max_tokens``
    unstreamed ("Streaming is required for operations that may take longer than 10 minutes"): ``3600
    * max_tokens / 128000 > 600`` or ``max_tokens`` above ``MODEL_NONSTREAMING_TOKENS[model]`` (see
    the constants above)."""
    limit = MODEL_NONSTREAMING_TOKENS.get(model)
    too_long = 3600 * max_tokens / SDK_HOUR_TOKENS > SDK_NONSTREAMING_S
    return too_long or (limit is not None and max_tokens > limit)


class SSEParser:
    """An incremental parser of ``text/event-stream`` (the WHATWG HTML standard, "Server-sent
    events"): ``feed(bytes)`` returns the events completed by those bytes as ``(event name, data)``
    pairs (the name "" when the event has none; several ``data:`` lines joined by a newline). Lines
    end in LF or CRLF; comment lines (``:``) and other fields (``id``, ``retry``) are skipped."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        out = []
        for raw in lines:
            line = raw.removesuffix(b"\r").decode("utf-8", "replace")
            if not line:
                if self._data:
                    out.append((self._event, "\n".join(self._data)))
                self._event, self._data = "", []
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                self._data.append(value)
            elif field == "event":
                self._event = value
        return out

    def close(self) -> list[tuple[str, str]]:
        """The last event, when the stream ended without the blank line after it."""
        return self.feed(b"\n\n") if self._buffer or self._data else []


class Assembler:
    """Builds the non-streamed reply from a stream's events (see the module docstring). ``began``:
    an event of the reply arrived; ``complete``: its stop was given; ``error``: the provider's error
    event or chunk (its JSON), which ends the stream; ``done``: ``data: [DONE]`` came, which ends it
    too (what follows is not read). ``feed`` returns True when the event carried generated output
    (text, thinking, a refusal, tool input): the first such is the time to first token."""

    COUNTS: tuple[str, ...] = ()
    """The counts of the format's usage block that must not fall from one event to the next
    (``_usage``)."""

    def __init__(self) -> None:
        self.began = False
        self.complete = False
        self.done = False
        self.error: Any = None
        self.usage_conflict = False

    def _usage(self, before: Any, after: dict) -> dict | None:
        """The usage to keep once the stream states ``after`` where it stated ``before`` (None:
        none yet): ``after``, every provider's counts being cumulative (the last whole), unless a
        count of ``COUNTS`` falls or goes missing (500 input tokens, then 1): then none, for the
        rest of the stream (``usage_conflict``, the one rule of every assembler: see the module
        docstring)."""
        if not self.usage_conflict and isinstance(before, dict):
            for name in self.COUNTS:
                was, now = before.get(name), after.get(name)
                if _number(was) and not (_number(now) and now >= was):
                    self.usage_conflict = True
        return None if self.usage_conflict else after

    @property
    def ended(self) -> bool:
        """Whether the stream ended by its own word (``[DONE]`` or an error): read no further."""
        return self.done or self.error is not None

    def feed(self, event: str, data: str) -> bool:
        """Read one event (its name and its data); raises MalformedReply when its data is not
        JSON."""
        if data.strip() == "[DONE]":
            self.complete = self.complete or self.began
            self.done = True
            return False
        if event == "ping":
            return False
        doc = load_reply(data)
        if body_error(doc) is not None:
            self.error = doc
            return False
        return self._feed(event, doc)

    def _feed(self, event: str, doc: Any) -> bool:
        raise NotImplementedError

    def body(self) -> bytes:
        """The assembled reply (JSON bytes), as the request sends it whole; the error event's JSON
        after one."""
        return orjson.dumps(self.error if self.error is not None else self._doc())

    def _doc(self) -> dict:
        raise NotImplementedError


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _join(target: dict, delta: dict, texts: tuple[str, ...]) -> bool:
    """Add ``delta``'s fields to ``target``: the text fields ``texts`` appended, others replaced
    (None never replaces a value). True when a text field brought text."""
    token = False
    for key, value in delta.items():
        if key in texts and isinstance(value, str):
            target[key] = (target.get(key) or "") + value
            token = token or bool(value)
        elif value is not None or key not in target:
            target[key] = value
    return token


def _tool_calls(message: dict, calls: list) -> bool:
    """Join streamed tool-call pieces into ``message["tool_calls"]`` by their ``index`` (the openai
    SDK's ``ChatCompletionStreamState``: the first piece names the call, the next ones carry
    ``function.arguments`` a few characters at a time, appended); True when arguments came."""
    joined = message.get("tool_calls")
    joined = message["tool_calls"] = joined if isinstance(joined, list) else []
    token = False
    for call in calls:
        if not isinstance(call, dict):
            continue
        index = call.get("index", len(joined))
        target = next((c for c in joined if c.get("index") == index), None)
        if target is None:
            joined.append(target := {})
        for key, value in call.items():
            if key == "function" and isinstance(value, dict):
                function = target.setdefault("function", {})
                token = _join(function, value, ("arguments",)) or token
            elif value is not None or key not in target:
                target[key] = value
    return token


def _keep(doc: dict, key: str, usage: dict | None) -> None:
    """``doc[key]`` set to ``usage``, or left out when None (``Assembler._usage``)."""
    if usage is None:
        doc.pop(key, None)
    else:
        doc[key] = usage


class _ListAssembler(Assembler):
    """A reply whose chunks are JSON objects: top-level fields (``_field``) and a list ``LIST`` of
    items, each chunk of an item joined into the item of its index (``_item``): OpenAI's
    ``choices``, Gemini's ``candidates``. ``doc`` holds the fields, ``items`` the items by index."""

    LIST = ""

    def __init__(self) -> None:
        super().__init__()
        self.doc: dict = {}
        self.items: dict[int, dict] = {}

    def _feed(self, event: str, doc: Any) -> bool:
        if not isinstance(doc, dict):
            return False
        self.began = True
        token = False
        for key, value in doc.items():
            if key == self.LIST:
                self.doc.setdefault(key, None)
                for position, chunk in enumerate(value if isinstance(value, list) else []):
                    if isinstance(chunk, dict):
                        token = self._item(chunk, position) or token
            else:
                self._field(key, value)
        self._fed()
        return token

    def _item(self, chunk: dict, position: int) -> bool:
        """Join the chunk of the item at ``position`` in its list (its own ``index`` when it has
        one); True when it brought generated output."""
        raise NotImplementedError

    def _field(self, key: str, value: Any) -> None:
        if value is not None or key not in self.doc:
            self.doc[key] = value

    def _fed(self) -> None:
        """After each chunk (a reply that ends without its items' stop sets ``complete`` here)."""

    def _doc(self) -> dict:
        doc = dict(self.doc)
        if self.LIST in doc or self.items:
            doc[self.LIST] = [self.items[i] for i in sorted(self.items)]
        return doc


class ChatAssembler(_ListAssembler):
    """OpenAI Chat Completions chunks into a ``chat.completion`` (see the module docstring)."""

    TEXTS = ("content", "refusal", "reasoning_content", "reasoning")
    LIST = "choices"
    COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")

    def _field(self, key: str, value: Any) -> None:
        if key == "object":
            self.doc[key] = "chat.completion"
        elif key == "usage" and isinstance(value, dict):
            _keep(self.doc, key, self._usage(self.doc.get(key), value))
        else:
            super()._field(key, value)

    def _item(self, chunk: dict, position: int) -> bool:
        index = chunk.get("index", 0)
        choice = self.items.setdefault(index if isinstance(index, int) else 0, {})
        token = False
        for key, value in chunk.items():
            if key == "delta":
                message = choice.setdefault("message", {})
                if isinstance(value, dict):
                    delta = dict(value)
                    calls = delta.pop("tool_calls", None)
                    token = _join(message, delta, self.TEXTS)
                    if isinstance(calls, list):
                        token = _tool_calls(message, calls) or token
            elif (
                key == "logprobs" and isinstance(value, dict) and isinstance(choice.get(key), dict)
            ):
                for part, items in value.items():  # token logprobs arrive a few per chunk
                    if isinstance(items, list):
                        choice[key][part] = (choice[key].get(part) or []) + items
            elif value is not None or key not in choice:
                choice[key] = value
        if choice.get("finish_reason") is not None:
            self.complete = True
        return token


class MessagesAssembler(Assembler):
    """Anthropic Messages events into a ``message`` (see the module docstring)."""

    COUNTS = (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    )

    def __init__(self) -> None:
        super().__init__()
        self.message: dict | None = None
        self.json_parts: dict[int, str] = {}

    def _feed(self, event: str, doc: Any) -> bool:
        kind = doc.get("type") if isinstance(doc, dict) else None
        if kind == "message_start" and isinstance(doc.get("message"), dict):
            self.began = True
            self.message = dict(doc["message"])
            self.message["content"] = list(self.message.get("content") or [])
            return False
        message = self.message
        if message is None:
            return False  # (nothing before message_start belongs to a reply)
        blocks = message["content"]
        index = doc.get("index")
        if kind == "content_block_start" and isinstance(doc.get("content_block"), dict):
            block = dict(doc["content_block"])
            blocks.append(block)
            return bool(block.get("text") or block.get("thinking"))
        if kind == "content_block_delta" and isinstance(index, int) and 0 <= index < len(blocks):
            block = blocks[index]
            delta = doc.get("delta") if isinstance(doc.get("delta"), dict) else {}
            step = delta.get("type")
            if step == "text_delta" and isinstance(delta.get("text"), str):
                block["text"] = (block.get("text") or "") + delta["text"]
                return bool(delta["text"])
            if step == "thinking_delta" and isinstance(delta.get("thinking"), str):
                block["thinking"] = (block.get("thinking") or "") + delta["thinking"]
                return bool(delta["thinking"])
            if step == "signature_delta":
                block["signature"] = delta.get("signature")
            elif step == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                self.json_parts[index] = self.json_parts.get(index, "") + delta["partial_json"]
                return bool(delta["partial_json"])
            elif step == "citations_delta" and delta.get("citation") is not None:
                block["citations"] = [*(block.get("citations") or []), delta["citation"]]
            return False
        if kind == "content_block_stop" and isinstance(index, int) and index in self.json_parts:
            text = self.json_parts.pop(index)
            if 0 <= index < len(blocks) and text.strip():
                blocks[index]["input"] = load_json(text)
        elif kind == "message_delta":
            delta = doc.get("delta") if isinstance(doc.get("delta"), dict) else {}
            message["stop_reason"] = delta.get("stop_reason")
            message["stop_sequence"] = delta.get("stop_sequence")
            for key, value in delta.items():
                if key not in ("stop_reason", "stop_sequence") and value is not None:
                    message[key] = value
            usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
            before = message.get("usage")
            total = dict(before) if isinstance(before, dict) else {}
            for key, value in usage.items():  # cumulative counts: they overwrite the start's
                if value is not None:
                    total[key] = value
            _keep(message, "usage", self._usage(before, total))
            self.complete = self.complete or message["stop_reason"] is not None
        elif kind == "message_stop":
            self.complete = True
        return False

    def _doc(self) -> dict:
        return self.message or {}


class GenerateAssembler(_ListAssembler):
    """Gemini ``streamGenerateContent`` chunks into one ``GenerateContentResponse`` (see the module
    docstring)."""

    LIST = "candidates"
    COUNTS = ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount", "totalTokenCount")

    def _field(self, key: str, value: Any) -> None:
        if key == "usageMetadata" and isinstance(value, dict):
            _keep(self.doc, key, self._usage(self.doc.get(key), value))
        elif value is not None:
            self.doc[key] = value

    def _fed(self) -> None:
        feedback = self.doc.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            self.complete = True

    def _item(self, chunk: dict, position: int) -> bool:
        index = chunk.get("index", position)
        candidate = self.items.setdefault(index if isinstance(index, int) else position, {})
        token = False
        for key, value in chunk.items():
            if key == "content" and isinstance(value, dict):
                content = candidate.setdefault("content", {})
                for part_key, part_value in value.items():
                    if part_key == "parts" and isinstance(part_value, list):
                        parts = content.setdefault("parts", [])
                        for part in part_value:
                            token = _add_part(parts, part) or token
                    else:
                        content[part_key] = part_value
            elif value is not None:
                candidate[key] = value
        if candidate.get("finishReason") not in (None, "FINISH_REASON_UNSPECIFIED"):
            self.complete = True
        return token


def _add_part(parts: list, part: Any) -> bool:
    """Append a streamed part to ``parts``: text joined to the last part when both are text of one
    kind (thought or answer); True when it brought text."""
    if not isinstance(part, dict):
        return False
    text = part.get("text")
    last = parts[-1] if parts else None
    if (
        isinstance(text, str)
        and isinstance(last, dict)
        and isinstance(last.get("text"), str)
        and bool(last.get("thought")) == bool(part.get("thought"))
    ):
        last["text"] += text
        last.update((k, v) for k, v in part.items() if k != "text")
    else:
        parts.append(dict(part))
    return bool(text)


_GEMINI_PATH = re.compile(r":generateContent$")


def gemini_stream_path(path: str) -> str:
    """The streamed form of a generateContent path: ``:streamGenerateContent?alt=sse``."""
    return _GEMINI_PATH.sub(":streamGenerateContent?alt=sse", path)
