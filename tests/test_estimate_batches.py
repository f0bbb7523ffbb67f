"""``dxi estimate`` and the cache's open batches: a request an open batch holds (an earlier
``dxi run --batch`` killed) is collected by the next run, never sent again, so the estimate counts
it apart (``in_open_batches``): not new, not priced in the expected cost nor in ``at most`` (a
trial: after a kill -9 with 16 of 32 requests in open batches the estimate said 32 new and an
``at most`` for all 32; the run sent 16)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from dxi.cache.ledger import Ledger
from dxi.runner.cli import main
from dxi.runner.dispatch import identity
from dxi.runner.planning import plan

from .fakes.fake_provider import serve
from .helpers.batches import command, model

MODEL = "openai:m@http://127.0.0.1:9/v1"  # nothing listens: the estimate warns, sends nothing
PRICED = ["--price", "openai:m=1/0"]  # $1 per million input tokens, output free


def _entry(ledger: Ledger, name: str, ident: str, keys: list[str], batch_id: str | None) -> None:
    """An entry of ``keys`` as ``dxi run --batch`` records it: its intent, then (``batch_id``) the
    provider's reply to the create."""
    ledger.intent(name, keys, identity=ident, label="openai:m", kind="openai", requests=len(keys))
    if batch_id is not None:
        ledger.record(name, "submitted", batch_id=batch_id, state="in_progress")


def test_requests_in_open_batches_are_counted_apart_not_new_nor_priced(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cache = tmp_path / "c"
    where = ["--data-dir", str(data_dir), "--cache-dir", str(cache)]
    built = plan.build(models=[MODEL], data_dir=data_dir, cache_dir=cache)
    requests = [r for _, _, r in built.models[0].requests(built.suite)]
    keys, sizes = [r.key for r in requests], [len(r.body) for r in requests]
    assert len(keys) == 12
    ledger, ident = Ledger(cache), identity(built.models[0])
    _entry(ledger, "dxi-a", ident, keys[0:4], "batch_a")  # open, submitted: its 4 held
    _entry(ledger, "dxi-b", ident, keys[4:6], None)  # intent only: may never have reached it
    _entry(ledger, "dxi-c", ident, keys[6:8], "batch_c")  # collected whole: claims nothing
    ledger.record("dxi-c", "ended", outcome="completed", output={})
    ledger.record("dxi-c", "collected", stored=2)
    _entry(ledger, "dxi-d", "another model's digest", keys[8:10], "batch_d")  # not this model's

    capsys.readouterr()
    assert main(["estimate", "--model", MODEL, *PRICED, *where, "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    (m,) = doc["models"]
    new = sum(sizes[4:])  # the bytes of the 8 requests that are sent: input = bytes / 4
    assert (m["requests"], m["cached"], m["new"]) == (12, 0, 8)  # (the old code said 12 new)
    assert m["in_open_batches"] == 4
    assert m["reasons"] == {"new model": 6, "batch not confirmed": 2}
    assert m["input_tokens"] == round(new / 4)
    assert m["cost_usd"] == round(new / 4 / 1e6, 6)
    assert m["bound_usd"] == round(new / 1e6, 6)  # each reserved at its bytes (OpenAI adds none)
    assert sum(sizes[:4]) > 0  # (the 4 held would have added to both)
    total = doc["total"]
    assert (total["new"], total["in_open_batches"]) == (8, 4)
    assert (total["cost_usd"], total["bound_usd"]) == (m["cost_usd"], m["bound_usd"])

    assert main(["estimate", "--model", MODEL, *PRICED, *where]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "openai:m: in open batches 4 (collected by the next run; paid when their batch ends; "
        "not new, not in cost or at most)" in out
    )
    assert "new because: new model (6), batch not confirmed (2)" in out
    assert (
        "openai:m: batch not confirmed: a run was killed before it recorded the provider's reply "
        "to its create, so the batch may exist; the next run asks the provider, collects that "
        "batch if it was made and sends only what it did not get (cost and at most may overstate)"
        in out
    )


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, point, new, held, sent",
    [
        ("openai", "submitted", 0, 12, 0),
        ("openai", "intent", 12, 0, 12),
        ("anthropic", "created", 12, 0, 0),
    ],
)
def test_after_a_batch_run_killed_the_estimate_counts_what_the_next_run_sends(
    kind: str,
    point: str,
    new: int,
    held: int,
    sent: int,
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
):
    """A ``dxi run --batch`` killed (-9) right after the provider's reply to its batch of the 12
    requests was recorded: the estimate says 0 new, 12 in open batches, $0 at most, and the next
    run submits nothing. Killed after its intent, before the create: nothing reached the provider,
    so the 12 are new ("batch not confirmed"; the next run finds no batch of that tag and submits
    them). Killed after the create, before its reply was recorded: the ledger cannot tell this from
    the one before, so the 12 stay new and priced (an ``at most`` that overstates, never one that
    falls short); the next run finds the batch and submits nothing."""
    with serve(model=None, record=False, batch={"polls": 1}) as server:
        killed = subprocess.run(
            command(kind, server.url, data_dir, tmp_path),
            env=dict(os.environ, DXI_FAILPOINT=point),
            timeout=300,
        )
        assert killed.returncode == -signal.SIGKILL
        at_kill = server.stats()["batch_keys"]
        capsys.readouterr()
        where = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
        priced = ["--price", f"{kind}:m=1/0", "--batch"]
        assert (
            main(["estimate", "--model", model(kind, server.url), *priced, *where, "--json"]) == 0
        )
        m = orjson.loads(capsys.readouterr().out)["models"][0]
        assert (m["requests"], m["new"], m["in_open_batches"]) == (12, new, held)
        assert m["reasons"] == ({"batch not confirmed": 12} if new else {})
        assert (m["cost_usd"] > 0, m["bound_usd"] > 0) == (new > 0, new > 0)  # $0 when none new
        # dxi plan counts them as dxi estimate does (docs/adaptive.md, "cached and new"): those
        # held not new, their cost not planned (it priced all 12 as new)
        plan_args = ["--model", model(kind, server.url), "--price", f"{kind}:m=1/1", *where]
        assert main(["plan", *plan_args, "--precision", "10", "--json"]) == 0
        p = orjson.loads(capsys.readouterr().out)["models"][0]
        whole = p["whole"]
        assert (whole["requests"], whole["cached_requests"], whole["new_requests"]) == (
            12,
            held,
            new,
        )
        assert (whole["cost_usd"] > 0, p.get("in_open_batches")) == (new > 0, held or None)
        assert (
            subprocess.run(command(kind, server.url, data_dir, tmp_path), timeout=300).returncode
            == 0
        )
        assert server.stats()["batch_keys"] - at_kill == sent  # what the next run submitted
