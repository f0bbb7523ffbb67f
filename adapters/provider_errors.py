"""Reading the providers' error bodies: the provider's own message, and the failures that every
request to the provider would meet alike (``errors.ProviderStop``), told apart from a rate limit or
a bad request.

One function, ``provider_stop``, reads the three documented error shapes (they cannot be confused):

* **OpenAI** (and OpenAI-compatible gateways): ``{"error": {"message", "type", "param", "code"}}``.
  Quota and billing: HTTP 429 with ``error.type`` ``insufficient_quota`` or ``error.code`` one of
  ``insufficient_quota``, ``credit_balance_exhausted``, ``organization_spend_limit_exceeded``,
  ``project_spend_limit_exceeded``, ``organization_usage_limit_exceeded`` ("Check error.code in the
  API response. A billing-related error may still use the broader error.type value
  insufficient_quota"; "Retrying these errors won't restore access":
  help.openai.com/en/articles/6614457 and 5955604;
  developers.openai.com/api/docs/guides/spend-limits). A 400 for an unsupported parameter or value
  carries ``error.code`` ``unsupported_parameter`` / ``unsupported_value`` and names the field in
  ``error.param``.
* **Anthropic**: ``{"type": "error", "error": {"type", "message", "details": {"error_code"}}}``.
  Spend limits: a 429 ``rate_limit_error`` whose ``error.details.error_code`` is
  ``enforced_spend_limit_reached`` (the tier's monthly cap; access resumes 00:00 UTC on the first
  day of the next month, and the reply has no retry-after), ``contract_spend_limit_reached`` or
  ``linked_organization_spend_limit_reached`` (the anthropic SDK's
  ``types/shared/*_spend_limit_reached_error_details.py``, ``ErrorDetails`` union);
  ``organization_on_hold``; a 402 ``billing_error``; a spend limit the user set: HTTP 400
  ``invalid_request_error`` whose message begins "You have reached your specified (workspace) API
  usage limits" and states when access resumes (platform.claude.com/docs/en/api/errors); and a
  prepaid balance used up: HTTP 400 ``invalid_request_error`` "Your credit balance is too low to
  access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits." (every
  request of the organization meets it until credits are bought: anthropics/claude-code #4684,
  #66314).
* **Google** (Gemini): ``{"error": {"code", "message", "status", "details": [...]}}``. A per-day
  quota: 429 ``RESOURCE_EXHAUSTED`` with a ``type.googleapis.com/google.rpc.QuotaFailure`` detail
  whose violations' ``quotaId`` names a per-day quota
  (``GenerateRequestsPerDayPerProjectPerModel-FreeTier``, ``quotaMetric``
  ``.../generate_requests_per_model_per_day``); its ``google.rpc.RetryInfo`` ``retryDelay`` says
  when it resets (ai.google.dev/gemini-api/docs/rate-limits: per-day quotas reset at midnight
  Pacific time; google/rpc/error_details.proto).

Whatever the shape: 401 and 403 (the key is refused or lacks permission; Google also says so in a
400 whose ``google.rpc.ErrorInfo`` reason is ``API_KEY_INVALID`` and the like) stop the provider;
404 (an unknown model or path) and a 400 refusing the request's form (an unsupported schema,
parameter or field, an effort level the model does not have), not its content (a prompt too long is
this request's own failure), stop the model alone (``ProviderStop.scope``: the other models on the
same base URL go on).

Form or content is read from the error's structured fields wherever the provider gives one, never
from words in its free text: OpenAI's ``error.code`` and ``error.param`` (the invalid-schema 400,
"Invalid schema for response_format 'answers': In context=(), ...", names ``param``
``response_format``: the form, though its text says "context"; a prompt too long has ``code``
``context_length_exceeded`` and ``param`` ``messages``), Google's ``google.rpc.BadRequest``
``fieldViolations[].field`` (``contents`` is the content, any other field the form). Only a body
with neither (Anthropic's) is read by its words.

A streamed request carries fields its stored body does not (``STREAM_FIELDS``: OpenAI's
``"stream": true, "stream_options": {...}``). A server that refuses them (an OpenAI-compatible
server without ``stream_options``: a 400 naming it in ``error.param``, with or without a ``code``,
or in its words; a 422 saying so) refuses the streamed form, which every streamed request of the
model has: ``streaming_refused`` makes that a stop of the model, whose message says to run it with
``--stream never`` (``runner.sending.retry.reclassify`` never turns it into a stored failure: such a
request is answered when sent whole).
"""

from __future__ import annotations

import calendar
import contextlib
import re
from datetime import UTC, datetime
from typing import Any

import orjson

from .errors import KEY, MODEL, QUOTA, REQUEST, AdapterError, Fatal, ProviderStop

OPENAI_QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
    }
)
OPENAI_FORM_CODES = frozenset(
    {
        "unsupported_parameter",
        "unsupported_value",
        "invalid_json_schema",
        "model_not_found",
        "unknown_parameter",
    }
)
OPENAI_CONTENT_CODES = frozenset(
    {
        "context_length_exceeded",
        "string_above_max_length",
        "invalid_prompt",
        "content_policy_violation",
    }
)
# the body fields whose refusal concerns every request alike (the form the adapter gives every
# request); a dotted param ("response_format.json_schema") is read by its first part
FORM_PARAMS = frozenset(
    {
        "model",
        "response_format",
        "tools",
        "tool_choice",
        "output_config",
        "logprobs",
        "top_logprobs",
        "max_tokens",
        "max_completion_tokens",
        "generationConfig",
        "responseJsonSchema",
        "temperature",
        "reasoning_effort",
        "seed",
        "thinking",
        "top_p",
        "top_k",
        "stop",
        "n",
        "service_tier",
        "store",
        "verbosity",
    }
)
STREAM_FIELDS = frozenset({"stream", "stream_options"})
"""The fields a streamed request adds to its body (``HTTPAdapter.stream_body``): a refusal naming
one refuses the streamed form (``streaming_refused``)."""
STREAM_NEVER = (
    "the server refuses the streamed form of request ({field}): run this model with --stream never "
    '(a run file\'s provider table: stream = "never")'
)
_STREAM_WORDS = re.compile(r"\b(stream_options|stream)\b", re.IGNORECASE)
GOOGLE_CONTENT_FIELDS = (
    "contents",
)  # a BadRequest field violation under these is the request's content
ANTHROPIC_SPEND_CODES = frozenset(
    {
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
        "organization_on_hold",
        "linked_organization_billing_unavailable",
    }
)
# Google: a key that is not valid is a 400 INVALID_ARGUMENT whose ErrorInfo reason says so
# (google/rpc/error_details.proto)
GOOGLE_KEY_REASONS = frozenset(
    {
        "API_KEY_INVALID",
        "API_KEY_SERVICE_BLOCKED",
        "API_KEY_HTTP_REFERRER_BLOCKED",
        "API_KEY_IP_ADDRESS_BLOCKED",
        "SERVICE_DISABLED",
        "ACCESS_TOKEN_EXPIRED",
    }
)
GOOGLE_BILLING_REASONS = frozenset({"BILLING_DISABLED"})
_USAGE_LIMIT = re.compile(
    r"you have reached your specified (?:workspace )?api usage limits", re.IGNORECASE
)
_CREDIT_BALANCE = re.compile(r"your credit balance is too low", re.IGNORECASE)
_REGAIN = re.compile(
    r"(\d{4}-\d{2}-\d{2})(?:[ T]?(?:at )?(\d{1,2}:\d{2})(?::\d{2})?)?\s*(?:UTC|Z)?"
)
_FORM = re.compile(
    r"unsupported|not supported|does not support|is not available for|unknown (?:parameter|field|name)"
    r"|unrecognized (?:request argument|field|parameter)|extra inputs are not permitted|invalid (?:json )?schema"
    r"|\bschema\b|tool_choice|output_config|response_format|responsejsonschema",
    re.IGNORECASE,
)
_CONTENT = re.compile(
    r"context|too long|too many tokens|maximum .*tokens|prompt is too|exceeds? the (?:maximum|limit)",
    re.IGNORECASE,
)
_TOO_LONG = re.compile(
    r"context[_ ]length|context (?:size|window)|prompt is too long|input token count .*exceeds",
    re.IGNORECASE,
)
_PER_DAY = re.compile(r"per ?day|_day\b|daily", re.IGNORECASE)


def error_doc(payload: bytes) -> dict:
    """The ``error`` object of an error body (any of the three shapes), or {} when there is none."""
    with contextlib.suppress(orjson.JSONDecodeError, TypeError):
        doc = orjson.loads(payload)
        if (
            isinstance(doc, list) and doc and isinstance(doc[0], dict)
        ):  # Google sometimes wraps it in a list
            doc = doc[0]
        error = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(error, dict):
            return error
        if isinstance(error, str):
            return {"message": error}
    return {}


def error_message(payload: bytes) -> str | None:
    """The provider's own message in an error body (``error.message``), None when it gives none."""
    message = error_doc(payload).get("message")
    return message if isinstance(message, str) and message.strip() else None


def retry_delay(error: dict) -> float | None:
    """Seconds of a Google error object's ``google.rpc.RetryInfo`` ``retryDelay`` ("32s"); None when
    absent, negative or not finite."""
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith(
            "google.rpc.RetryInfo"
        ):
            with contextlib.suppress(TypeError, ValueError):
                delay = float(str(detail.get("retryDelay", "")).removesuffix("s"))
                if 0 <= delay < float("inf"):
                    return delay
    return None


def _per_day_violation(error: dict) -> str | None:
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith(
            "google.rpc.QuotaFailure"
        ):
            for v in detail.get("violations") or []:
                if isinstance(v, dict):
                    named = f"{v.get('quotaId', '')} {v.get('quotaMetric', '')}"
                    if _PER_DAY.search(named):
                        return str(v.get("quotaId") or v.get("quotaMetric"))
    return None


def _error_info_reason(error: dict) -> str:
    """The ``reason`` of a Google error's ``google.rpc.ErrorInfo`` detail ("API_KEY_INVALID"), or
    ""."""
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith(
            "google.rpc.ErrorInfo"
        ):
            return str(detail.get("reason") or "")
    return ""


def _field_violations(error: dict) -> list[str]:
    """The ``field`` of each ``fieldViolations`` entry of a Google error's ``google.rpc.BadRequest``
    detail."""
    out = []
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith(
            "google.rpc.BadRequest"
        ):
            out += [
                str(v["field"])
                for v in detail.get("fieldViolations") or []
                if isinstance(v, dict) and v.get("field")
            ]
    return out


def refuses_form(error: dict) -> bool:
    """Whether a 400's error object refuses the request's form (see the module docstring) rather
    than its content: by its structured fields where it has any, else by its words."""
    code, param = str(error.get("code") or ""), str(error.get("param") or "")
    if code in OPENAI_CONTENT_CODES:
        return False
    if code in OPENAI_FORM_CODES:
        return True
    if param:
        return param.split(".")[0].split("[")[0] in FORM_PARAMS | STREAM_FIELDS
    fields = _field_violations(error)
    if fields:
        return any(not f.startswith(GOOGLE_CONTENT_FIELDS) for f in fields)
    message = str(error.get("message") or "")
    return bool(_FORM.search(message)) and not _CONTENT.search(message)


def prompt_too_long(error: dict) -> bool:
    """Whether a 400's error object says the prompt (with the output budget asked) is longer than
    the model's context: OpenAI's ``code`` ``context_length_exceeded``, llama.cpp's ``type``
    ``exceed_context_size_error``, else its words (Anthropic's "prompt is too long", Google's "The
    input token count ... exceeds", vLLM's "maximum context length")."""
    if error.get("code") == "context_length_exceeded":
        return True
    if error.get("type") == "exceed_context_size_error":
        return True
    return bool(_TOO_LONG.search(str(error.get("message") or "")))


def _next_month_utc(now: float) -> float:
    """Seconds from ``now`` (Unix time) to 00:00 UTC on the first day of the next month."""
    t = datetime.fromtimestamp(now, UTC)
    year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) - now


def _regain_in(message: str, now: float) -> float | None:
    """Seconds until the date a message says access resumes ("... regain access on 2026-12-01 at
    00:00 UTC")."""
    m = _REGAIN.search(message)
    if m is None:
        return None
    with contextlib.suppress(ValueError):
        when = datetime.fromisoformat(f"{m.group(1)}T{m.group(2) or '00:00'}").replace(tzinfo=UTC)
        wait = when.timestamp() - now
        return wait if wait > 0 else None
    return None


def provider_stop(
    status: int, payload: bytes, what: str, snippet: str, now: float
) -> ProviderStop | None:
    """The ProviderStop an error reply means (see the module docstring), or None when it concerns
    this request alone or is a plain rate limit. ``snippet`` is the redacted start of the body
    quoted in the message when the body has no ``error.message`` (the provider's own words, quoted
    otherwise); ``now`` the reply's time (its ``Date`` header, else the local clock) as Unix
    seconds."""
    error = error_doc(payload) if status >= 400 else {}
    message = str(error.get("message") or "")
    etype, code = str(error.get("type") or ""), str(error.get("code") or "")
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    anthropic_code = str(details.get("error_code") or "")

    said = message.strip()[:300] or snippet

    field = str(error.get("param") or next(iter(_field_violations(error)), "")) or None

    def stop(cause: str, resets_in: float | None = None, hint: str = "") -> ProviderStop:
        return ProviderStop(
            f"{what}: HTTP {status} {cause}{hint}: {said}", cause, status, resets_in, field=field
        )

    if etype == "insufficient_quota" or code in OPENAI_QUOTA_CODES:
        return stop(QUOTA, hint=f" ({code or etype})")
    if anthropic_code in ANTHROPIC_SPEND_CODES:
        resets = (
            _next_month_utc(now)
            if anthropic_code == "enforced_spend_limit_reached"
            else _regain_in(message, now)
        )
        return stop(QUOTA, resets, f" ({anthropic_code})")
    if etype == "billing_error" or status == 402:
        return stop(QUOTA, hint=" (billing)")
    if _USAGE_LIMIT.search(message):
        return stop(QUOTA, _regain_in(message, now), " (spend limit)")
    # the words last, after every structured field above (the SDK: a message's "wording can
    # change, so don't match on it"): anthropic 2.17 has no type nor error_code for a used-up
    # prepaid balance (``types/shared/error_type.py``, ``_error_classes.py``), which the API answers
    # as a 400 ``invalid_request_error``; a ``billing_error`` (402) is caught above by its type
    if _CREDIT_BALANCE.search(message):
        return stop(QUOTA, hint=" (credit balance)")
    if error.get("status") == "RESOURCE_EXHAUSTED" and (quota := _per_day_violation(error)):
        return stop(QUOTA, retry_delay(error), f" ({quota})")
    reason = _error_info_reason(error)
    if reason in GOOGLE_BILLING_REASONS:
        return stop(QUOTA, hint=f" ({reason})")
    if status in (401, 403) or reason in GOOGLE_KEY_REASONS:
        return stop(KEY, hint=" (check the API key's environment variable and its permissions)")
    if status == 404:
        return stop(MODEL, hint=" (check the base URL and the model name)")
    if status == 400 and refuses_form(error):
        return stop(
            REQUEST,
            hint=" (the provider refuses this form of request for this model: an unsupported schema, "
            "parameter or effort level)",
        )
    return None


def _stream_field(error: AdapterError) -> str | None:
    """The streaming field (``STREAM_FIELDS``) that ``error``, the answer to a streamed request,
    refuses: its ``field`` (OpenAI's ``error.param``) when it names one, else the first one its
    words name after the model's label; None when it refuses none (or is no refusal of the request's
    form: a ProviderStop of cause ``REQUEST``, or a Fatal 400 or 422)."""
    if error.status not in (400, 422):
        return None
    if isinstance(error, ProviderStop):
        if error.cause != REQUEST:
            return None
        if error.field:
            field = error.field.split(".")[0]
            return field if field in STREAM_FIELDS else None
    elif not isinstance(error, Fatal):
        return None
    said = _STREAM_WORDS.search(str(error).split(": ", 1)[-1])
    return said.group(1).lower() if said else None


def streaming_refused(error: AdapterError) -> ProviderStop | None:
    """The stop of the model (cause ``REQUEST``, its ``field`` the one refused) for ``error``, the
    answer to a streamed request, when it refuses a streaming field (``_stream_field``), saying to
    run the model with ``--stream never`` (``STREAM_NEVER``); None otherwise."""
    field = _stream_field(error)
    if field is None:
        return None
    return ProviderStop(
        f"{error} — {STREAM_NEVER.format(field=field)}", REQUEST, error.status, field=field
    )


def body_error(doc: Any) -> str | None:
    """The provider's message when a 200 reply carries an error instead of an answer, else None: an
    ``error`` body (OpenRouter and other gateways, an Anthropic ``{"type": "error"}`` event), a
    top-level ``error`` beside the answer (``choices`` and an ``error`` object or message: which one
    the provider meant is unknown, so never an answer stored), or a Chat Completions choice whose
    ``finish_reason`` is ``"error"`` or that holds an ``error`` object
    (openrouter.ai/docs/api-reference/errors: "errors occurring mid-generation ... finish_reason:
    error"). An empty ``error`` beside ``choices`` (``null``, ``{}``, ``""``) is none."""
    if not isinstance(doc, dict):
        return None
    error = doc.get("error")
    if doc.get("type") == "error" or (
        error is not None and error != {} and (bool(error) or not doc.get("choices"))
    ):
        return _describe(error) or "an error body"
    for choice in doc.get("choices") or []:
        if isinstance(choice, dict) and (
            choice.get("finish_reason") == "error" or choice.get("error")
        ):
            return _describe(choice.get("error") or error) or "finish_reason error"
    return None


def _describe(error: Any) -> str | None:
    if isinstance(error, str):
        return error[:300]
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code")
        text = message if isinstance(message, str) else orjson.dumps(error).decode()
        return (f"{code}: {text}" if code not in (None, "") else text)[:300]
    return None
