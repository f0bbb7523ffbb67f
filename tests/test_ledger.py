"""The batch ledger (``cache.ledger``): events folded into entries, what an open entry claims, a
line cut by a kill, the collector lock, and the input files of processes that died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from dxi.cache.ledger import Ledger, new_id


def test_events_fold_into_entries_and_open_entries_claim_their_keys(tmp_path: Path):
    ledger = Ledger(tmp_path)
    a, b = new_id(), new_id()
    assert len(a) == 32 and a.startswith("dxi-") and a != b
    ledger.intent(
        a, ["k1", "k2", "k3"], identity="model", label="m", kind="openai", requests=3, bytes=300
    )
    ledger.record(a, "uploaded", file_id="file-1")
    ledger.record(a, "submitted", batch_id="batch_1", state="validating")
    ledger.intent(b, ["k4"], identity="other", label="o", kind="anthropic", requests=1, bytes=100)
    entry = ledger.entries()[a]
    assert (entry.phase, entry.file_id, entry.batch_id, entry.requests, entry.pid) == (
        "validating",
        "file-1",
        "batch_1",
        3,
        os.getpid(),
    )
    assert ledger.claimed("model") == {"k1": a, "k2": a, "k3": a} and ledger.claimed("other") == {
        "k4": b
    }
    ledger.record(
        a, "ended", outcome="expired", state="expired", output={"output_file_id": "file-2"}
    )
    ledger.record(a, "collected", stored=2, returned=["k3"], unmatched=0, cost_usd=0.25)
    entry = ledger.entries()[a]
    assert (entry.phase, entry.closed, entry.stored, entry.returned, entry.cost_usd) == (
        "collected",
        True,
        2,
        frozenset({"k3"}),
        0.25,
    )
    assert ledger.claimed("model") == {}  # closed: claims nothing
    ledger.record(b, "abandoned", reason="not found")
    assert [e.id for e in ledger.open_entries()] == []
    fresh = Ledger(tmp_path).entries()  # another reader folds the same file to the same entries
    assert {k: v.as_dict() for k, v in fresh.items()} == {
        k: v.as_dict() for k, v in ledger.entries().items()
    }


def test_an_entry_collected_in_part_stays_open_and_claims_what_it_did_not_store(tmp_path: Path):
    ledger = Ledger(tmp_path)
    e = new_id()
    ledger.intent(e, ["k1", "k2"], identity="model", requests=2)
    ledger.record(e, "submitted", batch_id="b")
    ledger.record(e, "collected", stored=1, returned=[], unmatched=1)
    assert not ledger.entries()[e].closed and ledger.claimed("model") == {"k1": e, "k2": e}


KILLED_MID_WRITE = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
os.write(fd, b'{"event": "state", "entry": "dxi-x", "sta')  # a line cut by a kill mid-write
os.kill(os.getpid(), 9)
"""


@pytest.mark.process
def test_a_line_cut_by_a_kill_is_skipped_and_the_next_writer_keeps_its_own_line_whole(
    tmp_path: Path,
):
    ledger = Ledger(tmp_path)
    e = new_id()
    ledger.intent(e, ["k"], identity="model", requests=1)
    done = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(ledger.path)])
    assert done.returncode == -signal.SIGKILL
    assert ledger.entries()[e].phase == "intent"  # the cut line is not read while it has no end
    ledger.record(
        e, "submitted", batch_id="batch_9"
    )  # ends the cut line first: this one stays whole
    reader = Ledger(tmp_path)
    assert reader.entries()[e].batch_id == "batch_9"
    assert len(reader.warnings) == 1 and "damaged line" in reader.warnings[0]
    assert ledger.path.read_bytes().count(b"\n") == 3


HOLD_LOCK = """
import sys, time
from dxi.cache.ledger import Ledger
with Ledger(sys.argv[1]).collector(sys.argv[2]) as held:
    print("held" if held else "refused", flush=True)
    time.sleep(60)
"""


@pytest.mark.process
def test_one_process_collects_an_entry_and_its_death_frees_it(tmp_path: Path):
    ledger = Ledger(tmp_path)
    e = new_id()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path), e], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with ledger.collector(e) as mine:
            assert not mine
        (ledger.folder / f"{e}.input.jsonl").write_bytes(b"{}\n")
        (ledger.folder / "dxi-dead.input.jsonl").write_bytes(b"{}\n")
        (ledger.folder / "dxi-open.input.jsonl").write_bytes(b"{}\n")
        assert (
            ledger.sweep_inputs(keep={"dxi-open"}) == 1
        )  # the dead builder's; not the live one's, nor an open entry's
        assert sorted(p.name for p in ledger.folder.glob("*.input.jsonl")) == [
            f"{e}.input.jsonl",
            "dxi-open.input.jsonl",
        ]
        proc.kill()
        proc.wait()
        with ledger.collector(e) as mine:
            assert mine
    finally:
        proc.kill()
        proc.wait()


def test_dxi_batches_list_shows_the_price_each_batch_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """Two open batches of one model: the first's intent recorded the run's price (3/15 USD per
    million input/output tokens, what ``dxi batches collect`` prices its results at when no
    run-history line has it), the second's none (a ledger of an older dxi). Expected, by hand:
    ``--json`` gives ``price`` [3.0, 15.0] and null (the old code: no ``price`` key), and the
    table's price column "3/15" and "-"."""
    from dxi.runner.cli import main

    ledger = Ledger(tmp_path)
    for n, (entry, price) in enumerate((("dxi-a", [3.0, 15.0]), ("dxi-b", None))):
        given = {"price": price} if price is not None else {}
        ledger.intent(entry, [f"k{n}"], identity="i", label="openai:m", kind="openai", **given)
        ledger.record(entry, "submitted", batch_id=f"batch_{n}", state="in_progress")
    capsys.readouterr()
    assert main(["batches", "list", "--cache-dir", str(tmp_path), "--json"]) == 0
    listed = orjson.loads(capsys.readouterr().out)
    assert [(e["id"], e["price"]) for e in listed] == [("dxi-a", [3.0, 15.0]), ("dxi-b", None)]
    monkeypatch.setenv("COLUMNS", "200")  # the table whole, no cell folded
    assert main(["batches", "list", "--cache-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in next(line for line in table if "entry" in line).split("┃")]
    cells = {
        c[1]: c[header.index("price (in/out)")]
        for line in table
        if (c := [x.strip() for x in line.split("│")])[1:2] in (["dxi-a"], ["dxi-b"])
    }
    assert cells == {"dxi-a": "3/15", "dxi-b": "-"}
