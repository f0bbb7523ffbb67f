"""``dxi report`` and ``dxi view`` on the extremes issue 31 names: one question (so every model at
0% or 100% on each evaluation), one model, fifty models. The synthetic cache
(``tests.helpers.synthetic``) goes through the same scoring as ``dxi score``
(``runner.outputs.summarize``); the report is rendered (``report.html.render``) and every page
kind of the view is asked over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dxi import scoring
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION
from dxi.report.html import render
from dxi.runner.outputs.files import summarize
from dxi.view.app import make_app
from dxi.view.data import Browser
from tests.helpers.synthetic import SyntheticSuite, suite, write_cache

ONE = {"aa_omniscience_decision": 1, "hle_multichoice": 1, "when2call": 1, "wildguardtest": 1}


async def _fetch(browser: Browser, paths: list[str]) -> list[tuple[str, int, str]]:
    async with TestClient(TestServer(make_app(browser))) as client:
        out = []
        for path in paths:
            async with client.get(path) as resp:
                out.append((path, resp.status, await resp.text()))
        return out


@pytest.mark.parametrize("models", [1, 2, 50])
def test_report_and_view_work_on_one_question_one_model_and_fifty_models(
    tmp_path: Path, models: int
):
    cache_dir = tmp_path / "cache"
    write_cache(cache_dir, suite(ONE), models, invalid_rate=0.0, failed_rate=0.0)
    with Cache(cache_dir, read_only=True) as cache:
        listed = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
        summary, scored = summarize(cache, SyntheticSuite(ONE), listed, None, 1)
    labels = listed["label"].to_list()
    assert len(labels) == models
    # one question per evaluation: every accuracy is 0 or 100, with an interval of nonzero width
    # holding it, and every model ranked
    for entry in summary.models:
        for name in ("hle_multichoice", "when2call"):
            block = entry.evals[name]
            low, high = block["accuracy_ci"]
            assert (
                block["accuracy"] in (0.0, 100.0)
                and low <= block["accuracy"] <= high
                and low < high
            )
        assert 1 <= entry.rank <= models
    # one question can separate nothing: every model in one tied group, each rank set all the ranks
    assert len(summary.ranking.groups) == 1 and sorted(summary.ranking.groups[0]) == sorted(labels)
    assert all(entry.rank_set == [1, models] for entry in summary.models)
    html = render(summary, scored)
    assert "<html" in html and all(label in html for label in labels)
    browser = Browser.build(
        cache_dir, SyntheticSuite(ONE), listed, summarize, 1, dict.fromkeys(labels), child=False
    )
    try:
        a, b = quote(labels[0]), quote(labels[-1])
        paths = [
            "/",
            "/calibration",
            *[f"/eval/{e}" for e in browser.evals],
            *[
                f"/compare/{e}?a={a}&b={b}"
                for e in ("hle_multichoice", "aa_omniscience_decision")
                if models > 1
            ],
        ]
        for path, status, text in asyncio.run(_fetch(browser, paths)):
            assert status == 200, (path, text[:300])
    finally:
        browser.close()
