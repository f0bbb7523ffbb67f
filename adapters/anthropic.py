"""Language models over the Anthropic Messages API, with the answer schema as a structured output
(PROTOCOLS.md §C).

``POST {base_url}/v1/messages`` (default https://api.anthropic.com) with headers
``x-api-key: $ANTHROPIC_API_KEY`` and ``anthropic-version: 2026-10-21`` (``API_VERSION``: the
version the anthropic SDK 2.x sends, ``anthropic/_constants.py`` ``ANTHROPIC_API_VERSION``;
Anthropic recommends the latest version, earlier ones being "deprecated and may be unavailable for
new users", platform.claude.com/docs/en/api/versioning). ``--option api_version=2023-06-01`` pins
the previous version (``API_VERSIONS``), which still serves the requests it served. Body (the
default, ``structured=output_config``)::

    {"model", "max_tokens": <adapters.budgets>, **params, "system": <adapters.llm.SYSTEM_PROMPT>,
     "messages": [{"role": "user", "content": <adapters.llm.render>}],
     "output_config": {**<the user's output_config>, "format": {"type": "json_schema",
                                                            "schema": <adapters.llm.answer_schema>}}}

(the anthropic SDK's ``types/output_config_param.py`` and ``json_output_format_param.py``; the
structured-outputs page of Anthropic's docs). The current models (``claude-opus-5-5``,
``claude-sonnet-5-5``, ``claude-fable-5-1``, ``claude-mythos-5-1``) refuse forced tool use
(``tool_choice`` of type ``tool`` or ``any``) with HTTP 400. Reply: the text blocks, read by
``adapters.llm.decode_text`` with the reply rules of every language model (the object alone is
valid, one Markdown fence is ``repaired``, anything else invalid with its reason).

``--option structured=tool`` (older models without structured outputs) sends the schema as a forced
tool instead: ``"tools": [{"name": "answer", "description", "input_schema": <schema>}],
"tool_choice": {"type": "tool", "name": "answer"}``; the reply's ``tool_use`` block named "answer"
carries the answers as ``input`` (an object, never "repaired"); a reply without the tool call (text
only, thinking only) is invalid.

Either way ``stop_reason`` "max_tokens" or "model_context_window_exceeded" (cut off: while thinking
when thinking blocks came, or ``usage.output_tokens_details.thinking_tokens`` counted thinking, and
no answer had begun), "refusal" and "pause_turn" (a long-running turn paused unfinished, to be sent
back to continue: ``PAUSED``) make every answer invalid, and an error body in a 200 (an
``{"type": "error"}`` event) is a transient failure. ``params`` are Messages fields sent as given
(``max_tokens``, ``thinking``, ``stop_sequences``, ...), except the sampling parameters
``temperature``, ``top_p`` and ``top_k`` (``SAMPLING``): version 2026-10-21 answers a request
carrying any of them with HTTP 400, even at its default value (the migration guide,
platform.claude.com/docs/en/api/migration-2026-10-21; the SDK 2.x declares none of them), so they
are refused before anything is sent, unless the version is pinned to 2023-06-01. The default
``max_tokens`` leaves room for the thinking of the current models, which think by default and count
it within ``max_tokens``: 16,000 (64,000 at effort xhigh or max), 1,024 for models that do not think
(``adapters.budgets``). ``--effort LEVEL`` is ``output_config.effort`` (low, medium, high, xhigh,
max: the SDK's ``OutputConfigParam``); a user's ``output_config`` (``--param
output_config='{"effort": "low"}'``) is merged with the adapter's key by key: only ``format`` is the
adapter's. Usage: ``input_tokens`` plus ``cache_read_input_tokens`` and
``cache_creation_input_tokens``, which Anthropic counts outside ``input_tokens``, as input (the
cache reads also as cached input, the writes as cache writes, 5-minute or 1-hour: ``usage_of``),
each at its price (``CACHE_PRICES`` unless the run file gives one), ``output_tokens``. Errors: 429
and 529 (overloaded) are retried, honouring ``retry-after``; a spend limit stops the provider
(``adapters.provider_errors``).

The version is not part of the cache key (``adapters.base.Request``): it changes which request
bodies the API accepts, not the meaning of one it accepts. Every body sent at 2026-10-21 is accepted
at 2023-06-01 too and answered in the same shapes (the SDK's ``Message``, ``Usage``, ``StopReason``,
stream events, batch results and error bodies are the same at both: the changes the guide lists are
requests it refuses), and the bodies only 2023-06-01 accepts (sampling parameters) are refused here
at 2026-10-21, so a cached row is only ever read by a run that sends the same request at a version
that serves it. Message Batches: each request of a batch is held to the version its create was sent
with.

Model strings: ``anthropic:claude-sonnet-5-5``, ``anthropic:NAME@https://proxy.example/anthropic``.
"""

from __future__ import annotations

from typing import Any

import orjson

from dxi.evals import Task

from . import budgets, llm
from .base import Limits, ModelSpec, Reply, Request
from .errors import ErrorIn200, MalformedReply
from .http import HTTPAdapter, as_count, load_reply, not_counts
from .provider_errors import body_error
from .streaming import MessagesAssembler, anthropic_sdk_refuses

TOOL = "answer"
API_VERSION = "2026-10-21"
LEGACY_VERSION = "2023-06-01"
API_VERSIONS = (API_VERSION, LEGACY_VERSION)
"""The ``anthropic-version`` values the adapter speaks: the default, then the deprecated one a user
may pin (``--option api_version=...``)."""
SAMPLING = ("temperature", "top_p", "top_k")
"""The Messages fields version 2026-10-21 refuses with HTTP 400 at any value ("temperature: Extra
inputs are not permitted")."""


STRUCTURED = ("output_config", "tool")
PAUSED = (
    "the provider paused the turn unfinished (stop_reason pause_turn: a long-running turn, to be sent "
    "back to continue): no final answer"
)


COUNTS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
"""The counts of a Messages reply's ``usage`` that price it."""


def usage_of(doc: dict) -> dict:
    """``input_tokens`` (cache reads and writes included: Anthropic counts them outside
    ``input_tokens``), ``cached_input_tokens`` (the cache reads, ``cache_read_input_tokens``),
    ``cache_write_tokens`` and ``cache_write_1h_tokens`` (the writes,
    ``cache_creation_input_tokens``, split by TTL as ``cache_creation.ephemeral_5m_input_tokens`` /
    ``ephemeral_1h_input_tokens`` say; without that split all are 5-minute writes, the default TTL),
    ``output_tokens`` and ``served_model`` of a Messages reply (the anthropic SDK's
    ``types/usage.py`` and ``cache_creation.py``), with ``usage_problem`` (``Reply``: a count
    stated that is not one, such as ``cache_read_input_tokens: -100000``, which is not read as 0;
    a cache count that is ``null``, ``Optional[int]`` in the SDK, states nothing: 0, as left out).
    Anthropic prices cache reads at 0.1x the input price, 5-minute writes at 1.25x and 1-hour writes
    at 2x (``CACHE_PRICES``)."""
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    fresh = as_count(usage.get("input_tokens"))
    read = as_count(usage.get("cache_read_input_tokens")) or 0
    written = as_count(usage.get("cache_creation_input_tokens")) or 0
    split = usage.get("cache_creation") if isinstance(usage.get("cache_creation"), dict) else {}
    hour = min(as_count(split.get("ephemeral_1h_input_tokens")) or 0, written)
    known = fresh is not None
    splits = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
    problems = not_counts(usage, COUNTS, "usage", COUNTS[2:]) + not_counts(
        split, splits, "usage.cache_creation", splits
    )
    return {
        "input_tokens": fresh + read + written if known else None,
        "cached_input_tokens": read if known else None,
        "cache_write_tokens": written - hour if known else None,
        "cache_write_1h_tokens": hour if known else None,
        "output_tokens": as_count(usage.get("output_tokens")),
        "served_model": doc.get("model") if isinstance(doc.get("model"), str) else None,
        "usage_problem": "; ".join(problems) or None,
    }


def thinking_tokens_of(doc: dict) -> int | None:
    """``usage.output_tokens_details.thinking_tokens`` of a Messages reply (the anthropic SDK's
    ``types/output_tokens_details.py``: the output tokens spent thinking, within ``output_tokens``,
    whether or not the thinking is returned); None if absent."""
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    details = usage.get("output_tokens_details")
    return as_count(details.get("thinking_tokens")) if isinstance(details, dict) else None


def decode_messages(
    task: Task, body: bytes, structured: str = "output_config", doc: Any = None
) -> Reply:
    """Parse a Messages reply to a structured-output request (``structured="output_config"``) or a
    forced-tool one (``"tool"``); see the module docstring. ``doc``: ``body`` parsed already
    (``Adapter.decode_parsed``), else None."""
    doc = load_reply(body) if doc is None else doc
    if (error := body_error(doc)) is not None:
        usage = Reply((), **usage_of(doc)) if isinstance(doc.get("usage"), dict) else None
        raise ErrorIn200(error, usage)  # billed: the usage it states (runner.sending.cost)
    if not isinstance(doc, dict) or not isinstance(doc.get("content"), list):
        raise MalformedReply("reply has no 'content' list", body[:2000].decode("utf-8", "replace"))
    meta = usage_of(doc)
    blocks = [b for b in doc["content"] if isinstance(b, dict)]
    stop = doc.get("stop_reason")
    text = "".join(
        b.get("text", "")
        for b in blocks
        if b.get("type") == "text" and isinstance(b.get("text"), str)
    )
    thinking = any(b.get("type") in ("thinking", "redacted_thinking") for b in blocks) or bool(
        thinking_tokens_of(doc)
    )  # thinking counted, though none returned
    if stop == "refusal":
        return llm.invalid_reply(task, "refusal (stop_reason refusal)", **meta)
    if stop == "pause_turn":  # the anthropic SDK's Message.stop_reason: unfinished, never final
        return llm.invalid_reply(task, PAUSED, **meta)
    if stop in ("max_tokens", "model_context_window_exceeded"):
        began = bool(text.strip()) or any(b.get("type") == "tool_use" for b in blocks)
        reason, cut_off = llm.truncated(f"stop_reason {stop}", "max_tokens", began, thinking)
        return llm.invalid_reply(task, reason, cut_off=cut_off, **meta)
    if structured == "output_config":
        return llm.decode_text(task, text, reasoning=thinking, **meta)
    tool = next((b for b in blocks if b.get("type") == "tool_use" and b.get("name") == TOOL), None)
    if tool is not None:
        return Reply(llm.answers_from_object(task, tool.get("input")), **meta)
    if text.strip():
        return llm.invalid_reply(task, f"no '{TOOL}' tool call: the model replied in text", **meta)
    return llm.invalid_reply(task, llm.REASONING_ONLY if thinking else llm.EMPTY, **meta)


class Anthropic(HTTPAdapter):
    """The Anthropic Messages API with the answer schema as ``output_config.format`` (structured
    outputs), or, with the option ``structured=tool``, as a forced tool's ``input_schema`` (older
    models)."""

    kind = "anthropic"
    default_base_url = "https://api.anthropic.com"
    path = "/v1/messages"
    api_key_env = "ANTHROPIC_API_KEY"
    OPTIONS = frozenset({"api_key_env", "api_key_command", "structured", "api_version"})
    RESERVED = frozenset({"model", "system", "messages", "tools", "tool_choice", "stream"})
    EFFORT_FIELD = "output_config.effort"
    EFFORT_LEVELS = (
        "low",
        "medium",
        "high",
        "xhigh",
        "max",
    )  # OutputConfigParam.effort (anthropic 2.15.0)
    # Anthropic adds a system prompt to every request with tools or a structured output, billed as
    # input; the largest its pricing page lists is 530 tokens (Claude 3 Opus, tool_choice auto;
    # 313-340 for a forced tool): 600 bounds it.
    HIDDEN_INPUT_TOKENS = 600
    # Anthropic's pricing, the same for every model (its prompt-caching docs): cache reads cost 0.1x
    # the input price, writes to the 5-minute cache 1.25x and to the 1-hour cache 2x
    CACHE_PRICES = {"cached_input": 0.1, "cache_write": 1.25, "cache_write_1h": 2.0}

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        super().__init__(spec, limits)
        self.structured = str(spec.options.get("structured") or STRUCTURED[0])
        if self.structured not in STRUCTURED:
            raise ValueError(
                f"anthropic: the option structured is one of {', '.join(STRUCTURED)} "
                f"(tool: a forced tool, for older models), not {self.structured!r}"
            )
        self.api_version = str(spec.options.get("api_version") or API_VERSION)
        if self.api_version not in API_VERSIONS:
            raise ValueError(
                f"anthropic: the option api_version is one of {', '.join(API_VERSIONS)} "
                f"(the anthropic-version header), not {self.api_version!r}"
            )
        refused = [k for k in SAMPLING if k in self.params]
        if refused and self.api_version == API_VERSION:
            raise ValueError(
                f"anthropic: API version {API_VERSION} refuses {', '.join(refused)} (HTTP 400, even "
                "at the default value): leave it out, or pin the deprecated version with --option "
                f"api_version={LEGACY_VERSION} (a run file: options = "
                f'{{api_version = "{LEGACY_VERSION}"}})'
            )

    def default_params(self, model: str, params: dict) -> dict:
        """``max_tokens`` leaving room for the model's thinking at its effort
        (``adapters.budgets``)."""
        config = params.get("output_config")
        if "output_config" in params and not isinstance(config, dict):
            raise ValueError(f"anthropic: output_config must be an object, not {config!r}")
        if isinstance(config, dict) and "format" in config:
            raise ValueError(
                "anthropic: output_config.format is set by the adapter itself (the answer schema); "
                "the other keys of output_config (effort, ...) are merged with it"
            )
        return {"max_tokens": budgets.anthropic_max_tokens(model, params)}

    @classmethod
    def effort_hint(cls, effort: str) -> str:
        return (
            '; to turn thinking off where the model allows it, give --param thinking=\'{"type": "disabled"}\''
            if effort in ("none", "minimal")
            else ""
        )

    @classmethod
    def _with_effort(cls, params: dict, effort: str) -> dict:
        config = (
            params.get("output_config") if isinstance(params.get("output_config"), dict) else {}
        )
        given = config.get("effort")
        if given is not None and given != effort:
            raise ValueError(
                f"--effort {effort} and the parameter output_config.effort={given} disagree: give one"
            )
        return params | {"output_config": {**config, "effort": effort}}

    @classmethod
    def effort_of(cls, params: dict) -> str | None:
        config = params.get("output_config")
        value = config.get("effort") if isinstance(config, dict) else None
        return value if isinstance(value, str) else None

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    def extra_headers(self) -> dict[str, str]:
        return {"anthropic-version": self.api_version}

    def encode(self, task: Task, sample: int = 0) -> Request:
        config = self.params.get("output_config") or {}
        payload = {
            "model": self.model,
            **{k: v for k, v in self.params.items() if k != "output_config"},
            "system": llm.SYSTEM_PROMPT,
            "messages": [{"role": "user", "content": llm.render(task)}],
        }
        if self.structured == "tool":
            payload |= {
                "tools": [
                    {
                        "name": TOOL,
                        "description": "Record the answer picked for every question.",
                        "input_schema": llm.answer_schema(task),
                    }
                ],
                "tool_choice": {"type": "tool", "name": TOOL},
            }
            if config:
                payload["output_config"] = config
        else:
            # the user's output_config (effort, ...) merged with ours: only format is the adapter's
            payload["output_config"] = {
                **config,
                "format": {"type": "json_schema", "schema": llm.answer_schema(task)},
            }
        return self.request(payload, sample)

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_messages(task, body, self.structured)

    def decode_parsed(self, task: Task, body: bytes, doc: Any) -> Reply:
        return decode_messages(task, body, self.structured, doc)

    def assembler(self) -> MessagesAssembler:
        return MessagesAssembler()

    def stream_body(self, body: bytes) -> bytes:
        """The body with ``"stream": true``."""
        return orjson.dumps(orjson.loads(body) | {"stream": True})

    def long_reply(self, request: Request) -> bool:
        """The model thinks (``thinking`` enabled or adaptive; without it, a model that thinks by
        default, ``adapters.budgets``), or the anthropic SDK refuses the request unstreamed
        (``adapters.streaming.anthropic_sdk_refuses``: ``max_tokens`` above 21,333, or the model's
        own limit)."""
        given = self.params.get("thinking")
        kind = given.get("type") if isinstance(given, dict) else None
        thinks = kind in ("enabled", "adaptive") or (
            kind is None and budgets.anthropic_thinks_by_default(self.model)
        )
        cap = llm.token_cap(self.params, "max_tokens")
        return thinks or (cap is not None and anthropic_sdk_refuses(self.model, cap))

    def output_tokens_bound(self, task: Task) -> int | None:
        """``max_tokens`` (its default leaves room for thinking, ``adapters.budgets``; thinking
        counts within it)."""
        return llm.token_cap(self.params, "max_tokens")

    def cost_bound_problem(self) -> str | None:
        """A ``max_tokens`` below 1 (``llm.cost_bound_problem``; Messages has no number of
        replies)."""
        return llm.cost_bound_problem(self.params, ("max_tokens",))
