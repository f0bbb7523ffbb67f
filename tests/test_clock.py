"""A clock that was ahead (issue 32, item 8): a transient failure written while the clock was a day
ahead (a restored VM snapshot, an NTP step back, machines with skewed clocks sharing a cache) no
longer beats the later successful retry. Real ``dxi run`` / ``dxi export`` against a loopback fake
provider, with the clock that stamps cache rows (``runner.sending.rows``) moved a day ahead for the
first run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.cache import Cache
from dxi.runner.cli import main
from dxi.runner.sending import rows as rows_mod

from .fakes.fake_llm_server import FakeLLM

DAY = 86_400.0


class _Ahead:
    """``time`` as ``runner.sending.rows`` uses it, a day ahead."""

    @staticmethod
    def time() -> float:
        return time.time() + DAY


async def test_a_transient_failure_written_a_day_ahead_does_not_beat_its_later_retry(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cache, failing = tmp_path / "cache", 3

    def run(out: str) -> int:
        return main(
            [
                "run",
                "--model",
                f"openai:gpt-fake@{server.url}/v1",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(cache),
                "--out",
                str(tmp_path / out),
                "--max-attempts",
                "1",
                "--max-in-flight",
                "1",
                "-q",
            ]
        )

    def requests(out: str) -> dict:
        return orjson.loads((tmp_path / out / "summary.json").read_bytes())["models"][0]["requests"]

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    async with FakeLLM(script=["500"] * failing) as server:
        with monkeypatch.context() as ahead:
            ahead.setattr(rows_mod, "time", _Ahead)
            assert await asyncio.to_thread(run, "one") == 1  # provisional: three transient failures
        total = len(server.requests)
        assert requests("one")["failed"] == failing and total > failing
        assert (
            await asyncio.to_thread(run, "two") == 0
        )  # the clock right again: the three sent, answered
        assert len(server.requests) == total + failing and requests("two")["failed"] == 0
        assert await asyncio.to_thread(run, "three") == 0  # nothing sent again, nothing failed
        assert len(server.requests) == total + failing
        assert requests("three") == requests("three") | {
            "sent": 0,
            "failed": 0,
            "cache_hits": total,
        }
    with Cache(cache) as c:
        stamped = c.scan().select("key", "status", "created_at").collect()
    failed = stamped.filter(pl.col("status") == "failed")
    retried = failed.join(stamped.filter(pl.col("status") == "ok"), on="key", suffix="_retry")
    assert failed.height == retried.height == failing
    assert (
        retried["created_at"] - retried["created_at_retry"]
    ).min() > DAY - 60  # each failure looks newer
    rescored = await asyncio.to_thread(
        main,
        [
            "score",
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(cache),
            "--out",
            str(tmp_path / "score"),
        ],
    )
    assert (
        rescored == 0 and requests("score")["failed"] == 0
    )  # rescoring: not provisional, no failure
    target = tmp_path / "answers.csv"
    assert (
        await asyncio.to_thread(
            main,
            [
                "export",
                "--model",
                f"openai:gpt-fake@{server.url}/v1",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(cache),
                "--format",
                "csv",
                str(target),
            ],
        )
        == 0
    )
    exported = pl.read_csv(target)
    assert exported.height >= total and exported["status"].unique().to_list() == ["ok"]
