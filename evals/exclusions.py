"""Exclusion lists (SPEC §4): plain text, one id per line; ``#`` at the start of a line or after
whitespace starts a comment (so ``q#1`` is an id).

A line is a task id (``when2call/<uuid>``) or ``task_id:question_id`` to drop a single question
(``wildguardtest/17:response_harmful``). A line is matched against each task's id first, then
against ``<task id>:<question id>`` for each of its questions, so task ids that themselves contain
``:`` or ``#`` (``omniscience/q:1``) can be excluded, whole or per question. A list loaded for one
evaluation (``--exclude when2call=FILE``) may also use bare ids (``<uuid>``), which are namespaced
to that evaluation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from .task import Task

_COMMENT = re.compile(r"(?:^|\s)#.*")


@dataclass
class Exclusions:
    """The ids listed (task ids, or ``task_id:question_id``); records which of them matched a
    task."""

    ids: set[str] = field(default_factory=set)
    _matched: set[str] = field(default_factory=set, repr=False)

    @classmethod
    def read(cls, path: Path, eval_name: str | None = None) -> Exclusions:
        """Parse one list; ``eval_name`` namespaces bare ids. Raises FileNotFoundError, ValueError
        (naming file and line) for a malformed line."""
        out = cls()
        out.add_file(path, eval_name)
        return out

    def add_file(self, path: Path, eval_name: str | None = None) -> None:
        """Add the ids of one list file (see ``read``)."""
        for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            line = _COMMENT.sub("", raw).strip()
            if not line:
                continue
            if any(c.isspace() for c in line):
                raise ValueError(f"{path}, line {n}: expected one id per line, got {line!r}")
            if "/" not in line:
                if eval_name is None:
                    raise ValueError(
                        f"{path}, line {n}: {line!r} is not a namespaced task id "
                        "(write <eval>/<id>, or pass the list as --exclude EVAL=FILE)"
                    )
                line = f"{eval_name}/{line}"
            self.ids.add(line)

    def apply(self, tasks: Iterable[Task]) -> Iterator[Task]:
        """Drop excluded tasks and questions; a task left with no question is dropped."""
        if not self.ids:
            yield from tasks
            return
        for t in tasks:
            kept = self.keep(t)
            if kept is not None:
                yield kept

    def keep(self, t: Task) -> Task | None:
        """``t`` less its excluded questions, or None when the task is excluded (or left with no
        question)."""
        ids = self.ids
        if not ids:
            return t
        if t.id in ids:
            self._matched.add(t.id)
            return None
        drop = {q.id for q in t.questions if f"{t.id}:{q.id}" in ids}
        if drop:
            self._matched.update(f"{t.id}:{q}" for q in drop)
            kept = tuple(q for q in t.questions if q.id not in drop)
            if not kept:
                return None
            t = replace(t, questions=kept, gold={k: v for k, v in t.gold.items() if k not in drop})
        return t

    def summary(self, eval_name: str) -> dict[str, int]:
        """Counts for the data block: ids listed for ``eval_name`` and how many matched a task."""
        listed = [i for i in self.ids if i.startswith(f"{eval_name}/")]
        if not listed:
            return {}
        return {"listed": len(listed), "matched": sum(1 for i in listed if i in self._matched)}
