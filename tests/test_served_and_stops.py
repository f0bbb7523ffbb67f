"""Which model answered, and which failures stop what: a provider that reroutes a retired model is
said so once per model (terminal, summary.json, report, ``dxi view``); OpenAI's invalid-schema 400
stops the model rather than failing each request; a 400 or 404 that names one model stops that model
alone, and the other models on the same base URL go on. Against the fakes on 127.0.0.1, through
``dxi run``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi import scoring
from dxi.adapters.errors import REQUEST, SCOPE_MODEL
from dxi.adapters.provider_errors import provider_stop, refuses_form
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION, Suite, discover
from dxi.runner import rescore
from dxi.runner.cli import main
from dxi.runner.errors import EXIT_PROVIDER_STOPPED
from dxi.runner.planning.inputs import PlanInputs
from dxi.scoring.replies import same_model, usage_and_replies

from .fakes import wire_formats
from .fakes.fake_llm_server import FakeLLM
from .helpers.runs import ONE, run_model


def n_tasks(data_dir: Path) -> int:
    return len(list(Suite(discover(data_dir)).tasks()))


# ---- 5. the served model -------------------------------------------------------------------------
def test_a_snapshot_of_the_model_asked_for_is_the_same_model():
    assert same_model("gpt-6-luna", "gpt-6-luna-2026-09-22") and same_model(
        "gemini-decision-1", "models/gemini-decision-1"
    )
    assert same_model("claude-opus-5-5", "claude-opus-5-5-20261001") and same_model(
        "gemini-3.5-flash", "gemini-3.5-flash-001"
    )
    assert not same_model("gemini-2.5-flash", "gemini-3.5-flash-lite")
    assert not same_model(
        "gemini-3.5-flash", "gemini-3.5-flash-lite"
    )  # another model, not a snapshot
    assert not same_model("gpt-6-luna", "gpt-6-luna-fast")


@pytest.mark.slow
async def test_a_rerouted_retired_model_is_said_once_per_model_and_recorded(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out, cache = tmp_path / "out", tmp_path / "c"
    async with FakeLLM() as server:
        argv = [
            "--model",
            f"gemini:gemini-2.5-flash@{server.url}",
            "--model",
            f"gemini:gemini-3.5-flash@{server.url}",
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
        ]
        assert await asyncio.to_thread(main, ["run", *argv]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    summary = orjson.loads((out / "summary.json").read_bytes())
    retired, current = summary["models"]
    answers = sum(len(t.questions) for t in Suite(discover(data_dir)).tasks())
    assert retired["served_models"] == {"gemini-3.5-flash-lite": answers}
    assert retired["served_differs"] == {
        "requested": "gemini-2.5-flash",
        "served": ["gemini-3.5-flash-lite"],
    }
    assert (
        current["served_models"] == {"gemini-3.5-flash": answers}
        and "served_differs" not in current
    )
    note = (
        f"gemini:gemini-2.5-flash: answered by gemini-3.5-flash-lite ({answers} answers), not gemini-2.5-flash as "
        "asked: the provider served another model, and its answers are scored under this name"
    )
    assert printed.count(note) == 1 and printed.count("answered by") == 1
    # one read of the cache gives the usage table scoring.usage gives, and the replies table
    suite = Suite(discover(data_dir))
    gold, _ = suite.gold_frames()
    with Cache(cache) as opened:
        models = opened.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
        used, table = opened.read(lambda rows: usage_and_replies(rows, models, gold))
        assert used.equals(opened.read(lambda rows: scoring.usage(rows, models, gold)))
    by_name = table.group_by("served_model").agg(pl.col("replies", "answers").sum())
    assert by_name.sort("served_model").rows() == [
        ("gemini-3.5-flash", n_tasks(data_dir), answers),
        ("gemini-3.5-flash-lite", n_tasks(data_dir), answers),
    ]
    # dxi score says it again from the cache alone; the report shows it
    inputs = PlanInputs(
        models=[argv[1], argv[3]], data_dir=data_dir, cache_dir=cache, out=tmp_path / "r"
    )
    assert rescore.rescore(rescore.select(inputs), html=True).exit_code == 0
    html = (tmp_path / "r" / "report.html").read_text()
    assert (
        "answered by gemini-3.5-flash-lite" in html
        and html.count("not gemini-2.5-flash as asked") == 1
    )


async def test_the_view_shows_the_served_model_and_the_clamp_on_the_calibration_page(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from urllib.parse import quote

    from .helpers.view import caught_view, fetch

    common = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "c"), "-q"]
    async with FakeLLM() as server:
        models = [
            "--model",
            f"gemini:gemini-2.5-flash@{server.url}",
            "--model",
            f"gemini-decisions:gemini-decision-1@{server.url}",
        ]
        assert (
            await asyncio.to_thread(main, ["run", *models, "--out", str(tmp_path / "o"), *common])
            == 0
        )
    browser = await asyncio.to_thread(caught_view, monkeypatch, *common)
    try:
        (_, _, overview), (_, _, calibration) = await fetch(
            browser, "/", f"/calibration?m={quote('gemini-decisions:gemini-decision-1')}"
        )
    finally:
        browser.close()
    assert "gemini:gemini-2.5-flash: answered by gemini-3.5-flash-lite (" in overview
    assert "not gemini-2.5-flash as asked" in overview
    assert "Its provider clamps P(yes) to [0.01, 0.99]" in calibration


# ---- 6. error classes ----------------------------------------------------------------------------
def test_a_400_is_classified_by_its_structured_fields_before_its_words():
    invalid_schema = wire_formats._openai_refusal(
        wire_formats.INVALID_SCHEMA, "response_format", None
    ).body
    assert refuses_form(invalid_schema["error"])  # its text says "context", its param says the form
    stop = provider_stop(400, orjson.dumps(invalid_schema), "m", "s", 0.0)
    assert (stop.cause, stop.scope, stop.field) == (REQUEST, SCOPE_MODEL, "response_format")
    too_long = {
        "message": "This model's maximum context length is 8192 tokens; your schema is unsupported",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    assert not refuses_form(too_long)  # its words say "schema", its code says the content
    assert not refuses_form({"message": "unsupported schema", "param": "messages[1].content"})
    google = {
        "code": 400,
        "status": "INVALID_ARGUMENT",
        "message": "Request contains an invalid argument.",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [
                    {
                        "field": "generation_config.thinking_config.thinking_level",
                        "description": "thinking_level is not supported by this model.",
                    }
                ],
            }
        ],
    }
    assert refuses_form(google)
    google["details"][0]["fieldViolations"][0]["field"] = "contents[0].parts[0].text"
    assert not refuses_form(google)
    # without any structured field (Anthropic's body): its words
    assert refuses_form(
        {
            "type": "invalid_request_error",
            "message": "output_config.effort 'xhigh' is not supported",
        }
    )
    assert not refuses_form(
        {"type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000"}
    )


async def test_the_invalid_schema_400_stops_the_model_instead_of_failing_each_request(
    data_dir: Path, tmp_path: Path
):
    limiters: dict = {}
    async with FakeLLM(default="invalid_schema") as server:
        _, stats, rows = await run_model(
            f"openai:gpt-fake@{server.url}/v1",
            data_dir,
            tmp_path / "c",
            ONE,
            limit=3,
            limiters=limiters,
        )
    ((stop, _),) = next(iter(limiters.values())).stopped_models.values()
    assert (len(server.requests), stats.refused, stats.not_sent, stats.failed, rows.height) == (
        1,
        1,
        2,
        0,
        0,
    )
    assert (stop.cause, stop.field) == (REQUEST, "response_format") and str(stop).endswith(
        wire_formats.INVALID_SCHEMA
    )


async def test_an_unknown_model_stops_alone_and_the_others_on_its_base_url_go_on(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "out"
    async with FakeLLM() as server:
        base = f"{server.url}/v1"
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--model",
                f"openai:gpt-4-retired@{base}",
                "--model",
                f"openai:gpt-fake@{base}",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(tmp_path / "c"),
                "--out",
                str(out),
                "--max-in-flight",
                "1",
            ],
        )
    summary = orjson.loads((out / "summary.json").read_bytes())
    retired, alive = summary["models"]
    n = n_tasks(data_dir)
    assert code == EXIT_PROVIDER_STOPPED
    assert alive["requests"]["sent"] == n and alive["decision_index"] is not None
    assert (retired["requests"]["refused"], retired["requests"]["not_sent"]) == (1, n - 1)
    (block,) = summary["stopped_providers"]
    assert (
        block["scope"],
        block["provider"],
        block["models"],
        block["cause"],
        block["http_status"],
    ) == ("model", f"openai@{base}", ["openai:gpt-4-retired"], "unknown model", 404)
    assert block["message"].endswith(
        "The model `gpt-4-retired` does not exist or you do not have access to it."
    )
    assert sum(1 for _, b in server.requests if b["model"] == "gpt-4-retired") == 1
