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
from dxi.runner.sending.cost import UNBOUNDED

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
        "--evals",
        "when2call",  # the synthetic data: When2Call only
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
    # this run charged each its reservation, which caps no output here: no "at most" of it
    assert (m["requests"]["cost_usd"], m["requests"]["cost_reason"]) == (
        None,
        UNBOUNDED.format(n=2),
    )
    assert "cost_at_reservation_usd" not in m["requests"]


@pytest.mark.parametrize("cap", [None, 20000])
async def test_a_stream_cut_mid_way_reads_at_most_its_reservation_only_when_a_cap_bounds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, cap: int | None
):
    """A trial's streams, cut after some reasoning, read "at most $0.4026" for 2 requests with
    ``max_completion_tokens=20000`` (the reservations: a bound) and "at most $0.0026" without a cap
    (the input alone: no bound). Without a cap the run's cost is unknown: null with the reason,
    "—" in the usage table's ``this run``, "cost unknown" on the progress line."""
    extra = ["--param", f"max_completion_tokens={cap}"] if cap else []
    async with FakeLLM(["cut:3"] * TASKS) as server:
        model = f"openai:gpt-6-luna@{server.url}/v1"  # reasons by default: streamed
        args = _dxi(tmp_path, model, "--price", "openai:gpt-6-luna=1/10", *extra)
        assert await asyncio.to_thread(main, args) == 1  # failed (transient): provisional
        sent = [body for _, body in server.requests]
    out = capsys.readouterr().out
    (m,) = _summary(tmp_path)["models"]
    assert (m["requests"]["sent"], m["requests"]["failed"]) == (TASKS, TASKS)
    if cap is None:
        assert (m["requests"]["cost_usd"], m["requests"]["cost_reason"]) == (
            None,
            UNBOUNDED.format(n=2),
        )
        assert "cost_at_reservation_usd" not in m["requests"]
        assert "done cost unknown" in out and "at most" not in out
        assert f"  this run, openai:gpt-6-luna: {UNBOUNDED.format(n=2)}" in out
        return
    # each reservation: the canonical body's bytes at $1 and the cap at $10 per million tokens
    bodies = [
        orjson.dumps({k: v for k, v in b.items() if k not in ("stream", "stream_options")})
        for b in sent
    ]
    reserved = round(sum(len(b) * 1.0 + cap * 10.0 for b in bodies) / 1e6, 6)
    assert 0.4 < reserved < 0.41
    assert (m["requests"]["cost_usd"], m["requests"]["cost_at_reservation_usd"]) == (
        reserved,
        reserved,
    )
    assert "cost_reason" not in m["requests"] and f"at most ${reserved:.4f}" in out
