"""``dxi report``: the HTML report and its tables, opened in a real headless browser (Debian's
chromium)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import orjson
import polars as pl
import pytest

from dxi.report.html import MIN_GROUP_TASKS, banner
from dxi.runner import rescore, session
from dxi.runner.cli import main
from dxi.runner.planning import plan
from dxi.runner.planning.inputs import PlanInputs
from dxi.scoring import records
from dxi.scoring.provisional import span
from dxi.scoring.records import ModelEntry, Summary
from dxi.scoring.summary import signed

from .conftest import fixture_data
from .helpers import records as made
from .helpers.four_models import FourModels, four_models
from .helpers.report import (
    CHROMIUM_FLAGS,
    HOSTILE_ERROR,
    HOSTILE_MODEL,
    add_hostile_model,
    chromium,
)
from .helpers.runs import MODEL, copy_model, fail_rows, run_plan

TABLES = (
    "index",
    "metrics",
    "calibration",
    "reliability",
    "breakdowns",
    "when2call_confusion",
    "answer_statuses",
    "errors",
)


def report_of(data_dir: Path, cache_dir: Path, out: Path) -> rescore.Rescored:
    """``dxi report``'s work as a library call: ``rescore.rescore`` with ``html``."""
    return rescore.rescore(
        rescore.select(PlanInputs(data_dir=data_dir, cache_dir=cache_dir, out=out)), html=True
    )


@pytest.fixture
def report(data_dir: Path, tmp_path: Path) -> Path:
    assert run_plan(data_dir, tmp_path).exit_code == 0
    add_hostile_model(tmp_path / "cache")
    out = tmp_path / "report"
    # the hostile model's failed When2Call answers make the result provisional: exit code 1
    done = report_of(data_dir, tmp_path / "cache", out)
    assert (done.exit_code, done.report) == (1, out / "report.html")
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
    assert metrics.height == 2 * 4 and {
        "accuracy_low",
        "accuracy_high",
        "brier",
        "ece",
        "log_loss",
    } <= set(metrics.columns)
    index = (
        pl.read_parquet(report / "tables" / "index.parquet")
        .filter(pl.col("model") == MODEL)
        .row(0, named=True)
    )
    assert index["decision_index"] == pytest.approx(
        summary["models"][1]["decision_index"], abs=1e-6
    )
    statuses = pl.read_parquet(report / "tables" / "answer_statuses.parquet")
    hostile = statuses.filter(
        (pl.col("model") == f"embedded:{HOSTILE_MODEL}") & (pl.col("eval") == "when2call")
    )
    assert hostile.select("answers", "failed").row(0) == (3, 3)
    errors = pl.read_parquet(report / "tables" / "errors.parquet")
    assert errors.select("status", "error", "count").rows() == [("failed", HOSTILE_ERROR, 3)]


def _outputs(out: Path) -> dict[str, bytes]:
    """Every file in ``out`` (tables/ included) -> its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_ctrl_c_while_the_report_is_written_leaves_the_earlier_outputs_whole_and_alone(
    report: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A third model added to the cache, then `dxi report` stopped by Ctrl-C as it renders
    report.html (the moment a trial met: summary.json, answers.parquet and tables/ were already
    the new scoring's, report.html the old one, showing old figures): every output in the folder
    is the earlier scoring's, byte for byte, and nothing of this one is left beside them."""
    from dxi.report import html as report_html
    from dxi.runner import signals
    from dxi.runner.outputs import staging

    before = _outputs(report)
    assert len(orjson.loads(before["summary.json"])["models"]) == 2
    copy_model(tmp_path / "cache", "copy", "when2call", 1)
    monkeypatch.setattr(staging, "_state", {})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as Python's handler raises it on Ctrl-C

    monkeypatch.setattr(report_html, "render", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report_of(data_dir, tmp_path / "cache", report)
    assert _outputs(report) == before
    assert sorted(p.name for p in report.iterdir()) == [
        "answers.parquet",
        "report.html",
        "summary.json",
        "tables",
    ]
    assert signals.stopped_line() == (
        f"Interrupted (Ctrl-C). {report} is left as it was: none of this scoring's outputs was "
        "written there."
    )


@pytest.mark.parametrize("html", [False, True])
def test_a_ctrl_c_before_anything_is_staged_says_the_folder_is_left_as_it_was(
    report: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, html: bool
):
    """`dxi score` and `dxi report` stopped by Ctrl-C while they read the cache (before staging
    starts: the models to score being found): the folder is as it was, and the line says so (it
    said "Interrupted (Ctrl-C)." alone)."""
    from dxi.runner import signals
    from dxi.runner.outputs import staging

    before = _outputs(report)
    monkeypatch.setattr(staging, "_state", {})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as Python's handler raises it on Ctrl-C

    monkeypatch.setattr(rescore, "models_to_score", interrupted)
    selection = rescore.select(
        PlanInputs(data_dir=data_dir, cache_dir=tmp_path / "cache", out=report)
    )
    with pytest.raises(KeyboardInterrupt):
        rescore.rescore(selection, html=html)
    assert _outputs(report) == before
    assert signals.stopped_line() == (
        f"Interrupted (Ctrl-C). {report} is left as it was: none of this scoring's outputs was "
        "written there."
    )


def test_a_ctrl_c_while_the_outputs_are_put_in_place_is_handled_once_they_all_are(
    report: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The same, the Ctrl-C (a real SIGINT) coming inside the step that puts the new outputs in
    place, once the earlier ones are moved away: it is held until every new one is in place, then
    stops the command; the folder holds the new scoring's outputs, whole (three models in
    summary.json, the report and index.csv), and says so."""
    import signal

    from dxi.runner import signals
    from dxi.runner.outputs import staging

    copy_model(tmp_path / "cache", "copy", "when2call", 1)
    monkeypatch.setattr(staging, "_state", {})
    clear = staging._clear

    def interrupted(out: Path, old: Path) -> list[str]:
        moved = clear(out, old)
        os.kill(os.getpid(), signal.SIGINT)
        return moved

    monkeypatch.setattr(staging, "_clear", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report_of(data_dir, tmp_path / "cache", report)
    summary = orjson.loads((report / "summary.json").read_bytes())
    labels = [m["model"] for m in summary["models"]]
    assert labels == [f"embedded:{HOSTILE_MODEL}", "embedded:copy", MODEL]
    assert "embedded:copy" in (report / "report.html").read_text()
    assert sorted(pl.read_csv(report / "tables" / "index.csv")["model"]) == sorted(labels)
    assert pl.read_parquet(report / "answers.parquet")["model"].unique().sort().to_list() == sorted(
        labels
    )
    assert sorted(p.name for p in report.iterdir()) == [
        "answers.parquet",
        "report.html",
        "summary.json",
        "tables",
    ]
    assert signals.stopped_line() == (
        f"Interrupted (Ctrl-C). {report} holds this scoring's outputs, whole (answers.parquet, "
        "tables/, report.html, summary.json)."
    )


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("how", ["INT", "KILL"])
def test_dxi_report_stopped_while_it_puts_its_outputs_in_place(
    report: Path, data_dir: Path, tmp_path: Path, how: str
):
    """`dxi report` in a process of its own, stopped inside the step that puts its outputs in place
    (the earlier ones moved away, the new ones not yet renamed in: the ``committing`` event). A
    Ctrl-C there is held until every output is in place: exit 130, the line says the folder holds
    this scoring's outputs, whole. A SIGKILL (nothing can hold it) leaves the folder with no
    output at all, never some of each scoring's; the next command settles what the killed one left
    (the earlier outputs moved back: ``tests/test_outputs_commit.py``), then writes its own."""
    import subprocess

    from .conftest import DXI
    from .helpers import events

    copy_model(tmp_path / "cache", "copy", "when2call", 1)
    log = tmp_path / "events.jsonl"
    argv = [DXI, "report", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(
        [*argv, "--out", str(report), "-q"],
        env=events.env(log, "committing:1" + ("/INT" if how == "INT" else "")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    ((_, _, pid, moved),) = events.read(log, "committing")
    assert moved == ["answers.parquet", "tables", "report.html", "summary.json"]
    names = sorted(p.name for p in report.iterdir())
    if how == "INT":
        assert done.returncode == 130
        assert done.stderr.endswith(
            f"Interrupted (Ctrl-C). {report} holds this scoring's outputs, whole "
            "(answers.parquet, tables/, report.html, summary.json).\n"
        )
        assert names == ["answers.parquet", "report.html", "summary.json", "tables"]
        assert len(orjson.loads((report / "summary.json").read_bytes())["models"]) == 3
        assert "embedded:copy" in (report / "report.html").read_text()
        return
    assert (done.returncode, names) == (-9, [f".dxi-staging-{pid}"])
    assert report_of(data_dir, tmp_path / "cache", report).exit_code == 1
    assert sorted(p.name for p in report.iterdir()) == [
        "answers.parquet",
        "report.html",
        "summary.json",
        "tables",
    ]


def test_score_after_a_report_takes_the_report_away_and_says_so(
    report: Path, data_dir: Path, tmp_path: Path
):
    """`dxi score` into a folder holding a report writes summary.json and answers.parquet only: the
    report and its tables, of the earlier scoring, no longer match them and are taken away (before,
    they stayed beside the new summary.json, the old figures in them)."""
    copy_model(tmp_path / "cache", "copy", "when2call", 1)
    done = rescore.rescore(
        rescore.select(PlanInputs(data_dir=data_dir, cache_dir=tmp_path / "cache", out=report))
    )
    assert sorted(p.name for p in report.iterdir()) == ["answers.parquet", "summary.json"]
    assert len(done.summary.models) == 3
    assert (
        f"{report / 'report.html'} and {report / 'tables'} (an earlier scoring's, which "
        "summary.json no longer matches) were removed: `dxi report` writes them for this one"
    ) in done.notes


def test_run_after_a_report_takes_the_report_away_and_says_so(
    report: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """`dxi run` of the embedded model into a folder holding a report, every answer in the cache
    (exit 0), writes summary.json and answers.parquet and takes the report away, as `dxi score`
    does, and says so with its note (the old code: removed them silently)."""
    code = main(
        ["run", "--model", MODEL, "--data-dir", str(data_dir), "--cache-dir"]
        + [str(tmp_path / "cache"), "--out", str(report)]
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert code == 0, printed
    assert sorted(p.name for p in report.iterdir()) == [
        "answers.parquet",
        "run-history.jsonl",
        "summary.json",
    ]
    assert (
        f"note: {report / 'report.html'} and {report / 'tables'} (an earlier scoring's, which "
        "summary.json no longer matches) were removed: `dxi report` writes them for this one"
    ) in printed


def test_model_output_in_the_report_is_text_not_markup(report: Path):
    html = (report / "report.html").read_text()
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;not bold&lt;/b&gt;" in html
    assert "&lt;script&gt;alert(&#34;model&#34;)&lt;/script&gt;$x$" in html
    assert "Content-Security-Policy" in html and "http://" not in html and "https://" not in html


@pytest.mark.server
def test_the_report_opens_in_a_headless_browser_and_shows_its_charts(report: Path, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    url = (report / "report.html").as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems, requests = [], []
            page.on(
                "console",
                lambda m: problems.append(m.text) if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: problems.append(f"dialog: {d.message}"))
            page.goto(url)
            charts = page.eval_on_selector_all(
                "img.chart",
                "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight, e.alt])",
            )
            text = page.inner_text("body")
            title = page.title()
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert problems == [] and requests == [url]
    # the index, one chart per evaluation, one heatmap per breakdown, one reliability figure per
    # model with probabilities and one risk-coverage figure per such model
    breakdowns = (
        pl.read_parquet(report / "tables" / "breakdowns.parquet")
        .select("eval", "dimension")
        .n_unique()
    )
    assert breakdowns == 5 and len(charts) == 1 + 4 + breakdowns + 2 + 2
    assert sum(alt.startswith("Risk–coverage curves of ") for *_, alt in charts) == 2
    assert all(complete and width > 100 and height > 50 for complete, width, height, _ in charts)
    assert HOSTILE_ERROR in text and HOSTILE_MODEL in text  # shown as text
    assert title == "Decision Index report (dxi-prompt-1)"
    assert (tmp_path / "report.png").stat().st_size > 20_000


# ---- a publishable report: four models in a real browser at 1,280 px -----------------------------
@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> FourModels:
    root = tmp_path_factory.mktemp("four")
    return four_models(fixture_data(root / "data"), root)


@pytest.fixture(scope="module")
def four_report(four: FourModels) -> Path:
    """``dxi report`` of the four models, named in the run's order."""
    out = four.cache.parent / "report"
    assert four.rescore(out, html=True, models=four.models).exit_code == 0
    return out


@pytest.mark.server
def test_a_four_model_report_fits_1280_px_and_its_contents_links_resolve(
    four: FourModels, four_report: Path, tmp_path: Path
):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((four_report / "report.html").as_uri())
            index = page.eval_on_selector(
                "table.index",
                "t => { const box = t.parentElement; return "
                "[box.scrollWidth, box.clientWidth, t.getBoundingClientRect().right]; }",
            )
            page_width = page.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            rows = page.eval_on_selector_all(
                "table.index tbody tr", "rs => rs.map(r => r.cells[0].innerText)"
            )
            links = page.eval_on_selector_all(
                "nav.toc a", "as => as.map(a => a.getAttribute('href'))"
            )
            page.screenshot(path=str(tmp_path / "top.png"))
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
            landed = []
            for href in links:
                page.click(f"nav.toc a[href='{href}']")
                page.wait_for_function("h => location.hash === h", arg=href)
                landed.append(
                    page.evaluate(
                        "h => { const e = document.getElementById(h.slice(1)); return e ? "
                        "Math.round(e.getBoundingClientRect().top) : null; }",
                        href,
                    )
                )
                page.evaluate("window.scrollTo(0, 0)")
            banner = page.inner_text(".banner")
        finally:
            browser.close()
    assert index[0] <= index[1] and index[2] <= 1280, f"the index table overflows: {index}"
    assert page_width[0] <= page_width[1], f"the page scrolls sideways: {page_width}"
    assert rows == four.labels  # the run's order
    ids = [
        "data",
        "index",
        "index-pairs",
        "aa_omniscience_decision",
        "aa_omniscience_decision-domain",
        "hle_multichoice",
        "hle_multichoice-category",
        "when2call",
        "when2call-reply_type",
        "when2call-confusion",
        "wildguardtest",
        "wildguardtest-adversarial",
        "wildguardtest-subcategory",
        "calibration",
        "measures",
        "answers",
    ]
    assert sorted(links) == sorted(f"#{i}" for i in ids)
    # every link's target exists and is scrolled to the top of the window (the last ones as far as
    # the page goes)
    assert (
        None not in landed
        and all(top < 900 for top in landed)
        and sum(top <= 20 for top in landed) >= 10
    ), landed
    assert "AA-Omniscience-Decision is a stand-in dataset" in banner
    assert (tmp_path / "top.png").stat().st_size > 20_000 and (
        tmp_path / "report.png"
    ).stat().st_size > 100_000
    if os.environ.get(
        "DXI_REPORT_SCREENSHOTS"
    ):  # to look at them: DXI_REPORT_SCREENSHOTS=DIR pytest -k fits_1280
        keep = Path(os.environ["DXI_REPORT_SCREENSHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        for name in ("top.png", "report.png"):
            shutil.copy(tmp_path / name, keep / f"four-models-1280-{name}")


def _entry(label: str, index: float | None, evals: dict | None = None) -> ModelEntry:
    """A model entry with ``evals`` (default none) and the other fields as a complete run has
    them."""
    return made.entry(label, index, evals=evals or {})


def _summary(data: dict, models: list[ModelEntry]) -> Summary:
    """A complete, accepted summary over ``data`` (evaluation -> data block) with ``models``."""
    return made.summary(models, data)


def _headers(html: str, table_class: str) -> list[list[str]]:
    """The header cells of every table of ``table_class``, as text."""
    import re

    heads = re.findall(
        rf'<table class="{table_class}">\s*<thead><tr>(.*?)</tr></thead>', html, re.S
    )
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<th[^>]*>(.*?)</th>", h, re.S)]
        for h in heads
    ]


def test_every_table_and_chart_has_the_runs_model_order(four: FourModels, four_report: Path):
    html = (four_report / "report.html").read_text()
    breakdowns = _headers(html, "breakdown")
    assert len(breakdowns) == 5  # domain, category, reply type, adversarial, subcategory
    for head in breakdowns:
        assert head[-4:] == four.labels
    # every per-model listing follows the same order: the per-evaluation tables and the status table
    positions = [
        [html.index(f">{label}</td>", start) for label in four.labels]
        for start in (html.index('id="hle_multichoice"'), html.index('id="answers"'))
    ]
    assert all(p == sorted(p) for p in positions)
    assert "Models are in the order they were given" in html
    # and the tables written beside it (comparisons: each pair once, a before b in that order, as
    # summary.json's)
    for name in ("index", "metrics", "calibration", "breakdowns", "answer_statuses"):
        listed = pl.read_csv(four_report / "tables" / f"{name}.csv")["model"]
        # (calibration: the models whose answers carry a probability)
        assert listed.unique(maintain_order=True).to_list() == [
            m for m in four.labels if m in set(listed)
        ], name
    pairs = pl.read_csv(four_report / "tables" / "comparisons.csv").filter(pl.col("eval").is_null())
    assert pairs.select("a", "b").rows() == [
        (a, b) for i, a in enumerate(four.labels) for b in four.labels[i + 1 :]
    ]
    summary = orjson.loads((four_report / "summary.json").read_bytes())
    index = [c for c in summary["comparisons"] if c["metric"] == "decision_index"]
    assert pairs["difference"].round(6).to_list() == [c["difference"] for c in index]
    assert pairs["low"].round(6).to_list() == [c["ci"][0] for c in index]


@pytest.mark.slow
def test_without_a_given_order_models_are_ranked_by_the_index(
    four: FourModels, capsys: pytest.CaptureFixture
):
    summary = _summary(
        {}, [_entry("b", 10.0), _entry("a", None), _entry("c", 30.0), _entry("d", 10.0)]
    )
    assert summary.order(ranked=False) == ["b", "a", "c", "d"]
    assert summary.order(ranked=True) == ["c", "b", "d", "a"]
    out = four.cache.parent / "ranked"
    capsys.readouterr()
    assert main([*four.args("report", "--out", str(out))]) == 0  # the command end to end
    printed = capsys.readouterr().out.splitlines()
    summary = records.decode((out / "summary.json").read_bytes())
    expected = summary.order(ranked=True)
    html = (out / "report.html").read_text()
    assert _headers(html, "breakdown")[0][-4:] == expected
    assert "Models are ordered by Decision Index" in html
    # the terminal's tables and the report's own tables too: one order
    assert expected == [  # 39.0, 29.2 and 29.2 (a tie: by name), 28.5
        "systemone:fake-decider",
        "logprobs:lp-fake",
        "openai:gpt-fake",
        "embedded:sparrow-nano-general-v1.1",
    ]
    rows = [line for line in printed if line.startswith("│ ")][:4]  # the index table's
    assert [row.split("│")[1].strip() for row in rows] == expected
    for name in ("index", "metrics", "answer_statuses"):
        table = pl.read_csv(out / "tables" / f"{name}.csv")
        assert table["model"].unique(maintain_order=True).to_list() == expected, name


def test_the_logprob_models_warnings_say_what_they_are(four: FourModels, four_report: Path):
    html = (four_report / "report.html").read_text()
    statuses = pl.read_parquet(four_report / "tables" / "answer_statuses.parquet")
    lp = statuses.filter(pl.col("model") == four.labels[0]).sort("eval")
    assert (
        lp["warnings"].to_list() == lp["answers"].to_list() == [4, 2, 3, 9]
    )  # every logprob answer is noted
    held = "renormalised over the allowed answers, which held 0.9000 of the first token&#39;s probability"
    assert html.count(f"9: {held}") == 1 and html.count(f"4: {held}") == 1
    assert (
        "logprob decision renormalised over the allowed answers" in html
    )  # the note saying what warnings are


def test_breakdowns_are_one_table_per_breakdown_with_intervals_and_small_groups_marked(
    four_report: Path,
):
    html = (four_report / "report.html").read_text()
    start = html.index('id="aa_omniscience_decision-domain"')
    table = html[start : html.index("</table>", start)]
    # groups as rows (one per metric), models as columns, each cell the score and its interval
    assert table.count('<td class="group" rowspan="2">') == 2  # History, Science
    assert table.count('<td class="metric">accuracy</td>') == 2
    assert table.count('<span class="ci">[') == 2 * 2 * 4
    assert table.count(f'title="fewer than {MIN_GROUP_TASKS} tasks">*</span>') == 2  # 2 tasks each
    assert f"fewer than {MIN_GROUP_TASKS} tasks: the interval is wide" in html
    assert html.count('alt="Heatmap of') == 5


@pytest.mark.slow
def test_the_banner_says_why_the_numbers_are_not_the_full_index(four: FourModels):
    scored = SimpleNamespace(
        statuses=pl.DataFrame(
            {"label": ["m", "m"], "eval": ["hle_multichoice", "when2call"], "answers": [100, 100]}
        )
    )
    full = {"file": "x", "tasks": 100}
    done = {"invalid": 0, "failed": 0, "missing": 0, "complete": True}
    summary = _summary(
        {"hle_multichoice": dict(full), "when2call": dict(full)},
        [_entry("m", None, {"hle_multichoice": {**done, "invalid": 5}, "when2call": dict(done)})],
    )
    assert banner(summary, scored) == []  # 5% invalid is at the threshold, not above it
    summary.models[0].evals["hle_multichoice"]["invalid"] = 6
    assert banner(summary, scored) == [
        "m, HLE-MultiChoice: 6 of 100 answers (6%) are invalid or failed (more than 5%): the "
        "invalid ones are scored as wrong, the failed ones left out."
    ]
    summary.models[0].complete, summary.models[0].within_tolerance = False, False
    summary.models[0].evals["hle_multichoice"] = {
        "invalid": 0,
        "failed": 2,
        "missing": 7,
        "complete": False,
        "rerun": 8,
    }
    summary.complete, summary.accepted = False, False
    assert banner(summary, scored) == [
        "m: provisional (*): 2 failed and 7 missing answer(s) in HLE-MultiChoice, left out: its "
        "figures are over the answered questions; the next `dxi run` with these options asks for 8 "
        "of them again (1 deterministic failure(s) are kept: --retry-failed requests them too).",
        "The result is provisional: rerun to complete it, or accept the failed and missing answers explicitly with "
        "--allow-failed N (answers per model and evaluation) or a fraction of them.",
    ]
    summary.models[0].evals["hle_multichoice"] = dict(done)
    summary.models[0].complete = True
    summary.data["when2call"] = {"missing": "not selected (--evals)"}
    assert banner(summary, scored) == [
        "When2Call is not scored: not selected (--evals). The Decision Index needs all "
        "four evaluations, so it is not computed."
    ]
    summary.data = {"hle_multichoice": {**full, "limit": 10}, "when2call": {**full, "limit": 10}}
    assert banner(summary, scored)[0].startswith(
        "Only the first 10 tasks of each evaluation were scored (--limit)"
    )
    # --sample, as the data block records it: a per-evaluation block with the count and the seed
    for recorded in (
        {"hle_multichoice": {**full, "sample": {"tasks": 20, "seed": 3}}},
        {"hle_multichoice": {**full, "sample": {"n": 20, "seed": 3}}},
    ):
        notes = banner(_summary(recorded, []), scored)
        assert notes == [
            "A sample of the tasks was scored (20 tasks per evaluation, seed 3): not the full index; "
            "intervals are wide."
        ], recorded
    # and in a real report: a --limit run
    out = four.cache.parent / "limited"
    assert four.rescore(out, html=True, limit=1, models=four.models).exit_code == 0
    html = (out / "report.html").read_text()
    assert (
        "These numbers are not the full Decision Index." in html
        and "Only the first 1 tasks" in html
    )


def test_the_report_cites_no_file_outside_the_repository(four_report: Path):
    html = (four_report / "report.html").read_text()
    assert "SPEC" not in html and "README" not in html and "§" not in html
    assert "In AA-Omniscience-Decision an invalid answer is not an abstention" in html


def _eval_table(html: str, name: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header and the rows (by model) of evaluation ``name``'s table, as text."""
    import re

    start = html.index(f'<h2 id="{name}">')
    table = html[html.index("<table>", start) : html.index("</table>", start)]
    text = lambda c: re.sub(r"<span.*?</span>", "", re.sub(r"\s+", " ", c)).strip()  # noqa: E731 (the value, no interval)
    head = [text(c) for c in re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)]
    rows = [
        [text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
        for r in re.findall(r"<tr>(.*?)</tr>", table, re.S)
    ]
    return head, {r[0]: r for r in rows if r}


@pytest.mark.process
def test_the_report_shows_each_models_ties_per_evaluation_as_summary_json_counts_them(
    data_dir: Path, tmp_path: Path
):
    from .fakes.fake_provider import serve

    # "tied": every When2Call question has its 4 options at 0.25 and every P(yes) is 0.5; "decided":
    # no ties
    with (
        serve(model="tied", p_first=0.25, p_yes=0.5) as tied,
        serve(model="decided", p_first=0.7, p_yes=0.9) as decided,
    ):
        ran = session.run(
            plan.build(
                models=[f"systemone:{tied.url}", f"systemone:{decided.url}"],
                data_dir=data_dir,
                cache_dir=tmp_path / "c",
                out=tmp_path / "run",
            )
        )
        assert ran.exit_code == 0
    out = tmp_path / "report"
    summary = records.to_builtins(report_of(data_dir, tmp_path / "c", out).summary)
    assert summary == orjson.loads((out / "summary.json").read_bytes())
    ties = {m["model"]: {e: b["ties"] for e, b in m["evals"].items()} for m in summary["models"]}
    wildguard = (
        pl.read_parquet(out / "answers.parquet").filter(pl.col("eval") == "wildguardtest").height
        // 2
    )
    assert (
        wildguard == 9
    )  # the fixture's 3 agreed rows, 3 questions each: every P(yes) = 0.5 is a tie
    assert ties == {
        "systemone:tied": {
            "aa_omniscience_decision": 0,
            "hle_multichoice": 0,
            "when2call": 3,
            "wildguardtest": wildguard,
        },
        "systemone:decided": {
            "aa_omniscience_decision": 0,
            "hle_multichoice": 0,
            "when2call": 0,
            "wildguardtest": 0,
        },
    }
    html = (out / "report.html").read_text()
    for name in ("aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest"):
        head, rows = _eval_table(html, name)
        at = head.index("ties")
        assert head[at - 3 : at + 2] == ["invalid", "failed", "missing", "ties", "reason"], name
        assert {model: row[at] for model, row in rows.items()} == {
            m: str(t[name]) for m, t in ties.items()
        }, name
    note = "ties: picks decided by a tie of the highest probabilities"
    assert html.count(note) == 2  # under the two evaluations with ties, When2Call and WildGuardTest
    assert (
        html.index('<h2 id="when2call">')
        < html.index(note)
        < html.index('<h2 id="wildguardtest">')
        < html.rindex(note)
    )


def test_the_banner_names_every_evaluation_that_is_not_the_published_set():
    """Issue 32: the banner named only the Omniscience stand-in. When2Call's file of 300 rows (the
    index scores 3,423) and WildGuardTest's 880 agreed rows (the index scores 835) are said there
    too; a selection (--sample, --limit) says so itself, and fewer tasks than published in a file
    that holds them all is the exclusion list's doing, not a difference."""
    from dxi.evals import subset_note

    scored = SimpleNamespace(
        statuses=pl.DataFrame(
            {"label": [], "eval": [], "answers": []},
            schema={"label": pl.String, "eval": pl.String, "answers": pl.Int64},
        )
    )
    data = {
        "aa_omniscience_decision": {
            "tasks": 500,
            "stand_in": True,
            "note": "a TruthfulQA stand-in",
        },
        "hle_multichoice": {"tasks": 513},
        "when2call": {"tasks": 300, "note": subset_note("when2call", 300)},
        "wildguardtest": {"tasks": 880, "subset": "agreed"},
    }
    assert banner(_summary(data, []), scored) == [
        "AA-Omniscience-Decision is a stand-in dataset: a TruthfulQA stand-in",
        "When2Call: The published Decision Index scores 3,423 When2Call tasks; this file holds 300 rows, a subset, so "
        "results are not comparable to published numbers (`dxi data fetch` downloads the full set).",
        "WildGuardTest: 880 tasks scored where the published Decision Index scores 835 (it also leaves out the "
        "questions that consistently trigger model refusals, a list that is not public: give it with --exclude), so "
        "results are not comparable to published numbers.",
    ]
    data["wildguardtest"] = {
        "tasks": 835,
        "subset": "agreed",
        "excluded": 45,
    }  # the exclusion list given
    data["when2call"] = {"tasks": 3423}
    assert banner(_summary(data, []), scored) == [
        "AA-Omniscience-Decision is a stand-in dataset: a TruthfulQA stand-in"
    ]
    data["wildguardtest"] = {
        "tasks": 880,
        "sample": {"tasks": 880, "seed": 0},
    }  # a selection says so itself
    assert not any(n.startswith("WildGuardTest") for n in banner(_summary(data, []), scored))


@pytest.mark.slow
def test_a_provisional_result_has_a_banner_and_its_figures_are_marked(
    data_dir: Path, tmp_path: Path
):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    fail_rows(tmp_path / "cache", "when2call", 2)
    out = tmp_path / "report"
    assert report_of(data_dir, tmp_path / "cache", out).exit_code == 1
    html = (out / "report.html").read_text()
    summary = orjson.loads((out / "summary.json").read_bytes())
    m = summary["models"][0]
    assert "These numbers are not the full Decision Index." in html
    w2c = m["evals"]["when2call"]
    # u-1 and u-2 failed (the first two by task id, whatever order their replies came in): u-3,
    # answered right, is scored alone; the two failed ones wrong or right bound it
    assert (w2c["accuracy"], w2c["accuracy_bounds"]) == (100.0, [33.333333, 100.0])
    spans = [
        f"decision_index {span(m['decision_index_bounds'])}",
        f"When2Call accuracy {span(w2c['accuracy_bounds'])}",
    ]
    assert (
        f"{MODEL}: provisional (*): 2 failed answer(s) in When2Call, left out: its figures are "
        "over the answered questions; whatever those answers turn out to be, they lie within: "
        f"{'; '.join(spans)}; the next `dxi run` with these options asks for 2 of them "
        "again."
    ) in html
    index = html[html.index('<table class="index">') :]
    index = index[: index.index("</table>")]
    # every provisional figure with its bounds under it; a complete one with none
    index_bounds = f'<span class="ci bounds">bounds {span(m["decision_index_bounds"])}</span>'
    w2c_bounds = f'<span class="ci bounds">bounds {span(w2c["accuracy_bounds"])}</span>'
    assert f"<td>{m['decision_index']:.1f}* <span" in index and index_bounds in index
    assert f"<td>{w2c['accuracy']:.1f}* <span" in index and w2c_bounds in index
    assert (
        f"<td>{m['evals']['hle_multichoice']['accuracy']:.1f} <span" in index
    )  # complete: not marked
    assert index.count('class="ci bounds"') == 2
    section = html[html.index('<h2 id="when2call">') : html.index('<h2 id="wildguardtest">')]
    assert w2c_bounds in section


def test_the_rows_failed_are_the_first_by_task_id_whatever_order_the_replies_came_in(
    tmp_path: Path,
):
    """``fail_rows`` (the test above's failures) takes the first rows by task id: replies stored
    u2, u0, u1 (the order they came in, which varies with the load) fail u0 and u1, never the first
    two stored (u2 and u0), so the task left answered, and every figure, is the same at each run."""
    from dxi.cache.layout import read_nested
    from dxi.cache.schema import SCHEMA

    from .helpers.synthetic import suite, write_cache

    u0, u1, u2 = suite({"when2call": 3})
    write_cache(tmp_path, [u2, u0, u1], 1, invalid_rate=0.0, failed_rate=0.0)
    assert fail_rows(tmp_path, "when2call", 2) == ["when2call/u0", "when2call/u1"]
    (shard,) = tmp_path.glob("shards/*.parquet")
    rows = pl.from_arrow(read_nested(shard, SCHEMA.names))
    assert rows.select("task_id", "status").rows() == [
        ("when2call/u2", "ok"),
        ("when2call/u0", "failed"),
        ("when2call/u1", "failed"),
    ]


@pytest.mark.slow
def test_the_rank_of_a_provisional_index_is_marked_as_the_index_is(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """The embedded model and a copy of it with one failed When2Call answer: the copy's index is
    provisional (24.3*), and so is its rank, marked the same way in the terminal and the report;
    the complete model's rank is not. tables/index.csv keeps ranks as numbers, as it keeps the index
    (its provisional index has bounds there)."""
    assert run_plan(data_dir, tmp_path).exit_code == 0
    copy = copy_model(tmp_path / "cache", "copy", "when2call", 1)
    out = tmp_path / "report"
    capsys.readouterr()
    args = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
    assert main(["report", *args, "--out", str(out)]) == 1  # provisional
    printed = capsys.readouterr().out.splitlines()
    rows = [line for line in printed if line.startswith("│ embedded")][:2]
    cells = [[c.strip() for c in row.split("│")[1:5]] for row in rows]  # the index table's
    assert cells == [  # by index, as the report (no order was given)
        [MODEL, "28.5", "[13.1, 59.2]", "1 [1–2]"],  # 1 [1–1] before the marginal rank sets
        [copy, "24.3*", "[10.4, 56.3]", "2* [1–2]"],
    ]
    html = (out / "report.html").read_text()
    index = html[html.index('<table class="index">') :]
    ranks = re.findall(r'<span class="ci">(rank [^<]*)</span>', index[: index.index("</table>")])
    assert ranks == ["rank 1 [1–2], jointly [1–2]", "rank 2* [1–2], jointly [1–2]"]  # by index
    # as text (copied, read aloud, a text browser) a cell reads as the terminal's: a space before
    # its interval, its bounds and its rank, each shown on a line of its own
    row = index[index.index("<tbody>") :].split("</tr>")[1]  # the copy's
    text = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
    assert text == [
        copy,
        "24.3* [10.4, 56.3] bounds [20.1, 28.5] rank 2* [1–2], jointly [1–2]",
        "50.0 [9.2, 90.8]",
        "0.0 [0.0, 80.2]",
        "0.0 [0.0, 80.2]",
        "50.0* [2.7, 97.3] bounds [33.3, 66.7]",  # When2Call, its failed answer
        "22.2 [1.7, 97.7]",
        "0",
        "1",
    ]
    table = pl.read_csv(out / "tables" / "index.csv")
    assert table.select("model", "rank", "decision_index_lowest").rows() == [
        (MODEL, 1, None),
        (copy, 2, pytest.approx(20.13888888888889)),
    ]


@pytest.mark.slow
def test_a_provisional_index_is_placed_by_its_lowest_bound_never_above_its_complete_twin(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """The embedded model (complete, index 28.5) and a copy of it whose first two When2Call answers
    failed, one of them a wrong answer of the model: over the answered questions the copy scores
    36.8*, with bounds [20.1, 36.8] (28.5 complete). It is placed by its lowest bound, 20.1: second,
    below its complete twin, in summary.json's ranks and ranking, the terminal's table and ranking
    line, the report and tables/index.csv; its figure stays 36.8* and its rank interval still
    covers rank 1, which its bounds allow."""
    assert run_plan(data_dir, tmp_path).exit_code == 0
    copy = copy_model(tmp_path / "cache", "copy", "when2call", 2)
    out = tmp_path / "report"
    capsys.readouterr()
    args = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
    assert main(["report", *args, "--out", str(out)]) == 1  # provisional
    printed = capsys.readouterr().out.splitlines()
    rows = [line for line in printed if line.startswith("│ embedded")][:2]
    cells = [[c.strip() for c in row.split("│")[1:5]] for row in rows]
    assert cells == [
        [MODEL, "28.5", "[13.1, 59.2]", "1 [1–2]"],
        [copy, "36.8*", "[12.1, 66.5]", "2* [1–2]"],
    ]
    line = next(line for line in printed if line.startswith("Ranked by Decision Index"))
    assert line.endswith(f"{{{MODEL}, {copy}}}; adjacent: {MODEL} − {copy} -8.3 (p_adj 0.336)")
    summary = orjson.loads((out / "summary.json").read_bytes())
    placed = {m["model"]: (m["rank"], m["rank_ci"], m["rank_set"]) for m in summary["models"]}
    assert placed == {MODEL: (1, [1, 2], [1, 2]), copy: (2, [1, 2], [1, 2])}
    assert summary["ranking"]["groups"] == [[MODEL, copy]]
    assert summary["ranking"]["method"].endswith(
        "; a provisional index is placed, and its rank counted, by its lowest bound (the worst "
        "outcome of its failed and missing answers), not its point value"
    )
    html = (out / "report.html").read_text()
    index = html[html.index('<table class="index">') :]
    index = index[: index.index("</table>")]
    ranks = re.findall(r'<span class="ci">(rank [^<]*)</span>', index)
    assert ranks == ["rank 1 [1–2], jointly [1–2]", "rank 2* [1–2], jointly [1–2]"]
    assert index.index(MODEL) < index.index(copy)
    table = pl.read_csv(out / "tables" / "index.csv")
    assert table.select("model", "rank", "decision_index_lowest").rows() == [
        (MODEL, 1, None),
        (copy, 2, pytest.approx(20.138888888888889)),
    ]
    assert table["decision_index"].to_list() == pytest.approx([28.472222, 36.805556])


@pytest.mark.slow
def test_the_pairwise_matrix_holds_every_pairs_index_difference_and_marks_the_significant_ones(
    four: FourModels,
):
    out = four.cache.parent / "pairs"
    assert four.rescore(out, html=True, models=four.models).exit_code == 0
    html = (out / "report.html").read_text()
    summary = orjson.loads((out / "summary.json").read_bytes())
    start = html.index('<table class="pairs">')
    matrix = html[start : html.index("</table>", start)]
    rows = [r for r in matrix.split("<tr>")[2:]]  # the header row first
    assert len(rows) == 4
    alpha = 1 - summary["intervals"]["confidence"]
    pairs = [c for c in summary["comparisons"] if c["metric"] == "decision_index"]
    assert len(pairs) == 6  # 4 models: every pair once
    assert [(c["a"], c["b"]) for c in pairs] == [
        (x, y) for k, x in enumerate(four.labels) for y in four.labels[k + 1 :]
    ]
    for c in pairs:  # in the summary's order (a before b), as the matrix's rows and columns
        a, b = four.labels.index(c["a"]), four.labels.index(c["b"])
        cells = rows[a].split("<td")[2:]  # the model's name first
        assert c["significant"] is (c["p_adjusted"] < alpha)
        text = signed(c["difference"]) + (" †" if c["significant"] else "")
        assert text in cells[b] and (' class="sig"' in cells[b]) == c["significant"]
        p = "< 0.001" if c["p_adjusted"] < 0.001 else f"{c['p_adjusted']:.3f}"
        assert f"p<sub>adj</sub> {p}" in cells[b]
        mirrored = rows[b].split("<td")[2:][a]  # the other way round: the opposite difference
        assert signed(-c["difference"]) in mirrored
    # the two models that answer alike (29.2 each): a zero difference has no sign either way round,
    # and its interval and p-value follow it after a space, as text. Its interval is its terms'
    # (tables/comparisons.csv: Omniscience ±49.0 and ±60.4, HLE ±69.3, When2Call ±55.4, mean F1
    # ±94.5) weighed and square-and-added over the evaluations: √((0.125·49.0 + 0.125·60.4)² +
    # (0.25·69.3)² + (0.25·55.4)² + (0.25·94.5)²) = 35.2 (the weighted sum of Wilson bounds: 56.8)
    lp, gpt = four.labels.index("logprobs:lp-fake"), four.labels.index("openai:gpt-fake")
    for a, b in ((lp, gpt), (gpt, lp)):
        assert rows[a].split("<td")[2:][b] == (
            '>0.0 <span class="ci">[-35.2, +35.2]</span> <span class="ci">p<sub>adj</sub> 1.000'
            "</span></td>" + ("</tr>\n" if b == 3 else "")
        )
    index = html[html.index('<table class="index">') :]
    for m in summary["models"]:
        assert (
            f"rank {m['rank']} [{m['rank_ci'][0]}–{m['rank_ci'][1]}], jointly [{m['rank_set'][0]}–"
            f"{m['rank_set'][1]}]"
        ) in index[: index.index("</table>")]
    assert (out / "tables" / "comparisons.parquet").exists()


def test_an_adaptive_run_s_sample_note_says_the_part_each_model_was_asked():
    """``--sample 100 --until``: one model stopped after 61 tasks of each evaluation, one asked the
    whole sample; the banner says the sample was drawn and each model scored over its part."""
    scored = SimpleNamespace(
        statuses=pl.DataFrame(
            {"label": [], "eval": [], "answers": []},
            schema={"label": pl.String, "eval": pl.String, "answers": pl.Int64},
        )
    )
    names = ("hle_multichoice", "when2call")
    data = {name: {"tasks": 100, "sample": {"tasks": 100, "seed": 0}} for name in names}
    stopped, whole = _entry("a", 20.0), _entry("b", 30.0)
    stopped.adaptive = {"asked": dict.fromkeys(names, 61), "rule": "precision=5", "round": 7}
    whole.adaptive = {"asked": dict.fromkeys(names, 100), "rule": "exhausted", "round": 9}
    summary = _summary(data, [stopped, whole])
    summary.adaptive = {
        "until": "precision=5",
        "seed": 0,
        "rounds": 9,
        "populations": dict.fromkeys(names, 100),
    }
    notes = [n for n in banner(summary, scored) if "sample" in n]
    assert notes == [
        "A sample of the tasks was drawn (100 tasks per evaluation, seed 0), and each model was "
        "scored over the part of it the adaptive run asked (a: 61 tasks per evaluation; b: the "
        "whole set): not the full index; intervals are wide."
    ]
    # asked the whole sample (an exhausted run): the plain sentence
    stopped.adaptive = {"asked": dict.fromkeys(names, 100), "rule": "exhausted", "round": 9}
    assert [n for n in banner(summary, scored) if "sample" in n] == [
        "A sample of the tasks was scored (100 tasks per evaluation, seed 0): not the full index; "
        "intervals are wide."
    ]


def test_a_difference_prints_with_its_sign_unless_it_is_zero_to_the_digits_shown():
    assert [signed(v) for v in (3.21, -0.4, 0.0, -0.0, 0.04, -0.04, -11.44)] == [
        "+3.2",
        "-0.4",
        "0.0",
        "0.0",
        "0.0",
        "0.0",
        "-11.4",
    ]
    assert signed(-0.004, 2) == "0.00" and signed(0.006, 2) == "+0.01"
