"""The library entry points of a run and a rescoring (``runner.session``, ``runner.rescore``),
called without the command line: their typed results, summary.json's per-model request counts, the
cost-bound block and the exit-code decision, with exact values."""

from __future__ import annotations

from pathlib import Path

import pytest

from dxi.runner import counts, rescore, session
from dxi.runner.batch.options import BatchStats
from dxi.runner.cli import parser
from dxi.runner.errors import (
    EXIT_COST_BOUND,
    EXIT_FAILED_REQUESTS,
    EXIT_PROVIDER_STOPPED,
    EXIT_UPLOAD,
    UsageError,
)
from dxi.runner.planning.estimate import Estimate
from dxi.runner.planning.inputs import PlanInputs, inputs_of
from dxi.runner.planning.plan import Plan, build, from_args
from dxi.runner.sending.cost import Budget
from dxi.runner.sending.scheduler import Stats
from dxi.scoring import records

MODEL = "embedded:sparrow-nano-general-v1.1"
EVERY = {
    "sent": 0,
    "cache_hits": 0,
    "failed": 0,
    "invalid": 0,
    "attempts": 0,
    "retry_wait_s": 0.0,
    "rate_limited": 0,
    "repaired": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "cost_usd": 0.0,
    "not_sent": 0,
    "refused": 0,
}


def plan(data_dir: Path, tmp_path: Path, out: str = "out", **fields) -> Plan:
    return build(
        models=[MODEL],
        data_dir=data_dir,
        cache_dir=tmp_path / "cache",
        out=tmp_path / out,
        **fields,
    )


def selection(data_dir: Path, tmp_path: Path, out: str = "scored", **fields) -> rescore.Selection:
    return rescore.select(
        PlanInputs(data_dir=data_dir, cache_dir=tmp_path / "cache", out=tmp_path / out, **fields)
    )


def test_the_keyword_constructor_and_the_command_line_build_the_same_plan(
    data_dir: Path, tmp_path: Path
):
    """One path: ``plan.build(**fields)`` and ``dxi run``'s parsed flags give the same models,
    suite, locations and settings; the defaults are the parser's."""
    flags = parser().parse_args(
        [
            "run",
            "--model",
            MODEL,
            "--model",
            "openai:gpt-6-luna",
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(tmp_path / "c"),
            "--limit",
            "2",
            "--evals",
            "when2call,hle_multichoice",
            "--epochs",
            "3",
            "--param",
            "temperature=0",
            "--effort",
            "low",
            "--rpm",
            "60",
            "--timeout",
            "9",
            "--price",
            "openai:gpt-6-luna=1/2",
            "--max-cost",
            "4",
            "--wildguard-subset",
            "all",
            "--batch",
            "--batch-size",
            "7",
        ]
    )
    assert inputs_of(flags) == PlanInputs(
        models=(MODEL, "openai:gpt-6-luna"),
        data_dir=data_dir,
        cache_dir=tmp_path / "c",
        limit=2,
        evals="when2call,hle_multichoice",
        epochs=3,
        params=("temperature=0",),
        effort="low",
        limits={"rpm": 60.0, "attempt_timeout_s": 9.0},
        prices=("openai:gpt-6-luna=1/2",),
        max_cost=4.0,
        wildguard_subset="all",
        batch=True,
        batch_size=7,
    )
    given = from_args(flags)
    built = build(
        models=[MODEL, "openai:gpt-6-luna"],
        data_dir=str(data_dir),
        cache_dir=tmp_path / "c",
        limit=2,
        evals=["when2call", "hle_multichoice"],
        epochs=3,
        params={"temperature": 0},
        effort="low",
        limits={"rpm": 60, "attempt_timeout_s": 9},
        prices=["openai:gpt-6-luna=1/2"],
        max_cost=4,
        wildguard_subset="all",
        batch=True,
        batch_size=7,
    )
    for p in (given, built):
        assert [
            (m.label, m.epochs, m.price, m.adapter.params_key, m.identity.effort) for m in p.models
        ] == [
            (MODEL, 3, (0.0, 0.0), "{}", None),
            (
                "openai:gpt-6-luna",
                3,
                (1.0, 2.0),
                '{"reasoning_effort":"low","temperature":0}',
                "low",
            ),
        ]
        assert [(m.adapter.limits.rpm, m.adapter.limits.attempt_timeout_s) for m in p.models] == [
            (60, 9),
            (60, 9),
        ]
        assert (p.data_dir, p.cache_dir, p.out, p.epochs, p.max_cost, p.source) == (
            data_dir,
            tmp_path / "c",
            Path("out"),
            3,
            4,
            None,
        )
        assert (p.suite.selected(), p.suite.limit, p.suite.wildguard_subset) == (
            ["hle_multichoice", "when2call"],
            2,
            "all",
        )
        assert (p.batch, p.batch_limits) == (
            frozenset({MODEL, "openai:gpt-6-luna"}),
            {MODEL: (7, None), "openai:gpt-6-luna": (7, None)},
        )
    # the parser's defaults are the inputs' defaults
    assert inputs_of(parser().parse_args(["run"])) == PlanInputs()
    assert inputs_of(parser().parse_args(["score"])) == PlanInputs()
    with pytest.raises(TypeError, match="limt"):
        build(models=[MODEL], limt=2)
    with pytest.raises(UsageError, match="limits rpms: not a limit"):
        build(models=[MODEL], data_dir=data_dir, limits={"rpms": 1})
    with pytest.raises(UsageError, match="--limit must be at least 1"):
        build(models=[MODEL], data_dir=data_dir, limit=0)


def test_a_run_returns_its_stats_summary_and_exit_code_and_a_rerun_reads_the_cache(
    data_dir: Path, tmp_path: Path
):
    first = session.run(plan(data_dir, tmp_path))
    assert isinstance(first, session.RunResult)
    assert (
        first.exit_code,
        first.stopped,
        first.cost_bound,
        first.refused,
        first.unanswered,
        first.upload_failed,
    ) == (0, [], None, False, False, None)
    (stats,) = first.stats.values()
    assert (stats.total, stats.sent, stats.ok, stats.cache_hits, stats.failed, stats.attempts) == (
        12,
        12,
        12,
        0,
        0,
        12,
    )
    assert records.to_json(first.summary) == (tmp_path / "out" / "summary.json").read_bytes()
    assert first.summary.models[0].requests == EVERY | {"sent": 12, "attempts": 12}
    assert first.spent_usd == 0.0 and first.failed == {}
    seen = []
    again = session.run(plan(data_dir, tmp_path, out="again"), on_summary=seen.append)
    assert seen == [again.summary]  # handed over once written
    assert again.stats[MODEL] == Stats(
        total=12, cache_hits=12, cost_usd=0.0
    )  # every request cached: none started
    assert again.summary.models[0].requests == EVERY | {"cache_hits": 12}
    assert again.exit_code == 0


def test_a_cost_bound_is_recorded_in_the_result(data_dir: Path, tmp_path: Path):
    done = session.run(plan(data_dir, tmp_path, max_cost=1))
    assert done.cost_bound == {
        "max_cost_usd": 1.0,
        "spent_usd": 0.0,
        "stopped": False,
    }  # the embedded model is free
    assert done.summary.cost_bound == done.cost_bound and done.exit_code == 0


@pytest.mark.slow
def test_rescore_scores_the_cache_without_the_network(data_dir: Path, tmp_path: Path):
    ran = session.run(plan(data_dir, tmp_path))
    done = rescore.rescore(selection(data_dir, tmp_path))
    assert (done.exit_code, done.out, done.report, done.notes) == (0, tmp_path / "scored", None, [])
    assert done.summary.models[0].decision_index == ran.summary.models[0].decision_index
    assert done.summary.models[0].requests == {
        "sent": 0,
        "cache_hits": 12,
        "failed": 0,
        "invalid": 0,
        "repaired": 0,
    }  # read from the cache: nothing was sent
    report = rescore.rescore(selection(data_dir, tmp_path, out="report"), html=True)
    assert report.report == tmp_path / "report" / "report.html" and report.report.is_file()


def test_the_models_to_score_are_those_in_the_cache_or_those_named(data_dir: Path, tmp_path: Path):
    from dxi.cache import Cache

    session.run(plan(data_dir, tmp_path, epochs=2))
    chosen = selection(data_dir, tmp_path)
    with Cache(chosen.cache_dir) as cache:
        every = rescore.models_to_score(cache, chosen)
        named = rescore.models_to_score(cache, selection(data_dir, tmp_path, models=[MODEL]))
        other = selection(data_dir, tmp_path, models=["systemone:m@http://127.0.0.1:9"])
        with pytest.raises(
            UsageError, match=f"no such model in .*cache .*Models there: {MODEL}\\.$"
        ):
            rescore.models_to_score(cache, other)
        # an embedded model (a typo of its name): no endpoint named, it has no server
        typo = selection(data_dir, tmp_path, models=["embedded:sparrow-nano-genral-v1.1"])
        with pytest.raises(UsageError) as refused:
            rescore.models_to_score(cache, typo)
    assert str(refused.value) == (
        f"embedded:sparrow-nano-genral-v1.1: no such model in {tmp_path / 'cache'} (parameters "
        "{}, prompt version dxi-prompt-1); give the model string and --param as `dxi run` was "
        f"given them. Models there: {MODEL}."
    )
    assert (every.frame["label"].to_list(), every.prices, every.epochs) == (
        [MODEL],
        {MODEL: (0.0, 0.0)},
        1,
    )
    assert (
        every.notes
        == named.notes
        == [f"{MODEL}: the cache holds 2 epochs; --epochs 2 scores them all (scored: 1)"]
    )
    assert named.frame["label"].to_list() == [MODEL] and named.epochs == 1


def test_a_selection_needs_a_cache_and_no_model_beside_a_run_file(tmp_path: Path, data_dir: Path):
    with pytest.raises(UsageError, match=f"no cache at {tmp_path / 'cache'}: run `dxi run` first"):
        selection(data_dir, tmp_path)
    (tmp_path / "run.toml").write_text('models = ["embedded"]\n')
    flags = parser().parse_args(["score", str(tmp_path / "run.toml"), "--model", MODEL])
    with pytest.raises(UsageError, match="--model cannot be combined with a run file"):
        rescore.select(flags)


def test_requests_block_counts_each_model_as_summary_json_records_it():
    s = Stats(
        total=9,
        sent=7,
        cache_hits=2,
        ok=5,
        invalid=1,
        failed=1,
        attempts=11,
        retry_wait_s=1.23456,
        rate_limited=3,
        repaired=1,
        input_tokens=700,
        output_tokens=90,
        cost_usd=0.00123456789,
        not_sent=0,
    )
    b = BatchStats(
        sent=4,
        ok=4,
        attempts=4,
        cost_usd=None,
        submitted=2,
        collected=1,
        given_back=3,
        running={"dxi-1": 1.0},
    )
    assert counts.requests_block({"a": s, "b": b}) == {
        "a": {
            "sent": 7,
            "cache_hits": 2,
            "failed": 1,
            "invalid": 1,
            "attempts": 11,
            "retry_wait_s": 1.235,
            "rate_limited": 3,
            "repaired": 1,
            "input_tokens": 700,
            "output_tokens": 90,
            "cost_usd": 0.001235,
            "not_sent": 0,
            "refused": 0,
        },
        "b": EVERY
        | {
            "sent": 4,
            "attempts": 4,
            "cost_usd": None,
            "batches": {
                "submitted": 2,
                "collected": 1,
                "running": 1,
                "given_back": 3,
                "from_earlier_runs": 0,
                "from_earlier_runs_usd": None,
                "unknown_results": 0,
                "duplicate_results": 0,
                "unanswered": 0,
            },
        },
    }


def test_the_cost_bound_block_adds_what_remains_once_stopped():
    budget = Budget(0.5)
    budget.spent, budget.stopped = 0.49999951, True
    remaining = [
        Estimate("a", requests=10, cached=4, new=6, cost_usd=0.25, bound_usd=0.5),
        Estimate("b", requests=3, new=3, cost_usd=0.125, bound_usd=None),
    ]
    assert counts.bound_block(budget, remaining) == {
        "max_cost_usd": 0.5,
        "spent_usd": 0.5,
        "stopped": True,
        "remaining_requests": 9,
        "remaining_cost_usd": 0.375,
        "remaining_bound_usd": None,
    }
    assert counts.bound_block(Budget(None), None) == {
        "max_cost_usd": None,
        "spent_usd": 0.0,
        "stopped": False,
    }


@pytest.mark.parametrize(
    ("given", "accepted", "failed", "code"),
    [
        ({}, True, 0, 0),
        ({}, False, 0, EXIT_FAILED_REQUESTS),
        ({"upload_failed": EXIT_UPLOAD}, True, 0, EXIT_UPLOAD),
        ({"upload_failed": EXIT_UPLOAD}, False, 0, EXIT_UPLOAD),
        (
            {"budget_stopped": True, "stopped": True},
            True,
            0,
            EXIT_PROVIDER_STOPPED,
        ),  # a stopped provider first: a higher bound would not bring it back
        ({"budget_stopped": True, "refused": True}, True, 0, EXIT_PROVIDER_STOPPED),
        ({"budget_stopped": True, "unanswered": True}, True, 0, EXIT_COST_BOUND),
        ({"stopped": True, "unanswered": True}, True, 0, EXIT_PROVIDER_STOPPED),
        ({"refused": True}, True, 0, EXIT_PROVIDER_STOPPED),
        ({"unanswered": True, "upload_failed": EXIT_UPLOAD}, True, 0, EXIT_FAILED_REQUESTS),
        (
            {"sharded": True},
            False,
            0,
            0,
        ),  # one shard of several: the others' answers are missing by design
        ({"sharded": True}, False, 2, EXIT_FAILED_REQUESTS),
        ({"sharded": True}, True, 2, 0),
        ({"sharded": True, "upload_failed": EXIT_UPLOAD}, False, 2, EXIT_UPLOAD),
    ],
)
def test_the_exit_code_decision(given: dict, accepted: bool, failed: int, code: int):
    flags = {
        "budget_stopped": False,
        "stopped": False,
        "refused": False,
        "unanswered": False,
        "sharded": False,
        "upload_failed": None,
    } | given
    assert session.exit_code(accepted, {"m": Stats(failed=failed)}, **flags) == code


def test_batch_outcome_tells_refused_from_unanswered():
    assert counts.batch_outcome({"a": Stats(not_sent=3)}) == (
        False,
        False,
    )  # synchronous: not a batch's doing
    assert counts.batch_outcome({"a": BatchStats(not_sent=3)}) == (False, True)
    assert counts.batch_outcome(
        {"a": BatchStats(not_sent=3, stopped="no batch API"), "b": BatchStats()}
    ) == (True, False)
