"""What a priced model's replies cost when the cost is unknown (``scoring.cost``,
``runner.sending.cost``): a reply that reports no usage has an unknown cost, as one that reports 0
tokens does (never $0, which is what a free model costs), and an attempt charged its reservation
where nothing caps the output (no ``max_completion_tokens``, no ``--max-cost``) has no upper bound,
so no figure reads "at most" of it, as ``dxi estimate`` says "at most —" of such a model.

Each test runs ``dxi run`` in this process against ``FakeLLM`` (``tests/fakes/fake_llm_server.py``)
on 127.0.0.1, on two synthetic When2Call tasks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from dxi.runner.cli import main

from .fakes.fake_llm_server import FakeLLM
from .helpers.synthetic import data_dir

TASKS = 2


def _dxi(tmp_path: Path, model: str, *extra: str) -> list[str]:
    data_dir(tmp_path / "data", TASKS)
    return [
        "run",
        "--model",
        model,
        "--data-dir",
        str(tmp_path / "data"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--max-attempts",
        "1",
        *extra,
    ]


def _summary(tmp_path: Path) -> dict:
    return orjson.loads((tmp_path / "out" / "summary.json").read_bytes())


async def test_a_priced_model_whose_replies_report_no_usage_has_an_unknown_cost_not_0(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A trial priced a model whose server reports no usage and was shown $0.0000 everywhere (a
    free model's figure), a ``note`` aside: its cost, and its cost of 1,000 decisions, are null
    with a reason, as for replies that report 0 tokens; the terminal prints "—" and the reason."""
    async with FakeLLM(default="nousage") as server:
        model = f"openai:plain@{server.url}/v1"
        args = _dxi(tmp_path, model, "--price", "openai:plain=1/10", "--stream", "never")
        assert await asyncio.to_thread(main, args) == 0
    out = capsys.readouterr().out
    s = _summary(tmp_path)
    (m,) = s["models"]
    reason = "2 replies reported no usage: their cost is unknown"
    usage = {k: v for k, v in m["usage"].items() if k != "evals"}
    assert usage == {
        "requests": 2,
        "replies": 2,
        "with_usage": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_input_tokens": 0,
        "cost_usd": None,
        "note": "2 replies reported no usage: their tokens (and cost) are not counted",
        "price": {"input": 1.0, "output": 10.0},
        "cost_reason": reason,
    }
    assert (
        m["usage"]["evals"]["when2call"]["cost_usd"],
        m["usage"]["evals"]["when2call"]["cost_reason"],
    ) == (None, reason)
    assert (s["usage"]["cost_usd"], s["usage"]["cost_reason"]) == (
        None,
        "replies of openai:plain reported no usage",
    )
    for block in (m["measures"], m["evals"]["when2call"]["measures"]):
        assert (block["decisions"], block["cost_per_1000_decisions_usd"], block["cost_reason"]) == (
            2,
            None,
            reason,
        )
    assert "$0.0000" not in out.split("Usage")[1]
    assert "  cost: replies of openai:plain reported no usage" in out
