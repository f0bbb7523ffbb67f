"""An adaptive run's paired comparisons are claimed only by a test valid after stopping (docs/
adaptive.md, "The headline intervals are the ones valid after stopping"; ``scoring.stopped_pairs``):
a pair with a model whose figures are estimates claims its index difference only where the
anytime-valid paired interval ``--until separated`` decides on leaves 0 out, and none of its
metrics' differences; pairs of two models with exact figures keep their fixed-sample claims. The
three models of ``tests.test_adaptive_outputs`` (known answers, 40 tasks of each evaluation): under
``--until precision=20`` they stop after 7, 20 and 15 tasks of each, under ``precision=4`` m00 after
31 while m50 and m100 are asked all 40."""

from __future__ import annotations

import csv
import html as html_module
from pathlib import Path
from urllib.parse import quote

import pytest

from .fakes.fake_provider import serve
from .helpers.adaptive_models import DATA_ENV, write_data
from .helpers.adaptive_outputs import SMALL, THREE
from .helpers.adaptive_outputs import printed as _printed
from .helpers.adaptive_runs import ROUTE, dxi_run, dxi_score, figures, page, summary

A, B, C = "systemone:m00", "systemone:m50", "systemone:m100"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("adaptive-pairs") / "data", SMALL)


@pytest.fixture
def server(data: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(DATA_ENV, str(data))
    with serve(model=None, route_factories=ROUTE, record=False) as served:
        yield served


def _index_pairs(doc: dict) -> list[tuple]:
    return [
        (c["a"], c["b"], c["significant"], c.get("settled"), c["claim"], c.get("anytime_ci"))
        for c in doc["comparisons"]
        if c["metric"] == "decision_index"
    ]


@pytest.mark.slow
def test_a_pair_with_a_stopped_model_is_claimed_only_by_its_anytime_paired_interval(
    data: Path, server, tmp_path: Path
):
    """``precision=20``: every model stopped early; the fixed-sample p of each index pair is below
    0.001 (all three were † before, m100 − m50 inside the tied group {m100, m50}), but no anytime
    paired interval leaves 0 out: nothing is claimed, and no metric's difference either."""
    cache = tmp_path / "cache"
    assert (
        dxi_run(server.url, data, cache, tmp_path / "out", "--until", "precision=20", models=THREE)
        == 0
    )
    s = summary(tmp_path / "out")
    assert [c["p_adjusted"] < 0.001 for c in s["comparisons"] if c["eval"] is None] == [True] * 3
    assert _index_pairs(s) == [
        (A, B, False, False, "anytime-valid", [-75.920259, 45.815887]),
        (A, C, False, False, "anytime-valid", [-100.0, 24.414675]),
        (B, C, False, False, "anytime-valid", [-79.707031, 18.589996]),
    ]
    metrics = [c for c in s["comparisons"] if c["metric"] != "decision_index"]
    assert len(metrics) == 3 * 8 and {  # 2 + 1 + 1 + 4 metrics a pair
        (c["significant"], c["settled"], c["claim"]) for c in metrics
    } == {(False, False, "not valid after stopping")}
    assert all("anytime_ci" not in c for c in metrics)
    # no pair is claimed, so no group boundary stands (before: {m100, m50} > {m00}, from the
    # fixed-sample claims)
    assert s["ranking"]["groups"] == [[C, B, A]]
    assert [m["tied_group"] for m in s["models"]] == [1, 1, 1]
    assert [m["rank_set"] for m in s["models"]] == [[2, 3], [1, 3], [1, 2]]
    text = _printed(tmp_path / "out")
    assert (
        "Ranked by Decision Index in statistically tied groups (max-T step-down over every pair, "
        "adjusted p < 0.05; an adaptive run's estimates parted only where their anytime-valid "
        "paired intervals and their own intervals part too): "
        "{systemone:m100, systemone:m50, systemone:m00}; adjacent: systemone:m100 − "
        "systemone:m50 +57.7 (p_adj < 0.001; not claimed: its anytime-valid interval "
        "[-18.6, +79.7] holds 0), systemone:m50 − systemone:m00 +42.3 (p_adj < 0.001; not "
        "claimed: its anytime-valid interval [-45.8, +75.9] holds 0)"
    ) in text
    assert "†" not in text
    # `dxi score` of the cache claims the same; its report's matrix and comparisons table say so
    assert dxi_score(server.url, data, cache, tmp_path / "scored", THREE) == 0
    scored = figures(summary(tmp_path / "scored"))
    assert scored["comparisons"] == s["comparisons"]
    assert summary(tmp_path / "scored")["ranking"]["groups"] == [[C, B, A]]
    from dxi.runner import rescore
    from dxi.runner.planning.inputs import PlanInputs

    rescore.rescore(
        rescore.select(PlanInputs(data_dir=data, cache_dir=cache, out=tmp_path / "report")),
        html=True,
    )
    report = (tmp_path / "report" / "report.html").read_text()
    # 3 pairs, both ways: which half failed (the fixed-sample test separates them), in place of p
    cell = '<span class="ci">p_adj &lt; 0.001; not claimed: its anytime-valid interval '
    assert report.count(cell) == 6
    assert (
        '<span class="ci">p_adj &lt; 0.001; not claimed: its anytime-valid interval '
        "[-45.8, +75.9] holds 0</span>" in report
    )
    assert '<span class="ci">p_adj &lt; 0.001; not claimed: not valid' not in report
    assert '"ci">not claimed: bounds overlap' not in report and 'class="sig"' not in report
    with (tmp_path / "report" / "tables" / "comparisons.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["metric"] == "decision_index"]
    assert [
        (
            r["a"],
            r["b"],
            r["significant"],
            r["settled"],
            r["claim"],
            r["anytime_low"],
            r["anytime_high"],
            r["fixed_sample_significant"],
        )
        for r in rows
    ] == [
        (C, B, "false", "false", "anytime-valid", "-18.589996", "79.707031", "true"),
        (C, A, "false", "false", "anytime-valid", "-24.414675", "100.0", "true"),
        (B, A, "false", "false", "anytime-valid", "-45.815887", "75.920259", "true"),
    ]
    # dxi view's compare page: B − A, turned round, not claimed, its anytime interval
    text = " ".join(
        html_module.unescape(
            page(data, cache, f"/compare/hle_multichoice?a={quote(B)}&b={quote(A)}")
        ).split()
    )
    assert "p_adj < 0.001; not claimed: its anytime-valid interval [-45.8, +75.9] holds 0" in text
    assert text.count("not claimed: not valid after stopping") == 1  # HLE's accuracy


@pytest.mark.slow
def test_a_pair_of_exact_models_keeps_its_claim_and_a_stopped_one_is_claimed_where_valid(
    data: Path, server, tmp_path: Path
):
    """``precision=4``: m50 and m100 asked everything (exact), their pair as a run without
    ``--until`` has it (``fixed sample``, no ``settled``); m00's pairs with them are claimed by
    their anytime paired intervals, which leave 0 out."""
    out = tmp_path / "out"
    assert (
        dxi_run(server.url, data, tmp_path / "cache", out, "--until", "precision=4", models=THREE)
        == 0
    )
    s = summary(out)
    assert _index_pairs(s) == [
        (A, B, True, True, "anytime-valid", [-40.9375, -28.316873]),
        (A, C, True, True, "anytime-valid", [-100.0, -82.777471]),
        (B, C, True, None, "fixed sample", None),
    ]
    fixed = [c for c in s["comparisons"] if {c["a"], c["b"]} == {B, C}]
    assert {c["claim"] for c in fixed} == {"fixed sample"} and all(
        "settled" not in c for c in fixed
    )
    assert {
        (c["significant"], c["claim"])
        for c in s["comparisons"]
        if A in (c["a"], c["b"]) and c["metric"] != "decision_index"
    } == {(False, "not valid after stopping")}
    # every pair claimed (by its own rule): every model its own group
    assert s["ranking"]["groups"] == [[C], [B], [A]]
    assert (
        "and their own intervals part too): {systemone:m100} > {systemone:m50} > "
        "{systemone:m00}; adjacent: systemone:m100 − systemone:m50 +59.1 (p_adj < 0.001 †), "
        "systemone:m50 − systemone:m00 +40.9 (p_adj < 0.001 †)"
    ) in _printed(out)
