"""An adaptive run's outputs (issue 35; docs/adaptive.md, "What an adaptive run records"): a model
stopped by ``--until`` is scored over the tasks it was asked (the questions never asked are neither
missing nor failed), a failed answer inside the asked part keeps its bounds, ``dxi score`` of the
cache gives the run's summary figure for figure and exits 0, a later run without ``--until`` gives
exactly the summary of an ordinary run, and the progress bars count what the rounds ask. Three
models of ``tests.helpers.adaptive_models`` (known per-question answers) on 40 tasks of each
evaluation; with ``--until precision=20`` they stop after 7, 20 and 15 tasks of each."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from dxi.evals import Suite, discover
from dxi.runner.sending import progress as progress_module
from dxi.scoring.sequential import Until

from .fakes.fake_provider import serve
from .helpers.adaptive_models import DATA_ENV, knows, write_data
from .helpers.adaptive_outputs import SMALL, THREE
from .helpers.adaptive_outputs import printed as _printed
from .helpers.adaptive_runs import (
    ROUTE,
    dxi_run,
    dxi_score,
    figures,
    overview,
    page,
    replay,
    summary,
)

UNTIL = ("--until", "precision=20")
# what each model is asked of every evaluation before it stops (seed 0)
STOPPED_AT = {"systemone:m00": 7, "systemone:m50": 20, "systemone:m100": 15}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("adaptive-outputs") / "data", SMALL)


@pytest.fixture
def server(data: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(DATA_ENV, str(data))
    with serve(model=None, route_factories=ROUTE, record=False) as served:
        yield served


def timeless(doc):
    """``doc`` without its measured latencies (``latency`` blocks: how fast the fake server replied
    in that run, the one figure two runs of the same answers do not share)."""
    if isinstance(doc, dict):
        return {k: timeless(v) for k, v in doc.items() if k != "latency"}
    if isinstance(doc, list):
        return [timeless(v) for v in doc]
    return doc


def accuracy(model: str, name: str, task_ids: list[str], data: Path) -> float:
    """A one-question evaluation's accuracy (0-100, as summary.json rounds it) over ``task_ids``,
    from the answers the helper's model gives by construction (``knows``)."""
    tasks = {t.id: t for t in Suite(discover(data)).tasks(name)}
    right = [knows(model, i, q) for i in task_ids for q in tasks[i].gold]
    return round(100 * sum(right) / len(right), 6)


def test_a_stopped_model_is_scored_over_what_it_was_asked_and_dxi_score_agrees(
    data: Path, server, tmp_path: Path
):
    cache = tmp_path / "cache"
    assert dxi_run(server.url, data, cache, tmp_path / "out", *UNTIL, models=THREE) == 0
    s = summary(tmp_path / "out")
    order = orjson.loads(Path(s["adaptive"]["order"]).read_bytes())["evals"]
    assert s["adaptive"]["populations"] == dict.fromkeys(order, SMALL)
    # nothing missing: the result is complete, over what was asked
    assert (s["complete"], s["accepted"]) == (True, True)
    for m in s["models"]:
        label, asked = m["model"], m["adaptive"]["asked"]
        assert asked == dict.fromkeys(order, STOPPED_AT[label])
        assert m["adaptive"]["rule"] == "precision=20" and m["complete"]
        assert "decision_index_bounds" not in m and m["requests"]["sent"] == 4 * STOPPED_AT[label]
        for block in m["evals"].values():
            assert (block["n"], block["missing"], block["failed"], block["complete"]) == (
                STOPPED_AT[label],
                0,
                0,
                True,
            )
            assert "rerun" not in block and "reason" not in block
            assert not any(k.endswith("_bounds") for k in block)
        for name in ("hle_multichoice", "when2call"):  # over the part asked, by hand
            prefix = order[name][: asked[name]]
            assert m["evals"][name]["accuracy"] == accuracy(label.split(":")[1], name, prefix, data)
    assert s["models"][1]["evals"]["hle_multichoice"]["accuracy"] == 55.0  # m50: 11 of 20
    # the headline intervals of a model stopped before the end are the anytime-valid ones, valid
    # although the run chose when to stop (the fixed-sample ones over the asked part kept apart)
    for m in s["models"]:
        block = m["adaptive"]
        assert m["decision_index_ci"] == [block["index"]["low"], block["index"]["high"]]
        assert m["decision_index_ci"] != block["fixed_sample_ci"]["index"]
        for key, figure in block["metrics"].items():
            name, metric = key.split(".")
            assert m["evals"][name][f"{metric}_ci"] == [figure["low"], figure["high"]]
            assert block["fixed_sample_ci"][key] is not None
    assert [m["decision_index_ci"] for m in s["models"]] == [
        [0.0, 39.4713],
        [26.2264, 64.4952],
        [60.0628, 100.0],
    ]
    # the ranks cover what those intervals allow (m00 is below m100's [60.1, 100] only), and the
    # tied groups follow the pairs claimed: none is (their anytime paired intervals hold 0,
    # tests/test_adaptive_pairs), so one group
    assert [(m["rank"], m["rank_ci"], m["rank_set"]) for m in s["models"]] == [
        (3, [2, 3], [2, 3]),
        (2, [1, 3], [1, 3]),
        (1, [1, 2], [1, 2]),
    ]
    assert s["ranking"]["groups"] == [["systemone:m100", "systemone:m50", "systemone:m00"]]
    assert [m["tied_group"] for m in s["models"]] == [1, 1, 1]
    text = _printed(tmp_path / "out")
    for row in (
        "│ systemone:m00 │ ≈0.0 │ [0.0, 39.5] │ 3 [2–3] │ ≈0.0 │",
        "│ systemone:m50 │ ≈42.3 │ [26.2, 64.5] │ 2 [1–3] │ ≈35.0 │",
        "│ systemone:m100 │ ≈100.0 │ [60.1, 100.0] │ 1 [1–2] │ ≈100.0 │",
    ):
        assert row in text
    assert (
        "adjusted p < 0.05; an adaptive run's estimates parted only where their anytime-valid "
        "paired intervals and their own intervals part too): "
        "{systemone:m100, systemone:m50, systemone:m00}"
    ) in text
    # the report and its tables (the cache alone) show the same intervals and ranks
    from dxi.runner import rescore
    from dxi.runner.planning.inputs import PlanInputs

    rescore.rescore(
        rescore.select(PlanInputs(data_dir=data, cache_dir=cache, out=tmp_path / "report")),
        html=True,
    )
    report = (tmp_path / "report" / "report.html").read_text()
    assert "[26.2, 64.5]" in report and "rank 2 [1–3], jointly [1–3]" in report
    table = (tmp_path / "report" / "tables" / "index.csv").read_text().splitlines()
    assert [",".join(r.split(",")[i] for i in (0, 3, 4, 9, 10, 11, 12, 13)) for r in table[1:]] == [
        "systemone:m100,60.0628,100.0,1,2,1,2,1",
        "systemone:m50,26.2264,64.4952,1,3,1,3,1",
        "systemone:m00,0.0,39.4713,2,3,2,3,1",
    ]
    # `dxi score` of the cache: the same figures, the same blocks, exit 0 (no network needed: the
    # server is only named)
    server_url = server.url
    assert dxi_score(server_url, data, cache, tmp_path / "scored", models=THREE) == 0
    scored = summary(tmp_path / "scored")
    assert figures(scored) == figures(s)
    assert [m["requests"]["cache_hits"] for m in scored["models"]] == [
        4 * STOPPED_AT[m] for m in STOPPED_AT
    ]
    # one evaluation scored: the same figures for it; other tasks (--limit): not the run's order,
    # scored as any cache (what was not asked is missing: exit 1) and nothing marked
    hle = ["--evals", "hle_multichoice"]
    assert dxi_score(server_url, data, cache, tmp_path / "hle", THREE, *hle) == 0
    one = summary(tmp_path / "hle")
    assert [m["evals"]["hle_multichoice"] for m in one["models"]] == [
        m["evals"]["hle_multichoice"] for m in s["models"]
    ]
    # the index is not computed over one evaluation, and the adaptive blocks do not show the
    # run's whole-set index as if it applied: they hold the evaluation scored, its metrics' whole-
    # set estimates as the run recorded them, and the evaluations not scored are named
    others = ["aa_omniscience_decision", "when2call", "wildguardtest"]
    assert one["adaptive"] == {k: v for k, v in s["adaptive"].items() if k != "populations"} | {
        "populations": {"hle_multichoice": SMALL},
        "not_scored": others,
    }
    assert [m["decision_index"] for m in one["models"]] == [None] * 3
    assert [m["adaptive"] for m in one["models"]] == [
        m["adaptive"]
        | {
            "asked": {"hle_multichoice": STOPPED_AT[m["model"]]},
            "index": None,
            "metrics": {
                "hle_multichoice.accuracy": m["adaptive"]["metrics"]["hle_multichoice.accuracy"]
            },
            "fixed_sample_ci": {
                "index": None,
                "hle_multichoice.accuracy": m["adaptive"]["fixed_sample_ci"][
                    "hle_multichoice.accuracy"
                ],
            },
        }
        for m in s["models"]
    ]
    text = _printed(tmp_path / "hle")
    assert (
        "its figures (marked ≈) are estimates of the whole set, computed over the questions it was "
        "asked (a run without --until asks the others). Their 95% intervals are the anytime-valid "
        "ones, which hold although the run chose when to stop, and their rank intervals and tied "
        "groups cover them; a pair with such a model claims a difference only where both the "
        "anytime-valid interval of its index difference leaves 0 out (the order on the whole set, "
        "valid after stopping) and its ordinary p-value over the questions asked separates it "
        "(the claim beyond the set every other pair makes), and no difference of a metric. "
        "Not scored here: "
        "aa_omniscience_decision, when2call, wildguardtest, so no whole-set index is shown (the "
        "run's is over every evaluation it asked: its summary.json has it); each model's questions "
        "asked of the evaluations scored, and what stopped it:"
    ) in text
    assert "│ systemone:m50 │ 20 of 40 (50%) │ — │ — │ precision=20 │ " in text
    # the report's and dxi view's sentence
    from dxi.scoring import adaptive, records

    assert adaptive.sentences(records.decode((tmp_path / "hle" / "summary.json").read_bytes()))[
        2
    ] == (
        "systemone:m50: asked 20 of 40 (50%); whole-set index not shown; stopped by precision=20 after round 8."
    )
    assert dxi_score(server_url, data, cache, tmp_path / "ten", THREE, "--limit", "39") == 1
    limited = summary(tmp_path / "ten")
    assert "adaptive" not in limited and all("adaptive" not in m for m in limited["models"])
    assert limited["models"][1]["evals"]["hle_multichoice"]["n"] == 39
    # a run without --until completes them: exactly an ordinary run's summary, and so is `dxi
    # score` after it
    assert dxi_run(server.url, data, cache, tmp_path / "full", models=THREE) == 0
    full = summary(tmp_path / "full")
    assert dxi_run(server.url, data, tmp_path / "plain", tmp_path / "plain-out", models=THREE) == 0
    plain = summary(tmp_path / "plain-out")
    assert "adaptive" not in full and timeless(figures(full)) == timeless(figures(plain))
    assert [m["requests"]["sent"] for m in full["models"]] == [
        4 * (SMALL - STOPPED_AT[m]) for m in STOPPED_AT
    ]
    assert all(b["n"] == SMALL for m in full["models"] for b in m["evals"].values())
    assert dxi_score(server_url, data, cache, tmp_path / "rescored", models=THREE) == 0
    assert figures(summary(tmp_path / "rescored")) == figures(full)


def test_a_failed_answer_inside_the_asked_part_keeps_its_bounds(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(DATA_ENV, str(data))
    cache = tmp_path / "cache"
    # one request at a time: the first one (m00's first task of round 1) is refused for good
    with serve(model=None, route_factories=ROUTE, record=False, script=["400"]) as server:
        code = dxi_run(
            server.url, data, cache, tmp_path / "out", *UNTIL, "--max-in-flight", "1", models=THREE
        )
        url = server.url
    s = summary(tmp_path / "out")
    assert code == 1 and (s["complete"], s["accepted"]) == (False, False)
    failed = [
        (m["model"], name, b)
        for m in s["models"]
        for name, b in m["evals"].items()
        if b.get("failed")
    ]
    assert len(failed) == 1
    label, name, block = failed[0]
    asked = s["models"][[m["model"] for m in s["models"]].index(label)]["adaptive"]["asked"]
    # over the part asked, the failed answer left out and bounded; nothing missing
    assert (block["n"], block["failed"], block["missing"], block["complete"]) == (
        asked[name],
        1,
        0,
        False,
    )
    metric = next(k[: -len("_bounds")] for k in block if k.endswith("_bounds"))
    low, high = block[f"{metric}_bounds"]
    assert low <= block[metric] <= high and low < high
    assert all(
        b["missing"] == 0 and (b["complete"] or (m["model"], n) == (label, name))
        for m in s["models"]
        for n, b in m["evals"].items()
    )
    # dxi score: the same figures, and exit 1 (a failed answer, as for any run)
    assert dxi_score(url, data, cache, tmp_path / "scored", models=THREE) == 1
    assert figures(summary(tmp_path / "scored")) == figures(s)


def test_the_progress_bars_count_what_the_rounds_ask(
    data: Path, server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    totals: list[dict[str, int]] = []  # what each round_totals call gave
    last: dict[str, tuple[int, str]] = {}  # each model's last count and line
    round_totals, update = (
        progress_module.RunProgress.round_totals,
        progress_module.RunProgress.update,
    )

    def recording_totals(self, given, rounds):
        totals.append(dict(given))
        round_totals(self, given, rounds)

    def recording_update(self, label, stats):
        update(self, label, stats)
        last[label] = (stats.done, self.line(label, stats))

    monkeypatch.setattr(progress_module.RunProgress, "round_totals", recording_totals)
    monkeypatch.setattr(progress_module.RunProgress, "update", recording_update)
    args = ["run", "--data-dir", str(data), "--cache-dir", str(tmp_path / "cache")]
    from dxi.runner.cli import main

    models = [a for m in THREE for a in ("--model", f"systemone:{m}@{server.url}")]
    assert main([*args, *models, "--out", str(tmp_path / "out"), *UNTIL]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "): at most 480 requests (--until precision=20: each model stops when settled);" in out
    # before each round, each model's total grows by the round's requests (4 evaluations); a model
    # that stopped keeps its last total. The rounds' targets: replayed by hand (aimed rounds)
    names = Suite(discover(data)).selected()
    targets: list[dict[str, int]] = []
    order_file = Path(summary(tmp_path / "out")["adaptive"]["order"])
    replay(data, tmp_path / "cache", Until("precision", 20), order_file, targets=targets)
    asked, expected, running = 0, [], dict(STOPPED_AT)
    planned = dict.fromkeys(STOPPED_AT, 0)
    for target in targets:
        more = target[names[0]] - asked
        for label in running:
            planned[label] += 4 * more
        expected.append(dict(planned))
        asked = target[names[0]]
        running = {label: n for label, n in running.items() if n > asked}
    assert totals == expected
    assert totals[-1] == {label: 4 * n for label, n in STOPPED_AT.items()}
    # each bar ends full (the whole set's totals, counted during the run, are passed over), its
    # line naming the round it finished (never "done" for the run)
    rounds = {"systemone:m00": 3, "systemone:m50": 8, "systemone:m100": 6}
    for label, (done, line) in last.items():
        assert done == 4 * STOPPED_AT[label]
        assert line.startswith(f"{done}/{done} 100% ") and f" round {rounds[label]} done " in line


def test_the_terminal_the_report_and_dxi_view_mark_a_stopped_model_s_figures(
    data: Path, server, tmp_path: Path
):
    """``--until precision=4``: m00 stops after 31 tasks of each evaluation, m50 and m100 are asked
    all 40 (exact figures, unmarked)."""
    import io

    from rich.console import Console

    from dxi.runner import rescore
    from dxi.runner.outputs.terminal import print_summary
    from dxi.runner.planning.inputs import PlanInputs
    from dxi.scoring import records

    cache = tmp_path / "cache"
    assert (
        dxi_run(server.url, data, cache, tmp_path / "out", "--until", "precision=4", models=THREE)
        == 0
    )
    s = records.decode((tmp_path / "out" / "summary.json").read_bytes())
    assert [sum(m.adaptive["asked"].values()) for m in s.models] == [4 * 31, 4 * 40, 4 * 40]
    m00 = s.models[0]
    # m00 never answers right: every figure 0.0 (Omniscience's non-hallucination rate too: it never
    # abstains), marked; the others exact
    marked = ["≈0.0"] * 6
    console = Console(file=io.StringIO(), width=300, record=True)
    print_summary(s, console)
    text = console.export_text()
    row = next(line for line in text.splitlines() if "systemone:m00 " in line)
    assert [c.strip() for c in row.split("│")[2:10] if c.strip().startswith("≈")] == marked
    for label in ("systemone:m50 ", "systemone:m100 "):
        assert "≈" not in next(line for line in text.splitlines() if line.startswith(f"│ {label}"))
    assert "its figures (marked ≈) are estimates of the whole set" in " ".join(text.split())
    assert m00.decision_index == 0.0
    # the report: the index table and each evaluation's table
    done = rescore.rescore(
        rescore.select(PlanInputs(data_dir=data, cache_dir=cache, out=tmp_path / "report")),
        html=True,
    )
    page = (tmp_path / "report" / "report.html").read_text()
    # the index table (the index and its 5 terms), the evaluations' tables (2 + 1 + 1 + 4 metrics)
    assert done.exit_code == 0 and page.count("≈0.0") == 6 + 8
    assert page.count("≈") == 14 + 1 + 1  # and the note, and the interval legend
    # dxi view's overview: m00's index and its 8 metrics (2 + 1 + 1 + 4)
    html = overview(data, cache)
    assert html.count('class="estimate"') == 1 + 8


def test_asked_part_cuts_each_model_to_its_part_unless_a_later_run_completed_it():
    """``scoring.adaptive.asked_part`` on a frame made by hand: two models, two evaluations of
    three tasks; "a" was asked t1 of e1 and t1, t2 of e2; "b" t1 of e1 only."""
    import polars as pl

    from dxi.scoring.adaptive import asked_part

    rows = [
        # label, eval, task, status
        ("a", "e1", "t1", "ok"),
        ("a", "e1", "t2", "missing"),
        ("a", "e1", "t3", "missing"),
        ("a", "e2", "t1", "failed"),  # inside its part: kept (bounds)
        ("a", "e2", "t2", "missing"),  # inside its part: kept (provisional)
        ("a", "e2", "t3", "ok"),  # outside, and the only question outside: a later run did it
        ("b", "e1", "t1", "ok"),
        ("b", "e1", "t2", "ok"),  # a later run asked more, not all: still cut
        ("b", "e1", "t3", "missing"),
        ("b", "e2", "t1", "missing"),  # "b" has no part of e2: left whole
    ]
    frame = pl.DataFrame(rows, schema=["label", "eval", "task_id", "status"], orient="row")
    frame = frame.with_columns(pl.col("label").cast(pl.Enum(["a", "b"])))
    asked = {"a": {"e1": ["t1"], "e2": ["t1", "t2"]}, "b": {"e1": ["t1"]}}
    kept, cut = asked_part(frame, asked)
    assert kept.rows() == [rows[i] for i in (0, 3, 4, 5, 6, 9)]
    assert cut == {("a", "e1"), ("b", "e1")}
    assert kept.schema == frame.schema
    # always (the rounds): every part cut, whatever the cache holds beyond it
    kept, cut = asked_part(frame, asked, always=True)
    assert kept.rows() == [rows[i] for i in (0, 3, 4, 6, 9)]
    assert cut == {("a", "e1"), ("a", "e2"), ("b", "e1")}
    # nothing asked of anyone: the frame itself
    assert asked_part(frame, {}) == (frame, set())


EXACT_NOTE = (
    "no model's figures are estimates: each model was asked the whole set, or the cache held the "
    "questions the rule stopped before, so its figures are exact, computed over the whole set. "
    "Each model's whole-set index:"
)


def test_an_adaptive_run_over_a_cache_holding_the_whole_set_is_exact_and_dxi_score_agrees(
    data: Path, server, tmp_path: Path
):
    """A plain run fills the cache; the adaptive run after it stops each model where it would
    (``STOPPED_AT``), but its figures are over the whole set the cache holds: exact, unmarked, and
    its table says so; ``dxi score`` of the cache prints the same summary."""
    cache = tmp_path / "cache"
    assert dxi_run(server.url, data, cache, tmp_path / "plain", models=THREE) == 0
    assert dxi_run(server.url, data, cache, tmp_path / "out", *UNTIL, models=THREE) == 0
    plain, s = summary(tmp_path / "plain"), summary(tmp_path / "out")
    for p, m in zip(plain["models"], s["models"], strict=True):
        assert m["adaptive"]["asked"] == dict.fromkeys(
            s["adaptive"]["populations"], STOPPED_AT[m["model"]]
        )
        assert m["adaptive"]["exact"] is True and m["adaptive"]["rule"] == "precision=20"
        assert m["decision_index"] == p["decision_index"]
        assert {n: b["n"] for n, b in m["evals"].items()} == dict.fromkeys(m["evals"], SMALL)
        # its whole-set index is the exact figure, an interval of zero width (the estimate at
        # stopping kept apart); its headline intervals are the plain run's
        di = p["decision_index"]
        assert m["adaptive"]["index"] == {"point": di, "low": di, "high": di}
        assert m["adaptive"]["metrics"] == {
            key: dict.fromkeys(
                ("point", "low", "high"), p["evals"][key.split(".")[0]][key.split(".")[1]]
            )
            for key in m["adaptive"]["estimate_at_stopping"]["metrics"]
        }
        assert len(m["adaptive"]["metrics"]) == 8
        assert m["adaptive"]["estimate_at_stopping"]["index"]["low"] < di or di == 0.0
        assert m["decision_index_ci"] == p["decision_index_ci"]
        assert "fixed_sample_ci" not in m["adaptive"]
    # by hand: m00 never right (0.0), m100 always (100.0)
    assert [s["models"][i]["adaptive"]["index"]["point"] for i in (0, 2)] == [0.0, 100.0]
    text = _printed(tmp_path / "out")
    assert "≈" not in text and EXACT_NOTE in text and "a model stopped before the end" not in text
    assert "Adaptive run: exact figures over the whole set" in text
    for m in s["models"]:
        asked = 4 * STOPPED_AT[m["model"]]
        assert (
            f"{m['model']} │ {asked} of 160 ({100 * asked / 160:.0f}%) │ "
            f"{m['decision_index']:.1f} │ exact: whole set scored │ precision=20 │"
        ) in text
    assert dxi_score(server.url, data, cache, tmp_path / "scored", THREE) == 0
    assert figures(summary(tmp_path / "scored")) == figures(s)
    assert _printed(tmp_path / "scored") == text.replace(
        str(tmp_path / "out"), str(tmp_path / "scored")
    )


def test_the_estimates_note_is_printed_only_when_some_figures_are_estimates(
    data: Path, server, tmp_path: Path
):
    """``precision=0.1`` on 40 tasks: every model is asked everything (exhausted), its figures
    exact: the exact note, never the estimates'; ``precision=20``: the models stop early, the
    estimates' note."""
    cache = tmp_path / "cache"
    assert (
        dxi_run(server.url, data, cache, tmp_path / "all", "--until", "precision=0.1", models=THREE)
        == 0
    )
    s = summary(tmp_path / "all")
    assert {m["adaptive"]["rule"] for m in s["models"]} == {"exhausted"}
    text = _printed(tmp_path / "all")
    assert (
        "Adaptive run (--until precision=0.1, order seed 0, " in text
        and EXACT_NOTE in text
        and "marked ≈" not in text
        and "≈" not in text
    )
    assert (
        dxi_run(server.url, data, tmp_path / "cache2", tmp_path / "part", *UNTIL, models=THREE) == 0
    )
    text = _printed(tmp_path / "part")
    assert (
        EXACT_NOTE not in text
        and (
            "a model stopped before the end was asked a random part of each evaluation, so its figures "
            "(marked ≈) are estimates of the whole set"
        )
        in text
    )


def test_dxi_view_says_a_question_beyond_the_asked_part_was_not_asked(
    data: Path, server, tmp_path: Path
):
    """``precision=4``: m00 is asked 31 of the 40 tasks of each evaluation (the others all 40);
    the task page of one beyond its part says m00 was not asked it, never that it is missing."""
    import html as html_module

    cache = tmp_path / "cache"
    args = ("--until", "precision=4")
    assert dxi_run(server.url, data, cache, tmp_path / "out", *args, models=THREE) == 0
    s = summary(tmp_path / "out")
    order = orjson.loads(Path(s["adaptive"]["order"]).read_bytes())["evals"]
    asked, beyond = order["hle_multichoice"][0], order["hle_multichoice"][31]
    text = " ".join(html_module.unescape(page(data, cache, f"/task/{beyond}")).split())
    assert text.count("not asked by the adaptive run: its rule stopped before this question") == 1
    assert (
        text.count(
            "not asked by the adaptive run (its rule stopped before this question): a run without "
            "<code>--until</code> sends it"
        )
        == 1
    )
    assert "not in the answers" not in text and "not in the cache (missing)" not in text
    inside = " ".join(html_module.unescape(page(data, cache, f"/task/{asked}")).split())
    assert "not asked" not in inside and "not in the cache (missing)" not in inside


def test_dxi_view_lists_a_question_no_model_was_asked_as_not_asked_by_every_model(
    data: Path, server, tmp_path: Path
):
    """``precision=20``: the models stop after 7, 20 and 15 of the 40 tasks of each evaluation
    (one question each), so the last 20 of the run's order were asked by none. The evaluation page
    lists all 40 (not the 20 some model was asked), those 20 ``not asked`` for every model; each
    model's ``not asked`` filter keeps 40 - its part (33, 20, 25), none is missing."""
    from dxi.runner import rescore
    from dxi.runner.planning.inputs import PlanInputs
    from dxi.view.data import EvalQuery
    from dxi.view.home import private_home

    cache = tmp_path / "cache"
    assert dxi_run(server.url, data, cache, tmp_path / "out", *UNTIL, models=THREE) == 0
    order = orjson.loads(Path(summary(tmp_path / "out")["adaptive"]["order"]).read_bytes())
    never = set(order["evals"]["hle_multichoice"][20:])
    browser, _ = rescore.browse(
        rescore.select(PlanInputs(data_dir=data, cache_dir=cache)), private_home()
    )
    browser.source.owns_home = True
    try:

        def listed(**q) -> list[dict]:
            page = browser.evaluation("hle_multichoice", EvalQuery(**q))
            assert page.pages == 1
            return page.rows

        tasks = {t.id: t for t in Suite(discover(data)).tasks("hle_multichoice")}
        rows = listed()
        assert len(rows) == 40 and len(never) == 20
        assert {r["task_id"] for r in rows if r["task_id"] in never} == never
        for r in rows:
            assert r["gold"] == tasks[r["task_id"]].gold[r["question_id"]]
            if r["task_id"] in never:
                assert [c["status"] for c in r["models"]] == ["not asked"] * 3
                assert [c["correct"] for c in r["models"]] == [None] * 3
        assert len(listed(status="not asked")) == 33  # any model's: m00 asked 7
        assert [len(listed(model=m, status="not asked")) for m in STOPPED_AT] == [33, 20, 25]
        assert listed(status="missing") == []
    finally:
        browser.close()


def test_pairs_compare_only_the_questions_both_models_were_asked(
    data: Path, server, tmp_path: Path
):
    """``precision=4``: m00 is asked 31 of the 40 HLE questions, m50 and m100 all 40. A question
    m00 was never asked is not a wrong answer of it: summary.json's m00-m50 accuracy pair has no
    McNemar test (their parts differ), m50-m100's has the one the answers give by hand (``knows``);
    ``dxi view``'s compare page counts its 2×2 over the 31 questions both were asked and lists
    none of the other 9 as a difference."""
    import html as html_module
    from urllib.parse import quote

    from scipy.stats import binomtest

    cache = tmp_path / "cache"
    assert (
        dxi_run(server.url, data, cache, tmp_path / "out", "--until", "precision=4", models=THREE)
        == 0
    )
    s = summary(tmp_path / "out")
    order = orjson.loads(Path(s["adaptive"]["order"]).read_bytes())["evals"]["hle_multichoice"]
    asked = {m["model"]: m["adaptive"]["asked"]["hle_multichoice"] for m in s["models"]}
    a, b, c = "systemone:m00", "systemone:m50", "systemone:m100"
    assert (asked[a], asked[b], asked[c]) == (31, 40, 40)
    hle = {
        frozenset((x["a"], x["b"])): x
        for x in s["comparisons"]
        if x["eval"] == "hle_multichoice" and x["metric"] == "accuracy"
    }
    assert "discordant" not in hle[frozenset((a, b))] and "mcnemar_p" not in hle[frozenset((a, b))]
    bc = hle[frozenset((b, c))]
    first, second = (bc["a"], bc["b"])
    only = [
        sum(knows(x[10:], t, "answer") and not knows(y[10:], t, "answer") for t in order)
        for x, y in ((first, second), (second, first))
    ]
    assert bc["discordant"] == only
    assert bc["mcnemar_p"] == pytest.approx(binomtest(min(only), sum(only)).pvalue, abs=5e-4)
    # the view: a 2×2 over the 31 questions m00 was asked
    part = order[:31]
    cells = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for t in part:
        cells[(knows("m00", t, "answer"), knows("m50", t, "answer"))] += 1
    text = " ".join(
        html_module.unescape(
            page(data, cache, f"/compare/hle_multichoice?a={quote(a)}&b={quote(b)}")
        ).split()
    )
    assert (
        f"McNemar's exact test on the discordant answers ({cells[(True, False)]} A only, "
        f"{cells[(False, True)]} B only)"
    ) in text
    assert not any(t in text for t in order[31:]) and "miss." not in text
    assert (
        "An adaptive run asked these two models different parts of the set: the 2×2 and its test "
        "count the questions both were asked (9 more were asked of one only), while each figure "
        "below is over its own model's part, with no McNemar test between parts that differ."
    ) in text


def test_an_adaptive_run_that_did_not_finish_is_found_from_its_journal_and_outcomes(
    tmp_path: Path,
):
    """``unfinished``: an order of the tasks scored whose journal has lines after the latest
    outcome naming it (or that no outcome names) is a run that did not end; its rule is the latest
    line's, its rounds the highest of those lines for that rule."""
    from dxi.runner.outputs.adaptive import ORDER_DIR, OUTCOMES, Unfinished, unfinished

    folder = tmp_path / ORDER_DIR
    folder.mkdir()
    tasks = {"a": {"a/1", "a/2"}, "b": {"b/1"}}
    order = folder / "order-0123456789abcdef.json"
    order.write_bytes(orjson.dumps({"seed": 7, "evals": {"a": ["a/2", "a/1"], "b": ["b/1"]}}))
    journal = folder / "decisions-0123456789abcdef.jsonl"
    outcomes = folder / OUTCOMES

    def lines(path: Path, *docs: dict) -> None:
        path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))

    # stopped before its first round ended: an order, no journal, no outcome
    left = unfinished(tmp_path, tasks)
    assert left == Unfinished(None, 7, 0)
    assert left.line() == (
        "An adaptive run over this cache did not finish (no round finished): rerunning the same "
        "`dxi run ... --until ... --seed 7` command continues it; until then the figures here are "
        "over every task, the questions it has not asked counted missing (provisional)"
    )
    # a precision=5 run that ended (its outcome after its last line), then a separated run
    # stopped after its round 2 (a torn last line passed over)
    lines(
        journal,
        {"at": 10.0, "until": "precision=5", "round": 1, "settled": {}},
        {"at": 11.0, "until": "precision=5", "round": 2, "settled": {}},
        {"at": 20.0, "until": "separated=1", "round": 1, "settled": {}},
        {"at": 21.0, "until": "separated=1", "round": 2, "settled": {}},
    )
    journal.write_bytes(journal.read_bytes() + b'{"at": 22.0, "unt')
    lines(outcomes, {"at": 12.0, "order": str(order), "rounds": 2, "models": []})
    assert unfinished(tmp_path, tasks) == Unfinished("separated=1", 7, 2)
    assert unfinished(tmp_path, {"a": tasks["a"]}) == Unfinished("separated=1", 7, 2)
    assert (
        Unfinished("separated=1", 7, 2)
        .line()
        .startswith(
            "An adaptive run over this cache did not finish (--until separated=1: its journal has 2 "
            "rounds): rerunning the same `dxi run ... --until separated=1 --seed 7` command"
        )
    )
    assert Unfinished("precision=5", 0, 1).hint() == (
        "rerunning the adaptive run that did not finish (`dxi run ... --until precision=5`) "
        "continues it"
    )
    # its outcome too: every run over the order ended
    lines(
        outcomes,
        {"at": 12.0, "order": str(order), "rounds": 2, "models": []},
        {"at": 23.0, "order": str(order), "rounds": 2, "models": []},
    )
    assert unfinished(tmp_path, tasks) is None
    # other tasks scored (another selection): not this order's run
    outcomes.unlink()
    assert unfinished(tmp_path, tasks) == Unfinished("separated=1", 7, 2)
    assert unfinished(tmp_path, {"a": {"a/1"}}) is None
    assert unfinished(tmp_path, {"c": {"c/1"}}) is None


def test_models_of_two_adaptive_runs_are_each_described_by_their_own_run():
    """``dxi score`` of a cache where one model was last run under ``precision=10`` (seed 0, 3
    rounds) and another later under ``precision=8 --seed 3`` (4 rounds, unsettled): the top
    block is the latest run's and lists both runs with their models; the note describes each
    run with its models, and the line about the unsettled model names its own run's command."""
    from dxi.runner.outputs.adaptive import Recorded, attach
    from dxi.scoring.adaptive import note, unsettled

    from .helpers import records

    populations = {"hle_multichoice": 10}
    first = {"at": 1.0, "until": "precision=10", "seed": 0, "rounds": 3, "order": "o0.json"}
    later = {"at": 2.0, "until": "precision=8", "seed": 3, "rounds": 4, "order": "o3.json"}
    blocks = {
        "a": {"asked": {"hle_multichoice": 4}, "settled": True, "rule": "precision=10"},
        "b": {"asked": {"hle_multichoice": 6}, "settled": False, "rule": None},
    }
    record = Recorded(
        top={"a": first | {"populations": populations}, "b": later | {"populations": populations}},
        blocks=blocks,
        parts={},
    )
    summary = records.summary([records.entry(m, 30.0) for m in ("b", "a")])
    attach(summary, record, {("a", "hle_multichoice"), ("b", "hle_multichoice")})
    assert summary.adaptive == {
        "until": "precision=8",
        "seed": 3,
        "rounds": 4,
        "order": "o3.json",
        "populations": populations,
        "runs": [
            {"until": "precision=10", "seed": 0, "rounds": 3, "order": "o0.json", "models": ["a"]},
            {"until": "precision=8", "seed": 3, "rounds": 4, "order": "o3.json", "models": ["b"]},
        ],
    }
    assert note(summary).startswith(
        "Adaptive runs (2, each model's latest: --until precision=10, order seed 0, 3 rounds: a; "
        "--until precision=8, order seed 3, 4 rounds: b): a model stopped before the end"
    )
    assert unsettled(summary) == (
        "1 model was not settled when the adaptive run ended (--until precision=8; b): rerunning "
        "the same `dxi run ... --until precision=8 --seed 3` command continues it (with a higher "
        "--max-cost, if the cost bound stopped it); until then its figures are estimates over "
        "what it was asked"
    )
    blocks["a"]["settled"] = False  # both unsettled: each with its own run's command
    assert unsettled(summary) == (
        "2 models were not settled when the adaptive runs ended (--until precision=8: b; --until "
        "precision=10: a): rerunning the same command continues each (`dxi run ... --until "
        "precision=8 --seed 3` for b; `dxi run ... --until precision=10` for a) (with a higher "
        "--max-cost, if the cost bound stopped one); until then their figures are estimates over "
        "what they were asked"
    )
    # both models of one run: no ``runs`` list, the run's own note
    both = Recorded(top={"a": record.top["b"], "b": record.top["b"]}, blocks=blocks, parts={})
    summary.adaptive = None
    attach(summary, both, {("a", "hle_multichoice"), ("b", "hle_multichoice")})
    assert "runs" not in summary.adaptive and note(summary).startswith(
        "Adaptive run (--until precision=8, order seed 3, 4 rounds): a model stopped"
    )


def test_the_hint_of_an_unfinished_adaptive_run_reaches_a_reason_with_a_note_after_it():
    """WildGuardTest's reason goes on after its hint ("...; `dxi run` with --sample 20 sends what is
    missing; f1_response_harm: undefined ..."): the rewrite to the adaptive rerun took only a reason
    ending in the hint, so this one still told the user to send the whole set (trial 8)."""
    from types import SimpleNamespace

    from dxi.runner.outputs.adaptive import Unfinished, hint_unfinished
    from dxi.scoring.records import UNSET

    note = "; f1_response_harm: undefined (no positive gold label and no positive prediction)"
    reasons = {
        "when2call": "12 missing (not sent); `dxi run` with --sample 20 sends what is missing",
        "wildguardtest": f"12 missing (not sent); `dxi run` with --sample 20 sends what is missing{note}",
        "hle_multichoice": "12 missing (not sent); `dxi run` with --sample 20 sends what is missingly",
    }
    model = SimpleNamespace(
        adaptive=UNSET,
        evals={name: {"missing": 12, "reason": reason} for name, reason in reasons.items()},
    )
    hint_unfinished(SimpleNamespace(models=[model]), Unfinished("precision=3", 0, 1))
    rerun = (
        "12 missing (not sent); rerunning the adaptive run that did not finish (`dxi run ... "
        "--until precision=3`) continues it, or `dxi run` with --sample 20 sends every missing "
        "answer"
    )
    assert {name: block["reason"] for name, block in model.evals.items()} == {
        "when2call": rerun,
        "wildguardtest": rerun + note,
        "hle_multichoice": reasons["hle_multichoice"],  # not the hint's words: left alone
    }


def test_the_intervals_methods_name_an_adaptive_runs_anytime_valid_intervals_and_their_sources(
    data: Path, server, tmp_path: Path
):
    """summary.json's ``intervals.methods`` and the report's interval legend name the anytime-valid
    intervals an adaptive run publishes (the headline intervals of its ≈ figures, each model's
    whole-set index), with their sources, after the fixed-sample ones (they named the fixed-sample
    ones only); ``dxi score`` of its cache too. A run without --until names the fixed-sample ones
    only (so tests/fixtures/summary_realistic.json stays byte for byte: tests/test_records)."""
    from markupsafe import escape

    from dxi.runner import rescore
    from dxi.runner.planning.inputs import PlanInputs

    cache = tmp_path / "cache"
    assert dxi_run(server.url, data, cache, tmp_path / "out", *UNTIL, models=THREE) == 0
    fixed = [
        "accuracy",
        "non_hallucination_rate",
        "f1_prompt_harm",
        "f1_response_refusal",
        "f1_response_harm",
        "mean_f1",
        "decision_index",
        "brier",
        "ece",
        "log_loss",
        "auroc",
        "differences",
    ]
    index = (
        "anytime-valid confidence sequence of the whole-set index (sampling without replacement): "
        "the empirical-Bernstein sequence across the four evaluations (Howard, Ramdas, McAuliffe "
        "& Sekhon 2021) intersected with the weighted sum of the metrics' betting confidence "
        "sequences (Waudby-Smith & Ramdas 2020, NeurIPS 33), at the round the adaptive run "
        "stopped the model"
    )
    metric = (
        "anytime-valid confidence sequence of the whole-set value (sampling without "
        "replacement): the betting confidence sequence of Waudby-Smith & Ramdas (2020, "
        '"Confidence sequences for sampling without replacement", NeurIPS 33), a ratio by '
        "inverting a test, simultaneous over the model's metrics (Bonferroni), at the round the "
        "adaptive run stopped the model"
    )
    methods = summary(tmp_path / "out")["intervals"]["methods"]
    assert list(methods) == [*fixed, "anytime_index", "anytime_metric"]
    assert (methods["anytime_index"], methods["anytime_metric"]) == (index, metric)
    assert dxi_score(server.url, data, cache, tmp_path / "scored", THREE) == 0
    assert summary(tmp_path / "scored")["intervals"]["methods"] == methods
    html = {k: str(escape(v)) for k, v in methods.items()}  # as the report writes them
    legend = (
        "An adaptive run's figures marked ≈ (estimates of the whole set) have instead, as each "
        "model's whole-set index in its note, an anytime-valid 95% interval, which holds although "
        f"the run chose when to stop: for the Decision Index, the {html['anytime_index']}; for "
        "accuracy, the non-hallucination rate, each F1 and mean F1, the "
        f"{html['anytime_metric']}.\nWildGuardTest's three F1 scores are in its section."
    )
    for out, until in ((tmp_path / "report", True), (tmp_path / "plain-report", False)):
        if not until:  # a run without --until completes the models: no adaptive run's summary
            assert dxi_run(server.url, data, cache, tmp_path / "plain", models=THREE) == 0
            plain = summary(tmp_path / "plain")["intervals"]["methods"]
            assert list(plain) == fixed
        inputs = PlanInputs(data_dir=data, cache_dir=cache, out=out)
        rescore.rescore(rescore.select(inputs), html=True)
        page = (out / "report.html").read_text()
        assert page.count(legend) == until, until
        assert page.count("anytime-valid confidence sequence") == 2 * until, until
