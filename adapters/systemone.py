"""System One decision models: ``POST {base_url}/v1/systemone`` (Strands Decider, sparrow-decider
serve, LiteLLM proxy). Wire format: ``shared/PROTOCOLS.md`` §A.

Request: ``{"model", "state", "questions": {question_id: question}}``; a choice question is
``{"type": "choice", "instructions", "criteria": {option_id: option_text}}`` (ordered as the
options), a yes/no question ``{"type": "noul", "instructions"}``. Reply: ``{"model", "answers":
{question_id: answer}, "usage", "latency_ms"}`` with ``{"type": "choice", "choice", "probabilities":
{option: p}}`` or ``{"type": "noul", "noul": P(yes)}``.

Question types: a server that answers only some question types (a yes/no-only decider) says so in
its ``GET /health`` reply, ``"question_types": ["noul"]`` (the wire format's type names; ``choice``,
``noul``, ``score``). dxi reads it at start; a request asking a type the server does not list is not
sent and is the request's deterministic failure (``Fatal``: stored, kept on reruns, counted as
failed), with a message naming what the server answers (``unsupported``). So such a model runs the
evaluations it can (here WildGuardTest's yes/no questions) and the others say why they have no
figures; ``--evals wildguardtest`` runs only what it can. A server that lists nothing is asked every
type (its 422 for a type it lacks is then that request's deterministic failure, with its own
message).

Model strings: ``systemone:http://127.0.0.1:8000`` (the server's reported name identifies the
model), ``systemone:NAME@http://host:port`` or ``systemone:NAME`` (default URL
http://127.0.0.1:8000). The environment variable ``SYSTEMONE_API_KEY``, when set, is sent as a
Bearer token (LiteLLM).
"""

from __future__ import annotations

import os

import aiohttp
import orjson
import yarl

from dxi.evals import CHOICE, Task
from dxi.served import served_by_other
from dxi.shown import shown

from . import http
from .base import Adapter, Answer, Limits, ModelSpec, Reply, Request
from .decision import choice_answer, yes_no_answer
from .errors import SERVED, UNREACHABLE, ErrorIn200, Fatal, MalformedReply, ProviderStop
from .http import as_count, not_counts
from .json_body import duplicates, load_reply
from .provider_errors import body_error

DEFAULT_URL = "http://127.0.0.1:8000"
ENDPOINT = "/v1/systemone"
API_KEY_ENV = "SYSTEMONE_API_KEY"


def encode_questions(task: Task) -> dict:
    """The ``questions`` map keyed by question id: a choice is ``{"type": "choice", "instructions",
    "criteria": {option_id: option_text}}`` (ordered as the options), a yes/no question
    ``{"type": "noul", "instructions"}``. System One's and the Gemini Decisions API's
    (``adapters.gemini_decisions``) alike."""
    questions = {}
    for q in task.questions:
        if q.kind == CHOICE:
            questions[q.id] = {
                "type": "choice",
                "instructions": q.text,
                "criteria": {o.id: o.text for o in q.options},
            }
        else:
            questions[q.id] = {"type": "noul", "instructions": q.text}
    return questions


def encode_body(task: Task, model: str) -> bytes:
    """The System One request body for ``task``: options become ordered ``criteria``."""
    return orjson.dumps({"model": model, "state": task.state, "questions": encode_questions(task)})


QUESTION_TYPES = ("choice", "noul", "score")
"""The System One question types (``shared/PROTOCOLS.md`` §A)."""


def question_types(health: object) -> frozenset[str] | None:
    """The question types a server's ``GET /health`` reply declares it answers
    (``"question_types"``: a list of type names), or None when it declares none (every type is
    asked)."""
    declared = health.get("question_types") if isinstance(health, dict) else None
    if not isinstance(declared, list):
        return None
    return frozenset(t for t in declared if isinstance(t, str))


def unsupported(body: bytes, answered: frozenset[str] | None, where: str) -> str | None:
    """Why a request (its System One ``body``) is not sent to a server that answers only
    ``answered`` question types (None: every type, never refused), or None when it asks nothing
    else."""
    if answered is None:
        return None
    asked = {q.get("type") for q in orjson.loads(body)["questions"].values() if isinstance(q, dict)}
    missing = sorted(str(t) for t in asked - answered)
    if not missing:
        return None
    types = ", ".join(sorted(answered)) or "no"
    kind = "a choice among options" if missing == ["choice"] else "questions it does not answer"
    return (
        f"not sent: the System One server at {where} answers {types} questions "
        f"only (its /health question_types), and this task asks {', '.join(missing)} "
        f"({kind}); run it with --evals naming the evaluations it can answer (yes/no "
        "questions: wildguardtest)"
    )


def _text(body: bytes) -> str:
    return body[:2000].decode("utf-8", "replace")


def decode_body(task: Task, body: bytes) -> Reply:
    """Parse a System One reply; raises MalformedReply when it is not a JSON object with
    ``answers``, and ErrorIn200 when it is an error body. A missing, duplicated or malformed answer
    to one question makes that answer invalid, with the reason (``NaN``/``Infinity`` too:
    ``adapters.decision``)."""
    doc = load_reply(body, answers="answers")
    if (error := body_error(doc)) is not None:
        usage = Reply((), **_stated(doc)) if isinstance(doc.get("usage"), dict) else None
        raise ErrorIn200(error, usage)  # billed: the usage it states (runner.sending.cost)
    if not isinstance(doc, dict) or not isinstance(doc.get("answers"), dict):
        raise MalformedReply("reply has no 'answers' object", _text(body))
    parsed = decode_answers(task, doc["answers"])
    return Reply(parsed, **_stated(doc))


def _stated(doc: dict) -> dict:
    """The usage and served model a System One reply states (a count left out: None)."""
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    counts = ("input_tokens", "output_tokens")
    stated_in, stated_out = (
        as_count(usage.get("input_tokens")),
        as_count(usage.get("output_tokens")),
    )
    # both counts read: nothing for not_counts to name (looked for only when one is not)
    problem = (
        None
        if stated_in is not None and stated_out is not None
        else not_counts(usage, counts, "usage")
    )
    return {
        "input_tokens": stated_in,
        "output_tokens": stated_out,
        "served_model": doc.get("model") if isinstance(doc.get("model"), str) else None,
        "usage_problem": "; ".join(problem) if problem else None,
    }


def decode_answers(task: Task, answers: dict) -> tuple[Answer, ...]:
    """One validated Answer per question of ``task`` from an ``answers`` map keyed by question id
    (System One's, the Gemini Decisions API's): ``{"type": "choice", "choice", "probabilities":
    {option: p}}`` or ``{"type":     "noul", "noul": P(yes)}`` (``adapters.decision``). A question
    missing, answered twice (a duplicate key) or answered with another type is invalid, with the
    reason."""
    twice = set(duplicates(answers))
    parsed = []
    for q in task.questions:
        a = answers.get(q.id)
        want = "choice" if q.kind == CHOICE else "noul"
        if q.id in twice:
            parsed.append(
                Answer.invalid(
                    q.id,
                    f"duplicate key {q.id!r} in answers: the question is answered more "
                    "than once, which answer is meant is ambiguous",
                )
            )
        elif not isinstance(a, dict):
            parsed.append(Answer.invalid(q.id, "no answer for this question"))
        elif a.get("type", want) != want:
            parsed.append(Answer.invalid(q.id, f"answer type {a.get('type')!r}, expected {want!r}"))
        elif q.kind == CHOICE:
            parsed.append(choice_answer(q, a.get("probabilities"), a.get("choice")))
        else:
            parsed.append(yes_no_answer(q, a.get("noul")))
    return tuple(parsed)


class SystemOne(Adapter):
    """A System One server over aiohttp. ``start`` asks ``GET /health`` for the model the server
    serves: it becomes the model name when the model string names none; a named model the server
    does not serve stops the provider (ProviderStop, cause ``SERVED``: the run's other providers go
    on) rather than scoring another model under its name, and so does a reply, later, that names
    another model (``check_served``: the server was restarted with another). An
    unreachable server fails with a clear message. The cache key's endpoint is the full URL (base
    URL included), as for the hosted adapters: one model name on two servers never shares cache
    rows."""

    kind = "systemone"
    own_timeout = True  # the session's read timeout is the attempt timeout
    OWN_PROMPT = True  # the server's prompt template wraps the questions (Strands Decider's)

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        super().__init__(spec, limits)
        base = (spec.base_url or DEFAULT_URL).rstrip("/")
        self.base_url = base.removesuffix(ENDPOINT)
        self._url = yarl.URL(self.base_url + ENDPOINT)  # parsed once, not per request
        self._session: aiohttp.ClientSession | None = None
        key = os.environ.get(API_KEY_ENV)
        self._headers = {"Content-Type": "application/json"} | (
            {"Authorization": f"Bearer {key}"} if key else {}
        )
        self._secrets = http.secrets_in(self._headers)
        # the question types GET /health declares the server answers (None: it declares none)
        self.question_types: frozenset[str] | None = None

    @property
    def limits_key(self) -> str:
        return f"{self.kind}@{self.base_url}"

    @property
    def endpoint(self) -> str:  # type: ignore[override]
        return self.base_url + ENDPOINT

    async def check_reachable(self) -> None:
        """A connection opened and closed (``http.check_reachable``), then ``GET /health``: a
        ProviderStop when the server cannot be reached, or serves another model than the one named
        (cause ``SERVED``, as ``start`` would stop it). Nothing is sent to ``/v1/systemone``."""
        await http.check_reachable(self.base_url, self.label)
        if self.model:
            try:
                await self.start()
            except Fatal:  # a server that answers /health oddly: `dxi run` says so when it starts
                return
            await self.close()

    async def start(self) -> None:
        self._session = http.session(self.limits.max_in_flight, self.limits.attempt_timeout_s)
        url = f"{self.base_url}/health"
        try:
            async with self._session.get(url, headers=self._headers, allow_redirects=False) as resp:
                status, headers = resp.status, resp.headers
                doc = orjson.loads(await resp.read()) if status == 200 else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            await self.close()
            message = (
                f"cannot reach the System One server at {self.base_url} ({type(exc).__name__}: "
                f"{exc}); is it running? e.g. sparrow-decider serve --port 8000"
            )
            if isinstance(
                exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
            ):  # no connection
                raise ProviderStop(message, UNREACHABLE) from None
            raise Fatal(message) from None
        except orjson.JSONDecodeError:
            doc = None
        self.question_types = question_types(doc)
        served = doc.get("model") if isinstance(doc, dict) else None
        served = served if isinstance(served, str) and served else None
        if self.model:
            # A server that reports one model answers with it whatever the request names
            # (sparrow-decider serve ignores the request's model): another name would file its
            # answers under the wrong model. A proxy serving many models (LiteLLM) reports none
            # here, and is trusted until a reply names another model (check_served).
            if served_by_other(self.kind, self.model, served):
                await self.close()
                raise ProviderStop(
                    f"the System One server at {self.base_url} serves {served!r}, not {self.model!r}; "
                    f"name the model it serves (systemone:{served}@{self.base_url}) or leave the name out",
                    SERVED,
                )
            return
        if served is None:
            await self.close()
            if 300 <= status < 400:  # the name is not looked for elsewhere: the key is not followed
                raise http.redirected(status, headers, url, self._secrets)
            answered = "" if status == 200 else f" (it answered HTTP {status})"
            raise Fatal(
                f"{url} did not report a model name{answered}; name the model in the model "
                f"string: systemone:NAME@{self.base_url}"
            )
        if shown(served) != served:  # the name is printed and written to the cache and outputs
            await self.close()
            raise Fatal(
                f"{url} reported the model name '{shown(served)}', which holds a control character "
                "(ESC, a line break, a bidirectional override: shown escaped here); name the model "
                f"in the model string: systemone:NAME@{self.base_url}"
            )
        self.model = served

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def encode(self, task: Task, sample: int = 0) -> Request:
        return Request(
            self.kind,
            self.model,
            self.endpoint,
            encode_body(task, self.model),
            sample,
            self.params_key,
        )

    async def send(self, request: Request) -> bytes:
        if self._session is None:
            raise RuntimeError("SystemOne.send() before start()")
        refused = unsupported(request.body, self.question_types, self.base_url)
        if refused is not None:
            raise Fatal(refused)
        return await http.post(
            self._session,
            self._url,
            request.body,
            self._headers,
            self.label,
            secrets=self._secrets,
            max_bytes=self.limits.max_reply_bytes,
        )

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_body(task, body)

    def check_served(self, reply: Reply) -> None:
        """A reply that names another model than the one this run asks for (named in the model
        string, or by ``GET /health`` at start; compared exactly, as at start) is not its answer:
        the server changed model since the run started (restarted with another). ProviderStop (cause
        ``SERVED``): the provider stops, as it would have at start, and the reply is not stored. A
        reply that names no model is taken as the model asked for. The rule is
        ``dxi.served.served_by_other``, by which the cache also sets aside such a reply that an
        older dxi stored."""
        served = reply.served_model
        if served_by_other(self.kind, self.model, served):
            raise ProviderStop(
                f"the System One server at {self.base_url} answered as {served!r}, not {self.model!r} "
                "as asked: another model serves there now (was the server restarted with another "
                f"model?); that reply is not {self.model}'s answer and is not stored. Serve "
                f"{self.model} there again and rerun (the next run sends what is missing), or run the "
                f"model it serves under its own name (systemone:{served}@{self.base_url})",
                SERVED,
            )

    def output_tokens_bound(self, task: Task) -> int | None:
        """System One servers count one output token per question (Strands Decider; sparrow reports
        0): ``shared/PROTOCOLS.md`` §A."""
        return len(task.questions)
