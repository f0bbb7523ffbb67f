"""The task model shared by every stage (SPEC §3).

A *task* is a state (the text to decide about) plus one or more *questions*, all answered in one
call. A question is a ``choice`` among named options or a ``yes_no`` question. Records are frozen
and slotted; they are built by the loaders in ``evals/`` and never mutated afterwards.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import orjson

CHOICE = "choice"
YES_NO = "yes_no"


@dataclass(frozen=True, slots=True)
class Option:
    """One option of a choice question: ``id`` is what the model picks ("A", "B", ...)."""

    id: str
    text: str


@dataclass(frozen=True, slots=True)
class Question:
    """A question about a task's state.

    ``kind`` is ``"choice"`` (``options`` holds 2-255 options, order meaningful) or ``"yes_no"``
    (``options`` is empty; the answer is "yes" or "no").
    """

    id: str
    kind: str
    text: str
    options: tuple[Option, ...] = ()
    _answer_ids: tuple[str, ...] = field(
        default=(), init=False, repr=False, hash=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "_answer_ids",
            tuple(o.id for o in self.options) if self.kind == CHOICE else ("yes", "no"),
        )

    @property
    def answer_ids(self) -> tuple[str, ...]:
        """The allowed answers: the option ids, or ("yes", "no"); computed once, with the question
        (every reply decoded checks its answer against them)."""
        return self._answer_ids


@dataclass(frozen=True, slots=True)
class Task:
    """One task of one evaluation.

    ``id`` is stable and namespaced by evaluation (``when2call/<uuid>``); ``gold`` maps question id
    to the gold answer (an option id, or "yes"/"no"); ``meta`` holds per-task facts used by reports
    and scoring but never sent to a model (When2Call's option-to-category map, HLE's category, ...).
    """

    id: str
    eval: str
    state: str
    questions: tuple[Question, ...]
    gold: dict[str, str] = field(hash=False, compare=False)
    meta: dict[str, object] = field(default_factory=dict, hash=False, compare=False)
    _digest: str | None = field(default=None, init=False, repr=False, hash=False, compare=False)

    @property
    def digest(self) -> str:
        """sha256 (hex) of everything a model is shown: state, questions and options (not the id,
        which no adapter sends).

        Two tasks with equal digests render to identical requests under one prompt version (the same
        cache key), so the scorer can find a task's cache rows by ``task_digest`` without
        re-encoding, and two tasks that send the same bytes (renamed ids, a repeated question) share
        one row. Computed once per Task (a task is immutable): every row of a task's requests
        carries it, and batch mode stores the rows of up to 20 models for one Task (~50 µs a digest
        for When2Call).
        """
        if self._digest is None:
            object.__setattr__(
                self, "_digest", hashlib.sha256(orjson.dumps(self._shown())).hexdigest()
            )
        return self._digest

    @property
    def id_digest(self) -> str:
        """The digest rows written before ``digest`` left out the id recorded: sha256 of the id and
        what ``digest`` covers. Scoring accepts it for the task with this id, so those rows are
        still found."""
        return hashlib.sha256(orjson.dumps([self.id, *self._shown()])).hexdigest()

    @property
    def headline(self) -> str:
        """The line that stands for this task in a list of tasks (``dxi view``'s evaluation page):
        the first line of the state that is a user's turn (``User: ...``: WildGuardTest's prompt;
        When2Call's message, after its tool listing), else the state's first non-empty line; "" for
        an empty state."""
        lines = [line.strip() for line in self.state.splitlines() if line.strip()]
        return next(
            (line for line in lines if line.startswith("User: ")), lines[0] if lines else ""
        )

    def _shown(self) -> list:
        return [
            self.state,
            [[q.id, q.kind, q.text, [[o.id, o.text] for o in q.options]] for q in self.questions],
        ]
