"""Adaptive runs, the runner's side (issue 35; docs/adaptive.md): the seeded stratified order
recorded in the cache (``runner.adaptive.order``), ``--until`` and the run file's ``until`` checked
when parsed, the rounds (``runner.adaptive.rounds``) against a loopback System One server whose ten
models have known per-question answers (``tests.helpers.adaptive_models``): each model stops exactly
where ``scoring.sequential.standings`` says when the rounds are replayed by hand from the recorded
order and the cache's answers; a kill -9 between two rounds loses nothing and the rerun asks the
same sequence without sending anything twice; ``--max-cost`` and ``--batch`` combine with it; a
later run without ``--until`` completes the models from where they stopped."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from dxi.evals import Suite, discover
from dxi.runner import rescore
from dxi.runner.adaptive.order import Order, PrefixSuite, digest, order_of, ordered
from dxi.runner.cli import main
from dxi.runner.errors import EXIT_COST_BOUND, UsageError
from dxi.runner.outputs.adaptive import ORDER_DIR
from dxi.runner.planning import plan
from dxi.runner.planning.inputs import PlanInputs
from dxi.runner.planning.sample import stratum
from dxi.scoring import records
from dxi.scoring.sequential import Until, round_sizes

from .fakes.fake_provider import serve
from .helpers import synthetic
from .helpers.adaptive_models import DATA_ENV, MODELS, write_data
from .helpers.adaptive_runs import (
    ROUTE,
    dxi_run,
    dxi_score,
    figures,
    overview,
    replay,
    served,
    summary,
)
from .helpers.runs import dxi_args
from .helpers.servers import free_port

N = 100  # tasks of each evaluation: 400 in all, so each model asks between 16 and 400


# ---- the order
# ------------------------------------------------------------------------------------------


def _rank(seed: int, task_id: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{task_id}".encode()).digest()


def test_an_evaluation_s_order_is_its_tasks_by_their_seeded_hash():
    tasks = synthetic.suite({"when2call": 50})
    expected = [t.id for t in sorted(tasks, key=lambda t: _rank(7, t.id))]
    assert ordered(tasks, 7, stratified=False) == expected
    assert ordered(list(reversed(tasks)), 7, stratified=False) == expected  # not the file's order
    assert ordered(tasks, 8, stratified=False) != expected


def test_every_prefix_of_wildguardtest_keeps_its_label_mix_within_one_task():
    tasks = synthetic.suite({"wildguardtest": 240})
    order = ordered(tasks, 3, stratified=True)
    by_id = {t.id: t for t in tasks}
    sizes = Counter(stratum(t) for t in tasks)
    assert sorted(order) == sorted(by_id) and len(sizes) >= 5
    seen: Counter[str] = Counter()
    for n, task_id in enumerate(order, 1):
        seen[stratum(by_id[task_id])] += 1
        for s, size in sizes.items():
            assert abs(seen[s] - n * size / len(tasks)) < 1, (n, s)
    for s in sizes:  # within a stratum: the seeded hash order
        mine = [i for i in order if stratum(by_id[i]) == s]
        assert mine == sorted(mine, key=lambda i: _rank(3, i))


def test_the_order_is_recorded_in_the_cache_and_read_back(tmp_path: Path):
    data = write_data(tmp_path / "data", 12)
    suite = Suite(discover(data))
    first = order_of(suite, 5, tmp_path / "cache")
    ids = {n: [t.id for t in suite.tasks(n)] for n in suite.selected()}
    assert first.path == tmp_path / "cache" / ORDER_DIR / f"order-{digest(5, ids)}.json"
    assert orjson.loads(first.path.read_bytes()) == {
        "seed": 5,
        "evals": {n: list(s) for n, s in first.evals.items()},
    }
    assert first.populations() == dict.fromkeys(suite.selected(), 12)
    # what is recorded is what a later run asks (a valid order written by an earlier version, say)
    doc = orjson.loads(first.path.read_bytes())
    doc["evals"]["when2call"].reverse()
    first.path.write_bytes(orjson.dumps(doc))
    again = order_of(suite, 5, tmp_path / "cache")
    assert again.evals["when2call"] == tuple(reversed(first.evals["when2call"]))
    # a record that does not hold exactly these tasks is made again; another seed is another file
    doc["evals"]["when2call"] = doc["evals"]["when2call"][:-1]
    first.path.write_bytes(orjson.dumps(doc))
    assert order_of(suite, 5, tmp_path / "cache").evals == first.evals
    assert order_of(suite, 6, tmp_path / "cache").path != first.path
    # no temporary
    assert sorted(p.name.startswith(".") for p in first.path.parent.iterdir()) == [False, False]


def test_a_prefix_suite_streams_the_order_s_part_in_file_order(tmp_path: Path):
    suite = Suite(discover(write_data(tmp_path / "data", 10)))
    order = Order(
        0,
        {n: tuple(t.id for t in reversed(list(suite.tasks(n)))) for n in suite.selected()},
        tmp_path,
    )
    part = PrefixSuite.of(
        suite, order, dict.fromkeys(suite.selected(), 4), start={"hle_multichoice": 2}
    )
    got = [t.id for t in part.tasks()]
    assert got == [
        t.id
        for t in suite.tasks()
        if t.id
        in {
            i
            for n in suite.selected()
            for i in order.prefix(n, 4, 2 if n == "hle_multichoice" else 0)
        }
    ]
    assert len(got) == 14 and part.survey().tasks == {
        **dict.fromkeys(suite.selected(), 4),
        "hle_multichoice": 2,
    }


# ---- parsing
# -------------------------------------------------------------------------------------------


def test_until_is_checked_when_parsed(tmp_path: Path, capsys: pytest.CaptureFixture):
    data = write_data(tmp_path / "data", 4)
    base = dxi_args(data, tmp_path / "c", None, models=["embedded"])
    assert main([*base, "--until", "precision=0"]) == 2
    err = capsys.readouterr().err
    assert "--until" in err and "precision=P" in err and "separated=Δ" in err
    assert not (tmp_path / "c").exists()  # nothing was sent
    # separation needs two or more models: refused before anything is sent
    assert main([*base, "--until", "separated"]) == 2
    assert capsys.readouterr().err == (
        "dxi run: error: --until separated needs two or more models (it stops a model once its "
        "order against every other is known); this run has 1: give another --model, or use "
        "--until precision=P\n"
    )
    assert not (tmp_path / "c").exists()
    two = [*base, "--model", "embedded:sparrow-nano-robot-v1.2"]
    # Δ outside [0, 100] (index points): refused with the range, as dxi plan --tolerance
    for text in ("separated=1000", "separated=-1"):
        assert main([*two, "--until", text]) == 2
        assert capsys.readouterr().err == (
            f"dxi run: error: argument --until: '{text}': the tolerance Δ must be a "
            "number from 0 to 100 (index points); accepted forms: precision=P (e.g. "
            "precision=5), precision=P:all, separated, separated=Δ\n"
            "run 'dxi run --help' for the options\n"
        )
        assert not (tmp_path / "c").exists()
    assert main([*two, "--until", "separated", "--shard", "0/2"]) == 2
    assert "--until and --shard do not combine" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--until: 'fast'"):
        plan.build(models=["embedded"], data_dir=data, until="fast")
    # --seed: the order's seed
    p = plan.build(models=["embedded"], data_dir=data, until="separated", seed=3)
    assert (p.until, p.seed) == (Until("separated", 1.0), 3)
    with pytest.raises(UsageError, match="--seed is the seed of --sample"):
        plan.build(models=["embedded"], data_dir=data, seed=3)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'data_dir = "{data}"\nuntil = "precision"\n\n[[models]]\nprovider = "embedded"\n'
    )
    assert main(["run", str(run_file), "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert f"{run_file}, line 2: until: 'precision': expected one of" in " ".join(err.split())
    run_file.write_text(
        f'data_dir = "{data}"\nuntil = "separated=1000"\n\n[[models]]\nprovider = "embedded"\n'
    )
    assert main(["run", str(run_file), "--cache-dir", str(tmp_path / "c")]) == 2
    assert (
        f"{run_file}, line 2: until: 'separated=1000': the tolerance Δ must be a number "
        "from 0 to 100 (index points)"
    ) in " ".join(capsys.readouterr().err.split())
    run_file.write_text(
        f'data_dir = "{data}"\nuntil = "precision=2.5:all"\n\n[evals]\nseed = 4\n\n'
        '[[models]]\nprovider = "embedded"\n'
    )
    p = plan.build(run_file=run_file)
    assert (p.until, p.seed) == (Until("precision", 2.5, True), 4)
    # the flag first
    assert plan.build(run_file=run_file, until="separated=0.5").until == Until("separated", 0.5)


# ---- runs against the ten models
# ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("adaptive") / "data", N)


@pytest.fixture
def server(data: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(DATA_ENV, str(data))
    with serve(model=None, route_factories=ROUTE, record=False) as served:
        yield served


def estimate(e) -> dict:
    """An Estimate as summary.json's adaptive block writes it (4 decimals; None where unknown)."""
    pairs = (("point", e.point), ("low", e.low), ("high", e.high))
    return {k: None if v is None else round(float(v), 4) for k, v in pairs}


def test_a_run_file_s_separated_with_one_model_is_named_as_the_file_s(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    data = write_data(tmp_path / "data", 4)
    run_file = tmp_path / "one.toml"
    run_file.write_text(
        f'data_dir = "{data}"\nuntil = "separated"\n\n[[models]]\nprovider = "embedded"\n'
    )
    assert main(["run", str(run_file), "--cache-dir", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == (
        f'dxi run: error: until = "separated=1" ({run_file}) needs two or more models (it stops a '
        "model once its order against every other is known); this run has 1: give another model, "
        "or precision=P\n"
    )
    assert not (tmp_path / "c").exists()


def test_until_with_an_evaluation_left_out_is_refused_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """Every rule stops on the Decision Index, which needs all four evaluations: with one left out
    (``--evals``) or without data, ``--until`` could never stop a model and would pay for the whole
    set; it exits 2 naming each and why, and creates no cache."""
    data = write_data(tmp_path / "data", 4)
    base = dxi_args(data, tmp_path / "c", None, models=["embedded"])
    assert main([*base, "--until", "precision=5", "--evals", "hle_multichoice,when2call"]) == 2
    assert capsys.readouterr().err == (
        "dxi run: error: --until precision=5 stops on the Decision Index, which needs all four "
        "evaluations; aa_omniscience_decision: left out by --evals; wildguardtest: left out by "
        "--evals (run them all, or drop --until)\n"
    )
    assert not (tmp_path / "c").exists()
    for f in (data / "hle").iterdir():
        f.unlink()
    assert main([*base, "--until", "precision=5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "dxi run: error: --until precision=5 stops on the Decision Index, which needs all four "
        "evaluations; hle_multichoice: no "
    ) and err.endswith(" (run them all, or drop --until)\n")
    assert not (tmp_path / "c").exists()
    # without --until the same selection runs (its figures, no index)
    assert main([*base, "--evals", "when2call", "--out", str(tmp_path / "o"), "-q"]) == 0


def test_a_run_file_s_until_with_its_select_leaving_out_an_evaluation_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """The rule and the selection both from the run file (no flag given): the refusal names the
    file's key and its select, not --until, and says to remove the key; the flag over the same
    file is named as the flag."""
    data = write_data(tmp_path / "data", 4)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'data_dir = "{data}"\ncache_dir = "{tmp_path / "c"}"\nuntil = "precision=5"\n\n'
        '[evals]\nselect = ["hle_multichoice", "when2call", "wildguardtest"]\n\n'
        '[[models]]\nprovider = "embedded"\n'
    )
    assert main(["run", str(run_file)]) == 2
    assert capsys.readouterr() == (
        "",
        f'dxi run: error: until = "precision=5" ({run_file}) stops on the Decision Index, which '
        "needs all four evaluations; aa_omniscience_decision: left out by the [evals] select of "
        f"{run_file} (run them all, or remove until)\n",
    )
    assert main(["run", str(run_file), "--until", "precision=2"]) == 2
    assert capsys.readouterr().err == (
        "dxi run: error: --until precision=2 stops on the Decision Index, which needs all four "
        "evaluations; aa_omniscience_decision: left out by the [evals] select of "
        f"{run_file} (run them all, or drop --until)\n"
    )
    assert not (tmp_path / "c").exists()


def test_precision_stops_each_model_where_the_interval_says_and_a_plain_run_completes_them(
    data: Path, server, tmp_path: Path, capsys: pytest.CaptureFixture
):
    assert (
        dxi_run(server.url, data, tmp_path / "cache", tmp_path / "out", "--until", "precision=5")
        == 0
    )
    s = summary(tmp_path / "out")
    order_file = Path(s["adaptive"]["order"])
    raw = (tmp_path / "out" / "summary.json").read_bytes()
    # the adaptive blocks typed, read back byte for byte
    assert records.to_json(records.decode(raw)) == raw
    assert s["adaptive"] == {
        "until": "precision=5",
        "seed": 0,
        "rounds": s["adaptive"]["rounds"],
        "order": str(order_file),
        "populations": dict.fromkeys(evals_of(data), N),
    }
    by_hand = replay(data, tmp_path / "cache", Until("precision", 5), order_file)
    populations = s["adaptive"]["populations"]
    assert set(by_hand) == {f"systemone:{m}" for m in MODELS}
    sent = 0
    for m in s["models"]:
        k, asked, standing = by_hand[m["model"]]
        block = m["adaptive"]
        assert (block["round"], block["asked"], block["rule"], block["settled"]) == (
            k,
            asked,
            standing.rule,
            True,
        )
        assert block["index"] == estimate(standing.index) and block["reason"] == standing.reason
        assert block["metrics"] == {name: estimate(e) for name, e in standing.metrics.items()}
        assert m["requests"]["sent"] == sum(asked.values()) and m["requests"]["cache_hits"] == 0
        sent += sum(asked.values())
    assert (
        server.stats()["ok"] == sent
        and max(k for k, _, _ in by_hand.values()) == s["adaptive"]["rounds"]
    )
    early = {label for label, (_, _, st) in by_hand.items() if st.rule == "precision=5"}
    assert "systemone:m00" in early  # never right: known first
    # the others: stopped by the rule, or asked everything
    for _, asked, st in by_hand.values():
        assert st.rule in ("precision=5", "exhausted") and (st.rule == "exhausted") == (
            asked == populations
        )
    out = capsys.readouterr().out
    assert (
        "Adaptive run (--until precision=5, order seed 0" in out
        and "estimates of the whole set" in out
    )
    journal = [
        orjson.loads(line)
        for line in order_file.with_name(order_file.name.replace("order-", "decisions-") + "l")
        .read_bytes()
        .splitlines()
    ]
    assert [line["round"] for line in journal] == list(range(1, s["adaptive"]["rounds"] + 1))
    assert {label for line in journal for label in line["settled"]} == set(by_hand)
    # dxi report (the cache alone) marks the part-asked models' figures as estimates (the run's
    # record)
    done = rescore.rescore(
        rescore.select(
            PlanInputs(data_dir=data, cache_dir=tmp_path / "cache", out=tmp_path / "report")
        ),
        html=True,
    )
    # every model over what it was asked, nothing missing: exit 0, the run's blocks
    assert done.exit_code == 0 and {m.model: m.adaptive for m in done.summary.models} == {
        m["model"]: m["adaptive"] for m in s["models"]
    }
    # `dxi score` of the run's models (their order): the run's summary, figure for figure
    assert dxi_score(server.url, data, tmp_path / "cache", tmp_path / "scored") == 0
    assert figures(summary(tmp_path / "scored")) == figures(s)
    page = (tmp_path / "report" / "report.html").read_text()
    m00 = next(m["adaptive"] for m in s["models"] if m["model"] == "systemone:m00")
    assert "Adaptive run (--until precision=5, order seed 0" in page
    assert (
        f"systemone:m00: asked {sum(m00['asked'].values())} of {4 * N} (" in page
        and f"stopped by precision=5 after round {m00['round']}." in page
    )
    assert "Adaptive run (--until precision=5, order seed 0" in overview(data, tmp_path / "cache")
    # a later run without --until asks what each model was not asked, and nothing twice
    before = server.stats()["ok"]
    assert dxi_run(server.url, data, tmp_path / "cache", tmp_path / "full") == 0
    full = summary(tmp_path / "full")
    assert "adaptive" not in full and all(
        m["complete"] and "adaptive" not in m for m in full["models"]
    )
    for m in full["models"]:
        asked = sum(by_hand[m["model"]][1].values())
        assert (m["requests"]["sent"], m["requests"]["cache_hits"]) == (4 * N - asked, asked)
    assert server.stats()["ok"] - before == 10 * 4 * N - sent and server.stats()["duplicates"] == 0


def evals_of(data: Path) -> list[str]:
    return Suite(discover(data)).selected()


def test_separated_stops_the_clearly_different_models_first_and_the_near_twins_last(
    data: Path, server, tmp_path: Path
):
    assert (
        dxi_run(server.url, data, tmp_path / "cache", tmp_path / "out", "--until", "separated") == 0
    )
    s = summary(tmp_path / "out")
    by_hand = replay(
        data, tmp_path / "cache", Until("separated", 1.0), Path(s["adaptive"]["order"])
    )
    blocks = {m["model"]: m["adaptive"] for m in s["models"]}
    assert {label: (b["round"], b["asked"], b["rule"]) for label, b in blocks.items()} == {
        label: (k, asked, st.rule) for label, (k, asked, st) in by_hand.items()
    }
    rounds = {label.split(":")[1]: b["round"] for label, b in blocks.items()}
    assert rounds["m00"] < rounds["twin-a"] and rounds["m100"] < rounds["twin-a"]
    assert rounds["twin-a"] == rounds["twin-b"] == max(rounds.values())
    assert blocks["systemone:m00"]["rule"] == blocks["systemone:m100"]["rule"] == "separated=1"
    assert blocks["systemone:twin-a"]["rule"] == "exhausted"
    # the reason says the relation settled with every other model, the nearest named first
    assert blocks["systemone:m00"]["reason"] == (
        "above none; below 9 (systemone:m30, systemone:m40, systemone:m50, +6 more); within ±1 "
        "point of none"
    )
    assert blocks["systemone:m70"]["reason"] == (
        "above 8 (systemone:twin-b, systemone:twin-a, systemone:m55, +5 more); below "
        "systemone:m100; within ±1 point of none"
    )
    assert blocks["systemone:twin-a"]["reason"] == "every task of the whole set was asked"


THREE = ("m00", "m50", "m100")
SMALL = 40


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("adaptive-small") / "data", SMALL)


KILL_AFTER_ROUND = """\
import os, signal, sys
from dxi.runner.outputs import adaptive as record
append = record.Journal.append
def append_then_die(self, round_, settled, asked):
    append(self, round_, settled, asked)
    # between two rounds: this one decided, the next not begun
    if round_ == int(os.environ["KILL_AFTER_ROUND"]):
        os.kill(os.getpid(), getattr(signal, os.environ["KILL_SIGNAL"]))
record.Journal.append = append_then_die
from dxi.runner.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("signal", "code"), [("SIGKILL", -9), ("SIGINT", 130)])
def test_a_kill_between_rounds_loses_nothing_and_the_rerun_asks_the_same_sequence(
    signal: str,
    code: int,
    small: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
):
    """kill -9, or a Ctrl-C (the run drains: nothing of the next round is sent), just after round
    3's decisions are in the journal; the rerun of the same command replays the rounds from the
    cache."""
    monkeypatch.setenv(DATA_ENV, str(small))
    args = ["--until", "precision=5", "--seed", "11"]
    with serve(model=None, route_factories=ROUTE, record=False) as server:  # the reference: one run
        assert (
            dxi_run(server.url, small, tmp_path / "ref", tmp_path / "ref-out", *args, models=THREE)
            == 0
        )
        reference = server.stats()["ok"]
    with serve(model=None, route_factories=ROUTE, record=False) as server:
        env = dict(
            os.environ,
            KILL_AFTER_ROUND="3",
            KILL_SIGNAL=signal,
            PYTHONPATH=str(Path(__file__).parents[1]),
        )
        cmd = [
            sys.executable,
            "-c",
            KILL_AFTER_ROUND,
            *dxi_args(
                small,
                tmp_path / "cache",
                tmp_path / "out",
                *args,
                "-q",
                models=served(server.url, THREE),
            ),
        ]
        killed = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
        assert killed.returncode == code, killed.stderr.decode()[-2000:]
        if signal == "SIGKILL":
            assert not (tmp_path / "out" / "summary.json").exists()
        else:  # drained: what arrived, over every task (not asked: missing), marked interrupted
            stopped = summary(tmp_path / "out")
            assert (stopped["interrupted"]["exit_code"], stopped["complete"]) == (130, False)
            assert "adaptive" not in stopped  # no outcome recorded: `dxi score` below says so
            # its own missing answers' hints name the adaptive rerun first, as `dxi score` does
            assert {
                b["reason"].split("); ", 1)[1]
                for m in stopped["models"]
                for b in m["evals"].values()
            } == {
                "rerunning the adaptive run that did not finish (`dxi run ... --until precision=5 "
                "--seed 11`) continues it, or `dxi run` with --all-tasks sends every missing answer"
            }
        first = server.stats()["ok"]
        journal = next((tmp_path / "cache" / ORDER_DIR).glob("decisions-*.jsonl"))
        assert [orjson.loads(line)["round"] for line in journal.read_bytes().splitlines()] == [
            1,
            2,
            3,
        ]
        # `dxi score` of the cache before the rerun: no outcome of the run is recorded (it did not
        # end), so its figures are over every task, provisional (exit 1), and it says that the
        # run did not finish and which command continues it, in one line, and in each missing
        # answers' hint before the plain run that would send everything
        capsys.readouterr()
        scoring = dxi_args(small, tmp_path / "cache", tmp_path / "scored", command="score")
        assert (
            main([*scoring, *(a for m in served(server.url, THREE) for a in ("--model", m))]) == 1
        )
        printed = " ".join(capsys.readouterr().out.split())
        # the note, each evaluation's hint, and each model's provisional line: its rerun continues
        # the sequence, not "asks for N of them again" (N: every task not asked, far more than
        # the rounds send)
        assert printed.count("did not finish") == 1 + 3 * 4 + 3
        assert "asks for" not in printed
        assert (
            printed.count(
                "WildGuardTest mean_f1 [9.7, 89.0]; rerunning the adaptive run that did not finish "
                "(`dxi run ... --until precision=5 --seed 11`) continues its sequence (how many of "
                "them it asks, its rounds decide). systemone:m100: provisional (*): 198 missing"
            )
            == 1
        )
        assert (
            printed.count("continues its sequence (how many of them it asks, its rounds decide)")
            == 3
        )
        assert (
            "note: An adaptive run over this cache did not finish (--until precision=5: its journal "
            "has 3 rounds): rerunning the same `dxi run ... --until precision=5 --seed 11` command "
            "continues it; until then the figures here are over every task, the questions it has "
            "not asked counted missing (provisional)"
        ) in printed
        scored = summary(tmp_path / "scored")
        asked = sum(after_rounds(small, 3).values()) // 4  # of each evaluation, rounds 1-3
        assert [
            (b["missing"] >= SMALL - asked, b["reason"].split("); ", 1)[1])
            for m in scored["models"]
            for b in m["evals"].values()
        ] == [
            (
                True,
                "rerunning the adaptive run that did not finish (`dxi run ... --until precision=5 "
                "--seed 11`) continues it, or `dxi run` with --all-tasks sends every missing answer",
            )
        ] * 12
        assert (
            dxi_run(server.url, small, tmp_path / "cache", tmp_path / "out", *args, models=THREE)
            == 0
        )
        # once it finished: its record, exit 0, and no such line
        assert (
            main([*scoring, *(a for m in served(server.url, THREE) for a in ("--model", m))]) == 0
        )
        assert "did not finish" not in capsys.readouterr().out
        stats = server.stats()
    ref, again = summary(tmp_path / "ref-out"), summary(tmp_path / "out")
    assert [m["adaptive"] for m in again["models"]] == [m["adaptive"] for m in ref["models"]]
    assert again["adaptive"] | {"order": ""} == ref["adaptive"] | {"order": ""}
    # the rerun replayed rounds 1-3 deciding what the journal records: no line twice; the journal
    # is the uninterrupted run's, line for line (but the time)
    lines = [
        {k: v for k, v in orjson.loads(line).items() if k != "at"}
        for line in journal.read_bytes().splitlines()
    ]
    reference_journal = next((tmp_path / "ref" / ORDER_DIR).glob("decisions-*.jsonl"))
    assert [line["round"] for line in lines] == list(range(1, ref["adaptive"]["rounds"] + 1))
    assert lines == [
        {k: v for k, v in orjson.loads(line).items() if k != "at"}
        for line in reference_journal.read_bytes().splitlines()
    ]
    # every request once, over the two runs
    assert stats["duplicates"] == 0 and stats["ok"] == reference
    stops = {m["model"]: m["adaptive"]["round"] for m in again["models"]}
    asked = {m["model"]: sum(m["adaptive"]["asked"].values()) for m in again["models"]}
    assert min(stops.values()) > 3  # every model was still running when the run was killed
    assert first == 3 * sum(after_rounds(small, 3).values())  # rounds 1-3 whole, nothing of round 4
    assert {
        label: m["requests"]["sent"] for label, m in zip(stops, again["models"], strict=True)
    } == {label: n - sum(after_rounds(small, 3).values()) for label, n in asked.items()}


def after_rounds(data: Path, k: int) -> dict[str, int]:
    """What each running model has been asked after ``k`` rounds."""
    asked = dict.fromkeys(evals_of(data), 0)
    for r in range(k):
        more = round_sizes(asked, dict.fromkeys(asked, SMALL), round_index=r)
        asked = {n: asked[n] + more[n] for n in asked}
    return asked


# $0.01 a request (10 tokens) for each of THREE
PRICES = [a for m in THREE for a in ("--price", f"systemone:{m}=1000/0")]


def bounded_run(url: str, small: Path, tmp_path: Path, max_cost: str, *extra: str) -> int:
    """``dxi run --until precision=5`` of THREE at ``PRICES`` under ``--max-cost max_cost`` into
    ``tmp_path``'s cache and out (printing: not quiet), with the flags ``extra``; its exit code."""
    return main(
        dxi_args(
            small,
            tmp_path / "cache",
            tmp_path / "out",
            *extra,
            "--until",
            "precision=5",
            *PRICES,
            "--max-cost",
            max_cost,
            models=served(url, THREE),
        )
    )


def test_the_cost_bound_holds_and_a_rerun_with_more_continues_the_sequence(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.setenv(DATA_ENV, str(small))
    # (rounds 1-3 ask 8, 16 and 28 tasks of a model, 24, 48 and 84 requests of the three; $1 buys
    # 100 at most)
    args = ["--until", "precision=5", *PRICES]
    with serve(model=None, route_factories=ROUTE, record=False) as server:
        assert (
            dxi_run(server.url, small, tmp_path / "ref", tmp_path / "ref-out", *args, models=THREE)
            == 0
        )
    ref = summary(tmp_path / "ref-out")
    with serve(model=None, route_factories=ROUTE, record=False) as server:
        capsys.readouterr()
        code = bounded_run(server.url, small, tmp_path, "1", "--max-in-flight", "32")
        out = capsys.readouterr().out
        s = summary(tmp_path / "out")
        assert (
            code == EXIT_COST_BOUND
            and s["cost_bound"]["stopped"]
            and s["cost_bound"]["spent_usd"] <= 1
        )
        sent = sum(m["requests"]["sent"] for m in s["models"])
        # 10 input tokens a request
        assert s["cost_bound"]["spent_usd"] == pytest.approx(sent * 0.01)
        assert (
            0 < sent < sum(m["requests"]["sent"] for m in ref["models"])
            and s["cost_bound"]["remaining_requests"] > 0
        )
        # round 3 was cut by the bound (each request reserves its worst case, more than the
        # $0.01 it costs: the bound is reached before round 3's 84th request): it decides nothing
        # and is no round of the summary, whose models were asked rounds 1-2's prefix (16 tasks, 48
        # requests of the three); what round 3 sent is in the cache, outside the part scored: no
        # answer is missing, nothing is provisional, no hint tells a run to send "what is missing"
        two = sum(after_rounds(small, 2).values())
        third = sum(after_rounds(small, 3).values()) - two
        assert (two, third) == (16, 12) and 0 < sent - 3 * two < 3 * third
        assert s["adaptive"]["rounds"] == 2
        assert [m["adaptive"]["asked"] for m in s["models"]] == [after_rounds(small, 2)] * 3
        assert [m["adaptive"]["settled"] for m in s["models"]] == [False] * 3
        assert s["complete"] and all(
            e["n"] == 4 and e["missing"] == 0 and "reason" not in e
            for m in s["models"]
            for e in m["evals"].values()
        )
        assert "missing" not in out and "≈" in out and "*" not in out.split("Data used")[0]
        assert (
            f"round 3 cut by the cost bound ({3 * third - (sent - 3 * two)} of its "
            f"{3 * third} requests not sent): it decides nothing; the run's figures are over "
            f"rounds 1-2 (16 of 160 tasks asked); what it sent is in the cache, and a rerun with a "
            "higher --max-cost continues the sequence"
        ) in out
        assert "Adaptive run (--until precision=5, order seed 0, 2 rounds)" in out
        # the closing line: what the cut round left, then the most the rounds can still ask
        assert (
            f"{3 * third - (sent - 3 * two)} request(s) not sent; at most "
            f"{s['cost_bound']['remaining_requests']} request(s) of the whole set left to send"
        ) in " ".join(out.split())
        # the cache alone scores the same part, and says how to go on
        capsys.readouterr()
        assert dxi_score(server.url, small, tmp_path / "cache", tmp_path / "scored", THREE) == 0
        printed = " ".join("".join(capsys.readouterr()).split())
        assert (
            "3 models were not settled when the adaptive run ended (--until precision=5; "
            "systemone:m00, systemone:m50, systemone:m100): rerunning the same `dxi run ... "
            "--until precision=5` command continues them (with a higher --max-cost, if the cost "
            "bound stopped it); until then their figures are estimates over what they were asked"
        ) in printed
        scored = summary(tmp_path / "scored")
        assert [m["adaptive"] for m in scored["models"]] == [m["adaptive"] for m in s["models"]]
        # and its usage is of those answers' requests: 16 a model, not what round 3 sent too
        assert [m["usage"]["requests"] for m in s["models"]] == [two] * 3
        assert [m["usage"]["requests"] for m in scored["models"]] == [two] * 3
        decided = [
            orjson.loads(line)
            for p in (tmp_path / "cache" / ORDER_DIR).glob("decisions-*.jsonl")
            for line in p.read_bytes().splitlines()
        ]
        assert (
            dxi_run(
                server.url,
                small,
                tmp_path / "cache",
                tmp_path / "out",
                *args,
                "--max-cost",
                "100",
                models=THREE,
            )
            == 0
        )
        stats = server.stats()
    again = summary(tmp_path / "out")
    assert [m["adaptive"] for m in again["models"]] == [m["adaptive"] for m in ref["models"]]
    assert stats["duplicates"] == 0 and stats["ok"] == sum(
        m["requests"]["sent"] for m in ref["models"]
    )
    # the rounds the bounded run finished are on record (its decisions: none settled so early),
    # the cut one not
    assert [line["round"] for line in decided] == [1, 2]


def test_a_cost_bound_that_cuts_round_1_says_no_round_finished_after_the_start_line(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """$0.10 at $0.01 a request, each reserving more than that: round 1 (24 requests of three
    models) sends nothing. The start line comes first (the cut line is said while the start line is
    still being counted), the note says no round finished and how to go on, not that figures are
    estimates; every model was asked 0 tasks."""
    monkeypatch.setenv(DATA_ENV, str(small))
    with serve(model=None, route_factories=ROUTE, record=False) as server:
        capsys.readouterr()
        code = bounded_run(server.url, small, tmp_path, "0.1")
        out = " ".join(capsys.readouterr().out.split())
        stats = server.stats()
    s = summary(tmp_path / "out")
    assert code == EXIT_COST_BOUND and stats["ok"] == 0 and s["adaptive"]["rounds"] == 0
    assert [sum(m["adaptive"]["asked"].values()) for m in s["models"]] == [0, 0, 0]
    start = out.index("Running 3 models (systemone:m00; systemone:m50; systemone:m100)")
    cut = out.index(
        "round 1 cut by the cost bound (24 of its 24 requests not sent): it decides nothing; no "
        "round finished"
    )
    assert start < cut
    assert (
        "Adaptive run (--until precision=5, order seed 0, no round finished): no model was asked "
        "a question yet, so none has figures; rerunning the same `dxi run ... --until "
        "precision=5` command starts the sequence (with a higher --max-cost, if the cost bound "
        "stopped it). Each model:"
    ) in out
    assert "marked ≈" not in out and "0 rounds" not in out


def test_the_round_line_gives_the_share_of_the_tasks_actually_asked():
    """On a small set each evaluation's share is rounded up to whole tasks: after the schedule's
    4%, 9% and 15% of two evaluations of 50 tasks, 2, 5 and 8 tasks of each, 16 of 100 (the line
    says 16%, with the count), and an aimed round's share is what it asked."""
    from types import SimpleNamespace

    from dxi.runner.adaptive.rounds import Rounds

    populations = {"a": 50, "b": 50}
    rounds = Rounds(plan=None)  # type: ignore[arg-type]
    rounds.order = SimpleNamespace(populations=lambda: populations)  # type: ignore[assignment]
    asked = dict.fromkeys(populations, 0)
    for r in range(3):
        more = round_sizes(asked, populations, round_index=r)
        asked = {n: asked[n] + more[n] for n in asked}
    rounds.asked = {"m1": asked, "m2": dict.fromkeys(populations, 2)}  # m2 stopped after round 1
    rounds.rounds = 3
    assert asked == {"a": 8, "b": 8}
    assert rounds.round_line([], 1) == (
        "round 3 (16% of the whole set asked: 16 of 100 tasks): none stopped; 1 running"
    )
    more = round_sizes(asked, populations, aim=0.2)  # aimed short of the schedule's 23%
    rounds.asked["m1"] = {n: asked[n] + more[n] for n in asked}
    rounds.rounds = 4
    assert rounds.round_line([], 1) == (
        "round 4 (20% of the whole set asked: 20 of 100 tasks): none stopped; 1 running"
    )


def test_with_batch_each_round_is_one_batch_per_model_with_the_same_decisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-adaptive")
    # 30 tasks of each evaluation and ±0.01 points: precision asks every task, round after round
    data = write_data(tmp_path / "data", 30)
    models = ["openai:a", "openai:b"]
    with serve(model=None, record=False) as server:
        urls = [a for m in models for a in ("--model", f"{m}@{server.url}/v1")]
        common = ["run", *urls, "--data-dir", str(data), "--until", "precision=0.01"]
        sync = ["--cache-dir", str(tmp_path / "sync"), "--out", str(tmp_path / "sync-out")]
        assert main([*common, *sync]) == 0
        out = capsys.readouterr().out.splitlines()
        lines = [line[9:] for line in out if re.match(r"\d\d:\d\d:\d\d round ", line)]
        batched = ["--batch", "--poll", "0.02", "--cache-dir", str(tmp_path / "batch")]
        assert main([*common, *batched, "--out", str(tmp_path / "batch-out"), "-q"]) == 0
        stats = server.stats()
    # one line after each round (after the time of day): who stopped, who runs on
    # (4% of 30 is 1.2: 2 tasks of each evaluation, 8 of 120)
    assert (
        lines[0] == "round 1 (7% of the whole set asked: 8 of 120 tasks): none stopped; 2 running"
    )
    # the fake answers both alike: their exact index, the interval of nothing left to ask
    assert lines[-1] == (
        f"round {len(lines)} (100% of the whole set asked: 120 of 120 tasks): openai:a asked the "
        "whole set (index 24.2 [24.2, 24.2]); openai:b asked the whole set (index 24.2 [24.2, "
        "24.2]); 0 running"
    )
    sync, batch = summary(tmp_path / "sync-out"), summary(tmp_path / "batch-out")
    assert [m["adaptive"] for m in batch["models"]] == [m["adaptive"] for m in sync["models"]]
    rounds = batch["adaptive"]["rounds"]
    assert rounds == len(lines) > 1
    assert all(m["adaptive"]["rule"] == "exhausted" for m in batch["models"])
    for m in batch["models"]:
        assert m["requests"]["batches"]["submitted"] == rounds and m["requests"]["sent"] == 120
    assert stats["batch_creates"] == 2 * rounds and stats["batch_lines"] == 240


def test_with_batch_a_model_without_a_batch_api_is_noted_once_per_run_not_per_round(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    # 30 tasks of each evaluation and ±0.01 points: precision asks every task, round after round
    data = write_data(tmp_path / "data", 30)
    code = main(
        [
            "run",
            "--model",
            "embedded",
            "--data-dir",
            str(data),
            "--until",
            "precision=0.01",
            "--batch",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    rounds = [line for line in out.splitlines() if re.match(r"\d\d:\d\d:\d\d round ", line)]
    assert code == 0 and len(rounds) == summary(tmp_path / "out")["adaptive"]["rounds"] == 9
    assert out.count("has no batch API") == 1
    assert (
        "--batch: embedded:sparrow-nano-general-v1.1 has no batch API (decision models, the "
        "embedded model, local servers and logprob decisions are sent one call at a time): sent "
        "synchronously"
    ) in out


def test_with_batch_the_deadline_still_holds_and_no_round_starts_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-adaptive")
    data = write_data(tmp_path / "data", 30)
    # batches that would never end
    with serve(model=None, record=False, batch={"polls": 100000}) as server:
        deadline = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 4))
        code = main(
            [
                "run",
                "--model",
                f"openai:a@{server.url}/v1",
                "--model",
                f"openai:b@{server.url}/v1",
                "--data-dir",
                str(data),
                "--until",
                "separated",
                "--batch",
                "--poll",
                "0.02",
                "--deadline",
                deadline,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--out",
                str(tmp_path / "out"),
                "-q",
            ]
        )
        stats = server.stats()
    s = summary(tmp_path / "out")
    populations = dict.fromkeys(s["adaptive"]["populations"], 30)
    first = round_sizes(dict.fromkeys(populations, 0), populations, round_index=0)  # 2 of each
    sent = sum(first.values())
    # the batches' unanswered half: the next run sends it
    assert code == 1 and s["adaptive"]["rounds"] == 1 and sent == 8
    assert (
        stats["batch_creates"] == stats["batch_cancels"] == 2 and stats["batch_lines"] == 2 * sent
    )
    for m in s["models"]:
        assert (m["adaptive"]["asked"], m["adaptive"]["rule"], m["adaptive"]["round"]) == (
            first,
            None,
            None,
        )
        # a cancelled batch answers its first half; the other, sent, is counted sent once (the old
        # count: also not sent)
        requests = m["requests"]
        assert (requests["sent"], requests["not_sent"]) == (sent, 0)
        assert requests["batches"]["unanswered"] == sent - sent // 2


def test_a_provider_stop_leaves_its_models_unsettled_and_the_next_run_continues(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(DATA_ENV, str(small))
    # one request at a time: the 401 is the 60th
    args = ["--until", "precision=5", "--max-in-flight", "1"]
    with serve(model=None, route_factories=ROUTE, record=False) as server:
        assert (
            dxi_run(server.url, small, tmp_path / "ref", tmp_path / "ref-out", *args, models=THREE)
            == 0
        )
    ref = summary(tmp_path / "ref-out")
    # rounds 1-2 of the three models are 48 requests, rounds 1-3 84: the 60th request falls in round
    # 3
    assert 3 * sum(after_rounds(small, 2).values()) < 60 <= 3 * sum(after_rounds(small, 3).values())
    # the rerun's server on the same port: the same endpoint, so the same cache keys
    port = free_port()
    with serve(
        port, model=None, route_factories=ROUTE, record=False, script=["ok"] * 59 + ["401"]
    ) as server:
        code = dxi_run(server.url, small, tmp_path / "cache", tmp_path / "out", *args, models=THREE)
        assert server.stats()["ok"] == 59
    s = summary(tmp_path / "out")
    assert code == 6 and s["stopped_providers"] and s["adaptive"]["rounds"] == 3
    for m in s["models"]:
        block = m["adaptive"]
        assert (block["settled"], block["rule"], block["round"]) == (False, None, None)
        assert block["reason"].startswith("its provider stopped") and block[
            "asked"
        ] == after_rounds(small, 3)
    journal = (
        next((tmp_path / "cache" / ORDER_DIR).glob("decisions-*.jsonl")).read_bytes().splitlines()
    )
    # round 3 was cut: nothing decided from it for them
    lines = [orjson.loads(line) for line in journal]
    assert [(line["round"], line["settled"]) for line in lines] == [(1, {}), (2, {}), (3, {})]
    with serve(port, model=None, route_factories=ROUTE, record=False) as server:
        assert (
            dxi_run(server.url, small, tmp_path / "cache", tmp_path / "out", *args, models=THREE)
            == 0
        )
        assert server.stats()["ok"] == sum(m["requests"]["sent"] for m in ref["models"]) - 59
    assert [m["adaptive"] for m in summary(tmp_path / "out")["models"]] == [
        m["adaptive"] for m in ref["models"]
    ]


def test_a_journal_line_whose_reason_reads_otherwise_records_the_same_decision(tmp_path: Path):
    """The journal's reason is words for the decision (another version of dxi words it
    otherwise): a replayed round deciding the same models, asked the same, with the same rule and
    interval appends nothing, whatever an older line's reason says; another interval appends."""
    from dxi.runner.outputs import adaptive as record
    from dxi.scoring.sequential import Estimate, Standing

    order = tmp_path / "adaptive" / "order-abc.json"
    order.parent.mkdir(parents=True)
    index = Estimate(40.0, 35.0, 45.0)
    st = Standing("m", {"e": 10}, {"e": 100}, index, {}, True, "separated=1", "above x")
    old = {
        "at": 1.0,
        "until": "separated=1",
        "round": 3,
        "settled": {
            "m": {
                "asked": {"e": 10},
                "rule": "separated=1",
                "reason": "every other model ordered or within 1 points",
                "index": record.estimate(index),
            }
        },
    }
    path = order.with_name("decisions-abc.jsonl")
    path.write_bytes(orjson.dumps(old) + b"\n")
    journal = record.Journal.of(order, Until("separated", 1.0))
    journal.append(3, {"m": st}, {"m": {"e": 10}})
    assert len(path.read_bytes().splitlines()) == 1
    wider = Standing("m", {"e": 10}, {"e": 100}, Estimate(40.0, 34.0, 45.0), {}, True,
                     "separated=1", "above x")  # fmt: skip
    journal.append(3, {"m": wider}, {"m": {"e": 10}})
    assert len(path.read_bytes().splitlines()) == 2
