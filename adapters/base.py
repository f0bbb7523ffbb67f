"""What every adapter shares: the request record and its cache key, limits, parsed replies, the
interface."""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from dxi.evals import PROMPT_VERSION, Task
from dxi.shown import shown
from dxi.stored import request_key


@dataclass(frozen=True, slots=True)
class Request:
    """One request, encoded before any I/O.

    ``body`` is the exact bytes sent (built deterministically; keys never sorted, since option order
    is meaningful). ``params`` is the canonical JSON of the sampling parameters ("{}" for none).
    ``sample`` is the epoch index. ``kind`` is the adapter's (``Adapter.kind``: the wire format);
    the cache stores it in its ``provider`` column (the column's name since the first shards).
    Secrets never appear here: adapters add them as headers in ``send``.
    """

    kind: str
    model: str
    endpoint: str
    body: bytes
    sample: int = 0
    params: str = "{}"
    prompt_version: str = PROMPT_VERSION
    key: str = field(init=False, repr=False, compare=False)
    """The cache key: sha256 (hex) of kind, model, endpoint, sample, prompt version, sampling
    parameters and the body bytes; computed once, when the request is made."""

    def __post_init__(self) -> None:
        key = request_key(
            self.kind,
            self.model,
            self.endpoint,
            self.sample,
            self.prompt_version,
            self.params,
            self.body,
        )
        object.__setattr__(self, "key", key)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-provider limits and retry budget.

    ``rpm``: requests per minute (None: unlimited); ``tpm``: tokens per minute (None: unlimited);
    ``max_in_flight``: concurrent requests; ``attempt_timeout_s``: seconds to wait for one reply;
    ``max_attempts``: attempts per request including the first; ``backoff_s``: the first backoff
    wait (doubling, plus up to ``backoff_s`` of jitter); ``max_wait_s``: cap on one backoff wait;
    ``max_stated_wait_s``: the longest wait a provider may state (``Retry-After``, a reset header,
    Gemini's ``RetryInfo``) that is honoured exactly, a longer one stops the provider
    (``runner.sending.stops``); ``max_reply_bytes``: the largest reply body read (decoded), a larger
    one is stored invalid.

    The HTTP adapters read ``attempt_timeout_s`` as an idle timeout: no byte of the reply for that
    long ends the attempt, however long the reply has been arriving; ``max_reply_time_s`` bounds one
    attempt's whole reply (seconds). ``stream``: when requests are streamed, ``auto`` (where a reply
    can be long), ``always`` or ``never`` (``adapters.streaming``).
    """

    rpm: float | None = None
    tpm: int | None = None
    max_in_flight: int = 16
    attempt_timeout_s: float = 120.0
    max_attempts: int = 6
    backoff_s: float = 1.0
    max_wait_s: float = 60.0
    max_stated_wait_s: float = 600.0
    max_reply_bytes: int = 4 << 20
    max_reply_time_s: float = 3600.0
    stream: str = "auto"


@dataclass(slots=True)
class Progress:
    """What arrived of one attempt's reply, as it arrives (``Adapter.transmit`` fills it; the runner
    reads it when the attempt ends, whatever the outcome): ``started`` (``time.perf_counter()`` when
    it was sent), ``streamed`` (the request was streamed), ``began`` (part of the reply arrived: a
    streamed reply's first event, a byte of a whole 2xx reply's body), ``first_token``
    (``perf_counter()`` when the first generated token arrived: text, thinking, a refusal; streamed
    replies only) and ``received`` (bytes of the reply body read)."""

    started: float = 0.0
    streamed: bool = False
    began: bool = False
    first_token: float | None = None
    received: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending to the first generated token; None when none arrived or it was not
        streamed."""
        return None if self.first_token is None else self.first_token - self.started


OK, INVALID = "ok", "invalid"


@dataclass(frozen=True, slots=True)
class Answer:
    """One question's parsed answer.

    ``status`` is "ok" or "invalid" (then ``predicted`` is None and ``error`` says why).
    ``predicted`` is an option id or "yes"/"no"; ``p_predicted`` its probability; ``p_yes`` P(yes)
    for yes/no questions; ``probabilities`` every option's probability as returned (decision models;
    empty otherwise); ``warning`` notes an accepted oddity (e.g. the returned choice was not the
    most probable).
    """

    question_id: str
    status: str
    predicted: str | None = None
    p_predicted: float | None = None
    p_yes: float | None = None
    probabilities: tuple[tuple[str, float], ...] = ()
    error: str | None = None
    warning: str | None = None

    @classmethod
    def invalid(cls, question_id: str, error: str) -> Answer:
        return cls(question_id, INVALID, error=error)

    def as_row(self) -> dict:
        """The cache's per-question struct."""
        return {
            "question_id": self.question_id,
            "status": self.status,
            "predicted": self.predicted,
            "p_predicted": self.p_predicted,
            "p_yes": self.p_yes,
            "probabilities": [{"option": o, "p": p} for o, p in self.probabilities],
            "error": self.error,
            "warning": self.warning,
        }


@dataclass(frozen=True, slots=True)
class Reply:
    """A decoded reply: one Answer per question of the task, in task order, plus usage.

    ``repaired`` is True when a language model's JSON object arrived wrapped in one Markdown code
    fence: accepted and scored normally, but counted (SPEC §6). ``input_tokens`` counts every input
    token billed; ``cached_input_tokens`` those of them read from the provider's prompt cache
    (OpenAI ``prompt_tokens_details.cached_tokens``, Anthropic ``cache_read_input_tokens``, Gemini
    ``cachedContentTokenCount``), ``cache_write_tokens`` those written to it (OpenAI
    ``prompt_tokens_details.cache_write_tokens``, Anthropic's 5-minute cache) and
    ``cache_write_1h_tokens`` those written to Anthropic's 1-hour cache; each priced at its own
    price (``scoring.cost``). ``served_model`` is the model the reply says answered (``model``,
    Gemini's ``modelVersion``), None when it names none. ``cut_off`` says where a reply cut off at
    the token limit was cut: ``"thinking"`` (the limit was spent before any answer text),
    ``"answer"`` (within the answer), None when it was not cut off. ``usage_problem`` names the
    counts the reply's usage states that are not counts of tokens (``adapters.http.not_counts``:
    ``'usage.completion_tokens "50"'``; None: none), which make its usage not credible
    (``runner.sending.cost.credible`` keeps none of it; never stored). ``over_cap``: its output
    tokens pass the request's own cap, but not the most any reply holds (a provider whose cap leaves
    out its reasoning): its usage is kept, and the cost bound charges it at least its reservation
    (``runner.sending.cost``).
    """

    answers: tuple[Answer, ...]
    input_tokens: int | None = None
    output_tokens: int | None = None
    served_model: str | None = None
    repaired: bool = False
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    cut_off: str | None = None
    usage_problem: str | None = None
    over_cap: bool = False

    @property
    def status(self) -> str:
        """ "ok" when every answer is valid, else "invalid"."""
        return OK if all(a.status == OK for a in self.answers) else INVALID

    @property
    def error(self) -> str | None:
        """The invalid answers' reasons, joined; None when all are valid."""
        errors = [f"{a.question_id}: {a.error}" for a in self.answers if a.status != OK]
        return "; ".join(errors) or None


@dataclass
class ModelSpec:
    """A parsed model string ``ADAPTER:MODEL[@BASE_URL]``; ``model`` may be None where the server
    names it.

    ``params``: sampling parameters (temperature, max tokens, seed, reasoning effort, ... in the
    provider's own names), sent in the request body and part of the cache key. ``options``: settings
    that do not change the answers (the API key's environment variable, a local server's context
    size), never in the key. ``name``: the model's name in reports (a run file's ``name``); None:
    ``ADAPTER:MODEL``. Never in the key. ``effort``: one of ``EFFORTS`` (``--effort``, a run file's
    ``effort``), mapped by the adapter onto the provider's own field in ``params``
    (``Adapter.apply_effort``), so it is in the body and the key.
    """

    kind: str
    model: str | None
    base_url: str | None = None
    params: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    name: str | None = None
    effort: str | None = None

    def __post_init__(self) -> None:
        """Refuse a base URL that carries credentials, a query, parameters or a fragment
        (ValueError, the secret not quoted): the base URL is written to the cache, runs.jsonl and
        the outputs, and a request to it would go to another path. ``?``, ``;`` and ``#`` are
        refused even empty, and a percent escape too (``/v1%3Fkey=...`` is sent as part of the
        path): a base URL needs none (``_URL_SECRET``)."""
        named = self.name or f"{self.kind}:{self.model or ''}"
        for what, text in (("name", self.name), ("model", self.model), ("adapter", self.kind)):
            if text and shown(text) != text:
                raise ValueError(
                    f"model {shown(named)}: its {what} holds a control character (ESC, a line "
                    "break, a bidirectional override: shown escaped here); a model's names are "
                    "printed and written to the cache and the outputs"
                )
        parts = urlsplit(self.base_url or "")
        if (
            parts.username is not None
            or parts.password is not None
            or _URL_SECRET.search(self.base_url or "")
        ):
            raise ValueError(
                f"model {self.kind}:{self.model or ''}: its base URL carries credentials, a "
                f"query, parameters or a fragment ({parts.scheme}://{parts.hostname}...: "
                "user:password@, ?key=..., ;key=..., #... or a percent escape); give "
                "the API key in its environment variable (or --option api_key_env=NAME, "
                "api_key_command): the base URL is written to the cache, runs.jsonl and the outputs"
            )


# what a base URL never needs, and a secret could hide in: a query, parameters, a fragment, a
# percent escape
_URL_SECRET = re.compile(r"[?;#%]")


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """A started model as the cache and the scoring tell it apart (``Adapter.identity``): ``label``
    (its name in reports), ``kind`` (the adapter), ``model`` (the provider's name; a server-named
    model's once started), ``endpoint``, ``params`` (the canonical JSON of its sampling parameters,
    ``Adapter.params_key``) and the ``effort`` level its requests carry (None: the provider's
    default). ``key`` is the configuration every cache key and cache row holds (the cache's
    ``provider``, ``model``, ``endpoint`` and ``params`` columns); ``row`` the model's row of the
    frame scoring selects cache rows by (``scoring.MODELS_SCHEMA``)."""

    label: str
    kind: str
    model: str
    endpoint: str
    params: str
    effort: str | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(adapter, model, endpoint, params): what no two models of one run may share
        (``runner.planning.plan``)."""
        return self.kind, self.model, self.endpoint, self.params

    def row(self, prompt_version: str = PROMPT_VERSION) -> tuple[str, str, str, str, str, str]:
        """The model's ``scoring.MODELS_SCHEMA`` row: label, provider (the adapter), model,
        endpoint, params and ``prompt_version``."""
        return self.label, *self.key, prompt_version


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""The one effort vocabulary of ``--effort`` and a run file's ``effort``, lowest first: the values
of the openai SDK's ``ReasoningEffort`` (``types/shared/reasoning_effort.py``, openai 3.57.0). Each
adapter maps a level onto its provider's own field (``Adapter.apply_effort``) and refuses the levels
that field does not have."""


def canonical_params(value: Any) -> Any:
    """Sampling parameters in one canonical form, so equal settings give equal requests and cache
    keys: object keys sorted (at every depth) and whole-number floats as integers
    (``temperature=0.0`` is ``temperature=0``). Whatever order ``--param`` flags or run-file keys
    come in, the bytes sent are the same."""
    if isinstance(value, dict):
        return {k: canonical_params(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [canonical_params(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class Adapter(abc.ABC):
    """One wire format. ``encode`` and ``decode`` are pure; ``send`` does the I/O and raises the
    errors of ``adapters.errors``. ``start`` runs once before the first request (open sessions,
    learn the served model's name) and ``close`` once after the last.

    ``kind``: the adapter name in model strings (the wire format); ``limits_key``: the key of the
    rate limits this adapter's requests share (e.g. one per base URL; a run file's provider
    overrides it, ``ModelRun``); ``model``: the model's name, part of every cache key;
    ``takes_params``: language-model adapters send sampling parameters, decision formats have none;
    ``OPTIONS``: the settings (``ModelSpec.options``) the adapter reads; ``free``: the model runs on
    this machine (no bill: its price is 0 unless a run file says otherwise); ``fixed_endpoint``: its
    ``endpoint`` is a constant of the cache key, not a server the user named (in-process, or a
    server dxi starts on a port of its own), so no message names it; ``HIDDEN_INPUT_TOKENS``: input
    tokens a provider adds to every request beyond what the body holds (an upper bound; see
    ``runner.planning.tokens``); ``OWN_PROMPT``: the server wraps each request in a prompt of its
    own, of a size no request states (a System One server's template), so its input tokens may pass
    the body's bytes (``runner.sending.cost``); ``CACHE_PRICES``: the prices of prompt-cache reads
    and writes (``cached_input``, ``cache_write``, ``cache_write_1h``) as multiples of the input
    price, where the provider's pricing fixes them for every model (Anthropic); a run file's price
    overrides them, and a part priced by neither is priced as input.
    """

    kind: str = ""
    endpoint: str = ""
    takes_params: bool = False  # whether ModelSpec.params (sampling parameters) reach the request
    OPTIONS: frozenset[str] = frozenset()  # the ModelSpec.options this adapter understands
    free: bool = False
    fixed_endpoint: bool = False
    HIDDEN_INPUT_TOKENS: int = 0
    OWN_PROMPT: bool = False
    CACHE_PRICES: Mapping[str, float] = {}
    P_YES_RANGE: tuple[float, float] | None = None
    """The range the provider clamps a yes/no answer's P(yes) to, when it clamps (Gemini Decisions:
    0.01-0.99)."""
    EFFORT_FIELD: str = ""
    """The provider's own field an effort level is written to (``apply_effort``); "" when the
    adapter has none."""
    EFFORT_LEVELS: tuple[str, ...] = ()
    """The levels of ``EFFORTS`` that ``EFFORT_FIELD`` takes (from the provider's SDK types)."""
    own_timeout: bool = False
    """True when ``send`` itself gives up after ``limits.attempt_timeout_s`` without a reply
    (raising Transient), as the HTTP adapters' sessions do; otherwise the runner times each
    attempt."""

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        self.spec = spec
        self.model: str = spec.model or ""
        self.limits = limits or self.default_limits()
        self.params: dict = canonical_params(dict(spec.params))

    @classmethod
    def default_limits(cls) -> Limits:
        return Limits()

    @classmethod
    def apply_effort(cls, params: dict, effort: str) -> dict:
        """``params`` with the effort level ``effort`` (one of ``EFFORTS``) written to the
        provider's own field. Raises ValueError when the adapter has no effort setting, the level is
        not one its field takes, or ``params`` already set that field to something else (give one:
        ``--effort`` or the native parameter)."""
        if effort not in EFFORTS:
            raise ValueError(f"effort {effort!r} is not one of {', '.join(EFFORTS)}")
        if not cls.EFFORT_FIELD:
            raise ValueError(
                f"{cls.kind}: this adapter has no effort setting (--effort is for the hosted language "
                "models: openai, anthropic, gemini, logprobs)"
            )
        if effort not in cls.EFFORT_LEVELS:
            raise ValueError(
                f"{cls.kind}: effort {effort!r} is not a level of {cls.EFFORT_FIELD} (it takes "
                f"{', '.join(cls.EFFORT_LEVELS)}){cls.effort_hint(effort)}"
            )
        return cls._with_effort(dict(params), effort)

    @classmethod
    def effort_hint(cls, effort: str) -> str:
        """What to give instead of a level the provider's field does not have (appended to the
        error)."""
        return ""

    @classmethod
    def _with_effort(cls, params: dict, effort: str) -> dict:
        raise NotImplementedError

    @classmethod
    def effort_of(cls, params: dict) -> str | None:
        """The effort level ``params`` set in the provider's own field (however it was given:
        ``--effort`` or the native parameter), in the vocabulary of ``EFFORTS`` where it is one of
        them; None when unset."""
        return None

    @property
    def effort(self) -> str | None:
        """The effort level this model's requests carry (``effort_of`` its parameters); None: the
        provider's default."""
        return self.effort_of(self.params)

    @property
    def label(self) -> str:
        """The model's name in reports: ``ModelSpec.name`` when given, else ``kind:model``."""
        return self.spec.name or f"{self.kind}:{self.model}"

    def output_tokens_bound(self, task: Task) -> int | None:
        """An upper bound of the output tokens of one request for ``task`` (what the provider may
        bill), from the request's own cap (``max_tokens`` and the like); None when nothing caps the
        reply."""
        return None

    def cost_bound_problem(self) -> str | None:
        """What in this model's parameters no cost bound can hold, as a message naming the
        parameter (``adapters.llm.cost_bound_problem``: an output cap below 1, a number of
        replies that is not a positive integer); None: nothing. ``dxi run --max-cost`` refuses it
        (exit 2)."""
        return None

    @property
    def limits_key(self) -> str:
        return f"{self.kind}@{self.spec.base_url or 'default'}"

    @property
    def params_key(self) -> str:
        """Canonical JSON (sorted keys) of the sampling parameters; "{}" when there are none."""
        return orjson.dumps(self.params, option=orjson.OPT_SORT_KEYS).decode()

    @property
    def identity(self) -> ModelIdentity:
        """This model as the cache and the scoring tell it apart (as it is now: a server-named
        model's name is known once started)."""
        return ModelIdentity(
            self.label, self.kind, self.model, self.endpoint, self.params_key, self.effort
        )

    def missing_setup(self) -> str | None:
        """What ``start`` will refuse for lack of local set-up (an API key's environment variable
        not set), as the message it will give; None when nothing is missing. Checked without the
        network."""
        return None

    def unknown_model(self) -> str | None:
        """The part of ``missing_setup`` that is the input's fault, not this machine's: a model
        name that is none of the adapter's models (a typo), as the message ``start`` will give; None
        otherwise (``runner.planning.plan.Plan.check_models``: bad input, exit 2)."""
        return None

    async def start(self) -> None:
        """Prepare for sending; raises Fatal when the model cannot be used (unknown, no key),
        ProviderStop (cause ``UNREACHABLE``) when its server cannot be reached."""
        return None

    async def check_reachable(self) -> None:
        """Raise ProviderStop (cause ``UNREACHABLE``) when the model's server cannot be reached now
        (a connection opened and closed, nothing sent: ``dxi estimate`` warns with it; a System One
        server is also asked ``GET /health``, cause ``SERVED``); nothing to check for a model that
        runs in this process."""
        return None

    async def close(self) -> None:
        """Release sessions and threads."""
        return None

    @abc.abstractmethod
    def encode(self, task: Task, sample: int = 0) -> Request:
        """The request for one task and epoch; pure: the same task gives the same bytes."""

    @abc.abstractmethod
    async def send(self, request: Request) -> bytes:
        """Send one request and return the raw reply body; raises RateLimited, Transient or
        Fatal."""

    async def transmit(self, request: Request, progress: Progress) -> bytes:
        """``send``, noting in ``progress`` what of the reply arrived (the runner's entry point).
        Adapters that stream their replies override it (``adapters.http.HTTPAdapter``); the default
        sends whole."""
        return await self.send(request)

    def long_reply(self, request: Request) -> bool:
        """Whether the reply to ``request`` can be long (``--stream auto`` streams it): the model
        thinks, or its output budget is large (``adapters.streaming``); False for adapters without a
        streamed form."""
        return False

    @abc.abstractmethod
    def decode(self, task: Task, body: bytes) -> Reply:
        """Parse a reply body into one Answer per question; raises MalformedReply when the body is
        not the wire format. Problems with single answers are recorded as invalid answers, not
        raised."""

    def check_served(self, reply: Reply) -> None:
        """Raise ProviderStop (cause ``SERVED``) when ``reply`` is not an answer of the model asked
        for: the server that gave it serves another model (``adapters.systemone``). The runner calls
        it after ``decode``, and stores no such reply. A hosted provider's served name is never
        refused here: an alias, a dated snapshot or a provider's reroute is recorded
        (``served_model``; summary.json's ``served_models``), and this default accepts every
        reply."""
        return None

    def decode_parsed(self, task: Task, body: bytes, doc: Any) -> Reply:
        """``decode`` of a body parsed already: ``doc`` is ``body`` as ``json_body.load_json`` reads
        it (a batch result line's own parse, ``adapters.batches.ResultLine.doc``). The adapters
        whose decoder starts from the parsed body read ``doc`` instead of parsing ``body`` again;
        the others (this default) decode ``body``."""
        return self.decode(task, body)
