"""Provisional figures (SPEC §6, ``scoring.bounds``): computed over the answered questions, with
bounds that are the exact extremes over every outcome of the failed and missing answers (checked by
brute-force enumeration), and comparisons that claim nothing those answers could overturn."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

from dxi.scoring import Bootstrap, records, score
from dxi.scoring.bounds import f1_bounds, mean_f1_bounds, settle_ranks, settled
from dxi.scoring.pipeline import metrics
from dxi.scoring.summary import build

from .helpers.answers import choice, yes_no
from .helpers.answers import frame as answers

OMNI, WILDGUARD = "aa_omniscience_decision", "wildguardtest"
QUESTIONS = ("prompt_harmful", "response_refusal", "response_harmful")
METRICS = {
    OMNI: ("accuracy", "non_hallucination_rate"),
    "hle_multichoice": ("accuracy",),
    WILDGUARD: ("f1_prompt_harm", "f1_response_refusal", "f1_response_harm", "mean_f1"),
}
DATA = {name: {"files": []} for name in (OMNI, "hle_multichoice", "when2call", WILDGUARD)}


def omni(
    label: str, task: int, gold: str, pick: str | None, status: str = "ok", sample: int = 0
) -> dict:
    return choice(
        label,
        OMNI,
        f"o/{task:03d}",
        gold,
        {pick: 1.0} if pick else None,
        status=status,
        sample=sample,
    )


def table_row(rows: list[dict], name: str) -> dict:
    return metrics(answers(rows)).filter(pl.col("eval") == name).row(0, named=True)


def test_58_of_60_missing_shows_0_over_the_2_answered_with_bounds():
    # the case: 2 answers, both wrong picks (hallucinations), 58 missing. Before, 98.3
    # (58 missing counted as not correct and not hallucinated: 1 − 1/60); now 0 over the 2 answered
    rows = [omni("m", i, "A", "B") for i in range(2)] + [
        omni("m", i, "A", None, "missing") for i in range(2, 60)
    ]
    row = table_row(rows, OMNI)
    assert (row["accuracy"], row["non_hallucination_rate"]) == (0.0, 0.0)
    assert (row["accuracy_lowest"], row["accuracy_highest"]) == (0.0, pytest.approx(100 * 58 / 60))
    # lowest: every missing answer a wrong pick (60 of 60 hallucinated); highest: every one "I don't
    # know"
    # (2 hallucinated of 60 wrong: 100 · 58/60)
    assert row["non_hallucination_rate_lowest"] == 0.0
    assert row["non_hallucination_rate_highest"] == pytest.approx(100 * 58 / 60)
    entry = records.to_builtins(build(metrics(answers(rows)), ["m"], DATA, "p", 1, {}).models[0])
    block = entry["evals"][OMNI]
    assert (block["non_hallucination_rate"], block["non_hallucination_rate_bounds"]) == (
        0.0,
        [0.0, 96.666667],
    )
    assert block["complete"] is False and "non_hallucination_rate_bounds" in block


def test_half_failed_shows_the_answered_figure_and_hand_computed_bounds():
    # 10 Omniscience questions: 5 answered (3 right, 1 "I don't know", 1 wrong pick), 5 failed.
    # Over the 5 answered: accuracy 60, non-hallucination 1 − 1/2 = 50.
    # Bounds: accuracy [3/10, 8/10]; non-hallucination lowest 1 − (1 + 5)/(2 + 5) = 14.29 (every
    # failed
    # one a wrong pick), highest 1 − 1/(2 + 5) = 85.71 (every one "I don't know")
    rows = [
        omni("m", 0, "A", "A"),
        omni("m", 1, "B", "B"),
        omni("m", 2, "C", "C"),
        omni("m", 3, "A", "E"),
        omni("m", 4, "A", "D"),
    ] + [omni("m", i, "A", None, "failed") for i in range(5, 10)]
    row = table_row(rows, OMNI)
    assert (row["n"], row["failed"], row["accuracy"], row["non_hallucination_rate"]) == (
        10,
        5,
        60.0,
        50.0,
    )
    assert (row["accuracy_lowest"], row["accuracy_highest"]) == (30.0, 80.0)
    assert row["non_hallucination_rate_lowest"] == pytest.approx(100 * (1 - 6 / 7))
    assert row["non_hallucination_rate_highest"] == pytest.approx(100 * (1 - 1 / 7))
    # the figure is the one its answered questions give: the failed answers left out entirely
    answered = table_row(rows[:5], OMNI)
    assert (answered["accuracy"], answered["non_hallucination_rate"]) == (60.0, 50.0)
    assert answered["accuracy_lowest"] is None  # complete: no bounds


def test_a_mixed_model_is_never_flattered_by_its_failures():
    # the mixed case in small: failures used to raise non-hallucination (not correct, never
    # hallucinated). 4 answered: 1 right, 3 wrong picks -> non-hallucination 0; 6 failed
    rows = [omni("m", 0, "A", "A")] + [omni("m", i, "A", "B") for i in range(1, 4)]
    rows += [omni("m", i, "A", None, "failed") for i in range(4, 10)]
    row = table_row(rows, OMNI)
    assert (
        row["non_hallucination_rate"] == table_row(rows[:4], OMNI)["non_hallucination_rate"] == 0.0
    )
    assert row["accuracy"] == 25.0


def _completions(rows: list[dict], options: dict[str, tuple[str, ...]]):
    """Every way the open (failed or missing) answers of ``rows`` could have turned out: each open
    answer replaced by an ok answer picking one of ``options[its eval]`` (yes/no: "yes", "no")."""
    open_at = [i for i, r in enumerate(rows) if r["status"] in ("failed", "missing")]
    picks = [options[rows[i]["eval"]] for i in open_at]
    for combo in itertools.product(*picks):
        done = list(rows)
        for i, pick in zip(open_at, combo, strict=True):
            r = rows[i]
            if r["eval"] == WILDGUARD:
                done[i] = yes_no(
                    r["label"],
                    r["task_id"],
                    r["question_id"],
                    r["gold"],
                    1.0 if pick == "yes" else 0.0,
                    sample=r["sample"],
                )
            else:
                done[i] = choice(
                    r["label"], r["eval"], r["task_id"], r["gold"], {pick: 1.0}, sample=r["sample"]
                )
        yield done


def _check_against_enumeration(
    rows: list[dict], name: str, options: dict[str, tuple[str, ...]]
) -> dict:
    """Asserts that the bounds of every metric of ``name`` are the min and max over every completion
    and that the figure (over the answered questions) lies within them; returns the provisional
    row."""
    row = table_row(rows, name)
    seen: dict[str, list[float]] = {m: [] for m in METRICS[name]}
    for done in _completions(rows, options):
        complete = table_row(done, name)
        for m in METRICS[name]:
            if complete[m] is not None:
                seen[m].append(complete[m])
    for m in METRICS[name]:
        assert row[f"{m}_lowest"] == pytest.approx(min(seen[m])), m
        assert row[f"{m}_highest"] == pytest.approx(max(seen[m])), m
        if row[m] is not None:
            assert row[f"{m}_lowest"] - 1e-9 <= row[m] <= row[f"{m}_highest"] + 1e-9, m
    return row


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_omniscience_bounds_are_the_extremes_over_every_completion(seed: int):
    # gold A everywhere; each open answer right (A), a wrong pick (B) or "I don't know" (E): 3^k
    # completions, k <= 5; the replies are right, wrong picks, abstentions or invalid
    rng = np.random.default_rng(seed)
    rows, n_open = [], 0
    for i in range(int(rng.integers(4, 9))):
        status = ("ok", "ok", "invalid", "failed", "missing")[rng.integers(5)]
        if status in ("failed", "missing") and n_open == 5:
            status = "ok"
        n_open += status in ("failed", "missing")
        rows.append(omni("m", i, "A", "ABCDE"[rng.integers(5)] if status == "ok" else None, status))
    if n_open == 0:
        rows.append(omni("m", 99, "A", None, "failed"))
    if n_open == len(rows):
        rows.append(omni("m", 98, "A", "C"))
    _check_against_enumeration(rows, OMNI, {OMNI: ("A", "B", "E")})


@pytest.mark.parametrize("seed", range(8))
def test_f1_and_mean_f1_bounds_are_the_extremes_over_every_completion(seed: int):
    # small WildGuardTest frames with 1-6 open yes/no answers (2^k completions), some questions
    # without
    # any positive gold label (their F1 can be undefined: mean F1 is then over the others)
    rng = np.random.default_rng(100 + seed)
    rows, n_open = [], 0
    no_positives = QUESTIONS[seed % 3] if seed % 2 else None
    for t in range(int(rng.integers(2, 5))):
        for q in QUESTIONS:
            gold = "no" if q == no_positives else ("yes", "no")[rng.integers(2)]
            status = ("ok", "ok", "ok", "invalid", "failed")[rng.integers(5)]
            if status == "failed" and n_open >= 6:
                status = "ok"
            n_open += status == "failed"
            rows.append(
                yes_no(
                    "m",
                    f"g/{t}",
                    q,
                    gold,
                    float(rng.integers(2)) if status == "ok" else None,
                    status=status,
                )
            )
    if n_open == 0:
        rows[0] = yes_no(
            "m", rows[0]["task_id"], rows[0]["question_id"], rows[0]["gold"], None, status="missing"
        )
    _check_against_enumeration(rows, WILDGUARD, {WILDGUARD: ("yes", "no")})


def test_bounds_with_two_epochs_are_the_extremes_over_every_completion():
    # the figure is the mean over epochs; each epoch's open answers are its own
    rows = [
        omni("m", 0, "A", "A", sample=0),
        omni("m", 1, "A", "B", sample=0),
        omni("m", 2, "A", None, "failed", sample=0),
        omni("m", 0, "A", "E", sample=1),
        omni("m", 1, "A", None, "missing", sample=1),
        omni("m", 2, "A", None, "missing", sample=1),
    ]
    row = _check_against_enumeration(rows, OMNI, {OMNI: ("A", "B", "E")})
    # epoch 0: 1 of 2 answered right (50), epoch 1: 0 of 1 (0): mean 25; bounds ([1/3, 2/3] + [0,
    # 2/3]) / 2
    assert row["accuracy"] == 25.0
    assert (row["accuracy_lowest"], row["accuracy_highest"]) == (
        pytest.approx(100 / 6),
        pytest.approx(200 / 3),
    )


def test_f1_bounds_by_hand():
    # TP 1, FP 1, FN 0 answered; 2 open with gold yes, 1 with gold no: lowest 2/(2 + 1 + 1 + 2) =
    # 33.3,
    # highest 2·3/(2·3 + 1) = 85.7
    low, high, undefined = f1_bounds(
        np.array(1.0), np.array(1.0), np.array(0.0), np.array(2.0), np.array(1.0)
    )
    assert (float(low), float(high), bool(undefined)) == (
        pytest.approx(100 / 3),
        pytest.approx(600 / 7),
        False,
    )
    # no positive anywhere and no FP reply: undefined (every open answer "no") or 0
    low, high, undefined = f1_bounds(
        np.array(0.0), np.array(0.0), np.array(0.0), np.array(0.0), np.array(2.0)
    )
    assert (float(low), float(high), bool(undefined)) == (0.0, 0.0, True)
    # the mean of the defined F1s: [80, 90], [50, 60] and one that is 0 or undefined -> lowest (80 +
    # 50 + 0) / 3,
    # highest (90 + 60) / 2
    lowest, highest = mean_f1_bounds(
        np.array([80.0, 50.0, 0.0]), np.array([90.0, 60.0, 0.0]), np.array([False, False, True])
    )
    assert (float(lowest), float(highest)) == (pytest.approx(130 / 3), 75.0)


def _two_models(open_b: int, right_b: int) -> pl.DataFrame:
    """Model a answers 40 HLE questions, 36 right; model b answers 40 − ``open_b`` of them,
    ``right_b`` right, the others missing."""
    rows = [
        choice("a", "hle_multichoice", f"h/{i:02d}", "A", {"A" if i < 36 else "B": 1.0})
        for i in range(40)
    ]
    for i in range(40):
        if i < 40 - open_b:
            rows.append(
                choice(
                    "b", "hle_multichoice", f"h/{i:02d}", "A", {"A" if i < right_b else "B": 1.0}
                )
            )
        else:
            rows.append(choice("b", "hle_multichoice", f"h/{i:02d}", "A", None, status="missing"))
    return answers(rows)


def test_a_difference_the_missing_answers_could_overturn_is_not_claimed():
    # b: 2 answered, both wrong, 38 missing -> accuracy 0 over its answered (bounds [0, 95]): the
    # difference
    # from a's 90 is large and its bootstrap p small, but b could be at 95: not settled, not claimed
    scored = score(_two_models(38, 0), Bootstrap(resamples=200), with_comparisons=True)
    row = scored.comparisons.filter(pl.col("metric") == "accuracy").row(0, named=True)
    assert (row["difference"], row["complete"], row["settled"]) == (90.0, False, False)
    # the exact test's worst case stops the claim too: b's 38 open answers could balance a's 34 sure
    # discordant ones (issue 31, item 5; ``compare.worst_mcnemar``); the bootstrap p alone is small
    assert row["mcnemar_p"] == 1.0 and row["p_adjusted"] == 1.0 and row["significant"] is False
    summary = records.to_builtins(build(scored.metrics, ["a", "b"], DATA, "p", 1, {}, scored))
    (entry,) = [c for c in summary["comparisons"] if c["metric"] == "accuracy"]
    assert (entry["settled"], entry["significant"]) == (False, False)
    # b: 36 answered, all wrong, 4 missing -> bounds [0, 10]: below a's 90 whatever they are:
    # settled
    scored = score(_two_models(4, 0), Bootstrap(resamples=200), with_comparisons=True)
    row = scored.comparisons.filter(pl.col("metric") == "accuracy").row(0, named=True)
    assert (row["complete"], row["settled"]) == (False, True)
    # complete figures: no ``settled`` key in summary.json, the column true
    scored = score(_two_models(0, 0), Bootstrap(resamples=200), with_comparisons=True)
    summary = records.to_builtins(build(scored.metrics, ["a", "b"], DATA, "p", 1, {}, scored))
    assert all("settled" not in c for c in summary["comparisons"])


def test_a_provisional_pair_s_accuracy_interval_is_around_its_difference():
    """b answers 20 of 40 questions, every one right (100 over its answered), 20 missing; a is right
    on 36 (90): the difference is −10. The 2×2 table counts b's missing answers not right (a only
    16, b only 0: +40 points): Newcombe's interval from it, [+22.0, +54.5], did not contain −10 (a
    trial met it: "difference −1.25, ci [7.6, 13.2]"). The pair takes the bootstrap interval around
    its difference (with the MOVER hull of the two accuracies' own intervals); McNemar's p stays at
    its worst over the open answers."""
    rows = _two_models(20, 20)
    scored = score(rows, Bootstrap(resamples=200), with_comparisons=True)
    row = scored.comparisons.filter(pl.col("metric") == "accuracy").row(0, named=True)
    assert (row["difference"], row["complete"], row["a_only"], row["b_only"]) == (
        -10.0,
        False,
        16,
        0,
    )
    assert row["low"] <= -10.0 <= row["high"]
    assert row["interval"] == "symmetric bootstrap and MOVER hull"
    assert row["mcnemar_p"] == 1.0  # 16 sure against 20 open that could join b's side
    # complete, the same table gives Newcombe's hull
    complete = score(_two_models(0, 20), Bootstrap(resamples=200), with_comparisons=True)
    row = complete.comparisons.filter(pl.col("metric") == "accuracy").row(0, named=True)
    assert row["interval"].startswith("Newcombe") and row["low"] <= row["difference"] <= row["high"]


def test_settled_and_ranks_by_hand():
    assert settled(
        np.array([50.0]), np.array([60.0]), np.array([61.0]), np.array([61.0])
    ).tolist() == [True]
    assert settled(
        np.array([50.0]), np.array([60.0]), np.array([60.0]), np.array([70.0])
    ).tolist() == [False]
    # three models by index 80 (complete), 70 (provisional, [40, 85]), 20 (complete): y could be
    # first (85 > 80) but never last (40 > 20); the marginal intervals and the rank sets widen alike
    ranks = pl.DataFrame(
        {
            "label": ["x", "y", "z"],
            "rank": [1, 2, 3],
            "rank_low": [1, 2, 3],
            "rank_high": [1, 2, 3],
            "rank_set_low": [1, 2, 3],
            "rank_set_high": [1, 3, 3],
            "group": [1, 2, 3],
        }
    )
    bounds = (np.array([80.0, 40.0, 20.0]), np.array([80.0, 85.0, 20.0]))
    out = settle_ranks(ranks, ["x", "y", "z"], bounds)
    assert out["group"].to_list() == [1, 2, 3]  # groups follow the claimed comparisons, not this
    assert list(zip(out["rank_low"], out["rank_high"], strict=True)) == [(1, 2), (1, 2), (3, 3)]
    assert list(zip(out["rank_set_low"], out["rank_set_high"], strict=True)) == [
        (1, 2),
        (1, 3),
        (3, 3),
    ]
    # every index complete: unchanged
    assert settle_ranks(ranks, ["x", "y", "z"], (bounds[0], bounds[0])).equals(ranks)


def test_the_reports_matrix_marks_no_pair_the_open_answers_could_overturn():
    # two pairs significant by their p-values; the second's figures have overlapping bounds (settled
    # false): only the first is bold †, the second says it is not claimed
    from types import SimpleNamespace

    from dxi.report.html import _pairs

    models = [
        SimpleNamespace(model=m, decision_index=v)
        for m, v in (("x", 80.0), ("y", 60.0), ("z", 50.0))
    ]
    summary = SimpleNamespace(models=models, intervals={"confidence": 0.95})
    table = pl.DataFrame(
        {
            "a": ["x", "y", "x"],
            "b": ["y", "z", "z"],
            "metric": ["decision_index"] * 3,
            "difference": [20.0, 10.0, 30.0],
            "low": [15.0, 5.0, 25.0],
            "high": [25.0, 15.0, 35.0],
            "p_adjusted": [0.001, 0.001, 0.5],
            "significant": [True, False, False],  # y - z: not settled, so not significant
            "settled": [True, False, True],
        }
    )
    pairs = _pairs(summary, SimpleNamespace(comparisons=table), ["x", "y", "z"])
    cells = {
        (r["model"], b): c
        for r in pairs["rows"]
        for b, c in zip(pairs["models"], r["cells"], strict=True)
    }
    # ``open`` says why a difference is not claimed: "bounds" (open answers), None where nothing
    # keeps it from being claimed
    assert (cells[("x", "y")]["sig"], cells[("x", "y")]["open"]) == (True, None)
    assert (cells[("y", "z")]["sig"], cells[("y", "z")]["open"]) == (False, "bounds")
    assert (cells[("z", "y")]["sig"], cells[("z", "y")]["open"]) == (False, "bounds")
    assert (cells[("x", "z")]["sig"], cells[("x", "z")]["open"]) == (False, None)
    assert (pairs["open"], pairs["stopped"]) == (True, False)


def _models(
    failed_hle: dict[str, int], models: int = 4, n: int = 400, step: int = 8
) -> pl.DataFrame:
    """``models`` models on every evaluation, model k right on the first n − step·k tasks (index 2
    points apart, all one way; each its own group when complete); ``failed_hle`` label -> how many
    of its first HLE answers (all right ones) failed instead."""
    rows = []
    for k in range(models):
        label = f"m:{k:02d}"
        right = [i < n - step * k for i in range(n)]
        for name in (OMNI, "hle_multichoice", "when2call"):
            for i, ok in enumerate(right):
                if name == "hle_multichoice" and i < failed_hle.get(label, 0):
                    rows.append(
                        choice(
                            label, name, f"{name}/{i:03d}", "A", None, status="failed", error="x"
                        )
                    )
                else:
                    rows.append(
                        choice(
                            label,
                            name,
                            f"{name}/{i:03d}",
                            "A",
                            {"A": 0.8, "B": 0.2} if ok else {"A": 0.2, "B": 0.8},
                        )
                    )
        for i, ok in enumerate(right):
            gold = "yes" if i % 2 == 0 else "no"
            for q in QUESTIONS:
                rows.append(
                    yes_no(
                        label,
                        f"{WILDGUARD}/{i:03d}",
                        q,
                        gold,
                        0.9 if (gold == "yes") == ok else 0.1,
                    )
                )
    return answers(rows)


def test_tied_groups_merge_where_a_provisional_index_could_overturn_the_difference():
    # complete: four models 2 index points apart, each its own group (tests/test_compare.py)
    complete = score(_models({}), Bootstrap(), with_breakdowns=False, with_comparisons=True)
    assert complete.index.sort("label")["tied_group"].to_list() == [1, 2, 3, 4]
    # m:01's first 40 HLE answers (right ones) failed: its HLE accuracy over the 352 answered of 360
    # is 97.78, its bounds [352/400, 392/400] = [88, 98], so its index could be 0.25 x (97.78 - 88)
    # = 2.44 points lower (below m:02, 2 points under it) and 0.25 x (98 - 97.78) = 0.06 higher
    # (still below m:00, 2 points above it)
    scored = score(_models({"m:01": 40}), Bootstrap(), with_breakdowns=False, with_comparisons=True)
    index = {r["label"]: r for r in scored.index.iter_rows(named=True)}
    one = index["m:01"]
    point = one["decision_index"]
    assert point - one["decision_index_lowest"] == pytest.approx(0.25 * (352 / 3.6 - 88))
    assert one["decision_index_highest"] - point == pytest.approx(0.25 * (98 - 352 / 3.6))
    assert one["decision_index_lowest"] < index["m:02"]["decision_index"] < one["decision_index"]
    assert one["decision_index_highest"] < index["m:00"]["decision_index"]
    pairs = scored.comparisons.filter(pl.col("metric") == "decision_index")
    settled_ = {
        (r["a"], r["b"]): (r["settled"], r["significant"]) for r in pairs.iter_rows(named=True)
    }
    assert settled_[("m:00", "m:01")] == (True, True)  # m:01 below m:00 whatever its failed answers
    assert settled_[("m:01", "m:02")] == (False, False)  # could be overturned: not claimed
    assert settled_[("m:01", "m:03")] == (True, True)  # 0.25 x 9.78 < 4 points: still above m:03
    assert settled_[("m:02", "m:03")] == (True, True)  # complete pairs: settled, separated
    # the groups merge exactly there: m:02 joins m:01's group (its first, m:01, is not claimed above
    # it); m:03 starts the next (m:01 is claimed above it)
    assert [index[f"m:{k:02d}"]["tied_group"] for k in range(4)] == [1, 2, 2, 3]
    # the rank sets widen to what the bounds allow: m:01 could rank 3rd, m:02 2nd
    assert (one["rank_set_low"], one["rank_set_high"]) == (2, 3)
    assert (index["m:02"]["rank_set_low"], index["m:02"]["rank_set_high"]) == (2, 3)
