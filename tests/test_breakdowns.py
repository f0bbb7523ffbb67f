"""Breakdowns by group, When2Call's confusion matrix, answer statuses and errors, by hand."""

from __future__ import annotations

import polars as pl
import pytest
from scipy.stats import binomtest

from dxi.scoring import Bootstrap, score

from .helpers.answers import choice, frame, yes_no

M = "systemone:m"
W2C = {"A": "tool_call", "B": "direct", "C": "request_for_info", "D": "cannot_answer"}


def test_hle_and_omniscience_groups_by_hand():
    rows = [
        choice(M, "hle_multichoice", "h/1", "A", {"A": 0.9, "B": 0.1}, group="Math"),
        choice(M, "hle_multichoice", "h/2", "A", {"A": 0.2, "B": 0.8}, group="Math"),
        choice(M, "hle_multichoice", "h/3", "B", {"A": 0.2, "B": 0.8}, group="Physics"),
        choice(
            M, "aa_omniscience_decision", "o/1", "A", {"A": 0.1, "E": 0.9}, group="Law"
        ),  # abstains
        choice(
            M, "aa_omniscience_decision", "o/2", "A", {"A": 0.1, "C": 0.9}, group="Law"
        ),  # guesses
        choice(M, "aa_omniscience_decision", "o/3", "A", {"A": 0.9, "C": 0.1}, group="Health"),
    ]
    table = score(frame(rows), Bootstrap(resamples=100)).breakdowns
    got = {
        (r["eval"], r["dimension"], r["group"]): (
            r["n"],
            r["accuracy"],
            r["non_hallucination_rate"],
        )
        for r in table.iter_rows(named=True)
    }
    assert got == {
        ("hle_multichoice", "category", "Math"): (2, 50.0, None),
        ("hle_multichoice", "category", "Physics"): (1, 100.0, None),
        ("aa_omniscience_decision", "domain", "Law"): (2, 0.0, 50.0),
        ("aa_omniscience_decision", "domain", "Health"): (1, 100.0, 100.0),
    }
    physics = table.filter(pl.col("group") == "Physics").row(0, named=True)
    # its one task: the score interval of one trial (Wilson's with continuity correction, scipy's
    # as a test-only reference), not a collapsed [100, 100]
    low = 100 * binomtest(1, 1).proportion_ci(method="wilsoncc").low
    assert (physics["accuracy_low"], physics["accuracy_high"]) == (
        pytest.approx(low, abs=1e-9),
        100.0,
    )
    # a group's non-hallucination rate: the same interval of its share among the group's answers not
    # correct (Law: 1 of 2 an abstention; Health: nothing wrong, nothing known: [0, 100])
    law = table.filter(pl.col("group") == "Law").row(0, named=True)
    ci = binomtest(1, 2).proportion_ci(method="wilsoncc")
    assert (law["non_hallucination_rate_low"], law["non_hallucination_rate_high"]) == (
        pytest.approx(100 * ci.low, abs=1e-9),
        pytest.approx(100 * ci.high, abs=1e-9),
    )
    health = table.filter(pl.col("group") == "Health").row(0, named=True)
    health = (health["non_hallucination_rate_low"], health["non_hallucination_rate_high"])
    assert health == (0.0, 100.0)


def test_wildguard_subcategory_and_adversarial_f1_by_hand():
    rows = []
    # (task, subcategory, adversarial, gold, p_yes) for prompt_harmful
    for task, sub, adv, gold, p in [
        ("g/0", "fraud", True, "yes", 0.9),
        ("g/1", "fraud", False, "yes", 0.2),
        ("g/2", "benign", True, "no", 0.7),
        ("g/3", "benign", False, "no", 0.1),
    ]:
        rows.append(yes_no(M, task, "prompt_harmful", gold, p, group=sub, adversarial=adv))
    table = score(frame(rows)).breakdowns
    f1 = {(r["dimension"], r["group"]): r["f1_prompt_harm"] for r in table.iter_rows(named=True)}
    # fraud: TP + FN -> 2/(2+0+1) ; benign: FP + TN -> 0/(0+1+0) = 0
    # adversarial true: TP + FP -> 2/3 ; false: FN + TN -> 0/(0+0+1) = 0
    assert f1 == {
        ("subcategory", "fraud"): pytest.approx(200 / 3),
        ("subcategory", "benign"): 0.0,
        ("adversarial", "true"): pytest.approx(200 / 3),
        ("adversarial", "false"): 0.0,
    }
    # each group's F1 interval: θ = TP / (TP + FP + FN) over the group's tasks (fraud: 1 of 2),
    # mapped
    boot = score(frame(rows), Bootstrap(resamples=20)).breakdowns
    fraud = boot.filter(pl.col("group") == "fraud").row(0, named=True)
    ci = binomtest(1, 2).proportion_ci(method="wilsoncc")
    assert (fraud["f1_prompt_harm_low"], fraud["f1_prompt_harm_high"]) == (
        pytest.approx(200 * ci.low / (1 + ci.low), abs=1e-9),
        pytest.approx(200 * ci.high / (1 + ci.high), abs=1e-9),
    )


def test_when2call_reply_type_accuracy_and_confusion_matrix():
    rows = [
        choice(
            M, "when2call", "w/1", "A", {"A": 0.9, "B": 0.1}, categories=W2C
        ),  # tool_call -> tool_call
        choice(
            M, "when2call", "w/2", "A", {"A": 0.1, "B": 0.9}, categories=W2C
        ),  # tool_call -> direct
        choice(
            M, "when2call", "w/3", "C", {"C": 0.6, "D": 0.4}, categories=W2C
        ),  # request_for_info ok
        choice(M, "when2call", "w/4", "D", None, status="invalid", error="x", categories=W2C),
    ]  # cannot_answer: invalid
    scored = score(frame(rows))
    acc = {r["group"]: r["accuracy"] for r in scored.breakdowns.iter_rows(named=True)}
    assert acc == {"tool_call": 50.0, "request_for_info": 100.0, "cannot_answer": 0.0}
    cm = {
        (r["gold_category"], r["predicted"]): r["count"]
        for r in scored.confusion.iter_rows(named=True)
    }
    assert len(cm) == 4 * 7 and sum(cm.values()) == 4
    assert (
        cm[("tool_call", "tool_call")],
        cm[("tool_call", "direct")],
        cm[("request_for_info", "request_for_info")],
        cm[("cannot_answer", "invalid")],
        cm[("direct", "direct")],
    ) == (1, 1, 1, 1, 0)


def test_statuses_and_errors_per_evaluation():
    rows = [choice(M, "hle_multichoice", f"h/{i}", "A", {"A": 0.9, "B": 0.1}) for i in range(3)]
    rows += [
        choice(M, "hle_multichoice", "h/3", "A", None, status="invalid", error="not valid JSON"),
        choice(M, "hle_multichoice", "h/4", "A", None, status="invalid", error="not valid JSON"),
        choice(M, "hle_multichoice", "h/5", "A", None, status="failed", error="HTTP 503"),
    ]
    scored = score(frame(rows))
    assert scored.statuses.select("answers", "ok", "invalid", "failed", "missing", "warnings").row(
        0
    ) == (6, 3, 2, 1, 0, 0)
    assert scored.errors.select("status", "error", "count", "example").rows() == [
        ("invalid", "not valid JSON", 2, "h/3"),
        ("failed", "HTTP 503", 1, "h/5"),
    ]


def test_invalid_reasons_differing_only_in_numbers_count_as_one():
    from dxi.scoring.summary import invalid_counts, invalid_reasons

    # one shape, three sums: shown by its most frequent one (1.400000, twice), not the first in
    # text order (a trial met "sum to 1.299700 ... count 745" where 2 answers had that sum)
    ans = pl.DataFrame(
        {
            "label": ["m"] * 6 + ["n"],
            "status": ["invalid"] * 5 + ["ok", "invalid"],
            "error": [
                "probabilities sum to 1.400000, not 1",
                "probabilities sum to 1.366600, not 1",
                "no answer",
                "probabilities sum to 1.400000, not 1",
                "probabilities sum to 1.300000, not 1",
                None,
                "cut off",
            ],
        }
    )
    expected = {
        "m": [
            {"error": "probabilities sum to 1.400000, not 1", "count": 4},
            {"error": "no answer", "count": 1},
        ],
        "n": [{"error": "cut off", "count": 1}],
    }
    assert invalid_reasons(invalid_counts(ans)) == expected
    # counted in two parts (two evaluations scored apart): the same reasons, the same counts and
    # examples
    assert (
        invalid_reasons(pl.concat([invalid_counts(ans.slice(0, 1)), invalid_counts(ans.slice(1))]))
        == expected
    )
