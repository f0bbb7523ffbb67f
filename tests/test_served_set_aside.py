"""A cache an older dxi filled, before ``check_served`` refused a System One reply that names
another model: those rows hold another model's answers under the asked model's key. They are set
aside (``dxi.served.served_by_other``): never a cache hit, never scored, counted in summary.json's
``set_aside`` with a note, and sent again by the next run; the rows stay in the cache, and every
other row (a hosted provider's dated snapshot included) is read as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.adapters import Adapter
from dxi.adapters.systemone import SystemOne
from dxi.cache import Cache
from dxi.runner.cli import main
from dxi.served import served_by_other

from .fakes.fake_provider import FakeProvider, swapping, systemone
from .helpers.rows import row


def test_which_rows_are_set_aside_and_which_stay_cache_hits(tmp_path: Path):
    """The rule ``check_served`` applies, on stored rows: a System One (or embedded) row whose
    served name is not exactly the model's; a hosted provider's dated snapshot, a row naming no
    model, and a row naming its own model stay cache hits, in the key index built as rows are
    appended and in the one loaded from the shards. The set-aside row is not final: the reply sent
    again replaces it (and the row stays)."""
    rows = {
        "robot": row("k1", provider="systemone", model="fake-decider", served_model="fake-robot"),
        "embedded": row("k2", provider="embedded", model="m", served_model="other"),
        "own": row("k3", provider="systemone", model="fake-decider", served_model="fake-decider"),
        "unnamed": row("k4", provider="systemone", model="fake-decider", served_model=None),
        "snapshot": row("k5", provider="openai", model="gpt-4o", served_model="gpt-4o-2024-08-06"),
        "reroute": row("k6", provider="gemini", model="g-2.5", served_model="g-3.5-lite"),
    }
    expected = {"k1": False, "k2": False, "k3": True, "k4": True, "k5": True, "k6": True}
    with Cache(tmp_path) as cache:
        cache.append_many(list(rows.values()))
        assert dict(zip(expected, cache.has_many(list(expected)), strict=True)) == expected
        assert (cache.status("k1"), cache.status("k3")) == ("set aside", "ok")
    with Cache(tmp_path) as cache:  # compacted into a shard, the index loaded from it
        assert dict(zip(expected, cache.has_many(list(expected)), strict=True)) == expected
        assert cache.status("k2") == "set aside" and len(cache.scan().collect()) == 6
        # the reply sent again wins over the row set aside, even written with a clock behind it
        again = row("k1", provider="systemone", model="fake-decider", served_model="fake-decider")
        cache.append(again | {"created_at": 0.5})
        assert (cache.status("k1"), cache.has("k1")) == ("ok", True)
    with Cache(tmp_path) as cache:
        assert (cache.status("k1"), len(cache.scan().collect())) == ("ok", 7)
    assert [
        served_by_other(r["provider"], r["model"], r["served_model"]) for r in rows.values()
    ] == [True, True, False, False, False, False]


def _argv(url: str, data_dir: Path, tmp_path: Path, out: str) -> list[str]:
    return [
        "--model",
        f"systemone:fake-decider@{url}",
        "--evals",
        "when2call,wildguardtest",
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / out),
    ]


async def test_replies_an_older_dxi_stored_from_another_model_are_set_aside_and_sent_again(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
):
    """When2Call (3 tasks, 1 question each) and WildGuardTest (3 fully agreed tasks, 3 questions
    each): 6 requests, 12 answers. An older dxi (``check_served`` accepting every reply) sent them
    one at a time, When2Call first, to a server that answered the first 3 as fake-decider and was
    then restarted with fake-robot: all 6 stored under fake-decider's keys, WildGuardTest's 3 (9
    answers) from fake-robot. ``dxi score`` scores the 3 When2Call replies and sets the 3 others
    aside (their 9 answers missing, counted with the model that served them); ``dxi estimate``
    counts those 3 as new; the next ``dxi run``, fake-decider served again, sends exactly those 3
    and takes the 3 others from the cache. Every row stays in the cache."""
    monkeypatch.setattr(SystemOne, "check_served", Adapter.check_served)  # the older dxi
    swap = swapping(3, "fake-decider", "fake-robot")
    async with FakeProvider(routes={"/v1/systemone": swap}) as server:
        argv = _argv(server.url, data_dir, tmp_path, "old")
        # this dxi's summary of that run already leaves the 9 answers out: provisional (exit 1)
        assert await asyncio.to_thread(main, ["run", *argv, "-q", "--max-in-flight", "1"]) == 1
        monkeypatch.undo()
        with Cache(tmp_path / "c") as cache:
            old = cache.scan().collect()
        robot = old.filter(old["served_model"] == "fake-robot")
        assert (old.height, robot.height, set(robot["eval"])) == (6, 3, {"wildguardtest"})
        capsys.readouterr()

        # dxi score: fake-decider's 3 replies scored, fake-robot's 3 set aside
        scored = [str(tmp_path / "scored") if a == str(tmp_path / "old") else a for a in argv]
        assert await asyncio.to_thread(main, ["score", *scored]) == 1
        printed = " ".join(capsys.readouterr().out.split())
        (entry,) = orjson.loads((tmp_path / "scored" / "summary.json").read_bytes())["models"]
        assert entry["answered_by_other"] == {
            "requested": "fake-decider",
            "replies": 3,
            "answers": 9,
            "served": {"fake-robot": 9},
        }
        assert entry["served_models"] == {"fake-decider": 3} and "served_differs" not in entry
        assert (entry["complete"], entry["requests"]["cache_hits"]) == (False, 3)
        assert entry["usage"]["requests"] == 3  # fake-robot's tokens are not this model's
        note = (
            "systemone:fake-decider: 3 replies (9 answers) answered by fake-robot (9 answers), not "
            "fake-decider as asked, set aside: another model's answers, not scored (missing); the "
            "next dxi run sends their requests again"
        )
        assert printed.count(note) == 1 and "scored under this name" not in printed
        wildguard = entry["evals"]["wildguardtest"]
        assert (wildguard["missing"], wildguard["rerun"], wildguard["reason"]) == (
            9,
            9,
            "9 answer(s) set aside: another model answered them, not the model asked for (the "
            "model's answered_by_other); `dxi run` sends their requests again",
        )
        answers = pl.read_parquet(tmp_path / "scored" / "answers.parquet")
        missing = answers.filter(pl.col("status") == "missing")
        assert (missing.height, set(missing["eval"]), set(missing["error"])) == (
            9,
            {"wildguardtest"},
            {
                "answered by fake-robot, not fake-decider as asked: another model's answer, set "
                "aside (the next dxi run sends its request again)"
            },
        )

        # the dry run counts the 3 as to be requested
        dry = [a for a in argv if a not in ("--out", str(tmp_path / "old"))]
        assert await asyncio.to_thread(main, ["estimate", *dry, "--json"]) == 0
        (est,) = orjson.loads(capsys.readouterr().out)["models"]
        assert (est["requests"], est["cached"], est["new"], est["reasons"]) == (
            6,
            3,
            3,
            {"another model answered": 3},
        )

        # fake-decider served again: the next run sends exactly the 3 set aside
        server.routes["/v1/systemone"] = systemone("fake-decider")
        before = len(server.requests)
        assert (
            await asyncio.to_thread(main, ["run", *_argv(server.url, data_dir, tmp_path, "new")])
            == 0
        )
        sent = [orjson.dumps(payload) for _, payload in server.requests[before:]]
    assert sorted(sent) == sorted(orjson.dumps(orjson.loads(b)) for b in robot["request_body"])
    (entry,) = orjson.loads((tmp_path / "new" / "summary.json").read_bytes())["models"]
    assert (entry["requests"]["sent"], entry["requests"]["cache_hits"]) == (3, 3)
    assert entry["served_models"] == {"fake-decider": 12} and "answered_by_other" not in entry
    assert entry["complete"] is True
    with Cache(tmp_path / "c") as cache:
        rows = cache.scan().collect()
        assert all(cache.has_many(old["key"].to_list()))
    # nothing lost: the older run's 6 rows (fake-robot's 3 among them, set aside), then the 3 new
    assert rows.head(6).equals(old) and rows.height == 9
    assert rows.tail(3)["key"].sort().to_list() == robot["key"].sort().to_list()
    assert set(rows.tail(3)["served_model"]) == {"fake-decider"}
