"""Adaptive runs' statistics (``scoring.sequential``) and planner (``scoring.planner``, ``dxi
plan``): the confidence sequence against a step-by-step computation of its formulas, exactness on
the whole set, bounds for open answers, the stopping rules, the rounds, seeded coverage at a
random stopping time, and the plan's figures by hand."""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import types

import numpy as np
import orjson
import polars as pl
import pytest

from dxi.runner.cli import main
from dxi.runner.commands import plan as plan_command
from dxi.scoring import planner, sequential
from dxi.scoring.decision_index import WEIGHTS
from dxi.scoring.sequential import (
    Until,
    capital,
    interval,
    round_sizes,
    schedule,
    standings,
)
from dxi.scoring.sums import build_cubes, eval_metrics

POPS = {"aa_omniscience_decision": 40, "hle_multichoice": 30, "when2call": 20, "wildguardtest": 50}


def reference_capital(x: list[float], n: int, target: float, alpha: float) -> float:
    """The module docstring's betting capital, one draw at a time (no NumPy): the largest
    log-capital of either bettor on "the whole-set mean is ``target``"."""
    log_term = math.log(2 / alpha)
    up = down = s = dev = 0.0
    best = -math.inf
    for i, xi in enumerate(x, 1):
        m = (n * target - s) / (n - i + 1)
        if not -1e-9 <= m <= 1 + 1e-9:
            return math.inf
        m = min(max(m, 1e-12), 1 - 1e-12)
        var_prev = (0.25 + dev) / i
        slope = n / (n - i + 1)
        bet = min(0.9, slope * math.sqrt(2 * log_term / (var_prev * i * math.log(1 + i))))
        up += math.log(1 + min(bet, 0.75 / m) * (xi - m))
        down += math.log(1 - min(bet, 0.75 / (1 - m)) * (xi - m))
        best = max(best, up, down)
        s += xi
        dev += (xi - (0.5 + s) / (i + 1)) ** 2
    return best


def profile(label: str, accuracy: float, idk: float, sensitivity: float, specificity: float):
    """A planner profile with one accuracy on every choice evaluation and one sensitivity and
    specificity on every WildGuardTest question."""
    return planner.Profile(
        label,
        dict.fromkeys(planner.CHOICE_EVALS, accuracy),
        idk,
        dict.fromkeys(planner.POSITIVES, sensitivity),
        dict.fromkeys(planner.POSITIVES, specificity),
    )


def test_until_parse_accepts_the_documented_forms():
    assert Until.parse("precision=5") == Until("precision", 5.0, False)
    assert Until.parse("precision=2.5:all") == Until("precision", 2.5, True)
    assert Until.parse("separated") == Until("separated", 1.0, False)
    assert Until.parse("separated=0.5") == Until("separated", 0.5, False)
    assert Until.parse("separated=0") == Until("separated", 0.0, False)
    assert Until.parse(" separated = 100 ") == Until("separated", 100.0, False)
    assert str(Until.parse("precision=2.5:all")) == "precision=2.5:all"


@pytest.mark.parametrize(
    "text",
    [
        "precision",
        "precision=0",
        "precision=101",
        "separated:all",
        "sep",
        "precision=-1",
        "precision=5:some",
        "",
        "separated=-1",
        "separated=1000",
        "separated=",
        "separated=1:all",
    ],
)
def test_until_parse_rejects_the_rest_quoting_the_text(text):
    # the caller names where it came from: "argument --until:", "run.toml, line 2: until:"
    with pytest.raises(ValueError) as caught:
        Until.parse(text)
    assert str(caught.value).startswith(f"{text!r}: ") and "precision=P" in str(caught.value)


PRECISION_RANGE = "the precision P must be a number above 0 and at most 100 (index points)"
TOLERANCE_RANGE = "the tolerance Δ must be a number from 0 to 100 (index points)"


@pytest.mark.parametrize(
    ("text", "range_"),
    [
        *(
            (f"precision={p}", PRECISION_RANGE)
            for p in ("-1", "nan", "inf", "0", "101", "abc", "-2:all")
        ),
        *(
            (f"separated={d}", TOLERANCE_RANGE)
            for d in ("-1", "1000", "100.5", "-0.5", "nan", "inf", "abc")
        ),
    ],
)
def test_every_out_of_range_or_non_number_gets_the_range_message(text, range_):
    with pytest.raises(ValueError) as caught:
        Until.parse(text)
    assert str(caught.value) == (
        f"{text!r}: {range_}; accepted forms: precision=P (e.g. precision=5), precision=P:all, "
        "separated, separated=Δ"
    )


@pytest.mark.parametrize("text", ["separated:all", "separated=1:all", "separated=", "sep"])
def test_a_separated_of_another_form_gets_the_accepted_forms(text):
    with pytest.raises(ValueError) as caught:
        Until.parse(text)
    assert str(caught.value) == (
        f"{text!r}: expected one of precision=P (e.g. precision=5), precision=P:all, "
        "separated, separated=Δ"
    )


@pytest.mark.parametrize(
    "value", ["-1", "-0.001", "0", "0.001", "1", "99.5", "100", "100.001", "1000", "nan", "inf"]
)
def test_until_takes_the_ranges_of_dxi_plan(value):
    """``separated=Δ`` takes what ``dxi plan --tolerance`` takes, ``precision=P`` what ``dxi plan
    --precision`` takes (``runner.planning.numbers``), and their messages give the same ranges."""
    from dxi.runner.planning import numbers

    def parses(text: str) -> bool:
        try:
            Until.parse(text)
        except ValueError:
            return False
        return True

    assert parses(f"separated={value}") == numbers.TOLERANCE.accepts(value)
    assert parses(f"precision={value}") == numbers.POINTS.accepts(value)
    assert numbers.TOLERANCE.expected() == "a number from 0 to 100 (index points)"
    assert numbers.POINTS.expected() == "a number above 0 and at most 100 (index points)"


def test_capital_matches_its_formulas_step_by_step():
    rng = np.random.default_rng(1)
    x = (rng.random(150) < 0.3).astype(float)
    targets = np.array([0.1, 0.25, 0.3, 0.42, 0.6])
    got = capital(np.broadcast_to(x, (5, 150)), targets, 200, 0.05)
    want = [reference_capital(x.tolist(), 200, m, 0.05) for m in targets]
    assert np.allclose(got, want, rtol=0, atol=1e-12)
    # 44 of the 150 draws are 1 (of 200): a mean of 0.1 (20 ones) or 0.6 (120: at most 94) is
    # impossible; 0.42 is rejected at 95% (log-capital ≥ log 40), 0.25 and 0.3 are not
    assert int(x.sum()) == 44
    assert np.isinf(got[[0, 4]]).all()
    assert (got[1:3] < math.log(40)).all() and math.log(40) <= got[3] < np.inf


def test_two_draws_give_the_certain_bounds():
    # x = 1, 0 of N = 4: no candidate is rejected by two draws, so the interval is what the two
    # unseen values allow: [1/4, 3/4]
    assert interval(np.array([1.0, 0.0]), np.array([1.0, 0.0]), 4, 0.05) == (0.25, 0.75)


def test_interval_is_exact_on_the_whole_set_and_never_widens():
    rng = np.random.default_rng(2)
    x = rng.random(300)
    assert interval(x, x, 300, 0.05) == (x.mean(), x.mean())
    ends = [interval(x[:t], x[:t], 300, 0.05) for t in range(20, 300, 20)]
    step = 1 / (24 * 24)  # the search's grid: ends are rounded outwards by at most two steps
    for (lo0, hi0), (lo1, hi1) in zip(ends, ends[1:], strict=False):
        assert lo1 >= lo0 - 2 * step and hi1 <= hi0 + 2 * step


def test_capital_rejects_bad_input():
    with pytest.raises(ValueError, match="values must lie in"):
        capital(np.array([[0.5, 1.5]]), np.array([0.5]), 10, 0.05)
    with pytest.raises(ValueError, match="3 draws from a population of 2"):
        capital(np.zeros((1, 3)), np.array([0.5]), 2, 0.05)


def test_open_answers_give_the_union_of_both_completions():
    # 10 of 10 asked, 6 correct, 2 open: the whole-set value lies in [6/10, 8/10] (bounds.py)
    low_fill = np.array([1] * 6 + [0] * 4, float)
    high_fill = np.array([1] * 6 + [0] * 2 + [1] * 2, float)
    assert interval(low_fill, high_fill, 10, 0.05) == (0.6, 0.8)
    # 6 of 10 asked, one open: the union of the two fills' intervals
    lo, hi = interval(low_fill[:6] * [1, 1, 1, 1, 1, 0], low_fill[:6], 10, 0.05)
    assert (
        lo
        == interval(low_fill[:6] * [1, 1, 1, 1, 1, 0], low_fill[:6] * [1, 1, 1, 1, 1, 0], 10, 0.05)[
            0
        ]
    )
    assert hi == interval(low_fill[:6], low_fill[:6], 10, 0.05)[1]


def test_coverage_at_a_random_stopping_time():
    """Seeded: 400 populations of 300 (shares 0.05-0.95), a random stopping time each: the test of
    the true whole-set mean has not rejected it by that time, nor by the end (the interval holds
    at every time), in ≥ 95% of runs; the interval at the stopping time holds the mean whenever
    the test has not rejected it."""
    rng = np.random.default_rng(3)
    bar = math.log(2 / 0.05)
    pops = (rng.random((400, 300)) < rng.uniform(0.05, 0.95, (400, 1))).astype(float)
    x = rng.permuted(pops, axis=1)
    means = pops.mean(1)
    stops = rng.integers(1, 300, 400)
    everywhere = capital(x, means, 300, 0.05) < bar
    at_stop = np.array(
        [
            capital(x[k : k + 1, : stops[k]], means[k : k + 1], 300, 0.05)[0] < bar
            for k in range(400)
        ]
    )
    assert at_stop.mean() >= 0.95 and everywhere.mean() >= 0.95
    for k in range(0, 400, 40):  # the interval agrees with its test
        lo, hi = interval(x[k, : stops[k]], x[k, : stops[k]], 300, 0.05)
        assert (lo <= means[k] <= hi) or not at_stop[k]


def _answers(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema=["label", "eval", "task_id", "question_id", "sample", "status", "predicted", "gold"],
        orient="row",
    )


def _whole(model: str, acc: float, rng: np.random.Generator) -> list[tuple]:
    rows = []
    for e, n in POPS.items():
        for t in range(n):
            if e == "wildguardtest":
                for q in ("prompt_harmful", "response_refusal", "response_harmful"):
                    gold = "yes" if rng.random() < 0.4 else "no"
                    pred = gold if rng.random() < acc else ("no" if gold == "yes" else "yes")
                    rows.append((model, e, f"{e}/{t}", q, 0, "ok", pred, gold))
            else:
                r = rng.random()
                pred = "A" if r < acc else ("E" if r < acc + 0.2 else "B")
                rows.append((model, e, f"{e}/{t}", "answer", 0, "ok", pred, "A"))
    return rows


def test_whole_set_is_exact_and_settles_as_exhausted():
    rng = np.random.default_rng(4)
    ans = _answers(_whole("m", 0.5, rng))
    st = standings(ans, POPS, Until.parse("precision=0.1"))["m"]
    assert st.settled and st.rule == "exhausted"
    assert st.asked == POPS
    omni = ans.filter(pl.col("eval") == "aa_omniscience_decision")
    correct = (omni["predicted"] == "A").sum()
    hallucinated = (omni["predicted"] == "B").sum()
    acc = st.metrics["aa_omniscience_decision.accuracy"]
    assert acc.point == acc.low == acc.high == pytest.approx(100 * correct / 40)
    nh = st.metrics["aa_omniscience_decision.non_hallucination_rate"]
    assert nh.low == nh.high == pytest.approx(100 * (1 - hallucinated / (40 - correct)))
    wg = ans.filter(
        (pl.col("eval") == "wildguardtest") & (pl.col("question_id") == "prompt_harmful")
    )
    tp = ((wg["predicted"] == "yes") & (wg["gold"] == "yes")).sum()
    err = (wg["predicted"] != wg["gold"]).sum()
    f1 = st.metrics["wildguardtest.f1_prompt_harm"]
    assert f1.low == f1.high == pytest.approx(100 * 2 * tp / (2 * tp + err))
    assert st.index.low == st.index.high == pytest.approx(st.index.point)


def test_failed_answers_on_the_whole_set_give_the_bounds():
    rng = np.random.default_rng(5)
    ans = _answers(_whole("m", 0.5, rng)).with_columns(
        pl.when(
            (pl.col("eval") == "hle_multichoice")
            & pl.col("task_id").is_in(
                ["hle_multichoice/0", "hle_multichoice/1", "hle_multichoice/2"]
            )
        )
        .then(pl.lit("failed"))
        .otherwise(pl.col("status"))
        .alias("status")
    )
    st = standings(ans, POPS, Until.parse("precision=5"))["m"]
    hle = ans.filter((pl.col("eval") == "hle_multichoice") & (pl.col("status") == "ok"))
    c = int((hle["predicted"] == "A").sum())
    est = st.metrics["hle_multichoice.accuracy"]
    assert (est.low, est.high) == (pytest.approx(100 * c / 30), pytest.approx(100 * (c + 3) / 30))
    assert est.point == pytest.approx(100 * c / 27)  # over the replies (SPEC §6)


def test_precision_settles_where_the_half_width_says_and_order_matters():
    rng = np.random.default_rng(6)
    whole = _answers(_whole("m", 0.5, rng))
    order = {e: [f"{e}/{k}" for k in rng.permutation(n)] for e, n in POPS.items()}
    asked = {e: set(order[e][: n // 2]) for e, n in POPS.items()}
    half = whole.filter(
        pl.struct("eval", "task_id").map_elements(
            lambda r: r["task_id"] in asked[r["eval"]], return_dtype=pl.Boolean
        )
    )
    st = standings(half, POPS, Until("precision", 100.0), order=order)["m"]
    assert st.asked == {e: n // 2 for e, n in POPS.items()}
    assert st.settled and st.rule == "precision=100"
    width = st.index.half_width
    tight = standings(half, POPS, Until("precision", width * 0.99), order=order)["m"]
    assert not tight.settled and tight.rule is None
    assert standings(half, POPS, Until("precision", width), order=order)["m"].settled


def test_separated_settles_far_apart_models_and_not_twins():
    rng = np.random.default_rng(7)
    pops = {
        "aa_omniscience_decision": 500,
        "hle_multichoice": 513,
        "when2call": 300,
        "wildguardtest": 880,
    }
    strong = profile("strong", 0.9, 0.05, 0.95, 0.95)
    weak = profile("weak", 0.1, 0.1, 0.3, 0.3)
    twin = dataclasses.replace(weak, label="twin")
    ans = planner.synthetic([strong, weak, twin], pops, rng)
    order = planner.random_order(pops, rng, ans)
    sim = planner.simulate(ans, pops, Until.parse("separated"), order)
    assert sim.standing["strong"].rule == "separated=1"
    assert sum(sim.asked["strong"].values()) < sum(pops.values()) // 2
    assert sim.standing["weak"].rule == "exhausted"  # its twin is never told apart


def test_round_sizes_progress_every_evaluation_alike():
    pops = {"a": 500, "b": 300}
    assert schedule(0) == pytest.approx(0.04)
    assert schedule(1) == pytest.approx(0.09)
    assert round_sizes({}, pops, round_index=0) == {"a": 20, "b": 12}
    assert round_sizes({"a": 20, "b": 12}, pops, round_index=1) == {"a": 25, "b": 15}
    # a resumed run already past the schedule still progresses: to the next share, 0.230625
    # (ceil(115.3) = 116 of a, ceil(69.2) = 70 of b)
    assert round_sizes({"a": 100, "b": 60}, pops, round_index=0) == {"a": 16, "b": 10}
    assert round_sizes({"a": 500, "b": 300}, pops, round_index=3) == {"a": 0, "b": 0}
    with pytest.raises(ValueError, match="b: 301 asked of a population of 300"):
        round_sizes({"a": 1, "b": 301}, pops, round_index=0)


def test_spend_by_hand():
    usage = planner.Usage({"a": (100.0, 10.0), "b": (200.0, 20.0)}, (1.0, 4.0))
    got = planner.spend({"a": 10, "b": 5}, 2, usage)
    # requests (10 + 5)·2; input 10·2·100 + 5·2·200; output 10·2·10 + 5·2·20;
    # USD (4000·1 + 400·4)/1e6, the batch price half
    assert got == {
        "requests": 30,
        "cached_requests": 0,
        "new_requests": 30,
        "input_tokens": 4000.0,
        "output_tokens": 400.0,
        "new_input_tokens": 4000.0,
        "new_output_tokens": 400.0,
        "cost_usd": pytest.approx(0.0056),
        "batch_cost_usd": pytest.approx(0.0028),
    }
    # the first tasks of a's order cached (1, 2, 2, 3 requests among its first 1..4 tasks, then
    # no more), a new request of a at 50 and 5 tokens: a's first 10 tasks × 2 epochs are 20
    # requests, 3 of them cached, 17 new; b's 10 all new. New input 17·50 + 10·200 = 2850, output
    # 17·5 + 10·20 = 285: USD (2850·1 + 285·4)/1e6 = 0.00399
    usage = planner.Usage(
        {"a": (100.0, 10.0), "b": (200.0, 20.0)},
        (1.0, 4.0),
        cached={"a": [0, 1, 2, 2, *[3] * 20]},
        new_tokens={"a": (50.0, 5.0), "b": (200.0, 20.0)},
    )
    got = planner.spend({"a": 10, "b": 5}, 2, usage, usage.cached_in({"a": 10, "b": 5}))
    assert got == {
        "requests": 30,
        "cached_requests": 3,
        "new_requests": 27,
        "input_tokens": 4000.0,
        "output_tokens": 400.0,
        "new_input_tokens": 2850.0,
        "new_output_tokens": 285.0,
        "cost_usd": pytest.approx(0.00399),
        "batch_cost_usd": pytest.approx(0.001995),
    }
    assert usage.cached_in({"a": 1, "b": 5}) == {"a": 1, "b": 0}


def test_a_shifted_profile_names_whose_answers_it_is():
    """``Profile.shifted``: the second model of a separation plan is the first one's answers moved
    down, and its ``source`` names the first (not the second's own answers or prior)."""
    cached = dataclasses.replace(profile("embedded:m", 0.5, 0.2, 0.7, 0.8), source=planner.CACHED)
    b = cached.shifted(3, "openai:gpt-x")
    assert b.label == "openai:gpt-x"
    assert b.source == "embedded:m's answers in the cache, 3 points lower"
    assert b.accuracy == dict.fromkeys(planner.CHOICE_EVALS, pytest.approx(0.47))
    assert b.sensitivity == dict.fromkeys(planner.POSITIVES, pytest.approx(0.67))
    assert b.specificity == dict.fromkeys(planner.POSITIVES, pytest.approx(0.77))
    assert b.idk == 0.2
    prior = dataclasses.replace(planner.PRIOR, label="openai:gpt-x").shifted(2.5, "embedded:m")
    assert prior.source == (
        "the prior for openai:gpt-x (40% correct on each choice evaluation, 20% 'I don't know', "
        "WildGuardTest sensitivity 0.70 and specificity 0.85; index about 46), 2.5 points lower"
    )
    assert planner.PRIOR.source == (
        "prior: 40% correct on each choice evaluation, 20% 'I don't know', WildGuardTest "
        "sensitivity 0.70 and specificity 0.85; index about 46"
    )
    # any other source: named with it
    assert profile("a", 0.5, 0.2, 0.7, 0.8).shifted(1, "b").source == (
        "a's profile (prior), 1 point lower"
    )


def test_a_plan_gives_the_power_s_run_and_the_mean_run(monkeypatch):
    """Three scripted simulated runs asking 10, 30 and 20 tasks of one evaluation (a: 2 tasks
    more than b each time): at 80% power the plan is the 3rd smallest run (⌈0.8·4⌉ = 4, at most
    3), 30 tasks; ``expected`` is their mean, 20 tasks; 2 epochs double the requests; at 1 USD
    per million input tokens and 100 tokens a request, 40 requests cost 4000/1e6 USD."""
    asked = iter([{"a": 6, "b": 4}, {"a": 16, "b": 14}, {"a": 11, "b": 9}])
    pops = {"a": 50, "b": 50}

    def scripted(answers, populations, until, order, alpha):
        sim = planner.Simulated()
        sim.asked["m"] = next(asked)
        sim.standing["m"] = types.SimpleNamespace(rule="separated=1")
        return sim

    monkeypatch.setattr(planner, "synthetic", lambda *a, **k: None)
    monkeypatch.setattr(planner, "random_order", lambda *a, **k: {})
    monkeypatch.setattr(planner, "simulate", scripted)
    usage = {"m": planner.Usage({"a": (100.0, 0.0), "b": (100.0, 0.0)}, (1.0, 0.0))}
    profile = dataclasses.replace(planner.PRIOR, label="m")
    doc = planner.plan(
        [profile], pops, Until("separated", 1.0), usage, epochs=2, runs=3, quantile=0.8
    )
    m = doc["models"][0]
    assert m["questions"] == {"a": 16.0, "b": 14.0}
    assert m["adaptive"]["requests"] == 60 and m["expected"]["requests"] == 40
    assert m["expected"]["cost_usd"] == pytest.approx(40 * 100 / 1e6)
    assert m["expected"]["batch_cost_usd"] == pytest.approx(40 * 100 / 2e6)
    assert doc["holds"] == 0.75 and m["saving"] == pytest.approx(1 - 60 / 200)


def test_plan_command_by_hand(tmp_path, capsys):
    # 3 tasks per evaluation (--limit 3) and ±0.01 points: every run must ask everything, so the
    # plan is the whole index: 12 questions, 2 epochs, 24 requests, no saving; the cost is the
    # price times the tokens it reports
    code = main(
        [
            "plan",
            "--model",
            "openai:m",
            "--price",
            "openai:m=2/8",
            "--data-dir",
            "../shared/data",
            "--limit",
            "3",
            "--cache-dir",
            str(tmp_path / "c"),
            "--epochs",
            "2",
            "--precision",
            "0.01",
            "--runs",
            "2",
            "--json",
        ]
    )
    assert code == 0
    doc = orjson.loads(capsys.readouterr().out)
    m = doc["models"][0]
    assert m["questions"] == {
        "aa_omniscience_decision": 3.0,
        "hle_multichoice": 3.0,
        "when2call": 3.0,
        "wildguardtest": 3.0,
    }
    assert m["adaptive"]["requests"] == 24 and m["whole"]["requests"] == 24
    assert m["expected"] == m["adaptive"]  # a precision plan is the mean run
    assert m["saving"] == 0
    a = m["adaptive"]
    # nothing cached: every request new, priced at dxi estimate's tokens (rounded: ±1e-6)
    assert (a["cached_requests"], a["new_requests"]) == (0.0, 24.0)
    assert (a["new_input_tokens"], a["new_output_tokens"]) == (
        a["input_tokens"],
        a["output_tokens"],
    )
    assert a["cost_usd"] == pytest.approx(
        (a["input_tokens"] * 2 + a["output_tokens"] * 8) / 1e6, abs=5e-6
    )
    assert a["batch_cost_usd"] == pytest.approx(a["cost_usd"] / 2, abs=1e-6)
    # every task asked: the plan's cost is `dxi estimate`'s over the same (empty) cache
    estimate_args = ["estimate", "--model", "openai:m", "--price", "openai:m=2/8", "--epochs", "2"]
    estimate_args += ["--data-dir", "../shared/data", "--limit", "3"]
    assert main([*estimate_args, "--cache-dir", str(tmp_path / "c"), "--json"]) == 0
    estimated = orjson.loads(capsys.readouterr().out)["models"][0]
    assert (estimated["new"], estimated["cost_usd"]) == (24, a["cost_usd"])
    assert m["whole"]["cost_usd"] == a["cost_usd"]
    assert m["profile"].startswith("prior")
    # rounded as documented, each key of one type: requests 0.1 (float), tokens whole (int)
    assert {k: type(v).__name__ for k, v in a.items()} == {
        "requests": "float",
        "cached_requests": "float",
        "new_requests": "float",
        "input_tokens": "int",
        "output_tokens": "int",
        "new_input_tokens": "int",
        "new_output_tokens": "int",
        "cost_usd": "float",
        "batch_cost_usd": "float",
    }
    assert type(m["whole"]["requests"]) is float and type(m["saving"]) is float


def test_plan_tokens_of_the_embedded_model_say_their_source_and_agree_with_estimate(
    tmp_path, capsys
):
    # an empty cache: the prompts' size, bytes / 4, as `dxi estimate` gives it (every task of
    # --limit 3 is asked: ±0.01 points); after a run of it, whose replies report 0 tokens (the
    # embedded model counts none): the same bytes / 4, never the 0 as a count
    common = ["--model", "embedded", "--data-dir", "../shared/data", "--limit", "3"]
    cache = ["--cache-dir", str(tmp_path / "c")]
    plan_args = ["plan", *common, *cache, "--precision", "0.01", "--runs", "1", "--json"]
    assert main(["estimate", *common, *cache, "--json"]) == 0
    estimated = orjson.loads(capsys.readouterr().out)
    assert main(plan_args) == 0
    before = orjson.loads(capsys.readouterr().out)["models"][0]
    assert before["tokens_basis"] == {"bytes / 4 (no usage in the cache yet)": 12}
    assert before["adaptive"]["input_tokens"] == estimated["models"][0]["input_tokens"] > 0
    assert main(["run", *common, *cache, "--out", str(tmp_path / "out"), "-q"]) == 0
    capsys.readouterr()
    recorded = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())["models"][0]
    assert main(plan_args) == 0
    after = orjson.loads(capsys.readouterr().out)["models"][0]
    uncounted = (
        "bytes / 4 (this model's cached replies reported 0 tokens: a server that counts none)"
    )
    assert after["tokens_basis"] == {uncounted: 12}
    # the 12 requests cached: none sent again (the embedded model has no price: no cost)
    same = ("requests", "input_tokens", "output_tokens", "cost_usd", "batch_cost_usd")
    assert {k: after["adaptive"][k] for k in same} == {k: before["adaptive"][k] for k in same}
    assert (after["adaptive"]["cached_requests"], after["adaptive"]["new_requests"]) == (12.0, 0.0)
    assert (before["adaptive"]["cached_requests"], before["adaptive"]["new_requests"]) == (
        0.0,
        12.0,
    )
    assert (after["adaptive"]["input_tokens"], after["adaptive"]["output_tokens"]) == (
        estimated["models"][0]["input_tokens"],
        estimated["models"][0]["output_tokens"],
    )
    assert (recorded["usage"]["input_tokens"], recorded["usage"]["output_tokens"]) == (0, 0)
    # a 4th task of each evaluation: the 12 cached requests' 0 tokens left out, the 4 new ones
    # estimated from their bytes, named as `dxi estimate` names them (two sources, not one)
    four = ["--model", "embedded", "--data-dir", "../shared/data", "--limit", "4", *cache]
    assert main(["plan", *four, "--precision", "0.01", "--runs", "1", "--json"]) == 0
    both = orjson.loads(capsys.readouterr().out)["models"][0]
    assert both["tokens_basis"] == {
        "cached replies without token usage (left out of the mean)": 12,
        uncounted: 4,
    }
    assert main(["plan", *four, "--precision", "0.01", "--runs", "1"]) == 0
    assert (
        "embedded:sparrow-nano-general-v1.1: tokens: cached replies without token usage (left out "
        f"of the mean) (12 requests); {uncounted} (4 requests)"
    ) in " ".join(capsys.readouterr().out.split())
    assert main(["estimate", *four, "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["models"][0]["basis"] == {uncounted: 4}
    assert main(["estimate", *four]) == 0
    assert (f"embedded:sparrow-nano-general-v1.1: tokens: {uncounted} (4)") in " ".join(
        capsys.readouterr().out.split()
    )
    # a separation plan's B is A's answers moved down, whatever B's own: its line names A
    for a, b, source in (
        (
            "embedded",
            "openai:gpt-x",
            "embedded:sparrow-nano-general-v1.1's answers in the cache, 3 points lower",
        ),
        (
            "openai:gpt-x",
            "embedded",
            f"the prior for openai:gpt-x ({planner.PRIOR_SHARES}), 3 points lower",
        ),
    ):
        two = [*common, "--model", "openai:gpt-x", *cache, "--runs", "1", "--json"]
        assert main(["plan", *two, "--separate", a, b, "--difference", "3"]) == 0
        profiles = [m["profile"] for m in orjson.loads(capsys.readouterr().out)["models"]]
        own = "its answers in the cache" if a == "embedded" else f"prior: {planner.PRIOR_SHARES}"
        assert profiles == [own, source]


def test_plan_json_is_rounded_as_documented():
    spent = {
        "requests": 41.666666666666664,
        "cached_requests": 1.66666,
        "new_requests": 40.00001,
        "input_tokens": 509913.4999,
        "output_tokens": 1234.5000001,
        "new_input_tokens": 489516.96,
        "new_output_tokens": 1185.1,
        "cost_usd": 0.41666666666666663,
        "batch_cost_usd": None,
    }
    doc = {
        "until": "precision=5",
        "models": [
            {
                "model": "openai:m",
                "questions": {"when2call": 13.333333333333334},
                "adaptive": spent,
                "expected": spent | {"requests": 38.04999},
                "whole": spent | {"requests": 300},
                "saving": 0.8611111111111112,
                "exhausted_share": 1 / 3,
            }
        ],
    }
    rounded = plan_command.rounded(doc)
    m = rounded["models"][0]
    assert m["questions"] == {"when2call": 13.3}
    assert m["adaptive"] == {
        "requests": 41.7,
        "cached_requests": 1.7,
        "new_requests": 40.0,
        "input_tokens": 509913,
        "output_tokens": 1235,
        "new_input_tokens": 489517,
        "new_output_tokens": 1185,
        "cost_usd": 0.416667,
        "batch_cost_usd": None,
    }
    assert m["expected"] == m["adaptive"] | {"requests": 38.0}
    assert m["whole"]["requests"] == 300.0 and type(m["whole"]["requests"]) is float
    assert (m["saving"], m["exhausted_share"]) == (0.8611, 0.3333)
    assert rounded["until"] == "precision=5" and doc["models"][0]["saving"] == 0.8611111111111112


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "give one of --precision P or --separate"),
        (["--precision", "0"], "argument --precision: expected a number above 0 and at most 100"),
        (["--precision", "5", "--separate", "a", "b"], "give one of"),
        (["--separate", "openai:m", "openai:m", "--difference", "3"], "two different models"),
        (["--separate", "openai:m", "x"], "needs --difference D"),
        (
            ["--separate", "openai:m", "x", "--difference", "3"],
            "--separate x: no model of this run is named so (its models: openai:m)",
        ),
        (["--precision", "5", "--runs", "0"], "argument --runs: expected a whole number from 1"),
    ],
)
def test_plan_bad_input_exits_2(tmp_path, capsys, flags, message):
    code = main(
        [
            "plan",
            "--model",
            "openai:m",
            "--data-dir",
            "../shared/data",
            "--limit",
            "3",
            "--cache-dir",
            str(tmp_path / "c"),
            *flags,
        ]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def separation_plan(tmp_path, limit: int, difference: str, *flags: str) -> list[str]:
    """``dxi plan`` separating openai:a from openai:b at ``difference`` points, on ``limit`` tasks
    of each evaluation of ../shared/data, a cache under ``tmp_path``, then ``flags``."""
    models = ["--model", "openai:a", "--model", "openai:b"]
    data = ["--data-dir", "../shared/data", "--limit", str(limit)]
    return [
        "plan",
        *models,
        *data,
        "--cache-dir",
        str(tmp_path / "c"),
        "--separate",
        "openai:a",
        "openai:b",
        "--difference",
        difference,
        *flags,
    ]


def test_plan_without_tolerance_separates_at_1_point(tmp_path, capsys):
    """``--tolerance`` has no default of its own (None, refused with ``--precision``): a separation
    plan without it is ``--until separated=1``, with it ``separated=Δ``."""
    flags = separation_plan(tmp_path, 3, "3", "--runs", "1", "--json")
    assert main(flags) == 0
    assert orjson.loads(capsys.readouterr().out)["until"] == "separated=1"
    assert main([*flags, "--tolerance", "0.5"]) == 0
    assert orjson.loads(capsys.readouterr().out)["until"] == "separated=0.5"


PLAN_KEYS = {
    "until",
    "runs",
    "seed",
    "alpha",
    "quantile",
    "holds",
    "populations",
    "models",
    "power",
}


def test_plan_takes_a_difference_within_the_tolerance_and_gives_the_documented_keys(
    tmp_path, capsys
):
    """A pair within ±Δ is one way ``--until separated=Δ`` settles: D ≤ Δ is planned (D = 0.5
    without --tolerance, Δ = 1; D = Δ), not refused naming a --tolerance never given. The JSON's
    top-level keys are docs/adaptive.md's: ``power`` 0.8 and ``difference`` D in a separation
    plan; ``power`` null and no ``difference`` in a precision plan."""
    common = ["plan", "--model", "openai:a", "--model", "openai:b", "--data-dir"]
    common += ["../shared/data", "--limit", "3", "--cache-dir", str(tmp_path / "c")]
    common += ["--runs", "1", "--json"]
    separate = [*common, "--separate", "openai:a", "openai:b"]
    for extra, until, difference in (
        (["--difference", "0.5"], "separated=1", 0.5),
        (["--difference", "2", "--tolerance", "2"], "separated=2", 2.0),
    ):
        assert main([*separate, *extra]) == 0
        out, err = capsys.readouterr()
        doc = orjson.loads(out)
        assert err == "" and set(doc) == PLAN_KEYS | {"difference"}
        assert (doc["until"], doc["difference"], doc["power"], doc["quantile"]) == (
            until,
            difference,
            0.8,
            0.8,
        )
    assert main([*common, "--precision", "5"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert set(doc) == PLAN_KEYS
    assert (doc["until"], doc["power"], doc["quantile"], doc["holds"]) == (
        "precision=5",
        None,
        None,
        None,
    )


PLAN_TOKENS = (
    "requests = questions × epochs; cached: those the cache (or an open batch the provider "
    "accepted) holds among the tasks the run asks first (its order, seeded: --seed), not sent "
    "again; new: the rest, whose tokens and dollars "
    "are the cost, as `dxi estimate` prices them (the whole cost is `dxi estimate`'s); "
    "tokens are the model's mean per request (what its cached "
    "replies recorded, and for the requests the cache does not hold `dxi estimate`'s estimates; "
    'each model\'s sources above: "bytes / 4" is the size of its prompts, not usage a run records; '
    "a reply of 0 tokens, from a server that counts none (the embedded model), is not counted)"
)
NO_PRICE = "a cost is — without a price (--price MODEL=IN/OUT)"


def test_plan_note_says_what_its_questions_are_and_the_missing_price_only_when_missing(
    tmp_path, capsys
):
    """The note under a plan: a precision plan's questions are the means over its N runs (the one
    run's with --runs 1), a separation plan's those of the run at 80% power; "a cost is —" only
    when some model has no price. A model every simulated run of which asked the whole set (3
    tasks each, ±0.01 points) is said to be one the data cannot settle."""
    common = ["plan", "--model", "openai:a", "--data-dir", "../shared/data", "--limit", "3"]
    common += ["--cache-dir", str(tmp_path / "c")]

    def printed(*flags: str) -> str:
        assert main([*common, *flags]) == 0
        return " ".join(capsys.readouterr().out.split())

    out = printed("--precision", "0.01", "--runs", "2")
    assert out.endswith(
        f"Questions are the means over the 2 simulated runs; {PLAN_TOKENS}; {NO_PRICE}."
    )
    assert (
        "openai:a: 100% of the simulated runs asked the whole set without settling it: the data "
        "cannot settle it at this setting"
    ) in out
    out = printed("--precision", "0.01", "--runs", "1", "--price", "openai:a=2/8")
    assert out.endswith(f"Questions are those of the one simulated run; {PLAN_TOKENS}.")
    assert "without a price" not in out
    separate = ["--model", "openai:b", "--separate", "openai:a", "openai:b", "--difference", "3"]
    out = printed(*separate, "--runs", "1", "--price", "openai:a=2/8")
    assert out.endswith(
        "Questions are those of the run at 80% power (above); the expected line is the mean; "
        f"{PLAN_TOKENS}; {NO_PRICE}."
    )  # openai:b has no price
    out = printed(*separate, "--runs", "1", "--price", "openai:a=2/8", "--price", "openai:b=1/1")
    assert out.endswith(
        "Questions are those of the run at 80% power (above); the expected line is the mean; "
        f"{PLAN_TOKENS}."
    )


@pytest.mark.parametrize(
    ("share", "line"),
    [
        (
            1.0,
            "100% of the simulated runs asked the whole set without settling it: the data "
            "cannot settle it at this setting",
        ),
        (
            0.1,
            "10% of the simulated runs asked the whole set without settling it (the model can "
            "need every question)",
        ),
        (
            0.9,
            "90% of the simulated runs asked the whole set without settling it (the model can "
            "need every question)",
        ),
        (
            0.996,
            "over 99% of the simulated runs asked the whole set without settling it (the "
            "model can need every question)",
        ),
    ],
)
def test_plan_says_the_data_cannot_settle_a_model_only_when_every_run_asked_everything(share, line):
    assert plan_command.exhausted(share) == line


@pytest.mark.parametrize(
    ("data", "evals", "error"),
    [
        (
            "all",
            "hle_multichoice,when2call",
            "dxi plan: error: --evals leaves out aa_omniscience_decision, wildguardtest: a plan is "
            "of the whole index, which needs all four\n",
        ),
        (
            "no omniscience",
            None,
            "dxi plan: error: dxi plan needs every evaluation of the index; no data for "
            "aa_omniscience_decision (see `dxi data check`)\n",
        ),
        (
            "no omniscience",
            "hle_multichoice,aa_omniscience_decision,when2call",
            "dxi plan: error: --evals leaves out wildguardtest: a plan is of the whole index, which "
            "needs all four; no data for aa_omniscience_decision either (see `dxi data check`)\n",
        ),
    ],
    ids=["left-out", "no-data", "both"],
)
def test_plan_tells_evaluations_left_out_from_evaluations_without_data(
    tmp_path, capsys, data, evals, error
):
    source = pathlib.Path("../shared/data").resolve()
    data_dir = source
    if data != "all":  # the data folder without the Omniscience stand-in
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        for d in ("hle", "when2call", "wildguardtest"):
            (data_dir / d).symlink_to(source / d)
    flags = ["plan", "--model", "embedded", "--precision", "5", "--data-dir", str(data_dir)]
    flags += ["--limit", "3", "--cache-dir", str(tmp_path / "c")]
    assert main([*flags, *(["--evals", evals] if evals else [])]) == 2
    assert capsys.readouterr() == ("", error)


def test_plan_says_whose_evals_select_leaves_out(tmp_path, capsys):
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        '[evals]\nselect = ["hle_multichoice", "when2call", "wildguardtest"]\n\n'
        '[[models]]\nprovider = "embedded"\n'
    )
    flags = ["plan", str(run_file), "--precision", "5", "--data-dir", "../shared/data"]
    assert main([*flags, "--cache-dir", str(tmp_path / "c")]) == 2
    assert capsys.readouterr() == (
        "",
        f"dxi plan: error: the [evals] select of {run_file} leaves out aa_omniscience_decision: "
        "a plan is of the whole index, which needs all four\n",
    )


def test_plan_counts_one_run_and_one_point_in_the_singular(tmp_path, capsys):
    """--runs 1, --difference 1 and --precision 1: "1 simulated run", "1 point"."""
    common = ["plan", "--model", "openai:a", "--data-dir", "../shared/data", "--limit", "3"]
    common += ["--cache-dir", str(tmp_path / "c"), "--runs", "1"]
    separate = [*common, "--model", "openai:b", "--separate", "openai:a", "openai:b"]
    separate += ["--difference", "1", "--tolerance", "0"]
    assert main([*separate, "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert main(separate) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "Plan: separating at a true difference of 1 point (80% power), 1 simulated run "
        "(nothing was sent)"
    ) in out
    assert (
        "A separation plan takes the one simulated run: a fresh run needs no more with "
        "probability 1/2 = 0.50, less than the 80% power asked: --runs 4 or more for it."
    ) in out
    assert f"({planner.PRIOR_SHARES}), 1 point lower" in out
    for m in doc["models"]:
        requests = m["expected"]["requests"]
        assert (
            f"{m['model']}: expected {requests:,.0f} requests (—, batch —), the mean of the 1 "
            f"simulated run; planned above: {m['adaptive']['requests']:,.0f}"
        ) in out
    assert main([*common, "--precision", "1"]) == 0
    assert "Plan: ±1 point, 1 simulated run (nothing was sent)" in " ".join(
        capsys.readouterr().out.split()
    )
    assert [plan_command._count(n, "request") for n in (0, 1, 1.04, 2, 2087)] == [
        "0 requests",
        "1 request",
        "1 request",
        "2 requests",
        "2,087 requests",
    ]
    assert [plan_command._points(v) for v in (1, 1.0, 2.5, 0.5)] == [
        "1 point",
        "1 point",
        "2.5 points",
        "0.5 points",
    ]


def test_index_coverage_at_a_random_look():
    """Seeded: 40 runs of a model on small sets (40/30/20/50 tasks), stopped at a random round: the
    whole-set index (and every metric) lies inside its interval in ≥ 95% of runs."""
    rng = np.random.default_rng(8)
    covered = metrics_covered = 0
    for k in range(40):
        s = 0.2 + 0.6 * (k % 4) / 3
        model = profile("m", s, (1 - s) / 3, 0.5 + 0.4 * s, 0.5 + 0.4 * s)
        ans = planner.synthetic([model], POPS, rng)
        truth = standings(ans, POPS, Until("precision", 100.0))["m"]
        trace: list = []
        planner.simulate(
            ans, POPS, Until("precision", 0.01), planner.random_order(POPS, rng, ans), trace=trace
        )
        st = trace[int(rng.integers(0, len(trace)))]["m"]
        covered += st.index.low - 1e-9 <= truth.index.point <= st.index.high + 1e-9
        metrics_covered += all(
            e.low - 1e-9 <= truth.metrics[m].point <= e.high + 1e-9 for m, e in st.metrics.items()
        )
    assert covered / 40 >= 0.95
    assert metrics_covered / 40 >= 0.95


def test_precision_all_waits_for_every_metric():
    rng = np.random.default_rng(9)
    ans = _answers(_whole("m", 0.5, rng))
    order = {e: [f"{e}/{k}" for k in range(n)] for e, n in POPS.items()}
    half = ans.filter(
        pl.col("task_id").str.split("/").list.get(1).cast(pl.Int64)
        < pl.col("eval").replace_strict(POPS, return_dtype=pl.Int64) // 2
    )
    st = standings(half, POPS, Until("precision", 100.0), order=order)["m"]
    widest = max(e.half_width for e in st.metrics.values())
    assert widest > st.index.half_width
    between = (st.index.half_width + widest) / 2
    assert standings(half, POPS, Until("precision", between), order=order)["m"].settled
    every = standings(half, POPS, Until("precision", between, True), order=order)["m"]
    assert not every.settled
    # the reason names the figure that decides: the index alone without :all, under :all the
    # widest figure (still above P while it runs), with the index beside it once settled
    assert st.reason == "index ±18.19 ≤ ±100 points"
    assert standings(half, POPS, Until("precision", 1.0), order=order)["m"].reason == (
        "index ±18.19 > ±1 point"
    )
    nh = "aa_omniscience_decision.non_hallucination_rate"
    assert (every.index.half_width, every.metrics[nh].half_width) == (
        pytest.approx(19.5208, abs=1e-4),
        pytest.approx(28.6929, abs=1e-4),
    )
    assert max(every.metrics.values(), key=lambda e: e.half_width) == every.metrics[nh]
    running = standings(half, POPS, Until("precision", 26.0, True), order=order)["m"]
    assert not running.settled and running.reason == f"{nh} ±28.69 > ±26 points"
    done = standings(half, POPS, Until("precision", 29.0, True), order=order)["m"]
    assert done.settled and done.rule == "precision=29:all"
    assert done.reason == f"every figure within ±29 points (widest: {nh} ±28.69; index ±19.52)"
    # under :all the metrics' sequences get most of α (EVERY_METRIC_SHARE): each narrower, the
    # index's own sequence wider
    for key, est in every.metrics.items():
        assert est.half_width <= st.metrics[key].half_width, key
    assert sum(e.half_width for e in every.metrics.values()) < sum(
        e.half_width for e in st.metrics.values()
    )
    assert every.index.half_width > st.index.half_width


def test_precision_reasons_name_the_deciding_figure_by_hand(monkeypatch):
    """Figures set by hand (``_model_figures`` replaced): the reason of ``precision=P`` names the
    index; under ``:all`` the widest figure (the first by name of equally wide ones, the index
    first), the index beside it once settled, alone when it is the widest; a figure that cannot
    be computed yet is named."""
    ans = _answers(_whole("m", 0.5, np.random.default_rng(9))).filter(
        pl.col("task_id").str.ends_with("/0")
    )  # one task of each evaluation: nothing exhausted
    figures: dict = {}

    def est(half: float | None) -> sequential.Estimate:
        return sequential.Estimate(50.0, None if half is None else 50 - half, 50 + (half or 0))

    monkeypatch.setattr(sequential, "_model_figures", lambda *_: figures["m"])

    def reason(index, metrics, until):
        figures["m"] = (est(index), {k: est(v) for k, v in metrics.items()})
        st = standings(ans, POPS, Until.parse(until))["m"]
        return st.settled, st.reason

    two = {"when2call.accuracy": 4.85, "hle_multichoice.accuracy": 3.0}
    assert reason(1.79, two, "precision=5") == (True, "index ±1.79 ≤ ±5 points")
    assert reason(1.79, two, "precision=5:all") == (
        True,
        "every figure within ±5 points (widest: when2call.accuracy ±4.85; index ±1.79)",
    )
    assert reason(4.9, two, "precision=5:all") == (
        True,
        "every figure within ±5 points (widest: index ±4.90)",
    )
    wide = {"when2call.accuracy": 7.1, "hle_multichoice.accuracy": 6.0}
    assert reason(1.79, wide, "precision=5") == (True, "index ±1.79 ≤ ±5 points")
    assert reason(1.79, wide, "precision=5:all") == (
        False,
        "when2call.accuracy ±7.10 > ±5 points",
    )
    tied = {"when2call.accuracy": 7.1, "hle_multichoice.accuracy": 7.1}
    assert reason(7.1, tied, "precision=5:all") == (False, "index ±7.10 > ±5 points")
    assert reason(4.0, tied, "precision=5:all") == (
        False,
        "hle_multichoice.accuracy ±7.10 > ±5 points",
    )
    assert reason(0.5, {"when2call.accuracy": 0.9}, "precision=1:all") == (
        True,
        "every figure within ±1 point (widest: when2call.accuracy ±0.90; index ±0.50)",
    )
    unknown = {"when2call.accuracy": None, "hle_multichoice.accuracy": 1.0}
    assert reason(1.0, unknown, "precision=5:all") == (
        False,
        "when2call.accuracy not computable yet",
    )
    assert reason(1.0, unknown, "precision=5") == (True, "index ±1.00 ≤ ±5 points")
    assert reason(None, unknown, "precision=5:all") == (False, "index not computable yet")


def test_a_separated_reason_says_the_relation_of_each_pair_by_hand(monkeypatch):
    """Pair intervals and index estimates set by hand (``_pair_interval`` and ``_model_figures``
    replaced; the difference is first − second of the pair, by label): the settled reason says
    whom the model is known to be above, below and within ±Δ of (a low end above 0: above; a
    high end below 0: below; else within ±Δ), names at most three per relation, the nearest
    index estimate first (then by label), then "+N more"; a running one whom it is not yet told
    from."""
    labels = ["a", "b", "c", "d", "e", "f"]
    rng = np.random.default_rng(14)
    ans = _answers([r for m in labels for r in _whole(m, 0.5, rng)]).filter(
        pl.col("task_id").str.ends_with("/0")
    )
    parts = sequential._parts(ans, None)
    # a is above b, c, d, e (the low end above 0, 0.01 too), below nobody, within ±1 of f;
    # b − c in [−1, 1] exactly: within ±1; c − d in [−1.5, 0.5]: neither ordered nor within ±1
    intervals = {
        ("a", "b"): (0.2, 9.0),
        ("a", "c"): (3.0, 8.0),
        ("a", "d"): (0.01, 2.0),
        ("a", "e"): (5.0, 6.0),
        ("a", "f"): (-0.5, 0.9),
        ("b", "c"): (-1.0, 1.0),
        ("b", "d"): (-4.0, -2.0),
        ("b", "e"): (-4.0, -0.1),
        ("b", "f"): (-8.0, -3.0),
        ("c", "d"): (-1.5, 0.5),
        ("c", "e"): (-3.0, -1.0),
        ("c", "f"): (-9.0, -2.0),
        ("d", "e"): (-2.0, -1.0),
        ("d", "f"): (-7.0, -1.0),
        ("e", "f"): (-6.0, -0.2),
    }
    label_of = {id(by): m for m, by in parts.items()}
    points = {"a": 60.0, "b": 49.0, "c": 49.5, "d": 50.0, "e": 57.0, "f": 60.2}

    def by_hand(pa, pb, populations, alpha, boxes):
        return intervals[(label_of[id(pa)], label_of[id(pb)])]

    def figures(part, *_):
        point = points[label_of[id(part)]]
        return sequential.Estimate(point, point - 5, point + 5), {}

    monkeypatch.setattr(sequential, "_pair_interval", by_hand)
    monkeypatch.setattr(sequential, "_model_figures", figures)
    got = sequential._standings(parts, POPS, Until.parse("separated"), 0.05)
    assert {m: (st.settled, st.rule, st.reason) for m, st in got.items()} == {
        "a": (True, "separated=1", "above 4 (e, d, c, +1 more); below none; within ±1 point of f"),
        "b": (True, "separated=1", "above none; below 4 (d, e, a, +1 more); within ±1 point of c"),
        "c": (False, None, "not yet told apart from 1: d"),
        "d": (False, None, "not yet told apart from 1: c"),
        "e": (True, "separated=1", "above 3 (d, c, b); below 2 (a, f); within ±1 point of none"),
        "f": (True, "separated=1", "above 4 (e, d, c, +1 more); below none; within ±1 point of a"),
    }
    # Δ = 2: c and d within ±2 (b and d equally near c: by label); the unit in the plural
    got = sequential._standings(parts, POPS, Until.parse("separated=2"), 0.05)
    assert got["c"].reason == "above none; below 3 (e, a, f); within ±2 points of 2 (b, d)"
    assert got["d"].reason == "above b; below 3 (e, a, f); within ±2 points of c"


def test_named_caps_the_names_at_three():
    assert sequential._named([]) == "none"
    assert sequential._named(["x"]) == "x"
    assert sequential._named(["x", "y"]) == "2 (x, y)"
    assert sequential._named(["x", "y", "z"]) == "3 (x, y, z)"
    assert sequential._named(["v", "w", "x", "y", "z"]) == "5 (v, w, x, +2 more)"


@pytest.mark.parametrize("epochs", [1, 2])
def test_simulate_looks_equal_standings_over_the_asked_rows(epochs):
    """``planner.simulate`` slices one whole set's components per look (``_Part.head``): every
    look's standings equal ``standings`` over the rows each model was asked, exactly."""
    rng = np.random.default_rng(10)
    a = profile("a", 0.6, 0.1, 0.8, 0.8)
    b = dataclasses.replace(a, label="b", accuracy={e: 0.3 for e in planner.CHOICE_EVALS})
    ans = planner.synthetic([a, b], POPS, rng, epochs=epochs)
    order = planner.random_order(POPS, rng, ans)
    trace: list = []
    planner.simulate(ans, POPS, Until("separated", 1.0), order, trace=trace)
    assert len(trace) >= 2
    pos = pl.concat(
        [pl.DataFrame({"eval": e, "task_id": ts, "pos": range(len(ts))}) for e, ts in order.items()]
    )
    for look in trace:
        limits = pl.DataFrame(
            [(m, e, n) for m, st in look.items() for e, n in st.asked.items()],
            schema={"label": pl.String, "eval": pl.String, "limit": pl.Int64},
            orient="row",
        )
        asked = (
            ans.join(pos, on=["eval", "task_id"])
            .join(limits, on=["label", "eval"])
            .filter(pl.col("pos") < pl.col("limit"))
        )
        assert standings(asked, POPS, Until("separated", 1.0), order=order) == look


def test_separation_holds_every_pair_at_once(monkeypatch):
    """Seeded: 30 runs of four models on small sets, looked at a random round: every pair's
    interval of the index difference (``_pair_interval`` as ``_standings`` calls it, with each
    model's boxes shared by its pairs) holds the whole-set difference in ≥ 95% of runs, all six
    pairs at once."""
    rng = np.random.default_rng(13)
    seen: list = []
    real = sequential._pair_interval

    def record(pa, pb, populations, alpha, boxes):
        iv = real(pa, pb, populations, alpha, boxes)
        seen.append((pa, pb, iv))
        return iv

    monkeypatch.setattr(sequential, "_pair_interval", record)
    held = 0
    for _ in range(30):
        models = [
            profile(f"m{k}", 0.3 + 0.1 * k, 0.2, 0.6 + 0.05 * k, 0.7 + 0.05 * k) for k in range(4)
        ]
        ans = planner.synthetic(models, POPS, rng)
        truth = {
            m: s.index.point for m, s in standings(ans, POPS, Until("precision", 100.0)).items()
        }
        order = planner.random_order(POPS, rng, ans)
        parts = sequential._parts(ans, order)
        share = float(rng.choice([0.2, 0.4, 0.6, 0.8]))
        heads = {
            m: {e: p.head(math.ceil(share * POPS[e])) for e, p in by.items()}
            for m, by in parts.items()
        }
        names = {id(v): m for m, v in heads.items()}
        seen.clear()
        sequential._standings(heads, POPS, Until("separated", 1.0), 0.05)
        assert len(seen) == 6
        held += all(
            lo - 1e-9 <= truth[names[id(a)]] - truth[names[id(b)]] <= hi + 1e-9
            for a, b, (lo, hi) in seen
        )
    assert held / 30 >= 0.95


def test_the_index_sequence_on_one_accuracy_is_the_empirical_bernstein_interval_by_hand():
    """One evaluation with one accuracy term: ``product_interval`` is the closed form of the
    module docstring, ``[(A − Ψ − log(2/α))/B, (A + Ψ + log(2/α))/B]``, computed here one draw at
    a time (no NumPy) with the bet tuned to ``TARGET`` of a prior variance of 1/4."""
    rng = np.random.default_rng(21)
    population, n, alpha = 200, 60, 0.05
    c = (rng.random(n) < 0.4).astype(float)
    term = sequential._Term(
        "lin", 1.0, {False: c, True: c}, {False: np.ones(n)} | {True: np.ones(n)}, 1.0, (0.0, 1.0)
    )
    got = sequential.product_interval({"e": ([term], n, population)}, alpha, 0.0)
    log_term = math.log(2 / alpha)
    bet = math.sqrt(2 * log_term / (0.25 / population)) / math.sqrt(sequential.TARGET) / population
    g = min(bet, sequential.CAP)
    a = b = psi = s = 0.0
    for i, x in enumerate(c.tolist()):
        a += g * (x + s / (population - i))
        b += g * population / (population - i)
        psi += (-math.log(1 - g) - g) * (x - (0.5 + s) / (1 + i)) ** 2
        s += x
    assert got == pytest.approx(((a - psi - log_term) / b, (a + psi + log_term) / b), abs=1e-12)


def _f1_terms(rng: np.random.Generator, n: int) -> list:
    """An accuracy term and three F1 terms over ``n`` tasks (one stratum, for the steering)."""
    c = (rng.random(n) < 0.45).astype(float)
    terms = [
        sequential._Term(
            "lin", 0.25, {False: c, True: c}, {False: np.ones(n), True: np.ones(n)}, 1.0, (0.0, 1.0)
        )
    ]
    for share in (0.42, 0.29, 0.16):  # gold "yes" shares of the three questions
        gold = rng.random(n) < share
        right = rng.random(n) < 0.8
        tp = (gold & right).astype(float)
        err = (~right).astype(float)
        num, den = 2 * tp, 2 * tp + err
        terms.append(
            sequential._Term(
                "f1", 0.25 / 3, {False: num, True: num}, {False: den, True: den}, 0.6, (0.0, 1.0)
            )
        )
    return terms


def test_steering_keeps_every_term_in_step_with_an_accuracy(monkeypatch):
    """The ratio terms' coefficients are steered block by block: after 300 of 880 draws each
    term's linear coefficient per unit of weight (``K_t/w_t``) is within 3% of the accuracy's
    (1.6% here); with the plain references w/D̂ (no steering) one is 6.7% off. The
    coefficients of a draw never depend on how many draws there are (``n``)."""
    rng = np.random.default_rng(22)
    terms = _f1_terms(rng, 880)
    bet = 0.3

    def spread() -> float:
        _, k, *_ = sequential._sums(terms, 300, 880, False, bet)
        per_weight = k / np.array([t.weight for t in terms])
        return float(np.max(np.abs(per_weight[1:] / per_weight[0] - 1)))

    assert spread() < 0.03
    full = sequential._coefficients(terms, _dprime(terms, 880), 880, 880, False)
    part = sequential._coefficients(terms, _dprime(terms, 300), 300, 880, False)
    assert np.array_equal(full[:, :300], part)
    monkeypatch.setattr(sequential, "STEER", (1.0, 1.0))
    assert spread() > 0.05


def _dprime(terms: list, n: int) -> np.ndarray:
    den = np.stack([t.den[False][:n] for t in terms])
    return den + (np.cumsum(den, 1) - den) / (880 - np.arange(n))


def test_least_is_the_linear_programme_scipy_solves():
    """``_least`` (min w·r over a box with k·r ≥ h, each k_t of w_t's sign) agrees with
    ``scipy.optimize.linprog`` on 200 seeded instances, feasible ones and the box's corner."""
    from scipy.optimize import linprog

    rng = np.random.default_rng(23)
    for _ in range(200):
        t = int(rng.integers(1, 9))
        w = rng.uniform(0.05, 0.3, t) * rng.choice([-1, 1], t)
        k = w * rng.uniform(100, 200) * rng.uniform(0.8, 1.2, t)
        lo = rng.uniform(0, 0.5, t)
        hi = lo + rng.uniform(0, 0.5, t)
        corner = np.where(w > 0, lo, hi)
        top = float(np.sum(np.maximum(k * lo, k * hi)))
        h = float(rng.uniform(k @ corner - 5, top))
        want = linprog(w, A_ub=-k[None], b_ub=[-h], bounds=list(zip(lo, hi, strict=True)))
        assert want.status == 0
        assert sequential._least(w, k, h, lo, hi) == pytest.approx(want.fun, abs=1e-9)


def test_an_aimed_round_stops_short_of_the_schedule_by_hand():
    """``round_sizes(aim=)``, from a third of each set (165 of 500, 99 of 300): aimed at 36% it
    asks ceil(0.36·N) − asked; an aim below 1% more than was asked asks 34%; an aim past the
    schedule's next share (45.035%) asks the schedule's; ``_predicted`` by hand."""
    pops, asked = {"a": 500, "b": 300}, {"a": 165, "b": 99}
    assert round_sizes(asked, pops) == {"a": 226 - 165, "b": 136 - 99}  # schedule(5) = 0.45035
    assert round_sizes(asked, pops, aim=0.36) == {"a": 180 - 165, "b": 108 - 99}
    assert round_sizes(asked, pops, aim=0.30) == {"a": 170 - 165, "b": 102 - 99}
    assert round_sizes(asked, pops, aim=0.5) == round_sizes(asked, pops)
    # ±6 at 30% of the set, ±5 wanted: 1.02 / (1 + (5/6)² · 0.7/0.3)
    assert sequential._predicted(6.0, 5.0, 0.3) == pytest.approx(1.02 / (1 + 25 / 36 * 7 / 3))
    assert sequential._predicted(4.0, 5.0, 0.3) == 0.3  # already there
    assert sequential._predicted(4.0, 0.0, 0.3) == 1.0  # never


def test_aimed_rounds_never_ask_more_than_the_schedule(monkeypatch):
    """Seeded: 8 runs of ``--until precision=10`` on small sets (``planner.simulate``, the run's
    loop) stop each model at a share no larger than on the schedule alone, and smaller in some;
    ``aim`` is the least ``settles_at`` of the running models."""
    rng = np.random.default_rng(24)
    model = profile("m", 0.4, 0.2, 0.7, 0.8)
    sets = []
    for _ in range(8):
        ans = planner.synthetic([model], POPS, rng)
        sets.append((ans, planner.random_order(POPS, rng, ans)))

    def asked(ans, order) -> int:
        return sum(planner.simulate(ans, POPS, Until("precision", 10.0), order).asked["m"].values())

    aimed = [asked(*s) for s in sets]
    monkeypatch.setattr(sequential, "aim", lambda standings: None)
    plain = [asked(*s) for s in sets]
    assert all(a <= p for a, p in zip(aimed, plain, strict=True))
    assert sum(aimed) < sum(plain)
    running = sequential.Standing(
        "x", {}, {}, sequential.Estimate(None, None, None), {}, False, None, "", 0.5
    )
    done = dataclasses.replace(running, settled=True, settles_at=0.2)
    later = dataclasses.replace(running, settles_at=0.7)
    monkeypatch.undo()
    assert sequential.aim([running, done, later]) == 0.5
    assert sequential.aim([done]) is None


def test_the_interval_holds_when_nearly_the_whole_set_is_asked():
    """A set of 513 with 202 ones, asked 480 to 512 of it: the interval holds the whole-set mean,
    inside the bounds that hold with certainty and wider than a point, although it is then
    narrower than the first grid of the search (found by zooming on the least impossible
    candidate: ``capital(graded=True)`` orders the impossible ones by how far they are)."""
    rng = np.random.default_rng(25)
    x = rng.permutation(np.r_[np.ones(202), np.zeros(311)])
    for t in (480, 500, 505, 507, 510, 512):
        lo, hi = interval(x[:t], x[:t], 513, 0.004)
        certain = (x[:t].sum() / 513, (x[:t].sum() + 513 - t) / 513)
        assert certain[0] - 1e-12 <= lo <= 202 / 513 <= hi <= certain[1] + 1e-12
        assert hi - lo > 0.001
    graded = capital(
        np.broadcast_to(x[:500], (3, 500)), np.array([0.0, 0.2, 202 / 513]), 513, 0.004, graded=True
    )
    assert graded[0] > graded[1] > 1e12 > graded[2]
    assert np.isinf(capital(x[None, :500], np.array([0.2]), 513, 0.004))


def scorer_points(ans: pl.DataFrame) -> dict[str, dict[str, float]]:
    """The scorer's figure of every metric of each model (``sums.eval_metrics``: per epoch, then
    the mean over the epochs): label -> ``eval.metric`` -> points."""
    out: dict[str, dict[str, float]] = {}
    for name, cube in build_cubes(ans).items():
        for metric, values in eval_metrics(cube).point.items():
            for label, v in zip(cube.labels, values, strict=True):
                out.setdefault(label, {})[f"{name}.{metric}"] = float(v)
    return out


def test_several_epochs_estimate_the_scorers_mean_of_per_epoch_ratios():
    """With 3 epochs a ratio metric's figure is the mean of its per-epoch ratios (SPEC §6), which
    the ratio of the epoch-averaged counts misses by 0.33 point here: on the whole set every
    metric is exact at the scorer's figure, and so is the index (its weighted sum); on the
    first half, each point is the scorer's over the asked rows."""
    rng = np.random.default_rng(31)
    ans = planner.synthetic([profile("m", 0.5, 0.2, 0.7, 0.8)], POPS, rng, epochs=3)
    want = scorer_points(ans)["m"]
    st = standings(ans, POPS, Until.parse("precision=5"))["m"]
    assert st.rule == "exhausted"
    for key, est in st.metrics.items():
        assert est.low == est.point == est.high == pytest.approx(want[key], abs=1e-9), key
    index = sum(w * want[f"{e}.{m}"] for (e, m), w in WEIGHTS.items())
    assert st.index.low == st.index.high == pytest.approx(index, abs=1e-9)
    # the ratio of the epoch-averaged counts (the former estimate) is not the scorer's figure
    omni = ans.filter(pl.col("eval") == "aa_omniscience_decision")
    right, hall = (omni["predicted"] == "A").sum(), (omni["predicted"] == "B").sum()
    pooled = 100 * (1 - hall / (omni.height - right))
    nh = want["aa_omniscience_decision.non_hallucination_rate"]
    assert abs(pooled - nh) > 0.3
    half = ans.filter(
        pl.col("task_id").str.split("/").list.get(1).cast(pl.Int64)
        < pl.col("eval").replace_strict(POPS, return_dtype=pl.Int64) // 2
    )
    st = standings(half, POPS, Until.parse("precision=5"))["m"]
    for key, value in scorer_points(half)["m"].items():
        if key in st.metrics:
            est = st.metrics[key]
            assert est.point == pytest.approx(value, abs=1e-9), key
            assert est.low < est.point < est.high


def test_index_coverage_at_a_random_look_with_epochs():
    """Seeded: 40 runs of two models with 2 or 3 epochs on small sets, looked at after a random
    share of a random order: the scorer's whole-set index and every metric (means of per-epoch
    figures) lie inside their intervals in ≥ 95% of runs, and so does the pair's difference (18
    ratio terms with 3 epochs: ``_largest``'s bound past ``CORNERS``)."""
    rng = np.random.default_rng(32)
    covered = metrics_covered = pairs_covered = 0
    for k in range(40):
        s = 0.2 + 0.6 * (k % 4) / 3
        a = profile("a", s, (1 - s) / 3, 0.5 + 0.4 * s, 0.5 + 0.4 * s)
        b = dataclasses.replace(a, label="b", accuracy={e: s + 0.05 for e in planner.CHOICE_EVALS})
        ans = planner.synthetic([a, b], POPS, rng, epochs=3 if k % 2 else 2)
        truth = scorer_points(ans)
        index = {m: sum(w * truth[m][f"{e}.{q}"] for (e, q), w in WEIGHTS.items()) for m in truth}
        parts = sequential._parts(ans, planner.random_order(POPS, rng, ans))
        share = rng.uniform(0.05, 0.95)
        n = {e: max(2, int(share * size)) for e, size in POPS.items()}
        heads = {m: {e: p.head(n[e]) for e, p in parts[m].items()} for m in parts}
        st = sequential._standings(heads, POPS, Until("precision", 0.01), 0.05)["a"]
        covered += st.index.low - 1e-9 <= index["a"] <= st.index.high + 1e-9
        metrics_covered += all(
            e.low - 1e-9 <= truth["a"][m] <= e.high + 1e-9 for m, e in st.metrics.items()
        )
        boxes = {
            m: {e: sequential._box(p, e, n[e], POPS[e], 0.01) for e, p in heads[m].items()}
            for m in heads
        }
        lo, hi = sequential._pair_interval(
            heads["a"], heads["b"], POPS, 0.04, (boxes["a"], boxes["b"])
        )
        pairs_covered += lo - 1e-9 <= index["a"] - index["b"] <= hi + 1e-9
    assert covered / 40 >= 0.95
    assert metrics_covered / 40 >= 0.95
    assert pairs_covered / 40 >= 0.95


def test_largest_bounds_the_corners_past_their_count():
    """``_largest`` past ``CORNERS`` dimensions is an upper bound of the largest corner (found by
    enumerating them) on 50 seeded instances of 13 dimensions, and within 10% of it on narrow
    boxes like the metrics'."""
    rng = np.random.default_rng(33)
    t = sequential.CORNERS + 1
    for _ in range(50):
        e1 = rng.normal(size=(t, 40))
        c = e1 @ e1.T / 40
        b = rng.normal(size=t) / 10
        lo = rng.uniform(0, 0.8, t)
        hi = lo + rng.uniform(0, 0.05, t)
        corners = np.array(list(itertools.product(*zip(lo, hi, strict=True))))
        exact = float(np.max(1.0 + 2 * corners @ b + np.einsum("ct,tu,cu->c", corners, c, corners)))
        bound = sequential._largest(1.0, b, c, lo, hi)
        assert exact - 1e-9 <= bound <= exact + 0.1 * abs(exact)


@pytest.mark.parametrize("epochs", [1, 3])
def test_the_bets_prior_variance_of_a_pair_is_its_two_models(epochs):
    """The prior variance that tunes a pair's bet (``_variance``) is the sum of its two models':
    a model's epochs of one metric are taken as one (fully correlated), the two models never
    (their terms of a metric carry opposite signs and must not cancel)."""
    rng = np.random.default_rng(34)
    ans = planner.synthetic(
        [profile("a", 0.5, 0.2, 0.7, 0.8), profile("b", 0.4, 0.2, 0.7, 0.8)],
        POPS,
        rng,
        epochs=epochs,
    )
    parts = sequential._parts(ans, None)
    for name, size in POPS.items():
        terms = {
            m: sequential._index_terms(
                parts[m][name], name, sequential._box(parts[m][name], name, size, size, 0.01), sign
            )
            for m, sign in (("a", 1.0), ("b", -1.0))
        }
        one = sequential._variance(terms["a"])
        assert one > 0
        assert sequential._variance(terms["b"]) == pytest.approx(one)
        assert sequential._variance(terms["a"] + terms["b"]) == pytest.approx(2 * one)
        # a model's epochs add up to their metric's weight: the prior of one epoch, by hand
        # (each metric's weight over its reference denominator, 1 for an accuracy, 0.6 for a
        # ratio; mean F1's weight shared by its three F1s)
        want = {
            "aa_omniscience_decision": (0.125 / 1.0) ** 2 + (0.125 / 0.6) ** 2,
            "hle_multichoice": 0.25**2,
            "when2call": 0.25**2,
            "wildguardtest": 3 * (0.25 / 3 / 0.6) ** 2,
        }
        assert one == pytest.approx(0.25 * want[name], rel=1e-12)


@pytest.mark.parametrize(
    ("quantile", "runs", "k"),
    [
        (0.8, 10, 9),
        (0.5, 10, 6),
        (0.8, 4, 4),
        (0.8, 3, 3),
        (0.95, 10, 10),
        (1.0, 5, 5),
        (0.1, 10, 2),
    ],
)
def test_a_plan_at_a_power_takes_the_conformal_order_statistic(quantile, runs, k):
    """k = ⌈q·(runs + 1)⌉, at most ``runs`` (by hand)."""
    assert planner.order_statistic(quantile, runs) == k
    # the fewest runs for the power: the largest k of them holds runs/(runs + 1) ≥ q
    need = planner.runs_for(quantile)
    assert need is None if quantile == 1 else need / (need + 1) >= quantile > (need - 1) / need


def test_the_order_statistic_holds_a_fresh_run_with_its_stated_probability():
    """Seeded: 20,000 times, 10 simulated runs and a fresh one from the same distribution: the fresh
    one is at most the plan's run (the 9th smallest for 80% power) in 9/11 of the trials, as
    ``holds`` says; the in-sample 80th percentile (the 8th, what ``plan`` took before) only in
    8/11 = 0.727, below the power asked."""
    rng = np.random.default_rng(36)
    draws = rng.gamma(3.0, size=(20_000, 11))
    ranked = np.sort(draws[:, :10], axis=1)
    k = planner.order_statistic(0.8, 10)
    held = float(np.mean(draws[:, 10] <= ranked[:, k - 1]))
    assert k == 9 and held == pytest.approx(9 / 11, abs=0.01)
    assert float(np.mean(draws[:, 10] <= ranked[:, 7])) == pytest.approx(8 / 11, abs=0.01)


def test_a_separation_plan_says_how_often_it_holds(tmp_path, capsys):
    """``dxi plan --separate`` on 3 simulated runs: the run it plans is the 3rd smallest (⌈0.8·4⌉),
    which a fresh run needs no more than with probability 3/4, below the 80% asked: the table
    says so and names the runs that would do; the JSON carries ``holds``."""
    flags = separation_plan(tmp_path, 20, "30", "--runs", "3")
    assert main(flags) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "A separation plan takes run 3 of the 3 simulated runs sorted by the questions they asked: "
        "a fresh run needs no more with probability 3/4 = 0.75, less than the 80% power asked: "
        "--runs 4 or more for it."
    ) in out
    assert main([*flags, "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert (doc["holds"], doc["power"], doc["runs"]) == (0.75, 0.8, 3)
    # the mean run beside the power's: the table's line carries the JSON's figures
    a = doc["models"][0]
    assert a["expected"]["requests"] <= a["adaptive"]["requests"]
    assert (
        f"openai:a: expected {a['expected']['requests']:,.0f} requests (—, batch —), the mean of "
        f"the 3 simulated runs; planned above: {a['adaptive']['requests']:,.0f}"
    ) in out
