"""Logprob decisions: any OpenAI-compatible Chat Completions server that returns ``top_logprobs`` becomes a
decision model, with a probability for every allowed answer (so calibration metrics apply to open models).

Each question of a task is its own chat request: ``adapters.llm.LOGPROB_SYSTEM_PROMPT``, then the state and
that one question (``adapters.llm.render(task, [question])``), with ``"logprobs": true`` and the sampling
parameters (default ``top_logprobs`` 20, OpenAI's maximum, and a cap of 1 token: ``max_completion_tokens``
for OpenAI's own API, where ``max_tokens`` is deprecated and refused by reasoning models, and ``max_tokens``
for every other server, which llama.cpp, vLLM and Ollama honour). The first generated token's
``top_logprobs`` give the decision (``adapters.llm.logprob_answer``): the allowed answers' probabilities,
renormalised over them (an answer missing from the top list gets the share the list leaves it,
``llm.absent_share``; the mass they held is noted in the answer's warning).
The server's grammar, if any, plays no part: its logprobs come before it.

Wire format of one stored request: the request body is the JSON array of the per-question chat bodies,
sent one after another (so a server's prompt cache reuses the shared state prefix); the raw reply is the
JSON array of their reply bodies, in the same order. A task is one cache row, as for every adapter.

Model strings: ``logprobs:MODEL`` (https://api.openai.com/v1, ``OPENAI_API_KEY``) or
``logprobs:MODEL@http://127.0.0.1:8080/v1``.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import orjson

from dxi.evals import Task

from . import llm
from .base import Answer, Limits, ModelSpec, Reply, Request, canonical_params
from .errors import MalformedReply, Retryable
from .http import HTTPAdapter, load_json
from .openai import cache_writes_of, cached_of, choice_of, raise_body_error, usage_of

OPENAI_HOST = "api.openai.com"


def _top_logprobs(choice: dict) -> list[tuple[str, float]] | None:
    """The first generated token's ``top_logprobs`` as (token, logprob) pairs; None when absent."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return None
    top = content[0].get("top_logprobs")
    if not isinstance(top, list):
        return None
    return [(t["token"], t["logprob"]) for t in top
            if isinstance(t, dict) and isinstance(t.get("token"), str) and isinstance(t.get("logprob"), (int, float))]


def decode_logprobs(task: Task, body: bytes, n_top: int) -> Reply:
    """Parse the array of per-question Chat Completions replies into one decision per question."""
    docs = load_json(body)
    if not isinstance(docs, list) or len(docs) != len(task.questions):
        raise MalformedReply(f"expected a JSON array of {len(task.questions)} replies",
                             body[:2000].decode("utf-8", "replace"))
    answers, tokens_in, tokens_out, cached, written, served = [], 0, 0, 0, 0, None
    for q, doc in zip(task.questions, docs, strict=True):
        raise_body_error(doc)
        choice = choice_of(doc, orjson.dumps(doc))
        top = _top_logprobs(choice)
        if top is None:
            answers.append(Answer.invalid(q.id, "the reply has no top_logprobs (does the server support "
                                                "logprobs and top_logprobs?)"))
        else:
            answers.append(llm.logprob_answer(q, top, n_top))
        used_in, used_out = usage_of(doc)
        tokens_in = None if tokens_in is None or used_in is None else tokens_in + used_in
        tokens_out = None if tokens_out is None or used_out is None else tokens_out + used_out
        cached += cached_of(doc) or 0
        written += cache_writes_of(doc) or 0
        served = served or (doc.get("model") if isinstance(doc.get("model"), str) else None)
    known = tokens_in is not None
    return Reply(tuple(answers), tokens_in, tokens_out, served, cached_input_tokens=cached if known else None,
                 cache_write_tokens=written if known and written else None)


class Logprobs(HTTPAdapter):
    """Decisions from an OpenAI-compatible server's first-token ``top_logprobs``."""

    kind = "logprobs"
    default_base_url = "https://api.openai.com/v1"
    path = "/chat/completions"
    api_key_env = "OPENAI_API_KEY"
    DEFAULT_PARAMS = {"max_tokens": 1, "top_logprobs": 20}
    RESERVED = frozenset({"model", "messages", "logprobs"})

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        super().__init__(spec, limits)
        if urlsplit(self.base_url).hostname == OPENAI_HOST and "max_tokens" not in spec.params:
            # OpenAI's API: max_tokens "is now deprecated in favor of max_completion_tokens, and is not compatible
            # with o-series models" (API reference, Create chat completion)
            cap = self.params.pop("max_tokens")
            self.params = canonical_params({**self.params, "max_completion_tokens": self.params.get("max_completion_tokens", cap)})
        top = self.params.get("top_logprobs")
        if not isinstance(top, int) or isinstance(top, bool) or top < 1:
            raise ValueError(f"{self.kind}: top_logprobs must be a positive integer, not {top!r}")
        self.n_top = top
        self._answered: dict[str, list[bytes]] = {}  # request key -> replies to its first questions so far

    def encode(self, task: Task, sample: int = 0) -> Request:
        bodies = [{"model": self.model, "messages": llm.logprob_messages(task, q), "logprobs": True, **self.params}
                  for q in task.questions]
        return self.request(bodies, sample)

    async def send(self, request: Request) -> bytes:
        """One request per question, in order. When one fails, the replies already received are kept for
        the retry of this request, which sends only the questions still unanswered (each is paid once)."""
        bodies = orjson.loads(request.body)
        replies = self._answered.setdefault(request.key, [])
        try:
            for body in bodies[len(replies):]:
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
        """``max_completion_tokens`` or ``max_tokens`` (default 1) for each question's request."""
        cap = llm.token_cap(self.params, "max_completion_tokens", "max_tokens")
        return None if cap is None else cap * len(task.questions)
