"""``dxi view``: every route over HTTP (status codes, headers, escaping, 404s, nothing written to
the cache), and a walk through the pages in a real headless browser (Debian's chromium).

The cache holds the embedded decision model, a language model served by the fault-injecting provider
whose When2Call replies are hostile prose (invalid answers quoting ``<script>`` and
``<img onerror>``), and a model whose name is markup (``tests.test_report.add_hostile_model``); the
dataset's texts carry markup too.
"""

from __future__ import annotations

import asyncio
import html
import multiprocessing
import os
import re
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote

import msgspec
import orjson
import polars as pl
import pytest
import rich.console
from aiohttp.test_utils import TestClient, TestServer
from markupsafe import escape
from scipy.stats import binomtest

from dxi.cache import Cache, CacheWriteError
from dxi.runner import rescore, session
from dxi.runner.cli import main
from dxi.runner.planning import plan
from dxi.runner.planning.inputs import PlanInputs
from dxi.scoring import measures, records
from dxi.scoring.provisional import span
from dxi.scoring.summary import signed
from dxi.view.app import CSP, is_loopback_host, make_app, task_url
from dxi.view.data import Browser, EvalQuery

from .conftest import FIXTURES, write_wildguard_parquet
from .fakes.fake_provider import serve
from .fakes.responders import HOSTILE_REPLY
from .helpers.report import (
    CHROMIUM_FLAGS,
    HOSTILE_ERROR,
    HOSTILE_MODEL,
    add_hostile_model,
    chromium,
)
from .helpers.runs import MODEL, copy_model, fail_rows
from .helpers.synthetic import data_dir as synthetic_data
from .helpers.view import get, view_of

LLM = "openai:fake-chat"
HOSTILE_QUESTION = "<img src=x onerror=alert(3)> Which gas do plants absorb?"
HOSTILE_OPTION = "<script>alert(4)</script>Oxygen"
HOSTILE_ID = 'q 2/<i>"?#%'  # a question id that needs escaping in HTML and quoting in URLs
SAFE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "link",
    "script",
    "body",
    "header",
    "nav",
    "main",
    "footer",
    "a",
    "span",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "p",
    "code",
    "div",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "form",
    "fieldset",
    "legend",
    "select",
    "option",
    "input",
    "label",
    "button",
    "section",
    "pre",
    "details",
    "summary",
    "ul",
    "li",
    "strong",
    "svg",
    "rect",
    "line",
    "polyline",
    "circle",
    "text",
    "figure",
    "figcaption",
    "dl",
    "dt",
    "dd",
    "article",
    "br",
    "wbr",
}  # the app's own markup: model or dataset text never adds a tag


def _data(root: Path) -> Path:
    """The test fixtures laid out like shared/data, with markup in an Omniscience question and
    option."""
    for src, dst in (
        ("omniscience.jsonl", "omniscience-standin/omniscience.jsonl"),
        ("hle_split.json", "hle/hle_mcqa.json"),
        ("when2call.jsonl", "when2call/when2call_test_mcq.jsonl"),
    ):
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / src, root / dst)
    omni = root / "omniscience-standin/omniscience.jsonl"
    rows = [orjson.loads(line) for line in omni.read_bytes().splitlines()]
    answers = [rows[1]["answers"][0], HOSTILE_OPTION, *rows[1]["answers"][2:]]
    rows[1] |= {"question_id": HOSTILE_ID, "question": HOSTILE_QUESTION, "answers": answers}
    omni.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    write_wildguard_parquet(root / "wildguardtest" / "wildguardtest.parquet")
    return root


class Tags(HTMLParser):
    """Every start tag of a page with its attributes (the markup, never the text)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.append((tag, attrs))


def run(**fields) -> int:
    """``dxi run -q``'s work (``session.run``) of ``plan.build(**fields)``: its exit code."""
    return session.run(plan.build(**fields)).exit_code


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root``: (size, mtime in ns)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("view")
    data = _data(tmp / "data")
    cache_dir = tmp / "cache"
    common = ["--data-dir", str(data), "--cache-dir", str(cache_dir), "-q"]
    assert run(models=[MODEL], out=tmp / "run1", data_dir=data, cache_dir=cache_dir) == 0
    add_hostile_model(cache_dir)
    # its first request meets a 503 and is retried: a row with the wait before its retry
    with serve(
        model="fake-chat",
        route_factories={"/v1/chat/completions": "tests.fakes.responders:hostile_when2call_chat"},
        script=["503"],
    ) as server:
        llm = f"{LLM}@{server.url}/v1"
        assert (
            run(
                models=[llm],
                epochs=2,
                limits={"backoff_s": 0.2},
                out=tmp / "run2",
                data_dir=data,
                cache_dir=cache_dir,
            )
            == 0
        )
    scored = rescore.rescore(
        rescore.select(PlanInputs(out=tmp / "scored", data_dir=data, cache_dir=cache_dir))
    )
    assert scored.exit_code == 1  # the hostile model's failures: provisional
    return {
        "tmp": tmp,
        "data": data,
        "cache": cache_dir,
        "common": common,
        "llm": llm,
        "summary": orjson.loads((tmp / "scored" / "summary.json").read_bytes()),
        "answers": pl.read_parquet(tmp / "scored" / "answers.parquet"),
    }


def _browser(
    built: dict, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> tuple[Browser, list[str]]:
    """The Browser ``dxi view`` builds (its server replaced by a catcher) and what it printed."""
    caught: dict = {}
    monkeypatch.setattr(
        "dxi.view.app.serve",
        lambda browser, host, port, print_: caught.update(browser=browser, host=host, port=port),
    )
    monkeypatch.setattr(
        "dxi.runner.commands.view._check_port", lambda host, port: None
    )  # nothing is bound
    printed: list[str] = []
    monkeypatch.setattr(
        rich.console.Console, "print", lambda self, *a, **k: printed.append(" ".join(map(str, a)))
    )
    assert main(["view", *built["common"], *extra]) == 0
    return caught["browser"], printed


@pytest.fixture(scope="module")
def browser(built: dict) -> Browser:
    b = view_of(data_dir=built["data"], cache_dir=built["cache"])
    yield b
    b.close()


def routes(browser: Browser, built: dict) -> list[str]:
    """One URL of every page kind, with every filter."""
    a, b = browser.labels[0], browser.labels[-1]
    hle = quote(a)
    paths = [
        "/",
        *[f"/eval/{e}" for e in browser.evals],
        f"/eval/when2call?m={quote(LLM)}&status=invalid",
        f"/eval/hle_multichoice?m={hle}&result=wrong&sort=p_gold&desc=1",
        f"/eval/aa_omniscience_decision?a={quote(a)}&b={quote(b)}",
        "/eval/wildguardtest?category=benign&q=user",
        "/eval/aa_omniscience_decision?sort=confidence&page=1",
        f"/compare/when2call?a={quote(a)}&b={quote(b)}",
        f"/compare/hle_multichoice?a={quote(a)}&b={quote(b)}&cell=both_wrong",
        "/calibration",
        f"/calibration?m={quote(MODEL)}&eval=aa_omniscience_decision&bin=9",
        f"/calibration?m={quote(LLM)}",
        "/static/view.css",
        "/static/view.js",
        "/static/favicon.svg",
    ]
    return paths + [task_url(t) for t in browser.tasks]


@pytest.mark.process
def test_the_view_shows_what_dxi_score_computes(browser: Browser, built: dict):
    scored = records.decode(orjson.dumps(built["summary"]))
    assert records.to_builtins(browser.summary) == records.to_builtins(
        scored.ordered(ranked=True)
    )  # one code path: the same summary, every number
    # no run file or --model: the models by Decision Index (28.5, 12.5, none), the order of the
    # report, the terminal and tables/index.csv (summary.json lists them by name)
    assert [m["model"] for m in built["summary"]["models"]] == [
        f"embedded:{HOSTILE_MODEL}",
        MODEL,
        LLM,
    ]
    assert browser.labels == [MODEL, LLM, f"embedded:{HOSTILE_MODEL}"]
    ((status, _, page),) = get(browser, "/")
    assert status == 200
    table = page[page.index("<table") : page.index("</table>")]  # the index table
    at = [table.index(f'<th class="label">{escape(label)}</th>') for label in browser.labels]
    assert at == sorted(at)
    # the hostile model's When2Call requests all failed: its figures are provisional, and the page
    # says so
    assert built["summary"]["models"][0]["complete"] is False  # the hostile model's
    assert (
        "provisional (*): 3 failed answer(s) in When2Call, left out: its figures are over the "
        "answered questions; the next `dxi run` with these options asks for 0 of them again (3 "
        "deterministic failure(s) are kept"
    ) in page
    for m in built["summary"]["models"]:
        value = m["decision_index"]
        assert (f"{value:.1f}" if value is not None else "—") in page
        for name, e in m["evals"].items():
            if e["n"]:
                assert f'href="/eval/{name}?m={quote(m["model"], safe="")}"' in page.replace(
                    "&amp;", "&"
                )


@pytest.mark.process
def test_every_route_answers_with_a_strict_policy_and_no_inline_script_or_style(
    browser: Browser, built: dict
):
    for path, (status, headers, body) in zip(
        routes(browser, built), get(browser, *routes(browser, built)), strict=True
    ):
        assert status == 200, (path, body[:500])
        assert (
            headers["Content-Security-Policy"] == CSP
            and headers["X-Content-Type-Options"] == "nosniff"
        ), path
        if headers["Content-Type"].startswith("text/html"):  # the svg icon is an image, not a page
            tags = Tags()
            tags.feed(body)
            assert [a for t, a in tags.seen if t == "script"] == [
                [("src", "/static/view.js"), ("defer", None)]
            ], path
            assert "style" not in {t for t, _ in tags.seen} and "img" not in {
                t for t, _ in tags.seen
            }, path
            attributes = [(n, v or "") for _, a in tags.seen for n, v in a]
            assert not [n for n, _ in attributes if n.startswith("on") or n == "style"], path
            assert not [
                v
                for _, v in attributes
                if v.lower().startswith(("javascript:", "http:", "https:", "//"))
            ], path
    assert "script-src 'self'" in CSP and "default-src 'none'" in CSP and "unsafe" not in CSP


@pytest.mark.process
def test_unknown_ids_are_404_and_bad_queries_400(browser: Browser):
    not_found = [
        "/eval/nope",
        "/task/hle_multichoice/nope",
        "/task/nope",
        "/compare/nope",
        "/calibration?m=nobody",
        "/eval/when2call?m=nobody",
        "/eval/when2call?epoch=3",
        "/calibration?m=nobody&eval=when2call&bin=1",
        f"/calibration?m={quote(MODEL)}&eval=when2call&bin=10",
        "/nothing/here",
        "/static/nothing.css",
        "/static/../view/app.py",
    ]
    for path, (status, headers, _) in zip(not_found, get(browser, *not_found), strict=True):
        assert status == 404, path
        assert headers["Content-Security-Policy"] == CSP, path
    bad = [
        "/eval/when2call?page=x",
        "/eval/when2call?page=0",
        "/eval/when2call?sort=evil",
        "/eval/when2call?status=odd",
        f"/eval/when2call?a={quote(MODEL)}",
        "/compare/when2call?cell=diagonal",
        "/calibration?bin=1",
    ]
    for path, (status, _, _) in zip(bad, get(browser, *bad), strict=True):
        assert status == 400, path
    # a page past the last one says so (200: the page exists as an empty one, with its pager back)
    ((status, _, body),) = get(browser, "/eval/when2call?page=99")
    total = browser.evaluation("when2call", EvalQuery()).total
    assert (
        status == 200 and f"No page 99: these filters match {total} questions, on 1 page." in body
    )
    ((_, _, body),) = get(browser, "/eval/when2call?q=no-such-text-anywhere")
    assert "No question matches these filters." in body
    posted = get(browser, "/", "/eval/when2call", method="POST")
    assert [(s, h["Content-Security-Policy"]) for s, h, _ in posted] == [(405, CSP), (405, CSP)]


@pytest.mark.process
def test_hostile_model_and_dataset_text_is_escaped_everywhere(browser: Browser, built: dict):
    pages = {
        path: body
        for path, (_, _, body) in zip(
            routes(browser, built), get(browser, *routes(browser, built)), strict=True
        )
    }
    for path, body in pages.items():
        tags = Tags()
        tags.feed(body)
        assert {t for t, _ in tags.seen} <= SAFE_TAGS, (path, {t for t, _ in tags.seen} - SAFE_TAGS)
        assert body.count("<script") == (1 if not path.startswith("/static") else 0), path
    w2c = next(t for t in browser.tasks if t.startswith("when2call/"))
    page = pages[task_url(w2c)]
    assert str(escape(HOSTILE_REPLY)) in page  # the LLM's raw reply, shown as text
    assert str(escape(HOSTILE_ERROR)) in page  # the hostile model's failure
    omni = pages[task_url(f"aa_omniscience_decision/{HOSTILE_ID}")]
    assert str(escape(HOSTILE_QUESTION)) in omni and str(escape(HOSTILE_OPTION)) in omni
    assert str(escape(HOSTILE_MODEL)) in pages["/"]
    assert "invalid" in page and 'class="invalid-reason"' in page


@pytest.mark.process
def test_the_evaluation_page_filters_on_the_server(browser: Browser, built: dict):
    ans = built["answers"]
    llm_w2c = ans.filter((pl.col("model") == LLM) & (pl.col("eval") == "when2call"))
    invalid = llm_w2c.filter(pl.col("status") == "invalid")["task_id"].to_list()
    assert len(invalid) == llm_w2c.height == 3  # every When2Call reply was hostile prose

    def shown(body: str) -> list[str]:
        return [unquote(t) for t in re.findall(r'<td class="task"><a href="/task/([^"]+)"', body)]

    ((status, _, body),) = get(browser, f"/eval/when2call?m={quote(LLM)}&status=invalid")
    assert status == 200 and sorted(shown(body)) == sorted(t for t in invalid)
    hle = ans.filter((pl.col("eval") == "hle_multichoice") & (pl.col("model") == MODEL))
    wrong = hle.filter(~pl.col("correct"))["task_id"].to_list()
    ((_, _, body),) = get(browser, f"/eval/hle_multichoice?m={quote(MODEL)}&result=wrong")
    assert sorted(shown(body)) == sorted(wrong)
    # disagreement: the embedded model and the LLM pick differently
    pair = ans.filter(pl.col("eval") == "aa_omniscience_decision").pivot(
        "model", index=["task_id", "question_id"], values="predicted"
    )
    differ = pair.filter(pl.col(MODEL).ne_missing(pl.col(LLM)))["task_id"].to_list()
    ((_, _, body),) = get(browser, f"/eval/aa_omniscience_decision?a={quote(MODEL)}&b={quote(LLM)}")
    assert sorted(shown(body)) == sorted(differ)
    # category (Omniscience domain) and search in the state
    ((_, _, body),) = get(browser, "/eval/aa_omniscience_decision?category=History")
    history = {t.id for t in browser.tasks.values() if t.meta.get("domain") == "History"}
    assert set(shown(body)) == history and history
    ((_, _, body),) = get(browser, "/eval/aa_omniscience_decision?q=PLANTS+absorb")
    assert shown(body) == [f"aa_omniscience_decision/{HOSTILE_ID}"]
    # sorted by the probability of the gold, descending
    ((_, _, body),) = get(
        browser, f"/eval/aa_omniscience_decision?m={quote(MODEL)}&sort=p_gold&desc=1"
    )
    omni = ans.filter((pl.col("eval") == "aa_omniscience_decision") & (pl.col("model") == MODEL))
    p_gold = {
        t: next(p["p"] for p in probs if p["option"] == g)
        for t, g, probs in omni.select("task_id", "gold", "probabilities").iter_rows()
    }
    assert shown(body) == sorted(p_gold, key=lambda t: -p_gold[t])


@pytest.mark.process
def test_the_question_page_shows_the_probabilities_of_answers_parquet(
    browser: Browser, built: dict
):
    ans = built["answers"].filter(pl.col("model") == MODEL)
    for task_id in (
        ans.filter(pl.col("eval") == "hle_multichoice")["task_id"][0],
        ans.filter(pl.col("eval") == "wildguardtest")["task_id"][0],
    ):
        ((status, _, body),) = get(browser, task_url(task_id))
        assert status == 200
        for question_id, probs in (
            ans.filter(pl.col("task_id") == task_id)
            .select("question_id", "probabilities")
            .iter_rows()
        ):
            cell = re.search(
                rf'data-model="{re.escape(str(escape(MODEL)))}" data-epoch="0" data-question="{question_id}">'
                r"(.*?)</table>",
                body,
                re.S,
            ).group(1)
            shown = dict(re.findall(r'data-option="([^"]+)" data-p="([^"]+)">', cell))
            assert {o: float(p) for o, p in shown.items()} == {p["option"]: p["p"] for p in probs}
    # the request: cache key, attempts, the exact row of the cache
    rows = (
        Cache(built["cache"], read_only=True).scan().filter(pl.col("task_id") == task_id).collect()
    )
    key = rows.filter(pl.col("model") == MODEL.split(":", 1)[1])["key"].item()
    assert key in body and "prompt version <code>dxi-prompt-1</code>" in body
    assert "<dt>attempts</dt><dd>1</dd>" in body  # at its first attempt: no wait shown
    # the request retried after a 503: its attempts and the wait before the retry, as the cache has
    # them
    retried = Cache(built["cache"], read_only=True).scan().filter(pl.col("attempts") == 2).collect()
    (wait,) = retried["retry_waits_s"].item()
    assert retried.height == 1 and wait >= 0.2
    # the scripted 503 meets whichever of its 2 epochs' requests is sent first: viewed at 2 epochs
    both = view_of(data_dir=built["data"], cache_dir=built["cache"], epochs=2)
    try:
        ((status, _, body),) = get(both, task_url(retried["task_id"].item()))
    finally:
        both.close()
    assert status == 200
    shown = re.findall(r"<dt>attempts</dt><dd>([^<]*)</dd>", body)
    assert f"2 (waited {wait:.1f} s before the retries)" in shown, shown


@pytest.mark.process
def test_compare_counts_the_two_by_two(browser: Browser, built: dict):
    ans = built["answers"].filter(pl.col("eval") == "hle_multichoice")
    right = {
        m: dict(ans.filter(pl.col("model") == m).select("task_id", "correct").iter_rows())
        for m in (MODEL, LLM)
    }
    expected = {"both_right": 0, "a_only": 0, "b_only": 0, "both_wrong": 0}
    for t in right[MODEL]:
        cell = {
            (True, True): "both_right",
            (True, False): "a_only",
            (False, True): "b_only",
            (False, False): "both_wrong",
        }
        expected[cell[(right[MODEL][t], right[LLM][t])]] += 1
    table, page = browser.compare("hle_multichoice", MODEL, LLM)
    assert {k: table[k] for k in expected} == expected and page.total == expected[
        "a_only"
    ] + expected["b_only"]
    # beside the 2x2: McNemar's exact test of its discordant cells (scipy's binomial test as the
    # reference)
    discordant = expected["a_only"] + expected["b_only"]
    assert table["mcnemar_p"] == (
        pytest.approx(binomtest(expected["a_only"], discordant).pvalue) if discordant else 1.0
    )
    ((status, _, html),) = get(browser, f"/compare/hle_multichoice?a={quote(MODEL)}&b={quote(LLM)}")
    assert status == 200 and "McNemar's exact test on the discordant answers" in html
    assert f"<strong>p = {table['mcnemar_p']:.3g}</strong>" in html
    # and the summary's paired comparisons of the two: the index's and each HLE metric's difference,
    # as A − B
    differences = browser.differences("hle_multichoice", MODEL, LLM)
    assert [d["metric"] for d in differences] == ["decision_index", "accuracy"] or [
        d["metric"] for d in differences
    ] == ["accuracy"]  # the index only when both have one
    for d in differences:
        stored = next(
            c
            for c in built["summary"]["comparisons"]
            if c["metric"] == d["metric"]
            and c["eval"] in (None, "hle_multichoice")
            and {c["a"], c["b"]} == {MODEL, LLM}
        )
        sign = 1 if stored["a"] == MODEL else -1
        assert d["difference"] == sign * stored["difference"]
        assert f'<td class="num">{signed(d["difference"])}</td>' in html  # 0.0: no sign
        assert d["significant"] is (d["p_adjusted"] < 0.05)
    # the page says which procedure adjusted the p-values (summary.json's comparison_method)
    assert (
        "p adjusted (every pair)" in html
        and "max-T step-down of Westfall &amp; Young / Romano &amp; Wolf" in html
    )
    back = browser.differences("hle_multichoice", LLM, MODEL)
    assert [-d["difference"] for d in back] == [d["difference"] for d in differences]


def test_the_wildguard_compare_page_counts_answers_and_claims_no_mcnemar_test(
    browser: Browser, built: dict
):
    """A WildGuardTest row holds three answers (its questions), not independent pairs: the 2×2
    counts them (three per row) and no McNemar test is computed or shown."""
    ans = built["answers"].filter(pl.col("eval") == "wildguardtest")
    table, _ = browser.compare("wildguardtest", MODEL, LLM)
    rows = ans.filter(pl.col("model") == MODEL).height
    assert table["mcnemar_p"] is None and table["one_asked"] == 0
    assert sum(table[k] for k in ("both_right", "a_only", "b_only", "both_wrong")) == rows
    ((status, _, html),) = get(browser, f"/compare/wildguardtest?a={quote(MODEL)}&b={quote(LLM)}")
    assert status == 200 and "McNemar's exact test on the discordant answers" not in html
    assert (
        "Answers, three per row (its three questions): not independent pairs, so no McNemar test"
        in html
    )


@pytest.mark.process
def test_the_compare_page_claims_no_difference_the_missing_answers_could_overturn(
    browser: Browser, monkeypatch: pytest.MonkeyPatch
):
    # the summary as it would be with MODEL's HLE answers mostly missing: its accuracy provisional,
    # over its answered questions, with bounds that reach past LLM's; the comparison is not settled
    summary = browser.summary
    mine = next(
        c for c in summary.comparisons if c.eval == "hle_multichoice" and {c.a, c.b} == {MODEL, LLM}
    )
    entries = {m.model: m for m in summary.models}
    hle = dict(
        entries[MODEL].evals["hle_multichoice"], complete=False, accuracy_bounds=[0.0, 100.0]
    )
    model = msgspec.structs.replace(
        entries[MODEL], evals={**entries[MODEL].evals, "hle_multichoice": hle}
    )
    open_one = msgspec.structs.replace(
        mine, complete=False, settled=False, p_value=0.0001, p_adjusted=0.0001, significant=False
    )
    monkeypatch.setattr(
        browser,
        "summary",
        msgspec.structs.replace(
            summary,
            models=[model if m.model == MODEL else m for m in summary.models],
            comparisons=[open_one if c is mine else c for c in summary.comparisons],
        ),
    )
    (d,) = [
        d for d in browser.differences("hle_multichoice", MODEL, LLM) if d["metric"] == "accuracy"
    ]
    llm = entries[LLM].evals["hle_multichoice"]["accuracy"]
    assert (d["settled"], d["bounds"]) == (False, {"a": [0.0, 100.0], "b": [llm, llm]})
    ((status, _, html),) = get(browser, f"/compare/hle_multichoice?a={quote(MODEL)}&b={quote(LLM)}")
    row = next(r for r in html.split("<tr>") if r.startswith("<th>accuracy"))
    assert status == 200 and "< 0.001" not in row and "0.0001" not in row
    # B is complete: its value, not its value as an outward-rounded range ("[22.4, 22.5]")
    assert f"not claimed: A bounds [0.0, 100.0], B {llm:.1f} overlap" in row


@pytest.mark.process
def test_the_compare_page_takes_mcnemars_test_at_the_worst_outcome_of_failed_answers(
    tmp_path: Path,
):
    """The embedded model and a copy of it whose first 30 of 60 When2Call answers failed: counted
    as not right, the failures make 11 discordant answers one way (p < 0.001 on those counts), which
    the failed answers could all undo; the page takes the test at their worst outcome, p = 1, as
    summary.json's mcnemar_p does, and shows no p-value of the counts as they stand."""
    data, cache_dir = synthetic_data(tmp_path / "data", 60, seed=3), tmp_path / "cache"
    assert run(models=[MODEL], out=tmp_path / "out", data_dir=data, cache_dir=cache_dir) == 0
    copy = copy_model(cache_dir, "copy", "when2call", 30)
    b = view_of(data_dir=data, cache_dir=cache_dir, evals="when2call")
    try:
        table, _ = b.compare("when2call", MODEL, copy)
        assert table == {
            "both_right": 5,
            "a_only": 11,
            "b_only": 0,
            "both_wrong": 44,
            "one_asked": 0,
            "open": 30,
            "mcnemar_p": 1.0,
        }
        (stored,) = [
            c
            for c in b.summary.comparisons
            if c.eval == "when2call" and c.metric == "accuracy" and {c.a, c.b} == {MODEL, copy}
        ]
        assert (stored.mcnemar_p, stored.complete, stored.settled) == (1.0, False, False)
        ((status, _, html),) = get(b, f"/compare/when2call?a={quote(MODEL)}&b={quote(copy)}")
        (said,) = re.findall(r'<p class="mcnemar">(.*?)</p>', html)
        assert status == 200 and said == (
            "McNemar's exact test: 30 of these questions have a failed or missing answer, counted"
            " above as not right. The test on the discordant counts as they stand (11 A only, 0 B"
            " only) could claim a difference those answers would overturn, so it is taken at their"
            " worst outcome, as summary.json's <code>mcnemar_p</code> is: <strong>p = 1</strong>."
        )
        assert "&lt; 0.001" not in html  # the naive p of 11 against 0 (0.00098) is nowhere
    finally:
        b.close()


@pytest.mark.process
def test_calibration_bins_list_their_questions(browser: Browser, built: dict):
    bins = browser.reliability_bins(MODEL)
    assert set(bins) == {"aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest"}
    assert (
        browser.reliability_bins(LLM) == {}
    )  # no probabilities from a structured-output language model
    ans = built["answers"].filter((pl.col("model") == MODEL) & (pl.col("eval") == "wildguardtest"))
    for row in bins["wildguardtest"]:
        listed = browser.in_bin("wildguardtest", MODEL, row["bin"])
        expected = ans.filter((pl.col("p_predicted") * 10).floor().clip(0, 9) == row["bin"])
        assert listed.total == row["n"] == expected.height
    # the page gives each evaluation's calibration figures as dxi score computed them (summary.json)
    ((status, _, page),) = get(browser, f"/calibration?m={quote(MODEL)}")
    entry = next(m for m in built["summary"]["models"] if m["model"] == MODEL)
    for name in bins:
        block = entry["evals"][name]["calibration"]
        assert block["ece_ci"] is None  # no interval: the binned ECE is biased (intervals.py)
        low, high = block["brier_ci"]
        brier = f"Brier {block['brier']:.3f} [{low:.3f}, {high:.3f}]"
        assert f"ECE {block['ece']:.3f} · {brier}" in page
        assert (
            f"{block['answers']} answers counted, {block['excluded']} without probabilities" in page
        )
    wild = entry["evals"]["wildguardtest"]["calibration"]["questions"]
    assert "AUROC " + ", ".join(f"{q} {v['auroc']:.3f}" for q, v in wild.items()) in page


@pytest.mark.process
def test_a_run_file_names_the_models_and_their_names(built: dict, monkeypatch: pytest.MonkeyPatch):
    run = built["tmp"] / "view.toml"
    run.write_text(
        f'data_dir = "{built["data"]}"\ncache_dir = "{built["cache"]}"\n\n[[models]]\nname = "sparrow <nano>"\n'
        'provider = "embedded"\nmodel = "sparrow-nano-general-v1.1"\n'
    )
    b = view_of(run_file=run)
    try:
        assert b.labels == ["sparrow <nano>"]
        assert b.summary.models[0].decision_index == next(
            m["decision_index"] for m in built["summary"]["models"] if m["model"] == MODEL
        )
        ((_, _, page),) = get(b, "/")
        assert "sparrow &lt;nano&gt;" in page
    finally:
        b.close()


@pytest.mark.process
def test_quiet_leaves_out_the_notes_on_the_selection(built: dict, monkeypatch: pytest.MonkeyPatch):
    loud = {**built, "common": [a for a in built["common"] if a != "-q"]}
    b, printed = _browser(loud, monkeypatch)
    b.close()
    notes = [p for p in printed if p.startswith("[yellow]note:[/]")]
    assert len(notes) == 1 and "the cache holds 2 epochs; --epochs 2 scores them all" in notes[0]
    b, printed = _browser(built, monkeypatch)  # with -q
    b.close()
    assert not [p for p in printed if "note:" in p]


@pytest.mark.process
def test_epochs_side_by_side(built: dict, monkeypatch: pytest.MonkeyPatch):
    b, printed = _browser(built, monkeypatch, "--model", built["llm"], "--epochs", "2")
    try:
        assert b.labels == [LLM] and b.summary.epochs == 2 and b.epochs_of("when2call") == [0, 1]
        task = next(t for t in b.tasks if t.startswith("hle_multichoice/"))
        detail = b.question(task)
        (epochs,) = [m["epochs"] for m in detail["models"]]
        assert [e["sample"] for e in epochs] == [0, 1]
        keys = [e["request"]["key"] for e in epochs]
        assert len(set(keys)) == 2  # each epoch its own request (SPEC §6)
        (status, _, body), (s1, _, page1) = get(
            b, task_url(task), "/eval/when2call?epoch=1&status=invalid"
        )
        assert status == s1 == 200
        assert "<th>epoch 0</th><th>epoch 1</th>" in body and all(k in body for k in keys)
        assert page1.count('<td class="task">') == 3  # the hostile prose in epoch 1 too
    finally:
        b.close()


@pytest.mark.process
def test_the_view_never_writes_to_the_cache(built: dict, monkeypatch: pytest.MonkeyPatch):
    cache_dir: Path = built["cache"]
    # a log left by a killed writer: a writing Cache would compact it into a shard at start-up
    row = Cache(cache_dir, read_only=True).scan().head(1).collect().to_dicts()[0]
    orphan = cache_dir / "wal" / "1-99999-deadbeef.jsonl"
    orphan.write_bytes(orjson.dumps(row | {"created_at": row["created_at"] + 1}) + b"\n")
    try:
        before = tree(cache_dir)
        b, _ = _browser(built, monkeypatch)
        try:
            assert all(status == 200 for status, _, _ in get(b, *routes(b, built)))
        finally:
            b.close()
        assert tree(cache_dir) == before
        assert not Path(b.workdir.name).exists()
    finally:
        orphan.unlink()
    with pytest.raises(CacheWriteError, match="read-only"):
        Cache(cache_dir, read_only=True).append(row)
    assert not (built["tmp"] / "nowhere").exists()
    Cache(built["tmp"] / "nowhere", read_only=True).scan().collect()
    assert not (built["tmp"] / "nowhere").exists()


@pytest.mark.process
def test_a_damaged_shard_is_skipped_not_moved_when_read_only(built: dict, tmp_path: Path):
    cache_dir = tmp_path / "cache"
    shutil.copytree(built["cache"], cache_dir)
    total = Cache(cache_dir, read_only=True).scan().collect().height
    shard = cache_dir / "shards" / "hostile.parquet"
    lost = pl.read_parquet(shard).height
    shard.write_bytes(shard.read_bytes()[:-100])  # the footer cut off
    before = tree(cache_dir)
    cache = Cache(cache_dir, read_only=True)
    assert cache.read(lambda rows: rows.collect().height) == total - lost
    assert tree(cache_dir) == before  # left in place, not moved to quarantine/
    assert [
        w for w in cache.warnings if str(shard) in w and "skipped (read-only: left in place)" in w
    ]


@pytest.mark.process
def test_only_loopback_by_default_and_a_warning_for_another_host(
    built: dict, monkeypatch: pytest.MonkeyPatch
):
    b, printed = _browser(built, monkeypatch)
    b.close()
    assert not any("warning" in p for p in printed)
    b, printed = _browser(
        built, monkeypatch, "--host", "0.0.0.0", "--port", "9999", "--model", MODEL
    )
    b.close()
    assert b.labels == [MODEL]  # the selection options of dxi score
    assert any("warning" in p and "0.0.0.0" in p for p in printed)
    assert [
        is_loopback_host(h)
        for h in ("127.0.0.1", "::1", "localhost", "127.0.0.2", "0.0.0.0", "192.168.1.2", "example")
    ] == [True, True, True, True, False, False, False]
    assert (
        main(
            [
                "view",
                "--data-dir",
                str(built["data"]),
                "--cache-dir",
                str(built["tmp"] / "none"),
                "-q",
            ]
        )
        == 2
    )


@pytest.mark.server
@pytest.mark.process
def test_a_walk_through_the_pages_in_a_headless_browser(
    browser: Browser, built: dict, tmp_path: Path
):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    shots = Path(os.environ.get("DXI_VIEW_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    ans = built["answers"]

    async def walk() -> dict:
        async with TestServer(make_app(browser), host="127.0.0.1") as server:
            base = str(server.make_url("/")).rstrip("/")
            return await asyncio.to_thread(_walk, base)

    def _walk(base: str) -> dict:
        with sync_playwright() as p:
            chrome = p.chromium.launch(
                executable_path=executable, args=["--headless", *CHROMIUM_FLAGS]
            )
            try:
                page = chrome.new_page(viewport={"width": 1280, "height": 900})
                problems, requests = [], []
                page.on(
                    "console",
                    lambda m: problems.append(m.text) if m.type in ("error", "warning") else None,
                )
                page.on("pageerror", lambda e: problems.append(str(e)))
                page.on("dialog", lambda d: problems.append(f"dialog: {d.message}"))
                page.on("request", lambda r: requests.append(r.url))
                page.goto(base + "/")
                page.screenshot(path=str(shots / "overview.png"), full_page=True)
                overview = page.inner_text("body")
                # follow the embedded model's HLE accuracy to the evaluation page
                page.click(f'table.index a[href="/eval/hle_multichoice?m={quote(MODEL, safe="")}"]')
                page.wait_for_load_state()
                # filter to the wrong answers (the drop-down applies itself: view.js)
                page.select_option("select[name=result]", "wrong")
                page.wait_for_url("**result=wrong**")
                page.screenshot(path=str(shots / "evaluation.png"), full_page=True)
                listed = page.eval_on_selector_all(
                    "td.task a", "els => els.map(e => e.getAttribute('href'))"
                )
                url = page.url
                page.click("td.task a")
                page.wait_for_load_state()
                page.screenshot(path=str(shots / "question.png"), full_page=True)
                shown = page.eval_on_selector_all(
                    "td.answer",
                    "els => els.map(e => [e.dataset.model, e.dataset.question, "
                    "[...e.querySelectorAll('td.p')].map(p => [p.dataset.option, p.innerText])])",
                )
                task_id = page.inner_text("h1.task-id")
                question_text = page.inner_text("body")
                page.goto(base + f"/compare/hle_multichoice?a={quote(MODEL)}&b={quote(LLM)}")
                page.screenshot(path=str(shots / "compare.png"), full_page=True)
                page.goto(
                    base + f"/calibration?m={quote(MODEL)}&eval=aa_omniscience_decision&bin=9"
                )
                page.screenshot(path=str(shots / "calibration.png"), full_page=True)
                w2c = next(t for t in browser.tasks if t.startswith("when2call/"))
                page.goto(base + task_url(w2c))
                page.screenshot(path=str(shots / "hostile.png"), full_page=True)
                hostile_text = page.inner_text("body")
                scripts = page.evaluate("document.scripts.length")
                images = page.evaluate("document.images.length")
            finally:
                chrome.close()
        return {
            "problems": problems,
            "requests": requests,
            "overview": overview,
            "listed": listed,
            "url": url,
            "shown": shown,
            "task_id": task_id,
            "question": question_text,
            "hostile": hostile_text,
            "scripts": scripts,
            "images": images,
            "base": base,
        }

    seen = asyncio.run(walk())
    assert seen["problems"] == []
    assert all(r.startswith(seen["base"]) for r in seen["requests"])  # nothing from elsewhere
    assert HOSTILE_MODEL in seen["overview"]
    hle = ans.filter((pl.col("eval") == "hle_multichoice") & (pl.col("model") == MODEL))
    wrong = sorted(hle.filter(~pl.col("correct"))["task_id"].to_list())
    assert (
        "result=wrong" in seen["url"]
        and sorted(u.removeprefix("/task/") for u in seen["listed"]) == wrong
    )
    assert (
        seen["task_id"] == wrong[0]
        if seen["listed"][0] == "/task/" + wrong[0]
        else seen["task_id"] in wrong
    )
    # the probabilities shown are those of answers.parquet, to the 4 decimals shown
    mine = ans.filter(pl.col("task_id") == seen["task_id"])
    expected = {
        (m, q): [(p["option"], f"{p['p']:.4f}") for p in probs]
        for m, q, probs in mine.select("model", "question_id", "probabilities").iter_rows()
        if probs
    }
    shown = {(m, q): [tuple(x) for x in ps] for m, q, ps in seen["shown"] if ps}
    assert shown == expected and (MODEL, "answer") in shown
    # hostile text shown as text, never run: no dialog opened, no image element, only the app's
    # script
    assert HOSTILE_REPLY in seen["hostile"] and HOSTILE_ERROR in seen["hostile"]
    assert (seen["scripts"], seen["images"]) == (1, 0)
    for name in ("overview", "evaluation", "question", "compare", "calibration", "hostile"):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name


@pytest.mark.process
def test_a_port_that_cannot_be_served_is_a_usage_error_not_a_traceback(
    built: dict, capsys: pytest.CaptureFixture
):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        base = ["view", "--data-dir", str(built["data"]), "--cache-dir", str(built["cache"]), "-q"]
        assert main([*base, "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert f"cannot serve on 127.0.0.1:{port}" in err and "--port 0 for a free one" in err
    assert main([*base, "--port", "99999"]) == 2  # refused as parsed (tests/test_cli_numbers.py)
    assert (
        "argument --port: expected a whole number from 0 to 65,535, got '99999'"
        in capsys.readouterr().err
    )


def test_the_view_has_no_out_option_and_score_keeps_it(capsys: pytest.CaptureFixture):
    from dxi.runner.cli import parser

    helps = {}
    for command in ("view", "export", "score", "report"):
        with pytest.raises(SystemExit):
            parser().parse_args([command, "--help"])
        helps[command] = capsys.readouterr().out
    assert (
        "--out" not in helps["view"] and "--out" not in helps["export"]
    )  # they write no summary.json
    assert "--out DIR" in helps["score"] and "--out DIR" in helps["report"]
    assert main(["view", "--out", "somewhere", "-q"]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.slow
def test_the_view_rescores_rows_appended_while_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from dxi.view.live import Live

    data, cache_dir = _data(tmp_path / "data"), tmp_path / "cache"
    common = {"evals": ["hle_multichoice"], "limit": 3, "data_dir": data, "cache_dir": cache_dir}
    assert run(models=[MODEL], out=tmp_path / "out", **common) == 0
    b = view_of(**common)
    first = b.workdir.name
    rows = Cache(cache_dir, read_only=True).scan().collect().to_dicts()
    copy = "copy-of-sparrow"

    async def follow() -> tuple[str, str, list[str]]:
        live = Live(b, interval=0.05, settle=0)
        async with TestClient(TestServer(make_app(live))) as client:
            before = await (await client.get("/")).text()
            assert await live.check() is False  # nothing changed: the same snapshot
            with Cache(cache_dir) as writer:  # an overnight run adds a model's rows meanwhile
                for row in rows:
                    writer.append(
                        row
                        | {
                            "model": copy,
                            "served_model": copy,  # its replies name it (``dxi.served``)
                            "key": "copy-" + row["key"],
                            "created_at": row["created_at"] + 1,
                        }
                    )
            pages = []
            for _ in range(600):
                await asyncio.sleep(0.1)
                body = await (await client.get("/")).text()
                pages.append(body)
                if f"embedded:{copy}" in body:
                    break
            return before, body, pages

    before, after, pages = asyncio.run(follow())
    assert f"embedded:{copy}" not in before and MODEL in before
    assert f"embedded:{copy}" in after and MODEL in after  # the new model, scored like the first
    as_of = re.compile(r'<span class="as-of">as of (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)</span>')
    assert as_of.search(before) and as_of.search(after) and all(as_of.search(p) for p in pages)
    assert as_of.search(after)[1] >= as_of.search(before)[1]
    new = _live_browser_of(b, first)
    try:
        assert not Path(
            first
        ).exists()  # the old snapshot's folder is removed once the new one serves
        row, mine = new.summary.entry(f"embedded:{copy}"), new.summary.entry(MODEL)
        assert (
            row.evals["hle_multichoice"] == mine.evals["hle_multichoice"]
        )  # the same answers, the same scores
    finally:
        new.close()
    assert not Path(b.source.home.name).exists()


def _live_browser_of(b: Browser, first: str) -> Browser:
    """The newest snapshot in ``b``'s private folder (the one ``Live`` swapped in), opened again."""
    home = Path(b.source.home.name)
    snapshots = [p for p in home.glob("snapshot-*") if str(p) != first]
    assert len(snapshots) == 1, snapshots
    return Browser.open(
        _Folder(snapshots[0]), b.source.suite.tasks(), b.models, b.epochs, b.prices, b.cache_dir
    )


class _Folder:
    """A snapshot folder as ``Browser.open`` takes it (``name``; ``cleanup`` removes it and the
    private folder)."""

    def __init__(self, path: Path):
        self.name = str(path)

    def cleanup(self) -> None:
        shutil.rmtree(Path(self.name).parent, ignore_errors=True)


@pytest.mark.process
def test_a_killed_views_private_folder_is_removed_by_the_next_view(tmp_path: Path):
    import signal
    import subprocess
    import sys

    from dxi.view.home import private_home, remove_stale

    code = (
        "import sys, time; from dxi.view.home import private_home; "
        "home = private_home(sys.argv[1]); print(home.name, flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    killed = Path(proc.stdout.readline().strip())
    (killed / "snapshot-x").mkdir()
    (killed / "snapshot-x" / "answers.parquet").write_bytes(b"x" * 100)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert killed.is_dir() and killed.parent == tmp_path  # SIGKILL: nothing could remove it
    other = tmp_path / "dxi-view-notes"  # another name: not a view's folder
    other.mkdir()
    mine = private_home(tmp_path)  # a new view: the killed one's folder goes, its own stays
    try:
        assert not killed.exists() and Path(mine.name).is_dir() and other.is_dir()
        assert remove_stale(tmp_path) == []  # this process runs: its folder is not stale
        assert Path(mine.name).is_dir()
    finally:
        mine.cleanup()


@pytest.mark.server
@pytest.mark.process
def test_a_remote_cache_is_mirrored_in_the_views_own_folder_not_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from .helpers.servers import moto_s3

    data = _data(tmp_path / "data")
    select = ["--evals", "hle_multichoice", "--limit", "3", "--data-dir", str(data), "-q"]
    with moto_s3(monkeypatch) as s3:
        assert (
            run(
                models=[MODEL],
                cache_dir=tmp_path / "writer",
                out=tmp_path / "o",
                cache_remote=s3.uri(),
                evals=["hle_multichoice"],
                limit=3,
                data_dir=data,
            )
            == 0
        )  # uploaded to the remote
        local = (
            tmp_path / "reader"
        )  # a cache folder of this machine: the remote's rows are not in it
        local.mkdir()
        before = tree(local)
        b = view_of(
            cache_dir=local,
            cache_remote=s3.uri(),
            evals=["hle_multichoice"],
            limit=3,
            data_dir=data,
        )
        try:
            assert b.labels == [MODEL]
            hle = b.summary.models[0].evals["hle_multichoice"]
            assert (hle["n"], hle["missing"]) == (2, 0) and hle[
                "accuracy"
            ] is not None  # the remote's rows, scored
            mirror = b.source.remote.mirror
            assert (
                mirror.parent == Path(b.source.home.name)
                and len(list(mirror.glob("shards/*.parquet"))) >= 1
            )
            assert all(status == 200 for status, _, _ in get(b, "/", "/eval/hle_multichoice"))
        finally:
            b.close()
        assert (
            tree(local) == before == {}
        )  # nothing written into the cache folder: no remote/ mirror
        assert not mirror.exists()
        # a fresh machine: no cache folder, the remote's rows all the same (issue: it refused,
        # "no cache at ...", where score and report read the remote); the folder is not created
        b = view_of(
            cache_dir=tmp_path / "none",
            cache_remote=s3.uri(),
            evals=["hle_multichoice"],
            limit=3,
            data_dir=data,
        )
        try:
            assert b.labels == [MODEL]
            hle = b.summary.models[0].evals["hle_multichoice"]
            assert (hle["n"], hle["missing"]) == (2, 0)
            assert all(status == 200 for status, _, _ in get(b, "/", "/eval/hle_multichoice"))
        finally:
            b.close()
        assert not (tmp_path / "none").exists()
    # without a remote tier a missing cache folder is still refused, naming it
    assert main(["view", "--cache-dir", str(tmp_path / "none"), *select]) == 2
    assert not (tmp_path / "none").exists()


@pytest.mark.process
def test_a_failed_rescoring_keeps_the_snapshot_and_says_why(
    browser: Browser, monkeypatch: pytest.MonkeyPatch
):
    from dxi.view.live import Live

    def fails(self, child=True):
        raise OSError("disk <b>gone</b>")

    async def attempt() -> tuple[bool, str, str]:
        live = Live(browser, interval=0, settle=60)
        live._seen = ()  # as if a shard had been added since
        monkeypatch.setattr(Browser, "rebuild", fails)
        async with TestClient(TestServer(make_app(live))) as client:
            swapped = await live.check()
            tried = live._next
            assert (
                await live.check() is False and live._next == tried
            )  # settling: not tried again at once
            assert tried - time.monotonic() > 50
            body = await (await client.get("/")).text()
            live.building = True
            building = await (await client.get("/eval/hle_multichoice")).text()
        return swapped, body, building

    swapped, body, building = asyncio.run(attempt())
    assert (
        swapped is False and Path(browser.workdir.name).is_dir()
    )  # still served, its snapshot in place
    assert "Rescoring the newer rows failed (OSError: disk &lt;b&gt;gone&lt;/b&gt;)" in body
    assert '<span class="building">rescoring newer rows…</span>' in building


@pytest.mark.process
def test_requests_parquet_written_in_parts_holds_every_current_row_sorted_by_task(
    browser: Browser, built: dict
):
    """The snapshot reads the cache's rows in ``REQUEST_PARTS`` ranges of task ids (12 tasks: 6
    parts of 2): the file holds exactly the rows one read of the whole cache gives, sorted by task
    id, rows of one task in cache order, in one row group or more per part."""
    import pyarrow.parquet as pq

    from dxi.evals import PROMPT_VERSION
    from dxi.view import data

    path = Path(browser.workdir.name) / "requests.parquet"
    written = pl.read_parquet(path)
    ids = pl.Series(list(browser.tasks), dtype=pl.String).implode()
    with Cache(built["cache"], read_only=True) as cache:
        whole = cache.read(
            lambda lf: (
                lf.filter(
                    (pl.col("prompt_version") == PROMPT_VERSION) & pl.col("task_id").is_in(ids)
                )
                .select(data._REQUESTS_READ)
                .collect()
            )
        )
    expected = whole.sort("task_id", maintain_order=True)
    assert written.height == whole.height == expected.height > 0
    assert written.columns == list(data._REQUESTS_READ)
    assert written.equals(expected)
    assert len(browser.tasks) == 12 and data.REQUEST_PARTS == 8
    assert pq.ParquetFile(path).num_row_groups == 6  # one per part of 2 tasks: -(-12 // 8) = 2


def test_the_start_up_child_is_spawned_with_its_allocator_options_and_the_environment_put_back(
    monkeypatch,
):
    from dxi.view.data import CHILD_JEMALLOC, JEMALLOC_VAR, _child_env

    glibc = "MALLOC_MMAP_THRESHOLD_"
    monkeypatch.delenv(glibc, raising=False)
    monkeypatch.setenv(
        JEMALLOC_VAR, "dirty_decay_ms:500,muzzy_decay_ms:1000"
    )  # what Polars sets on import
    with _child_env():
        assert (
            os.environ[JEMALLOC_VAR] == "dirty_decay_ms:500,muzzy_decay_ms:1000," + CHILD_JEMALLOC
        )
        assert os.environ[glibc] == "131072"
        # the child, spawned as Browser.build spawns it, starts with them (glibc and jemalloc read
        # them then)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            assert pool.submit(os.getenv, glibc).result() == "131072"
            assert pool.submit(os.getenv, JEMALLOC_VAR).result().endswith(CHILD_JEMALLOC)
    assert os.environ[JEMALLOC_VAR] == "dirty_decay_ms:500,muzzy_decay_ms:1000"
    assert glibc not in os.environ
    monkeypatch.delenv(JEMALLOC_VAR)
    monkeypatch.setenv(glibc, "1048576")  # the user's own tuning is kept
    with _child_env():
        assert (
            os.environ[JEMALLOC_VAR]
            == CHILD_JEMALLOC
            == "narenas:1,dirty_decay_ms:10,muzzy_decay_ms:0"
        )
        assert os.environ[glibc] == "1048576"
    assert JEMALLOC_VAR not in os.environ and os.environ[glibc] == "1048576"


@pytest.mark.process
def test_provisional_figures_are_marked_on_the_overview(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data, cache_dir = _data(tmp_path / "data"), tmp_path / "cache"
    assert run(models=[MODEL], out=tmp_path / "out", data_dir=data, cache_dir=cache_dir) == 0
    fail_rows(cache_dir, "when2call", 1)
    b = view_of(data_dir=data, cache_dir=cache_dir)
    try:
        ((status, _, page),) = get(b, "/")
        m = records.to_builtins(b.summary.models[0])
        mark = '<span class="provisional" title="provisional: answers failed or missing">*</span>'
        assert status == 200 and m["complete"] is False
        assert (
            f"{m['decision_index']:.1f}{mark}" in page
        )  # the index, and When2Call's accuracy, marked
        assert f'">{m["evals"]["when2call"]["accuracy"]:.1f}</a>{mark}' in page
        hle = m["evals"]["hle_multichoice"]["accuracy"]
        assert f'">{hle:.1f}</a>{mark}' not in page  # complete: not marked
        assert "asks for 1 of them again" in page
        # each provisional figure with its bounds beside it, labelled alike, and no complete one
        # with any
        shown = re.findall(r'<span class="bounds"[^>]*>([^<]*)</span>', page)
        assert shown == [
            f"bounds {span(m['decision_index_bounds'])}",
            f"bounds {span(m['evals']['when2call']['accuracy_bounds'])}",
        ]
    finally:
        b.close()


@pytest.mark.process
def test_the_overview_shows_each_models_latency_cost_and_risk_coverage(
    browser: Browser, built: dict
):
    ((status, _, page),) = get(browser, "/")
    assert status == 200 and 'id="measures"' in page
    by_model = {m["model"]: m for m in built["summary"]["models"]}
    decision = by_model[MODEL]["measures"]
    assert f"{decision['risk_coverage']['aurc']:.4f}" in page  # the decision model's pooled AURC
    assert f"{decision['latency']['p50_s']:.3f}" in page
    # the language model (structured outputs) has no confidence: said, not invented
    llm = by_model[LLM]["measures"]
    assert llm["risk_coverage"] is None and llm["risk_coverage_reason"] == measures.NO_CONFIDENCE
    assert f"{escape(LLM)}: {escape(measures.NO_CONFIDENCE)}" in page
    # the calibration page draws each evaluation's risk-coverage curve from the same figures
    ((status, _, calibration),) = get(browser, f"/calibration?m={quote(MODEL)}")
    assert status == 200 and 'id="risk-coverage"' in calibration
    curve = by_model[MODEL]["evals"]["wildguardtest"]["measures"]["risk_coverage"]["curve"]
    first = f'points="{40 + 200 * curve[0][0]:.1f},{210 - 200 * curve[0][1]:.1f} '
    curves = sum(
        1
        for b in by_model[MODEL]["evals"].values()
        if (b.get("measures") or {}).get("risk_coverage")
    )
    assert first in calibration and calibration.count('<polyline class="risk"') == curves > 0


def test_a_p_value_in_a_sentence_reads_p_below_or_p_equal():
    """The compare page's McNemar sentence: "p < 0.001", never "p = < 0.001" (as a trial saw)."""
    from dxi.view.app import _p_is

    assert [_p_is(p) for p in (0.0004, 0.001, 0.04567, 1.0)] == [
        "p < 0.001",
        "p = 0.001",
        "p = 0.0457",
        "p = 1",
    ]


@pytest.mark.process
@pytest.mark.slow
def test_an_answer_set_aside_as_damaged_is_told_as_such_on_its_pages(tmp_path: Path):
    from .helpers.damage import damage
    from .helpers.runs import run_plan
    from .helpers.view import get, view_of

    data = _data(tmp_path / "data")
    cache = tmp_path / "cache"
    assert run_plan(data, tmp_path, limit=1).exit_code == 0  # one task each: the first shard
    assert run_plan(data, tmp_path, limit=2).exit_code == 0
    first = sorted(cache.glob("shards/*.parquet"))[0]
    task = pl.read_parquet(first).filter(pl.col("eval") == "hle_multichoice")["task_id"][0]
    damage(first)
    b = view_of(data_dir=data, cache_dir=cache, limit=2)
    try:
        (epoch,) = b.question(task)["models"][0]["epochs"]
        assert (epoch["request"], epoch["set_aside"]) == (None, True)
        (other,) = [t for t in b.tasks if t.startswith("hle_multichoice/") and t != task]
        assert b.question(other)["models"][0]["epochs"][0]["set_aside"] is False
        (_, _, page), (_, _, overview) = get(b, task_url(task), "/")
        assert (
            "not in the cache (missing): its row was set aside as damaged (the cache found it "
            "unreadable); not scored, and <code>dxi run</code> sends it again"
        ) in page
        assert (
            "HLE-MultiChoice: 1 answer(s) not in the cache: set aside as damaged (the cache found "
            f"their rows unreadable and skipped them where they lie in {cache}/shards/ "
            "(read-only)): they are not scored, and `dxi run` with --limit 2 requests them again"
        ) in html.unescape(overview)
        assert not list(cache.glob("quarantine/*"))  # read-only: left in place
    finally:
        b.close()


# ---- dxi view: a request a provider batch answered costs the batch rate --------------------------


def test_the_view_prices_a_request_a_provider_batch_answered_at_the_batch_rate():
    """The question page's cost of one request: a batch row (``transport`` "batch") at half the
    price, as summary.json's usage blocks price it (``batch_price``), a synchronous one at the
    price; the requests file the page reads carries ``transport``."""
    from dxi.view import data

    row = {
        "input_tokens": 1000,
        "output_tokens": 200,
        "cached_input_tokens": 0,
        "cache_write_tokens": None,
        "cache_write_1h_tokens": None,
        "request_body": None,
        "raw_reply": None,
    }
    price = (2.0, 8.0)
    sync = data._request(row | {"transport": "sync"}, price)["cost_usd"]
    batch = data._request(row | {"transport": "batch"}, price)["cost_usd"]
    assert (sync, batch) == (0.0036, 0.0018)
    assert data._request(row | {"transport": None}, price)["cost_usd"] == 0.0036
    assert "transport" in data._REQUESTS_READ
