"""Synthetic evaluation data for tests and benchmarks that need many tasks: When2Call-shaped rows (the
shape of ``nvidia/When2Call``'s MCQ file, see ``evals/when2call.py``), generated from a seed, never the
real data. ``data_dir(root, n)`` writes a data directory ``dxi`` can run on; ``suite(n)`` streams the
tasks without writing anything (for a million tasks)."""
from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import orjson

from dxi.evals import Suite, Task
from dxi.evals.when2call import CATEGORIES, record_to_task

TOOLS = ['{"name": "get_weather", "description": "Current weather for a city", "parameters": {"type": "dict", '
         '"properties": {"city": {"type": "string"}}, "required": ["city"]}}',
         '{"name": "search_flights", "description": "Flights between two airports on a date", "parameters": '
         '{"type": "dict", "properties": {"from": {"type": "string"}, "to": {"type": "string"}, "date": '
         '{"type": "string"}}, "required": ["from", "to", "date"]}}']


def when2call_row(i: int, seed: int = 0) -> dict:
    """Row ``i``: a user question, 0-2 tools, the four candidate replies and the correct category."""
    rng = random.Random(f"{seed}:{i}")
    city = rng.choice(["Paris", "Lagos", "Lima", "Osaka", "Perth", "Quito"])
    return {
        "uuid": f"synthetic-{seed}-{i:07d}",
        "question": f"What is the weather like in {city} today? (case {i})",
        "tools": TOOLS[: rng.randrange(3)],
        "answers": {"direct": f"It is sunny in {city}.", "tool_call": f'{{"name": "get_weather", "arguments": '
                    f'{{"city": "{city}"}}}}', "request_for_info": "Which city do you mean?",
                    "cannot_answer": "I cannot look up the weather."},
        "correct_answer": rng.choice(CATEGORIES),
        "source": "synthetic",
    }


def data_dir(root: Path, n: int, seed: int = 0) -> Path:
    """A data directory holding ``n`` synthetic When2Call rows (``when2call/when2call_test_mcq.jsonl``)."""
    path = root / "when2call" / "when2call_test_mcq.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for i in range(n):
            f.write(orjson.dumps(when2call_row(i, seed)) + b"\n")
    return root


class SyntheticSuite(Suite):
    """A Suite of ``n`` synthetic When2Call tasks, made as they are streamed (nothing on disk, nothing
    held): ``SyntheticSuite(1_000_000)``."""

    def __init__(self, n: int, seed: int = 0):
        super().__init__({})
        self.n, self.seed = n, seed

    def selected(self) -> list[str]:
        return ["when2call"]

    def validate(self) -> None:
        """Nothing to check: the tasks are made, not read from a file (``Suite.validate`` reads files)."""

    def tasks(self, name: str | None = None) -> Iterator[Task]:
        path = Path("synthetic.jsonl")
        for i in range(self.n):
            yield record_to_task(path, i + 1, when2call_row(i, self.seed))
