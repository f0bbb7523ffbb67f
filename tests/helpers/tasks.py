"""Tasks written by hand for the tests that price or bound one request (``TASK``)."""

from __future__ import annotations

from dxi.evals import CHOICE, YES_NO, Question, Task

TASK = Task(
    "when2call/x",
    "when2call",
    "state",
    (Question("q", CHOICE, "Which?", ()), Question("r", YES_NO, "Yes?")),
    {"q": "A", "r": "yes"},
)
"""A When2Call task of two questions, a choice (no options) and a yes/no, gold "A" and "yes"."""
