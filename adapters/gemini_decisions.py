"""Decision models over the Gemini Decisions API (launched 2026-11-11, model ``gemini-decision-1``):
``POST {base_url}/v1beta/decisions`` (PROTOCOLS.md §B2).

Default base URL https://generativelanguage.googleapis.com, key in ``x-goog-api-key`` from
``GOOGLE_API_KEY`` or ``GEMINI_API_KEY`` (the first, as the google-genai SDK, when both are set; not
needed for a loopback base URL). Types: google-genai 3.6.1, ``google.genai.decisions``
(``CreateDecisionRequest``, ``CreateDecisionResponse``). Request::

    {"model": "models/<model>", "input": <the task's state>, "questions": {
        <question id>: {"type": "choice", "instructions": <question text>,
                        "criteria": {<option id>: <option text>, ...}}       # in option order, 2-255 options
      | <question id>: {"type": "noul", "instructions": <question text>}}}  # yes/no

(the questions map of System One, ``adapters.systemone.encode_questions``). No sampling parameters:
the model is calibrated as served, and its output is always 0 tokens.

Reply: ``{"answers": {id: answer}, "prompt_feedback"?: {"block_reason", "block_reason_message"},
"usage"?}``. A choice answer ``{"type": "choice", "choice", "probabilities": {option: p},
"confidence"}`` and a yes/no one ``{"type": "noul", "noul": P(true), "confidence"}`` are validated
by ``adapters.decision`` (through ``adapters.systemone.decode_answers``): a question missing,
answered twice or with another type is invalid with the reason. ``noul`` is **clamped** by the
provider to [0.01, 0.99] ("Calibrated probability P(true) in [0.01, 0.99]": ``NoulAnswer``), so this
model's yes/no probabilities never reach 0 or 1 (``P_YES_RANGE``; the calibration pages say so).
``prompt_feedback.block_reason`` set (the input was blocked; no answers come) makes every answer
invalid with the reason and its message. Usage: ``total_input_tokens`` (``total_cached_tokens`` of
them cached), ``total_output_tokens`` + ``total_thought_tokens`` as output (0 for this model). The
reply names no model. Errors and quota signals as the ``gemini`` adapter: a 429 without Retry-After
is retried after its body's ``google.rpc.RetryInfo`` ``retryDelay``; a per-day quota stops the
provider (``adapters.provider_errors``).

Model strings: ``gemini-decisions:gemini-decision-1``,
``gemini-decisions:gemini-decision-1@http://127.0.0.1:8090``.
"""

from __future__ import annotations

from typing import Any

from dxi.evals import Task

from .base import Reply, Request
from .errors import ErrorIn200, MalformedReply
from .gemini import API_KEY_ENVS, billed_output, retry_delay
from .http import HTTPAdapter, as_count, load_reply, not_counts
from .llm import invalid_reply
from .provider_errors import body_error
from .systemone import decode_answers, encode_questions

P_YES_RANGE = (0.01, 0.99)


def _usage(doc: dict) -> dict:
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    tokens_in = as_count(usage.get("total_input_tokens"))
    cached = as_count(usage.get("total_cached_tokens"))
    return {
        "input_tokens": tokens_in,
        "output_tokens": billed_output(usage, "total_output_tokens", "total_thought_tokens"),
        "cached_input_tokens": (cached or 0) if tokens_in is not None else None,
        "usage_problem": "; ".join(not_counts(usage, COUNTS, "usage", COUNTS[2:])) or None,
    }


COUNTS = (
    "total_input_tokens",
    "total_output_tokens",
    "total_thought_tokens",
    "total_cached_tokens",
)
"""The counts of a CreateDecisionResponse's ``usage`` that price it (the last two are parts of the
others: ``null`` there states nothing, ``adapters.http.not_counts``)."""


def decode_decision(task: Task, body: bytes) -> Reply:
    """Parse a CreateDecisionResponse into one validated Answer per question (see the module
    docstring)."""
    doc: Any = load_reply(body, answers="answers")
    if (error := body_error(doc)) is not None:
        usage = Reply((), **_usage(doc)) if isinstance(doc.get("usage"), dict) else None
        raise ErrorIn200(error, usage)  # billed: the usage it states (runner.sending.cost)
    if not isinstance(doc, dict):
        raise MalformedReply("reply is not a JSON object", body[:2000].decode("utf-8", "replace"))
    usage = _usage(doc)
    feedback = doc.get("prompt_feedback") if isinstance(doc.get("prompt_feedback"), dict) else {}
    if feedback.get("block_reason"):
        said = feedback.get("block_reason_message")
        reason = f"input blocked (prompt_feedback.block_reason {feedback['block_reason']})"
        return invalid_reply(
            task, reason + (f": {said[:200]}" if isinstance(said, str) and said else ""), **usage
        )
    if not isinstance(doc.get("answers"), dict):
        raise MalformedReply(
            "reply has no 'answers' object", body[:2000].decode("utf-8", "replace")
        )
    return Reply(decode_answers(task, doc["answers"]), **usage)


class GeminiDecisions(HTTPAdapter):
    """The Gemini Decisions API."""

    kind = "gemini-decisions"
    takes_params = False  # a decision model: no sampling parameters
    default_base_url = "https://generativelanguage.googleapis.com"
    path = "/v1beta/decisions"
    api_key_env = "GEMINI_API_KEY"
    API_KEY_ENVS = API_KEY_ENVS
    RESERVED = frozenset({"model", "input", "questions"})
    P_YES_RANGE = P_YES_RANGE

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-goog-api-key": key}

    def retry_after_from_body(self, body: bytes) -> float | None:
        return retry_delay(body)

    def encode(self, task: Task, sample: int = 0) -> Request:
        return self.request(
            {
                "model": f"models/{self.model.removeprefix('models/')}",
                "input": task.state,
                "questions": encode_questions(task),
            },
            sample,
        )

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_decision(task, body)

    def output_tokens_bound(self, task: Task) -> int | None:
        """0: the model's output is always 0 tokens (its answers are probabilities, not text)."""
        return 0
