"""Batch mode under a cost bound beside a batch the provider refused whole (``failed``: its input
did not pass validation), end to end: ``dxi run --batch --max-cost`` in a process of its own against
two fake batch providers in processes of their own (``tests.fakes.fake_batches``).

The prices make every amount exact in binary: each request is one When2Call question, capped at
``max_completion_tokens = 5``, which is what the fake reports (``OUTPUT_TOKENS_PER_QUESTION``), and
input is free, so a request reserves exactly what it costs. At the batch price (half the price) a
request of model A costs 5 x $200,000 / 10^6 = $1.00 and one of model B 5 x $12,500 / 10^6 = $0.0625
(1/16)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import orjson
import pytest

from dxi.cache.ledger import Ledger
from dxi.runner.errors import EXIT_PROVIDER_STOPPED

from .conftest import DXI
from .fakes.fake_provider import serve
from .helpers.batches import rows
from .helpers.synthetic import data_dir

TASKS = 12
A_PRICE = {"input": 0.0, "output": 400000.0}  # batch: $1.00 a request
B_PRICE = {"input": 0.0, "output": 25000.0}  # batch: $0.0625 a request


def run_file(tmp: Path, models: dict[str, tuple[str, dict]]) -> Path:
    """A run file of the OpenAI-kind ``models`` (name -> (the fake's URL, price)) in batch mode,
    each on a provider table of its own, on ``tmp/data``, caching in ``tmp/cache``, writing
    ``tmp/out``."""
    lines = ['data_dir = "data"', 'cache_dir = "cache"', 'out = "out"']
    for name, (url, price) in models.items():
        lines += [
            f"[providers.p{name}]",
            'kind = "openai"',
            f'base_url = "{url}/v1"',
            "batch = true",
            "[[models]]",
            f'name = "{name}"',
            f'provider = "p{name}"',
            'model = "m"',
            "params = { max_completion_tokens = 5 }",
            f"price = {{ input = {price['input']}, output = {price['output']} }}",
        ]
    lines += ["[evals]", 'select = ["when2call"]']  # the synthetic data: When2Call only
    path = tmp / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def dxi_run(path: Path, bound: str) -> tuple[int, str]:
    """``dxi run RUN_FILE --poll 0.05 --max-cost BOUND`` in a process of its own: its exit code and
    its standard output, blanks collapsed."""
    done = subprocess.run(
        [DXI, "run", str(path), "--poll", "0.05", "--max-cost", bound],
        capture_output=True,
        text=True,
        timeout=120,  # each takes a few seconds: a run that never ends fails
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, " ".join(done.stdout.split())


def requests(s: dict) -> dict[str, dict]:
    return {m["model"]: m["requests"] for m in s["models"]}


def counts(r: dict) -> tuple[int, int, int, int]:
    return r["sent"], r["cache_hits"], r["not_sent"], r["refused"]


@pytest.mark.process
@pytest.mark.slow
def test_a_refused_batch_beside_a_model_stopped_by_the_bound_counts_each_apart(tmp_path: Path):
    """Models A and B, 12 requests each, under a bound of $4.75. B's batch (its 12 requests,
    $0.75) is refused whole by its provider (``failed``); A's first 4 requests ($4.00) fit and are
    answered, its 5th would pass the bound ($5.00 > $4.75): A stops at the bound with 8 not sent.
    Whichever model reserves first, the outcome is the same: A alone takes $4.00 of the bound,
    leaving $0.75, B's 12 exactly; A's 5th fits neither beside B's reservation nor after its
    release.

    Expected, by hand: spent $4.00 (<= $4.75; B's refused batch costs nothing); A sent 4, not sent
    8; B sent 0, refused 12, not sent 0: each model's sent + cache_hits + not_sent + refused is its
    12. Exit code 6 (docs/cli.md: a batch API that refused wins over the bound's 3). The bound's
    line counts A's 8 and names B's 12 as left by the stop below, 20 in all; the next run's expected
    cost is A's 8 x $1.00 + B's 12 x $0.0625 = $8.75. B's line says 12 refused, 0 not sent.

    The rerun, with a higher bound and B's provider accepting its batches again (``script``: only
    the first batch it is sent fails), sends exactly what was left: A its 8 (one batch), B its 12
    (one batch), $8.00 + $0.75 = $8.75, exit 0; no request answered twice (each provider produced
    12 answers in all) and no batch created twice (A: 2 batches, B: 2, the refused one and the
    rerun's)."""
    data_dir(tmp_path / "data", TASKS)
    with (
        serve(model=None, record=False) as a,
        serve(model=None, record=False, batch={"script": ["failed"]}) as b,
    ):
        path = run_file(tmp_path, {"A": (a.url, A_PRICE), "B": (b.url, B_PRICE)})
        code, out = dxi_run(path, "4.75")
        first = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
        a1, b1 = a.stats(), b.stats()
        code2, out2 = dxi_run(path, "100")
        second = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
        a2, b2 = a.stats(), b.stats()

    # ---- the first run: the bound, and the refusal beside it ------------------------------------
    assert code == EXIT_PROVIDER_STOPPED, out
    got = requests(first)
    assert counts(got["A"]) == (4, 0, 8, 0), got["A"]
    assert counts(got["B"]) == (0, 0, 0, 12), got["B"]
    for r in got.values():
        assert sum(counts(r)) == TASKS
    assert (got["A"]["cost_usd"], got["B"]["cost_usd"]) == (4.0, 0.0)
    assert first["cost_bound"] == {
        "max_cost_usd": 4.75,
        "spent_usd": 4.0,
        "stopped": True,
        "remaining_requests": 20,
        "remaining_cost_usd": 8.75,
        "remaining_bound_usd": 8.75,
    }
    history = [
        orjson.loads(line)
        for line in (tmp_path / "out" / "run-history.jsonl").read_bytes().splitlines()
    ]
    assert [h["exit_code"] for h in history] == [6, 0]
    assert history[0]["cost_bound"] == first["cost_bound"]
    assert (
        requests(
            {"models": [{"model": k, "requests": v} for k, v in history[0]["requests"].items()]}
        )
        == got
    )
    assert (
        "Stopped at the cost bound: spent $4.000000 of $4.75 in this run; 8 request(s) not sent: "
        "the next run sends these and the 12 left by the stop(s) below, 20 in all (about $8.7500 "
        "expected)." in out
    )
    (refusal,) = re.findall(r"Batch API refused: B: .*?one call at a time\)", out)
    assert re.fullmatch(
        r"Batch API refused: B: batch batch_\w+ failed: the input was refused; 12 request\(s\) "
        r"refused, 0 not sent \(rerun without --batch to send them one call at a time\)",
        refusal,
    ), refusal
    assert (a1["batch_creates"], a1["batch_lines"], a1["batch_answers"]) == (1, 4, 4)
    assert (b1["batch_creates"], b1["batch_lines"], b1["batch_answers"]) == (1, 12, 0)

    # ---- the rerun: exactly what was left --------------------------------------------------------
    assert code2 == 0, out2
    got2 = requests(second)
    assert counts(got2["A"]) == (8, 4, 0, 0), got2["A"]
    assert counts(got2["B"]) == (12, 0, 0, 0), got2["B"]
    assert (got2["A"]["cost_usd"], got2["B"]["cost_usd"]) == (8.0, 0.75)
    assert second["cost_bound"] == {"max_cost_usd": 100.0, "spent_usd": 8.75, "stopped": False}
    assert history[1]["cost_bound"] == second["cost_bound"]
    assert (a2["batch_creates"], a2["batch_lines"], a2["batch_answers"]) == (2, 12, 12)
    assert (a2["batch_keys"], a2["batch_resubmitted"]) == (12, 0)
    # B's 12 submitted again once: the refused batch ran none of them
    assert (b2["batch_creates"], b2["batch_lines"], b2["batch_answers"]) == (2, 24, 12)
    assert (b2["batch_keys"], b2["batch_resubmitted"]) == (12, 12)
    assert rows(tmp_path / "cache").height == 2 * TASKS
    outcomes = sorted(
        (e.label, e.outcome, e.requests) for e in Ledger(tmp_path / "cache").entries().values()
    )
    assert outcomes == [
        ("A", "completed", 4),
        ("A", "completed", 8),
        ("B", "completed", 12),
        ("B", "failed", 12),
    ]


@pytest.mark.process
@pytest.mark.slow
def test_a_request_waiting_for_the_bound_when_its_batch_is_refused_is_never_submitted(
    tmp_path: Path,
):
    """Model B alone, every batch of its provider refused whole, $0.25 a request at the batch price
    (5 x $50,000 / 10^6), under a bound of $1.50: its first 6 requests fit and go in a batch; the
    7th waits for that batch to settle. The batch is refused: its reservations are released and the
    7th would fit, but the model's batch mode has stopped: it is not submitted (the old code put it
    in a second batch, refused again, and counted 7 sent and 12 not sent of 12 requests).

    Expected, by hand: one batch created; B sent 0, refused 6, not sent 6 (the stop's: the bound
    stopped nothing, $0 spent), exit code 6, and the refusal's line says 6 refused, 6 not sent."""
    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"outcome": "failed"}) as b:
        path = run_file(tmp_path, {"B": (b.url, {"input": 0.0, "output": 100000.0})})
        code, out = dxi_run(path, "1.5")
        stats = b.stats()
    s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert code == EXIT_PROVIDER_STOPPED, out
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_answers"]) == (1, 6, 0)
    got = requests(s)["B"]
    assert counts(got) == (0, 0, 6, 6) and got["cost_usd"] == 0.0, got
    assert s["cost_bound"] == {"max_cost_usd": 1.5, "spent_usd": 0.0, "stopped": False}
    assert "Stopped at the cost bound" not in out
    assert re.search(r"\d\d:\d\d:\d\d B: batch batch_\w+ failed: the input was refused ", out)
    assert "B: B:" not in out  # the model named once, in its log line and in the closing line
    (refusal,) = re.findall(r"Batch API refused: B: .*?one call at a time\)", out)
    assert re.fullmatch(
        r"Batch API refused: B: batch batch_\w+ failed: the input was refused; 6 request\(s\) "
        r"refused, 6 not sent \(rerun without --batch to send them one call at a time\)",
        refusal,
    ), refusal


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_run_stopped_at_the_bound_submits_its_last_batch_once(tmp_path: Path):
    """Model A alone, $1.00 a request at the batch price, 12 requests under a bound of $4.75: 4 fit
    and go in a batch; the 5th waits for it to settle ($4.00 spent), still does not fit ($5.00 >
    $4.75) and the run stops at the bound. The old code then submitted the batch of those 4 a second
    time (the same entry and requests: answered and billed twice, $8.00 at the provider against a
    bound of $4.75; its results thrown away as unknown ids) and counted 8 sent and 1 not sent (the
    other 7 of the same lookup were not counted).

    Expected, by hand: one batch of 4, answered once; sent 4, not sent 8, $4.00 spent; exit code 3
    and the bound's line: 8 not sent, about $8.00 expected (at the batch price, which the next
    ``--batch`` run pays: the old line said $16.00, the synchronous price). The rerun with a higher
    bound sends the other 8, once, in one batch."""
    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False) as a:
        path = run_file(tmp_path, {"A": (a.url, A_PRICE)})
        code, out = dxi_run(path, "4.75")
        first, stats = orjson.loads((tmp_path / "out" / "summary.json").read_bytes()), a.stats()
        code2, _ = dxi_run(path, "20")
        second, stats2 = orjson.loads((tmp_path / "out" / "summary.json").read_bytes()), a.stats()
    assert (code, code2) == (3, 0), out
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_answers"]) == (1, 4, 4)
    assert counts(requests(first)["A"]) == (4, 0, 8, 0)
    assert first["cost_bound"] == {
        "max_cost_usd": 4.75,
        "spent_usd": 4.0,
        "stopped": True,
        "remaining_requests": 8,
        "remaining_cost_usd": 8.0,
        "remaining_bound_usd": 8.0,
    }
    assert (
        "Stopped at the cost bound: spent $4.000000 of $4.75 in this run; 8 request(s) not sent "
        "(about $8.0000 expected)."
    ) in out
    assert (stats2["batch_creates"], stats2["batch_lines"], stats2["batch_answers"]) == (2, 12, 12)
    assert (stats2["batch_keys"], stats2["batch_resubmitted"]) == (12, 0)
    assert counts(requests(second)["A"]) == (8, 4, 0, 0)
    assert second["cost_bound"]["spent_usd"] == 8.0


@pytest.mark.process
@pytest.mark.slow
def test_requests_of_an_expired_batch_are_resubmitted_under_the_bound_and_the_run_ends(
    tmp_path: Path,
):
    """Model A alone, $1.00 a request at the batch price, 12 requests under a bound of $9.50; its
    provider lets the first batch expire (the first half of it answered, the rest given back). The
    first batch holds 9 ($9.00 reserved); it answers 4 ($4.00) and gives 5 back; the other 3
    requests then fit ($7.00) and go in a second batch; of the 5 given back 2 fit ($9.00) and go in
    a third batch, and the 3rd does not ($10.00 > $9.50) once the open batches have settled ($9.00
    spent): those 3, submitted once and never answered, are stored as transient failures, which the
    next run sends. The old code never ended: the given-back requests waited for room under the
    bound inside the loop that polls the batches that would make it.

    Expected, by hand: 3 batches (9, 3 and 2 requests: 14 lines, 9 answers; 4 batches of the same 14
    lines when the requests that fit are submitted apart, as batches settle); sent 12 (each request
    once, however many batches it was in: the old count was per batch), failed 3 (transient), not
    sent 0; $9.00 spent, exit code 3, the bound's line counting the 3 failed; the rerun sends those
    3, once."""
    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"script": ["expired"]}) as a:
        path = run_file(tmp_path, {"A": (a.url, A_PRICE)})
        code, out = dxi_run(path, "9.5")
        first, stats = orjson.loads((tmp_path / "out" / "summary.json").read_bytes()), a.stats()
        code2, _ = dxi_run(path, "20")
        second, stats2 = orjson.loads((tmp_path / "out" / "summary.json").read_bytes()), a.stats()
    assert code == 3, out
    # 14 lines and 9 answers always; how the requests that fit fall into batches depends on when
    # the open ones settle (3 batches here, 4 seen on a loaded machine), never a request twice
    # (``batch_keys`` below)
    assert (stats["batch_lines"], stats["batch_answers"]) == (14, 9)
    assert stats["batch_creates"] in (3, 4)
    got = requests(first)["A"]
    assert counts(got) == (12, 0, 0, 0) and (got["failed"], got["cost_usd"]) == (3, 9.0), got
    assert first["cost_bound"] == {
        "max_cost_usd": 9.5,
        "spent_usd": 9.0,
        "stopped": True,
        "remaining_requests": 3,
        "remaining_cost_usd": 3.0,
        "remaining_bound_usd": 3.0,
    }
    assert (
        "Stopped at the cost bound: spent $9.000000 of $9.5 in this run; 0 request(s) not sent and "
        "3 sent that failed (transient): the next run sends these 3 (about $3.0000 expected)."
    ) in out
    assert code2 == 0
    assert stats2["batch_creates"] == stats["batch_creates"] + 1  # the 3 failed, in one batch
    assert (stats2["batch_lines"], stats2["batch_answers"]) == (17, 12)
    assert stats2["batch_keys"] == 12
    assert counts(requests(second)["A"]) == (3, 9, 0, 0)
    assert second["cost_bound"]["spent_usd"] == 3.0


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_whose_replies_report_0_tokens_is_charged_at_reservation_and_says_so(
    tmp_path: Path,
):
    """Model A alone in batch mode, 12 requests under a bound of $20, its provider reporting 0
    tokens (a server that counts none): each reply's cost is unknown, so it is charged its
    reservation at the batch price, $1.00; the ``requests`` block counts the $12.00 apart as
    ``cost_at_reservation_usd`` (the old code showed $12.00 as spent) while ``usage`` says the cost
    is unknown; so does the ``cost_bound`` block (the old code: its ``spent_usd`` alone)."""
    data_dir(tmp_path / "data", TASKS)
    uncounted = {"/v1/chat/completions": "tests.fakes.responders:uncounted_chat"}
    with serve(model=None, record=False, route_factories=uncounted) as a:
        path = run_file(tmp_path, {"A": (a.url, A_PRICE)})
        code, out = dxi_run(path, "20")
    assert code == 0, out
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    got = requests(summary)["A"]
    assert (got["sent"], got["cost_usd"], got["cost_at_reservation_usd"]) == (12, 12.0, 12.0)
    assert summary["models"][0]["usage"]["cost_usd"] is None
    assert summary["cost_bound"] == {
        "max_cost_usd": 20.0,
        "spent_usd": 12.0,
        "cost_at_reservation_usd": 12.0,  # (the old code: no part said so)
        "stopped": False,
    }
