"""Validating decision-model answers and choosing the scored option (SPEC §3, §6, §7).

Every decision-model adapter (System One, embedded, and later OpenAI Decisions and logprobs) turns its
wire format into ``{option: probability}`` or P(yes) and calls one of these two functions.

Rules:
* choice: every option present once (an option named twice is invalid, with the key), no unknown option,
  each probability a finite number in [0, 1] (``NaN`` and ``Infinity`` are refused), summing to 1
  within ``sum_tolerance(n)`` = max(1e-3, n × 5e-5) (servers round to 4 decimals, SPEC §7);
* the scored option is the returned choice when its probability is the highest (ties within the
  servers' rounding, 1e-4, allowed); otherwise the most probable option (the first in option order on a
  tie) is scored and a warning recorded (SPEC §6);
* yes/no: P(yes) a number in [0, 1]; the answer is yes when P(yes) >= 0.5.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dxi.evals import Question

from .base import OK, Answer
from .json_body import duplicates

ROUNDING = 1e-4 + 1e-12  # two values rounded to 4 decimals differ by at most this when truly tied


def sum_tolerance(n_options: int) -> float:
    """How far from 1 the probabilities of ``n_options`` options may sum: max(1e-3, n × 5e-5)."""
    return max(1e-3, n_options * 5e-5)


def _probability(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def choice_answer(question: Question, probabilities: Any, choice: Any = None) -> Answer:
    """Validate one choice answer: ``probabilities`` maps option id -> probability; ``choice`` is the
    option the model returned (None when the format returns none). Returns an ok or invalid Answer."""
    qid = question.id
    if not isinstance(probabilities, Mapping):
        return Answer.invalid(qid, "probabilities: expected an object {option: probability}")
    twice = duplicates(probabilities)
    if twice:
        return Answer.invalid(qid, f"probabilities: duplicate key(s) {', '.join(map(repr, twice))}: the option is "
                                   "named more than once, which value is meant is ambiguous")
    ids = question.answer_ids
    missing = [i for i in ids if i not in probabilities]
    if missing:
        return Answer.invalid(qid, f"probabilities: missing option(s) {', '.join(missing)}")
    unknown = [str(k) for k in probabilities if k not in ids]
    if unknown:
        return Answer.invalid(qid, f"probabilities: unknown option(s) {', '.join(unknown[:5])}")
    probs: list[tuple[str, float]] = []
    for i in ids:
        p = _probability(probabilities[i])
        if p is None:
            return Answer.invalid(qid, f"probabilities.{i}: {probabilities[i]!r} is not a number in [0, 1]")
        probs.append((i, p))
    total = math.fsum(p for _, p in probs)
    if abs(total - 1.0) > sum_tolerance(len(ids)):
        return Answer.invalid(qid, f"probabilities sum to {total:.6f}, not 1 (tolerance {sum_tolerance(len(ids)):g})")
    best = max(p for _, p in probs)
    table = dict(probs)
    warning = None
    if choice in table and table[choice] >= best - ROUNDING:
        predicted = choice
    else:
        predicted = next(i for i, p in probs if p == best)
        warning = (f"returned choice {choice!r} is not the most probable option; scored {predicted}"
                   if choice is not None else None)
    return Answer(qid, OK, predicted=predicted, p_predicted=table[predicted], probabilities=tuple(probs),
                  warning=warning)


def yes_no_answer(question: Question, p_yes: Any) -> Answer:
    """Validate one yes/no answer given P(yes); yes when P(yes) >= 0.5."""
    p = _probability(p_yes)
    if p is None:
        return Answer.invalid(question.id, f"P(yes) {p_yes!r} is not a number in [0, 1]")
    yes = p >= 0.5
    return Answer(question.id, OK, predicted="yes" if yes else "no", p_predicted=p if yes else 1.0 - p,
                  p_yes=p, probabilities=(("yes", p), ("no", 1.0 - p)))
