"""AA-Omniscience-Decision: knowledge and hallucination.

Source: Artificial Analysis Decision Index methodology (``shared/seed``): 500 *private*
AA-Omniscience questions, each a choice among five options, four answers (one correct) and "I don't
know". Metrics: accuracy and non-hallucination rate, 12.5% of the index each.

The published set is not distributed. This loader reads any JSONL file of the same shape, one object
a line: ``question_id`` (str), ``domain`` (str), ``topic`` (str), ``question`` (str), ``answers``
(list of 4 str), ``correct_index`` (int, 0-based). The copy in ``shared/data/omniscience-standin``
is a stand-in built from TruthfulQA (Apache-2.0, 500 rows): results on it are not comparable to
published numbers, and every report says so.

Options: ``A``-``D`` are the four answers in file order, ``E`` is "I don't know".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .rows import DatasetError, field, read_rows
from .task import CHOICE, Option, Question, Task

NAME = "aa_omniscience_decision"
IDK = "E"
IDK_TEXT = "I don't know"
QUESTION = 'Which answer to the question is correct? If you do not know, choose "I don\'t know".'
PATTERNS = ("omniscience*/*.jsonl", "*omniscience*.jsonl", "aa_omniscience*/*.jsonl")
STANDIN_SHA256 = (
    "25a42818e2988fae6de7b5fb56cc22a1c301387c87337d5b510508da4300771b"  # shared/data's, 500 rows
)


def is_stand_in(path: Path, sha256: str) -> bool:
    """Whether a file is a stand-in for the private published set: the shipped one (by content), or
    any file whose name or folder says so (``standin``, ``stand-in``, ``stand_in``)."""
    name = f"{path.parent.name}/{path.name}".lower()
    return sha256 == STANDIN_SHA256 or any(w in name for w in ("standin", "stand-in", "stand_in"))


def provenance_note(stand_in: bool) -> str:
    """What every report says of an Omniscience file (``is_stand_in``)."""
    return "The published Decision Index uses 500 private AA-Omniscience questions; " + (
        "this file is a stand-in of the same shape, so results are not comparable to published numbers."
        if stand_in
        else "this file is not the shipped stand-in: results are comparable to published numbers only if it "
        "is that set."
    )


def record_to_task(path: Path, n: int, row: dict) -> Task:
    """One JSONL row -> Task; raises DatasetError naming file, row and field."""
    qid = field(path, n, row, "question_id", (str, int))
    question = field(path, n, row, "question", str)
    answers = field(path, n, row, "answers", list)
    if len(answers) != 4 or not all(isinstance(a, str) for a in answers):
        raise DatasetError(
            path, n, "answers", f"expected a list of 4 strings, got {len(answers)} items"
        )
    correct = field(path, n, row, "correct_index", int)
    if not 0 <= correct < 4:
        raise DatasetError(path, n, "correct_index", f"expected 0-3, got {correct}")
    options = tuple(Option(letter, text) for letter, text in zip("ABCD", answers, strict=True)) + (
        Option(IDK, IDK_TEXT),
    )
    return Task(
        id=f"{NAME}/{qid}",
        eval=NAME,
        state=question,
        questions=(Question("answer", CHOICE, QUESTION, options),),
        gold={"answer": "ABCD"[correct]},
        meta={
            "domain": field(path, n, row, "domain", str, optional=True),
            "topic": field(path, n, row, "topic", str, optional=True),
        },
    )


def numbered(path: Path) -> Iterator[tuple[int, Task]]:
    """Yield ``(row number, Task)`` for each row of ``path`` (JSONL)."""
    for n, row in read_rows(path):
        yield n, record_to_task(path, n, row)


def load(path: Path) -> Iterator[Task]:
    """Yield one Task per row of ``path`` (JSONL)."""
    for _, task in numbered(path):
        yield task
