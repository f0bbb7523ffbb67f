"""Logprob decisions: any OpenAI-compatible Chat Completions server that returns ``top_logprobs``
becomes a decision model, with a probability for every allowed answer (so calibration metrics apply
to open models).

Each question of a task is its own chat request: ``adapters.llm.LOGPROB_SYSTEM_PROMPT``, then the
state and that one question (``adapters.llm.render(task, [question])``), with ``"logprobs": true``
and the sampling parameters (default ``top_logprobs`` 20, OpenAI's maximum, and a cap of 1 token:
``max_completion_tokens`` for OpenAI's API, its regional hosts and Azure OpenAI
(``adapters.openai.is_openai_host``), where ``max_tokens`` is deprecated and refused by reasoning
models, and for any server when the user gives ``max_completion_tokens``; ``max_tokens`` for every
other server, which llama.cpp, vLLM and Ollama honour).

OpenAI gives ``logprobs`` on a reasoning model only at ``reasoning_effort`` "none" (the API
reference: logprobs, temperature and top_p are available on GPT-5.1 and later at reasoning effort
none; the o-series and GPT-5 before 5.1 have no "none" and give no logprobs): so on an OpenAI or
Azure host, a model that reasons by default (``adapters.openai.reasons_by_default``: ``gpt-6-luna``,
``gpt-6.1-terra``) is sent ``reasoning_effort: "none"`` unless an effort is given (``--effort``, or
the parameter). A model that refuses logprobs so (its 400 names ``logprobs``, ``top_logprobs`` or
``reasoning_effort``) is stopped alone with a message that says it cannot give logprobs and which
models can (``NO_LOGPROBS``; ``NO_LOGPROBS_AT_NONE`` when it refused effort none itself, so that the
message never advises the value just refused). The first generated token's ``top_logprobs`` give the
decision (``adapters.llm.logprob_answer``): the allowed answers' probabilities, renormalised over
them (an answer missing from the top list gets the share the list leaves it, ``llm.absent_share``;
the mass they held is noted in the answer's warning). The server's grammar, if any, plays no part:
its logprobs come before it.

Wire format of one stored request: the request body is the JSON array of the per-question chat
bodies, sent one after another (so a server's prompt cache reuses the shared state prefix); the raw
reply is the JSON array of their reply bodies, in the same order. A task is one cache row, as for
every adapter.

Model strings: ``logprobs:gpt-6-luna`` (https://api.openai.com/v1, ``OPENAI_API_KEY``) or
``logprobs:MODEL@http://127.0.0.1:8080/v1``.
"""

from __future__ import annotations

import orjson

from dxi.evals import Task

from . import llm
from .base import Answer, Limits, ModelSpec, Reply, Request
from .errors import MalformedReply, ProviderStop, Retryable
from .http import HTTPAdapter, load_reply
from .openai import (
    CAPS,
    ReasoningEffort,
    cache_writes_of,
    cached_of,
    choice_of,
    is_openai_host,
    raise_body_error,
    reasons_by_default,
    usage_of,
    usage_problem_of,
)

NONE_EFFORT_MODELS = ("gpt-6-luna", "gpt-6.1-terra")
"""The OpenAI models known to accept ``reasoning_effort`` "none" (and so to give logprobs while
reasoning by default): those whose levels the API reference lists with none. Others may; these are
the ones known."""
_KNOWN = ", ".join(NONE_EFFORT_MODELS)
NO_LOGPROBS = (
    "this model cannot give logprobs with these settings. OpenAI gives logprobs on a "
    "reasoning model only at reasoning_effort none (the models known to accept it: "
    f"{_KNOWN}: --effort none, the default here) and on models that do not reason; the "
    "o-series and gpt-5, gpt-5-mini, gpt-5-nano have no effort none and give none "
    '(docs/models.md, "Logprob decisions")'
)
NO_LOGPROBS_AT_NONE = (
    "this model refused reasoning_effort none, the only effort at which OpenAI "
    "gives a reasoning model's logprobs, so it cannot give logprobs at any "
    f"effort. The models known to accept none: {_KNOWN}; models that do not "
    'reason give logprobs too (docs/models.md, "Logprob decisions")'
)
LOGPROB_FIELDS = ("logprobs", "top_logprobs", "reasoning_effort")


def _top_logprobs(choice: dict) -> list[tuple[str, float]] | None:
    """The first generated token's ``top_logprobs`` as (token, logprob) pairs; None when absent."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return None
    top = content[0].get("top_logprobs")
    if not isinstance(top, list):
        return None
    return [
        (t["token"], t["logprob"])
        for t in top
        if isinstance(t, dict)
        and isinstance(t.get("token"), str)
        and isinstance(t.get("logprob"), (int, float))
    ]


def decode_logprobs(task: Task, body: bytes, n_top: int) -> Reply:
    """Parse the array of per-question Chat Completions replies into one decision per question."""
    docs = load_reply(body)
    if not isinstance(docs, list) or len(docs) != len(task.questions):
        raise MalformedReply(
            f"expected a JSON array of {len(task.questions)} replies",
            body[:2000].decode("utf-8", "replace"),
        )
    answers, tokens_in, tokens_out, cached, written, served = [], 0, 0, 0, 0, None
    problems: list[str] = []
    for q, doc in zip(task.questions, docs, strict=True):
        raise_body_error(doc)
        choice = choice_of(doc, orjson.dumps(doc))
        top = _top_logprobs(choice)
        if top is None:
            answers.append(
                Answer.invalid(
                    q.id,
                    "the reply has no top_logprobs (does the server support "
                    "logprobs and top_logprobs?)",
                )
            )
        else:
            answers.append(llm.logprob_answer(q, top, n_top))
        used_in, used_out = usage_of(doc)
        tokens_in = None if tokens_in is None or used_in is None else tokens_in + used_in
        tokens_out = None if tokens_out is None or used_out is None else tokens_out + used_out
        cached += cached_of(doc) or 0
        written += cache_writes_of(doc) or 0
        problems += [p for p in [usage_problem_of(doc)] if p]
        served = served or (doc.get("model") if isinstance(doc.get("model"), str) else None)
    known = tokens_in is not None
    return Reply(
        tuple(answers),
        tokens_in,
        tokens_out,
        served,
        cached_input_tokens=cached if known else None,
        cache_write_tokens=written if known and written else None,
        usage_problem="; ".join(problems) or None,
    )


class Logprobs(ReasoningEffort, HTTPAdapter):
    """Decisions from an OpenAI-compatible server's first-token ``top_logprobs``."""

    kind = "logprobs"
    default_base_url = "https://api.openai.com/v1"
    path = "/chat/completions"
    api_key_env = "OPENAI_API_KEY"
    DEFAULT_PARAMS = {"top_logprobs": 20}
    RESERVED = frozenset({"model", "messages", "logprobs"})

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        super().__init__(spec, limits)
        top = self.params.get("top_logprobs")
        if not isinstance(top, int) or isinstance(top, bool) or top < 1:
            raise ValueError(f"{self.kind}: top_logprobs must be a positive integer, not {top!r}")
        self.n_top = top
        self._answered: dict[
            str, list[bytes]
        ] = {}  # request key -> replies to its first questions so far

    def default_params(self, model: str, params: dict) -> dict:
        """``top_logprobs`` 20, a cap of one token unless one is given (``max_completion_tokens`` on
        an OpenAI or Azure host, or when the user names that field; else ``max_tokens``: OpenAI's
        API reference: max_tokens "is now deprecated in favor of max_completion_tokens, and is not
        compatible with o-series models"), and on an OpenAI or Azure host ``reasoning_effort``
        "none" for a model that reasons by default."""
        defaults = dict(self.DEFAULT_PARAMS)
        base = self.spec.base_url or self.default_base_url
        hosted = is_openai_host(base)
        if "max_tokens" not in params and "max_completion_tokens" not in params:
            defaults["max_completion_tokens" if hosted else "max_tokens"] = 1
        if hosted and "reasoning_effort" not in params and reasons_by_default(model):
            defaults["reasoning_effort"] = "none"
        return defaults

    def encode(self, task: Task, sample: int = 0) -> Request:
        bodies = [
            {
                "model": self.model,
                "messages": llm.logprob_messages(task, q),
                "logprobs": True,
                **self.params,
            }
            for q in task.questions
        ]
        return self.request(bodies, sample)

    async def post(self, body: bytes, url: str | None = None) -> bytes:
        """As ``HTTPAdapter.post``; a 400 that refuses logprobs (or the effort they need) says so
        (``NO_LOGPROBS``)."""
        try:
            return await super().post(body, url)
        except ProviderStop as exc:
            if exc.status == 400 and _names_logprobs(exc):  # never advise the effort just refused
                at_none = self.params.get("reasoning_effort") == "none"
                advice = NO_LOGPROBS_AT_NONE if at_none else NO_LOGPROBS
                raise ProviderStop(
                    f"{exc} — {advice}",
                    exc.cause,
                    exc.status,
                    exc.resets_in_s,
                    exc.scope,
                    exc.field,
                ) from None
            raise

    async def send(self, request: Request) -> bytes:
        """One request per question, in order. When one fails, the replies already received are kept
        for the retry of this request, which sends only the questions still unanswered (each is paid
        once)."""
        bodies = orjson.loads(request.body)
        replies = self._answered.setdefault(request.key, [])
        try:
            for body in bodies[len(replies) :]:
                replies.append((await self.post(orjson.dumps(body))).strip())
        except Retryable:
            raise  # kept for the retry
        except BaseException:
            del self._answered[request.key]  # no retry will come: forget the partial replies
            raise
        del self._answered[request.key]
        return b"[" + b",".join(replies) + b"]"

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_logprobs(task, body, self.n_top)

    def output_tokens_bound(self, task: Task) -> int | None:
        """``max_completion_tokens`` or ``max_tokens`` (default 1) for each question's request,
        once per choice it asks for (``n``)."""
        cap = llm.token_cap(self.params, *CAPS)
        n = llm.choices(self.params, "n")
        return None if cap is None or n is None else cap * n * len(task.questions)

    def cost_bound_problem(self) -> str | None:
        """A cap below 1, or an ``n`` that is not a positive integer
        (``llm.cost_bound_problem``)."""
        return llm.cost_bound_problem(self.params, CAPS, "n")


def _names_logprobs(stop: ProviderStop) -> bool:
    """Whether a refusal names one of ``LOGPROB_FIELDS``: its ``field`` (OpenAI's ``error.param``),
    else the provider's own words (quoted after the model's label, which itself says "logprobs")."""
    if stop.field:
        return stop.field.split(".")[0] in LOGPROB_FIELDS
    said = str(stop).split(": ", 1)[-1].lower()
    return any(field in said for field in LOGPROB_FIELDS)
