"""Exclusion lists (SPEC §4): plain text, one id per line, ``#`` starts a comment.

A line is a task id (``when2call/<uuid>``) or ``task_id:question_id`` to drop a single question
(``wildguardtest/17:response_harmful``). A list loaded for one evaluation (``--exclude when2call=FILE``)
may also use bare ids (``<uuid>``), which are namespaced to that evaluation.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from .task import Task


@dataclass
class Exclusions:
    """Task ids and (task id, question id) pairs to drop; records which ids matched a task."""

    tasks: set[str] = field(default_factory=set)
    questions: set[tuple[str, str]] = field(default_factory=set)
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
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if any(c.isspace() for c in line):
                raise ValueError(f"{path}, line {n}: expected one id per line, got {line!r}")
            task_id, _, question_id = line.rpartition(":") if ":" in line else (line, "", "")
            if "/" not in task_id:
                if eval_name is None:
                    raise ValueError(f"{path}, line {n}: {task_id!r} is not a namespaced task id "
                                     "(write <eval>/<id>, or pass the list as --exclude EVAL=FILE)")
                task_id = f"{eval_name}/{task_id}"
            if question_id:
                self.questions.add((task_id, question_id))
            else:
                self.tasks.add(task_id)

    def apply(self, tasks: Iterable[Task]) -> Iterator[Task]:
        """Drop excluded tasks and questions; a task left with no question is dropped."""
        if not self.tasks and not self.questions:
            yield from tasks
            return
        for t in tasks:
            if t.id in self.tasks:
                self._matched.add(t.id)
                continue
            drop = {q.id for q in t.questions if (t.id, q.id) in self.questions}
            if drop:
                self._matched.update(f"{t.id}:{q}" for q in drop)
                kept = tuple(q for q in t.questions if q.id not in drop)
                if not kept:
                    continue
                t = replace(t, questions=kept, gold={k: v for k, v in t.gold.items() if k not in drop})
            yield t

    def summary(self, eval_name: str) -> dict[str, int]:
        """Counts for the data block: ids listed for ``eval_name`` and how many matched a task."""
        prefix = f"{eval_name}/"
        listed = [t for t in self.tasks if t.startswith(prefix)]
        listed += [f"{t}:{q}" for t, q in self.questions if t.startswith(prefix)]
        if not listed:
            return {}
        return {"listed": len(listed), "matched": sum(1 for i in listed if i in self._matched)}
