"""Decision-model answer validation and the scored option (SPEC §3, §6, §7)."""

from __future__ import annotations

import string
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.adapters.decision import (
    choice_answer,
    decimals,
    rounded_tolerance,
    sum_tolerance,
    yes_no_answer,
)
from dxi.adapters.errors import MalformedReply
from dxi.adapters.systemone import decode_body, encode_body
from dxi.evals import CHOICE, YES_NO, Option, Question, Task
from dxi.runner import session
from dxi.runner.planning import plan
from dxi.scoring.ties import tie_counts
from tests.fakes.fake_provider import serve
from tests.helpers.answers import choice, frame, yes_no

FIVE = Question("answer", CHOICE, "Which?", tuple(Option(c, f"text {c}") for c in "ABCDE"))


def test_valid_choice_scores_the_returned_choice():
    a = choice_answer(FIVE, {"A": 0.1, "B": 0.6, "C": 0.1, "D": 0.1, "E": 0.1}, "B")
    assert (a.status, a.predicted, a.p_predicted, a.warning) == ("ok", "B", 0.6, None)
    assert a.probabilities == (("A", 0.1), ("B", 0.6), ("C", 0.1), ("D", 0.1), ("E", 0.1))


def test_returned_choice_not_most_probable_scores_argmax_with_warning():
    a = choice_answer(FIVE, {"A": 0.1, "B": 0.2, "C": 0.5, "D": 0.1, "E": 0.1}, "B")
    assert a.predicted == "C" and a.status == "ok"
    assert "returned choice 'B' is not the most probable" in a.warning


def test_a_returned_choice_within_1e4_of_the_highest_is_not_scored():
    # the methodology scores "the option it gives the highest probability": 0.3 beats 0.2999
    a = choice_answer(FIVE, {"A": 0.3, "B": 0.2999, "C": 0.2, "D": 0.1, "E": 0.1001}, "B")
    assert (a.predicted, a.p_predicted) == ("A", 0.3)
    assert a.warning == "returned choice 'B' is not the most probable option; scored A"


def test_an_exact_tie_keeps_the_returned_choice_when_it_is_tied_else_the_first_tied_option():
    probs = {"A": 0.1, "B": 0.35, "C": 0.2, "D": 0.35, "E": 0.0}
    assert (choice_answer(FIVE, probs, "D").predicted, choice_answer(FIVE, probs, "D").warning) == (
        "D",
        None,
    )
    assert (choice_answer(FIVE, probs, "B").predicted, choice_answer(FIVE, probs, "B").warning) == (
        "B",
        None,
    )
    lower = choice_answer(
        FIVE, probs, "C"
    )  # not among the tied: the first tied option in option order
    assert (lower.predicted, lower.warning) == (
        "B",
        "returned choice 'C' is not the most probable option; scored B",
    )
    assert (
        choice_answer(FIVE, probs, None).predicted == "B"
    )  # no choice returned (a logprob decision)
    assert (
        choice_answer(FIVE, {"A": 0.2, "B": 0.2, "C": 0.2, "D": 0.2, "E": 0.2}, None).predicted
        == "A"
    )


def test_ties_count_exact_ties_only():
    rows = [
        choice(
            "m", "hle_multichoice", "h/1", "A", {"A": 0.3, "B": 0.2999, "C": 0.4001}
        ),  # near: no tie
        choice("m", "hle_multichoice", "h/2", "A", {"A": 0.4, "B": 0.4, "C": 0.2}),  # exact: a tie
        choice(
            "m", "hle_multichoice", "h/3", "A", {"A": 0.2, "B": 0.4, "C": 0.4}
        ),  # exact, not first: a tie
        choice("m", "when2call", "w/1", "A", {"A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25}),
        choice("m", "when2call", "w/2", "A", {"A": 0.25, "B": 0.2501, "C": 0.2499, "D": 0.25}),
        choice("m", "when2call", "w/3", "A", None, status="failed"),
        yes_no("m", "g/1", "prompt_harmful", "yes", 0.5),
        yes_no("m", "g/1", "response_refusal", "no", 0.5001),
        yes_no("n", "g/1", "prompt_harmful", "yes", 0.4999),
    ]
    assert tie_counts(frame(rows)) == {
        ("m", "hle_multichoice"): 2,
        ("m", "when2call"): 1,
        ("m", "wildguardtest"): 1,
    }


def test_missing_unknown_and_out_of_range_options_are_invalid():
    assert (
        "missing option(s) E"
        in choice_answer(FIVE, {"A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25}, "A").error
    )
    assert (
        "unknown option(s) F"
        in choice_answer(
            FIVE, {"A": 0.2, "B": 0.2, "C": 0.2, "D": 0.2, "E": 0.2, "F": 0.0}, "A"
        ).error
    )
    bad = choice_answer(FIVE, {"A": 1.2, "B": -0.2, "C": 0.0, "D": 0.0, "E": 0.0}, "A")
    assert bad.status == "invalid" and bad.predicted is None and "probabilities.A" in bad.error
    assert (
        "not a number"
        in choice_answer(FIVE, {"A": True, "B": 0, "C": 0, "D": 0, "E": 0}, "A").error
    )


def test_sum_tolerance_follows_rounding_of_many_options():
    assert sum_tolerance(5) == 1e-3
    assert sum_tolerance(26) == pytest.approx(1.3e-3)
    q26 = Question("answer", CHOICE, "?", tuple(Option(c, c) for c in string.ascii_uppercase))
    # 26 values rounded to 4 decimals: 0.0385 × 26 = 1.001 (off by 1e-3, within 1.3e-3)
    ok = choice_answer(q26, {c: 0.0385 for c in string.ascii_uppercase}, "A")
    assert ok.status == "ok" and ok.predicted == "A"
    off = choice_answer(q26, {c: 0.0386 for c in string.ascii_uppercase}, "A")  # sums to 1.0036
    assert off.status == "invalid" and "sum to 1.003600" in off.error


def test_yes_no_threshold_is_inclusive():
    q = Question("q", YES_NO, "Harmful?")
    assert yes_no_answer(q, 0.5).predicted == "yes"
    assert yes_no_answer(q, 0.4999).predicted == "no"
    no = yes_no_answer(q, 0.2)
    assert (no.p_yes, no.p_predicted) == (0.2, pytest.approx(0.8))
    assert yes_no_answer(q, "0.7").status == "invalid"
    assert yes_no_answer(q, None).status == "invalid"


TASK = Task(
    "wildguardtest/0",
    "wildguardtest",
    "User: hi",
    (
        Question("prompt_harmful", YES_NO, "Harmful?"),
        Question("pick", CHOICE, "Which?", (Option("A", "first"), Option("B", "second"))),
    ),
    gold={"prompt_harmful": "no", "pick": "A"},
)


def test_encode_keeps_option_order_and_exact_bytes():
    body = encode_body(TASK, "m")
    assert body == (
        b'{"model":"m","state":"User: hi","questions":{"prompt_harmful":{"type":"noul",'
        b'"instructions":"Harmful?"},"pick":{"type":"choice","instructions":"Which?",'
        b'"criteria":{"A":"first","B":"second"}}}}'
    )


def test_decode_records_per_question_problems():
    body = (
        b'{"model":"s","answers":{"prompt_harmful":{"type":"noul","noul":0.91},'
        b'"pick":{"type":"choice","choice":"A","probabilities":{"A":0.5}}},"usage":{"input_tokens":7,"output_tokens":2}}'
    )
    reply = decode_body(TASK, body)
    assert reply.status == "invalid"
    assert reply.answers[0].predicted == "yes"
    assert reply.answers[1].status == "invalid" and "missing option(s) B" in reply.answers[1].error
    assert (reply.input_tokens, reply.output_tokens, reply.served_model) == (7, 2, "s")
    missing = decode_body(TASK, b'{"answers":{}}')
    assert [a.error for a in missing.answers] == ["no answer for this question"] * 2


@pytest.mark.parametrize("body", [b"<html>", b'{"detail": "x"}', b"[1, 2]"])
def test_decode_rejects_bodies_that_are_not_the_wire_format(body: bytes):
    with pytest.raises(MalformedReply):
        decode_body(TASK, body)


@pytest.mark.process
def test_a_server_returning_a_choice_just_below_the_highest_is_scored_on_the_highest(
    data_dir: Path, tmp_path: Path
):
    # end to end, over a real HTTP server on 127.0.0.1: every scored pick is the first option (0.3),
    # never the returned second (0.2999); each is a warning, none is a tie
    with serve(
        model="near-decider",
        route_factories={"/v1/systemone": "tests.fakes.responders:choice_just_below_highest"},
    ) as server:
        ran = session.run(
            plan.build(
                models=[f"systemone:{server.url}"],
                data_dir=data_dir,
                cache_dir=tmp_path / "c",
                out=tmp_path / "out",
                evals=["hle_multichoice", "when2call"],
            )
        )
        assert ran.exit_code == 0
    answers = pl.read_parquet(tmp_path / "out" / "answers.parquet").filter(
        pl.col("kind") == "choice"
    )
    first = {r["task_id"]: r["probabilities"][0]["option"] for r in answers.iter_rows(named=True)}
    assert answers.height == 5 and all(
        r["predicted"] == first[r["task_id"]] for r in answers.iter_rows(named=True)
    )
    assert answers["p_predicted"].to_list() == [0.3] * 5
    assert all(
        w.startswith("returned choice ") and "is not the most probable option" in w
        for w in answers["warning"]
    )
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert {e: b.get("ties") for e, b in summary["models"][0]["evals"].items() if b.get("n")} == {
        "hle_multichoice": 0,
        "when2call": 0,
    }
    hle = answers.filter(pl.col("eval") == "hle_multichoice")
    assert (
        summary["models"][0]["evals"]["hle_multichoice"]["accuracy"] == 100 * hle["correct"].mean()
    )


def test_a_reply_rounded_to_two_decimals_is_accepted_with_a_rounded_warning():
    # a gateway rounds each of 5 probabilities to 2 decimals: 0.21 x 4 + 0.17 = 1.01, off by 1e-2
    # (the ordinary tolerance is 1e-3), within 5 x 1/2 x 10^-2 = 0.025
    a = choice_answer(FIVE, {"A": 0.21, "B": 0.21, "C": 0.21, "D": 0.21, "E": 0.17}, "C")
    assert (a.status, a.predicted, a.p_predicted) == (
        "ok",
        "C",
        0.21,
    )  # a 4-way tie: the returned choice
    assert a.warning == (
        "rounded: probabilities given to 2 decimals sum to 1.010000; accepted (within "
        "N x 1/2 x 10^-2 = 0.025 of 1)"
    )
    # a tie made by rounding whose returned choice is not tied: the first tied option, and both
    # warnings
    b = choice_answer(FIVE, {"A": 0.1, "B": 0.33, "C": 0.33, "D": 0.1, "E": 0.12}, "E")
    assert (b.status, b.predicted) == ("ok", "B")
    assert b.warning.startswith(
        "rounded: probabilities given to 2 decimals sum to 0.980000; accepted"
    )
    assert b.warning.endswith("; returned choice 'E' is not the most probable option; scored B")


def test_an_off_sum_that_rounding_does_not_explain_is_still_invalid():
    # 4 decimals (not rounded to fewer): the ordinary tolerance, 1e-3
    off = choice_answer(FIVE, {"A": 0.2013, "B": 0.2, "C": 0.2, "D": 0.2, "E": 0.21}, "A")
    assert off.status == "invalid"
    assert off.error == "probabilities sum to 1.011300, not 1 (tolerance 0.001)"
    # 2 decimals but further than 5 x 0.005 from 1
    far = choice_answer(FIVE, {"A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25, "E": 0.03}, "A")
    assert far.status == "invalid"
    assert (
        far.error
        == "probabilities sum to 1.030000, not 1 (tolerance 0.001; rounded to 2 decimals: 0.025)"
    )
    # 0 decimals (every value 0 or 1) is no rounding to accept: two options at 1
    ones = choice_answer(FIVE, {"A": 1, "B": 1, "C": 0, "D": 0, "E": 0}, "A")
    assert (
        ones.status == "invalid"
        and ones.error == "probabilities sum to 2.000000, not 1 (tolerance 0.001)"
    )
    # unrounded floats
    assert (
        choice_answer(FIVE, {"A": 0.2071, "B": 0.2, "C": 0.2, "D": 0.2, "E": 0.2071}, "A").status
        == "invalid"
    )


def test_decimals_are_decided_robustly_for_floats_that_are_not_exact():
    assert decimals([0.07, 0.29, 0.57, 0.07]) == 2  # none of them is exactly k/100 as a float
    assert decimals([0.1 + 0.2, 0.7]) == 1  # 0.30000000000000004: within 1e-12 of 0.3
    assert decimals([0.125]) == 3 and decimals([0.1234]) is None and decimals([1.0, 0.0]) == 0
    assert rounded_tolerance(5, 2) == pytest.approx(0.025) and rounded_tolerance(
        26, 3
    ) == pytest.approx(0.013)


@pytest.mark.process
def test_a_gateway_that_rounds_to_two_decimals_is_scored_and_its_rounded_replies_counted(
    data_dir: Path, tmp_path: Path
):
    with serve(
        model="rounding",
        route_factories={"/v1/systemone": "tests.fakes.responders:two_decimal_gateway"},
    ) as server:
        ran = session.run(
            plan.build(
                models=[f"systemone:{server.url}"],
                data_dir=data_dir,
                cache_dir=tmp_path / "c",
                out=tmp_path / "out",
                evals=["hle_multichoice", "when2call"],
            )
        )
        assert ran.exit_code == 0
    answers = pl.read_parquet(tmp_path / "out" / "answers.parquet").filter(
        pl.col("kind") == "choice"
    )
    assert answers.height == 5 and (answers["status"] == "ok").all()  # none invalid
    # the tie made by rounding: scored as the returned choice (the second option)
    second = [r["probabilities"][1]["option"] for r in answers.iter_rows(named=True)]
    assert (
        answers["predicted"].to_list() == second and answers["p_predicted"].to_list() == [0.33] * 5
    )
    # which replies sum outside the ordinary tolerance, computed here from the probabilities
    off = {}
    for r in answers.iter_rows(named=True):
        ps = [p["p"] for p in r["probabilities"]]
        if abs(sum(ps) - 1) > sum_tolerance(len(ps)):
            off[r["eval"]] = off.get(r["eval"], 0) + 1
            assert r["warning"].startswith("rounded: probabilities given to 2 decimals")
        else:
            assert r["warning"] is None
    assert sum(off.values()) > 0
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    evals = summary["models"][0]["evals"]
    assert {e: b["rounded"] for e, b in evals.items() if b.get("rounded")} == off
    assert {e: b["ties"] for e, b in evals.items() if b.get("n")} == {
        "hle_multichoice": 2,
        "when2call": 3,
    }
