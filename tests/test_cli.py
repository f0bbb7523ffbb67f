"""``dxi run`` and ``dxi score`` end to end: outputs, reruns from the cache, partial caches, errors.
What the library does (a run's and a rescoring's outputs) goes through ``runner.session.run`` and
``runner.rescore``; what the command line does (exit codes, messages, usage errors) through
``main``."""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl
import pyarrow.parquet as pq
import pytest

from dxi.runner import rescore
from dxi.runner.cli import main
from dxi.runner.planning.config import allow_failed
from dxi.runner.planning.inputs import PlanInputs
from dxi.scoring import records
from dxi.scoring.provisional import span

from .conftest import REAL_DATA, requires_real_data, without_requests
from .helpers.runs import MODEL, dxi_args, fail_rows, run_plan


def dxi(*args: str) -> int:
    return main([*args, "-q"])


def summary(out: Path) -> dict:
    return orjson.loads((out / "summary.json").read_bytes())


def drop_rows(cache_dir: Path, n: int) -> list[str]:
    """Delete ``n`` rows from the cache's shards (as if lost), returning their task ids."""
    dropped = []
    for shard in sorted(cache_dir.glob("shards/*.parquet")):
        table = pq.read_table(shard)
        take = min(n - len(dropped), table.num_rows)
        if take <= 0:
            break
        frame = pl.from_arrow(table)
        dropped += frame["task_id"][:take].to_list()
        pq.write_table(frame[take:].to_arrow().cast(table.schema), shard)
    return dropped


def run_args(data: Path, tmp: Path, out: str = "out") -> list[str]:
    """``dxi run``'s arguments: ``MODEL`` on ``data``, caching in ``tmp/cache``, writing
    ``tmp/out``."""
    return dxi_args(data, tmp / "cache", tmp / out, models=[MODEL])


def score_args(data: Path, tmp: Path, out: str = "scored") -> list[str]:
    """``dxi score``'s arguments: the cache ``tmp/cache`` over ``data``, writing ``tmp/out``."""
    return dxi_args(data, tmp / "cache", tmp / out, command="score")


def rescore_cache(data: Path, tmp: Path, out: str = "scored", **fields) -> rescore.Rescored:
    """``dxi score``'s work as a library call: ``rescore.rescore`` of the selection ``fields`` make
    (``runner.planning.inputs.PlanInputs``), the cache in ``tmp/cache``, the outputs in
    ``tmp/out``."""
    return rescore.rescore(
        rescore.select(PlanInputs(data_dir=data, cache_dir=tmp / "cache", out=tmp / out, **fields))
    )


def test_run_writes_the_contract_outputs(data_dir: Path, tmp_path: Path):
    done = run_plan(data_dir, tmp_path)
    assert done.exit_code == 0
    s = summary(tmp_path / "out")
    assert (
        records.to_builtins(done.summary) == s
        and done.stopped == []
        and done.cost_bound is None
        and done.failed == {}
    )
    assert s["prompt_version"] and s["epochs"] == 1
    (m,) = s["models"]
    assert m["model"] == MODEL and isinstance(m["decision_index"], float)
    assert {k: v["n"] for k, v in m["evals"].items()} == {
        "aa_omniscience_decision": 4,
        "hle_multichoice": 2,
        "when2call": 3,
        "wildguardtest": 3,
    }
    assert set(m["evals"]["wildguardtest"]) >= {
        "f1_prompt_harm",
        "f1_response_refusal",
        "f1_response_harm",
        "mean_f1",
    }
    assert m["requests"] == {
        "sent": 12,
        "cache_hits": 0,
        "failed": 0,
        "invalid": 0,
        "attempts": 12,
        "retry_wait_s": 0.0,
        "rate_limited": 0,
        "repaired": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "not_sent": 0,
        "refused": 0,
    }
    # the embedded model runs here: free; it reports no tokens
    assert m["usage"]["cost_usd"] == 0.0 and m["usage"]["price"] == {"input": 0.0, "output": 0.0}
    assert s["usage"] == {
        "requests": 12,
        "replies": 12,
        "with_usage": 12,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_input_tokens": 0,
        "cost_usd": 0.0,
    }
    assert s["data"]["aa_omniscience_decision"]["stand_in"] is True
    assert s["data"]["wildguardtest"]["files"][0]["rows"] == 5

    answers = pl.read_parquet(tmp_path / "out" / "answers.parquet")
    assert answers.height == 4 + 2 + 3 + 9
    assert {
        "model",
        "eval",
        "task_id",
        "question_id",
        "predicted",
        "gold",
        "correct",
        "status",
        "error",
        "p_predicted",
        "p_yes",
        "predicted_category",
        "gold_category",
        "probabilities",
    } <= set(answers.columns)
    # every answer carries every option's probability (for calibration); the scored option is the
    # most probable
    probs = answers.select(
        "p_predicted", pl.col("probabilities").list.eval(pl.element().struct.field("p")).alias("p")
    )
    assert probs.select(pl.col("p").list.len().min()).item() >= 2
    assert probs.select((pl.col("p").list.max() == pl.col("p_predicted")).all()).item()
    w2c = answers.filter(pl.col("eval") == "when2call")
    assert w2c["gold_category"].to_list() == ["tool_call", "request_for_info", "cannot_answer"]
    assert w2c["predicted_category"].null_count() == 0
    wg = answers.filter(pl.col("eval") == "wildguardtest")
    assert set(wg["predicted"].to_list()) <= {"yes", "no"} and wg["p_yes"].null_count() == 0
    # accuracy in the summary is exactly what answers.parquet says
    hle = answers.filter(pl.col("eval") == "hle_multichoice")
    assert m["evals"]["hle_multichoice"]["accuracy"] == round(100 * hle["correct"].mean(), 6)


def test_rerun_sends_nothing_and_score_reproduces_the_summary(data_dir: Path, tmp_path: Path):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    again = run_plan(data_dir, tmp_path, "out2")
    assert again.exit_code == 0
    assert (again.stats[MODEL].sent, again.stats[MODEL].cache_hits, again.stats[MODEL].total) == (
        0,
        12,
        12,
    )
    assert summary(tmp_path / "out2")["models"][0]["requests"]["sent"] == 0
    assert summary(tmp_path / "out2")["models"][0]["requests"]["cache_hits"] == 12
    scored = rescore_cache(data_dir, tmp_path)
    assert (scored.exit_code, scored.out, scored.report, scored.notes) == (
        0,
        tmp_path / "scored",
        None,
        [],
    )
    assert records.to_builtins(scored.summary) == summary(tmp_path / "scored")
    assert without_requests(summary(tmp_path / "scored")) == without_requests(
        summary(tmp_path / "out")
    )
    assert pl.read_parquet(tmp_path / "scored" / "answers.parquet").equals(
        pl.read_parquet(tmp_path / "out" / "answers.parquet")
    )


@pytest.mark.slow
def test_rerun_after_losing_part_of_the_cache_sends_exactly_the_missing(
    data_dir: Path, tmp_path: Path
):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    lost = drop_rows(tmp_path / "cache", 5)
    assert (
        rescore_cache(data_dir, tmp_path, "partial").exit_code == 1
    )  # a provisional result: exit code 1
    partial = summary(tmp_path / "partial")
    missing = {
        name: b["missing"] for name, b in partial["models"][0]["evals"].items() if b.get("missing")
    }
    questions = {"wildguardtest": 3}  # the fixture's WildGuardTest rows have three questions each
    assert sum(missing.values()) == sum(questions.get(t.split("/")[0], 1) for t in lost)
    assert all(partial["models"][0]["evals"][name]["rerun"] == n for name, n in missing.items())
    # never a partial index presented as whole: marked incomplete wherever it is written
    assert (partial["complete"], partial["accepted"], partial["models"][0]["complete"]) == (
        False,
        False,
        False,
    )
    assert (
        rescore_cache(data_dir, tmp_path, "tolerated", allow_failed=allow_failed("1.0")).exit_code
        == 0
    )  # accepted, marked
    tolerated = summary(tmp_path / "tolerated")
    assert (tolerated["complete"], tolerated["accepted"], tolerated["allow_failed"]) == (
        False,
        True,
        {"fraction": 1.0},
    )
    assert tolerated["models"][0]["within_tolerance"] is True
    assert run_plan(data_dir, tmp_path, "out2").exit_code == 0
    requests = summary(tmp_path / "out2")["models"][0]["requests"]
    assert (requests["sent"], requests["cache_hits"]) == (len(lost), 12 - len(lost))
    assert without_requests(summary(tmp_path / "out2")) == without_requests(
        summary(tmp_path / "out")
    )


@pytest.mark.slow
def test_failed_requests_make_the_figures_provisional_and_a_rerun_requests_the_transient_ones(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    whole = summary(tmp_path / "out")
    assert fail_rows(tmp_path / "cache", "when2call", 2) and fail_rows(
        tmp_path / "cache", "hle_multichoice", 1, "fatal"
    )
    capsys.readouterr()
    assert main([*score_args(data_dir, tmp_path)]) == 1  # provisional: exit code 1
    s = summary(tmp_path / "scored")
    (m,) = s["models"]
    w2c, hle = m["evals"]["when2call"], m["evals"]["hle_multichoice"]
    assert (w2c["failed"], w2c["complete"], w2c["rerun"]) == (2, False, 2)
    assert (hle["failed"], hle["complete"], hle["rerun"]) == (
        1,
        False,
        0,
    )  # a deterministic failure is kept
    assert (
        m["evals"]["wildguardtest"]["complete"] is True
        and "rerun" not in m["evals"]["wildguardtest"]
    )
    # over the answered questions, with bounds that hold the complete figure; the index too, marked
    full = whole["models"][0]
    low, high = w2c["accuracy_bounds"]
    assert low <= full["evals"]["when2call"]["accuracy"] <= high
    assert w2c["accuracy_bounds"][0] <= w2c["accuracy"] <= w2c["accuracy_bounds"][1]
    assert m["decision_index_bounds"][0] <= full["decision_index"] <= m["decision_index_bounds"][1]
    assert m["decision_index"] is not None and (m["complete"], m["within_tolerance"]) == (
        False,
        False,
    )
    assert (s["complete"], s["accepted"], s["allow_failed"]) == (False, False, None)
    out = capsys.readouterr().out
    assert f"{MODEL}: provisional (*): 3 failed answer(s) in HLE-MultiChoice, When2Call" in out
    assert (
        "the next `dxi run` with these options asks for 2 of them again (1 deterministic failure(s) are kept"
        in out
    )
    flat = " ".join(out.split())  # the terminal wraps the note: each provisional figure's bounds
    assert (
        "whatever those answers turn out to be, they lie within: decision_index "
        f"{span(m['decision_index_bounds'])}; HLE-MultiChoice accuracy "
        f"{span(hle['accuracy_bounds'])}; When2Call accuracy "
        f"{span(w2c['accuracy_bounds'])};"
    ) in flat
    row = next(line for line in out.splitlines() if line.startswith("│ embedded"))
    assert f"{m['decision_index']:.1f}*" in row and f"{w2c['accuracy']:.1f}*" in row
    assert (
        f"{m['evals']['wildguardtest']['mean_f1']:.1f}*" not in row
    )  # a complete figure is not marked
    # a tolerance accepts them (exit 0), recorded; the figures stay marked
    assert (
        rescore_cache(data_dir, tmp_path, "tolerated", allow_failed=allow_failed("2")).exit_code
        == 0
    )
    tolerated = summary(tmp_path / "tolerated")
    assert (tolerated["accepted"], tolerated["allow_failed"], tolerated["complete"]) == (
        True,
        {"answers": 2},
        False,
    )
    assert (
        rescore_cache(data_dir, tmp_path, "short", allow_failed=allow_failed("1")).exit_code == 1
    )  # 2 in When2Call: > 1
    capsys.readouterr()
    # the figures accepted as they are, the count of failed answers beside them
    assert main([*score_args(data_dir, tmp_path, "accepted"), "--allow-failed", "2"]) == 0
    assert summary(tmp_path / "accepted")["models"][0]["evals"] == tolerated["models"][0]["evals"]
    assert (
        "accepted as they are (the figures over the answered questions, 3 failed answer(s) "
        "beside them): within --allow-failed 2"
    ) in " ".join(capsys.readouterr().out.split())
    assert dxi(*score_args(data_dir, tmp_path, "bad"), "--allow-failed", "-3") == 2  # a usage error
    # the next run sends the two transient failures only, and stays provisional on the kept one
    rerun = run_plan(data_dir, tmp_path, "again")
    assert rerun.exit_code == 1 and (rerun.stats[MODEL].sent, rerun.stats[MODEL].failed) == (2, 0)
    again = summary(tmp_path / "again")["models"][0]
    assert again["requests"]["sent"] == 2 and again["evals"]["when2call"]["complete"] is True
    assert run_plan(data_dir, tmp_path, "retried", retry_failed=True).exit_code == 0
    assert without_requests(summary(tmp_path / "retried")) == without_requests(whole)


def test_limit_and_evals_select_tasks(data_dir: Path, tmp_path: Path):
    assert (
        run_plan(data_dir, tmp_path, limit=1, evals=["when2call", "hle_multichoice"]).exit_code == 0
    )
    m = summary(tmp_path / "out")["models"][0]
    assert m["requests"]["sent"] == 2
    assert m["evals"]["when2call"]["n"] == 1 and m["decision_index"] is None
    assert m["evals"]["wildguardtest"]["reason"].startswith("no data: not selected")


def test_epochs_are_separate_requests(data_dir: Path, tmp_path: Path):
    assert run_plan(data_dir, tmp_path, epochs=2, evals=["when2call"]).stats[MODEL].sent == 6
    m = summary(tmp_path / "out")["models"][0]
    assert m["requests"]["sent"] == 6
    assert m["evals"]["when2call"]["accuracy_sd"] == 0.0  # the embedded model is deterministic


def test_score_names_models_and_errors_clearly(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    assert rescore_cache(data_dir, tmp_path, models=[MODEL]).exit_code == 0
    assert [m["model"] for m in summary(tmp_path / "scored")["models"]] == [MODEL]
    capsys.readouterr()
    assert dxi(*score_args(data_dir, tmp_path), "--model", "systemone:other") == 2
    err = capsys.readouterr().err
    assert "no such model" in err and MODEL in err


def test_missing_data_and_bad_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert dxi(*run_args(tmp_path / "nowhere", tmp_path)) == 2
    assert "no evaluation data found" in capsys.readouterr().err
    assert dxi("run", "--model", "nosuch:x", "--data-dir", str(tmp_path)) == 2
    bad = tmp_path / "bad" / "when2call"
    bad.mkdir(parents=True)
    (bad / "when2call_test_mcq.jsonl").write_text('{"uuid": "u"}\n')
    assert dxi(*run_args(tmp_path / "bad", tmp_path)) == 2
    assert "when2call_test_mcq.jsonl, row 1, field 'question': missing" in capsys.readouterr().err


@pytest.mark.slow
@requires_real_data
def test_real_data_end_to_end(tmp_path: Path):
    assert run_plan(REAL_DATA, tmp_path).exit_code == 0
    first = summary(tmp_path / "out")
    (m,) = first["models"]
    assert {k: v["n"] for k, v in m["evals"].items()} == {
        "aa_omniscience_decision": 500,
        "hle_multichoice": 513,
        "when2call": 300,
        "wildguardtest": 880,
    }
    assert m["requests"]["sent"] == 2193 and m["requests"]["failed"] == 0
    assert 0 <= m["decision_index"] <= 100
    assert run_plan(REAL_DATA, tmp_path, "out2").exit_code == 0
    assert summary(tmp_path / "out2")["models"][0]["requests"]["sent"] == 0
    assert rescore_cache(REAL_DATA, tmp_path).exit_code == 0
    assert without_requests(summary(tmp_path / "scored")) == without_requests(first)
    lost = drop_rows(tmp_path / "cache", 100)
    assert run_plan(REAL_DATA, tmp_path, "out3").exit_code == 0
    again = summary(tmp_path / "out3")
    assert again["models"][0]["requests"]["sent"] == len(lost) == 100
    assert without_requests(again) == without_requests(first)


def test_estimate_warns_that_run_will_need_a_missing_api_key(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-a-real-key")
    args = dxi_args(
        data_dir,
        tmp_path / "cache",
        None,
        models=["openai:gpt-5-mini", "anthropic:claude-x"],
        command="estimate",
    )
    assert main([*args, "--json"]) == 0  # a dry run: it still counts and prices what it can
    doc = orjson.loads(capsys.readouterr().out)
    assert list(doc["problems"]) == ["openai:gpt-5-mini"]
    assert (
        "the environment variable OPENAI_API_KEY is not set" in doc["problems"]["openai:gpt-5-mini"]
    )
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "dxi run will refuse to start" in out and "OPENAI_API_KEY" in out
    assert "not-a-real-key" not in out


def test_estimate_and_run_refuse_an_unknown_embedded_model_as_bad_input(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A model name none of the embedded models' (a typo) is bad input: ``dxi run`` and ``dxi
    estimate`` exit 2 naming it (the old estimate: exit 0, "dxi run will refuse to start"); from a
    run file, with the file, the line and the [[models]] table, as the file's other errors."""
    for command in ("estimate", "run"):
        args = dxi_args(
            data_dir, tmp_path / "cache", None, models=["embedded:nope"], command=command
        )
        assert main(args) == 2
        assert (
            f"dxi {command}: error: --model embedded:nope: unknown embedded model 'nope'; "
            "available: sparrow-nano-general-v1.1, sparrow-nano-robot-v1.2"
        ) in capsys.readouterr().err
    path = tmp_path / "run.toml"
    path.write_text(
        f'data_dir = "{data_dir}"\ncache_dir = "cache"\n\n[[models]]\nprovider = "embedded"\n'
        'model = "sparrow-nano-general-v1.1"\n\n[[models]]\nprovider = "embedded"\n'
        'model = "sparrow-nano-robt-v1.2"\n'
    )
    for command in ("estimate", "run"):
        assert main([command, str(path)]) == 2
        assert " ".join(capsys.readouterr().err.split()) == (
            f"dxi {command}: error: {path}, line 10: models[1].model (the 2nd [[models]] table): "
            "unknown embedded model 'sparrow-nano-robt-v1.2'; available: "
            "sparrow-nano-general-v1.1, sparrow-nano-robot-v1.2"
        )
    assert not (tmp_path / "cache").exists()  # refused before anything was opened


@pytest.mark.slow
@pytest.mark.parametrize("command", ["estimate", "score", "report"])
def test_a_truncated_shard_is_set_aside_by_every_command_that_reads_the_cache(
    data_dir: Path, tmp_path: Path, command: str, caplog: pytest.LogCaptureFixture
):
    other = "embedded:sparrow-nano-robot-v1.2"
    assert run_plan(data_dir, tmp_path).exit_code == 0
    assert run_plan(data_dir, tmp_path, models=[other]).exit_code == 0
    first, second = sorted(
        (tmp_path / "cache").glob("shards/*.parquet")
    )  # one shard per run, in run order
    first.write_bytes(first.read_bytes()[:-100])  # cut off its footer, as a full disk would
    cache = tmp_path / "cache"
    if command == "estimate":
        assert dxi(*dxi_args(data_dir, cache, None, "--json", models=[MODEL], command=command)) == 0
    else:
        assert dxi(*dxi_args(data_dir, cache, tmp_path / command, command=command)) == 0
        models = summary(tmp_path / command)["models"]
        assert [m["model"] for m in models] == [other]  # the damaged shard's model has no rows left
        assert models[0]["requests"]["cache_hits"] == 12
    assert [p.name for p in (tmp_path / "cache").glob("shards/*.parquet")] == [second.name]
    assert [p.name.rsplit(".", 1)[0] for p in (tmp_path / "cache").glob("quarantine/*")] == [
        first.name
    ]
    assert f"{first} is unreadable" in caplog.text and "moved to" in caplog.text


def test_a_full_disk_stops_the_run_with_a_clear_error_and_a_rerun_finishes(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """The 6th row finds the disk full: write(2) takes part of it, then refuses. The run stops
    (exit 4) saying so; the 5 rows before it are kept; the rerun drops the partial row and sends the
    other 7."""
    import os

    from dxi.cache import store

    calls = []

    def full_after_five(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) <= 5:
            return os.write(fd, data)
        if len(calls) == 6:
            return os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write", full_after_five)
    assert main([*run_args(data_dir, tmp_path), "--max-in-flight", "1"]) == 4
    out = capsys.readouterr().err  # a diagnostic: on standard error
    assert (
        "Stopped: cannot write to the cache log" in out
        and "only" in out
        and "rerun the same command" in out
    )
    # it ends with where the outputs are and what they hold (it named no --out folder)
    assert " ".join(out.split()).endswith(
        f"rerun the same command: only what is missing is sent. {tmp_path / 'out'} is left as it "
        "was: none of this scoring's outputs was written there."
    ), out
    monkeypatch.undo()
    assert run_plan(data_dir, tmp_path).exit_code == 0
    requests = summary(tmp_path / "out")["models"][0]["requests"]
    assert (requests["cache_hits"], requests["sent"]) == (5, 7)


def test_score_says_when_the_cache_holds_more_epochs_than_it_scores(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    assert run_plan(data_dir, tmp_path, epochs=2).exit_code == 0
    for model in ({}, {"models": [MODEL]}):
        assert rescore_cache(data_dir, tmp_path, "scored", **model).notes == [
            f"{MODEL}: the cache holds 2 epochs; --epochs 2 scores them all (scored: 1)"
        ]
    assert (
        dxi(*score_args(data_dir, tmp_path), "--model", MODEL) == 0
    )  # the command line prints the note
    assert (
        f"{MODEL}: the cache holds 2 epochs; --epochs 2 scores them all (scored: 1)"
        in capsys.readouterr().out
    )
    assert dxi(*score_args(data_dir, tmp_path), "--epochs", "2") == 0
    out = capsys.readouterr().out
    assert (
        "the cache holds" not in out and "±0.0 sd" in out
    )  # the embedded model: the same answers each epoch
    m = summary(tmp_path / "scored")["models"][0]
    assert (
        m["epochs"] == 2 and m["evals"]["when2call"]["calibration"]["answers"] == 6
    )  # 3 tasks × 2 epochs


def test_a_read_only_cache_is_scored_and_a_run_that_must_write_stops_with_exit_4(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    import os

    from dxi.cache import store

    assert run_plan(data_dir, tmp_path, limit=1).exit_code == 0
    real_open = os.open
    cache = str(tmp_path / "cache")  # a read-only cache (the outputs elsewhere)
    monkeypatch.setattr(
        store.os,
        "open",
        lambda path, flags, *a: (
            (_ for _ in ()).throw(OSError(30, "Read-only file system"))
            if flags & os.O_CREAT and str(path).startswith(cache)
            else real_open(path, flags, *a)
        ),
    )
    capsys.readouterr()
    assert rescore_cache(data_dir, tmp_path, limit=1).exit_code == 0
    assert dxi(*run_args(data_dir, tmp_path)) == 4  # new tasks: a log must be written
    assert (
        "Stopped: the cache cannot be written: cannot create a file in" in capsys.readouterr().err
    )


def test_model_names_are_printed_as_given_never_as_emoji(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    assert (
        main(
            dxi_args(
                data_dir, tmp_path / "c", tmp_path / "o", models=["openai:m@http://127.0.0.1:1/v1"]
            )
        )
        == 6
    )  # its server cannot be reached: stopped
    out = capsys.readouterr().out
    assert "openai:m: cannot reach" in out and "(openai:m)" in out and "Ⓜ" not in out


def test_the_embedded_model_keeps_its_cache_keys(data_dir: Path):
    from dxi import adapters
    from dxi.evals import Suite, discover

    task = next(iter(Suite(discover(data_dir)).tasks()))
    request = adapters.get(MODEL).encode(task)
    assert (request.kind, request.endpoint) == (
        "embedded",
        "/v1/systemone",
    )  # as written since the first version


def test_a_selection_with_no_tasks_scores_empty_beside_a_full_cache(data_dir: Path, tmp_path: Path):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    exact = tmp_path / "hle_exact.jsonl"  # no multiple-choice row: no HLE task at all
    exact.write_text(
        '{"id": "x1", "question": "2+2?", "answer": "4", "answer_type": "exactMatch", "image": ""}\n'
    )
    selected = {"files": {"hle_multichoice": exact}, "evals": ["hle_multichoice"]}
    assert run_plan(data_dir, tmp_path, "again", **selected).exit_code == 0
    assert rescore_cache(data_dir, tmp_path, **selected).exit_code == 0
    m = summary(tmp_path / "scored")["models"][0]
    assert (
        m["evals"]["hle_multichoice"]["reason"] == "no answers for this evaluation"
        and m["decision_index"] is None
    )


@pytest.mark.slow
def test_exclusion_lists_name_their_mistakes(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    listing = tmp_path / "exclude.txt"
    listing.write_text("when2call/u-2\nwhen2call/no-such-task\n")
    assert dxi(*run_args(data_dir, tmp_path), "--exclude", str(listing)) == 0
    out = capsys.readouterr().out
    assert (
        "1 of 2 excluded ids matched" in out
        and "1 excluded id(s) matched no task: check the ids" in out
    )
    assert dxi(*run_args(data_dir, tmp_path), "--exclude", f"hle={listing}") == 2
    assert (
        "'hle' is not an evaluation; write EVAL=FILE with EVAL one of aa_omniscience_decision"
        in capsys.readouterr().err
    )
    listing.write_text("foo/bar\n")
    assert dxi(*run_args(data_dir, tmp_path), "--exclude", str(listing)) == 2
    assert "'foo/bar' names no evaluation" in capsys.readouterr().err
