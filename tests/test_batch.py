"""Batch mode end to end (``dxi run --batch``, docs/batch.md) against the fake batch servers of the
three providers (``tests.fakes.fake_batches``, every request and reply checked against the official
SDKs' types): the same rows and summary as a synchronous run, batches that expire, are cancelled at
a deadline or lost, per-line errors of each class, the cost bound, ``dxi estimate --batch`` and
``dxi batches``."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.cache.ledger import Ledger
from dxi.runner import session
from dxi.runner.batch.options import BatchOptions
from dxi.runner.cli import main
from dxi.runner.planning import plan
from dxi.runner.planning.deadline import parse_deadline

from .fakes.fake_provider import serve
from .helpers.batches import (
    POLL,
    command,
    iso_in,
    model,
    rows,
    run,
    run_plan,
    same_answers,
    summary,
)
from .helpers.runs import dxi_args, dxi_command
from .helpers.synthetic import data_dir as synthetic_data


@pytest.mark.process
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_a_batch_run_stores_the_rows_and_summary_a_synchronous_run_does(
    kind: str, data_dir: Path, tmp_path: Path
):
    with serve(model=None, record=False) as server:
        assert (
            run(kind, server.url, data_dir, tmp_path, cache="sync", out="sync-out", batch=False)
            == 0
        )
        assert run(kind, server.url, data_dir, tmp_path) == 0
        stats = server.stats()
        assert run(kind, server.url, data_dir, tmp_path, out="again") == 0  # a rerun sends nothing
        again = server.stats()
    assert stats["sdk_problems"] == 0, stats["sdk_problem_lines"]
    assert (
        stats["batch_creates"],
        stats["batch_lines"],
        stats["batch_keys"],
        stats["batch_resubmitted"],
    ) == (1, 12, 12, 0)
    assert again["batch_creates"] == 1 and again["batch_polls"] == stats["batch_polls"]
    batch, sync = summary(tmp_path / "out"), summary(tmp_path / "sync-out")
    assert same_answers(batch) == same_answers(sync)
    (m,) = batch["models"]
    assert m["usage"]["batch"] == {"requests": 12, "cost_usd": None, "price": None}
    assert m["requests"]["sent"] == 12 and m["requests"]["batches"] == {
        "submitted": 1,
        "collected": 1,
        "running": 0,
        "given_back": 0,
        "from_earlier_runs": 0,
        "from_earlier_runs_usd": None,
        "unknown_results": 0,
        "duplicate_results": 0,
        "unanswered": 0,
    }
    assert "batch" not in sync["models"][0]["usage"]
    # a batch's time is no per-call latency: the batch answers are left out of it, and counted
    latency = m["measures"]["latency"]
    assert (latency["calls"], latency["batch_excluded"]) == (0, 12)
    assert latency["p50_s"] is None and "provider batch" in latency["reason"]
    timed = sync["models"][0]["measures"]["latency"]
    assert (timed["calls"], timed["batch_excluded"]) == (12, 0) and timed["p50_s"] > 0
    b, s = rows(tmp_path / "cache"), rows(tmp_path / "sync")
    assert b["key"].to_list() == s["key"].to_list() and b.height == 12
    assert b["transport"].unique().to_list() == ["batch"] and s["transport"].unique().to_list() == [
        "sync"
    ]
    assert b["batch_id"].n_unique() == 1 and b["batch_id"].null_count() == 0
    for column in (
        "request_body",
        "status",
        "answers",
        "input_tokens",
        "output_tokens",
        "served_model",
        "repaired",
        "cached_input_tokens",
        "task_id",
        "task_digest",
        "error",
    ):
        assert b[column].to_list() == s[column].to_list(), column
    entries = list(Ledger(tmp_path / "cache").entries().values())
    assert [(e.phase, e.requests, e.stored, e.kind) for e in entries] == [
        ("collected", 12, 12, kind)
    ]


@pytest.mark.process
def test_gemini_sends_its_requests_in_a_file_through_the_files_api(data_dir: Path, tmp_path: Path):
    """Always a file, whose result lines carry each request's key (inline responses may lose their
    metadata)."""
    with serve(model=None, record=False) as server:
        assert run("gemini", server.url, data_dir, tmp_path) == 0
        assert (
            run("gemini", server.url, data_dir, tmp_path, cache="sync", out="sync-out", batch=False)
            == 0
        )
        stats = server.stats()
    assert (
        stats["batch_uploads"],
        stats["batch_creates"],
        stats["batch_downloads"],
        stats["sdk_problems"],
    ) == (1, 1, 1, 0)
    assert same_answers(summary(tmp_path / "out")) == same_answers(summary(tmp_path / "sync-out"))


@pytest.mark.process
def test_several_batches_per_model_are_in_flight_at_once(tmp_path: Path):
    data = synthetic_data(tmp_path / "data", 50, seed=1)
    with serve(model=None, record=False, batch={"polls": 3}) as server:
        assert run("openai", server.url, data, tmp_path, batch_size=12) == 0
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_resubmitted"]) == (5, 50, 0)
    entries = Ledger(tmp_path / "cache").entries().values()
    assert sorted(e.requests for e in entries) == [2, 12, 12, 12, 12]
    assert max(e.submitted_at for e in entries) < min(
        e.ended_at for e in entries
    )  # all submitted before one ended
    assert stats["batch_polls"] <= 5 * 5  # a few reads per batch, never a busy loop


@pytest.mark.process
def test_a_batch_that_expires_half_done_gives_back_the_rest_for_the_next_batch(
    data_dir: Path, tmp_path: Path
):
    with serve(model=None, record=False, batch={"script": ["expired"]}) as server:
        assert run("anthropic", server.url, data_dir, tmp_path) == 0
        stats = server.stats()
    # the first batch answered 6 and expired; the 6 it did not run went in a second batch: none
    # answered twice
    assert (
        stats["batch_creates"],
        stats["batch_lines"],
        stats["batch_answers"],
        stats["batch_keys"],
    ) == (2, 18, 12, 12)
    outcomes = sorted(
        (e.outcome, e.stored, len(e.returned))
        for e in Ledger(tmp_path / "cache").entries().values()
    )
    assert outcomes == [("completed", 6, 0), ("expired", 6, 6)]
    assert rows(tmp_path / "cache")["status"].to_list() == ["ok"] * 12


@pytest.mark.process
def test_a_batch_the_provider_loses_is_submitted_again(data_dir: Path, tmp_path: Path):
    with serve(model=None, record=False, batch={"script": ["lost"]}) as server:
        assert run("openai", server.url, data_dir, tmp_path) == 0
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_answers"]) == (2, 12)
    assert sorted(e.outcome for e in Ledger(tmp_path / "cache").entries().values()) == [
        "completed",
        "lost",
    ]
    assert rows(tmp_path / "cache").height == 12


@pytest.mark.process
@pytest.mark.parametrize("fallback", ["none", "sync"])
def test_at_the_deadline_the_batches_are_cancelled_and_what_they_did_is_kept(
    data_dir: Path, tmp_path: Path, fallback: str
):
    with serve(
        model=None, record=False, batch={"polls": 100000}
    ) as server:  # a batch that would never end
        code = run("openai", server.url, data_dir, tmp_path, deadline=iso_in(6), fallback=fallback)
        stats = server.stats()
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert (entry.outcome, entry.stored, len(entry.returned), entry.cancel_at is not None) == (
        "cancelled",
        6,
        6,
        True,
    )
    assert stats["batch_cancels"] == 1 and stats["batch_answers"] == 6
    cached = rows(tmp_path / "cache")
    if fallback == "sync":  # the 6 left were sent one call at a time: the index is complete
        assert code == 0 and stats["arrivals"] == 6 and stats["keys_ok"] == 6
        assert sorted(cached["transport"].to_list()) == ["batch"] * 6 + ["sync"] * 6
        assert summary(tmp_path / "out")["models"][0]["decision_index"] is not None
    else:  # left to the next run, which sends them (in a batch)
        assert code == 1 and stats["arrivals"] == 0 and cached.height == 6
        assert (
            summary(tmp_path / "out")["models"][0]["decision_index"] is None
        )  # answers missing: no index


@pytest.mark.process
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_per_line_errors_are_classified_as_synchronous_replies_are(kind: str, tmp_path: Path):
    """Out of 200 requests, seeded per key and submission: 400s are stored as deterministic
    failures; 500s, 429s and bodies that are not the wire format go back into the next batch until
    they are answered. The results come in an order of their own (Gemini's in input order): matched
    by key, never by position."""
    data = synthetic_data(tmp_path / "data", 200, seed=2)
    faults = {"transient": 0.15, "rate_limited": 0.1, "fatal": 0.05, "malformed": 0.1}
    with serve(model=None, record=False, batch={"line_faults": faults}) as server:
        code = run(kind, server.url, data, tmp_path, limits={"max_attempts": 20})
        stats = server.stats()
    cached = rows(tmp_path / "cache")
    assert cached.height == cached["key"].n_unique() == 200
    fatal = cached.filter(pl.col("status") == "failed")
    assert code == 1 and fatal.height == stats["batch_line_fatal"] > 0
    assert set(fatal["error_kind"].to_list()) == {"fatal"} and set(
        fatal["http_status"].to_list()
    ) == {400}
    assert cached.filter(pl.col("status") == "ok").height == 200 - fatal.height
    given_back = (
        stats["batch_line_transient"]
        + stats["batch_line_rate_limited"]
        + stats["batch_line_malformed"]
    )
    assert (
        min(
            stats["batch_line_transient"],
            stats["batch_line_rate_limited"],
            stats["batch_line_malformed"],
        )
        > 0
    )
    assert (
        stats["batch_lines"] == 200 + given_back
    )  # each was submitted again exactly as often as it came back
    assert stats["batch_creates"] >= 3 and stats["sdk_problems"] == 0


def priced_run_file(path: Path, data_dir: Path, url: str) -> None:
    """A run file at ``path``: OpenAI model ``m`` at ``url`` in batch mode, its output capped at 100
    tokens, priced 100/200 USD per million input/output tokens (50/100 at the batch price)."""
    path.write_text(f"""
data_dir = "{data_dir}"
[[models]]
provider = "openai"
model = "m"
params = {{max_completion_tokens = 100}}
price = {{input = 100.0, output = 200.0}}
[providers.openai]
kind = "openai"
base_url = "{url}/v1"
batch = true
""")


@pytest.mark.process
def test_the_cost_bound_reserves_each_batch_worst_case_before_submitting_it(
    data_dir: Path, tmp_path: Path
):
    run_file = tmp_path / "run.toml"
    with serve(model=None, record=False) as server:
        priced_run_file(run_file, data_dir, server.url)
        # at the batch price (half), one request's worst case is (its body's bytes x $50 + 100 x
        # $100) / 1e6, $0.04 to $0.09: a few fit under $0.3 at once; each batch's results settle far
        # below (their usage), making room
        code = run_plan(
            plan.build(
                run_file=run_file, cache_dir=tmp_path / "cache", out=tmp_path / "out", max_cost=0.3
            )
        )
        stats = server.stats()
        assert (
            run_plan(
                plan.build(
                    run_file=run_file,
                    cache_dir=tmp_path / "none",
                    out=tmp_path / "none-out",
                    max_cost=0.05,
                )
            )
            == 3
        )  # not one request's worst case fits: nothing is submitted
        assert server.stats()["batch_lines"] == stats["batch_lines"]
    s = summary(tmp_path / "out")
    entries = list(Ledger(tmp_path / "cache").entries().values())
    assert (
        code == 0
        and len(entries) >= 2
        and stats["batch_lines"] == 12
        and stats["batch_resubmitted"] == 0
    )
    assert all(
        0 < e.reserved_usd <= 0.3 for e in entries
    )  # no batch was submitted that the bound could not hold
    assert (
        sum(e.reserved_usd for e in entries) > 0.3
    )  # ... and the first ones' settling made room for the next
    assert s["cost_bound"]["spent_usd"] <= 0.3
    usage = s["models"][0]["usage"]
    assert (
        usage["batch"]["price"] == {"input": 50.0, "output": 100.0}
        and usage["batch"]["requests"] == 12
    )
    assert (
        usage["cost_usd"]
        == usage["batch"]["cost_usd"]
        == round((usage["input_tokens"] * 50.0 + usage["output_tokens"] * 100.0) / 1e6, 6)
    )
    assert s["cost_bound"]["spent_usd"] == pytest.approx(usage["cost_usd"], abs=1e-6)
    assert not Ledger(tmp_path / "none").entries()


def test_estimate_batch_prices_what_is_new_at_the_batch_rate(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    run_file = tmp_path / "run.toml"
    run_file.write_text(f"""
data_dir = "{data_dir}"
[[models]]
provider = "openai"
model = "m"
params = {{max_completion_tokens = 100}}
price = {{input = 2.0, output = 8.0}}
[[models]]
provider = "anthropic"
model = "c"
price = {{input = 3.0, output = 15.0, batch_input = 1.0, batch_output = 5.0}}
[[models]]
provider = "embedded"
""")
    docs = []
    for extra in ((), ("--batch",)):
        assert (
            main(
                [
                    "estimate",
                    str(run_file),
                    "--cache-dir",
                    str(tmp_path / "cache"),
                    "--json",
                    *extra,
                ]
            )
            == 0
        )
        docs.append(orjson.loads(capsys.readouterr().out))
    plain, batch = ({m["model"]: m for m in d["models"]} for d in docs)
    assert batch["openai:m"]["cost_usd"] == pytest.approx(
        plain["openai:m"]["cost_usd"] / 2, abs=2e-6
    )
    assert batch["openai:m"]["bound_usd"] == pytest.approx(
        plain["openai:m"]["bound_usd"] / 2, abs=2e-6
    )
    assert batch["anthropic:c"]["cost_usd"] == pytest.approx(
        plain["anthropic:c"]["cost_usd"] / 3, abs=2e-6
    )  # the file's own
    assert (
        batch["embedded:sparrow-nano-general-v1.1"]["cost_usd"]
        == plain["embedded:sparrow-nano-general-v1.1"]["cost_usd"]
    )
    assert (
        docs[1]["batch"]["synchronous"] == ["embedded:sparrow-nano-general-v1.1"]
        and "batch" not in docs[0]
    )


@pytest.mark.process
def test_models_without_a_batch_api_stay_synchronous_and_the_run_says_so(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    with serve(model=None, record=False) as server:
        code = main(
            dxi_args(
                data_dir,
                tmp_path / "cache",
                tmp_path / "out",
                "--batch",
                *POLL,
                models=["embedded", model("openai", server.url)],
            )
        )
        stats = server.stats()
    out = capsys.readouterr().out
    assert (
        code == 0
        and out.count("has no batch API") == 1
        and "embedded:sparrow-nano-general-v1.1" in out
    )
    assert stats["batch_lines"] == 12 and stats["arrivals"] == 0
    transports = (
        rows(tmp_path / "cache")
        .group_by("provider")
        .agg(pl.col("transport").unique())
        .sort("provider")
    )
    assert transports.rows() == [("embedded", ["sync"]), ("openai", ["batch"])]


@pytest.mark.process
def test_a_run_without_batch_collects_open_batches_instead_of_sending_them_again(
    data_dir: Path, tmp_path: Path
):
    """An earlier --batch run stopped (Ctrl-C leaves its batch running); the rerun without --batch
    collects it."""
    with serve(model=None, record=False, batch={"polls": 2}) as server:
        cache = tmp_path / "cache"
        assert main(["batches", "list", "--cache-dir", str(cache)]) == 2  # no cache yet
        assert run("openai", server.url, data_dir, tmp_path, deadline=iso_in(100000), limit=1) == 0
        assert (
            run("openai", server.url, data_dir, tmp_path, batch=False) == 0
        )  # sends the rest synchronously
        stats = server.stats()
    assert (
        stats["batch_lines"] == 4 and stats["arrivals"] == 8
    )  # 1 of each evaluation by batch, 8 one call at a time


@pytest.mark.process
def test_in_log_mode_a_models_last_progress_line_follows_its_last_collection(
    data_dir: Path, tmp_path: Path
):
    """Logs (no terminal): the model's last line comes once its batch is collected, saying so, not
    when its last row is stored (the batch still shown running)."""
    import io

    from rich.console import Console

    log = io.StringIO()
    with serve(model=None, record=False) as server:
        p = plan.build(
            models=[model("openai", server.url)],
            data_dir=data_dir,
            cache_dir=tmp_path / "cache",
            out=tmp_path / "out",
            batch=True,
        )
        console = Console(file=log, width=400, emoji=False)  # as dxi's own
        assert (
            session.run(p, console=console, batch_options=BatchOptions(poll_s=0.02)).exit_code == 0
        )
    lines = log.getvalue().splitlines()
    collected = max(i for i, line in enumerate(lines) if "collected: 12 stored" in line)
    (last,) = [line for line in lines[collected:] if "openai:m: 12/12 100%" in line]
    assert (
        last.endswith(" cached 0 batches 1 submitted 0 running 1 done") and " 0.0 req/s" not in last
    )
    assert not [line for line in lines[:collected] if "openai:m: 12/12" in line]  # none before it


def leave_a_batch_running(url: str, data: Path, tmp: Path) -> None:
    """A ``dxi run --batch`` (not quiet) of the openai fake at ``url`` on ``data``, caching in
    ``tmp/cache`` and writing ``tmp/out``, stopped as Ctrl-C stops it once its batch (of 12
    requests) is submitted."""
    import signal
    import subprocess

    cmd = command("openai", url, data, tmp, quiet=False)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for (
        line
    ) in proc.stdout:  # the batch is submitted: stop the run as Ctrl-C would, leaving it running
        if (
            " submitted (" in line
        ):  # its own line ("batch ID submitted (12 requests, ...)"), not the progress
            break  # line's count ("batches 0 submitted"), which may come first
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130


@pytest.mark.process
def test_open_batches_are_listed_collected_and_cancelled_from_python(
    data_dir: Path, tmp_path: Path
):
    """``runner.open_batches``, the library under ``dxi batches``: a batch left running is listed,
    polled without being collected, cancelled (half its requests answered by then) and collected;
    nothing is submitted."""
    from dxi.runner import open_batches
    from dxi.runner.errors import UsageError

    cache = tmp_path / "cache"
    with pytest.raises(UsageError, match="holds no batches"):
        open_batches.cancel(cache, every=True)
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        leave_a_batch_running(server.url, data_dir, tmp_path)
        (entry,) = open_batches.listed(cache)
        assert (entry.label, entry.requests, entry.phase) == ("openai:m", 12, "validating")
        (row,) = open_batches.rows([entry])
        assert row["running_s"] >= 0 and row["batch_id"] == entry.batch_id
        the_plan = plan.build(
            models=[model("openai", server.url)], data_dir=data_dir, cache_dir=cache
        )
        said: list[str] = []
        assert open_batches.collect(the_plan, say=said.append)["openai:m"].running == {
            entry.id: entry.submitted_at
        }
        with pytest.raises(UsageError, match="no open batch matches the model 'other'"):
            open_batches.cancel(cache, model="other")
        with pytest.raises(
            UsageError, match="no open batch matches the model 'openai:m@http://127.0.0.1:1/v1'"
        ):
            open_batches.cancel(
                cache, model="openai:m@http://127.0.0.1:1/v1"
            )  # the model, on another server
        assert open_batches.cancel(
            cache, entry=entry.batch_id, say=said.append
        ) == open_batches.Cancelled(1, 1)
        assert (
            open_batches.listed(cache)[0].phase == "cancelling"
        )  # where the provider says it stands
        stats = open_batches.collect(the_plan, wait=True, poll_s=0.05, say=said.append)["openai:m"]
        assert (stats.ok + stats.invalid + stats.failed, stats.given_back, stats.running) == (
            6,
            6,
            {},
        )
        assert open_batches.listed(cache) == []
        assert open_batches.cancel(cache, every=True) == open_batches.Cancelled(
            0, 0
        )  # none open: nothing to do
        (done,) = open_batches.listed(cache, every=True)
        assert (done.phase, done.stored, len(done.returned)) == ("collected", 6, 6)
        counts = server.stats()
    assert (counts["batch_creates"], counts["batch_cancels"], counts["batch_answers"]) == (1, 1, 6)
    assert any("(cancel asked)" in line for line in said) and rows(cache).height == 6


@pytest.mark.process
def test_answers_collected_from_an_earlier_runs_batch_are_counted_in_the_requests_block(
    data_dir: Path, tmp_path: Path
):
    """A batch left running, then cancelled (half its 12 requests answered): the rerun without
    --batch collects those 6 and sends the other 6 one at a time; summary.json's requests block
    accounts for all 12."""
    from dxi.runner import open_batches

    cache = tmp_path / "cache"
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        leave_a_batch_running(server.url, data_dir, tmp_path)
        assert open_batches.cancel(cache, every=True).complete
        assert run("openai", server.url, data_dir, tmp_path, batch=False) == 0
    (m,) = summary(tmp_path / "out")["models"]
    requests = m["requests"]
    assert (requests["sent"], requests["cache_hits"], requests["batches"]["from_earlier_runs"]) == (
        6,
        0,
        6,
    )
    assert (requests["batches"]["collected"], requests["batches"]["given_back"]) == (1, 6)


@pytest.mark.process
@pytest.mark.slow
def test_the_first_ctrl_c_lets_requests_sent_beside_open_batches_finish_and_stores_them(
    tmp_path: Path,
):
    """An earlier --batch run left a batch of 4 running; a run without --batch over 40 tasks polls
    it while it sends the other 36 one call at a time (8 in flight, 1.5 s a reply). The first
    Ctrl-C as the first 8 reach the server stops polling the batch (it keeps running, the next run
    collects it) and lets the 8 finish and be stored: it used to cancel them with the batch's
    polling (paid, then aborted and lost)."""
    import signal
    import subprocess

    data = synthetic_data(tmp_path / "data", 40, seed=3)
    lines = (data / "when2call" / "when2call_test_mcq.jsonl").read_bytes().splitlines(keepends=True)
    first = synthetic_data(tmp_path / "first", 0)
    (first / "when2call" / "when2call_test_mcq.jsonl").write_bytes(b"".join(lines[:4]))
    with serve(model=None, record=False, latency="1.5", batch={"polls": 100000}) as server:
        leave_a_batch_running(server.url, first, tmp_path)
        cmd = dxi_command(
            data,
            tmp_path / "cache",
            tmp_path / "again",
            "--max-in-flight",
            "8",
            *POLL,
            "-q",
            models=[model("openai", server.url)],
        )
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while server.stats()["arrivals"] < 8:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            stderr = proc.communicate(timeout=60)[1]
        finally:
            if proc.poll() is None:
                proc.kill()
        deadline = time.monotonic() + 10
        while (stats := server.stats())["ok"] + stats["aborted"] < stats["arrivals"]:
            assert time.monotonic() < deadline  # every arrival replied to, or found gone
            time.sleep(0.02)
    assert proc.returncode == 130, stderr
    # the 8 on the wire answered whole and stored, nothing new sent; the batch is still open
    assert (stats["arrivals"], stats["ok"], stats["aborted"], stats["batch_creates"]) == (
        8,
        8,
        0,
        1,
    )
    assert rows(tmp_path / "cache").height == 8
    assert [e.closed for e in Ledger(tmp_path / "cache").entries().values()] == [False]
    (line,) = [orjson.loads(raw) for raw in (tmp_path / "again" / "run-history.jsonl").open("rb")]
    requests = line["requests"]["openai:m"]
    assert (requests["sent"], requests["cache_hits"], requests["not_sent"]) == (8, 0, 28)
    assert "the requests in flight finished and are stored; 28 request(s) were not sent" in stderr


@pytest.mark.process
def test_dxi_batches_lists_collects_and_cancels(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cache = tmp_path / "cache"
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        leave_a_batch_running(server.url, data_dir, tmp_path)
        capsys.readouterr()
        assert main(["batches", "list", "--cache-dir", str(cache), "--json"]) == 0
        (listed,) = orjson.loads(capsys.readouterr().out)
        assert (listed["label"], listed["requests"], listed["phase"]) == (
            "openai:m",
            12,
            "validating",
        )
        assert (
            main(
                [
                    "batches",
                    "collect",
                    "--model",
                    model("openai", server.url),
                    "--data-dir",
                    str(data_dir),
                    "--cache-dir",
                    str(cache),
                    "--out",
                    str(tmp_path / "out"),
                ]
            )
            == 0
        )
        assert "12 batch" not in capsys.readouterr().out
        assert (
            main(
                [
                    "batches",
                    "cancel",
                    "--cache-dir",
                    str(cache),
                    "--model",
                    model("openai", server.url),
                ]
            )
            == 0
        )
        assert "cancel asked for 1 of 1 running batch(es)" in capsys.readouterr().out
        assert (
            main(
                [
                    "batches",
                    "collect",
                    "--model",
                    model("openai", server.url),
                    "--data-dir",
                    str(data_dir),
                    "--cache-dir",
                    str(cache),
                    "--out",
                    str(tmp_path / "out"),
                    "--wait",
                    "--poll",
                    "0.05",
                ]
            )
            == 0
        )
        out = capsys.readouterr().out
        assert "6 result(s) stored, 6 given back" in out
        assert main(["batches", "list", "--cache-dir", str(cache), "--json"]) == 0
        assert orjson.loads(capsys.readouterr().out) == []
        assert main(["batches", "list", "--cache-dir", str(cache), "--all", "--json"]) == 0
        (done,) = orjson.loads(capsys.readouterr().out)
        assert (done["phase"], done["stored"], done["returned"]) == ("collected", 6, 6)
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_cancels"], stats["batch_answers"]) == (1, 1, 6)
    assert rows(cache).height == 6


def test_the_deadline_is_the_next_such_time_or_an_iso_time_and_bad_values_are_refused(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):

    def local(*when: int) -> float:
        return time.mktime((*when, 0, 0, 0, -1))

    now = local(2026, 12, 1, 22, 30)
    assert parse_deadline("07:00", now) == local(
        2026, 12, 2, 7, 0
    )  # tonight's 07:00 is tomorrow morning
    assert parse_deadline("23:15", now) == local(2026, 12, 1, 23, 15)
    assert parse_deadline("2026-12-02T06:30", now) == local(2026, 12, 2, 6, 30)
    assert parse_deadline("2026-12-02T06:30+00:00", now) == 1796193000.0
    for bad in ("25:00", "7am", "tomorrow"):
        with pytest.raises(ValueError, match="--deadline"):
            parse_deadline(bad, now)
    base = dxi_args(data_dir, tmp_path / "cache", None, models=["openai:m@http://127.0.0.1:1/v1"])
    assert main([*base, "--batch", "--deadline", "7am"]) == 2
    assert main([*base, "--deadline", "07:00"]) == 2  # a deadline is for batch mode
    assert main([*base, "--batch", "--poll", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        "expected HH:MM" in err
        and "give --batch too" in err
        and "argument --poll: expected a number above 0" in err
    )


@pytest.mark.process
def test_a_batch_whose_rows_are_all_in_the_cache_is_closed_without_the_network(
    data_dir: Path, tmp_path: Path
):
    """Killed after the last row of a collection and before its record: the next run needs nothing
    of that model (it is all cached, not even started), and closes the entry from the cache
    alone."""
    import os
    import subprocess

    with serve(model=None, record=False) as server:
        cmd = dxi_command(
            data_dir,
            tmp_path / "cache",
            tmp_path / "out",
            "--batch",
            *POLL,
            "-q",
            models=[model("openai", server.url)],
        )
        assert (
            subprocess.run(
                cmd, env=dict(os.environ, DXI_FAILPOINT="append:12"), timeout=300
            ).returncode
            == -9
        )
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert entry.phase == "ended (completed)" and rows(tmp_path / "cache").height == 12
    assert run("openai", server.url, data_dir, tmp_path) == 0  # the server is gone: none is needed
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert (entry.phase, entry.closed) == ("collected", True)


@pytest.mark.process
def test_the_enqueued_token_limit_keeps_open_batches_under_it(tmp_path: Path):
    data = synthetic_data(tmp_path / "data", 60, seed=9)
    with serve(model=None, record=False, batch={"polls": 2}) as server:
        run_file = tmp_path / "run.toml"
        run_file.write_text(f"""
data_dir = "{data}"
[[models]]
provider = "fake"
model = "m"
[providers.fake]
kind = "openai"
base_url = "{server.url}/v1"
batch = true
batch_max_requests = 10
batch_enqueued_tokens = 6000
""")
        assert (
            run_plan(
                plan.build(run_file=run_file, cache_dir=tmp_path / "cache", out=tmp_path / "out")
            )
            == 0
        )
        stats = server.stats()
    entries = sorted(Ledger(tmp_path / "cache").entries().values(), key=lambda e: e.submitted_at)
    assert stats["batch_lines"] == 60 and stats["batch_resubmitted"] == 0 and len(entries) >= 6
    from dxi.adapters.openai_batch import OpenAIBatch

    per_line = (
        len(OpenAIBatch.head(None, "k" * 64)) + 2
    )  # a line's bytes beyond its body: the id, "}" and "\n"
    for e in entries:
        # the input tokens (body bytes / 4) of the batches open when each was submitted, itself
        # included
        open_then = [o for o in entries if o.submitted_at <= e.submitted_at < o.collected_at]
        assert sum(o.bytes - per_line * o.requests for o in open_then) / 4 <= 6000
    assert (
        max(
            len([o for o in entries if o.submitted_at <= e.submitted_at < o.collected_at])
            for e in entries
        )
        >= 2
    )


@pytest.mark.process
def test_an_error_inside_a_200_in_a_batch_is_charged_the_usage_it_states(
    data_dir: Path, tmp_path: Path
):
    """A batch's result line whose chat completion carries a top-level ``error`` beside its answer
    and usage (a gateway's partial failure) is given back and sent in the next batch, as
    synchronously; it was generated and is billed, so it is charged the usage it states, as the
    synchronous path charges it (``runner.sending.retry``). Before, it was charged its whole
    reservation (``cost_at_reservation_usd`` above 0, "at most" figures) though its usage was
    stated."""
    run_file = tmp_path / "run.toml"
    faults = {"error200": 0.5}
    with serve(model=None, record=False, batch={"line_faults": faults}) as server:
        priced_run_file(run_file, data_dir, server.url)
        out = tmp_path / "out"
        built = plan.build(run_file=run_file, cache_dir=tmp_path / "cache", out=out, max_cost=50.0)
        run_plan(built)
        stats = server.stats()
    requests = summary(out)["models"][0]["requests"]
    # every error inside a 200 was given back and sent again (but a request's last, stored failed);
    # how many there are depends on the keys, which name the server's port
    errors = stats["batch_line_error200"]
    assert errors > 0 and stats["batch_lines"] == 12 + errors - requests["failed"]
    assert requests.get("cost_at_reservation_usd", 0) == 0  # no reservation kept: usage stated
    # the 12 answers stored, at the batch price (half of 100/200 USD per million tokens) ...
    stored = (requests["input_tokens"] * 50.0 + requests["output_tokens"] * 100.0) / 1e6
    # ... and the errors' stated usage beside them (a request's own usage, as its answer states it)
    assert 0 < requests["cost_usd"] - stored < errors * max(0.01, stored / 12 * 2)
