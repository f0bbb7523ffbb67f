"""``dxi plan`` over a cache that holds some of the model's requests: the requests the adaptive run
would ask (the first tasks of its seeded order) that are cached cost nothing, and the plan says how
many are cached and new, as ``dxi estimate`` does; its whole cost is ``dxi estimate``'s. And
``--precision P:all``: the rule ``dxi run --until precision=P:all`` stops on."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from dxi.cache import Cache
from dxi.runner.adaptive.order import order_of
from dxi.runner.cli import main
from dxi.runner.planning import plan
from dxi.scoring import planner
from dxi.scoring.sequential import Until

from .helpers.rows import row

DATA = Path("../shared/data")
MODEL = ["--model", "openai:m", "--price", "openai:m=2/8"]


def _cache_first(cache: Path, limit: int, first: int, seed: int = 0) -> dict[str, tuple]:
    """Cache openai:m's requests of the first ``first`` tasks of each evaluation's order (seed
    ``seed``), each reply of 100 input and 10 output tokens; the order returned."""
    built = plan.build(models=["openai:m"], data_dir=DATA, cache_dir=cache, limit=limit)
    order = order_of(built.suite, seed, cache, write=False).evals
    head = {t for ids in order.values() for t in ids[:first]}
    rows = [
        row(
            r.key,
            provider="openai",
            model="m",
            eval=t.eval,
            task_id=t.id,
            sample=r.sample,
            request_body=r.body.decode(),
            input_tokens=100,
            output_tokens=10,
        )
        for t, _, r in built.models[0].requests(built.suite)
        if t.id in head
    ]
    with Cache(cache) as opened:
        opened.append_many(rows)
    return order


def _json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(list(args)) == 0
    return orjson.loads(capsys.readouterr().out)


def test_a_plan_prices_only_the_requests_the_run_would_send(tmp_path, capsys):
    cache = tmp_path / "c"
    where = ["--data-dir", str(DATA), "--limit", "40", "--cache-dir", str(cache)]
    order = _cache_first(cache, 40, 5)  # 5 of 40 tasks of each evaluation: 20 requests cached
    est = _json(capsys, "estimate", *MODEL, *where, "--json")["models"][0]
    assert (est["requests"], est["cached"], est["new"]) == (160, 20, 140)
    doc = _json(capsys, "plan", *MODEL, *where, "--precision", "20", "--runs", "1", "--json")
    (m,) = doc["models"]
    asked = m["questions"]
    assert set(order) == set(asked) and all(5 <= k < 40 for k in asked.values())
    a, w = m["adaptive"], m["whole"]
    # the run asks the first K tasks of each order: the 5 cached ones among them, the rest new
    assert a["requests"] == sum(asked.values())
    assert a["cached_requests"] == 20.0 and a["new_requests"] == sum(asked.values()) - 20
    # a new request's tokens: dxi estimate's mean of the evaluation's new requests
    new_in = sum((k - 5) * est["evals"][e]["input_tokens"] / 35 for e, k in asked.items())
    new_out = sum((k - 5) * est["evals"][e]["output_tokens"] / 35 for e, k in asked.items())
    assert a["new_input_tokens"] == round(new_in) and a["new_output_tokens"] == round(new_out)
    assert a["cost_usd"] == pytest.approx((new_in * 2 + new_out * 8) / 1e6, abs=1e-6)
    assert a["batch_cost_usd"] == pytest.approx(a["cost_usd"] / 2, abs=1e-6)
    # the whole index: dxi estimate's figures over the same cache
    assert (w["requests"], w["cached_requests"], w["new_requests"]) == (160.0, 20.0, 140.0)
    assert (w["new_input_tokens"], w["new_output_tokens"]) == (
        est["input_tokens"],
        est["output_tokens"],
    )
    assert w["cost_usd"] == est["cost_usd"]
    capsys.readouterr()
    assert main(["plan", *MODEL, *where, "--precision", "20", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "│ cached │ new │" in out.replace("┃", "│")
    assert f"${est['cost_usd']:,.2f}" in out


def test_a_plan_of_a_cache_holding_every_request_costs_nothing(tmp_path, capsys):
    cache = tmp_path / "c"
    where = ["--data-dir", str(DATA), "--limit", "40", "--cache-dir", str(cache)]
    _cache_first(cache, 40, 40)
    doc = _json(capsys, "plan", *MODEL, *where, "--precision", "5", "--runs", "1", "--json")
    for part in ("adaptive", "whole"):
        figures = doc["models"][0][part]
        assert figures["cached_requests"] == figures["requests"] > 0
        assert (figures["new_requests"], figures["cost_usd"], figures["batch_cost_usd"]) == (
            0.0,
            0.0,
            0.0,
        )


def test_the_plan_reads_the_cached_tasks_down_the_order_of_its_seed(tmp_path, capsys):
    # the first 5 of seed 7's order cached: with --seed 7 the run asks them first; the plan of
    # seed 0 (another order) finds fewer of them among the tasks it asks first
    cache = tmp_path / "c"
    where = ["--data-dir", str(DATA), "--limit", "40", "--cache-dir", str(cache)]
    order7 = _cache_first(cache, 40, 5, seed=7)
    plan_args = ["plan", *MODEL, *where, "--precision", "20", "--runs", "1", "--json"]
    seven = _json(capsys, *plan_args, "--seed", "7")["models"][0]
    assert seven["adaptive"]["cached_requests"] == 20.0
    zero = _json(capsys, *plan_args)["models"][0]
    built = plan.build(models=["openai:m"], data_dir=DATA, cache_dir=cache, limit=40)
    order0 = order_of(built.suite, 0, cache, write=False).evals
    expected = sum(
        len(set(order0[e][: int(k)]) & set(order7[e][:5])) for e, k in zero["questions"].items()
    )
    assert zero["adaptive"]["cached_requests"] == expected < 20
    assert not (cache / "adaptive").exists()  # the plan writes no order file


def test_precision_all_plans_the_runs_rule(tmp_path, capsys, monkeypatch):
    """``--precision 10:all`` simulates ``Until("precision", 10, every_metric=True)``, the rule
    ``dxi run --until precision=10:all`` parses (``dxi plan`` refused it), and asks more than
    ``--precision 10`` on 100 tasks of each evaluation (1 simulated run, seed 0)."""
    rules = []
    real = planner.simulate

    def spy(answers, populations, until, *args, **kwargs):
        rules.append(until)
        return real(answers, populations, until, *args, **kwargs)

    monkeypatch.setattr(planner, "simulate", spy)
    where = ["--data-dir", str(DATA), "--limit", "100", "--cache-dir", str(tmp_path / "c")]
    common = ["plan", "--model", "openai:m", *where, "--runs", "1", "--json"]
    every = _json(capsys, *common, "--precision", "10:all")
    index = _json(capsys, *common, "--precision", "10")
    assert rules == [Until.parse("precision=10:all"), Until("precision", 10.0)]
    assert (every["until"], index["until"]) == ("precision=10:all", "precision=10")
    asked = [sum(d["models"][0]["questions"].values()) for d in (every, index)]
    assert asked == [364.0, 232.0]
    capsys.readouterr()
    assert main(common[:-1] + ["--precision", "10:all"]) == 0
    assert (
        "Plan: ±10 points, the index and every metric, 1 simulated run" in capsys.readouterr().out
    )


def test_a_precision_all_simulation_stops_where_every_figure_is_within_p():
    """The simulated run under ``precision=10:all`` (``sequential.standings`` at the run's
    simultaneous confidence for every metric) stops at the first look where the widest of the
    index and every metric is within ±10 points; under ``precision=10`` the index alone."""
    import numpy as np

    populations = {e: 100 for e in ("aa_omniscience_decision", "hle_multichoice", "when2call")}
    populations["wildguardtest"] = 100
    rng = np.random.default_rng(0)
    answers = planner.synthetic([planner.PRIOR], populations, rng)
    order = planner.random_order(populations, rng, answers)
    looks = {}
    for text in ("precision=10:all", "precision=10"):
        trace: list = []
        planner.simulate(answers, populations, Until.parse(text), order, trace=trace)
        looks[text] = [t["prior"] for t in trace]

    def widest(st) -> float:
        return max([st.index.half_width, *(e.half_width for e in st.metrics.values())])

    every = looks["precision=10:all"]
    assert every[-1].settled and widest(every[-1]) <= 10
    assert all(not s.settled and widest(s) > 10 for s in every[:-1])
    alone = looks["precision=10"]
    assert alone[-1].settled and alone[-1].index.half_width <= 10 < widest(alone[-1])
    assert sum(alone[-1].asked.values()) < sum(every[-1].asked.values())


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("0:all", "got '0' (in '0:all'); P or P:all (the index and every metric)"),
        ("10:ALL", "got '10:ALL'; P or P:all (the index and every metric)"),
    ],
)
def test_a_bad_precision_names_both_forms(tmp_path, capsys, given, said):
    where = ["--data-dir", str(DATA), "--limit", "3", "--cache-dir", str(tmp_path / "c")]
    assert main(["plan", "--model", "openai:m", *where, "--precision", given]) == 2
    assert (
        "dxi plan: error: argument --precision: expected a number above 0 and at most 100 "
        f"(index points), {said}\n"
    ) in capsys.readouterr().err
