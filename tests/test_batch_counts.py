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
            "--evals",
            "when2call",  # the synthetic data: When2Call only
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
            "--evals",
            "when2call",  # the synthetic data: When2Call only
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
    # what the two open batches hold: 10 reservations of $200, at most (the old code: nothing)
    (e1, e2) = r["batches"]["open"].pop("entries")
    assert r["batches"]["open"] == {"requests": 10, "answers": 10, "reserved_usd": 2000.0}
    assert (history["cost_bound"]["spent_usd"], history["cost_bound"]["open_batches_usd"]) == (
        0.0,
        2000.0,
    )
    assert (
        "10 of them are in batches still open at the provider, which `dxi batches collect` or the "
        "next `dxi run` collects (it does not ask for them again); it asks for the other 6 again"
    ) in " ".join(out.split())
    last = " ".join(err.split())
    assert "6 request(s) were not sent" in last
    assert (
        "Open batches of this run (10 request(s), at most $2000.0000 reserved) keep running at the "
        "provider: the next run collects them"
    ) in last


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
def test_a_batch_left_open_by_ctrl_c_is_committed_by_its_run_and_costed_once_by_the_collector(
    tmp_path: Path,
):
    """A ``--batch --max-cost 5000`` run submits one batch of 16 requests ($200 reserved each at the
    batch price: $3,200) and is stopped by Ctrl-C while it runs (8 status reads before it ends); the
    rerun collects it: 16 answers at $1.00, $16.00.

    Expected, by hand: the first line records what it committed, ``batches.open`` {one entry, 16
    requests, 16 answers, ``reserved_usd`` $3,200} and ``cost_bound.open_batches_usd`` $3,200, with
    ``cost_usd`` and ``spent_usd`` $0 (the old code: nothing but ``sent`` 16 and $0); its note says
    the 16 missing answers are collected by the next run (the old code: "asks for 16 of them
    again"); the second line records the actual $16.00 in ``cost_usd`` and ``earlier_batches_usd``,
    naming the same entry in ``from_earlier_entries``, its own ``spent_usd`` $0; the models'
    ``cost_usd`` over the two lines sum to $16.00; the usage table says both under "this run"."""
    import signal
    import time

    data_dir(tmp_path / "data", TASKS)
    args = [
        "--max-cost",
        "5000",
    ]
    with serve(model=None, record=False, batch={"polls": 8}) as server:
        cmd = [DXI, "run", "--data-dir", str(tmp_path / "data"), "--cache-dir"]
        cmd += [str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
        cmd += ["--model", f"openai:m@{server.url}/v1", "--param", "max_completion_tokens=1000"]
        cmd += ["--price", PRICE, "--batch", "--poll", "0.05", "--evals", "when2call", *args]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
            give_up = time.monotonic() + 60
            while server.stats()["batch_creates"] < 1 and time.monotonic() < give_up:
                time.sleep(0.05)
            p.send_signal(signal.SIGINT)
            first, err = p.communicate(timeout=60)
        assert p.returncode == 130, first + err
        code, second = dxi_run(tmp_path, server.url, *args)
        stats = server.stats()
    assert code == 0, second
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_answers"]) == (1, 16, 16)
    one, two = [orjson.loads(line) for line in (tmp_path / "out" / "run-history.jsonl").open()]
    r1, r2 = one["requests"]["openai:m"], two["requests"]["openai:m"]
    (entry,) = r1["batches"]["open"]["entries"]
    assert r1["batches"]["open"] == {
        "entries": [entry],
        "requests": 16,
        "answers": 16,
        "reserved_usd": 3200.0,
    }
    assert (r1["sent"], r1["cost_usd"]) == (16, 0.0)
    assert one["cost_bound"] == {
        "max_cost_usd": 5000.0,
        "spent_usd": 0.0,
        "stopped": False,
        "open_batches_usd": 3200.0,
    }
    assert (r2["sent"], r2["cost_usd"], r2["batches"]["from_earlier_runs_usd"]) == (0, 16.0, 16.0)
    assert r2["batches"]["from_earlier_entries"] == [entry]
    assert "open" not in r2["batches"]
    assert two["cost_bound"] == {
        "max_cost_usd": 5000.0,
        "spent_usd": 0.0,
        "stopped": False,
        "earlier_batches_usd": 16.0,
    }
    assert r1["cost_usd"] + r2["cost_usd"] == 16.0
    first = " ".join(first.split())
    assert (
        "16 of them are in batches still open at the provider, which `dxi batches collect` or the "
        "next `dxi run` collects (it does not ask for them again)."
    ) in first
    assert (
        "this run, openai:m: 16 request(s) in batches still open at the provider, at most "
        "$3200.0000 (their reservations), not in this run's cost: the run that collects them "
        "records what they cost"
    ) in first
    assert (
        "this run, openai:m: $16.0000 of it answered batches earlier runs submitted (theirs, "
        "under their bounds where they had one: not this run's own spend; under a bound, "
        "cost_bound.earlier_batches_usd)"
    ) in second


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_whose_results_are_gone_is_charged_its_reservation(tmp_path: Path):
    """The first batch (16 requests, $1.00 reserved each at the batch price: 5 output tokens capped
    at 5) ends, but its results are gone at the provider (404): it ran them, and billed them. Its
    requests are given back and answered by a second batch ($16.00).

    Expected, by hand: as a synchronous reply that never arrived, each reservation is kept as spent:
    the first batch's ledger entry costs $16.00 (the old code: $0), the run spends $32.00 and the
    model's ``cost_usd`` is $32.00 (sent 16, once); the $16.00 kept is the part of each charged at
    reservation (``cost_at_reservation_usd``, in the model's block and the cost bound's: the old
    code had it in neither)."""
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
    assert s["cost_bound"] == {
        "max_cost_usd": 100.0,
        "spent_usd": 32.0,
        "cost_at_reservation_usd": 16.0,
        "stopped": False,
    }
    got = counts(tmp_path)
    assert (got["sent"], got["cost_usd"], got["given_back"]) == (16, 32.0, 16)
    # the reservations kept are counted apart, as any charged at reservation (cost unknown)
    assert s["models"][0]["requests"]["cost_at_reservation_usd"] == 16.0


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_reply_that_is_not_the_wire_format_is_charged_its_reservation(tmp_path: Path):
    """Every result line of every batch carries a reply that is not the wire format (a 200 whose
    body is no chat completion), under ``--max-attempts 2``: the 16 requests go in a batch, come
    back unreadable, go in a second batch, come back unreadable again, and are stored as transient
    failures (the next run sends them). The provider ran and billed each of the 32 lines.

    Expected, by hand: as a synchronous reply that is not the wire format, each attempt is charged
    its reservation ($200 at the batch price): $6,400 (the old code: $0), all of it at reservation,
    in the model's ``cost_usd`` and ``cost_at_reservation_usd`` and in the cost bound's
    ``spent_usd`` and ``cost_at_reservation_usd``; sent 16 (once each), failed 16, exit 1."""
    data_dir(tmp_path / "data", TASKS)
    config = {"polls": 1, "line_faults": {"malformed": 1.0}}
    with serve(model=None, record=False, batch=config) as server:
        code, out = dxi_run(tmp_path, server.url, "--max-attempts", "2", "--max-cost", "10000")
        stats = server.stats()
    assert code == 1, out
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_line_malformed"]) == (
        2,
        32,
        32,
    )
    s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    r = s["models"][0]["requests"]
    assert (r["sent"], r["failed"], r["not_sent"]) == (16, 16, 0)
    assert (r["cost_usd"], r["cost_at_reservation_usd"]) == (6400.0, 6400.0)
    assert s["cost_bound"] == {
        "max_cost_usd": 10000.0,
        "spent_usd": 6400.0,
        "cost_at_reservation_usd": 6400.0,
        "stopped": False,
    }


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_result_line_that_cannot_be_read_is_charged_its_reservation(tmp_path: Path):
    """One batch of the 16 requests; the lines of its first 4 come back cut short (not JSON: their
    ids cannot be read). Those 4 requests have no result: they are given back and answered by a
    second batch. The provider ran and billed the 4 unreadable lines.

    Expected, by hand: each of the 4 is charged its reservation ($200 at the batch price), as a
    synchronous reply that is not the wire format: $800 (the old code: $0) on top of the 20 answers
    read, $1.00 each: the model's ``cost_usd`` $816.00 (``cost_at_reservation_usd`` $800.00), the
    first batch's ledger entry $812.00 (``kept_usd`` $800.00), the cost bound's ``spent_usd``
    $816.00 of which $800.00 at reservation; sent 16, once each; 4 results counted unknown and 4
    given back; exit 0."""
    from dxi.cache.ledger import Ledger

    data_dir(tmp_path / "data", TASKS)
    config = {"polls": 1, "extra_results": {"garbled": 4}}
    with serve(model=None, record=False, batch=config) as server:
        code, out = dxi_run(tmp_path, server.url, "--max-cost", "5000")
        stats = server.stats()
    assert code == 0, out
    assert (
        stats["batch_creates"],
        stats["batch_lines"],
        stats["batch_answers"],
        stats["batch_line_garbled"],
    ) == (2, 20, 20, 4)
    assert "batch_" in out and "4 result(s) whose id is none of its requests'" in out
    s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    r = s["models"][0]["requests"]
    assert (r["sent"], r["failed"], r["not_sent"]) == (16, 0, 0)
    assert (r["cost_usd"], r["cost_at_reservation_usd"]) == (816.0, 800.0)
    assert (r["batches"]["unknown_results"], r["batches"]["given_back"]) == (4, 4)
    assert s["cost_bound"] == {
        "max_cost_usd": 5000.0,
        "spent_usd": 816.0,
        "cost_at_reservation_usd": 800.0,
        "stopped": False,
    }
    (history,) = [orjson.loads(line) for line in (tmp_path / "out" / "run-history.jsonl").open()]
    assert history["cost_bound"] == s["cost_bound"]
    first, second = sorted(Ledger(tmp_path / "cache").entries().values(), key=lambda e: e.created)
    assert (first.cost_usd, second.cost_usd) == (812.0, 4.0)


@pytest.mark.process
@pytest.mark.slow
def test_a_request_a_completed_batch_leaves_out_is_charged_its_reservation(tmp_path: Path):
    """One batch of the 16 requests ends completed, but its results have no line at all for its
    last 4 requests (none in the output file, none in the error file, no unreadable line). A
    completed batch's results cover every request (OpenAI: its output and error files; Anthropic:
    each request's result type), so the 4 ran and may have been billed: they are given back and
    answered by a second batch.

    Expected, by hand: as a synchronous reply that never arrived, each of the 4 keeps its
    reservation ($200 at the batch price) as spent: $800 (the old code: $0) on top of the 20
    answers read, $1.00 each: the model's ``cost_usd`` $816.00 (``cost_at_reservation_usd``
    $800.00), the first batch's ledger entry $812.00 (``kept_usd`` $800.00, ``omitted`` 4 on its
    ``collected`` event), the cost bound's ``spent_usd`` $816.00 of which $800.00 at reservation;
    sent 16, once each; no result counted unknown, 4 given back; exit 0."""
    from dxi.cache.ledger import Ledger

    data_dir(tmp_path / "data", TASKS)
    config = {"polls": 1, "extra_results": {"omitted": 4}}
    with serve(model=None, record=False, batch=config) as server:
        code, out = dxi_run(tmp_path, server.url, "--max-cost", "5000")
        stats = server.stats()
    assert code == 0, out
    assert (
        stats["batch_creates"],
        stats["batch_lines"],
        stats["batch_answers"],
        stats["batch_line_omitted"],
    ) == (2, 20, 20, 4)
    s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    r = s["models"][0]["requests"]
    assert (r["sent"], r["failed"], r["not_sent"]) == (16, 0, 0)
    assert (r["cost_usd"], r.get("cost_at_reservation_usd")) == (816.0, 800.0)
    assert (r["batches"]["unknown_results"], r["batches"]["given_back"]) == (0, 4)
    assert s["cost_bound"] == {
        "max_cost_usd": 5000.0,
        "spent_usd": 816.0,
        "cost_at_reservation_usd": 800.0,
        "stopped": False,
    }
    ledger = Ledger(tmp_path / "cache")
    first, second = sorted(ledger.entries().values(), key=lambda e: e.created)
    assert (first.cost_usd, second.cost_usd) == (812.0, 4.0)
    events = [orjson.loads(line) for line in ledger.path.open()]
    (collected,) = [e for e in events if (e["event"], e["entry"]) == ("collected", first.id)]
    assert (collected.get("omitted"), collected.get("kept_usd"), len(collected["returned"])) == (
        4,
        800.0,
        4,
    )
    assert "4 request(s) without a result line in a completed batch" in out


@pytest.mark.process
@pytest.mark.slow
def test_a_request_given_back_that_the_bound_keeps_from_the_fallback_stays_sent(tmp_path: Path):
    """16 requests under a bound of $399, the batch price set to a quarter of the price (the run
    file's ``batch_output``): a request reserves $100 in a batch ($0.50 answered) and $400
    synchronously. 3 reservations fit, so the first 3 go in a batch and the 4th waits for room.
    The batch never ends on its own; at the deadline it is cancelled and ends with 1 of the 3
    answered ($0.50) and 2 given back. Nothing is submitted past the deadline: 15 are left, 2 of
    them sent already; ``--deadline-fallback sync`` would send them, but a synchronous reservation
    ($400) never fits ($0.50 + $400 > $399): the bound stops it before anything is sent.

    Expected, by hand: sent 3 (the old code: 1, the 2 given back counted not sent), of them 1
    answered and 2 ``unanswered``, not sent 13 (the old code: 15); $0.50 spent; exit code 3; the
    bound's line counts both and they add up to what the next run sends: "13 request(s) not sent
    and 2 sent in a batch that gave them back: the next run sends these 15" (about 15 x $0.50 =
    $7.50 at the batch price)."""
    data_dir(tmp_path / "data", TASKS)
    config = {"polls": 100000, "cancel_polls": 2}
    with serve(model=None, record=False, batch=config) as server:
        path = tmp_path / "run.toml"
        path.write_text(
            f"""data_dir = "data"
cache_dir = "cache"
out = "out"
[providers.p]
kind = "openai"
base_url = "{server.url}/v1"
batch = true
[[models]]
name = "m"
provider = "p"
model = "m"
params = {{ max_completion_tokens = 1000 }}
price = {{ input = 0.0, output = 400000.0, batch_input = 0.0, batch_output = 100000.0 }}
[evals]
select = ["when2call"]
"""
        )
        done = subprocess.run(
            [DXI, "run", str(path), "--poll", "0.05", "--max-cost", "399"]
            + ["--deadline", iso_in(6), "--deadline-fallback", "sync"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        stats = server.stats()
    out = " ".join(done.stdout.split())
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == 3, out
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_cancels"]) == (1, 3, 1)
    assert "sending the 15 request(s) left synchronously" in out
    got = counts(tmp_path)
    assert got == {
        "sent": 3,
        "cache_hits": 0,
        "not_sent": 13,
        "refused": 0,
        "cost_usd": 0.5,
        "unanswered": 2,
        "given_back": 2,
    }
    assert got["sent"] + got["cache_hits"] + got["not_sent"] + got["refused"] == TASKS
    assert (
        "Stopped at the cost bound: spent $0.500000 of $399 in this run; 13 request(s) not sent "
        "and 2 sent in a batch that gave them back: the next run sends these 15 (about $7.5000 "
        "expected)."
    ) in out


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize(("step", "sent"), [("create", 5), ("upload", 0)])
def test_a_stop_while_a_batch_is_submitted_counts_its_requests(tmp_path: Path, step, sent):
    """16 requests, batches of 5: the first batch's ``step`` (its input file's upload, or the
    create) stalls at the provider for 30 s, and Ctrl-C (SIGINT) lands meanwhile. Its 5 requests
    are in the ledger (their intent, no batch id yet); the 6th was being added when the full batch
    was submitted, the other 10 are not streamed yet.

    Expected, by hand: exit code 130, each of the 16 counted once (the old code counted the 5
    neither sent nor not sent: 11 of 16). Cut in the create (it went out: the batch may exist, the
    next run finds it by its tag): sent 5, not sent 11. Cut in the upload (no batch can exist):
    sent 0, not sent 16, and the last line says so."""
    import signal
    import time

    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"hold": {step: 30}}) as server:
        args = [
            DXI,
            "run",
            "--data-dir",
            str(tmp_path / "data"),
            "--evals",
            "when2call",  # the synthetic data: When2Call only
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
            "--model",
            f"openai:m@{server.url}/v1",
            "--price",
            PRICE,
            "--batch",
            "--poll",
            "0.05",
            "--batch-size",
            "5",
        ]
        with subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            give_up = time.monotonic() + 60
            while server.stats().get(f"arrived_{step}", 0) < 1 and time.monotonic() < give_up:
                time.sleep(0.1)
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
    assert "Traceback" not in out + err, err
    assert proc.returncode == 130, out + err
    (history,) = [orjson.loads(line) for line in (tmp_path / "out" / "run-history.jsonl").open()]
    r = history["requests"]["openai:m"]
    assert (r["sent"], r["cache_hits"], r["not_sent"], r["refused"]) == (sent, 0, TASKS - sent, 0)
    assert f"{TASKS - sent} request(s) were not sent" in " ".join(err.split())


def dxi_collect(tmp: Path, url: str, *flags: str) -> tuple[int, str]:
    """``dxi batches collect --wait`` of model ``openai:m`` at ``url`` over ``tmp/data`` (its exit
    code and standard output, blanks collapsed)."""
    done = subprocess.run(
        [DXI, "batches", "collect", "--data-dir", str(tmp / "data"), "--evals", "when2call"]
        + ["--cache-dir", str(tmp / "cache"), "--out", str(tmp / "out")]
        + ["--model", f"openai:m@{url}/v1", "--param", "max_completion_tokens=1000"]
        + ["--wait", "--poll", "0.05", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, " ".join(done.stdout.split())


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_the_lines_of_run_history_sum_to_what_the_provider_billed_when_dxi_batches_collect_collects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
):
    """A ``--batch --max-cost 5000`` run submits one batch of 16 requests ($200 reserved each at
    the batch price) and is stopped while it runs: by Ctrl-C (its line records the batch open,
    ``reserved_usd`` $3,200, $0 spent) or by SIGKILL right after the submission (no line). ``dxi
    batches collect --wait`` collects it (priced as the run's line recorded it after Ctrl-C; given
    ``--price`` after the kill, which left no line); then the same run again finds every answer in
    the cache.

    Expected, by hand: the provider answered (billed) 16 requests at $1.00: $16.00. The collect's
    line (``command`` "batches collect", the old code: none) records ``cost_usd`` $16.00, the
    entry in ``from_earlier_entries`` and ``collected``, ``cost_bound`` null; the last run's line
    16 cache hits and $0. The models' ``cost_usd`` over every line: $16.00 (the old code: $0)."""
    import signal
    import time

    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"polls": 8}) as server:
        if stop == "kill":
            monkeypatch.setenv("DXI_FAILPOINT", "submitted")
            assert dxi_run(tmp_path, server.url, "--max-cost", "5000")[0] == -9
            monkeypatch.delenv("DXI_FAILPOINT")
        else:
            cmd = [DXI, "run", "--data-dir", str(tmp_path / "data"), "--cache-dir"]
            cmd += [str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--evals", "when2call"]
            cmd += ["--model", f"openai:m@{server.url}/v1", "--param", "max_completion_tokens=1000"]
            cmd += ["--price", PRICE, "--batch", "--poll", "0.05", "--max-cost", "5000"]
            with subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            ) as p:
                give_up = time.monotonic() + 60
                while server.stats()["batch_creates"] < 1 and time.monotonic() < give_up:
                    time.sleep(0.05)
                p.send_signal(signal.SIGINT)
                p.communicate(timeout=60)
            assert p.returncode == 130
        code, out = dxi_collect(
            tmp_path, server.url, *(["--price", PRICE] if stop == "kill" else [])
        )
        assert code == 0, out
        assert "openai:m: 16 result(s) stored, 0 given back" in out
        code, out = dxi_run(tmp_path, server.url, "--max-cost", "5000")
        assert code == 0, out
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_answers"], stats["ok"]) == (
        1,
        16,
        16,
        0,
    )
    billed = stats["batch_answers"] * 1.0  # 5 output tokens at $200,000 per million each
    lines = [orjson.loads(line) for line in (tmp_path / "out" / "run-history.jsonl").open()]
    assert [line.get("command") for line in lines] == (
        [None, "batches collect", None] if stop == "ctrl-c" else ["batches collect", None]
    )
    collect, rerun = lines[-2], lines[-1]
    r = collect["requests"]["openai:m"]
    (entry,) = r["batches"]["from_earlier_entries"]
    assert (collect["exit_code"], collect["outcome"], collect["collected"]) == (0, "done", [entry])
    assert (collect["cost_bound"], collect["selection"]["prices"]) == (
        None,
        {"openai:m": [0.0, 400000.0]},
    )
    assert (r["sent"], r["cost_usd"], r["batches"]["from_earlier_runs_usd"]) == (0, 16.0, 16.0)
    if stop == "ctrl-c":  # the run's line holds the batch open, at most its reservations
        assert lines[0]["requests"]["openai:m"]["batches"]["open"]["entries"] == [entry]
        assert lines[0]["requests"]["openai:m"]["cost_usd"] == 0.0
    again = rerun["requests"]["openai:m"]
    assert (again["sent"], again["cache_hits"], again["cost_usd"]) == (0, 16, 0.0)
    assert sum(b["cost_usd"] for line in lines for b in line["requests"].values()) == billed == 16.0


@pytest.mark.process
@pytest.mark.slow
def test_dxi_score_run_later_says_which_missing_answers_open_batches_hold(tmp_path: Path):
    """4 of the 16 tasks answered one call at a time (``--limit 4``), then ``--batch --batch-size 5
    --max-cost 2000`` over all 16: two batches of 5 are submitted ($200 reserved each: 10 fit),
    the 11th request waits for room and Ctrl-C stops the run with both batches open (100,000 status
    reads). ``dxi score --all-tasks`` later, the cache alone.

    Expected, by hand: 12 answers missing; 10 of them in the two open batches (``dxi batches
    collect`` or the next ``dxi run`` collects them), the other 2 asked for again (the old code:
    "asks for 12 of them again"); ``requests.in_open_batches`` {10 requests, 10 answers}. Scoring
    every model in the cache (no ``--model``): the same (its model rebuilt from its cache rows and
    the ledger's server; the old code named its 2 open batches, without counts: "asks for 12 of
    them again, but for those that its 2 open batch(es) at the provider hold")."""
    import signal
    import time

    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        model = f"openai:m@{server.url}/v1"
        cmd = [DXI, "run", "--data-dir", str(tmp_path / "data"), "--evals", "when2call"]
        cmd += ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
        cmd += ["--model", model, "--param", "max_completion_tokens=1000", "--price", PRICE]
        sync = subprocess.run([*cmd, "--limit", "4"], capture_output=True, text=True, timeout=120)
        assert sync.returncode == 0, sync.stdout + sync.stderr
        cmd += ["--batch", "--poll", "0.05", "--batch-size", "5", "--max-cost", "2000"]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
            give_up = time.monotonic() + 60
            while server.stats()["batch_creates"] < 2 and time.monotonic() < give_up:
                time.sleep(0.1)
            time.sleep(0.5)  # the 11th request is waiting for room
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=60)
        assert p.returncode == 130
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_lines"]) == (2, 10)
    for given in ([model], []):
        score = [DXI, "score", "--data-dir", str(tmp_path / "data"), "--evals", "when2call"]
        score += ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "scored")]
        score += ["--all-tasks"] if given else []
        score += [a for m in given for a in ("--model", m, "--param", "max_completion_tokens=1000")]
        done = subprocess.run(score, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        said = " ".join(done.stdout.split())
        (m,) = orjson.loads((tmp_path / "scored" / "summary.json").read_bytes())["models"]
        assert m["requests"]["in_open_batches"] == {"requests": 10, "answers": 10}
        assert (
            "12 missing answer(s) in When2Call, left out: its figures are over the answered "
            "questions; whatever those answers turn out to be, they lie within: When2Call "
            "accuracy [0.0, 75.0]; 10 of them are in batches still open at the provider, which "
            "`dxi batches collect` or the next `dxi run` collects (it does not ask for them "
            "again); it asks for the other 2 again."
        ) in said, said


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_left_open_without_a_bound_on_its_output_is_not_called_at_most(tmp_path: Path):
    """A ``--batch`` run with no ``--max-cost`` and no output cap submits one batch of 16 requests
    (input free, output priced: each reservation holds its input alone, $0) and Ctrl-C stops it
    while the batch runs (100,000 status reads).

    Expected, by hand: the open batch's ``reserved_usd`` null (the old code: $0, "at most"),
    ``input_usd`` $0 and the reason; no ``cost_bound``; the last line says "$0.0000 reserved for
    their input; their output is not bounded" (the old code: "at most $0.0000 reserved"), and so
    does the usage table."""
    import signal
    import time

    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        cmd = [DXI, "run", "--data-dir", str(tmp_path / "data"), "--evals", "when2call"]
        cmd += ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
        cmd += ["--model", f"openai:m@{server.url}/v1", "--price", PRICE, "--batch"]
        cmd += ["--poll", "0.05"]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
            give_up = time.monotonic() + 60
            while server.stats()["batch_creates"] < 1 and time.monotonic() < give_up:
                time.sleep(0.05)
            time.sleep(0.3)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=60)
    assert "Traceback" not in out + err, err
    assert p.returncode == 130, out + err
    (history,) = [orjson.loads(line) for line in (tmp_path / "out" / "run-history.jsonl").open()]
    held = history["requests"]["openai:m"]["batches"]["open"]
    (entry,) = held.pop("entries")
    reason = (
        "their output is not bounded (no --max-cost, no output cap: max_completion_tokens, "
        "max_tokens, maxOutputTokens)"
    )
    assert held == {
        "requests": 16,
        "answers": 16,
        "reserved_usd": None,
        "input_usd": 0.0,
        "cost_reason": reason,
    }
    assert history["cost_bound"] is None
    assert (
        f"Open batches of this run (16 request(s), $0.0000 reserved for their input; {reason}) "
        "keep running at the provider"
    ) in " ".join(err.split())
    assert (
        "16 request(s) in batches still open at the provider, $0.0000 reserved for their input "
        f"({reason}), not in this run's cost"
    ) in " ".join(out.split())


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("ledger", ["priced", "older"])
def test_dxi_batches_collect_prices_a_killed_runs_batch_as_its_ledger_recorded_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ledger: str
):
    """A ``--batch --price`` run is killed (SIGKILL) right after its batch of 16 requests is
    submitted: it writes no line in run-history.jsonl. ``dxi batches collect --wait`` is given no
    ``--price``; with an ``older`` ledger its intent has no ``price`` (taken out by hand).

    Expected, by hand: the intent records the run's price [0, 400000]; collect says where it took
    it and its line has ``cost_usd`` $16.00 (16 answers at $1.00; the old code: null, silently).
    From the older ledger: ``cost_usd`` null, and a warning names the model and ``--price``."""
    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False) as server:
        monkeypatch.setenv("DXI_FAILPOINT", "submitted")
        assert dxi_run(tmp_path, server.url)[0] == -9
        monkeypatch.delenv("DXI_FAILPOINT")
        path = tmp_path / "cache" / "batches" / "ledger.jsonl"
        events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        (intent,) = [e for e in events if e["event"] == "intent"]
        assert intent["price"] == [0.0, 400000.0]
        if ledger == "older":
            path.write_bytes(
                b"".join(
                    orjson.dumps({k: v for k, v in e.items() if k != "price"}) + b"\n"
                    for e in events
                )
            )
        done = subprocess.run(
            [DXI, "batches", "collect", "--data-dir", str(tmp_path / "data")]
            + ["--evals", "when2call", "--cache-dir", str(tmp_path / "cache")]
            + ["--out", str(tmp_path / "out"), "--model", f"openai:m@{server.url}/v1"]
            + ["--param", "max_completion_tokens=1000", "--wait", "--poll", "0.05"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    out, err = " ".join(done.stdout.split()), " ".join(done.stderr.split())
    assert done.returncode == 0, out + err
    assert "openai:m: 16 result(s) stored, 0 given back" in out
    (line,) = [orjson.loads(line) for line in (tmp_path / "out" / "run-history.jsonl").open()]
    warning = (
        "warning: openai:m: no price for this model (none given, none recorded by its run or its "
        "batches): what it collected has cost_usd null in run-history.jsonl; give it with --price "
        "MODEL=IN/OUT (USD per million input / output tokens)"
    )
    if ledger == "priced":
        assert line["requests"]["openai:m"]["cost_usd"] == 16.0
        assert (
            f"openai:m: priced as its batch {intent['entry']} recorded it (the batch ledger)" in out
        )
        assert "no price" not in err
    else:
        assert line["requests"]["openai:m"]["cost_usd"] is None
        assert warning in err, err
