"""The cost bound's ledger, the token bounds adapters state, run-file planning errors, the progress
line."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import aiohttp
import orjson
import pytest
from rich.console import Console

from dxi import adapters
from dxi.adapters import Fatal, RateLimited, Reply, Transient, Unreachable
from dxi.adapters.http import post
from dxi.runner import session
from dxi.runner.cli import main
from dxi.runner.planning import plan
from dxi.runner.planning.tokens import TokenEstimate, input_bound, prior_output
from dxi.runner.sending.cost import Budget, Charge, CostBoundReached, Settled
from dxi.runner.sending.progress import RunProgress
from dxi.runner.sending.scheduler import Stats
from dxi.scoring import cost_usd

from .fakes.fake_provider import FakeProvider
from .helpers.servers import free_port
from .helpers.tasks import TASK


def test_prices_are_usd_per_million_tokens():
    assert cost_usd(1_000_000, 0, 0.25, 2.0) == 0.25
    assert cost_usd(2000, 500, 1000.0, 2000.0) == 3.0  # 2 + 1


async def test_budget_never_lets_spent_plus_reserved_pass_the_bound():
    b = Budget(1.0)
    assert await b.reserve(0.6) == 0.6
    waiting = asyncio.create_task(b.reserve(0.5))  # 0.6 + 0.5 > 1: waits for the attempt in flight
    await asyncio.sleep(0)
    assert not waiting.done() and not b.stopped
    b.settle(0.6, 0.1)  # it cost 0.1: now 0.1 + 0.5 fits
    assert await waiting == 0.5 and (b.spent, b.reserved, b.in_flight) == (0.1, 0.5, 1)
    b.settle(0.5, 0.5)
    with pytest.raises(CostBoundReached):
        await b.reserve(0.41)  # 0.6 spent, nothing in flight: 0.41 can never fit
    assert b.stopped and b.spent == 0.6 and b.reserved == 0.0
    with pytest.raises(CostBoundReached):
        await b.reserve(0.0)  # once stopped, nothing more is dispatched
    unbounded = Budget()
    await unbounded.reserve(1e9)
    assert not unbounded.stopped


async def test_an_attempt_costs_its_usage_its_reservation_or_nothing():
    a = adapters.get("systemone:m@http://127.0.0.1:1")
    request = a.encode(TASK)
    charge = Charge(Budget(100.0), (1000.0, 2000.0))
    reserved = await charge.reserve(a, TASK, request)
    # the bound: the body's bytes as input tokens, one output token per System One question
    assert reserved == cost_usd(len(request.body), 2, 1000.0, 2000.0)
    # (USD, at its reservation: the cost unknown, an upper bound of it)
    assert charge.settle(reserved, Reply((), 100, 2), None) == Settled(
        cost_usd(100, 2, 1000.0, 2000.0), False
    )  # usage
    assert charge.settle(
        await charge.reserve(a, TASK, request), Reply((), None, None), None
    ) == Settled(reserved, True)  # no usage
    assert charge.settle(
        await charge.reserve(a, TASK, request), None, Transient("timed out")
    ) == Settled(reserved, True)  # no reply
    assert charge.settle(
        await charge.reserve(a, TASK, request), None, RateLimited("429")
    ) == Settled(0.0, False)  # an HTTP error
    assert charge.settle(
        await charge.reserve(a, TASK, request), None, Fatal("400", 400)
    ) == Settled(0.0, False)
    # 0 tokens at a price: a server that counts none (sparrow-decider serve), not a free reply: its
    # reservation, as with no usage (settled at $0, such a model could spend past the bound)
    assert charge.settle(await charge.reserve(a, TASK, request), Reply((), 0, 0), None) == Settled(
        reserved, True
    )
    assert charge.budget.spent == pytest.approx(cost_usd(100, 2, 1000.0, 2000.0) + 3 * reserved)
    assert charge.budget.reserved == pytest.approx(0.0)
    # a free model (price 0/0, the embedded one, which reports 0 tokens too) costs nothing
    free = Charge(Budget(100.0), (0.0, 0.0))
    assert free.settle(await free.reserve(a, TASK, request), Reply((), 0, 0), None) == Settled(
        0.0, False
    )


async def test_an_attempt_that_never_connected_costs_nothing_a_dropped_one_its_reservation():
    """Over real connections: a closed port on 127.0.0.1 refuses the connection (Unreachable: the
    request never left) and costs $0; the fake provider closing the connection after reading the
    request (``drop``: it may have been billed) costs its reservation, $0.50 (nothing for input, one
    output token per question of TASK's two at $250,000 per million). The old code charged both."""
    charge = Charge(Budget(1.0), (0.0, 250000.0))
    a = adapters.get("systemone:m@http://127.0.0.1:1")
    request = a.encode(TASK)
    async with aiohttp.ClientSession() as client:
        with pytest.raises(Unreachable) as refused:
            await post(
                client, f"http://127.0.0.1:{free_port()}/v1/systemone", request.body, {}, "m"
            )
        reserved = await charge.reserve(a, TASK, request)
        assert reserved == 0.5 and charge.budget.reserved == 0.5
        assert charge.settle(reserved, None, refused.value) == Settled(0.0, False)
        assert (charge.budget.spent, charge.budget.reserved) == (0.0, 0.0)
        async with FakeProvider(model=None, script=["drop"]) as server:
            with pytest.raises(Transient) as dropped:
                await post(client, f"{server.url}/v1/systemone", request.body, {}, "m")
        assert type(dropped.value) is Transient  # not Unreachable: it was connected
        reserved = await charge.reserve(a, TASK, request)
        assert charge.settle(reserved, None, dropped.value) == Settled(0.5, True)
    assert (charge.budget.spent, charge.budget.reserved) == (0.5, 0.0)


def test_prompt_cache_reads_and_writes_are_priced_at_their_own_prices():
    # 1,000,000 input tokens at $3: 500,000 of them read from the cache at $0.3, 100,000 written at
    # $3.75 (5 min), 50,000 at $6 (1 hour); 10,000 output tokens at $15
    price = (3.0, 15.0, 0.3, 3.75, 6.0)
    usd = cost_usd(
        1_000_000,
        10_000,
        *price,
        cached_tokens=500_000,
        written_tokens=100_000,
        written_1h_tokens=50_000,
    )
    assert usd == pytest.approx(
        350_000 * 3e-6 + 500_000 * 0.3e-6 + 100_000 * 3.75e-6 + 50_000 * 6e-6 + 10_000 * 15e-6
    )
    assert usd == pytest.approx(1.05 + 0.15 + 0.375 + 0.3 + 0.15, abs=1e-12)
    assert (
        cost_usd(
            1_000_000, 0, 3.0, 15.0, None, None, None, cached_tokens=500_000, written_tokens=100_000
        )
        == 3.0
    )
    assert (
        cost_usd(1_000_000, 0, 3.0, 15.0)
        == cost_usd(1_000_000, 0, 3.0, 15.0, None, None, None)
        == 3.0
    )


def test_the_view_prices_a_cached_request_as_the_run_settles_it():
    from dxi.scoring.cost import request_cost
    from dxi.view.data import _request

    price = (3.0, 15.0, 0.3, 3.75, 6.0)
    row = {
        "input_tokens": 1_000_000,
        "output_tokens": 10_000,
        "cached_input_tokens": 500_000,
        "cache_write_tokens": 100_000,
        "cache_write_1h_tokens": 50_000,
        "request_body": "{}",
        "raw_reply": None,
    }
    assert request_cost(row, price) == pytest.approx(1.05 + 0.15 + 0.375 + 0.3 + 0.15, abs=1e-12)
    assert _request(row, price)["cost_usd"] == request_cost(row, price)
    assert _request(
        {
            **row,
            "cached_input_tokens": None,
            "cache_write_tokens": None,
            "cache_write_1h_tokens": None,
        },
        price,
    )["cost_usd"] == pytest.approx(3.0 + 0.15)  # an older row: every input token at $3
    assert _request({**row, "input_tokens": None}, price)["cost_usd"] is None  # no usage reported
    # a reply that reported 0 tokens (sparrow-decider serve): unknown at a price, 0 when free
    uncounted = {**row, "input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}
    uncounted |= {"cache_write_tokens": 0, "cache_write_1h_tokens": 0}
    assert _request(uncounted, price)["cost_usd"] is None
    assert _request(uncounted, (0.0, 0.0))["cost_usd"] == 0.0


async def test_a_cost_bound_reserves_input_at_the_dearest_price_a_token_can_cost():
    a = adapters.get("anthropic:m@http://127.0.0.1:1")
    request = a.encode(TASK)
    charge = Charge(
        Budget(100.0), (1000.0, 2000.0, 100.0, 1250.0, 2000.0)
    )  # Anthropic: 0.1x, 1.25x, 2x
    reserved = await charge.reserve(a, TASK, request)
    assert reserved == cost_usd(
        input_bound(len(request.body), a.HIDDEN_INPUT_TOKENS), 1024, 2000.0, 2000.0
    )
    reply = Reply(
        (), 1000, 10, cached_input_tokens=600, cache_write_tokens=300, cache_write_1h_tokens=50
    )
    assert charge.settle(reserved, reply, None).usd == pytest.approx(
        (50 * 1000 + 600 * 100 + 300 * 1250 + 50 * 2000 + 10 * 2000) / 1e6
    )


def test_a_run_files_price_takes_the_providers_prompt_cache_rule_where_it_gives_none(
    tmp_path: Path, data_dir: Path
):
    from dxi.runner.cli import parser
    from dxi.runner.planning import plan

    def prices(kind: str, price: str) -> tuple:
        (tmp_path / "run.toml").write_text(
            f'data_dir = "{data_dir}"\n[[models]]\nprovider = "{kind}"\nmodel = "m"\n'
            f"price = {{ {price} }}\n"
        )
        (m,) = plan.from_args(parser().parse_args(["run", str(tmp_path / "run.toml")])).models
        return m.price

    assert prices("anthropic", "input = 3.0, output = 15.0") == (3.0, 15.0, 0.3, 3.75, 6.0)
    assert prices("anthropic", "input = 3.0, output = 15.0, cache_write_1h = 7.0") == (
        3.0,
        15.0,
        0.3,
        3.75,
        7.0,
    )
    assert prices("openai", "input = 2.0, output = 8.0") == (
        2.0,
        8.0,
    )  # per model: priced as input unless given
    assert prices("openai", "input = 2.0, output = 8.0, cache_write = 2.5") == (2.0, 8.0, None, 2.5)
    assert prices("gemini", "input = 0.3, output = 2.5, cached_input = 0.03") == (0.3, 2.5, 0.03)
    assert (
        main(["estimate", str(tmp_path / "run.toml"), "-q"]) == 0
    )  # a price tuple with gaps estimates too


def test_adapters_state_their_output_caps_and_hidden_input():
    assert adapters.get("openai:m@http://127.0.0.1:1/v1").output_tokens_bound(TASK) is None
    spec = adapters.ModelSpec(
        "openai", "m", "http://127.0.0.1:1/v1", {"max_tokens": 300, "max_completion_tokens": 200}
    )
    assert adapters.get(spec).output_tokens_bound(TASK) == 200  # max_completion_tokens wins
    assert (
        adapters.get("anthropic:m@http://127.0.0.1:1").output_tokens_bound(TASK) == 1024
    )  # its default
    assert adapters.get("anthropic:m@http://127.0.0.1:1").HIDDEN_INPUT_TOKENS == 600
    gemini = adapters.ModelSpec(
        "gemini", "g", None, {"maxOutputTokens": 100, "thinkingConfig": {"thinkingBudget": 50}}
    )
    assert adapters.get(gemini).output_tokens_bound(TASK) == 150
    assert (
        adapters.get("logprobs:m@http://127.0.0.1:1/v1").output_tokens_bound(TASK) == 2
    )  # 1 per question
    assert adapters.get("openai-decisions:m").output_tokens_bound(TASK) is None
    assert adapters.get("embedded").free and not adapters.get("systemone:m").free
    assert input_bound(1234, 600) == 1834
    assert (prior_output(None, 3), prior_output(2, 3)) == (28.0, 2.0)


def test_a_learned_estimate_pools_the_usage_it_was_taught():
    est = TokenEstimate.learned(body_bytes=4000, input_tokens=500, output_tokens=30, replies=10)
    assert (est.ratio, est.output, est.observed) == (0.5, 3.0, 10)
    assert est.input(400) == 50.0 and est(400) == 53.0


def test_progress_line_shows_rate_eta_spend_retries_429s_and_invalid():
    s = Stats(
        sent=30,
        cache_hits=10,
        ok=27,
        invalid=2,
        failed=1,
        attempts=35,
        retries=5,
        rate_limited=4,
        cost_usd=0.125,
        started=100.0,
    )
    p = RunProgress(Console(), {"m": 100}, budget=Budget(5.0), started=100.0)
    p.budget.spent = 1.5
    assert p.line("m", s, now=110.0) == (
        "40/100 40% 3.0 req/s ETA 20s $0.1250 (run $1.5000 of $5) retries 5 429s 4 "
        "invalid replies 2 failed 1 cached 10"
    )
    assert (
        RunProgress(Console(), {"m": 40}, started=100.0)
        .line("m", s, now=110.0)
        .startswith("40/40 100% 3.0 req/s done $0.1250 retries")
    )


def test_a_model_cut_short_gets_its_last_line_even_before_its_total_is_known():
    """In a log: a model whose rest was not sent (the cost bound, a stopped provider) has none left
    and gets its last line, "stopped", with what was not sent and refused; one that ended before
    the tasks were counted gets it when its total comes."""
    log = io.StringIO()
    p = RunProgress(Console(file=log, width=300), {})
    # 4 attempts: one for each of the 3 sent and the 1 refused, none sent again (no retry)
    s = Stats(sent=3, ok=3, attempts=4, cache_hits=2, not_sent=4, refused=1, cost_usd=0.5)
    p.update("m", s)
    assert log.getvalue() == ""  # no total yet, and less than 10 s in
    p.set_totals({"m": 10})
    (line,) = log.getvalue().splitlines()
    assert line.split(" ", 1)[1].startswith("m: 5/10 50% ")
    assert line.endswith(
        " req/s stopped $0.5000 retries 0 429s 0 invalid replies 0 failed 0 cached 2 not sent 4 "
        "refused 1"
    )
    p.update("m", s)
    p.set_totals({"m": 10})
    assert len(log.getvalue().splitlines()) == 1  # once


@pytest.mark.parametrize("width", [200, 80, 60])
def test_the_live_progress_never_cuts_a_counter_the_bar_goes_first(width: int):
    s = Stats(
        sent=800,
        cache_hits=400,
        ok=798,
        invalid=2,
        attempts=810,
        retries=10,
        rate_limited=1,
        cost_usd=0.421,
    )
    labels = ["openai:gpt-6.1-terra", "anthropic:claude-sonnet-5-5 (t=0)"]
    terminal = Console(width=width, force_terminal=True, color_system=None, file=io.StringIO())
    with RunProgress(terminal, dict.fromkeys(labels, 2193), budget=Budget(5.0), started=0.0) as p:
        for label in labels:
            p._show(label, s, 1000.0)  # as update does, 1000 s into the run
        shown = Console(width=width, color_system=None, record=True, file=io.StringIO())
        shown.print(p._bars.make_tasks_table(p._bars.tasks))  # what the live display draws
        detail = p.line(labels[0], s, now=1000.0).split(" ", 1)[1]
    assert detail == (
        "55% 0.8 req/s ETA 20m41s $0.4210 (run $0.0000 of $5) retries 10 429s 1 invalid replies 2 "
        "failed 0 cached 400"
    )  # every counter
    lines = shown.export_text().splitlines()
    text = " ".join(" ".join(lines).split())
    assert "…" not in text and all(len(line.rstrip()) <= width for line in lines)
    for label in labels:  # each model's label, counts and every counter, whole
        assert f"{label} " in text and text.count("1200/2193 ") == 2 and text.count(detail) == 2
    assert ("━" in text) == (width == 200)  # the bar only where it fits beside every counter
    assert len(lines) == (
        2 if width == 200 else 6
    )  # 80, 60: label and counts, then the counters on two lines


def run_file(tmp: Path, body: str) -> Path:
    path = tmp / "run.toml"
    path.write_text('data_dir = "data"\n' + body)
    return path


@pytest.mark.parametrize(
    ("body", "extra", "message"),
    [
        (
            '[[models]]\nprovider = "embedded"\n',
            ["--model", "embedded"],
            "--model cannot be combined with a run file",
        ),
        (
            '[[models]]\nprovider = "systemone"\nmodel = "m"\n',
            ["--max-cost", "1"],
            "a cost bound needs a price",
        ),
        (
            '[[models]]\nprovider = "openai"\nmodel = "m"\nprice = { input = 1.0, output = 2.0 }\n',
            ["--max-cost", "1"],
            "cap the output tokens",
        ),
        (
            '[[models]]\nprovider = "embedded"\nparams = { temperature = 0 }\n',
            [],
            "models[0]: embedded is a decision model",
        ),
        (
            '[[models]]\nprovider = "openai"\nmodel = "m"\noptions = { ctx_size = 4 }\n',
            [],
            "option(s) ctx_size unknown",
        ),
        (
            '[[models]]\nprovider = "embedded"\n[[models]]\nprovider = "embedded"\nname = "again"\n',
            [],
            "are the same model",
        ),
    ],
)
def test_run_file_mistakes_exit_2_with_a_clear_message(
    tmp_path: Path,
    data_dir: Path,
    capsys: pytest.CaptureFixture,
    body: str,
    extra: list[str],
    message: str,
):
    path = run_file(tmp_path, body)
    for command in ("run", "estimate"):  # the dry run refuses what the run would
        assert (
            main(
                [
                    command,
                    str(path),
                    "--data-dir",
                    str(data_dir),
                    "--cache-dir",
                    str(tmp_path / "c"),
                    "-q",
                    *extra,
                ]
            )
            == 2
        )
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_run_file_paths_are_relative_to_the_file_and_flags_override(tmp_path: Path, data_dir: Path):
    sub = tmp_path / "conf"
    sub.mkdir()
    path = sub / "run.toml"
    path.write_text(
        f'data_dir = "{data_dir}"\ncache_dir = "cache"\nout = "out"\n[evals]\nlimit = 1\n'
        '[[models]]\nname = "nano"\nprovider = "embedded"\n'
    )
    assert session.run(plan.build(run_file=path)).exit_code == 0
    assert (sub / "cache" / "shards").is_dir() and (sub / "out" / "summary.json").is_file()
    assert session.run(plan.build(run_file=path, limit=2, out=tmp_path / "other")).exit_code == 0
    s = orjson.loads((tmp_path / "other" / "summary.json").read_bytes())
    assert (
        s["models"][0]["model"] == "nano" and s["models"][0]["requests"]["sent"] == 4
    )  # 2 tasks of each of 4 evaluations, 1 each cached
    assert s["models"][0]["requests"]["cache_hits"] == 4


def test_a_priced_model_whose_server_counts_no_tokens_has_an_unknown_cost_not_0():
    """A trial priced `sparrow-decider serve` (which reports 0 tokens) and its summary said $0.0000
    (a note aside): the cost of replies that reported 0 tokens is unknown, so a priced model's
    cost is null with a ``cost_reason`` in the evaluation where they are, for the model and for the
    run (as without a price); an evaluation whose replies counted keeps its cost. A free model (the
    embedded one, price 0/0) with the same replies costs 0 with no reason."""
    import polars as pl

    from dxi.scoring.cost import usage_blocks
    from dxi.scoring.pipeline import USAGE_SCHEMA

    tokens = {"cached_input_tokens": 0, "cache_write_tokens": 0, "cache_write_1h_tokens": 0}
    zero = {
        "eval": "when2call",
        "requests": 4,
        "replies": 4,
        "with_usage": 3,  # one reply reported nothing (null), three reported 0 tokens
        "counted": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        **tokens,
        "batch": False,
    }
    counted = zero | {
        "eval": "wildguardtest",
        "requests": 2,
        "replies": 2,
        "with_usage": 2,
        "counted": 2,
        "input_tokens": 1000,
        "output_tokens": 10,
    }
    table = pl.DataFrame(
        [{"label": "priced"} | zero, {"label": "priced"} | counted, {"label": "free"} | zero],
        schema=USAGE_SCHEMA,
    )
    per_model, run = usage_blocks(
        table, ["priced", "free"], {"priced": (0.1, 0.4), "free": (0.0, 0.0)}
    )
    no_usage = "1 reply reported no usage: its tokens (and cost) are not counted"
    unknown = (
        "3 replies reported 0 tokens (a server that counts none): their cost is unknown; "
        "1 reply reported no usage: its cost is unknown"
    )
    priced = per_model["priced"]
    assert {k: v for k, v in priced.items() if k != "evals"} == {
        "requests": 6,
        "replies": 6,
        "with_usage": 5,
        "input_tokens": 1000,
        "output_tokens": 10,
        "cached_input_tokens": 0,
        "cost_usd": None,
        "note": no_usage,
        "price": {"input": 0.1, "output": 0.4},
        "cost_reason": unknown,
    }
    assert priced["evals"]["when2call"]["cost_usd"] is None
    assert priced["evals"]["when2call"]["cost_reason"] == unknown
    # 1000 x 0.1 + 10 x 0.4 = 104 USD per million tokens
    assert priced["evals"]["wildguardtest"]["cost_usd"] == 0.000104
    assert "cost_reason" not in priced["evals"]["wildguardtest"]
    free = per_model["free"]
    assert (free["cost_usd"], free["note"]) == (0.0, no_usage)
    assert "cost_reason" not in free and "cost_reason" not in free["evals"]["when2call"]
    assert (run["cost_usd"], run["cost_reason"]) == (
        None,
        "replies of priced reported 0 tokens (a server that counts none); "
        "replies of priced reported no usage",
    )
    _, with_unpriced = usage_blocks(table, ["priced", "free"], {"priced": (0.1, 0.4), "free": None})
    assert with_unpriced["cost_reason"] == (
        "no price for free; replies of priced reported 0 tokens (a server that counts none); "
        "replies of priced reported no usage"
    )
