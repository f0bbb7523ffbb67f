"""Run files end to end against fake providers on 127.0.0.1: several models on several providers at
once, each provider's limit held; the cost bound; the dry run; adding a model; per-model epochs;
rescoring.

The fake System One responder reports ``len(state) // 4 + 8`` input tokens per question and one
output token per question (``tests.fakes.fake_provider.systemone``): that is the "actual" usage the
estimates are compared with here."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.cache import Cache
from dxi.runner import session
from dxi.runner.cli import main, parser
from dxi.runner.errors import EXIT_COST_BOUND
from dxi.runner.planning.plan import from_args
from dxi.scoring import records

from .fakes.fake_provider import FakeProvider
from .helpers.runs import fake_usage, write_run_file
from .helpers.synthetic import data_dir

TASKS = 24


async def dxi(*args: str) -> int:
    return await asyncio.to_thread(main, [*args, "-q"])


async def run(path: Path, *flags: str) -> session.RunResult:
    """``dxi run RUN_FILE FLAGS``'s work as a library call (``session.run``, no console), on a
    thread."""
    return await asyncio.to_thread(
        session.run, from_args(parser().parse_args(["run", str(path), *flags]))
    )


def summary(tmp: Path, out: str = "out") -> dict:
    return orjson.loads((tmp / out / "summary.json").read_bytes())


@pytest.mark.slow
async def test_three_models_on_two_providers_each_held_to_its_own_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Each server refuses what goes faster than its limit; none refuses one. The run's event loop
    is held up 0.35 s once (the servers' is not), as a loaded machine holds up a process: the
    requests whose turns came meanwhile went together, four within 50 ms, and the fast server
    refused the fourth (a 429, and 49 requests for 48: the flake this test had, under load)."""
    from dxi.runner.sending import limits

    finish, fast_replies = limits.ProviderLimiter.finish, []

    def held_up(self, *args, **kwargs) -> None:
        finish(self, *args, **kwargs)
        if self.limits.rpm == 600 and len(fast_replies) < 10:
            fast_replies.append(1)
            if len(fast_replies) == 10:
                time.sleep(0.35)  # the run's thread only: the servers' event loop goes on

    monkeypatch.setattr(limits.ProviderLimiter, "finish", held_up)
    data_dir(tmp_path / "data", TASKS)
    # the servers refuse (429) anything faster than their limits, 10/s and 5/s (allowing a burst of
    # 3 for the jitter of arrival times)
    async with (
        FakeProvider(model=None, rpm=600, burst=3) as a,
        FakeProvider(model=None, rpm=300, burst=3) as b,
    ):
        path = write_run_file(
            tmp_path,
            {"fast": (a.url, 600), "slow": (b.url, 300)},
            [
                {"name": "Model One", "provider": "fast", "model": "m1"},
                {"name": "Model Two", "provider": "fast", "model": "m2"},
                {"name": "Model Three", "provider": "slow", "model": "m3"},
            ],
        )
        assert (await run(path)).exit_code == 0
    s = summary(tmp_path)
    assert [m["model"] for m in s["models"]] == ["Model One", "Model Two", "Model Three"]
    assert [m["requests"]["sent"] for m in s["models"]] == [TASKS] * 3
    assert all(
        m["evals"]["when2call"]["n"] == TASKS and m["evals"]["when2call"]["missing"] == 0
        for m in s["models"]
    )
    # each server saw its share and never had to refuse one: the runner kept below both limits
    assert (a.stats()["arrivals"], b.stats()["arrivals"]) == (2 * TASKS, TASKS)
    assert a.stats()["rate_limited"] == b.stats()["rate_limited"] == 0
    # measured at the servers: the two models on "fast" shared its 10/s (alone each would have gone
    # at 10/s)
    for server, rate in ((a, 10.0), (b, 5.0)):
        times = sorted(t for t, _ in server.requests)
        assert times[-1] - times[0] >= (len(times) - 1) / rate * 0.98
    assert {p["model"] for _, p in a.requests} == {"m1", "m2"} and {
        p["model"] for _, p in b.requests
    } == {"m3"}
    answers = pl.read_parquet(tmp_path / "out" / "answers.parquet")
    assert sorted(answers["model"].unique().to_list()) == ["Model One", "Model Three", "Model Two"]


PRICE = {
    "input": 1000.0,
    "output": 2000.0,
}  # USD per million tokens: $0.001 an input token, $0.002 an output token


async def test_max_cost_stops_at_the_bound_and_a_higher_bound_finishes_without_duplicates(
    tmp_path: Path,
):
    data_dir(tmp_path / "data", TASKS)
    async with FakeProvider(model=None) as server:  # a proxy: serves every model named
        path = write_run_file(
            tmp_path, {"p": (server.url, 60000)}, [{"provider": "p", "model": "m1", "price": PRICE}]
        )
        stopped = await run(path, "--max-cost", "1.5")
        assert stopped.exit_code == EXIT_COST_BOUND
        first = summary(tmp_path)
        bound = first["cost_bound"]
        assert stopped.cost_bound == bound and records.to_builtins(stopped.summary) == first
        assert round(stopped.spent_usd, 6) == bound["spent_usd"]
        with Cache(tmp_path / "cache") as cache:
            done = cache.scan().collect().height
        tokens_in, tokens_out = fake_usage(tmp_path / "cache")
        spent = (tokens_in * 1000 + tokens_out * 2000) / 1e6
        assert 0 < done < TASKS and bound["stopped"] is True and bound["max_cost_usd"] == 1.5
        assert bound["spent_usd"] == pytest.approx(spent, rel=1e-9) and spent <= 1.5
        assert (
            server.stats()["arrivals"] == done
        )  # nothing in flight was lost, nothing more was sent
        assert bound["remaining_requests"] == TASKS - done and bound["remaining_cost_usd"] > 0
        (m,) = first["models"]
        assert (
            m["usage"]["cost_usd"] == pytest.approx(spent, abs=1e-6)
            and m["requests"]["sent"] == done
        )
        assert m["evals"]["when2call"]["missing"] == TASKS - done and m["decision_index"] is None

        assert (await run(path, "--max-cost", "100")).exit_code == 0
        stats = server.stats()
    assert (stats["keys_ok"], stats["duplicates"], stats["arrivals"]) == (TASKS, 0, TASKS)
    second = summary(tmp_path)
    assert (
        second["cost_bound"]["stopped"] is False
        and second["models"][0]["requests"]["sent"] == TASKS - done
    )
    # the bound is per invocation: this run spent only what it sent
    tokens_in, tokens_out = fake_usage(tmp_path / "cache")
    assert second["models"][0]["usage"]["cost_usd"] == pytest.approx(
        (tokens_in * 1000 + tokens_out * 2000) / 1e6, abs=1e-6
    )
    assert second["cost_bound"]["spent_usd"] == pytest.approx(
        second["models"][0]["usage"]["cost_usd"] - spent, abs=1e-6
    )


async def estimate_json(path: Path, *extra: str, capsys: pytest.CaptureFixture) -> dict:
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["estimate", str(path), "--json", *extra]) == 0
    return orjson.loads(capsys.readouterr().out)


async def test_estimate_then_a_fourth_model_estimates_and_sends_only_its_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    data_dir(tmp_path / "data", TASKS)
    models = [{"provider": "p", "model": f"m{i}", "price": PRICE} for i in (1, 2, 3)]
    async with FakeProvider(model=None) as server:  # a proxy: serves every model named
        path = write_run_file(tmp_path, {"p": (server.url, 60000)}, models)
        cold = await estimate_json(path, capsys=capsys)
        assert server.stats()["arrivals"] == 0  # a dry run sends nothing
        assert [(m["new"], m["cached"], m["reasons"]) for m in cold["models"]] == [
            (TASKS, 0, {"new model": TASKS})
        ] * 3
        assert (await run(path)).exit_code == 0
        actual_in, actual_out = fake_usage(tmp_path / "cache", "m1")
        cold_m1 = cold["models"][0]
        # no usage in the cache yet: bytes / 4 (README: within +100% on the fake, whose count
        # ignores option texts)
        assert (
            cold_m1["output_tokens"] == actual_out == TASKS
        )  # one per question, as System One servers count
        assert actual_in < cold_m1["input_tokens"] <= 2 * actual_in

        models.append({"provider": "p", "model": "m4", "price": PRICE})
        path = write_run_file(tmp_path, {"p": (server.url, 60000)}, models)
        warm = await estimate_json(path, capsys=capsys)
        assert [m["new"] for m in warm["models"]] == [0, 0, 0, TASKS]
        assert warm["models"][3]["reasons"] == {"new model": TASKS}
        assert warm["total"]["new"] == TASKS and warm["total"]["cached"] == 3 * TASKS
        before = server.stats()["arrivals"]
        assert (await run(path)).exit_code == 0
        assert server.stats()["arrivals"] - before == TASKS and server.stats()["duplicates"] == 0
        m4_in, m4_out = fake_usage(tmp_path / "cache", "m4")
        est = warm["models"][3]
        # learned from the other System One models' usage on this evaluation: within 2% (README)
        assert abs(est["input_tokens"] - m4_in) <= 0.02 * m4_in and est["output_tokens"] == m4_out
        assert est["cost_usd"] == pytest.approx(
            (est["input_tokens"] * 1000 + est["output_tokens"] * 2000) / 1e6, rel=1e-3
        )
        assert est["bound_usd"] >= summary(tmp_path)["models"][3]["usage"]["cost_usd"]
        assert summary(tmp_path)["models"][3]["requests"]["sent"] == TASKS

        # a second epoch for m2: the estimate says why, the run sends exactly those
        models[1]["epochs"] = 2
        path = write_run_file(tmp_path, {"p": (server.url, 60000)}, models)
        again = await estimate_json(path, capsys=capsys)
        assert [m["new"] for m in again["models"]] == [0, TASKS, 0, 0]
        assert again["models"][1]["reasons"] == {"new epoch": TASKS}
        before = server.stats()["arrivals"]
        assert (await run(path)).exit_code == 0
        assert (
            server.stats()["arrivals"] - before == TASKS
        )  # (the same bodies as epoch 0: the key has the epoch)
    with Cache(tmp_path / "cache") as cache:
        rows = cache.scan().collect()
    assert rows.height == rows["key"].n_unique() == 5 * TASKS
    assert rows.filter(pl.col("sample") == 1)["model"].unique().to_list() == ["m2"]
    s = summary(tmp_path)
    assert [m["epochs"] for m in s["models"]] == [1, 2, 1, 1]
    assert (
        "accuracy_sd" in s["models"][1]["evals"]["when2call"]
        and "accuracy_sd" not in s["models"][0]["evals"]["when2call"]
    )
    # rescoring from the cache alone gives the same figures under the same names
    assert await dxi("score", str(path), "--out", str(tmp_path / "scored")) == 0
    scored = summary(tmp_path, "scored")
    assert [m["usage"] for m in scored["models"]] == [m["usage"] for m in s["models"]]
    assert [m["decision_index"] for m in scored["models"]] == [
        m["decision_index"] for m in s["models"]
    ]


async def test_a_retry_the_bound_leaves_no_room_for_is_stored_as_a_transient_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """The first attempt is sent and its reply is malformed (charged at its reservation, as the
    provider may have billed it); the bound leaves room for one attempt only, so the retry is not
    sent. The request was sent: it gets a row (a transient failure, sent again by the next run),
    never a count with no row."""
    data_dir(tmp_path / "data", 1)
    async with FakeProvider(model=None, script=["malformed"]) as server:
        path = write_run_file(
            tmp_path, {"p": (server.url, 60000)}, [{"provider": "p", "model": "m1", "price": PRICE}]
        )
        one = (await estimate_json(path, capsys=capsys))["total"]["bound_usd"]
        assert (await run(path, "--max-cost", str(1.5 * one))).exit_code == EXIT_COST_BOUND
        assert server.stats()["arrivals"] == 1
        (m,) = summary(tmp_path)["models"]
        assert (m["requests"]["sent"], m["requests"]["failed"]) == (1, 1)
        with Cache(tmp_path / "cache") as cache:
            (row,) = cache.scan().collect().rows(named=True)
        assert (row["status"], row["error_kind"], row["attempts"]) == ("failed", "transient", 1)
        assert "the cost bound was reached before a retry could be sent" in row["error"]
        assert (await run(path, "--max-cost", "100")).exit_code == 0
        assert (
            server.stats()["arrivals"] == 2
            and summary(tmp_path)["models"][0]["requests"]["sent"] == 1
        )
