"""``dxi report``: the HTML report and its tables, opened in a real headless browser (Debian's chromium)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson
import polars as pl
import pyarrow.parquet as pq
import pytest

from dxi.cache.schema import SCHEMA
from dxi.runner.cli import main

from .test_cli import MODEL, dxi, run_args

HOSTILE_MODEL = '<script>alert("model")</script>$x$'
HOSTILE_ERROR = "<script>alert(1)</script> & <b>not bold</b>"
TABLES = ("index", "metrics", "calibration", "reliability", "breakdowns", "when2call_confusion", "answer_statuses",
          "errors")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def add_hostile_model(cache_dir: Path) -> None:
    """A second model in the cache (as a server-reported name could be): the embedded model's rows under
    a name holding markup, its When2Call requests failed with an error quoting markup."""
    rows = pl.read_parquet(sorted(cache_dir.glob("shards/*.parquet")))
    w2c = pl.col("eval") == "when2call"
    evil = rows.with_columns(
        pl.lit(HOSTILE_MODEL).alias("model"),
        pl.when(w2c).then(pl.lit("failed")).otherwise(pl.col("status")).alias("status"),
        pl.when(w2c).then(pl.lit(HOSTILE_ERROR)).otherwise(pl.col("error")).alias("error"),
        pl.when(w2c).then(pl.lit("fatal")).otherwise(pl.col("error_kind")).alias("error_kind"),
        pl.when(w2c).then(pl.col("answers").list.head(0)).otherwise(pl.col("answers")).alias("answers"))
    pq.write_table(evil.to_arrow().cast(SCHEMA), cache_dir / "shards" / "hostile.parquet")


def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium package")
        pytest.skip("no chromium on this machine (apt-get install chromium) to open the report in")
    return path


@pytest.fixture
def report(data_dir: Path, tmp_path: Path) -> Path:
    assert dxi(*run_args(data_dir, tmp_path)) == 0
    add_hostile_model(tmp_path / "cache")
    out = tmp_path / "report"
    assert main(["report", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache"), "--out", str(out),
                 "-q"]) == 0
    return out


def test_report_writes_every_table_as_csv_and_parquet(report: Path):
    summary = orjson.loads((report / "summary.json").read_bytes())
    assert [m["model"] for m in summary["models"]] == [f"embedded:{HOSTILE_MODEL}", MODEL]
    assert (report / "answers.parquet").exists()
    for name in TABLES:
        parquet = pl.read_parquet(report / "tables" / f"{name}.parquet")
        csv = pl.read_csv(report / "tables" / f"{name}.csv", schema=parquet.schema)
        assert csv.equals(parquet), name
    metrics = pl.read_parquet(report / "tables" / "metrics.parquet")
    assert metrics.height == 2 * 4 and {"accuracy_low", "accuracy_high", "brier", "ece", "log_loss"} <= set(metrics.columns)
    index = pl.read_parquet(report / "tables" / "index.parquet").filter(pl.col("model") == MODEL).row(0, named=True)
    assert index["decision_index"] == pytest.approx(summary["models"][1]["decision_index"], abs=1e-6)
    statuses = pl.read_parquet(report / "tables" / "answer_statuses.parquet")
    hostile = statuses.filter((pl.col("model") == f"embedded:{HOSTILE_MODEL}") & (pl.col("eval") == "when2call"))
    assert hostile.select("answers", "failed").row(0) == (3, 3)
    errors = pl.read_parquet(report / "tables" / "errors.parquet")
    assert errors.select("status", "error", "count").rows() == [("failed", HOSTILE_ERROR, 3)]


def test_model_output_in_the_report_is_text_not_markup(report: Path):
    html = (report / "report.html").read_text()
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;not bold&lt;/b&gt;" in html
    assert "&lt;script&gt;alert(&#34;model&#34;)&lt;/script&gt;$x$" in html
    assert "Content-Security-Policy" in html and "http://" not in html and "https://" not in html


def test_the_report_opens_in_a_headless_browser_and_shows_its_charts(report: Path, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    url = (report / "report.html").as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems, requests = [], []
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: problems.append(f"dialog: {d.message}"))
            page.goto(url)
            charts = page.eval_on_selector_all(
                "img.chart", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight, e.alt])")
            text = page.inner_text("body")
            title = page.title()
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert problems == [] and requests == [url]
    # the index, one chart per evaluation, one reliability figure per model
    assert len(charts) == 1 + 4 + 2
    assert all(complete and width > 100 and height > 50 for complete, width, height, _ in charts)
    assert HOSTILE_ERROR in text and HOSTILE_MODEL in text  # shown as text
    assert title == "Decision Index report (dxi-prompt-1)"
    assert (tmp_path / "report.png").stat().st_size > 20_000
