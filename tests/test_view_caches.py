"""Every ``dxi view`` route answers 200 for any cache (issue 23, item 11): an empty cache, a
one-task cache, a sampled cache and a cache with failed answers, over HTTP and in the real browser
(Debian's chromium); and the evaluation page's layout at 1,280 px (item 12): a long WildGuardTest
subcategory wraps in its column, each row shows the first line of its state, a model select shows a
long model name whole.

Each view is built as ``dxi view`` builds it, given no selection: it shows the tasks the runs
selected."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp.test_utils import TestServer

from dxi.cache import Cache
from dxi.cache.layout import read_nested
from dxi.cache.schema import SCHEMA
from dxi.evals import EVALS
from dxi.runner import session
from dxi.runner.planning import plan
from dxi.scoring.calibration import ECE_BINS
from dxi.view.app import make_app, task_url
from dxi.view.data import Browser

from .conftest import FIXTURES, REAL_DATA, requires_real_data
from .fakes.fake_provider import serve
from .helpers.report import CHROMIUM_FLAGS, chromium
from .helpers.runs import MODEL
from .helpers.view import get, view_of

LONG_CATEGORY = "disseminating_false_or_misleading_information_encouraging_disinformation_campaigns"
LONG_MODEL = "sparrow-nano-general-v1.1-with-a-long-fine-tuned-checkpoint-name-2026-11-30-rc2"


def _data(root: Path) -> Path:
    """The fixture data, WildGuardTest's fraud rows under the longest real subcategory name."""
    for src, dst in (
        ("omniscience.jsonl", "omniscience-standin/omniscience.jsonl"),
        ("hle_split.json", "hle/hle_mcqa.json"),
        ("when2call.jsonl", "when2call/when2call_test_mcq.jsonl"),
    ):
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / src, root / dst)
    rows = orjson.loads((FIXTURES / "wildguardtest.json").read_bytes())
    for r in rows:
        if r["subcategory"] == "fraud_assisting_illegal_activities":
            r["subcategory"] = LONG_CATEGORY
    (root / "wildguardtest").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "wildguardtest" / "wildguardtest.parquet")
    return root


def _copy_model(cache_dir: Path, name: str) -> None:
    """The cache's rows again under another model name (a long one: the selects must show it
    whole), its replies naming it as the model that served them (``dxi.served``)."""
    rows = pl.concat(
        [
            pl.from_arrow(read_nested(p, SCHEMA.names))
            for p in sorted(cache_dir.glob("shards/*.parquet"))
        ]
    )
    pq.write_table(
        rows.with_columns(model=pl.lit(name), served_model=pl.lit(name)).to_arrow().cast(SCHEMA),
        cache_dir / "shards" / "long-name.parquet",
    )


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("caches")
    data = _data(tmp / "data")

    def run(
        cache: str, model: str, **fields
    ) -> int:  # dxi run -q's work (session.run): its exit code
        return session.run(
            plan.build(
                models=[model], data_dir=data, cache_dir=tmp / cache, out=tmp / "out", **fields
            )
        ).exit_code

    Cache(
        tmp / "empty"
    ).close()  # a cache folder with no reply yet (a run stopped before its first)
    assert run("one", MODEL, evals=["hle_multichoice"], limit=1) == 0
    assert run("sampled", MODEL, sample=2) == 0
    _copy_model(tmp / "sampled", LONG_MODEL)
    with serve(
        model="fake-decider", faults={"server_error": 0.4}
    ) as server:  # transient failures, not retried
        assert run("failed", f"systemone:{server.url}", limits={"max_attempts": 1}) == 1
    return {"tmp": tmp, "data": data}


CACHES = ("empty", "one", "sampled", "failed")


def _view(caches: dict, name: str, monkeypatch: pytest.MonkeyPatch) -> Browser:
    return view_of(data_dir=caches["data"], cache_dir=caches["tmp"] / name)


def routes(b: Browser) -> list[str]:
    """Every page of the view: each evaluation's page and comparison (those without answers too),
    the calibration page of each model and a page of each of its bins with answers and of one
    without, the status filters, and every task's page."""
    paths = ["/", "/calibration"]
    for name in EVALS:
        paths += [
            f"/eval/{name}",
            f"/compare/{name}",
            f"/eval/{name}?status=failed",
            f"/eval/{name}?result=wrong",
        ]
    for label in b.labels:
        m = quote(label, safe="")
        paths += [f"/calibration?m={m}", f"/eval/hle_multichoice?m={m}&status=missing&sort=p_gold"]
        bins = b.reliability_bins(label)
        for name in EVALS:
            used = [r["bin"] for r in bins.get(name, [])]
            empty = [i for i in range(ECE_BINS) if i not in used][:1]
            paths += [f"/calibration?m={m}&eval={name}&bin={i}" for i in [*used, *empty]]
    return paths + [task_url(t) for t in b.tasks]


@pytest.mark.process
@pytest.mark.parametrize("name", CACHES)
def test_every_route_answers_200_on_each_cache(
    caches: dict, name: str, monkeypatch: pytest.MonkeyPatch
):
    b = _view(caches, name, monkeypatch)
    try:
        paths = routes(b)
        answered = get(b, *paths)
    finally:
        b.close()
    bad = [(p, s, body[-400:]) for p, (s, _, body) in zip(paths, answered, strict=True) if s != 200]
    assert bad == []
    pages = dict(zip(paths, (body for _, _, body in answered), strict=True))
    expected = {
        "empty": [],
        "one": [MODEL],
        "sampled": [MODEL, f"embedded:{LONG_MODEL}"],
        "failed": ["systemone:fake-decider"],
    }[name]
    assert b.labels == expected
    if name == "empty":
        assert (
            "No model in this view yet" in pages["/calibration"]
            and "No model in this view yet" in pages["/compare/when2call"]
        )
        assert (
            "When2Call: no answers in this view: the cache holds none of this prompt version yet."
            in pages["/eval/when2call"]
        )
    if (
        name == "one"
    ):  # the run selected one HLE task: the view shows it, and says why the others are empty
        assert list(b.tasks) == [next(iter(b.tasks))] and next(iter(b.tasks)).startswith(
            "hle_multichoice/"
        )
        assert (
            "When2Call: no answers in this view: not selected (--evals)."
            in pages["/eval/when2call"]
        )
    if name == "sampled":  # the run's --sample 2 (recorded in the cache), not every task
        assert len(b.tasks) == 8  # 2 of each evaluation
        assert b.summary.data["when2call"]["sample"] == {"tasks": 2, "seed": 0}
    if name == "failed":
        failed = sum(e.get("failed", 0) for m in b.summary.models for e in m.evals.values())
        assert failed > 0 and "failed" in pages["/eval/hle_multichoice?status=failed"]


@pytest.mark.slow
@requires_real_data
def test_the_calibration_page_of_a_run_of_ten_tasks_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The report's case: ``dxi run --limit 10`` of the embedded model, then
    ``dxi view --limit 10``: a yes/no question whose ten answers are all of one class has no AUROC,
    and the page said 500."""
    common = {"data_dir": REAL_DATA, "cache_dir": tmp_path / "cache", "limit": 10}
    assert session.run(plan.build(models=[MODEL], out=tmp_path / "out", **common)).exit_code == 0
    b = view_of(**common)
    try:
        [(status, _, body)] = get(b, f"/calibration?m={quote(MODEL)}")
    finally:
        b.close()
    assert status == 200 and "AUROC" in body


@pytest.mark.server
@pytest.mark.process
def test_every_route_in_the_browser_and_the_evaluation_page_at_1280_px(
    caches: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Every route of every cache in headless chromium: 200, no script error; then WildGuardTest's
    page of the sampled cache at 1,280 px: the long subcategory wraps inside its column (nothing
    drawn over the gold and model columns), each row shows its state's first line, and the model
    selects are wide enough for the longest name (a screenshot is kept in $DXI_VIEW_SHOTS, else the
    test's folder)."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    shots = Path(os.environ.get("DXI_VIEW_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    browsers = {name: _view(caches, name, monkeypatch) for name in CACHES}

    async def walk() -> dict:
        servers = {name: TestServer(make_app(b), host="127.0.0.1") for name, b in browsers.items()}
        for s in servers.values():
            await s.start_server()
        try:
            bases = {name: str(s.make_url("/")).rstrip("/") for name, s in servers.items()}
            return await asyncio.to_thread(_walk, bases)
        finally:
            for s in servers.values():
                await s.close()

    def _walk(bases: dict[str, str]) -> dict:
        seen: dict = {"statuses": [], "problems": []}
        with sync_playwright() as p:
            chrome = p.chromium.launch(
                executable_path=executable, args=["--headless", *CHROMIUM_FLAGS]
            )
            try:
                page = chrome.new_page(viewport={"width": 1280, "height": 900})
                page.on(
                    "console",
                    lambda m: (
                        seen["problems"].append(m.text) if m.type in ("error", "warning") else None
                    ),
                )
                page.on("pageerror", lambda e: seen["problems"].append(str(e)))
                for name, base in bases.items():
                    for path in routes(browsers[name]):
                        seen["statuses"].append((name, path, page.goto(base + path).status))
                page.goto(bases["sampled"] + "/eval/wildguardtest?sort=category&desc=1")
                page.screenshot(path=str(shots / "evaluation-wildguardtest.png"), full_page=True)
                seen["rows"] = page.eval_on_selector_all(
                    "table.questions tbody tr",
                    """rows => rows.map(r => {
                    const cat = r.querySelector('td.cat'), next = cat.nextElementSibling;
                    const range = document.createRange();
                    range.selectNodeContents(cat);
                    const lines = new Set([...range.getClientRects()].map(x => Math.round(x.top))).size;
                    return {text: cat.innerText, overflow: cat.scrollWidth - cat.clientWidth, lines: lines,
                            right: cat.getBoundingClientRect().right, next: next.getBoundingClientRect().left,
                            state: r.querySelector('td.headline').innerText,
                            task: r.querySelector('td.task a').getAttribute('href')}; })""",
                )
                seen["selects"] = page.eval_on_selector_all(
                    "form.filters select[name=m], form.filters select[name=a]",
                    """els => els.map(s => {
                    const ctx = document.createElement('canvas').getContext('2d');
                    ctx.font = getComputedStyle(s).font;
                    const text = Math.max(...[...s.options].map(o => ctx.measureText(o.text).width));
                    return {width: s.clientWidth, text: text}; })""",
                )
            finally:
                chrome.close()
        return seen

    try:
        seen = asyncio.run(walk())
    finally:
        for b in browsers.values():
            b.close()
    assert [s for s in seen["statuses"] if s[2] != 200] == [] and len(seen["statuses"]) > 100
    assert seen["problems"] == []
    rows = seen["rows"]
    long_rows = [r for r in rows if r["text"] == LONG_CATEGORY]
    assert long_rows and len(long_rows) < len(rows)
    for r in rows:  # nothing runs over the next column
        assert r["overflow"] <= 0 and r["right"] <= r["next"] + 0.5, r
    assert all(r["lines"] >= 3 for r in long_rows) and all(
        r["lines"] == 1 for r in rows if r not in long_rows
    )
    tasks = browsers["sampled"].tasks
    for (
        r
    ) in rows:  # the state's first line (here the user's prompt), cut by the page where it is long
        task = tasks[r["task"].removeprefix("/task/")]
        assert r["state"] and task.headline.startswith(r["state"].rstrip("…")), (
            r["state"],
            task.headline,
        )
        assert task.headline.startswith("User: ")
    # each model select shows the longest name whole (its width holds the text, plus its arrow)
    assert len(seen["selects"]) == 2 and all(s["width"] >= s["text"] for s in seen["selects"]), (
        seen["selects"]
    )


@pytest.mark.slow
def test_a_view_of_an_empty_cache_fills_in_with_the_tasks_the_run_selects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Started before the run: no model, every task; rebuilt once a `--sample 2` run has written (as
    ``view.live`` rebuilds it), the run's model over the run's sample."""
    data, cache = _data(tmp_path / "data"), tmp_path / "cache"
    Cache(cache).close()
    b = view_of(data_dir=data, cache_dir=cache)
    try:
        assert b.labels == [] and len(b.tasks) == 4 + 2 + 3 + 3
        ran = session.run(
            plan.build(
                models=[MODEL], sample=2, data_dir=data, cache_dir=cache, out=tmp_path / "out"
            )
        )
        assert ran.exit_code == 0
        new = b.rebuild(child=False)
        try:
            assert new.labels == [MODEL] and len(new.tasks) == 8
            ran = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
            assert [m.evals for m in new.summary.models] == [m["evals"] for m in ran["models"]]
        finally:
            # its snapshot; the private folder goes with the first snapshot's close
            new.workdir.cleanup()
    finally:
        b.close()
