"""Language models (SPEC §3 "Language models", §6): the one home of the request and reply logic that
the ``openai``, ``anthropic``, ``gemini``, ``logprobs`` and ``llamacpp`` adapters share; they differ
only in wire format.

Request (part of prompt version ``dxi-prompt-1``, see README "Prompt version"):

* ``SYSTEM_PROMPT``, fixed;
* the user message ``render(task)``: the state, then each question with its id, its text, its
  options (``A. text``, one a line, in task order) and its allowed answers;
* ``answer_schema(task)``: a JSON Schema object with one property per question id, each a string
  with an ``enum`` of the allowed answers (option ids, or "yes"/"no"), every question required,
  ``additionalProperties: false``.

Reply (``decode_text``): the model's text must be one JSON object giving every question one of its
allowed answers. The object wrapped in exactly one Markdown code fence is accepted and marked
``repaired``. A question named twice in the object is invalid, naming the key. Anything else makes
every answer invalid with the reason: a refusal, a reply cut off at the token limit (never repaired;
one cut off before any answer was written has its own reason, ``truncated``), empty content, content
only in a reasoning field, prose around the object, not JSON at all. Within a valid object, a
missing question or a value outside its ``enum`` makes that answer invalid. Answers are never
extracted from prose.

Logprob decisions (``logprob_answer``): one question per request, the model asked for the answer
alone; the first token's ``top_logprobs`` are turned into probabilities over the allowed answers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import orjson

from dxi.evals import CHOICE, Question, Task

from .base import OK, Answer, Reply
from .decision import choice_answer, yes_no_answer
from .errors import MalformedReply
from .json_body import duplicates, load_json

SYSTEM_PROMPT = (
    "You answer questions about a state. The user message gives the state, then one or more questions, "
    "each with its id and its allowed answers. Decide each question and pick exactly one of its allowed "
    "answers. Reply with only a JSON object that maps every question id to the answer you picked, "
    'like {"<question id>": "<allowed answer>"}, and no other text.'
)

LOGPROB_SYSTEM_PROMPT = (
    "You answer a question about a state. The user message gives the state, then the question and its "
    "allowed answers. Reply with exactly one of the allowed answers and nothing else."
)

SCHEMA_NAME = "answers"

# Reasons shared by every wire format (SPEC §6).
TRUNCATED = "cut off at the token limit ({}); a truncated reply is never repaired: raise {} or lower --effort"
TRUNCATED_THINKING = (
    "cut off at the token limit while thinking ({}), before any answer: raise {} or lower --effort"
)
TRUNCATED_EMPTY = (
    "cut off at the token limit ({}) before any answer was written: the reply is empty (a reasoning "
    "model may have spent the limit thinking unseen): raise {} or lower --effort"
)
CUT_OFF_THINKING, CUT_OFF_ANSWER = (
    "thinking",
    "answer",
)  # ``Reply.cut_off``: where the token limit cut the reply
EMPTY = "empty content"
REASONING_ONLY = "content only in a reasoning field, none in the reply"
NOT_JSON = "not a JSON object (prose around it, or not JSON at all)"

_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)


def render_question(q: Question) -> str:
    """One question as text: ``Question "<id>": <text>``, its options, then its allowed answers."""
    lines = [f'Question "{q.id}": {q.text}']
    if q.kind == CHOICE:
        lines.append("Options:")
        lines += [f"{o.id}. {o.text}" for o in q.options]
    lines.append(f"Allowed answers: {', '.join(q.answer_ids)}")
    return "\n".join(lines)


def render(task: Task, questions: Iterable[Question] | None = None) -> str:
    """The user message: ``State:`` and the state, then each question (all of the task's by
    default), separated by blank lines. The state comes first so that requests about one state share
    a prefix."""
    qs = task.questions if questions is None else questions
    return "\n\n".join([f"State:\n{task.state}", *(render_question(q) for q in qs)])


def answer_schema(task: Task) -> dict:
    """The JSON Schema of a reply to ``task``: ``{question_id: one of its allowed answers}``, all
    required, no other property (accepted by OpenAI strict structured outputs, Anthropic tool input
    schemas and Gemini ``responseJsonSchema``)."""
    return {
        "type": "object",
        "properties": {
            q.id: {"type": "string", "enum": list(q.answer_ids)} for q in task.questions
        },
        "required": [q.id for q in task.questions],
        "additionalProperties": False,
    }


def messages(task: Task) -> list[dict]:
    """Chat messages (OpenAI roles) for a structured request: the system prompt, then
    ``render(task)``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": render(task)}]


def logprob_messages(task: Task, question: Question) -> list[dict]:
    """Chat messages for a logprob decision on one ``question``: ``LOGPROB_SYSTEM_PROMPT``, then the
    state and that question alone."""
    return [
        {"role": "system", "content": LOGPROB_SYSTEM_PROMPT},
        {"role": "user", "content": render(task, [question])},
    ]


def token_cap(params: Mapping[str, Any], *names: str) -> int | None:
    """The first of ``names`` in ``params`` that is a non-negative integer (a token cap); None if
    none is."""
    for name in names:
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def choices(params: Mapping[str, Any], name: str) -> int | None:
    """How many replies a request with ``params`` asks for, each billed its own output tokens:
    ``params[name]`` (OpenAI's ``n`` choices, Gemini's ``candidateCount`` candidates; dxi scores
    the first), 1 when absent; None when it is not a positive integer (the provider refuses it, and
    no output bound holds for it)."""
    value = params.get(name, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def cost_bound_problem(
    params: Mapping[str, Any], caps: tuple[str, ...], many: str | None = None
) -> str | None:
    """What in ``params`` no cost bound can hold, naming the parameter (``Adapter``'s
    ``cost_bound_problem``): an output cap among ``caps`` that is not an integer of at least 1 (a
    cap of 0 leaves no room for an answer, and whatever a server writes past it was not reserved),
    or a number of replies ``many`` (``choices``; None: the API has none) that is not a positive
    integer. None: nothing."""
    for name in caps:
        value = params.get(name)
        if name in params and (token_cap(params, name) or 0) < 1:
            return (
                f"{name}={orjson.dumps(value).decode()}: under a cost bound an output cap must be an integer "
                "of at least 1 (the bound reserves the cap's output tokens: below 1 it reserves "
                "none, and leaves no room for an answer)"
            )
    if many is not None and choices(params, many) is None:
        return (
            f"{many}={orjson.dumps(params[many]).decode()}: under a cost bound {many} must be a positive "
            f"integer (the number of replies a request asks for, each billed its output: the bound "
            f"reserves the output cap {many} times)"
        )
    return None


def truncated(stop: str, cap: str, began: bool, thinking: bool) -> tuple[str, str]:
    """``(reason, Reply.cut_off)`` for a reply cut off at the token limit: ``stop`` names the
    provider's signal ("stop_reason max_tokens"), ``cap`` the request field that set the limit
    ("max_tokens"), ``began`` whether an answer had begun (text, or a tool call), ``thinking``
    whether the reply shows thinking (thinking blocks, reasoning text or reasoning tokens).
    ``TRUNCATED`` when an answer had begun, ``TRUNCATED_THINKING`` when the limit was spent thinking
    before any, ``TRUNCATED_EMPTY`` when the reply is empty and shows no thinking (nothing to
    repair, and a different fix). Every reason ends with the hint to raise the cap or lower
    ``--effort``."""
    if began:
        return TRUNCATED.format(stop, cap), CUT_OFF_ANSWER
    if thinking:
        return TRUNCATED_THINKING.format(stop, cap), CUT_OFF_THINKING
    return TRUNCATED_EMPTY.format(stop, cap), CUT_OFF_ANSWER


def invalid_reply(
    task: Task,
    reason: str,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    served_model: str | None = None,
    cached_input_tokens: int | None = None,
    cache_write_tokens: int | None = None,
    cache_write_1h_tokens: int | None = None,
    cut_off: str | None = None,
    usage_problem: str | None = None,
) -> Reply:
    """A reply whose every answer is invalid for the same ``reason`` (usage, ``cut_off`` and
    ``usage_problem`` as in ``Reply``)."""
    return Reply(
        tuple(Answer.invalid(q.id, reason) for q in task.questions),
        input_tokens,
        output_tokens,
        served_model,
        cached_input_tokens=cached_input_tokens,
        cache_write_tokens=cache_write_tokens,
        cache_write_1h_tokens=cache_write_1h_tokens,
        cut_off=cut_off,
        usage_problem=usage_problem,
    )


def answers_from_object(task: Task, obj: Any) -> tuple[Answer, ...]:
    """Validate a parsed reply object against ``answer_schema(task)``: one Answer per question,
    invalid where the question is missing, answered twice (a duplicate key) or its value is not one
    of the allowed answers. Unexpected keys are noted as a warning on every answer."""
    questions = task.questions
    if type(obj) is dict:  # (a plain dict named no key twice: ``load_json`` marks one that did)
        twice: tuple[str, ...] = ()
    elif isinstance(obj, Mapping):
        twice = duplicates(obj)
    else:
        return tuple(
            Answer.invalid(q.id, f"the reply is JSON but not an object ({type(obj).__name__})")
            for q in questions
        )
    ids = {q.id for q in questions}
    extra = [str(k) for k in obj if k not in ids]
    warning = f"unexpected key(s) in the reply: {', '.join(extra[:5])}" if extra else None
    out = []
    for q in questions:
        if q.id in twice:
            out.append(
                Answer.invalid(
                    q.id,
                    f"duplicate key {q.id!r} in the reply: the question is answered more "
                    "than once, which answer is meant is ambiguous",
                )
            )
            continue
        value = obj.get(q.id, _MISSING)
        if value is _MISSING:
            out.append(Answer.invalid(q.id, "missing from the reply"))
        elif type(value) is str and value in q.answer_ids:
            out.append(Answer(q.id, OK, predicted=value, warning=warning))
        else:
            shown = orjson.dumps(value).decode()[:60]
            out.append(
                Answer.invalid(
                    q.id, f"{shown} is not one of the allowed answers ({', '.join(q.answer_ids)})"
                )
            )
    return tuple(out)


_MISSING = object()


def parse_object(text: str) -> tuple[Any, bool, str | None]:
    """``(object, repaired, None)`` for a reply text that is one JSON value, possibly wrapped in
    exactly one Markdown code fence (then ``repaired`` is True); ``(None, False, reason)``
    otherwise."""
    stripped = text.strip()
    try:
        return load_json(stripped), False, None
    except MalformedReply:
        pass
    fenced = _FENCE.fullmatch(stripped)
    if fenced is None or "```" in fenced.group(1):
        return None, False, NOT_JSON
    try:
        return load_json(fenced.group(1)), True, None
    except MalformedReply:
        return None, False, "the Markdown code fence does not hold valid JSON"


def decode_text(
    task: Task,
    text: str | None,
    *,
    problem: str | None = None,
    reasoning: bool = False,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    served_model: str | None = None,
    cached_input_tokens: int | None = None,
    cache_write_tokens: int | None = None,
    cache_write_1h_tokens: int | None = None,
    cut_off: str | None = None,
    usage_problem: str | None = None,
) -> Reply:
    """The Reply for a language model's reply ``text``.

    ``problem`` is a whole-reply reason the wire format already established (a refusal, a reply cut
    off at the token limit, a safety block): every answer is then invalid with it, whatever the
    text. ``reasoning`` says a reasoning field had content (an empty ``text`` is then "content only
    in a reasoning field"). Token counts and ``usage_problem`` (as in ``Reply``), the served model
    name and ``cut_off`` (where the token limit cut the reply, with ``problem`` from ``truncated``)
    are passed through.
    """
    usage = (input_tokens, output_tokens, served_model)
    cache = {
        "cached_input_tokens": cached_input_tokens,
        "cache_write_tokens": cache_write_tokens,
        "cache_write_1h_tokens": cache_write_1h_tokens,
        "cut_off": cut_off,
        "usage_problem": usage_problem,
    }
    if problem is None and (text is None or not text.strip()):
        problem = REASONING_ONLY if reasoning else EMPTY
    if problem is not None:
        return invalid_reply(task, problem, *usage, **cache)
    obj, repaired, reason = parse_object(text)
    if reason is not None:
        return invalid_reply(task, reason, *usage, **cache)
    return Reply(answers_from_object(task, obj), *usage, repaired=repaired, **cache)


def logprob_answer(question: Question, top: Iterable[tuple[str, float]], n_top: int) -> Answer:
    """A decision from the first token's top log-probabilities ``top`` (``(token, logprob)`` pairs).

    A token counts for an allowed answer when, stripped of surrounding whitespace, it equals the
    option id (exactly: "A", never "a"), or for yes/no questions "yes"/"no" in any case.
    Probabilities of tokens counting for the same answer are added. An allowed answer that no listed
    token counts for is not given 0 (the list only says it was not among the top ``n_top``): it is
    assumed to hold ``absent_share``, the largest equal share the list leaves each absent answer
    (never more than the least probable listed token, which it ranked below, nor together more than
    the probability the list leaves unlisted). The allowed answers' probabilities are then
    renormalised to sum to 1; the mass the listed ones held before, and the share assumed for absent
    ones, are noted in the warning. Invalid when no allowed answer is among the top tokens, or a
    value is not a log-probability (a number at most 0; -inf is probability 0, which a listed token
    keeps).
    """
    ids = question.answer_ids
    mass = dict.fromkeys(ids, 0.0)
    listed: list[float] = []
    seen: set[str] = set()
    for token, logprob in top:
        if (
            isinstance(logprob, bool)
            or not isinstance(logprob, (int, float))
            or not -math.inf <= logprob <= 1e-6
        ):
            return Answer.invalid(
                question.id,
                f"top_logprobs: {logprob!r} for token {token!r} is not a log-probability",
            )
        p = math.exp(min(logprob, 0.0))
        listed.append(p)
        key = token.strip()
        if question.kind != CHOICE:
            key = key.lower()
        if key in mass:
            mass[key] += p
            seen.add(key)
    held = math.fsum(mass.values())
    if held <= 0.0:
        return Answer.invalid(
            question.id,
            f"none of the allowed answers ({', '.join(ids)}) is among the top {n_top} first tokens",
        )
    note = f"renormalised over the allowed answers, which held {held:.4f} of the first token's probability"
    absent = [i for i in ids if i not in seen]
    if absent:
        share = absent_share(listed, len(absent))
        for i in absent:
            mass[i] = share
        note += (
            f"; {len(absent)} absent from the top {len(listed)} ({', '.join(absent)}), each assumed to hold "
            f"{share:.3g}"
        )
    total = math.fsum(mass.values())
    if question.kind == CHOICE:
        answer = choice_answer(question, {i: p / total for i, p in mass.items()})
    else:
        answer = yes_no_answer(question, mass["yes"] / total)
    return replace(answer, warning=note)


def absent_share(listed: list[float], n_absent: int) -> float:
    """The probability assumed for each of ``n_absent`` allowed answers missing from a top-logprobs
    list whose tokens have probabilities ``listed``: ``min(min(listed), max(0, 1 - sum(listed)) /
    n_absent)``. A token missing from a top list ranked below every listed one, so held at most the
    least listed probability; all missing tokens together held what the list leaves,
    ``1 - sum(listed)``. The share is the largest that keeps both bounds for every absent answer
    alike: 0 only when the list leaves nothing."""
    left = max(0.0, 1.0 - math.fsum(listed))
    return min(min(listed), left / n_absent)
