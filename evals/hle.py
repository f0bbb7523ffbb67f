"""HLE-MultiChoice: reasoning.

Source: Humanity's Last Exam (Phan et al. 2025, arXiv:2501.14249), Hugging Face ``cais/hle``, test
split, 2,500 rows, MIT, gated. The Decision Index keeps the text-only multiple-choice questions
(``answer_type == "multipleChoice"`` and no image): 513 rows. Each is one choice among its lettered
answers in their original order; metric: exact match on the letter.

Two row shapes are read (JSONL, JSON list or Parquet):

* the original ``cais/hle`` row: ``id``, ``question`` (body, then an "Answer Choices:" block of
  lines ``A. text``), ``answer`` (letter), ``answer_type``, ``image`` (empty when none),
  ``category``; rows that are not text-only multipleChoice are skipped;
* the pre-split row of ``shared/data/hle/hle_mcqa.json``: ``id``, ``question`` (body only),
  ``choices`` (list of ``[letter, text]``), ``answer``, ``category``.

Option ids are HLE's own letters (A-Z; 5 to 26 options here). Choice parsing (``split_choices``)
accepts a new choice only at the next letter, with the delimiter the block uses, at the start of a
line, so a line starting "I think..." or "Q: ..." inside a choice stays part of it; a block it
cannot read unambiguously is a DatasetError naming the row.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from .rows import DatasetError, field, read_rows
from .task import CHOICE, Option, Question, Task

NAME = "hle_multichoice"
QUESTION = "Which answer choice is correct?"
PATTERNS = ("hle/*.json", "hle/*.jsonl", "hle/*.parquet", "hle*.json", "hle*.jsonl", "hle*.parquet")
# cais/hle's own marker, as written there (the split files were made by splitting at "Answer
# Choices:\n"); a lowercase "answer choices:" is text (choices say "None of the other answer choices
# are correct")
_MARKER = re.compile(r"Answer Choices[ \t]*:")
_CHOICE_LINE = re.compile(r"[ \t]*([A-Z])[ \t]*([.):])(?:[ \t]|$)(.*)", re.DOTALL)


def split_choices(path: Path, n: int, text: str) -> tuple[str, list[tuple[str, str]]]:
    """Split an original HLE question into ``(body, [(letter, text), ...])``.

    The block after the last "Answer Choices:" (in that case: a lowercase "answer choices:" is text)
    is read with the delimiter its first line uses (``A.``, ``A)`` or ``A:``): a choice starts at a
    line holding the next letter (A, B, C, ... in turn) and that delimiter; every other line, blank
    ones included, belongs to the choice before it, so a choice's text is kept whole (``P: ...``
    lines inside a block lettered ``A.``, as in row ``67219b2486e95ac1054387bc``). Raises
    DatasetError (field ``question``) when there is no such block, when it does not start at "A",
    when fewer than two choices are found, and when the block cannot be read unambiguously: a line
    with the block's delimiter but another letter than the next one (a skipped letter, A, B, D, ...;
    or a line of a choice's text that reads as a choice).
    """
    marks = list(_MARKER.finditer(text))
    if not marks:
        raise DatasetError(
            path, n, "question", "multipleChoice question without an 'Answer Choices:' block"
        )
    body, block = text[: marks[-1].start()].strip(), text[marks[-1].end() :]
    choices: list[tuple[str, list[str]]] = []
    delimiter = None
    for line in block.split("\n"):
        m = _CHOICE_LINE.fullmatch(line)
        if not choices:
            if not line.strip():
                continue
            if not m or m.group(1) != "A":
                raise DatasetError(
                    path,
                    n,
                    "question",
                    f"the Answer Choices block does not start with choice 'A': {line[:60]!r}",
                )
            delimiter = m.group(2)
        elif m and m.group(2) == delimiter:
            expected = chr(ord(choices[-1][0]) + 1)
            if m.group(1) != expected:
                raise DatasetError(
                    path,
                    n,
                    "question",
                    f"ambiguous Answer Choices block: after choice "
                    f"{choices[-1][0]!r} a line reads as choice {m.group(1)!r} ({line[:60]!r}), "
                    f"expected {expected!r} or more text of {choices[-1][0]!r}",
                )
        else:
            choices[-1][1].append(line)
            continue
        choices.append((m.group(1), [m.group(3)]))
    if len(choices) < 2:
        raise DatasetError(
            path, n, "question", f"found {len(choices)} lettered choice(s); expected at least 2"
        )
    return body, [(letter, "\n".join(lines).strip()) for letter, lines in choices]


def record_to_task(path: Path, n: int, row: dict) -> Task | None:
    """One row (either shape) -> Task, or None for rows outside the text-only multipleChoice
    subset."""
    rid = field(path, n, row, "id", (str, int))
    text = field(path, n, row, "question", str)
    if "choices" in row:
        raw = field(path, n, row, "choices", list)
        choices = []
        for i, c in enumerate(raw):
            if not (
                isinstance(c, (list, tuple)) and len(c) == 2 and all(isinstance(x, str) for x in c)
            ):
                raise DatasetError(path, n, f"choices[{i}]", "expected [letter, text]")
            choices.append((c[0], c[1]))
        body = text.strip()
    else:
        if field(path, n, row, "answer_type", str) != "multipleChoice" or row.get("image"):
            return None
        body, choices = split_choices(path, n, text)
    letters = [c[0] for c in choices]
    if len(set(letters)) != len(letters) or len(letters) < 2:
        raise DatasetError(
            path, n, "choices", f"expected at least 2 distinct letters, got {letters}"
        )
    gold = field(path, n, row, "answer", str).strip()
    if gold not in letters:
        raise DatasetError(
            path, n, "answer", f"{gold!r} is not one of the choice letters {''.join(letters)}"
        )
    return Task(
        id=f"{NAME}/{rid}",
        eval=NAME,
        state=body,
        questions=(Question("answer", CHOICE, QUESTION, tuple(Option(a, t) for a, t in choices)),),
        gold={"answer": gold},
        meta={"category": field(path, n, row, "category", str, optional=True)},
    )


def numbered(path: Path) -> Iterator[tuple[int, Task]]:
    """Yield ``(row number, Task)`` for the text-only multipleChoice rows of ``path``."""
    for n, row in read_rows(path):
        task = record_to_task(path, n, row)
        if task is not None:
            yield n, task


def load(path: Path) -> Iterator[Task]:
    """Yield the text-only multipleChoice tasks of ``path``."""
    for _, task in numbered(path):
        yield task
