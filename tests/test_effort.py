"""Today's language models: one effort setting mapped to each provider's own field (and so into the
body and the cache key), output budgets that leave room for thinking, cut-offs that say they were
spent thinking, and logprob decisions on OpenAI's current reasoning models. Against fakes that
answer as the providers document today (``tests/fakes/wire_formats.py``: thinking counted within the
budget, logprobs refused unless the effort is none, ``max_tokens`` refused by reasoning models),
over HTTP on 127.0.0.1 and through ``dxi run``."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi import adapters
from dxi.adapters import EFFORTS, ModelSpec, budgets, llm
from dxi.adapters.logprobs import NO_LOGPROBS, NO_LOGPROBS_AT_NONE
from dxi.evals import Suite, discover
from dxi.runner import export, rescore, session
from dxi.runner.cli import main, parser
from dxi.runner.errors import EXIT_PROVIDER_STOPPED, UsageError
from dxi.runner.planning import plan as plans
from dxi.runner.planning.inputs import PlanInputs
from dxi.runner.planning.plan import from_args

from .fakes import wire_formats
from .fakes.fake_llm_server import FakeLLM
from .helpers.runs import FAST, run_model
from .helpers.sdk_types import ANTHROPIC_BODY, OPENAI_BODY, conforms, gemini_problems

# the provider's own field of each adapter's effort, read back from a request body
NATIVE = {
    "openai": lambda body: body["reasoning_effort"],
    "logprobs": lambda body: body[0]["reasoning_effort"],
    "anthropic": lambda body: body["output_config"]["effort"],
    "gemini": lambda body: body["generationConfig"]["thinkingConfig"]["thinkingLevel"],
}
MODELS = {
    "openai": "gpt-6-luna",
    "logprobs": "gpt-6-luna",
    "anthropic": "claude-sonnet-5-5",
    "gemini": "gemini-3.5-flash",
}


def tasks(data_dir: Path) -> list:
    return list(Suite(discover(data_dir)).tasks())


def body_of(a: adapters.Adapter, task) -> dict | list:
    return orjson.loads(a.encode(task).body)


# ---- 1. one effort setting -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(NATIVE))
def test_effort_low_reaches_each_providers_own_field_and_the_cache_key(data_dir: Path, kind: str):
    task = tasks(data_dir)[0]
    url = "http://127.0.0.1:1" + ("/v1" if kind in ("openai", "logprobs") else "")
    plain = adapters.get(ModelSpec(kind, MODELS[kind], url))
    low = adapters.get(ModelSpec(kind, MODELS[kind], url, effort="low"))
    assert NATIVE[kind](body_of(low, task)) == ("LOW" if kind == "gemini" else "low")
    assert low.effort == "low" and low.encode(task).key != plain.encode(task).key
    assert "low" in low.params_key.lower() and low.encode(task).params == low.params_key
    body = body_of(low, task)
    problems = {
        "openai": lambda: conforms(body, OPENAI_BODY),
        "anthropic": lambda: conforms(body, ANTHROPIC_BODY),
        "gemini": lambda: gemini_problems(body),
        "logprobs": lambda: conforms(body[0], OPENAI_BODY),
    }[kind]()
    assert problems == []  # the SDK's own request types take the level where it is written


def test_every_level_maps_or_is_refused_naming_the_levels_the_field_takes():
    taken = {
        kind: [e for e in EFFORTS if _maps(kind, e)] for kind in ("openai", "anthropic", "gemini")
    }
    assert taken == {
        "openai": list(EFFORTS),
        "anthropic": ["low", "medium", "high", "xhigh", "max"],
        "gemini": ["minimal", "low", "medium", "high", "xhigh"],
    }
    with pytest.raises(
        ValueError,
        match=r"anthropic: effort 'none' is not a level of output_config.effort \(it takes "
        r"low, medium, high, xhigh, max\); to turn thinking off .* thinking=",
    ):
        adapters.get(ModelSpec("anthropic", "claude-sonnet-5-5", effort="none"))
    with pytest.raises(
        ValueError, match=r"gemini: effort 'max' is not a level of thinkingConfig.thinkingLevel"
    ):
        adapters.get(ModelSpec("gemini", "gemini-3.5-flash", effort="max"))
    with pytest.raises(ValueError, match="disagree: give one"):
        adapters.get(
            ModelSpec("openai", "gpt-6-luna", params={"reasoning_effort": "high"}, effort="low")
        )
    with pytest.raises(ValueError, match="thinkingBudget do not combine"):
        adapters.get(
            ModelSpec(
                "gemini",
                "gemini-2.5-pro",
                params={"thinkingConfig": {"thinkingBudget": 0}},
                effort="low",
            )
        )
    # the native field given as a parameter is the same effort (summary.json reads it back)
    assert (
        adapters.get(
            ModelSpec("gemini", "g", params={"thinkingConfig": {"thinkingBudget": 512}})
        ).effort
        is None
    )
    assert (
        adapters.get(ModelSpec("openai", "gpt-6-luna", params={"reasoning_effort": "high"})).effort
        == "high"
    )


def _maps(kind: str, effort: str) -> bool:
    try:
        adapters.get(ModelSpec(kind, MODELS[kind], effort=effort))
    except ValueError:
        return False
    return True


def test_anthropic_output_config_merges_with_the_schema_key_by_key(data_dir: Path):
    task = tasks(data_dir)[0]
    schema = llm.answer_schema(task)
    fmt = {"type": "json_schema", "schema": schema}
    given = adapters.get(
        ModelSpec("anthropic", "claude-opus-5-5", params={"output_config": {"effort": "low"}})
    )
    flag = adapters.get(ModelSpec("anthropic", "claude-opus-5-5", effort="low"))
    assert (
        body_of(given, task)["output_config"]
        == body_of(flag, task)["output_config"]
        == {"effort": "low", "format": fmt}
    )
    assert given.encode(task).key == flag.encode(task).key  # one setting, however it is given
    assert body_of(adapters.get("anthropic:claude-3-5-haiku-20241022"), task)["output_config"] == {
        "format": fmt
    }
    with pytest.raises(ValueError, match="output_config.format is set by the adapter itself"):
        adapters.get(
            ModelSpec(
                "anthropic", "claude-opus-5-5", params={"output_config": {"format": {"type": "x"}}}
            )
        )
    tool = adapters.get(
        ModelSpec(
            "anthropic", "claude-3-5-haiku-20241022", effort="low", options={"structured": "tool"}
        )
    )
    assert body_of(tool, task)["output_config"] == {"effort": "low"} and "tool_choice" in body_of(
        tool, task
    )


def test_effort_on_the_command_line_and_in_a_run_file(data_dir: Path, tmp_path: Path):
    def plan(*argv: str):
        return from_args(parser().parse_args(["run", *argv, "--data-dir", str(data_dir)]))

    models = plan("--model", "openai:gpt-6-luna", "--model", "embedded", "--effort", "high").models
    assert [m.adapter.effort for m in models] == ["high", None]  # a decision model has none
    with pytest.raises(UsageError, match="--effort: no model of this run has an effort setting"):
        plan("--model", "embedded", "--effort", "low")
    run = tmp_path / "run.toml"
    run.write_text(
        '[[models]]\nprovider = "anthropic"\nmodel = "claude-sonnet-5-5"\neffort = "max"\n\n'
        '[[models]]\nprovider = "openai"\nmodel = "gpt-6-luna"\n\n[[models]]\nprovider = "embedded"\n'
    )
    file_models = plan(str(run)).models
    assert [m.adapter.effort for m in file_models] == ["max", None, None]
    assert file_models[0].adapter.params == {
        "max_tokens": budgets.DEEP_THINKING_BUDGET,
        "output_config": {"effort": "max"},
    }
    assert [m.adapter.effort for m in plan(str(run), "--effort", "low").models] == [
        "low",
        "low",
        None,
    ]  # every one
    frame = from_args(
        parser().parse_args(["run", str(run), "--data-dir", str(data_dir)])
    ).models_frame()
    assert frame["effort"].to_list() == ["max", None, None]
    run.write_text('[[models]]\nprovider = "openai"\nmodel = "gpt-6-luna"\neffort = "extreme"\n')
    with pytest.raises(
        UsageError,
        match=r"models\[0\].effort .*'extreme' is not one of none, minimal, low, medium, high, "
        "xhigh, max",
    ):
        plan(str(run))
    run.write_text('[[models]]\nprovider = "embedded"\neffort = "low"\n')
    with pytest.raises(UsageError, match="embedded is a decision model: it has no effort setting"):
        plan(str(run))


async def test_effort_through_dxi_run_reaches_the_server_the_cache_the_summary_and_the_export(
    data_dir: Path, tmp_path: Path
):
    out, cache = tmp_path / "out", tmp_path / "c"
    async with FakeLLM() as server:
        argv = [
            "--model",
            f"anthropic:claude-sonnet-5-5@{server.url}",
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(cache),
            "--evals",
            "when2call",
            "--out",
            str(out),
            "-q",
        ]
        assert await asyncio.to_thread(main, ["run", *argv, "--effort", "low"]) == 0
        n = len(server.requests)
        given = {
            "models": [argv[1]],
            "data_dir": data_dir,
            "cache_dir": cache,
            "evals": ["when2call"],
        }
        again = await asyncio.to_thread(session.run, plans.build(**given, out=out, effort="low"))
        assert again.exit_code == 0  # all cached: nothing sent
        assert len(server.requests) == n
        medium = await asyncio.to_thread(
            session.run, plans.build(**given, out=out, effort="medium")
        )
        assert medium.exit_code == 0  # another key: sent again
    assert [b["output_config"]["effort"] for _, b in server.requests] == ["low"] * n + [
        "medium"
    ] * n
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["models"][0]["effort"] == "medium"
    low = PlanInputs(**given, effort="low")
    assert (
        rescore.rescore(rescore.select(replace(low, out=out))).exit_code == 0
    )  # dxi score finds the configuration
    assert orjson.loads((out / "summary.json").read_bytes())["models"][0]["effort"] == "low"
    assert export.export(rescore.select(low), "parquet", tmp_path / "a.parquet").exit_code == 0
    assert pl.read_parquet(tmp_path / "a.parquet")["effort"].unique().to_list() == ["low"]
    assert export.export(rescore.select(low), "eee", tmp_path / "eee").exit_code == 0
    records = [orjson.loads(p.read_bytes()) for p in (tmp_path / "eee").rglob("*.json")]
    assert records and {r["model_info"]["additional_details"]["effort"] for r in records} == {"low"}
    assert {
        orjson.dumps(e["generation_config"]) for r in records for e in r["evaluation_results"]
    } == {b'{"generation_args":{"reasoning":true},"additional_details":{"effort":"low"}}'}
    # every model in the cache (no --model): the effort is read back from each one's parameters
    everything = PlanInputs(
        data_dir=data_dir, cache_dir=cache, evals=["when2call"], out=tmp_path / "all"
    )
    assert rescore.rescore(rescore.select(everything)).exit_code == 0
    found = orjson.loads((tmp_path / "all" / "summary.json").read_bytes())["models"]
    assert sorted(m["effort"] for m in found) == ["low", "medium"]


async def test_a_level_the_model_refuses_stops_that_model_with_the_providers_message(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    # gpt-5-mini has no effort none (its 400 names reasoning_effort): it stops alone; gpt-6-luna
    # beside it on the same base URL answers everything
    out = tmp_path / "out"
    async with FakeLLM() as server:
        run = tmp_path / "run.toml"
        run.write_text(
            f'[providers.oai]\nkind = "openai"\nbase_url = "{server.url}/v1"\n\n'
            '[[models]]\nprovider = "oai"\nmodel = "gpt-5-mini"\neffort = "none"\n\n'
            '[[models]]\nprovider = "oai"\nmodel = "gpt-6-luna"\neffort = "none"\n'
        )
        code = await asyncio.to_thread(
            main,
            [
                "run",
                str(run),
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
    n = len(tasks(data_dir))
    luna = next(m for m in summary["models"] if m["model"] == "openai:gpt-6-luna")
    mini = next(m for m in summary["models"] if m["model"] == "openai:gpt-5-mini")
    assert (
        code == EXIT_PROVIDER_STOPPED
        and luna["requests"]["sent"] == n
        and luna["decision_index"] is not None
    )
    assert (
        mini["requests"]["refused"],
        mini["requests"]["not_sent"],
        mini["requests"]["sent"],
    ) == (1, n - 1, 0)
    (block,) = summary["stopped_providers"]
    assert (block["scope"], block["models"], block["cause"], block["http_status"]) == (
        "model",
        ["openai:gpt-5-mini"],
        "request refused",
        400,
    )
    assert block["message"].endswith(
        "Unsupported value: 'reasoning_effort' does not support 'none' with this model. "
        "Supported values are: 'minimal', 'low', 'medium', 'high'."
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert f"Model stopped: openai:gpt-5-mini (on {block['provider']}) stopped alone at" in printed
    assert "the provider's other models went on" in printed


# ---- 2. output budgets that leave room for thinking ----------------------------------------------
def test_anthropic_default_budgets_follow_the_model_and_effort(data_dir: Path):
    task = tasks(data_dir)[0]

    def default(model: str, **spec) -> int:
        return adapters.get(ModelSpec("anthropic", model, **spec)).params["max_tokens"]

    assert [
        default(m)
        for m in (
            "claude-opus-5-5",
            "claude-sonnet-5-5",
            "claude-haiku-5-5",
            "claude-fable-5-1",
            "claude-mythos-5-1",
            "claude-opus-5",
            "anthropic.claude-opus-5-5-v1",
        )
    ] == [16_000] * 7
    assert [
        default("claude-opus-5-5", effort=e) for e in ("low", "medium", "high", "xhigh", "max")
    ] == [16_000, 16_000, 16_000, 64_000, 64_000]
    # older models answer without thinking: their requests (and cache keys) are unchanged
    assert [
        default(m) for m in ("claude-opus-4-8", "claude-3-5-haiku-20241022", "claude-fake")
    ] == [1024] * 3
    assert default("claude-opus-4-8", params={"thinking": {"type": "adaptive"}}) == 16_000
    assert (
        default("claude-opus-4-8", params={"thinking": {"type": "enabled", "budget_tokens": 4000}})
        == 5024
    )
    assert default("claude-sonnet-5-5", params={"thinking": {"type": "disabled"}}) == 1024
    assert default("claude-sonnet-5-5", params={"max_tokens": 2000}) == 2000  # the user's wins
    # the cost bound reserves the budget the request carries
    assert adapters.get("anthropic:claude-sonnet-5-5").output_tokens_bound(task) == 16_000


async def test_the_old_anthropic_default_is_cut_off_while_thinking_and_the_new_one_is_not(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    argv = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "c"), "--evals", "when2call"]
    async with FakeLLM() as server:
        # thinks by default, at effort high: 6,000 tokens
        model = f"anthropic:claude-sonnet-5-5@{server.url}"
        old = await asyncio.to_thread(
            main,
            [
                "run",
                "--model",
                model,
                "--param",
                "max_tokens=1024",
                *argv,
                "--out",
                str(tmp_path / "old"),
            ],
        )
        printed = " ".join(capsys.readouterr().out.split())
        new = await asyncio.to_thread(
            main, ["run", "--model", model, *argv, "--out", str(tmp_path / "new")]
        )
    n = len([t for t in tasks(data_dir) if t.eval == "when2call"])
    assert [b["max_tokens"] for _, b in server.requests] == [1024] * n + [16_000] * n
    old_summary = orjson.loads((tmp_path / "old" / "summary.json").read_bytes())["models"][0]
    new_summary = orjson.loads((tmp_path / "new" / "summary.json").read_bytes())["models"][0]
    assert old == 0 and old_summary["evals"]["when2call"]["invalid"] == n
    assert old_summary["cut_off"] == {"replies": n, "while_thinking": n, "answers": n}
    reason = (
        "cut off at the token limit while thinking (stop_reason max_tokens), before any answer: raise max_tokens "
        "or lower --effort"
    )
    assert old_summary["invalid_reasons"] == [{"error": reason, "count": n}]
    assert (
        f"anthropic:claude-sonnet-5-5: {n} replies cut off at the token limit ({n} while thinking), {n} answers "
        "scored wrong: the budget, not the model, lost these points"
    ) in printed
    assert new == 0 and new_summary["evals"]["when2call"]["invalid"] == 0
    assert new_summary["cut_off"] == {"replies": 0, "while_thinking": 0, "answers": 0}
    assert new_summary["evals"]["when2call"]["accuracy"] is not None


async def test_openai_and_gemini_are_uncapped_by_default_and_a_small_cap_is_cut_off_while_thinking(
    data_dir: Path, tmp_path: Path
):
    async with FakeLLM() as server:
        luna = f"openai:gpt-6-luna@{server.url}/v1"
        _, ok, rows_ok = await run_model(luna, data_dir, tmp_path / "a")
        _, cut, rows_cut = await run_model(
            adapters.ModelSpec(
                "openai", "gpt-6-luna", f"{server.url}/v1", params={"max_completion_tokens": 1000}
            ),
            data_dir,
            tmp_path / "b",
        )
        flash = adapters.ModelSpec(
            "gemini",
            "gemini-3.5-flash",
            server.url,
            params={"maxOutputTokens": 1000},
            effort="high",
        )
        _, gem, rows_gem = await run_model(flash, data_dir, tmp_path / "g")
    bodies = [b for _, b in server.requests]
    assert (
        "max_completion_tokens" not in bodies[0] and "max_tokens" not in bodies[0]
    )  # the model's own maximum
    assert (ok.ok, rows_ok["output_tokens"][0]) == (1, wire_formats.REASONING_TOKENS["medium"] + 5)
    row = rows_cut.row(0, named=True)
    assert (cut.invalid, row["cut_off"], row["answers"][0]["error"]) == (
        1,
        "thinking",
        "cut off at the token limit while thinking (finish_reason length), before any answer: raise "
        "max_completion_tokens or lower --effort",
    )
    row = rows_gem.row(0, named=True)
    assert bodies[2]["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "HIGH"}
    assert (gem.invalid, row["cut_off"], row["answers"][0]["error"]) == (
        1,
        "thinking",
        "cut off at the token limit while thinking (finishReason MAX_TOKENS), before any answer: raise "
        "maxOutputTokens or lower --effort",
    )


def test_a_reply_cut_within_its_answer_says_so(data_dir: Path):
    adapter = adapters.get("anthropic:claude-fake@http://127.0.0.1:1")
    task = tasks(data_dir)[0]
    reply = adapter.decode(
        task, orjson.dumps(wire_formats.anthropic_messages(body_of(adapter, task), "truncated"))
    )
    assert reply.cut_off == "answer" and reply.answers[0].error == (
        "cut off at the token limit (stop_reason max_tokens); a truncated reply is never repaired: raise max_tokens "
        "or lower --effort"
    )


# ---- 3. logprob decisions on current OpenAI models -----------------------------------------------
def test_logprobs_requests_on_openai_hosts_azure_and_other_servers(data_dir: Path):
    task = tasks(data_dir)[0]

    def first(text: str | ModelSpec) -> dict:
        return body_of(adapters.get(text), task)[0]

    hosted = first("logprobs:gpt-6-luna")
    assert (
        hosted["reasoning_effort"],
        hosted["max_completion_tokens"],
        "max_tokens" in hosted,
    ) == ("none", 1, False)
    for base in (
        "https://eu.api.openai.com/v1",
        "https://us.api.openai.com/v1",
        "https://dxi.openai.azure.com/openai/v1",
        "https://dxi.cognitiveservices.azure.com/openai/v1",
    ):
        body = first(f"logprobs:gpt-6.1-terra@{base}")
        assert (body["reasoning_effort"], body["max_completion_tokens"], "max_tokens" in body) == (
            "none",
            1,
            False,
        )
    assert "reasoning_effort" not in first(
        "logprobs:gpt-4.1-mini"
    )  # it does not reason (nor take the field)
    assert "reasoning_effort" not in first("logprobs:gpt-5.1-chat-latest")  # nor the chat variants
    assert (
        first(ModelSpec("logprobs", "gpt-6-luna", effort="low"))["reasoning_effort"] == "low"
    )  # the user's
    local = first("logprobs:qwen@http://127.0.0.1:8080/v1")
    assert (local["max_tokens"], "max_completion_tokens" in local, "reasoning_effort" in local) == (
        1,
        False,
        False,
    )
    asked = first(
        ModelSpec(
            "logprobs", "qwen", "http://127.0.0.1:8080/v1", params={"max_completion_tokens": 1}
        )
    )
    assert (asked["max_completion_tokens"], "max_tokens" in asked) == (
        1,
        False,
    )  # on request, on any server
    assert conforms(hosted, OPENAI_BODY) == []


@pytest.fixture
def openai_host_on_loopback(monkeypatch: pytest.MonkeyPatch):
    """``eu.api.openai.com`` resolved to 127.0.0.1 for this test (nothing leaves the machine): the
    adapter treats it as OpenAI's host while the fake answers."""
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        return real("127.0.0.1" if host == "eu.api.openai.com" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-logprobs-0123456789")


async def test_logprobs_on_a_current_openai_reasoning_model(
    data_dir: Path, tmp_path: Path, openai_host_on_loopback
):
    async with FakeLLM() as server:
        port = server.url.rsplit(":", 1)[1]
        base = f"http://eu.api.openai.com:{port}/v1"
        _, stats, rows = await run_model(
            f"logprobs:gpt-6-luna@{base}", data_dir, tmp_path / "a", limit=None, evals=None
        )
        first = [b for _, b in server.requests]
        limiters: dict = {}
        _, refused, _ = await run_model(
            ModelSpec("logprobs", "gpt-6-luna", base, effort="low"),
            data_dir,
            tmp_path / "b",
            replace(FAST, max_in_flight=1),
            limit=3,
            limiters=limiters,
        )
    n = len(tasks(data_dir))
    assert (stats.ok, stats.invalid, stats.failed) == (
        n,
        0,
        0,
    )  # reasoning_effort none: the fake gives logprobs
    assert {(b["reasoning_effort"], b["max_completion_tokens"]) for b in first} == {("none", 1)}
    (limiter,) = limiters.values()
    ((stop, _),) = limiter.stopped_models.values()
    assert (refused.refused, refused.not_sent, stop.scope, stop.field) == (
        1,
        2,
        "model",
        "logprobs",
    )
    assert str(stop).endswith(NO_LOGPROBS) and "gpt-6-luna" in NO_LOGPROBS
    assert "logprobs are not supported with reasoning_effort 'low'" in str(stop)


async def test_a_model_that_refuses_effort_none_is_never_advised_effort_none(
    data_dir: Path, tmp_path: Path, openai_host_on_loopback
):
    """gpt-5-mini has no effort none: its refusal of the none sent for logprobs says it cannot give
    logprobs at any effort, and names only the models known to accept none; never "--effort none",
    the value just refused."""
    async with FakeLLM() as server:
        base = f"http://eu.api.openai.com:{server.url.rsplit(':', 1)[1]}/v1"
        limiters: dict = {}
        _, refused, _ = await run_model(
            f"logprobs:gpt-5-mini@{base}",
            data_dir,
            tmp_path / "m",
            replace(FAST, max_in_flight=1),
            limit=2,
            limiters=limiters,
        )
        assert [b["reasoning_effort"] for _, b in server.requests] == ["none"]
    (limiter,) = limiters.values()
    ((stop, _),) = limiter.stopped_models.values()
    assert "'reasoning_effort' does not support 'none'" in str(stop)
    assert str(stop).endswith(NO_LOGPROBS_AT_NONE)
    assert "--effort none" not in str(stop) and "gpt-6-luna, gpt-6.1-terra" in NO_LOGPROBS_AT_NONE
    assert refused.refused == 1


async def test_max_tokens_is_refused_by_a_reasoning_model_with_the_providers_message(
    data_dir: Path, tmp_path: Path
):
    limiters: dict = {}
    async with FakeLLM() as server:
        spec = ModelSpec("openai", "gpt-6-luna", f"{server.url}/v1", params={"max_tokens": 5000})
        _, stats, rows = await run_model(
            spec,
            data_dir,
            tmp_path / "c",
            replace(FAST, max_in_flight=1),
            limit=2,
            limiters=limiters,
        )
    ((stop, _),) = next(iter(limiters.values())).stopped_models.values()
    assert (stats.refused, stats.not_sent, rows.height, stop.field) == (1, 1, 0, "max_tokens")
    assert "Use 'max_completion_tokens' instead." in str(stop)


# ---- estimates of thinking models
# --------------------------------------------------------------------------------
def _estimate(argv: list[str], capsys: pytest.CaptureFixture) -> dict:
    capsys.readouterr()
    assert main(["estimate", *argv, "--json"]) == 0
    (m,) = orjson.loads(capsys.readouterr().out)["models"]
    return m


async def test_a_thinking_models_output_is_estimated_from_its_effort_then_from_its_own_usage(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    from dxi.runner.planning.tokens import OUTPUT_PER_QUESTION, THINKING_PRIOR

    cache = tmp_path / "c"
    async with FakeLLM() as server:
        where = ["--data-dir", str(data_dir), "--cache-dir", str(cache), "--evals", "when2call"]
        openai = ["--model", f"openai:gpt-6-luna@{server.url}/v1", *where]
        # nothing cached: the prior of effort low (3,000 thinking tokens) plus the answer (8 per
        # question + 4), below the request's cap of 16,000 (issue 34: 18 tokens were expected where
        # ~3,000 were used)
        low = await asyncio.to_thread(
            _estimate,
            [*openai, "--effort", "low", "--param", "max_completion_tokens=16000"],
            capsys,
        )
        n = low["new"]
        assert n == 3 and THINKING_PRIOR["openai"]["low"] == 3_000
        assert low["output_tokens"] == n * (3_000 + OUTPUT_PER_QUESTION + 4)
        assert low["basis"] == {
            "bytes / 4 (no usage in the cache yet); output: the thinking prior at effort low "
            "(3,000 tokens, runner.planning.tokens)": n
        }
        # a cap below the prior bounds it
        capped = await asyncio.to_thread(
            _estimate,
            [*openai, "--effort", "high", "--param", "max_completion_tokens=2000"],
            capsys,
        )
        assert capped["output_tokens"] == n * 2_000
        # Anthropic's current models think by default at effort high (12,000), within the 16,000
        # default cap
        claude = await asyncio.to_thread(
            _estimate, ["--model", f"anthropic:claude-sonnet-5-5@{server.url}", *where], capsys
        )
        assert claude["output_tokens"] == n * (12_000 + OUTPUT_PER_QUESTION + 4)
        # no effort on an OpenAI model: nothing says it thinks, the answer alone as before
        plain = await asyncio.to_thread(_estimate, openai, capsys)
        assert plain["output_tokens"] == n * (OUTPUT_PER_QUESTION + 4)
        # a run at effort low puts its usage in the cache: a new epoch is then estimated from it
        assert (
            await asyncio.to_thread(
                main, ["run", *openai, "--effort", "low", "--out", str(tmp_path / "o"), "-q"]
            )
            == 0
        )
    from dxi.cache import Cache

    with Cache(cache, read_only=True) as opened:
        used = opened.read(
            lambda rows: rows.filter(pl.col("status") == "ok").select("output_tokens").collect()
        )
    assert used.height == n and used["output_tokens"].min() > 0
    again = await asyncio.to_thread(
        _estimate, [*openai, "--effort", "low", "--epochs", "2"], capsys
    )
    assert again["new"] == n and again["basis"] == {"estimated from this model's cached usage": n}
    assert again["output_tokens"] == round(n * used["output_tokens"].mean())
    # another level of the same model: its cached usage at effort low says nothing of medium's
    # thinking
    medium = await asyncio.to_thread(_estimate, [*openai, "--effort", "medium"], capsys)
    assert medium["output_tokens"] == n * (6_000 + OUTPUT_PER_QUESTION + 4)
    assert medium["basis"] == {
        "estimated from this model's cached usage; output: the thinking prior at effort medium "
        "(6,000 tokens, runner.planning.tokens)": n
    }
