"""Batch mode's request counts, end to end: each request counted once (``sent + cache_hits +
not_sent + refused`` is the model's requests) when a deadline cancels batches, when a run is
stopped by a signal, and what a rerun collecting an earlier run's batch spends: ``dxi run --batch``
in a process of its own against a fake batch provider in a process of its own
(``tests.fakes.fake_batches``).

The prices make every amount exact in binary (as in ``tests/test_batch_bound.py``): each request is
one When2Call question and the fake reports 5 output tokens for it; input is free. At $400,000 per
million output tokens a request costs $2.00 synchronously and $1.00 at the batch price; capped at
``max_completion_tokens = 1000`` it reserves $400 synchronously and $200 at the batch price."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from .conftest import DXI
from .fakes.fake_provider import serve
from .helpers.batches import iso_in
from .helpers.synthetic import data_dir

TASKS = 16
PRICE = "openai:m=0/400000"


def dxi_run(tmp: Path, url: str, *flags: str) -> tuple[int, str]:
    """``dxi run --batch`` of model ``openai:m`` at ``url`` over ``tmp/data`` (its exit code and
    standard output, blanks collapsed)."""
    done = subprocess.run(
        [
            DXI,
            "run",
            "--data-dir",
            str(tmp / "data"),
            "--cache-dir",
            str(tmp / "cache"),
            "--out",
            str(tmp / "out"),
            "--model",
            f"openai:m@{url}/v1",
            "--param",
            "max_completion_tokens=1000",
            "--price",
            PRICE,
            "--batch",
            "--poll",
            "0.05",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, " ".join(done.stdout.split())


def counts(tmp: Path) -> dict:
    (m,) = orjson.loads((tmp / "out" / "summary.json").read_bytes())["models"]
    r = m["requests"]
    return {k: r[k] for k in ("sent", "cache_hits", "not_sent", "refused", "cost_usd")} | {
        "unanswered": r["batches"].get("unanswered"),
        "given_back": r["batches"]["given_back"],
    }


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("fallback", ["sync", "none"])
def test_requests_a_cancelled_batch_gives_back_are_counted_sent_once(tmp_path: Path, fallback):
    """16 requests, batches of 8, under a bound of $2,500: 12 reservations of $200 fit, so the first
    8 go in a batch, the next 4 in a second one, and the 13th waits for room. The batches never end
    on their own; at the deadline both are cancelled and end ``cancelled`` with the first half of
    each answered: 4 + 2 stored ($6.00), 4 + 2 given back. The 13th to 16th then fit, but nothing is
    submitted past the deadline: 10 requests are left, 6 of them sent already.

    Expected, by hand: with ``--deadline-fallback sync`` the 10 are sent one call at a time ($2.00
    each, $20.00; at most 6 reservations of $400 at once fit): sent 16 (the old code: 22, the 6
    counted again), $26.00, exit 0. Without it: sent 12 (6 of them unanswered), not sent 4 (the old
    code: 10, the 6 counted twice), $6.00, exit 1, and the line says both."""
    data_dir(tmp_path / "data", TASKS)
    config = {"polls": 100000, "cancel_polls": 2}
    with serve(model=None, record=False, batch=config) as server:
        code, out = dxi_run(
            tmp_path,
            server.url,
            "--batch-size",
            "8",
            "--max-cost",
            "2500",
            "--deadline",
            iso_in(6),
            "--deadline-fallback",
            fallback,
        )
        stats = server.stats()
    got = counts(tmp_path)
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_cancels"]) == (2, 12, 2)
    if fallback == "sync":
        assert code == 0, out
        assert "sending the 10 request(s) left synchronously" in out
        assert got == {
            "sent": 16,
            "cache_hits": 0,
            "not_sent": 0,
            "refused": 0,
            "cost_usd": 26.0,
            "unanswered": 0,
            "given_back": 6,
        }
    else:
        assert code == 1, out
        assert got == {
            "sent": 12,
            "cache_hits": 0,
            "not_sent": 4,
            "refused": 0,
            "cost_usd": 6.0,
            "unanswered": 6,
            "given_back": 6,
        }
        assert (
            "openai:m: 10 request(s) not answered by batch (4 not sent, 6 sent in a batch that gave "
            "them back) (the deadline, or the cost bound)"
        ) in out
    assert got["sent"] + got["cache_hits"] + got["not_sent"] + got["refused"] == TASKS


@pytest.mark.process
@pytest.mark.slow
def test_a_stopped_batch_run_counts_the_requests_not_in_a_batch_not_sent(tmp_path: Path):
    """16 requests, batches of 5, under a bound of $2,000: 10 reservations of $200 fit, so two
    batches of 5 are submitted and the 11th waits for room; the batches run on (100,000 status
    reads). Ctrl-C (SIGINT) once both are created: the polling and the wait end.

    Expected, by hand: exit code 130; sent 10 (the two open batches: the next run collects them),
    not sent 6 (the 11th, waiting for room, and the 5 never streamed; the old code: 0), and the last
    line says 6 were not sent and that the open batches keep running."""
    import signal
    import time

    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        args = [
            DXI,
            "run",
            "--data-dir",
            str(tmp_path / "data"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
            "--model",
            f"openai:m@{server.url}/v1",
            "--param",
            "max_completion_tokens=1000",
            "--price",
            PRICE,
            "--batch",
            "--poll",
            "0.05",
            "--batch-size",
            "5",
            "--max-cost",
            "2000",
        ]
        with subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            give_up = time.monotonic() + 60
            while server.stats()["batch_creates"] < 2 and time.monotonic() < give_up:
                time.sleep(0.1)
            time.sleep(0.5)  # the 11th request is waiting for room
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        stats = server.stats()
    assert "Traceback" not in out + err, err
    assert proc.returncode == 130, out + err
    assert (stats["batch_creates"], stats["batch_lines"]) == (2, 10)
    (history,) = [orjson.loads(line) for line in (tmp_path / "out" / "run-history.jsonl").open()]
    r = history["requests"]["openai:m"]
    assert (r["sent"], r["cache_hits"], r["not_sent"], r["refused"]) == (10, 0, 6, 0), r
    assert r["batches"]["running"] == 2
    last = " ".join(err.split())
    assert "6 request(s) were not sent" in last
    assert "Open batches keep running at the provider: the next run collects them" in last


@pytest.mark.process
@pytest.mark.slow
def test_a_rerun_collecting_an_earlier_runs_batch_keeps_its_cost_out_of_its_own_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A ``--batch --max-cost 5000`` run is killed (SIGKILL) right after its batch of 16 requests
    is submitted (``DXI_FAILPOINT=submitted``); the rerun, under a bound of $1, collects it: its
    16 answers at the batch price, $1.00 each, $16.00, were reserved and paid by the run that
    submitted the batch.

    Expected, by hand: the rerun sends nothing and exits 0; its cost bound's ``spent_usd`` is $0
    (the old code: $16.00, over its bound of $1), ``earlier_batches_usd`` $16.00; the model's
    ``cost_usd`` $16.00, ``batches.from_earlier_runs`` 16 and ``from_earlier_runs_usd`` $16.00; the
    progress line says "(run $0.0000 of $1; $16.0000 earlier runs' batches)"."""
    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False) as server:
        monkeypatch.setenv("DXI_FAILPOINT", "submitted")
        code, _ = dxi_run(tmp_path, server.url, "--max-cost", "5000")
        monkeypatch.delenv("DXI_FAILPOINT")
        assert code == -9
        code, out = dxi_run(tmp_path, server.url, "--max-cost", "1")
        stats = server.stats()
    assert code == 0, out
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_answers"]) == (1, 16, 16)
    s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert s["cost_bound"] == {
        "max_cost_usd": 1.0,
        "spent_usd": 0.0,
        "stopped": False,
        "earlier_batches_usd": 16.0,
    }
    (m,) = s["models"]
    r = m["requests"]
    assert (r["sent"], r["cache_hits"], r["not_sent"], r["cost_usd"]) == (0, 0, 0, 16.0)
    assert (r["batches"]["from_earlier_runs"], r["batches"]["from_earlier_runs_usd"]) == (16, 16.0)
    assert "$16.0000 (run $0.0000 of $1; $16.0000 earlier runs' batches)" in out


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_whose_results_are_gone_is_charged_its_reservation(tmp_path: Path):
    """The first batch (16 requests, $1.00 reserved each at the batch price: 5 output tokens capped
    at 5) ends, but its results are gone at the provider (404): it ran them, and billed them. Its
    requests are given back and answered by a second batch ($16.00).

    Expected, by hand: as a synchronous reply that never arrived, each reservation is kept as spent:
    the first batch's ledger entry costs $16.00 (the old code: $0), the run spends $32.00 and the
    model's ``cost_usd`` is $32.00 (sent 16, once), of which the $16.00 kept is at reservation
    (``cost_at_reservation_usd``: at most that was spent; the old code counted it a spend)."""
    from dxi.cache.ledger import Ledger

    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"polls": 1, "gone": 1}) as server:
        code, out = dxi_run(
            tmp_path,
            server.url,
            "--max-cost",
            "100",
            "--param",
            "max_completion_tokens=5",  # (over dxi_run's 1000: the last one given counts)
        )
        stats = server.stats()
    assert code == 0, out
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_answers"]) == (2, 32, 32)
    first, second = sorted(Ledger(tmp_path / "cache").entries().values(), key=lambda e: e.created)
    assert (first.cost_usd, second.cost_usd) == (16.0, 16.0)
    s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert s["cost_bound"] == {"max_cost_usd": 100.0, "spent_usd": 32.0, "stopped": False}
    got = counts(tmp_path)
    assert (got["sent"], got["cost_usd"], got["given_back"]) == (16, 32.0, 16)
    assert s["models"][0]["requests"]["cost_at_reservation_usd"] == 16.0
