"""Validating decision-model answers and choosing the scored option (SPEC §3, §6, §7).

Every decision-model adapter (embedded, System One, OpenAI Decisions, Gemini Decisions, the logprob
adapters) turns its wire format into ``{option: probability}`` (with the choice it returned, if any)
or P(yes) and calls one of the two functions here: ``choice_answer`` and ``yes_no_answer``. Both
return an ``adapters.base.Answer`` (``ok`` with the scored option, or ``invalid`` with the reason);
neither raises.

Rules:
* choice: every option present once (an option named twice is invalid, with the key), no unknown
  option, each probability a finite number in [0, 1] (``NaN`` and ``Infinity`` are refused), summing
  to 1 within ``sum_tolerance(n)`` = max(1e-3, n × 5e-5) (servers round to 4 decimals, SPEC §7);
* a server that rounds each probability to k decimals (gateways round to two) can sum further from
  1: a reply whose every probability has at most k decimals (1 <= k <= 3; ``decimals``) and whose
  sum is within N × ½ × 10^-k of 1 (each of the N values is at most ½ × 10^-k from the one it
  rounds) is accepted with a ``rounded`` warning (``ROUNDED``); any other sum outside the tolerance
  is invalid;
* the scored option is the option with the highest probability as returned (the seed methodology,
  "Decision models": "We score the option it picks, which is the option it gives the highest
  probability"). No tolerance widens the maximum: 0.3 beats 0.2999. Only an exact tie (equal values
  as the server returned them; servers round, so rounding shows up as exact ties) falls back to the
  returned choice when it is one of the tied options, else to the first tied option in option order
  (SPEC §6). A returned choice that is not the highest is scored as the highest, with a warning;
* yes/no: P(yes) a number in [0, 1]; the answer is yes when P(yes) >= 0.5 (P(yes) = 0.5 is a tie,
  yes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dxi.evals import Question
from dxi.stored import probability

from .base import OK, Answer
from .json_body import duplicates


def sum_tolerance(n_options: int) -> float:
    """How far from 1 the probabilities of ``n_options`` options may sum: max(1e-3, n × 5e-5)."""
    return max(1e-3, n_options * 5e-5)


ROUNDED = "rounded"
"""The first word of the warning on a reply accepted because its probabilities are rounded
(``choice_answer``)."""
MAX_ROUNDED_DECIMALS = 3
"""The most decimals a rounded reply may have (4 decimals is the ordinary tolerance,
``sum_tolerance``)."""
DECIMALS_SLACK = 1e-12


def decimals(values: Sequence[float], most: int = MAX_ROUNDED_DECIMALS) -> int | None:
    """The fewest decimals ``k`` (0..``most``) that every value has at most: ``round(v, k)`` equals
    ``v`` within 1e-12 (a float such as 0.29 is not exactly 29/100, and a JSON ``0.29`` decodes to
    the float ``round(0.29, 2)`` is). None when some value has more than ``most`` decimals."""
    for k in range(most + 1):
        if all(abs(round(v, k) - v) <= DECIMALS_SLACK for v in values):
            return k
    return None


def rounded_tolerance(n_options: int, k: int) -> float:
    """How far from 1 the probabilities of ``n_options`` options rounded to ``k`` decimals may sum:
    N × ½ × 10^-k (each rounded value is at most half a unit of its last decimal from the true
    one)."""
    return n_options * 0.5 * 10.0**-k


def choice_answer(question: Question, probabilities: Any, choice: Any = None) -> Answer:
    """Validate one choice answer and choose the scored option.

    ``probabilities``: the reply's mapping option id -> probability (0-1), as decoded (any type: a
    non-mapping is invalid); ``choice``: the option id the model returned, or None when the format
    returns none (a logprob decision). Returns an ok Answer (``predicted`` the option with the
    highest probability, see the module's rules; ``probabilities`` every option's in the question's
    option order; ``warning`` when the returned choice is not the highest) or an invalid one with
    the reason."""
    qid = question.id
    if not isinstance(probabilities, Mapping):
        return Answer.invalid(qid, "probabilities: expected an object {option: probability}")
    twice = duplicates(probabilities)
    if twice:
        return Answer.invalid(
            qid,
            f"probabilities: duplicate key(s) {', '.join(map(repr, twice))}: the option is "
            "named more than once, which value is meant is ambiguous",
        )
    ids = question.answer_ids
    missing = [i for i in ids if i not in probabilities]
    if missing:
        return Answer.invalid(qid, f"probabilities: missing option(s) {', '.join(missing)}")
    unknown = [str(k) for k in probabilities if k not in ids]
    if unknown:
        return Answer.invalid(qid, f"probabilities: unknown option(s) {', '.join(unknown[:5])}")
    probs: list[tuple[str, float]] = []
    for i in ids:
        p = probability(probabilities[i])
        if p is None:
            return Answer.invalid(
                qid, f"probabilities.{i}: {probabilities[i]!r} is not a number in [0, 1]"
            )
        probs.append((i, p))
    total = math.fsum(p for _, p in probs)
    warnings = []
    if abs(total - 1.0) > sum_tolerance(len(ids)):
        k = decimals([p for _, p in probs])
        within = rounded_tolerance(len(ids), k) if k else None
        if within is None or abs(total - 1.0) > within + DECIMALS_SLACK:
            rounded = f"; rounded to {k} decimals: {within:g}" if within is not None else ""
            return Answer.invalid(
                qid,
                f"probabilities sum to {total:.6f}, not 1 (tolerance "
                f"{sum_tolerance(len(ids)):g}{rounded})",
            )
        warnings.append(
            f"{ROUNDED}: probabilities given to {k} decimals sum to {total:.6f}; "
            f"accepted (within N x 1/2 x 10^-{k} = {within:g} of 1)"
        )
    predicted = pick(probs, choice)
    table = dict(probs)
    if choice is not None and predicted != choice:
        warnings.append(
            f"returned choice {choice!r} is not the most probable option; scored {predicted}"
        )
    warning = "; ".join(warnings) or None
    return Answer(
        qid,
        OK,
        predicted=predicted,
        p_predicted=table[predicted],
        probabilities=tuple(probs),
        warning=warning,
    )


def pick(probabilities: Sequence[tuple[str, float]], choice: Any = None) -> str:
    """The scored option of validated ``(option id, probability)`` pairs in option order: the one
    with the highest probability; on an exact tie (equal floats as returned) ``choice`` when it is
    one of the tied options, else the first tied option in order. ``probabilities`` must not be
    empty."""
    best = max(p for _, p in probabilities)
    tied = [i for i, p in probabilities if p == best]
    return choice if len(tied) > 1 and choice in tied else tied[0]


def yes_no_answer(question: Question, p_yes: Any) -> Answer:
    """Validate one yes/no answer given P(yes); yes when P(yes) >= 0.5."""
    p = probability(p_yes)
    if p is None:
        return Answer.invalid(question.id, f"P(yes) {p_yes!r} is not a number in [0, 1]")
    yes = p >= 0.5
    return Answer(
        question.id,
        OK,
        predicted="yes" if yes else "no",
        p_predicted=p if yes else 1.0 - p,
        p_yes=p,
        probabilities=(("yes", p), ("no", 1.0 - p)),
    )
