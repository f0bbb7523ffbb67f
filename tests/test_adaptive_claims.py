"""What an adaptive run says of a pair it does not claim: which half of the claim failed (docs/
adaptive.md, "The headline intervals are the ones valid after stopping"; ``scoring.stopped_pairs.
said``). A pair with a model whose figures are estimates is ``significant`` only where its
anytime-valid paired interval leaves 0 out (the order on the whole set, ``settled``) AND its
fixed-sample test separates it (the claim beyond the set, ``fixed_sample_significant``); the
terminal's "adjacent" line, the report's matrix and ``dxi view``'s compare page say which held.
Known answers (``tests.helpers.adaptive_models``): under ``--until separated`` on 80 tasks of each
evaluation m40 is asked 79 of them, its whole-set order with m45 and m50 known, but neither pair
separated by the fixed-sample test; under ``--until precision=20`` on 40 tasks m40 − m50 is neither
ordered nor separated, m100 − m50 separated but not ordered."""

from __future__ import annotations

import csv
import html as html_module
from pathlib import Path
from urllib.parse import quote

import pytest

from .fakes.fake_provider import serve
from .helpers.adaptive_models import DATA_ENV, write_data
from .helpers.adaptive_outputs import printed
from .helpers.adaptive_runs import ROUTE, dxi_run, page, summary

FOUR = ("m30", "m40", "m45", "m50")
M30, M40, M45, M50, M100 = (f"systemone:{m}" for m in ("m30", "m40", "m45", "m50", "m100"))


def _run(root: Path, n: int, models: tuple[str, ...], *until: str) -> tuple[Path, Path, dict]:
    data = write_data(root / "data", n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DATA_ENV, str(data))
        with serve(model=None, route_factories=ROUTE, record=False) as served:
            assert (
                dxi_run(served.url, data, root / "cache", root / "out", *until, models=models) == 0
            )
    return data, root / "cache", summary(root / "out")


def _pair(doc: dict, a: str, b: str) -> tuple:
    (c,) = (
        c
        for c in doc["comparisons"]
        if c["metric"] == "decision_index" and (c["a"], c["b"]) == (a, b)
    )
    return (
        round(c["p_adjusted"], 3),
        c["significant"],
        c.get("settled"),
        c.get("fixed_sample_significant"),
        c["claim"],
        c.get("anytime_ci"),
    )


def test_said_names_the_half_that_failed():
    """Each wording from a hand-made comparison; b − a turns the interval round."""
    from dxi.scoring.stopped_pairs import said

    c = {
        "claim": "anytime-valid",
        "significant": False,
        "settled": True,
        "fixed_sample_significant": False,
        "p_adjusted": 0.509,
        "anytime_ci": [0.17, 1.46],
    }
    assert said(c) == (
        "p_adj 0.509; ordered on the whole set (anytime-valid [+0.2, +1.5]), not claimed beyond it"
    )
    assert said(c, turned=True) == (
        "p_adj 0.509; ordered on the whole set (anytime-valid [-1.5, -0.2]), not claimed beyond it"
    )
    holds = c | {"settled": False, "anytime_ci": [-0.4, 1.2], "fixed_sample_significant": True}
    assert said(holds | {"p_adjusted": 0.0004}) == (
        "p_adj < 0.001; not claimed: its anytime-valid interval [-0.4, +1.2] holds 0"
    )
    assert said(holds | {"fixed_sample_significant": False}) == (
        "p_adj 0.509; not claimed: its anytime-valid interval [-0.4, +1.2] holds 0, nor beyond "
        "the set"
    )
    # a row of tables/comparisons: the interval in anytime_low/_high
    row = {k: v for k, v in c.items() if k != "anytime_ci"} | {
        "anytime_low": 0.17,
        "anytime_high": 1.46,
    }
    assert said(row) == said(c)
    metric = {"claim": "not valid after stopping", "significant": False, "p_adjusted": 0.02}
    assert said(metric) == "p_adj 0.020; not claimed: not valid after stopping"
    assert said(c | {"significant": True, "settled": True}) is None
    assert said({"claim": "fixed sample", "significant": False, "p_adjusted": 0.5}) is None


@pytest.mark.slow
def test_a_pair_ordered_on_the_whole_set_but_not_beyond_it_says_so(tmp_path: Path):
    """``--until separated``: m40 (asked 79 of 80) is ordered below m45 and m50 on the whole set by
    its anytime paired intervals, but their fixed-sample p_adj (0.153, 0.108) do not separate
    them: not significant, and every output says that the whole-set half held and the other not
    (before: the terminal "(p_adj 0.153)", the report's cell "p_adj 0.153", the compare page the
    p-values alone, nothing saying why an ordered pair was not claimed)."""
    data, cache, s = _run(tmp_path, 80, FOUR, "--until", "separated")
    assert _pair(s, M40, M45) == (
        0.153,
        False,
        True,
        False,
        "anytime-valid",
        [-6.032068, -3.556301],
    )
    assert _pair(s, M40, M50) == (
        0.108,
        False,
        True,
        False,
        "anytime-valid",
        [-7.109831, -4.634064],
    )
    assert _pair(s, M30, M40) == (0.049, True, True, True, "anytime-valid", [-12.506993, -1.172633])
    assert s["ranking"]["groups"] == [[M50, M45, M40], [M30]]
    text = printed(tmp_path / "out")
    assert (
        "{systemone:m50, systemone:m45, systemone:m40} > {systemone:m30}; adjacent: "
        "systemone:m50 − systemone:m45 +1.1 (p_adj 0.723), systemone:m45 − systemone:m40 +5.6 "
        "(p_adj 0.153; ordered on the whole set (anytime-valid [+3.6, +6.0]), not claimed beyond "
        "it), systemone:m40 − systemone:m30 +7.9 (p_adj 0.049 †)"
    ) in text
    from dxi.runner import rescore
    from dxi.runner.planning.inputs import PlanInputs

    rescore.rescore(
        rescore.select(PlanInputs(data_dir=data, cache_dir=cache, out=tmp_path / "report")),
        html=True,
    )
    report = (tmp_path / "report" / "report.html").read_text()
    # m45's row, m40's column, and the other way round, in place of the p-value
    assert (
        '<span class="ci">p_adj 0.153; ordered on the whole set (anytime-valid [+3.6, +6.0]), '
        "not claimed beyond it</span>" in report
    )
    assert (
        '<span class="ci">p_adj 0.153; ordered on the whole set (anytime-valid [-6.0, -3.6]), '
        "not claimed beyond it</span>" in report
    )
    assert report.count("; ordered on the whole set (anytime-valid [") == 4  # 2 pairs, both ways
    with (tmp_path / "report" / "tables" / "comparisons.csv").open() as f:
        rows = {
            (r["a"], r["b"]): (r["significant"], r["settled"], r["fixed_sample_significant"])
            for r in csv.DictReader(f)
            if r["metric"] == "decision_index"
        }
    assert rows[(M45, M40)] == ("false", "true", "false")
    assert rows[(M40, M30)] == ("true", "true", "true")
    assert rows[(M50, M45)] == ("false", "true", "")  # two exact models: fixed sample
    text = " ".join(
        html_module.unescape(
            page(data, cache, f"/compare/hle_multichoice?a={quote(M45)}&b={quote(M40)}")
        ).split()
    )
    assert (
        "p_adj 0.153; ordered on the whole set (anytime-valid [+3.6, +6.0]), not claimed beyond it"
        in text
    )


@pytest.mark.slow
def test_a_pair_neither_ordered_nor_separated_says_both(tmp_path: Path):
    """``--until precision=20`` on 40 tasks: m50 − m40 +4.6, p_adj 0.474, its anytime interval
    holding 0: both halves failed; m100 − m50's fixed-sample test separates it, its anytime
    interval holds 0 (before: both "not claimed: not valid after stopping")."""
    _, _, s = _run(tmp_path, 40, ("m40", "m50", "m100"), "--until", "precision=20")
    assert _pair(s, M40, M50) == (
        0.474,
        False,
        False,
        False,
        "anytime-valid",
        [-42.979027, 33.583083],
    )
    assert (
        "adjacent: systemone:m100 − systemone:m50 +57.7 (p_adj < 0.001; not claimed: its "
        "anytime-valid interval [-18.6, +79.7] holds 0), systemone:m50 − systemone:m40 +4.6 "
        "(p_adj 0.474; not claimed: its anytime-valid interval [-33.6, +43.0] holds 0, nor beyond "
        "the set)"
    ) in printed(tmp_path / "out")
