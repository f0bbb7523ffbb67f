"""When2Call: tool calling (when to call a tool, answer, ask, or decline).

Source: Ross et al. 2025, "When2Call: When (not) to Call Tools" (NAACL 2025), NVIDIA, Hugging Face
``nvidia/When2Call`` file ``when2call_test_mcq.jsonl`` (3,652 rows; Apache-2.0 code, data card CC BY
4.0 unverified). The 300-row LLM-judge file ``when2call_test_llm_judge.jsonl`` is a subset with the
same fields. The published index drops 229 ambiguous request_for_info tasks (list not public): pass
an exclusion list of uuids. Metric: accuracy (the reply of the correct category).

Row fields read: ``uuid``, ``question`` (str), ``tools`` (list of JSON-encoded tool schemas, may be
empty), ``answers`` (object with the four categories below), ``correct_answer`` (one category).
State: the tools, then the user's question. One choice among the four candidate replies, whose order
is shuffled per task deterministically from the task id (so ``--limit`` and a full run send
identical bytes); option ids ``A``-``D`` in the shuffled order, the category of each kept in
``meta``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from .rows import DatasetError, field, read_rows
from .task import CHOICE, Option, Question, Task

NAME = "when2call"
CATEGORIES = ("direct", "tool_call", "request_for_info", "cannot_answer")
QUESTION = "Which reply should the assistant give next?"
PATTERNS = (
    "when2call/*mcq*.jsonl",
    "when2call*mcq*.jsonl",
    "when2call/*.jsonl",
    "when2call*.jsonl",
)


def shuffled(task_id: str) -> tuple[str, ...]:
    """The four categories in this task's option order: sorted by sha256 of
    ``"<task_id>:<category>"``."""
    return tuple(
        sorted(CATEGORIES, key=lambda c: hashlib.sha256(f"{task_id}:{c}".encode()).digest())
    )


def render_state(tools: list[str], question: str) -> str:
    """The state shown to the model: each tool schema on its own line, then the user's message."""
    listed = "\n".join(tools) if tools else "(no tools)"
    return f"Tools available to the assistant:\n{listed}\n\nUser: {question}"


def record_to_task(path: Path, n: int, row: dict) -> Task:
    """One MCQ row -> Task; raises DatasetError naming file, row and field."""
    uuid = field(path, n, row, "uuid", str)
    question = field(path, n, row, "question", str)
    tools = field(path, n, row, "tools", list)
    for i, tool in enumerate(tools):
        if not isinstance(tool, str):
            raise DatasetError(path, n, f"tools[{i}]", "expected a JSON-encoded string")
    answers = field(path, n, row, "answers", dict)
    for c in CATEGORIES:
        if not isinstance(answers.get(c), str):
            raise DatasetError(path, n, f"answers.{c}", "missing or not a string")
    correct = field(path, n, row, "correct_answer", str)
    if correct not in CATEGORIES:
        raise DatasetError(
            path, n, "correct_answer", f"{correct!r} is not one of {', '.join(CATEGORIES)}"
        )
    tid = f"{NAME}/{uuid}"
    order = shuffled(tid)
    options = tuple(Option(letter, answers[c]) for letter, c in zip("ABCD", order, strict=True))
    return Task(
        id=tid,
        eval=NAME,
        state=render_state(tools, question),
        questions=(Question("answer", CHOICE, QUESTION, options),),
        gold={"answer": "ABCD"[order.index(correct)]},
        meta={"categories": dict(zip("ABCD", order, strict=True)), "source": row.get("source")},
    )


def numbered(path: Path) -> Iterator[tuple[int, Task]]:
    """Yield ``(row number, Task)`` for each row of ``path`` (JSONL)."""
    for n, row in read_rows(path):
        yield n, record_to_task(path, n, row)


def load(path: Path) -> Iterator[Task]:
    """Yield one Task per row of ``path`` (JSONL)."""
    for _, task in numbered(path):
        yield task
