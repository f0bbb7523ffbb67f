"""A cost bound holds parameters that multiply or void the output it reserves: ``n`` choices
(Gemini: ``candidateCount``), each billed its output, are reserved for; an output cap below 1, or a
number of choices that is not a positive integer, is refused under a bound (exit 2, naming the
parameter) (trial 9)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from dxi import adapters

from .fakes.fake_llm_server import FakeLLM
from .helpers.tasks import TASK


def test_the_output_bound_is_the_cap_once_per_choice_the_request_asks_for():
    """OpenAI bills ``n`` choices' output (``completion_tokens`` counts them all): 50 × 8 = 400
    reserved (it was 50); Gemini's ``candidateCount`` 3 × (``maxOutputTokens`` 100 + a thinking
    budget of 50) = 450; logprobs, 1 token per question × 2 questions × ``n`` 2 = 4; without ``n``,
    as before; an ``n`` that is not a positive integer bounds nothing (None)."""

    def bound(kind: str, params: dict) -> int | None:
        base = None if kind == "gemini" else "http://127.0.0.1:1/v1"
        return adapters.get(adapters.ModelSpec(kind, "m", base, params)).output_tokens_bound(TASK)

    assert bound("openai", {"max_completion_tokens": 50, "n": 8}) == 400
    assert bound("openai", {"max_completion_tokens": 50}) == 50
    assert bound("openai", {"max_completion_tokens": 50, "n": 0}) is None
    thinking = {"maxOutputTokens": 100, "thinkingConfig": {"thinkingBudget": 50}}
    assert bound("gemini", thinking | {"candidateCount": 3}) == 450
    assert bound("gemini", thinking) == 150
    assert bound("logprobs", {"n": 2}) == 4


@pytest.mark.parametrize(
    ("model", "param", "message"),
    [
        (
            "openai:gpt-fake@http://127.0.0.1:9/v1",
            "n=0",
            "openai:gpt-fake: n=0: under a cost bound n must be a positive integer (the number of "
            "replies a request asks for, each billed its output: the bound reserves the output "
            "cap n times)",
        ),
        (
            "openai:gpt-fake@http://127.0.0.1:9/v1",
            "max_completion_tokens=0",
            "openai:gpt-fake: max_completion_tokens=0: under a cost bound an output cap must be an "
            "integer of at least 1 (the bound reserves the cap's output tokens: below 1 it reserves "
            "none, and leaves no room for an answer)",
        ),
        (
            "gemini:gemini-fake@http://127.0.0.1:9",
            'candidateCount="8"',
            'gemini:gemini-fake: candidateCount="8": under a cost bound candidateCount must be a '
            "positive integer",
        ),
        (
            "anthropic:claude-fake@http://127.0.0.1:9",
            "max_tokens=0",
            "anthropic:claude-fake: max_tokens=0: under a cost bound an output cap must be an "
            "integer of at least 1",
        ),
    ],
)
def test_a_cap_below_1_or_a_number_of_choices_not_a_positive_integer_is_refused_under_a_bound(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    model: str,
    param: str,
    message: str,
):
    """``--param max_completion_tokens=0`` was accepted under a bound ("at most $0.0000"), and a
    server that writes 10 tokens anyway spent past it unseen; ``n=0`` bounds nothing. Refused (exit
    2, nothing sent: the port is closed), naming the parameter; the same without ``--max-cost`` is
    left to the provider (the dry run then plans it)."""
    from dxi.runner.cli import main

    for key in ("OPENAI_API_KEY", "GEMINI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(key, "sk-test-key")
    label = model.split("@")[0]
    argv = ["--model", model, "--evals", "when2call", "--limit", "2", "--param", param]
    argv += ["--price", f"{label}=1/100", "--data-dir", str(data_dir)]
    argv += ["--cache-dir", str(tmp_path / "c"), "-q"]
    cap = "maxOutputTokens" if "gemini" in model else "max_completion_tokens"
    argv += ["--param", f"{cap}=50"] * ("max" not in param)
    assert main(["run", *argv, "--max-cost", "1", "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert main(["estimate", *argv]) == 0


async def test_n_choices_are_reserved_for_so_the_bound_holds(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``--param n=8`` with ``max_completion_tokens=50`` at $100 per million output tokens (input
    free), under ``--max-cost 0.05``; the server bills the 8 choices, 400 output tokens a reply:
    $0.04. Each request reserves 400 tokens, $0.04: the first is sent, and then no second fits
    (0.04 + 0.04 > 0.05): 1 sent, $0.04 spent, a known cost, exit 3. The old code reserved 50
    ($0.005): both sent, billed $0.08 against the $0.05 bound, while it recorded "at most $0.01"
    (400 > 50 read as usage not credible)."""
    from dxi.runner.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    usage = {"prompt_tokens": 100, "completion_tokens": 400, "total_tokens": 500}
    out = tmp_path / "out"
    async with FakeLLM(default=f"usageof:{orjson.dumps(usage).decode()}") as server:
        argv = ["run", "--model", f"openai:gpt-fake@{server.url}/v1", "--evals", "when2call"]
        argv += ["--limit", "2", "--max-cost", "0.05", "--price", "openai:gpt-fake=0/100"]
        argv += ["--param", "max_completion_tokens=50", "--param", "n=8"]
        argv += ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "c")]
        argv += ["--out", str(out), "-q"]
        code = await asyncio.to_thread(main, argv)
        sent = len(server.requests)
    summary = orjson.loads((out / "summary.json").read_bytes())
    (model,) = summary["models"]
    assert (code, sent, summary["cost_bound"]["spent_usd"]) == (3, 1, 0.04)
    assert (model["requests"]["output_tokens"], model["requests"]["cost_usd"]) == (400, 0.04)
    assert "cost_at_reservation_usd" not in model["requests"]
