"""Batch mode where money is spent twice or a run never ends (issue 32), against the fake batch
servers of the three providers (``tests.fakes.fake_batches``, requests and replies checked against
the official SDKs' types): Gemini results without their inline metadata, several batches that may be
one lost create, results past the provider's retention, a host without a batch API, ``dxi estimate``
of a run file in batch mode, result lines of unknown or repeated ids, input files uploaded just
before a kill, a full disk, a cancelled batch after the deadline and the progress line."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

import orjson
import pytest

from dxi.adapters.gemini_batch import GeminiBatch
from dxi.cache.ledger import Ledger
from dxi.runner.cli import main

from .fakes.fake_provider import serve
from .helpers.batches import POLL, command, iso_in, model, rows, run, same_answers, summary
from .helpers.runs import dxi_args


def dxi_run(kind: str, url: str, data: Path, tmp: Path, *extra: str) -> list[str]:
    """``dxi run --batch --poll 0.02`` of ``kind:m`` at ``url`` (in this process, through
    ``main``)."""
    return dxi_args(
        data, tmp / "cache", tmp / "out", "--batch", *POLL, *extra, models=[model(kind, url)]
    )


def killed_at(failpoint: str, kind: str, url: str, data: Path, tmp: Path) -> None:
    """``dxi run --batch`` killed (SIGKILL) right after the step ``failpoint``
    (``runner.batch.options.failpoint``)."""
    env = dict(os.environ, DXI_FAILPOINT=failpoint)
    assert subprocess.run(command(kind, url, data, tmp), env=env, timeout=300).returncode == -9


# ---- 1. Gemini: matched by the key the file carries, never by position ---------------------------
@pytest.mark.process
def test_gemini_answers_are_matched_by_the_keys_of_its_jsonl_file_when_inline_metadata_is_dropped(
    data_dir: Path, tmp_path: Path
):
    """The backend drops inline responses' ``metadata`` and their order (python-genai #2008, #1909):
    dxi sends a JSONL file, whose result lines carry each request's ``key``: one batch, every answer
    under its own key."""
    with serve(model=None, record=False, batch={"inline_metadata": False}) as server:
        assert run("gemini", server.url, data_dir, tmp_path) == 0
        assert (
            run("gemini", server.url, data_dir, tmp_path, cache="sync", out="sync-out", batch=False)
            == 0
        )
        stats = server.stats()
    assert (
        stats["batch_uploads"],
        stats["batch_creates"],
        stats["batch_lines"],
        stats["batch_resubmitted"],
    ) == (1, 1, 12, 0)
    assert stats["sdk_problems"] == 0, stats["sdk_problem_lines"]
    assert same_answers(summary(tmp_path / "out")) == same_answers(summary(tmp_path / "sync-out"))


@pytest.mark.process
def test_a_batch_that_succeeded_and_matches_none_of_its_ids_stops_the_model_and_is_never_resubmitted(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """Inline requests (as earlier versions sent them) whose responses come back without their
    metadata: not one result can be matched. The model stops (exit code 6), nothing is submitted
    again, nothing is stored."""
    monkeypatch.setattr(
        GeminiBatch,
        "LIMITS",
        GeminiBatch.LIMITS.__class__(200_000, 2_000_000_000, inline_bytes=19_000_000),
    )
    with serve(model=None, record=False, batch={"inline_metadata": False}) as server:
        code = main(dxi_run("gemini", server.url, data_dir, tmp_path, "--max-attempts", "6"))
        stats = server.stats()
    out = " ".join(capsys.readouterr().out.split())
    assert code == 6 and (stats["batch_creates"], stats["batch_lines"], stats["batch_uploads"]) == (
        1,
        12,
        0,
    )
    assert "succeeded but none of its 12 result(s) carries one of its 12 requests' ids" in out
    assert "batch mode stopped for this model" in out
    assert rows(tmp_path / "cache").height == 0
    (m,) = summary(tmp_path / "out")["models"]
    # sent once (not also not sent: the old count, 24 of 12), none answered
    requests = m["requests"]
    assert (requests["sent"], requests["not_sent"], requests["batches"]["unanswered"]) == (
        12,
        0,
        12,
    )
    assert requests["batches"]["unknown_results"] == 12
    assert "0 request(s) not sent, 12 sent without an answer (rerun without --batch" in out
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert (entry.phase, len(entry.returned)) == ("collected: stopped its model's batch mode", 12)
    assert entry.closed  # a synchronous run may send them


def test_the_stop_of_a_batch_that_matched_none_of_its_ids_holds_for_the_next_run_until_resumed(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """The stop is kept in the ledger: a second run submits no batch for the model (exit code 6,
    saying how to lift the stop), ``dxi batches list`` shows the entry, and only after ``dxi batches
    resume --model`` does a third run submit its requests in a batch again."""
    inline = GeminiBatch.LIMITS.__class__(200_000, 2_000_000_000, inline_bytes=19_000_000)
    monkeypatch.setattr(GeminiBatch, "LIMITS", inline)
    with serve(model=None, record=False, batch={"inline_metadata": False}) as server:
        args = dxi_run("gemini", server.url, data_dir, tmp_path)
        assert main(args) == 6
        capsys.readouterr()
        assert main(args) == 6
        second = " ".join(capsys.readouterr().out.split())
        creates = server.stats()["batch_creates"]
        assert main(["batches", "list", "--cache-dir", str(tmp_path / "cache"), "--json"]) == 0
        listed = orjson.loads(capsys.readouterr().out)
        assert (
            main(
                [
                    "batches",
                    "resume",
                    "--model",
                    model("gemini", server.url),
                    "--cache-dir",
                    str(tmp_path / "cache"),
                ]
            )
            == 0
        )
        resumed = " ".join(capsys.readouterr().out.split())
        assert main(args) == 6  # submitted again, and (the backend unchanged) stopped again
        after = server.stats()["batch_creates"]
    assert creates == 1 and after == 2
    assert "batch mode stays stopped for this model" in second
    assert f"dxi batches resume --model gemini:m --cache-dir {tmp_path / 'cache'}" in second
    requests = summary(tmp_path / "out")["models"][0]["requests"]
    assert (requests["sent"], requests["not_sent"], requests["batches"]["unanswered"]) == (
        12,
        0,
        12,
    )
    assert [e["phase"] for e in listed] == ["collected: stopped its model's batch mode"]
    assert "gemini:m: batch mode resumed" in resumed
    assert len(Ledger(tmp_path / "cache").stops()) == 1  # the third run's batch stopped it again


# ---- 2. several batches that may be one lost create ----------------------------------------------
@pytest.mark.process
def test_every_batch_that_may_be_a_lost_anthropic_create_is_adopted_and_only_its_own_results_kept(
    data_dir: Path, tmp_path: Path
):
    """Killed between Anthropic's reply to the create and the ledger's record; meanwhile another
    client made a batch of the same size. Both are adopted (not abandoned, not submitted again):
    ours answers every request; the other's results carry ids of its own, left out; no request is
    given back or submitted twice."""
    import anthropic

    from dxi import adapters
    from dxi.evals import Suite, discover

    with serve(model=None, record=False, batch={"polls": 2}) as server:
        killed_at("created", "anthropic", server.url, data_dir, tmp_path)
        client = anthropic.Anthropic(base_url=server.url, api_key="sk-ant-test-0123456789")
        theirs = adapters.get(adapters.ModelSpec("anthropic", "theirs", server.url, {}, {}))
        params = orjson.loads(theirs.encode(next(iter(Suite(discover(data_dir)).tasks()))).body)
        other = client.messages.batches.create(
            requests=[{"custom_id": f"theirs-{n}", "params": params} for n in range(12)]
        )
        assert run("anthropic", server.url, data_dir, tmp_path) == 0
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_resubmitted"], stats["batch_keys"]) == (2, 0, 24)
    entries = sorted(
        Ledger(tmp_path / "cache").entries().values(), key=lambda e: e.batch_id == other.id
    )
    assert [(e.phase, e.guessed, e.stored, len(e.returned)) for e in entries] == [
        ("collected", True, 12, 0),
        ("collected", True, 0, 0),
    ]
    assert (
        entries[1].batch_id == other.id
        and rows(tmp_path / "cache")["status"].to_list() == ["ok"] * 12
    )
    m = summary(tmp_path / "out")["models"][0]["requests"]
    assert (
        m["batches"]["unknown_results"] == 0 and m["batches"]["given_back"] == 0
    )  # the other's: not counted


@pytest.mark.process
def test_a_lost_gemini_create_is_found_whatever_order_the_listing_gives(
    data_dir: Path, tmp_path: Path
):
    """Gemini's batch listing has no documented order: here it lists 250 older batches of another
    client first. The batch is found by its tag on the last page and adopted; nothing is submitted
    twice."""
    with serve(
        model=None, record=False, batch={"old_batches": 250, "list_oldest_first": True}
    ) as server:
        killed_at("created", "gemini", server.url, data_dir, tmp_path)
        assert run("gemini", server.url, data_dir, tmp_path) == 0
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_resubmitted"], stats["batch_lists"]) == (1, 0, 3)
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert (entry.phase, entry.stored, entry.guessed) == ("collected", 12, False)


def _other_clients_batch(url: str, data: Path) -> str:
    """A batch of 12 requests (the suite's size) made by another client through the anthropic SDK:
    its id."""
    import anthropic

    from dxi import adapters
    from dxi.evals import Suite, discover

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-test-0123456789")
    theirs = adapters.get(adapters.ModelSpec("anthropic", "theirs", url, {}, {}))
    params = orjson.loads(theirs.encode(next(iter(Suite(discover(data)).tasks()))).body)
    return client.messages.batches.create(
        requests=[{"custom_id": f"theirs-{n}", "params": params} for n in range(12)]
    ).id


def _shift_intent(cache: Path, seconds: float) -> None:
    """Move the ``at`` of the ledger's intent by ``seconds``: this machine's clock was that far
    off."""
    ledger = cache / "batches" / "ledger.jsonl"
    events = [orjson.loads(line) for line in ledger.read_bytes().splitlines()]
    (intent,) = [e for e in events if e["event"] == "intent"]
    intent["at"] += seconds
    ledger.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))


@pytest.mark.process
@pytest.mark.parametrize(
    ("clock", "offset"), [("provider", 600), ("provider", -600), ("ours", 600), ("ours", -600)]
)
def test_a_lost_anthropic_create_is_found_however_far_the_clocks_differ(
    clock: str, offset: int, data_dir: Path, tmp_path: Path
):
    """Killed between Anthropic's reply to the create and the ledger's record, with the provider's
    clock (or this machine's, when the intent was recorded) 10 minutes ahead or behind: the batch
    is found among those listed after the newest one listed before the create (the provider's own
    order and clock), adopted and collected; nothing is submitted twice."""
    config = {"clock_offset": offset} if clock == "provider" else {}
    with serve(model=None, record=False, batch=config) as server:
        killed_at("created", "anthropic", server.url, data_dir, tmp_path)
        if clock == "ours":
            _shift_intent(tmp_path / "cache", offset)
        assert run("anthropic", server.url, data_dir, tmp_path) == 0
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_resubmitted"], stats["batch_keys"]) == (1, 0, 12)
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert (entry.phase, entry.stored, entry.guessed) == ("collected", 12, True)


@pytest.mark.process
def test_a_create_that_never_happened_is_proven_so_and_an_older_batch_is_not_adopted(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """Another client made a batch of the same size a moment before dxi's intent; dxi was killed
    before its create. The listing read back to that batch (the newest before the create) holds
    nothing newer: the entry was never created, said as such; the other client's batch is not
    adopted."""
    with serve(model=None, record=False, batch={"clock_offset": -600}) as server:
        other = _other_clients_batch(server.url, data_dir)
        killed_at("intent", "anthropic", server.url, data_dir, tmp_path)
        assert main(dxi_run("anthropic", server.url, data_dir, tmp_path)) == 0
        stats = server.stats()
    out = " ".join(capsys.readouterr().out.split())
    assert (stats["batch_creates"], stats["batch_resubmitted"], stats["batch_keys"]) == (2, 0, 24)
    entries = Ledger(tmp_path / "cache").entries().values()
    assert other not in {e.batch_id for e in entries}
    (abandoned,) = [e for e in entries if e.abandoned]
    assert abandoned.ref == {"newest": other, "created_at": abandoned.ref["created_at"]}
    assert "none of the 0 batches it lists has its 12 requests" in abandoned.abandoned
    assert "it was never created" in out
    assert sorted(e.phase for e in entries) == ["abandoned", "collected"]


@pytest.mark.process
def test_a_batch_is_never_said_never_created_on_a_search_that_proves_nothing(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """An entry recorded without the provider's listing to go by (an earlier version's ledger): a
    lost create is looked for by size within a day before the intent by this machine's clock. With
    that clock two days ahead at the intent, the batch is not found; the run says what it knows
    (the search and its assumption), not that the batch was never created."""
    with serve(model=None, record=False) as server:
        killed_at("created", "anthropic", server.url, data_dir, tmp_path)
        ledger = tmp_path / "cache" / "batches" / "ledger.jsonl"
        events = [orjson.loads(line) for line in ledger.read_bytes().splitlines()]
        (intent,) = [e for e in events if e["event"] == "intent"]
        del intent["ref"]
        ledger.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
        _shift_intent(tmp_path / "cache", 2 * 86_400)
        assert main(dxi_run("anthropic", server.url, data_dir, tmp_path)) == 0
    out = " ".join(capsys.readouterr().out.split())
    (abandoned,) = [e for e in Ledger(tmp_path / "cache").entries().values() if e.abandoned]
    for text in (out, abandoned.abandoned):
        assert "never created" not in text and "taken as not created" in text
        assert "more than a day ahead of the provider's" in text


# ---- 4. results past the provider's retention ----------------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_results_gone_at_the_provider_give_the_requests_back_once(
    kind: str, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """The first batch's results answer 404 (past the provider's retention): said as such, its 12
    requests are submitted once more and answered; the run ends (a deadline 60 s away is never
    reached)."""
    retention = {"openai": "30 days", "anthropic": "29 days", "gemini": "48 hours"}[kind]
    with serve(model=None, record=False, batch={"gone": 1}) as server:
        code = main(dxi_run(kind, server.url, data_dir, tmp_path, "--deadline", iso_in(60)))
        stats = server.stats()
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and (stats["batch_creates"], stats["batch_lines"], stats["batch_keys"]) == (
        2,
        24,
        12,
    )
    assert "are gone at the provider" in out and retention in out and "unknown model" not in out
    assert "12 request(s) not stored are given back" in out
    assert sorted(
        (e.stored, len(e.returned)) for e in Ledger(tmp_path / "cache").entries().values()
    ) == [(0, 12), (12, 0)]
    assert rows(tmp_path / "cache").height == 12


# ---- 5. a host without a batch API ---------------------------------------------------------------
@pytest.mark.process
def test_a_host_without_the_files_endpoint_stops_the_models_batch_mode_and_counts_its_requests_once(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    with serve(model=None, record=False, batch={"no_files": True}) as server:
        code = main(dxi_run("openai", server.url, data_dir, tmp_path))
        stats = server.stats()
    out = " ".join(capsys.readouterr().out.split())
    assert code == 6 and (stats["batch_creates"], stats["arrivals"]) == (0, 0)
    assert "has no batch API (POST /files answered 404" in out and "unknown model" not in out
    requests = summary(tmp_path / "out")["models"][0]["requests"]
    assert (requests["not_sent"], requests["sent"]) == (12, 0)
    # its requests counted once: "12 request(s) not sent", never 24 (the times of day, as
    # "20:29:24 ", are left out: a 24 in them is no count)
    counts = re.sub(r"\b\d\d:\d\d:\d\d\b", "", out.replace(",", ""))
    assert "12 request(s) not sent" in counts and not re.search(r"\b24 ", counts)
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert entry.phase == "abandoned"


# ---- 6. dxi estimate of a run file in batch mode -------------------------------------------------
def test_estimate_prices_a_run_files_batch_models_at_the_batch_price(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    def run_file(batch: str) -> Path:
        path = tmp_path / f"run-{batch}.toml"
        path.write_text(f"""
data_dir = "{data_dir}"
[[models]]
provider = "p"
model = "m"
params = {{max_completion_tokens = 100}}
price = {{input = 2.0, output = 8.0}}
[[models]]
provider = "p"
model = "sync"
batch = false
price = {{input = 2.0, output = 8.0}}
[providers.p]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
batch = {batch}
""")
        return path

    docs = []
    for batch in ("false", "true"):
        assert (
            main(
                ["estimate", str(run_file(batch)), "--cache-dir", str(tmp_path / "cache"), "--json"]
            )
            == 0
        )
        docs.append({m["model"]: m for m in orjson.loads(capsys.readouterr().out)["models"]})
    plain, batched = docs
    assert sorted(plain) == ["openai:m", "openai:sync"], sorted(plain)
    assert plain["openai:m"]["cost_usd"] > 0
    assert batched["openai:m"]["cost_usd"] == pytest.approx(
        plain["openai:m"]["cost_usd"] / 2, abs=2e-6
    )
    assert batched["openai:m"]["bound_usd"] == pytest.approx(
        plain["openai:m"]["bound_usd"] / 2, abs=2e-6
    )
    assert (
        batched["openai:sync"]["cost_usd"] == plain["openai:sync"]["cost_usd"]
    )  # batch = false: its own price


# ---- 7. result lines of unknown and repeated ids -------------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_result_lines_of_unknown_or_repeated_ids_are_counted_and_said(
    kind: str, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """Each batch's results end with 2 lines of ids none of its requests has and 3 repeating a
    request's id with another answer (a 400): the first answer of each id is kept; summary.json
    counts the others."""
    with serve(
        model=None, record=False, batch={"extra_results": {"unknown": 2, "duplicate": 3}}
    ) as server:
        assert main(dxi_run(kind, server.url, data_dir, tmp_path)) == 0
        assert (
            run(kind, server.url, data_dir, tmp_path, cache="sync", out="sync-out", batch=False)
            == 0
        )
    out = " ".join(capsys.readouterr().out.split())
    assert "2 result(s) whose id is none of its requests'" in out
    assert "3 result(s) repeating an id read already left out" in out
    batches = summary(tmp_path / "out")["models"][0]["requests"]["batches"]
    assert (batches["unknown_results"], batches["duplicate_results"]) == (2, 3)
    assert same_answers(summary(tmp_path / "out")) == same_answers(summary(tmp_path / "sync-out"))


# ---- 9. input files uploaded just before a kill --------------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize(
    ("kind", "failpoint"),
    [
        ("openai", "upload_reply"),
        ("openai", "uploaded"),
        ("gemini", "upload_reply"),
        ("gemini", "uploaded"),
    ],
)
def test_an_input_file_uploaded_just_before_a_kill_is_deleted_by_the_rerun(
    kind: str, failpoint: str, data_dir: Path, tmp_path: Path
):
    """Killed after the upload (before or after its record): the rerun finds no batch with the
    entry's tag, abandons the entry and deletes its input file at the provider (by its id, or by the
    name dxi gave it), and no other file: a user's own batch file stays."""
    import openai

    with serve(model=None, record=False) as server:
        if kind == "openai":
            user = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test-0123456789")
            user.files.create(file=("mine.jsonl", b'{"custom_id": "x"}\n'), purpose="batch")
        killed_at(failpoint, kind, server.url, data_dir, tmp_path)
        (lost,) = Ledger(tmp_path / "cache").entries().values()
        assert (lost.file_id is not None) == (failpoint == "uploaded")
        assert run(kind, server.url, data_dir, tmp_path) == 0
        stats = server.stats()
    lost_name = f"{lost.id}.jsonl" if kind == "openai" else lost.id
    entries = Ledger(tmp_path / "cache").entries()
    (used,) = [e for e in entries.values() if e.id != lost.id]
    used_name = f"{used.id}.jsonl" if kind == "openai" else used.id
    # the lost entry's input file, then the used batch's input and result files once collected
    assert entries[lost.id].phase == "abandoned"
    assert stats["batch_file_deletes"] == 1 + (3 if kind == "openai" else 2)
    assert stats["input_files"] == (["mine.jsonl"] if kind == "openai" else [])
    assert lost_name not in stats["input_files"] and used_name not in stats["input_files"]
    assert (stats["batch_creates"], stats["batch_resubmitted"]) == (1, 0)


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_the_files_of_a_batch_are_deleted_at_the_provider_once_it_is_collected_and_only_once(
    kind: str, data_dir: Path, tmp_path: Path
):
    """A batch that ran: once its results are stored, its input file and its result files (OpenAI's
    output and error files, Gemini's responses file) are deleted at the provider, recorded in the
    ledger (``cleaned``); a rerun deletes nothing more. A batch that failed (its input refused
    whole) has its input file deleted too."""
    files = {"openai": 3, "gemini": 2}[kind]
    with serve(model=None, record=False) as server:
        assert run(kind, server.url, data_dir, tmp_path) == 0
        first = server.stats()
        assert run(kind, server.url, data_dir, tmp_path) == 0
        second = server.stats()
    assert (first["batch_creates"], first["batch_file_deletes"]) == (1, files)
    assert first["input_files"] == []
    assert second["batch_file_deletes"] == files and second["batch_creates"] == 1
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert (entry.phase, entry.cleaned, entry.stored) == ("collected", True, 12)
    with serve(model=None, record=False, batch={"outcome": "failed"}) as server:
        assert run(kind, server.url, data_dir, tmp_path, cache="failed") == 6
        stats = server.stats()
    assert (stats["batch_creates"], stats["batch_file_deletes"], stats["input_files"]) == (1, 1, [])


# ---- a full disk ---------------------------------------------------------------------------------
@pytest.mark.process
def test_a_full_disk_under_batch_mode_stops_as_a_synchronous_run_does(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """The ledger's write(2) fails with ENOSPC: exit code 4 with "make room", as a cache write; no
    traceback and nothing submitted."""
    import dxi.cache.lines as lines_module  # where the ledger appends its events

    class FullDisk:
        def __getattr__(self, name: str):
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lines_module, "os", FullDisk())
    with serve(model=None, record=False) as server:
        code = main(dxi_run("openai", server.url, data_dir, tmp_path))
        stats = server.stats()
    captured = capsys.readouterr()
    out = " ".join(captured.err.split())  # the stop is a diagnostic: on stderr
    assert code == 4 and "No space left on device" in out and "make room" in out
    assert "Traceback" not in captured.out + captured.err
    assert (stats["batch_uploads"], stats["batch_creates"]) == (0, 0)


# ---- after the deadline --------------------------------------------------------------------------
@pytest.mark.process
def test_a_cancelled_batch_is_polled_promptly_after_the_deadline(data_dir: Path, tmp_path: Path):
    """At the deadline the batch (running for a few seconds: its status reads were growing apart) is
    cancelled; it stays ``cancelling`` for three reads. Those reads come every --poll, not at the
    grown interval: the synchronous fallback starts within a second of the cancel."""
    with serve(model=None, record=False, batch={"polls": 100000, "cancel_polls": 3}) as server:
        code = run("openai", server.url, data_dir, tmp_path, deadline=iso_in(5), fallback="sync")
    (entry,) = Ledger(tmp_path / "cache").entries().values()
    assert code == 0 and (entry.outcome, entry.stored) == ("cancelled", 6)
    assert entry.ended_at - entry.cancel_at < 1.0


@pytest.mark.process
def test_the_batch_progress_line_shows_batches_open_and_answers_collected_not_a_rate(
    data_dir: Path, tmp_path: Path
):
    import io

    from rich.console import Console

    from dxi.runner import session
    from dxi.runner.batch.options import BatchOptions
    from dxi.runner.planning import plan

    log = io.StringIO()
    with serve(model=None, record=False, batch={"polls": 3}) as server:
        p = plan.build(
            models=[model("openai", server.url)],
            data_dir=data_dir,
            cache_dir=tmp_path / "cache",
            out=tmp_path / "out",
            batch=True,
        )
        assert (
            session.run(
                p,
                console=Console(file=log, width=400, emoji=False),
                batch_options=BatchOptions(poll_s=0.02),
            ).exit_code
            == 0
        )
    lines = [
        line for line in log.getvalue().splitlines() if "openai:m: " in line and "/12 " in line
    ]
    assert lines and not [line for line in lines if "req/s" in line or "ETA" in line]
    assert (
        lines[-1]
        .split("openai:m: ")[1]
        .startswith("12/12 100% 0 batch(es) open 12 answer(s) collected ")
    )


def last_progress_line(url: str, data_dir: Path, tmp: Path) -> str:
    """The last progress line of ``openai:m`` at ``url`` in batch mode (12 requests), after
    ``openai:m: ``."""
    import io

    from rich.console import Console

    from dxi.runner import session
    from dxi.runner.batch.options import BatchOptions
    from dxi.runner.planning import plan

    log = io.StringIO()
    p = plan.build(
        models=[model("openai", url)],
        data_dir=data_dir,
        cache_dir=tmp / "cache",
        out=tmp / "out",
        batch=True,
    )
    session.run(
        p,
        console=Console(file=log, width=400, emoji=False),
        batch_options=BatchOptions(poll_s=0.02),
    )
    lines = [line for line in log.getvalue().splitlines() if re.search(r"openai:m: \d+/12 ", line)]
    return lines[-1].split("openai:m: ")[1]


@pytest.mark.process
def test_the_batch_progress_line_collects_answers_not_failures_and_retries_only_what_was_resent(
    data_dir: Path, tmp_path: Path
):
    """12 requests in one batch. Every result line a 400: 0 answers collected, 12 failed (the old
    line said "12 answer(s) collected"). The first batch expiring (6 answered, 6 given back) and
    the second, holding those 6, refused whole: 6 refused and no retry, nothing was sent again
    (the old line counted "retries 6" as the 6 were put in the new batch). The second batch
    completing instead: the 6 are retries."""
    tail = "given back 12"
    with serve(model=None, record=False, batch={"line_faults": {"fatal": 1.0}}) as server:
        assert last_progress_line(server.url, data_dir, tmp_path / "a") == (
            "12/12 100% 0 batch(es) open 0 answer(s) collected no price retries 0 429s 0 "
            "invalid replies 0 failed 12 cached 0 batches 1 submitted 0 running 1 done"
        )
    with serve(model=None, record=False, batch={"script": ["expired", "failed"]}) as server:
        assert last_progress_line(server.url, data_dir, tmp_path / "b") == (
            "6/12 50% 0 batch(es) open 6 answer(s) collected no price retries 0 429s 0 "
            f"invalid replies 0 failed 0 cached 0 refused 6 batches 2 submitted 0 running 2 done {tail}"
        )
    with serve(model=None, record=False, batch={"script": ["expired"]}) as server:
        assert last_progress_line(server.url, data_dir, tmp_path / "c") == (
            "12/12 100% 0 batch(es) open 12 answer(s) collected no price retries 6 429s 0 "
            "invalid replies 0 failed 0 cached 0 batches 2 submitted 0 running 2 done given back 6"
        )


@pytest.mark.process
@pytest.mark.slow
def test_a_full_disk_after_a_batch_is_created_records_it_sent_and_its_reservation_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """The ledger's ``submitted`` record of a batch the provider created finds the disk full: the
    batch exists (the next run finds it by its tag), so its 16 requests are sent, and their
    reservations under the bound ($200 each at the batch price: 1,000 output tokens at $200,000 per
    million; $3,200) are what the run committed.

    Expected, by hand: exit code 4; the line records ``sent`` 16 (the old code: 0, and no counts
    at all before that: ``requests`` null), ``batches.open`` {16 requests, 16 answers,
    ``reserved_usd`` $3,200}, ``cost_bound.open_batches_usd`` $3,200; the stop's line says so."""
    import dxi.cache.lines as lines_module

    from .helpers.synthetic import data_dir as synthetic

    class FullDisk:
        def __getattr__(self, name: str):
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: bytes) -> int:
            if b'"event":"submitted"' in data:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return os.write(fd, data)

    synthetic(tmp_path / "data", 16)
    monkeypatch.setattr(lines_module, "os", FullDisk())
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        args = ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
        args += ["--out", str(tmp_path / "out"), "--model", f"openai:m@{server.url}/v1"]
        args += ["--param", "max_completion_tokens=1000", "--price", "openai:m=0/400000"]
        args += ["--evals", "when2call"]  # the synthetic data: When2Call only
        code = main(["run", *args, "--batch", *POLL, "--max-cost", "5000", "-q"])
        assert server.stats()["batch_creates"] == 1
    assert code == 4
    (line,) = [orjson.loads(x) for x in (tmp_path / "out" / "run-history.jsonl").open()]
    r = line["requests"]["openai:m"]
    (entry,) = r["batches"]["open"]["entries"]
    assert (r["sent"], r["cost_usd"], r["batches"]["open"]) == (
        16,
        0.0,
        {"entries": [entry], "requests": 16, "answers": 16, "reserved_usd": 3200.0},
    )
    assert line["cost_bound"]["open_batches_usd"] == 3200.0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "This run sent 16 request(s) and spent $0.0000; its open batches (16 request(s), at most "
        "$3200.0000 reserved) keep running at the provider. Every reply stored"
    ) in err
