"""Pure fake responders for the language-model and OpenAI Decisions wire formats, as the providers
document them: each takes the parsed request JSON (and a ``mode``) and returns the response JSON. No
I/O here, so a test server (``tests/fakes/fake_llm_server.py``) or a fault-injecting provider can
serve them as they are.

The fake model's policy is fixed: every question gets its *last* allowed answer (the last option, or
"no"), so tests know the expected answers. Usage is deterministic: ``prompt_tokens(request)`` is the
number of whitespace-separated words in the request's text fields; the output counts
``OUTPUT_TOKENS_PER_QUESTION`` per question (``1`` per question for logprob requests).

Formats and their modes (``"ok"`` everywhere):

* ``openai_chat`` — Chat Completions, structured (``response_format`` json_schema) or logprob
  requests (``logprobs: true``): ``fenced``, ``prose``, ``truncated`` (finish_reason length, JSON
  cut off), ``truncated_empty`` (finish_reason length before any content: the limit spent on
  reasoning), ``refusal`` (``message.refusal``), ``empty``, ``reasoning`` (content only in
  ``reasoning_content``), ``missing`` (first question left out), ``outside`` (a value outside the
  enum), ``content_filter``, ``cached`` (half the prompt read from the cache,
  ``prompt_tokens_details.cached_tokens``, a quarter written to it, ``cache_write_tokens``); for
  logprob requests ``no_logprobs`` and ``off_answers`` (no allowed answer among the top tokens);
* ``anthropic_messages`` — Messages with a structured output (a text block) or a forced tool:
  ``fenced``, ``prose``, ``empty`` (structured output), ``refusal`` (stop_reason refusal),
  ``truncated`` (stop_reason max_tokens), ``truncated_empty`` (stop_reason max_tokens with a
  thinking block only), ``text`` (prose, no tool call), ``thinking`` (thinking block only),
  ``missing``, ``outside``, ``cached`` (100 cache-read and 20 cache-write input tokens: 15 to the
  5-minute cache, 5 to the 1-hour one);
* ``gemini_generate`` — generateContent: ``fenced``, ``prose``, ``truncated`` (MAX_TOKENS),
  ``truncated_empty`` (MAX_TOKENS with thought parts only), ``safety`` (finishReason SAFETY),
  ``blocked`` (promptFeedback.blockReason), ``thought`` (thought parts only), ``missing``,
  ``outside``, ``cached`` (half the prompt cached: ``cachedContentTokenCount``);
* ``openai_decisions`` — ``/v1/decisions``: ``refusal`` (the first question refused), ``bad_sum``
  (probabilities that do not sum to 1);
* ``gemini_decisions`` — ``/v1beta/decisions`` (the Gemini Decisions API,
  ``google.genai.decisions``): ``blocked`` (``prompt_feedback.block_reason``, no answers),
  ``bad_sum``, ``missing``, ``sure`` (every yes/no answer as sure as the model can be: P(true) 1.0
  before the documented clamp to [0.01, 0.99], so 0.99).

Today's models, as their providers document them (``Refused`` is raised for a request the provider
refuses: the servers answer it with its status and error body):

* OpenAI (``OPENAI_REASONING``): a reasoning model refuses ``max_tokens`` ("use
  max_completion_tokens") and ``logprobs`` unless ``reasoning_effort`` is "none", refuses "none"
  where it has no such level, and spends ``REASONING_TOKENS[effort]`` completion tokens reasoning
  before the answer (``reasoning_tokens``): a ``max_completion_tokens`` below that is cut off while
  reasoning (finish_reason length, no content). A model in ``OPENAI_UNKNOWN`` is answered 404
  ``model_not_found``; ``invalid_schema`` (a mode) is OpenAI's invalid-schema 400.
* Anthropic (``CLAUDE_THINKING``: model -> its default effort): the current models think by default
  and their thinking (``THINKING_TOKENS[effort]``) counts within ``max_tokens``: a ``max_tokens``
  below it is cut off while thinking (stop_reason max_tokens, a thinking block only); Opus 5.5 and
  Fable 5.1 refuse ``thinking`` disabled.
* Gemini: a retired model is answered by its replacement (``GEMINI_REROUTED``, reported in
  ``modelVersion``); a ``thinkingLevel`` makes it think (``THINKING_TOKENS``), cut off while
  thinking below ``maxOutputTokens``.

``error_body(fmt, status)`` is each format's error JSON (Gemini's 429 carries a ``RetryInfo``
delay).
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

OUTPUT_TOKENS_PER_QUESTION = 5
P_LAST = 0.6  # decision formats and logprobs: the probability of the last allowed answer


class Refused(Exception):
    """A request the provider refuses: the servers answer it with ``status`` and the error
    ``body``."""

    def __init__(self, status: int, body: dict):
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


# reasoning (thinking) tokens spent before the answer, per effort level: the fakes' own figures
REASONING_TOKENS = {
    "none": 0,
    "minimal": 200,
    "low": 1_500,
    "medium": 3_000,
    "high": 6_000,
    "xhigh": 20_000,
    "max": 40_000,
}
THINKING_TOKENS = REASONING_TOKENS
# OpenAI's reasoning models: model -> (default effort, the levels it takes); OpenAI's docs:
# gpt-6-luna reasons by default and takes none..max; gpt-5-mini (before 5.1) has no "none"
OPENAI_REASONING = {
    "gpt-6-luna": ("medium", ("none", "low", "medium", "high", "xhigh", "max")),
    "gpt-6.1-terra": ("medium", ("none", "low", "medium", "high", "xhigh", "max")),
    "gpt-5-mini": ("medium", ("minimal", "low", "medium", "high")),
}
OPENAI_UNKNOWN = frozenset({"gpt-4-retired"})
# Anthropic's thinking models: model -> default effort (effort docs: Opus 5.5 and Haiku 5.5 default
# to medium, the rest to high); those in CLAUDE_ALWAYS_THINKS cannot turn thinking off
CLAUDE_THINKING = {
    "claude-opus-5-5": "medium",
    "claude-sonnet-5-5": "high",
    "claude-haiku-5-5": "medium",
    "claude-fable-5-1": "high",
    "claude-mythos-5-1": "high",
}
CLAUDE_ALWAYS_THINKS = frozenset({"claude-opus-5-5", "claude-fable-5-1"})
# Google's deprecations page: from 2026-12-01 requests to gemini-2.5-flash are routed to
# gemini-3.5-flash-lite, to gemini-2.5-pro to gemini-3.8-flash
GEMINI_REROUTED = {
    "gemini-2.5-flash": "gemini-3.5-flash-lite",
    "gemini-2.5-pro": "gemini-3.8-flash",
}


def _openai_refusal(
    message: str, param: str | None, code: str | None, status: int = 400
) -> Refused:
    return Refused(
        status,
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": code,
            }
        },
    )


def _words(*texts: str) -> int:
    return sum(len(t.split()) for t in texts)


def prompt_tokens(request: dict) -> int:
    """Words in the request's texts: chat messages, Anthropic system + messages, Gemini parts,
    Decisions input."""
    texts: list[str] = []
    for m in request.get("messages", []):
        texts.append(m["content"] if isinstance(m["content"], str) else "")
    if isinstance(request.get("system"), str):
        texts.append(request["system"])
    for block in [request.get("systemInstruction", {}), *request.get("contents", [])]:
        texts += [p.get("text", "") for p in block.get("parts", [])]
    if isinstance(request.get("input"), str):
        texts.append(request["input"])
    return _words(*texts)


def _answers(allowed: dict[str, list[str]], mode: str) -> dict[str, str]:
    """The fake model's answers: the last allowed value of each question, bent by ``mode``."""
    out = {qid: values[-1] for qid, values in allowed.items()}
    if mode == "missing":
        out.pop(next(iter(out)))
    elif mode == "outside":
        out[next(iter(out))] = "Z9"
    return out


def _allowed(schema: dict) -> dict[str, list[str]]:
    return {qid: prop["enum"] for qid, prop in schema["properties"].items()}


def _text(answers: dict[str, str], mode: str) -> str:
    body = orjson.dumps(answers).decode()
    if mode == "fenced":
        return f"```json\n{body}\n```"
    if mode == "prose":
        return f"Sure! Here is my answer: {body} Hope that helps."
    if mode == "truncated":
        return body[: len(body) // 2]
    return body


# ---- OpenAI Chat Completions ---------------------------------------------------------------------
_QUESTION = re.compile(r'^Question "([^"]+)":', re.MULTILINE)
_ALLOWED = re.compile(r"^Allowed answers: (.*)$", re.MULTILINE)


def _logprob_choice(request: dict, mode: str) -> dict:
    text = request["messages"][-1]["content"]
    allowed = _ALLOWED.findall(text)[-1].split(", ")
    # the last allowed answer P_LAST, the first the rest split with a non-answer token; variants
    # merge
    top = [(allowed[-1], P_LAST), ("The", 0.1), (" " + allowed[0], 0.3)]
    if mode == "off_answers":
        top = [("The", 0.7), ("Answer", 0.3)]
    tokens = [{"token": t, "logprob": math.log(p), "bytes": list(t.encode())} for t, p in top]
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": top[0][0], "refusal": None},
        "logprobs": {"content": [{**tokens[0], "top_logprobs": tokens}], "refusal": None},
        "finish_reason": "length",
    }
    if mode == "no_logprobs":
        choice["logprobs"] = None
    return choice


INVALID_SCHEMA = (
    "Invalid schema for response_format 'answers': In context=(), 'additionalProperties' is required to "
    "be supplied and to be false."
)


def _openai_reasoning(request: dict) -> int:
    """The reasoning tokens a request spends (0 for a model that does not reason); raises Refused
    for what the model refuses (see the module docstring)."""
    model = request["model"]
    if model in OPENAI_UNKNOWN:
        raise _openai_refusal(
            f"The model `{model}` does not exist or you do not have access to it.",
            None,
            "model_not_found",
            404,
        )
    if model not in OPENAI_REASONING:
        return 0
    default, levels = OPENAI_REASONING[model]
    effort = request.get("reasoning_effort", default)
    if effort not in levels:
        raise _openai_refusal(
            f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model. "
            f"Supported values are: {', '.join(repr(v) for v in levels)}.",
            "reasoning_effort",
            "unsupported_value",
        )
    if "max_tokens" in request:
        raise _openai_refusal(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            "max_tokens",
            "unsupported_parameter",
        )
    if (request.get("logprobs") or "top_logprobs" in request) and effort != "none":
        raise _openai_refusal(
            f"logprobs are not supported with reasoning_effort '{effort}' on this model; set "
            "reasoning_effort to 'none' to use logprobs.",
            "logprobs",
            "unsupported_parameter",
        )
    return REASONING_TOKENS[effort]


def openai_chat(request: dict, mode: str = "ok") -> dict:
    """A Chat Completions response (``chat.completion`` object) to a structured or a logprob
    request."""
    if mode == "invalid_schema":
        raise _openai_refusal(INVALID_SCHEMA, "response_format", None)
    reasoning = _openai_reasoning(request)
    cap = request.get("max_completion_tokens", request.get("max_tokens"))
    if request.get("logprobs"):
        choice, n_out = _logprob_choice(request, mode), 1
    elif reasoning and cap is not None and cap < reasoning + OUTPUT_TOKENS_PER_QUESTION:
        # the cap spent reasoning before any answer: cut off, no content (OpenAI's reasoning guide)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "", "refusal": None},
            "logprobs": None,
            "finish_reason": "length",
        }
        reasoning, n_out = cap, 0
    else:
        answers = _answers(_allowed(request["response_format"]["json_schema"]["schema"]), mode)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": _text(answers, mode),
            "refusal": None,
        }
        finish = {
            "truncated": "length",
            "truncated_empty": "length",
            "content_filter": "content_filter",
        }.get(mode, "stop")
        if mode == "refusal":
            message |= {"content": None, "refusal": "I'm sorry, I cannot help with that request."}
        elif mode == "empty":
            message["content"] = ""
        elif mode in (
            "reasoning",
            "truncated_empty",
        ):  # (OpenAI's reasoning models: content "" at the limit)
            message |= {
                "content": "" if mode == "truncated_empty" else None,
                "reasoning_content": "Let me think about the options first...",
            }
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        n_out = OUTPUT_TOKENS_PER_QUESTION * len(answers or [0])
    n_in = prompt_tokens(request)
    n_out += reasoning
    usage: dict[str, Any] = {
        "prompt_tokens": n_in,
        "completion_tokens": n_out,
        "total_tokens": n_in + n_out,
    }
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    if (
        mode == "cached"
    ):  # half the prompt read from OpenAI's prompt cache, a quarter written to it (within prompt_tokens)
        usage["prompt_tokens_details"] = {
            "cached_tokens": n_in // 2,
            "cache_write_tokens": n_in // 4,
            "audio_tokens": 0,
        }
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": request["model"],
        "choices": [choice],
        "usage": usage,
    }


# ---- Anthropic Messages --------------------------------------------------------------------------
def _claude_thinking(request: dict) -> int:
    """The thinking tokens a Messages request spends (``CLAUDE_THINKING``: the model's default, or
    ``thinking`` adaptive; at ``output_config.effort``, else the model's default effort); raises
    Refused for ``thinking`` disabled on a model that always thinks."""
    model = request["model"]
    kind = (request.get("thinking") or {}).get("type")
    if kind == "disabled" and model in CLAUDE_ALWAYS_THINKS:
        raise Refused(
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": f"thinking cannot be disabled on {model}",
                },
            },
        )
    if kind == "disabled" or (model not in CLAUDE_THINKING and kind != "adaptive"):
        return 0
    effort = (request.get("output_config") or {}).get("effort") or CLAUDE_THINKING.get(
        model, "high"
    )
    return THINKING_TOKENS[effort]


def anthropic_messages(request: dict, mode: str = "ok") -> dict:
    """A Messages response to a structured-output request (``output_config.format`` json_schema: the
    answer as a text block) or to one whose ``tool_choice`` forces the answer tool (the answer as
    ``tool_use``). A thinking model thinks first, within ``max_tokens`` (see the module
    docstring)."""
    thinking = _claude_thinking(request)
    if (
        thinking and request["max_tokens"] < thinking + OUTPUT_TOKENS_PER_QUESTION
    ):  # cut off while thinking
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": request["model"],
            "content": [
                {
                    "type": "thinking",
                    "thinking": "Weighing each option in turn...",
                    "signature": "sig",
                }
            ],
            "stop_reason": "max_tokens",
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt_tokens(request),
                "output_tokens": request["max_tokens"],
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
    forced = "tools" in request
    schema = (
        request["tools"][0]["input_schema"]
        if forced
        else request["output_config"]["format"]["schema"]
    )
    answers = _answers(_allowed(schema), mode)
    if forced:
        content: list[dict] = [
            {
                "type": "tool_use",
                "id": "toolu_fake",
                "name": request["tools"][0]["name"],
                "input": answers,
            }
        ]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": _text(answers, mode)}], "end_turn"
    if mode == "refusal":
        content, stop = [], "refusal"
    elif mode == "truncated":
        stop = "max_tokens"
        if forced:
            content[0]["input"] = {}
    elif mode == "text":
        content, stop = (
            [{"type": "text", "text": f"The answers are {orjson.dumps(answers).decode()}"}],
            "end_turn",
        )
    elif mode in ("thinking", "truncated_empty"):
        content = [{"type": "thinking", "thinking": "Considering...", "signature": "sig"}]
        stop = "max_tokens" if mode == "truncated_empty" else "end_turn"
    elif mode == "empty":
        content = [{"type": "text", "text": ""}]
    if thinking:
        content = [
            {"type": "thinking", "thinking": "Weighing each option in turn...", "signature": "sig"},
            *content,
        ]
    n_in = prompt_tokens(request)
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": n_in,
            "output_tokens": OUTPUT_TOKENS_PER_QUESTION * len(answers or [0]) + thinking,
            # mode cached: 100 tokens read from the prompt cache, 20 written to it (outside
            # input_tokens): 15 to the 5-minute cache, 5 to the 1-hour one
            "cache_creation_input_tokens": 20 if mode == "cached" else 0,
            "cache_read_input_tokens": 100 if mode == "cached" else 0,
        }
        | (
            {"cache_creation": {"ephemeral_5m_input_tokens": 15, "ephemeral_1h_input_tokens": 5}}
            if mode == "cached"
            else {}
        ),
    }


# ---- Gemini generateContent ----------------------------------------------------------------------
def gemini_generate(request: dict, mode: str = "ok", model: str = "gemini-fake") -> dict:
    """A GenerateContentResponse to a request with ``responseMimeType`` application/json and a
    schema, from ``model`` (a retired one's requests answered by its replacement:
    ``GEMINI_REROUTED``)."""
    model = GEMINI_REROUTED.get(model, model)
    config = request["generationConfig"]
    answers = _answers(_allowed(config["responseJsonSchema"]), mode)
    n_in, n_out = prompt_tokens(request), OUTPUT_TOKENS_PER_QUESTION * len(answers or [0])
    usage = {
        "promptTokenCount": n_in,
        "candidatesTokenCount": n_out,
        "totalTokenCount": n_in + n_out,
    }
    level = (config.get("thinkingConfig") or {}).get("thinkingLevel")
    thoughts = THINKING_TOKENS[level.lower()] if isinstance(level, str) else 0
    cap = config.get("maxOutputTokens")
    if thoughts and cap is not None and cap < thoughts + n_out:  # cut off while thinking
        return {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [{"text": "Weighing the options.", "thought": True}],
                    },
                    "finishReason": "MAX_TOKENS",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": n_in,
                "thoughtsTokenCount": cap,
                "totalTokenCount": n_in + cap,
            },
            "modelVersion": model,
        }
    if thoughts:
        usage |= {"thoughtsTokenCount": thoughts, "totalTokenCount": n_in + n_out + thoughts}
    if mode == "blocked":
        return {
            "promptFeedback": {"blockReason": "SAFETY"},
            "usageMetadata": {"promptTokenCount": n_in},
            "modelVersion": model,
        }
    parts: list[dict] = [{"text": _text(answers, mode)}]
    finish = {"truncated": "MAX_TOKENS", "truncated_empty": "MAX_TOKENS", "safety": "SAFETY"}.get(
        mode, "STOP"
    )
    if mode == "safety":
        parts = []
    elif mode in ("thought", "truncated_empty"):
        parts = [{"text": "Weighing the options first.", "thought": True}]
        usage["thoughtsTokenCount"] = 7
    elif (
        mode == "cached"
    ):  # half the prompt read from the (implicit) context cache, within promptTokenCount
        usage["cachedContentTokenCount"] = n_in // 2
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}
        ],
        "usageMetadata": usage,
        "modelVersion": model,
    }


# ---- OpenAI Decisions ----------------------------------------------------------------------------
def openai_decisions(request: dict, mode: str = "ok") -> dict:
    """A ``/v1/decisions`` response: answers in question order (PROTOCOLS.md §B)."""
    answers = []
    for q in request["questions"]:
        if q["type"] == "choice":
            values = [c["value"] for c in q["choices"]]
            rest = round((1 - P_LAST) / (len(values) - 1), 4)
            probs = [
                {"value": v, "probability": P_LAST if v == values[-1] else rest} for v in values
            ]
            if mode == "bad_sum":
                probs[0]["probability"] = 0.5
            n = len(values)
            answers.append(
                {
                    "type": "choice",
                    "name": q.get("name"),
                    "choice": values[-1],
                    "probabilities": probs,
                    "confidence": round((n * P_LAST - 1) / (n - 1), 4),
                }
            )
        else:
            answers.append({"type": "predicate", "name": q.get("name"), "probability": 1 - P_LAST})
    if mode == "refusal":
        answers[0] = {"type": "refusal", "name": answers[0]["name"]}
    n_in = prompt_tokens(request)
    return {
        "model": request["model"],
        "answers": answers,
        "usage": {
            "input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_in,
        },
    }


# ---- Gemini Decisions ----------------------------------------------------------------------------
def gemini_decisions(request: dict, mode: str = "ok") -> dict:
    """A CreateDecisionResponse (``google.genai.decisions``): answers keyed by question id; a choice
    puts ``P_LAST`` on its last option (the rest spread, rounded to 4 decimals), a yes/no question
    P(true) 1 - P_LAST, clamped to [0.01, 0.99] as documented (mode ``sure``: 1.0 before the clamp).
    Usage: the input's words, 0 output tokens."""
    n_in = prompt_tokens(request)
    usage = {"total_input_tokens": n_in, "total_output_tokens": 0, "total_tokens": n_in}
    if mode == "blocked":
        return {
            "prompt_feedback": {
                "block_reason": "safety",
                "block_reason_message": "The input was blocked.",
            },
            "usage": usage,
        }
    answers: dict[str, dict] = {}
    for qid, q in request["questions"].items():
        if q["type"] == "choice":
            options = list(q["criteria"])
            rest = round((1 - P_LAST) / (len(options) - 1), 4)
            probs = {o: P_LAST if o == options[-1] else rest for o in options}
            if mode == "bad_sum":
                probs[options[0]] = 0.5
            answers[qid] = {
                "type": "choice",
                "choice": options[-1],
                "probabilities": probs,
                "confidence": P_LAST,
            }
        else:
            p = min(0.99, max(0.01, 1.0 if mode == "sure" else round(1 - P_LAST, 4)))
            answers[qid] = {"type": "noul", "noul": p, "confidence": max(p, round(1 - p, 4))}
    if mode == "missing":
        answers.pop(next(iter(answers)))
    return {"answers": answers, "usage": usage}


# ---- errors --------------------------------------------------------------------------------------
_OPENAI_ERRORS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}
_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


GOOGLE = ("gemini", "gemini-decisions")  # the formats that answer with Google's error bodies


def error_body(
    fmt: str, status: int, retry_delay_s: float | None = None, message: str | None = None
) -> dict:
    """The error JSON of format ``fmt`` ("openai", "anthropic", "gemini"; any other: OpenAI's, which
    proxies forward) for an HTTP ``status``, saying ``message`` (default "injected STATUS");
    Gemini's 429 carries ``retry_delay_s`` as a ``google.rpc.RetryInfo`` detail when given."""
    message = message or f"injected {status}"
    if fmt == "anthropic":
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_ERRORS.get(status, "api_error"), "message": message},
        }
    if fmt in GOOGLE:
        details = (
            [
                {
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": f"{retry_delay_s:g}s",
                }
            ]
            if retry_delay_s is not None
            else []
        )
        return {
            "error": {
                "code": status,
                "message": message,
                "status": _GOOGLE_STATUS.get(status, "UNKNOWN"),
                "details": details,
            }
        }
    return {
        "error": {
            "message": message,
            "type": _OPENAI_ERRORS.get(status, "server_error"),
            "param": None,
            "code": "invalid_api_key" if status == 401 else None,
        }
    }


RESPONDERS = {
    "openai": openai_chat,
    "anthropic": anthropic_messages,
    "gemini": gemini_generate,
    "openai-decisions": openai_decisions,
    "gemini-decisions": gemini_decisions,
}


# ---- the providers' hostile replies (served by tests/fakes/fake_provider.py per format) ----------
def quota_body(fmt: str) -> dict:
    """The error body of an exhausted quota, as each provider documents it
    (``adapters.provider_errors``): OpenAI ``insufficient_quota`` (also what LiteLLM and other
    proxies forward: ``systemone``, ``openai-decisions``), Anthropic
    ``enforced_spend_limit_reached``, Gemini's per-day ``QuotaFailure`` with a ``RetryInfo`` of 12
    hours."""
    if fmt == "anthropic":
        return {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "Your organization has reached its monthly usage limit.",
                "details": {"error_code": "enforced_spend_limit_reached"},
            },
            "request_id": "req_fake",
        }
    if fmt in GOOGLE:
        return {
            "error": {
                "code": 429,
                "status": "RESOURCE_EXHAUSTED",
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [
                            {
                                "quotaMetric": "generativelanguage.googleapis.com/generate_requests_per_model_per_day",
                                "quotaId": "GenerateRequestsPerDayPerProjectPerModel",
                            }
                        ],
                    },
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "43200s"},
                ],
            }
        }
    return {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }


def error_in_200(fmt: str, reply: dict) -> dict:
    """A 200 reply that carries an error instead of an answer: OpenRouter's mid-generation error (a
    choice with ``finish_reason: "error"`` and an ``error`` object) for Chat Completions, an
    ``error`` event for Anthropic, an ``error`` body for the others."""
    if fmt == "openai":
        choice = {
            **reply["choices"][0],
            "finish_reason": "error",
            "message": {"role": "assistant", "content": "", "refusal": None},
            "error": {"code": 502, "message": "Upstream provider returned an error"},
        }
        return {**reply, "choices": [choice]}
    if fmt == "anthropic":
        return {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    if fmt in GOOGLE:
        return {
            "error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}
        }
    return {"error": {"code": 502, "message": "Upstream provider returned an error"}}


def _first_key_twice(obj: dict) -> str:
    """``obj`` as JSON text with its first key written twice (the same value): a duplicate key."""
    first, value = next(iter(obj.items()))
    return (
        "{"
        + orjson.dumps(first).decode()
        + ":"
        + orjson.dumps(value).decode()
        + ","
        + orjson.dumps(obj).decode()[1:]
    )


def duplicate_key(fmt: str, reply: dict) -> bytes:
    """The reply with its first answer named twice: a language model's JSON object, System One (and
    Gemini Decisions) ``answers``, an OpenAI Decisions ``probabilities`` list naming its first
    option twice."""
    if fmt == "openai":
        message = reply["choices"][0]["message"]
        message["content"] = _first_key_twice(orjson.loads(message["content"]))
    elif fmt == "anthropic":
        reply["content"][0]["text"] = _first_key_twice(orjson.loads(reply["content"][0]["text"]))
    elif fmt == "gemini":
        part = reply["candidates"][0]["content"]["parts"][0]
        part["text"] = _first_key_twice(orjson.loads(part["text"]))
    elif fmt == "openai-decisions":
        probs = next(a["probabilities"] for a in reply["answers"] if a["type"] == "choice")
        probs.append(dict(probs[0]))
    else:  # systemone: the answers object's first key twice
        answers = _first_key_twice(reply.pop("answers"))
        return orjson.dumps(reply)[:-1] + b',"answers":' + answers.encode() + b"}"
    return orjson.dumps(reply)


def with_nan(fmt: str, reply: dict) -> bytes:
    """A decision reply with ``NaN`` for the first probability of the first choice question
    (``Infinity`` for a yes/no one): not JSON, but what some servers write."""
    marker = "__not_a_number__"
    keyed = fmt in ("systemone", "gemini-decisions")  # answers keyed by question id
    for answer in reply["answers"].values() if keyed else reply["answers"]:
        if answer["type"] == "choice":
            probs = answer["probabilities"]
            if isinstance(probs, dict):
                probs[next(iter(probs))] = marker
            else:
                probs[0]["probability"] = marker
            break
    else:
        answer = next(iter(reply["answers"].values())) if keyed else reply["answers"][0]
        answer["noul" if keyed else "probability"] = marker
        return orjson.dumps(reply).replace(f'"{marker}"'.encode(), b"Infinity")
    return orjson.dumps(reply).replace(f'"{marker}"'.encode(), b"NaN")


def unsupported_body(fmt: str) -> dict:
    """A 400 refusing the form of the request (a schema feature or parameter the model does not
    support)."""
    if fmt == "anthropic":
        return {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "tool_choice of type 'tool' is not supported with this model",
            },
        }
    if fmt in GOOGLE:
        return {
            "error": {
                "code": 400,
                "status": "INVALID_ARGUMENT",
                "message": "Invalid JSON payload received. "
                "Unknown name \"responseJsonSchema\" at 'generation_config': Cannot find field.",
            }
        }
    return {
        "error": {
            "message": "Unsupported parameter: 'response_format' is not supported with this model.",
            "type": "invalid_request_error",
            "param": "response_format",
            "code": "unsupported_parameter",
        }
    }
