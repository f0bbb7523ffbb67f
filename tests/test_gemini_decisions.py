"""The Gemini Decisions adapter (``gemini-decisions:gemini-decision-1``): every request body and
every reply the fakes serve held against the google-genai SDK's own types
(``google.genai.decisions``: ``CreateDecisionRequest``, ``CreateDecisionResponse``), the mapping of
answers, the documented clamp of ``noul`` to [0.01, 0.99], and the whole index scored end to end
through ``dxi run`` against the fake on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import polars as pl
import pytest
from google.genai import decisions

from dxi import adapters
from dxi.evals import CHOICE, Suite, discover, gold_frames
from dxi.runner.cli import main

from .conftest import REAL_DATA, requires_real_data
from .fakes import wire_formats
from .fakes.fake_llm_server import FakeLLM
from .fakes.fake_provider import FakeProvider
from .helpers.runs import run_model
from .helpers.sdk_types import conforms, reply_problems

MODES = ("ok", "blocked", "bad_sum", "missing", "sure")


def tasks(data_dir: Path) -> list:
    return list(Suite(discover(data_dir)).tasks())


def request_problems(body: dict) -> list[str]:
    """The body against the SDK's request TypedDict (every key declared) and its pydantic model
    (strict types)."""
    problems = conforms(body, decisions.CreateDecisionRequestParam)
    try:
        decisions.CreateDecisionRequest.model_validate_json(orjson.dumps(body), strict=True)
    except Exception as exc:  # pydantic.ValidationError
        problems.append(str(exc))
    return problems


def adapter() -> adapters.Adapter:
    return adapters.get("gemini-decisions:gemini-decision-1@http://127.0.0.1:1")


def test_every_body_and_every_reply_conforms_to_the_sdk_types(data_dir: Path):
    a = adapter()
    sources = [tasks(data_dir)] + (
        [list(Suite(discover(REAL_DATA), limit=20).tasks())] if REAL_DATA.is_dir() else []
    )
    checked = 0
    for suite_tasks in sources:
        for task in suite_tasks:
            body = orjson.loads(a.encode(task).body)
            assert request_problems(body) == [], task.id
            for mode in MODES:
                assert (
                    reply_problems(
                        decisions.CreateDecisionResponse, wire_formats.gemini_decisions(body, mode)
                    )
                    == []
                ), mode
            checked += 1
    assert checked == sum(len(t) for t in sources) > 0
    # the checker is not blind: a criteria value that is not text, an unknown key, an answer without
    # confidence
    bad = {
        "model": "models/m",
        "input": "x",
        "questions": {"q": {"type": "choice", "instructions": "i", "criteria": {"A": 1, "B": "b"}}},
    }
    assert request_problems(bad) != []
    assert request_problems(
        {**orjson.loads(a.encode(tasks(data_dir)[0]).body), "temperature": 0}
    ) == ["$.temperature: not a field of CreateDecisionRequestParam"]
    assert (
        reply_problems(
            decisions.CreateDecisionResponse, {"answers": {"q": {"type": "noul", "noul": 0.5}}}
        )
        != []
    )


def test_the_body_maps_each_question_as_documented(data_dir: Path):
    a = adapter()
    choice = next(t for t in tasks(data_dir) if t.eval == "when2call")
    yes_no = next(t for t in tasks(data_dir) if t.eval == "wildguardtest")
    q = choice.questions[0]
    assert orjson.loads(a.encode(choice).body) == {
        "model": "models/gemini-decision-1",
        "input": choice.state,
        "questions": {
            q.id: {
                "type": "choice",
                "instructions": q.text,
                "criteria": {o.id: o.text for o in q.options},
            }
        },
    }
    assert orjson.loads(a.encode(yes_no).body)["questions"] == {
        q.id: {"type": "noul", "instructions": q.text} for q in yes_no.questions
    }
    assert list(orjson.loads(a.encode(choice).body)["questions"][q.id]["criteria"]) == [
        o.id for o in q.options
    ]
    assert a.url == "http://127.0.0.1:1/v1beta/decisions" and a.encode(choice).endpoint == a.url
    assert adapters.get("gemini-decisions:gemini-decision-1").url == (
        "https://generativelanguage.googleapis.com/v1beta/decisions"
    )
    assert a.output_tokens_bound(choice) == 0 and a.P_YES_RANGE == (0.01, 0.99)
    with pytest.raises(ValueError, match="no effort setting|takes no"):
        adapters.get(adapters.ModelSpec("gemini-decisions", "gemini-decision-1", effort="low"))


def test_replies_decode_to_validated_answers(data_dir: Path):
    a = adapter()
    for task in tasks(data_dir):
        body = orjson.loads(a.encode(task).body)
        ok = a.decode(task, orjson.dumps(wire_formats.gemini_decisions(body)))
        assert (ok.input_tokens, ok.output_tokens, ok.served_model) == (
            wire_formats.prompt_tokens(body),
            0,
            None,
        )
        for q, answer in zip(task.questions, ok.answers, strict=True):
            if q.kind == CHOICE:  # the last option holds 0.6
                assert (answer.predicted, answer.p_predicted) == (
                    q.options[-1].id,
                    wire_formats.P_LAST,
                )
            else:  # P(true) 0.4: no
                assert (answer.predicted, answer.p_yes) == ("no", 0.4)
        blocked = a.decode(task, orjson.dumps(wire_formats.gemini_decisions(body, "blocked")))
        assert [x.error for x in blocked.answers] == [
            "input blocked (prompt_feedback.block_reason safety): The input was blocked."
        ] * len(task.questions)
        missing = a.decode(task, orjson.dumps(wire_formats.gemini_decisions(body, "missing")))
        assert missing.answers[0].error == "no answer for this question"
        sure = a.decode(task, orjson.dumps(wire_formats.gemini_decisions(body, "sure")))
        for q, answer in zip(task.questions, sure.answers, strict=True):
            if q.kind != CHOICE:  # as sure as the model can be: 0.99, the documented clamp, never 1
                assert (answer.predicted, answer.p_yes, answer.p_predicted) == ("yes", 0.99, 0.99)
    w2c = next(t for t in tasks(data_dir) if t.eval == "when2call")
    bad = a.decode(
        w2c,
        orjson.dumps(wire_formats.gemini_decisions(orjson.loads(a.encode(w2c).body), "bad_sum")),
    )
    assert bad.answers[0].error == "probabilities sum to 1.366600, not 1 (tolerance 0.001)"
    with pytest.raises(adapters.MalformedReply, match="no 'answers' object"):
        a.decode(w2c, b'{"usage": {}}')


def test_the_key_is_read_as_the_sdk_reads_it(monkeypatch: pytest.MonkeyPatch):
    a = adapters.get("gemini-decisions:gemini-decision-1")
    for name in ("GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert a.missing_setup() == (
        "gemini-decisions:gemini-decision-1: the environment variable GEMINI_API_KEY (or GOOGLE_API_KEY) is not set; "
        "export the API key for https://generativelanguage.googleapis.com as GEMINI_API_KEY (or name another "
        "variable with --option api_key_env=NAME, or give a command that prints a token: api_key_command)"
    )
    monkeypatch.setenv("GEMINI_API_KEY", "g-key")
    assert (a.missing_setup(), a.key_env) == (None, "GEMINI_API_KEY")
    monkeypatch.setenv("GOOGLE_API_KEY", "k-key")  # both set: GOOGLE_API_KEY, as the SDK
    assert a.key_env == "GOOGLE_API_KEY"


async def test_the_key_goes_in_x_goog_api_key_and_a_stated_delay_is_honoured(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-decisions-key-0123")
    async with FakeLLM(script=["429body:1"]) as server:
        _, stats, rows = await run_model(
            f"gemini-decisions:gemini-decision-1@{server.url}", data_dir, tmp_path / "c"
        )
    assert [h["x-goog-api-key"] for h in server.headers] == ["gemini-decisions-key-0123"] * 2
    assert [path for path, _ in server.requests] == ["/v1beta/decisions"] * 2
    assert server.times[1] - server.times[0] >= 1.0  # the body's RetryInfo, not the 0.01 s backoff
    assert (stats.attempts, stats.rate_limited, stats.ok, rows["status"].to_list()) == (
        2,
        1,
        1,
        ["ok"],
    )


def _expected(data: Path, subset: str = "agreed") -> dict:
    """The fake's scores on ``data`` computed from the gold labels: it picks every choice's last
    option (for AA-Omniscience-Decision that is E, "I don't know") and answers every yes/no question
    no (P(true) 0.4)."""
    gold, _ = gold_frames(Suite(discover(data), wildguard_subset=subset).tasks())
    last = {
        t.id: t.questions[0].options[-1].id
        for t in Suite(discover(data), wildguard_subset=subset).tasks()
        if t.questions[0].kind == CHOICE
    }
    choice = gold.filter(pl.col("kind") == "choice").with_columns(
        pl.col("task_id").replace_strict(last).alias("pick")
    )
    acc = {e: 100 * (part["pick"] == part["gold"]).mean() for (e,), part in choice.group_by("eval")}
    return acc


@pytest.mark.process
async def test_the_whole_index_end_to_end_through_dxi_run(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "out"
    async with FakeProvider() as server:
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--model",
                f"gemini-decisions:gemini-decision-1@{server.url}",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(tmp_path / "c"),
                "--out",
                str(out),
            ],
        )
        sent = server.stats()["ok"]
    summary = orjson.loads((out / "summary.json").read_bytes())
    (entry,) = summary["models"]
    n_tasks = len(tasks(data_dir))
    assert code == 0 and sent == n_tasks
    assert entry["model"] == "gemini-decisions:gemini-decision-1" and entry["p_yes_range"] == [
        0.01,
        0.99,
    ]
    assert entry["requests"]["sent"] == n_tasks and entry["cut_off"] == {
        "replies": 0,
        "while_thinking": 0,
        "answers": 0,
    }
    assert (
        entry["served_models"] == {} and entry["effort"] is None
    )  # the reply names no model; no effort setting
    acc = _expected(data_dir)
    for name, metric in (("hle_multichoice", "accuracy"), ("when2call", "accuracy")):
        assert entry["evals"][name][metric] == pytest.approx(acc[name], abs=1e-6)
    omni = entry["evals"]["aa_omniscience_decision"]  # always "I don't know": never a hallucination
    assert (omni["accuracy"], omni["non_hallucination_rate"]) == (
        pytest.approx(acc["aa_omniscience_decision"]),
        100.0,
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "gemini-decisions:gemini-decision-1: P(yes) is clamped by the provider to [0.01, 0.99]"
        in printed
    )


@pytest.mark.slow
@requires_real_data
async def test_the_whole_index_on_the_real_data(tmp_path: Path):
    out = tmp_path / "out"
    async with FakeProvider() as server:
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--model",
                f"gemini-decisions:gemini-decision-1@{server.url}",
                "--data-dir",
                str(REAL_DATA),
                "--cache-dir",
                str(tmp_path / "c"),
                "--out",
                str(out),
                "--max-in-flight",
                "32",
                "-q",
            ],
        )
    summary = orjson.loads((out / "summary.json").read_bytes())
    (entry,) = summary["models"]
    evals = entry["evals"]
    acc = _expected(REAL_DATA)
    assert (
        code == 0
        and sum(b["n"] for b in evals.values())
        == entry["requests"]["sent"]
        == 500 + 513 + 300 + 880
    )
    assert all(b["invalid"] == b["failed"] == b["missing"] == 0 for b in evals.values())
    # every yes/no answer "no": no true positive, so each WildGuardTest F1 is 0 (every question has
    # positives)
    assert (
        evals["wildguardtest"]["mean_f1"],
        evals["aa_omniscience_decision"]["non_hallucination_rate"],
    ) == (0.0, 100.0)
    index = (
        0.125 * acc["aa_omniscience_decision"]
        + 0.125 * 100
        + 0.25 * acc["hle_multichoice"]
        + 0.25 * acc["when2call"]
        + 0.25 * 0
    )
    assert entry["decision_index"] == pytest.approx(index, abs=1e-6)
    # calibration: the yes/no answers' confidence is max(P, 1 - P) = 0.6 within [0.01, 0.99]
    assert evals["wildguardtest"]["calibration"]["answers"] == 3 * 880
