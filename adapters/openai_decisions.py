"""Decision models in the OpenAI Decisions format: ``POST {base_url}/decisions`` (PROTOCOLS.md §B).

Default base URL https://api.openai.com/v1, ``Authorization: Bearer $OPENAI_API_KEY`` (not needed
for a loopback base URL). Request::

    {"model", "input": <the task's state>, "questions": [
        {"type": "choice", "name": <question id>, "instructions": <question text>,
         "choices": [{"value": <option id>, "description": <option text>}, ...]}   # in option order
      | {"type": "predicate", "name": <question id>, "instructions": <question text>}], **params}

Reply: ``{"model", "answers": [...] in question order, "usage"}``; a choice answer's
``probabilities`` (``[{"value", "probability"}]``) and ``choice``, a predicate's ``probability`` =
P(yes), are validated by ``adapters.decision``. A ``refusal`` answer (the model declined that
question) is invalid; the others are kept. Answers are matched to questions by ``name``, or by
position when a name is absent; a question answered twice, or an option named twice in
``probabilities``, is invalid with the name; ``NaN`` and ``Infinity`` make the answers they touch
invalid; an error body in a 200 is a transient failure. Usage: ``input_tokens`` (of them
``input_tokens_details.cached_tokens`` read from the prompt cache and ``cache_write_tokens`` written
to it, each at its price when the run file gives one, as the ``openai`` adapter's),
``output_tokens`` (``output_tokens_details.reasoning_tokens`` within them).

Model strings: ``openai-decisions:gpt-6-luna``, ``openai-decisions:NAME@http://127.0.0.1:4000/v1``
(LiteLLM).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from dxi.evals import CHOICE, Task

from .base import Answer, Reply, Request
from .decision import choice_answer, yes_no_answer
from .errors import ErrorIn200, MalformedReply
from .http import HTTPAdapter, as_count, load_reply
from .openai import cache_writes_of, cached_of, usage_problem_of
from .provider_errors import body_error

INPUT_DETAILS = "input_tokens_details"  # the openai SDK's types/decision.py Usage


def encode_questions(task: Task) -> list[dict]:
    """The ``questions`` list: one choice (options as ordered ``choices``) or predicate per
    question."""
    out = []
    for q in task.questions:
        if q.kind == CHOICE:
            out.append(
                {
                    "type": "choice",
                    "name": q.id,
                    "instructions": q.text,
                    "choices": [{"value": o.id, "description": o.text} for o in q.options],
                }
            )
        else:
            out.append({"type": "predicate", "name": q.id, "instructions": q.text})
    return out


def decode_decisions(task: Task, body: bytes) -> Reply:
    """Parse a Decisions reply into one validated Answer per question (see the module docstring)."""
    doc = load_reply(body, answers="answers")
    if (error := body_error(doc)) is not None:
        raise ErrorIn200(error, _stated(doc))  # billed: the usage it states (runner.sending.cost)
    if not isinstance(doc, dict) or not isinstance(doc.get("answers"), list):
        raise MalformedReply("reply has no 'answers' list", body[:2000].decode("utf-8", "replace"))
    listed = [a for a in doc["answers"] if isinstance(a, dict)]
    names = Counter(a["name"] for a in listed if isinstance(a.get("name"), str))
    by_name = {a["name"]: a for a in listed if isinstance(a.get("name"), str)}
    parsed = []
    for i, q in enumerate(task.questions):
        a = by_name.get(q.id)
        if a is None and not by_name and i < len(listed):
            a = listed[i]
        want = "choice" if q.kind == CHOICE else "predicate"
        if names[q.id] > 1:
            parsed.append(
                Answer.invalid(
                    q.id,
                    f"the answers name {q.id!r} {names[q.id]} times: which answer is "
                    "meant is ambiguous",
                )
            )
        elif a is None:
            parsed.append(Answer.invalid(q.id, "no answer for this question"))
        elif a.get("type") == "refusal":
            parsed.append(Answer.invalid(q.id, "refusal: the model declined this question"))
        elif a.get("type") != want:
            parsed.append(Answer.invalid(q.id, f"answer type {a.get('type')!r}, expected {want!r}"))
        elif q.kind == CHOICE:
            probs = a.get("probabilities")
            values = (
                [
                    p["value"]
                    for p in probs
                    if isinstance(p, dict) and isinstance(p.get("value"), str)
                ]
                if isinstance(probs, list)
                else []
            )
            twice = sorted(v for v, n in Counter(values).items() if n > 1)
            if twice:
                parsed.append(
                    Answer.invalid(
                        q.id,
                        f"probabilities: option(s) {', '.join(map(repr, twice))} named more "
                        "than once: which probability is meant is ambiguous",
                    )
                )
                continue
            table = (
                {
                    p["value"]: p.get("probability")
                    for p in probs
                    if isinstance(p, dict) and isinstance(p.get("value"), str)
                }
                if isinstance(probs, list)
                else None
            )
            choice = a.get("choice")
            parsed.append(choice_answer(q, table, choice if isinstance(choice, str) else None))
        else:
            parsed.append(yes_no_answer(q, a.get("probability")))
    return replace(_stated(doc) or Reply(()), answers=tuple(parsed))


def _stated(doc: dict) -> Reply | None:
    """The usage (and served model) a Decisions reply states, as a ``Reply`` without answers (None:
    it has no ``usage`` object)."""
    if not isinstance(usage := doc.get("usage"), dict):
        served = doc.get("model") if isinstance(doc.get("model"), str) else None
        return Reply((), served_model=served) if served else None
    return Reply(
        (),
        as_count(usage.get("input_tokens")),
        as_count(usage.get("output_tokens")),
        doc.get("model") if isinstance(doc.get("model"), str) else None,
        cached_input_tokens=cached_of(doc, INPUT_DETAILS),
        cache_write_tokens=cache_writes_of(doc, INPUT_DETAILS),
        usage_problem=usage_problem_of(doc, ("input_tokens", "output_tokens"), INPUT_DETAILS),
    )


class OpenAIDecisions(HTTPAdapter):
    """The OpenAI Decisions format."""

    kind = "openai-decisions"
    takes_params = (
        False  # a decision model: no sampling parameters (``--param`` is for language models)
    )
    default_base_url = "https://api.openai.com/v1"
    path = "/decisions"
    api_key_env = "OPENAI_API_KEY"
    RESERVED = frozenset({"model", "input", "questions"})

    def encode(self, task: Task, sample: int = 0) -> Request:
        return self.request(
            {
                "model": self.model,
                "input": task.state,
                "questions": encode_questions(task),
                **self.params,
            },
            sample,
        )

    def decode(self, task: Task, body: bytes) -> Reply:
        return decode_decisions(task, body)
