"""What a run stopped by the cost bound counts: each model's requests left (not sent, or found in
the cache), the closing line's counts, and each model's last progress line in a log.

The fake System One provider reports one output token per question and the System One adapter
reserves one per question (``output_tokens_bound``), so at $250,000 per million output tokens and
nothing for input every When2Call request reserves and costs exactly $0.25: a bound of $2.50 lets
exactly 10 requests through, whatever the models' turns."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import orjson
import pytest

from dxi.runner.cli import main
from dxi.runner.errors import EXIT_COST_BOUND, EXIT_PROVIDER_STOPPED

from .fakes.fake_provider import FakeProvider, systemone
from .helpers.runs import write_run_file
from .helpers.synthetic import data_dir, when2call_row

TASKS = 24
PRICE = {"input": 0.0, "output": 250000.0}  # $0.25 a request
LINE = re.compile(r"^\d\d:\d\d:\d\d (A|B): ", re.M)  # a progress line in plain-line mode


def rows(root: Path, indices: range) -> None:
    """The data directory holds the synthetic When2Call rows ``indices`` (a row's request is the
    same whatever its place in the file)."""
    path = root / "when2call" / "when2call_test_mcq.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(when2call_row(i)) + b"\n" for i in indices))


def requests(tmp: Path) -> dict[str, dict]:
    s = orjson.loads((tmp / "out" / "summary.json").read_bytes())
    return {m["model"]: m["requests"] for m in s["models"]} | {"cost_bound": s["cost_bound"]}


async def test_the_bound_counts_every_models_rest_not_sent_or_cached_and_ends_its_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """Two models on two providers, the last 6 of their 24 requests cached by an earlier run: at
    $2.50 the run sends 10 (both models together), finds 6 of each in the cache and leaves 48 - 12 -
    10 = 26 not sent; each model's sent + cache_hits + not_sent is its 24 (the old code counted 4 a
    model not sent, the requests already queued, and 0 cache hits: the cached ones came after the
    stop), and each gets its last progress line though it never finished."""
    async with FakeProvider(model=None) as server:
        rows(tmp_path / "data", range(18, TASKS))  # before the run file: it selects what data holds
        path = write_run_file(
            tmp_path,
            {"pa": (server.url, 60000), "pb": (server.url, 60000)},
            [
                {"name": "A", "provider": "pa", "model": "a", "price": PRICE},
                {"name": "B", "provider": "pb", "model": "b", "price": PRICE},
            ],
        )
        assert await asyncio.to_thread(main, ["run", str(path), "-q"]) == 0
        assert server.stats()["arrivals"] == 12
        rows(tmp_path / "data", range(TASKS))
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["run", str(path), "--max-cost", "2.5"])
        out = capsys.readouterr().out
        assert (code, server.stats()["arrivals"]) == (EXIT_COST_BOUND, 12 + 10)
    got = requests(tmp_path)
    a, b = got["A"], got["B"]
    assert a["sent"] + b["sent"] == 10 and a["failed"] == b["failed"] == 0
    assert (a["cache_hits"], b["cache_hits"]) == (6, 6)
    assert (a["not_sent"], b["not_sent"]) == (24 - 6 - a["sent"], 24 - 6 - b["sent"])
    assert a["not_sent"] + b["not_sent"] == 26 == got["cost_bound"]["remaining_requests"]
    assert (
        "Stopped at the cost bound: spent $2.500000 of $2.5 in this run; 26 request(s) not sent "
        "(about $6.5000 expected)."
    ) in " ".join(out.split())
    # the messages end with where the outputs are and what they hold: the 26 answers not sent
    # are missing from the summary (it named no folder)
    assert out.splitlines()[-1] == (
        f"{tmp_path / 'out'} holds this scoring's outputs, whole (answers.parquet, summary.json): "
        "provisional, 26 answer(s) missing, left out of every figure (their bounds are in "
        "summary.json); the next run sends the missing ones."
    )
    # one line a model (the run takes less than the 10 s between lines), its last: none left
    lines = [line.split(" ", 1)[1] for line in out.splitlines() if LINE.match(line)]
    assert sorted(line.split(":")[0] for line in lines) == ["A", "B"]
    for model, r in (("A", a), ("B", b)):
        (line,) = (line for line in lines if line.startswith(f"{model}: "))
        done = r["sent"] + 6
        assert re.fullmatch(
            rf"{model}: {done}/24 {100 * done / 24:.0f}% [\d.]+ req/s stopped "
            rf"\${0.25 * r['sent']:.4f} \(run \$2\.5000 of \$2\.5\) retries 0 429s 0 invalid "
            rf"replies 0 failed 0 cached 6 not sent {r['not_sent']}",
            line,
        ), line


async def test_the_closing_line_counts_what_was_not_sent_apart_from_what_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """One request at a time: 9 answered ($2.25), the 10th's reply is not the wire format (charged
    its reservation, $0.25: $2.50 spent, at most: its cost is unknown), its retry cannot reserve: it
    is stored as a transient failure, sent again by the next run, and 14 are not sent. The next run
    sends 15; the old line called all 15 "not sent". The $0.25 charged at reservation is counted
    apart (``cost_at_reservation_usd``) and the lines say "at most" (the old ones read as spent)."""
    data_dir(tmp_path / "data", TASKS)
    async with FakeProvider(model=None, script=["ok"] * 9 + ["malformed"]) as server:
        path = write_run_file(
            tmp_path,
            {"pa": (server.url, 60000)},
            [{"name": "A", "provider": "pa", "model": "a", "price": PRICE}],
        )
        capsys.readouterr()
        code = await asyncio.to_thread(
            main,
            ["run", str(path), "--max-cost", "2.5", "--max-in-flight", "1", "--backoff", "0.01"],
        )
        out = capsys.readouterr().out
        assert (code, server.stats()["arrivals"]) == (EXIT_COST_BOUND, 10)
    got = requests(tmp_path)
    a = got["A"]
    assert (a["sent"], a["failed"], a["cache_hits"], a["not_sent"]) == (10, 1, 0, 14)
    assert (a["cost_usd"], a["cost_at_reservation_usd"]) == (2.5, 0.25)
    assert got["cost_bound"]["remaining_requests"] == 15
    said = " ".join(out.split())
    assert (
        "Stopped at the cost bound: spent at most $2.500000 of $2.5 in this run; 14 request(s) not sent "
        "and 1 sent that failed (transient): the next run sends these 15 (about $3.7500 "
        "expected)."
    ) in said
    (line,) = (line.split(" ", 1)[1] for line in out.splitlines() if LINE.match(line))
    assert re.fullmatch(
        r"A: 10/24 42% [\d.]+ req/s stopped at most \$2\.5000 \(run at most \$2\.5000 of \$2\.5\) "
        r"retries 0 429s 0 "
        r"invalid replies 0 failed 1 cached 0 not sent 14",
        line,
    ), line


def uncounted(model: str):
    """The fake System One replies, with 0 tokens for the requests naming ``model`` (a server that
    counts none, as ``sparrow-decider serve``)."""
    respond = systemone(None)

    def reply(payload: dict) -> dict:
        doc = respond(payload)
        if payload.get("model") == model:
            doc["usage"] = {"input_tokens": 0, "output_tokens": 0}
        return doc

    return reply


async def test_a_spend_charged_at_reservation_is_counted_apart_and_said_at_most(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A and B priced, 4 When2Call requests each, under a bound of $100: A's replies count their
    tokens (4 x $0.25 spent); B's server reports 0 tokens, so each of B's replies is charged its
    reservation ($0.25) and its cost is unknown. B's ``requests`` (summary.json and the run-history
    line) has ``cost_usd`` 1.0 of which ``cost_at_reservation_usd`` 1.0; A's has no such key; B's
    progress line and its usage row's ``this run`` say "at most". The old code showed B's $1.0000 as
    spent, with nothing to tell it from A's."""
    data_dir(tmp_path / "data", 4)
    async with FakeProvider(model=None, routes={"/v1/systemone": uncounted("b")}) as server:
        path = write_run_file(
            tmp_path,
            {"pa": (server.url, 60000), "pb": (server.url, 60000)},
            [
                {"name": "A", "provider": "pa", "model": "a", "price": PRICE},
                {"name": "B", "provider": "pb", "model": "b", "price": PRICE},
            ],
        )
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["run", str(path), "--max-cost", "100"])
        out = capsys.readouterr().out
    assert code == 0
    got = requests(tmp_path)
    a, b = got["A"], got["B"]
    assert (a["sent"], a["cost_usd"], "cost_at_reservation_usd" in a) == (4, 1.0, False)
    assert (b["sent"], b["cost_usd"], b["cost_at_reservation_usd"]) == (4, 1.0, 1.0)
    assert list(b)[list(b).index("cost_usd") + 1] == "cost_at_reservation_usd"
    assert got["cost_bound"]["spent_usd"] == 2.0
    (line,) = (tmp_path / "out" / "run-history.jsonl").read_text().splitlines()
    assert orjson.loads(line)["requests"] == {"A": a, "B": b}
    # B's last line can print while A's replies are still being settled: the run's figure is then
    # between B's $1 and the whole $2
    lines = [line.split(" ", 1)[1] for line in out.splitlines() if LINE.match(line)]
    (last_b,) = (line for line in lines if line.startswith("B: "))
    assert re.fullmatch(
        r"B: 4/4 100% [\d.]+ req/s done at most \$1\.0000 \(run at most \$(1\.\d{4}|2\.0000) of \$100\) "
        r"retries 0 429s 0 invalid replies 0 failed 0 cached 0",
        last_b,
    ), last_b
    (last_a,) = (line for line in lines if line.startswith("A: "))
    assert re.fullmatch(r"A: 4/4 100% [\d.]+ req/s done \$1\.0000 \(run .*", last_a), last_a
    usage = out.split("Usage (")[1].split("Measures")[0].splitlines()
    this_run = {r.split("│")[1].strip(): r.split("│")[-2].strip() for r in usage if "│ " in r}
    assert this_run == {"A": "$1.0000", "B": "at most $1.0000", "all": ""}, out


async def test_a_provider_stopped_in_a_run_stopped_by_the_bound_gets_its_own_line_and_exit_6(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """Trial t7: B's provider refuses its key (401) at B's first request, then A spends the bound.
    One request at a time a provider: B's 1 request refused (costs $0: an HTTP error) and its other
    23 not sent, by the stop; A (20 ms a reply) sends 10 ($2.50) and the bound leaves its other 14.
    The bound's line counts only its 14, the provider's line its 1 + 23, the next run sends 38
    (38 x $0.25 = $9.50), and the exit code is 6: a higher bound would not bring the key back. The
    old code printed no provider line, counted all 37 not sent under the bound, and exited 3."""
    data_dir(tmp_path / "data", TASKS)
    async with (
        FakeProvider(model=None, latency="0.02") as a_server,
        FakeProvider(model=None, default="401") as b_server,
    ):
        path = write_run_file(
            tmp_path,
            {"pa": (a_server.url, 60000), "pb": (b_server.url, 60000)},
            [
                {"name": "A", "provider": "pa", "model": "a", "price": PRICE},
                {"name": "B", "provider": "pb", "model": "b", "price": PRICE},
            ],
        )
        capsys.readouterr()
        code = await asyncio.to_thread(
            main, ["run", str(path), "--max-cost", "2.5", "--max-in-flight", "1"]
        )
        out = capsys.readouterr().out
        arrivals = (a_server.stats()["arrivals"], b_server.stats()["arrivals"])
    assert (code, arrivals) == (EXIT_PROVIDER_STOPPED, (10, 1))
    got = requests(tmp_path)
    a, b = got["A"], got["B"]
    assert (a["sent"], a["not_sent"], a["refused"], a["cost_usd"]) == (10, 14, 0, 2.5)
    assert (b["sent"], b["not_sent"], b["refused"], b["cost_usd"]) == (0, 23, 1, 0.0)
    assert got["cost_bound"]["remaining_requests"] == 38
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    (stop,) = summary["stopped_providers"]
    assert (stop["provider"], stop["models"], stop["refused"], stop["not_sent"]) == (
        "table:pb",
        ["B"],
        1,
        23,
    )
    said = " ".join(out.split())
    assert (
        "Stopped at the cost bound: spent $2.500000 of $2.5 in this run; 14 request(s) not sent: "
        "the next run sends these and the 24 left by the stop(s) below, 38 in all (about $9.5000 "
        "expected). Everything that arrived is in the cache: rerun with a higher --max-cost (or "
        "max_cost in the run file) to continue."
    ) in said
    assert re.search(
        r"Provider stopped: table:pb stopped at [\d: -]+ UTC: API key refused\. 1 request\(s\) "
        r"refused, 23 not sent "
        r"\(B\); the next run sends them\. Fix the cause, then rerun\.",
        said,
    ), said
    # after the cost bound's line and the stop's, the line on the outputs: 14 + 24 answers missing
    assert out.splitlines()[-1] == (
        f"{tmp_path / 'out'} holds this scoring's outputs, whole (answers.parquet, summary.json): "
        "provisional, 38 answer(s) missing, left out of every figure (their bounds are in "
        "summary.json); the next run sends the missing ones."
    )


async def test_a_tiny_bound_is_written_in_fixed_point_as_the_spend_is(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """``--max-cost 0.0000001``: no request ($0.25 each) fits, the run stops before it sends one.

    Expected, by hand: the start line says "cost bound $0.0000001" and the closing line "spent
    $0.000000 of $0.0000001" (the old code: "$1e-07" in both, ``:g``)."""
    async with FakeProvider(model=None) as server:
        rows(tmp_path / "data", range(2))
        path = write_run_file(
            tmp_path,
            {"pa": (server.url, 60000)},
            [{"name": "A", "provider": "pa", "model": "a", "price": PRICE}],
        )
        code = await asyncio.to_thread(main, ["run", str(path), "--max-cost", "0.0000001"])
        out = " ".join(capsys.readouterr().out.split())
        assert (code, server.stats()["arrivals"]) == (EXIT_COST_BOUND, 0)
    assert ", cost bound $0.0000001" in out
    assert "Stopped at the cost bound: spent $0.000000 of $0.0000001 in this run" in out


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (1e-7, "$0.0000001"),
        (2.5, "$2.5"),
        (5000.0, "$5000"),
        (5 / 3, "$1.66667"),
        (0.0, "$0"),
        (1e-8, "$0.00000001"),
        # below a millionth of a cent, an exponent (trial 9: --max-cost 1e-300 wrote 300 zeros)
        (1e-300, "$1e-300"),
        (2.5e-12, "$2.5e-12"),
        (1.2345678e-9, "$1.23457e-9"),
    ],
)
def test_an_amount_given_is_written_back_in_fixed_point(usd: float, text: str):
    from dxi.runner.outputs.amounts import usd as written

    assert written(usd) == text


@pytest.mark.parametrize(
    ("parts", "text"),
    [
        ((100.0, 0.0), "100/0 USD per million input/output tokens"),
        ((100.0, 0.0, 10.0), "100/0/10 USD per million input/output/cached input tokens"),
        ((1.0, 2.0, None, 3.75), "1/2/3.75 USD per million input/output/cache write tokens"),
    ],
)
def test_a_price_is_written_with_every_part_it_gives(parts: tuple, text: str):
    """The rescoring note of a recorded price said "priced at 100/0", leaving out the cached input
    price it also recorded (trial 9)."""
    from dxi.runner.outputs.amounts import price

    assert price(parts) == text
