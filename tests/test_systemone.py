"""The System One adapter and the runner's retry rules against real HTTP servers on 127.0.0.1: the
scriptable fake (429 + Retry-After, 5xx, 400, malformed bodies, dropped connections, timeouts) and a
real peer, ``sparrow-decider serve``, which must give the embedded adapter's answers."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi import adapters
from dxi.adapters import Limits
from dxi.adapters.errors import SERVED, UNREACHABLE
from dxi.cache import Cache

from .fakes.fake_provider import FakeProvider, swapping, systemone
from .helpers.runs import FAST, ONE, run_model


async def test_success_parses_answers_usage_and_learns_the_model_name(
    data_dir: Path, tmp_path: Path
):
    async with FakeProvider() as server:
        adapter, stats, rows = await run_model(
            f"systemone:{server.url}", data_dir, tmp_path / "c", limit=None
        )
    assert adapter.label == "systemone:fake-decider"
    assert (stats.sent, stats.ok, stats.attempts) == (3, 3, 3)
    first = rows.row(0, named=True)
    state = orjson.loads(first["request_body"])[
        "state"
    ]  # the fake counts len(state) // 4 + 8 per question
    assert (
        first["status"],
        first["input_tokens"],
        first["output_tokens"],
        first["served_model"],
    ) == ("ok", len(state) // 4 + 8, 1, "fake-decider")
    assert first["answers"][0]["predicted"] == "A" and first["answers"][0]["p_predicted"] == 0.7
    assert server.requests[0][1]["model"] == "fake-decider"


@pytest.mark.parametrize(
    ("behaviour", "at_least"),
    [
        ("429:1", 1.0),  # Retry-After: 1
        (
            "429:date:2",
            1.0,
        ),  # Retry-After: an HTTP date 2 s ahead (whole seconds: 1 to 2 s from now)
        ("429:ms:1200", 1.2),  # retry-after-ms: 1200
        ("429:reset:1s500ms", 1.5),  # x-ratelimit-reset-requests: 1s500ms, remaining 0
    ],
)
async def test_retry_after_is_honoured(
    data_dir: Path, tmp_path: Path, behaviour: str, at_least: float
):
    async with FakeProvider(script=[behaviour]) as server:
        _, stats, rows = await run_model(f"systemone:{server.url}", data_dir, tmp_path / "c")
    (t0, _), (t1, _) = server.requests
    assert t1 - t0 >= at_least  # the server's number, not the 0.01 s backoff
    assert (stats.attempts, stats.rate_limited, stats.ok) == (2, 1, 1)
    assert rows["attempts"].to_list() == [2]
    (wait,) = rows["retry_waits_s"][0]  # the wait before the retry, recorded in the cache
    assert at_least <= wait <= t1 - t0 and stats.retry_wait_s == wait


@pytest.mark.parametrize("script", [["500", "503"], ["malformed"], ["drop"], ["429"]])
async def test_transient_failures_are_retried(data_dir: Path, tmp_path: Path, script: list[str]):
    async with FakeProvider(script=list(script)) as server:
        _, stats, rows = await run_model(f"systemone:{server.url}", data_dir, tmp_path / "c")
    assert len(server.requests) == len(script) + 1
    assert (stats.ok, stats.attempts) == (1, len(script) + 1)
    assert rows["status"].to_list() == ["ok"]
    waits = rows["retry_waits_s"][
        0
    ].to_list()  # one per retry: at least the backoff, within the gap between arrivals
    arrivals = [t for t, _ in server.requests]
    assert len(waits) == len(script)
    assert all(  # the rows keep waits to the millisecond (rounded: up to 0.5 ms over)
        0.01 <= w <= later - earlier + 0.0005
        for w, earlier, later in zip(waits, arrivals, arrivals[1:], strict=False)
    )


async def test_timeout_is_retried(data_dir: Path, tmp_path: Path):
    limits = Limits(max_in_flight=1, attempt_timeout_s=0.3, max_attempts=2, backoff_s=0.01)
    async with FakeProvider(script=["sleep:2"]) as server:
        _, stats, rows = await run_model(
            f"systemone:{server.url}", data_dir, tmp_path / "c", limits
        )
    assert (stats.ok, stats.attempts) == (1, 2)


async def test_a_400_fails_fast_and_is_kept_unless_asked(data_dir: Path, tmp_path: Path):
    async with FakeProvider(default="400") as server:
        _, stats, rows = await run_model(f"systemone:{server.url}", data_dir, tmp_path / "c")
        assert len(server.requests) == 1  # no retry
        row = rows.row(0, named=True)
        assert (row["status"], row["error_kind"], row["http_status"], row["attempts"]) == (
            "failed",
            "fatal",
            400,
            1,
        )
        assert row["retry_waits_s"] == []  # no retry, no wait
        assert "systemone:fake-decider: HTTP 400" in row["error"] and "injected 400" in row["error"]
        _, again, _ = await run_model(f"systemone:{server.url}", data_dir, tmp_path / "c")
        assert (again.sent, again.cache_hits) == (0, 1)
        server.default = "ok"
        _, retried, _ = await run_model(
            f"systemone:{server.url}", data_dir, tmp_path / "c", retry_failed=True
        )
        assert (retried.sent, retried.ok) == (1, 1)


async def test_retries_run_out_then_the_next_run_asks_again(data_dir: Path, tmp_path: Path):
    async with FakeProvider(default="503") as server:
        _, stats, rows = await run_model(f"systemone:{server.url}", data_dir, tmp_path / "c")
        assert len(server.requests) == FAST.max_attempts
        assert (stats.failed, rows["error_kind"].to_list()) == (1, ["transient"])
        server.default = "ok"
        _, again, _ = await run_model(f"systemone:{server.url}", data_dir, tmp_path / "c")
    assert (again.sent, again.ok) == (1, 1)


async def test_api_key_is_sent_but_never_stored(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    secret = "sk-test-do-not-store-0123456789"
    monkeypatch.setenv("SYSTEMONE_API_KEY", secret)
    limiters: dict = {}
    async with FakeProvider(script=["401"]) as server:
        _, stats, rows = await run_model(
            f"systemone:{server.url}", data_dir, tmp_path / "c", limiters=limiters
        )
    assert server.headers[0]["Authorization"] == f"Bearer {secret}"
    # a refused key stops the provider; nothing is stored, the next run sends the request
    assert (stats.refused, rows.height) == (1, 0)
    assert "check the API key" in str(next(iter(limiters.values())).halted)
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


async def test_unreachable_server_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    adapter = adapters.get(f"systemone:http://127.0.0.1:{port}")
    with pytest.raises(adapters.ProviderStop, match="cannot reach the System One server") as stop:
        await adapter.start()
    assert stop.value.cause == UNREACHABLE


async def test_a_named_model_the_server_does_not_serve_stops_its_provider(
    data_dir: Path, tmp_path: Path
):
    async with FakeProvider(model="served") as server:
        wrong = adapters.get(f"systemone:other@{server.url}")
        with pytest.raises(
            adapters.ProviderStop,
            match=f"serves 'served', not 'other'; name the model it serves "
            rf"\(systemone:served@{server.url}\)",
        ) as stop:
            await wrong.start()
        assert (stop.value.cause, stop.value.scope) == (SERVED, "provider")
        adapter, stats, _ = await run_model(
            f"systemone:served@{server.url}", data_dir, tmp_path / "c"
        )
        assert (adapter.label, stats.ok, server.stats()["arrivals"]) == ("systemone:served", 1, 1)


@pytest.mark.parametrize(
    ("health", "model"),
    [("fake-decider", ""), ("fake-decider", "fake-decider@"), (None, "fake-decider@")],
    ids=["named-by-health", "named-and-served", "named-behind-a-proxy"],
)
async def test_a_server_that_changes_model_mid_run_stops_its_provider_and_stores_none_of_its_replies(
    data_dir: Path, tmp_path: Path, health: str | None, model: str
):
    """The model asked for (named, or named by /health at start) answers 3 of its 12 requests, then
    the server answers as another: that reply is not stored (no row under the model's key, so
    nothing of the other model is ever scored as this one), the provider stops (cause SERVED), the 8
    requests left are not sent; the next run against the right model sends exactly the 9 missing."""
    swap = swapping(3, health, "fake-robot")
    async with FakeProvider(model=health, routes={"/v1/systemone": swap}) as server:
        limiters: dict = {}
        adapter, stats, rows = await run_model(
            f"systemone:{model}{server.url}", data_dir, tmp_path / "c", ONE, None, None, limiters
        )
        assert (server.stats()["ok"], stats.sent, stats.ok, stats.refused, stats.not_sent) == (
            4,
            3,
            3,
            1,
            8,
        )
        assert (rows.height, set(rows["served_model"]), set(rows["model"])) == (
            3,
            {"fake-decider"},
            {"fake-decider"},
        )
        stop = limiters[adapter.limits_key].halted
        assert (stop.cause, str(stop)) == (
            SERVED,
            f"the System One server at {server.url} answered as 'fake-robot', not 'fake-decider' as "
            "asked: another model serves there now (was the server restarted with another model?); "
            "that reply is not fake-decider's answer and is not stored. Serve fake-decider there "
            "again and rerun (the next run sends what is missing), or run the model it serves under "
            f"its own name (systemone:fake-robot@{server.url})",
        )
        server.routes["/v1/systemone"] = systemone(health, 0.7, 0.8)  # the model asked for is back
        _, again, rows = await run_model(
            f"systemone:fake-decider@{server.url}", data_dir, tmp_path / "c", ONE, None, None
        )
    assert (again.sent, again.cache_hits, rows.height, set(rows["served_model"])) == (
        9,
        3,
        12,
        {"fake-decider"},
    )


async def test_a_proxy_serving_many_models_takes_any_name(data_dir: Path, tmp_path: Path):
    async with FakeProvider(model=None) as server:  # /health names no model, as a LiteLLM proxy
        _, stats, rows = await run_model(
            f"systemone:any-model@{server.url}", data_dir, tmp_path / "c"
        )
    assert (stats.ok, rows["served_model"].to_list()) == (1, ["any-model"])


async def test_one_model_name_on_two_servers_shares_no_cache_rows(data_dir: Path, tmp_path: Path):
    async with FakeProvider() as first, FakeProvider() as second:
        _, one, rows = await run_model(f"systemone:{first.url}", data_dir, tmp_path / "c")
        _, two, _ = await run_model(f"systemone:{second.url}", data_dir, tmp_path / "c")
        _, again, _ = await run_model(f"systemone:{first.url}", data_dir, tmp_path / "c")
    assert (one.sent, two.sent, again.sent, again.cache_hits) == (1, 1, 0, 1)
    assert rows["endpoint"].to_list() == [f"{first.url}/v1/systemone"]


def test_model_strings():
    assert adapters.parse_model("systemone:http://127.0.0.1:8000") == adapters.ModelSpec(
        "systemone", None, "http://127.0.0.1:8000"
    )
    assert adapters.parse_model("systemone:strands@http://h:1") == adapters.ModelSpec(
        "systemone", "strands", "http://h:1"
    )
    assert (
        adapters.parse_model("embedded:sparrow-nano-robot-v1.2").model == "sparrow-nano-robot-v1.2"
    )
    assert adapters.parse_model("embedded").model is None
    with pytest.raises(ValueError, match="known adapters: embedded, systemone"):
        adapters.parse_model("nosuch:model")


async def test_unknown_embedded_model_lists_the_known():
    with pytest.raises(adapters.Fatal, match="available: sparrow-nano-general-v1.1"):
        await adapters.get("embedded:sparrow-giant").start()


@contextlib.contextmanager
def sparrow(model: str | None = None) -> Iterator[str]:
    """A real ``sparrow-decider [--model MODEL] serve`` on a free 127.0.0.1 port: its base URL;
    stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("sparrow-decider")
    proc = subprocess.Popen(
        [str(exe), *(("--model", model) if model else ()), "serve"]
        + ["--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def sparrow_server():
    with sparrow() as url:
        yield url


@pytest.mark.process
async def test_systemone_against_sparrow_serve_matches_embedded(
    data_dir: Path, tmp_path: Path, sparrow_server: str
):
    from .conftest import REAL_DATA

    source = REAL_DATA if REAL_DATA.is_dir() else data_dir
    limit = 40 if source == REAL_DATA else None
    _, http_stats, http_rows = await run_model(
        f"systemone:{sparrow_server}",
        source,
        tmp_path / "c",
        limit=limit,
        evals=None,
        limits=Limits(max_in_flight=4),
    )
    _, emb_stats, emb_rows = await run_model(
        "embedded:sparrow-nano-general-v1.1", source, tmp_path / "c", limit=limit, evals=None
    )
    assert http_stats.ok == emb_stats.ok == http_stats.sent > 0
    assert http_rows.filter(pl.col("provider") == "systemone")["model"].unique().to_list() == [
        "sparrow-nano-general-v1.1"
    ]

    def picks(provider: str) -> pl.DataFrame:
        return (
            (http_rows if provider == "systemone" else emb_rows)
            .filter(pl.col("provider") == provider)
            .select(
                "task_id",
                pl.col("answers")
                .list.eval(pl.element().struct.field("predicted"))
                .alias("predicted"),
                pl.col("answers").list.eval(pl.element().struct.field("p_predicted")).alias("p"),
            )
            .sort("task_id")
        )

    http, emb = picks("systemone"), picks("embedded")
    assert http["task_id"].to_list() == emb["task_id"].to_list()
    assert http["predicted"].to_list() == emb["predicted"].to_list()
    assert http["p"].to_list() == emb["p"].to_list()
    # the same bytes were sent to both
    bodies = (
        emb_rows.filter(pl.col("provider") == "embedded").sort("task_id")["request_body"].to_list()
    )
    assert (
        bodies
        == http_rows.filter(pl.col("provider") == "systemone")
        .sort("task_id")["request_body"]
        .to_list()
    )


def test_a_base_url_without_its_scheme_is_refused_not_taken_for_a_model_name():
    with pytest.raises(
        ValueError,
        match=r"'127.0.0.1:8080/v1' looks like a base URL without its scheme; write "
        r"@http://127.0.0.1:8080/v1",
    ):
        adapters.parse_model("openai:qwen@127.0.0.1:8080/v1")
    for text in ("openai:m@localhost:8000", "openai:m@api.example.com/v1"):
        with pytest.raises(ValueError, match="without its scheme"):
            adapters.parse_model(text)
    # version suffixes stay part of the model name
    assert (
        adapters.parse_model("anthropic:claude-3-5-sonnet@20240620").model
        == "claude-3-5-sonnet@20240620"
    )
    assert adapters.parse_model("openai:gemma@1.5").model == "gemma@1.5"


async def test_a_yes_no_only_server_runs_the_evaluations_it_can_and_says_which_it_cannot(
    data_dir: Path, tmp_path: Path
):
    # the server declares in GET /health that it answers yes/no (noul) questions only
    async with FakeProvider(model="yes-no", question_types=["noul"]) as server:
        adapter, stats, rows = await run_model(
            f"systemone:{server.url}", data_dir, tmp_path / "c", limit=None, evals=None
        )
        assert adapter.question_types == frozenset({"noul"})
        # only WildGuardTest's 3 tasks (all yes/no) reached it; the 9 tasks with a choice were not
        # sent
        sent = [body for _, body in server.requests]
        assert len(sent) == 3 and all(
            q["type"] == "noul" for b in sent for q in b["questions"].values()
        )
        assert (stats.ok, stats.failed) == (3, 9)
        failed = rows.filter(pl.col("status") == "failed")
        assert sorted(set(failed["eval"].to_list())) == [
            "aa_omniscience_decision",
            "hle_multichoice",
            "when2call",
        ]
        assert set(failed["error_kind"].to_list()) == {"fatal"}
        assert set(failed["attempts"].to_list()) == {1}
        assert set(failed["error"].to_list()) == {
            f"not sent: the System One server at {server.url} answers noul questions only (its "
            "/health question_types), and this task asks choice (a choice among options); run it "
            "with --evals naming the evaluations it can answer (yes/no questions: wildguardtest)"
        }
        # deterministic: a rerun sends nothing again
        _, again, _ = await run_model(
            f"systemone:{server.url}", data_dir, tmp_path / "c", limit=None, evals=None
        )
        assert (again.sent, again.cache_hits, len(server.requests)) == (0, 12, 3)
    # a server that declares every type it answers, or declares nothing, is asked everything
    for declared in (["noul", "choice"], None):
        async with FakeProvider(model="both", question_types=declared) as server:
            _, stats, _ = await run_model(
                f"systemone:{server.url}",
                data_dir,
                tmp_path / f"c{declared}",
                limit=None,
                evals=None,
            )
            assert (stats.ok, stats.failed, len(server.requests)) == (12, 0, 12)


def test_question_types_are_read_from_health_and_refuse_only_what_is_not_declared():
    from dxi.adapters.systemone import question_types, unsupported

    assert question_types({"status": "ok", "question_types": ["noul", 3]}) == frozenset({"noul"})
    assert question_types({"status": "ok"}) is None and question_types(None) is None
    body = orjson.dumps(
        {"questions": {"a": {"type": "noul"}, "b": {"type": "choice", "criteria": {}}}}
    )
    assert unsupported(body, None, "u") is None
    assert unsupported(body, frozenset({"noul", "choice"}), "u") is None
    assert unsupported(body, frozenset({"noul"}), "u").startswith(
        "not sent: the System One server at u answers noul questions only"
    )


def _run_file(tmp_path: Path, data: Path, provider: str, url: str, model: str | None) -> Path:
    """A run file of the System One model "sparrow server" on ``url`` (its ``model`` named, or left
    to the server: None) and the embedded model, caching in ``tmp_path/cache``."""
    named = f'model = "{model}"\n' if model else ""
    path = tmp_path / "run.toml"
    path.write_text(
        f'data_dir = "{data}"\ncache_dir = "cache"\nout = "out"\n'
        f'[providers.{provider}]\nkind = "systemone"\nbase_url = "{url}"\n'
        f'[[models]]\nname = "sparrow server"\nprovider = "{provider}"\n{named}'
        '[[models]]\nname = "embedded"\nprovider = "embedded"\nmodel = "sparrow-nano-general-v1.1"\n'
    )
    return path


@pytest.mark.process
@pytest.mark.slow
def test_a_server_serving_another_model_than_named_stops_its_provider_alone(
    data_dir: Path, tmp_path: Path, capsys
):
    """A real ``sparrow-decider --model sparrow-nano-robot-v1.2 serve`` asked for
    sparrow-nano-general-v1.1 in a run file beside the embedded model: ``dxi estimate`` warns, and
    ``dxi run`` stops that provider alone (cause "serves another model", its 12 requests not sent,
    none stored), runs the embedded model's 12 and exits 6."""
    from dxi.runner.cli import main
    from dxi.runner.errors import EXIT_PROVIDER_STOPPED

    with sparrow("sparrow-nano-robot-v1.2") as url:
        run_file = _run_file(tmp_path, data_dir, "robot", url, "sparrow-nano-general-v1.1")
        said = (
            f"the System One server at {url} serves 'sparrow-nano-robot-v1.2', not "
            f"'sparrow-nano-general-v1.1'; name the model it serves "
            f"(systemone:sparrow-nano-robot-v1.2@{url}) or leave the name out"
        )
        assert main(["estimate", str(run_file), "--json"]) == 0
        doc = orjson.loads(capsys.readouterr().out)
        assert (doc["serves_another_model"], doc["unreachable"]) == ({"sparrow server": said}, {})
        assert main(["estimate", str(run_file)]) == 0
        assert (
            f"serves another model: {said}. dxi run would stop the provider of sparrow server "
            "(exit code 6) and run the others." in " ".join(capsys.readouterr().out.split())
        )
        assert main(["run", str(run_file), "-q"]) == EXIT_PROVIDER_STOPPED
    out = " ".join(capsys.readouterr().out.split())
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    (stopped,) = summary["stopped_providers"]
    assert {k: stopped[k] for k in ("provider", "models", "cause", "refused", "not_sent")} == {
        "provider": "table:robot",
        "models": ["sparrow server"],
        "cause": SERVED,
        "refused": 0,
        "not_sent": 12,
    }
    assert stopped["message"] == said
    requests = {m["model"]: m["requests"] for m in summary["models"]}
    assert (requests["embedded"]["sent"], requests["sparrow server"]["sent"]) == (12, 0)
    assert (
        "serves another model. 0 request(s) refused, 12 not sent (sparrow server); the next run "
        "sends them. Serve the model asked for there (or name the model the server serves), then "
        "rerun; nothing it answered as another model was stored." in out
    )
    with Cache(tmp_path / "cache") as cache:
        assert set(cache.scan().collect()["provider"]) == {"embedded"}


@pytest.mark.process
@pytest.mark.slow
def test_a_model_named_by_its_server_runs_from_the_cache_when_the_server_is_down(
    data_dir: Path, tmp_path: Path, capsys
):
    """A run file leaves the model's name to its real ``sparrow-decider serve``; once every request
    is cached, the server down: ``dxi estimate`` counts all 12 cached (none a "new model"), and
    ``dxi run`` names the model from the cache (the one model cached from that server), sends
    nothing, stops nothing, exits 0 and writes the same index as with the server up."""
    from dxi.runner.cli import main

    with sparrow() as url:
        run_file = _run_file(tmp_path, data_dir, "local", url, None)
        assert main(["run", str(run_file), "-q"]) == 0
    up = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    capsys.readouterr()
    assert main(["estimate", str(run_file), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    mine = next(m for m in doc["models"] if m["model"] == "sparrow server")
    assert (mine["cached"], mine["new"], mine["reasons"], doc["unreachable"]) == (12, 0, {}, {})
    assert main(["run", str(run_file)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Running 2 models (sparrow server (all cached); embedded (all cached))" in out
    assert "Every request is in the cache (24): nothing to send." in out
    down = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    index = {m["model"]: m["decision_index"] for m in up["models"]}
    assert {m["model"]: m["decision_index"] for m in down["models"]} == index
    assert index["sparrow server"] is not None and "stopped_providers" not in down


@pytest.mark.process
@pytest.mark.slow
def test_a_model_named_by_its_server_is_all_cached_with_the_server_up_too(
    data_dir: Path, tmp_path: Path, capsys
):
    """The rerun of a run file whose System One model is named by its (running) server: once its
    name is known every request is cached, so it is marked ``all cached`` and nothing is sent, as
    with the server down (docs/runs.md, Progress)."""
    from dxi.runner.cli import main

    with sparrow() as url:
        run_file = _run_file(tmp_path, data_dir, "local", url, None)
        assert main(["run", str(run_file), "-q"]) == 0
        capsys.readouterr()
        assert main(["run", str(run_file)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Running 2 models (sparrow server (all cached); embedded (all cached))" in out
    assert "Every request is in the cache (24): nothing to send." in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "anthropic:claude-sonnet-5-5@",
            "model 'anthropic:claude-sonnet-5-5@': nothing follows '@'; write @http://HOST:PORT (or "
            "@https://...) for a base URL, or leave '@' out for the adapter's default server",
        ),
        (
            "systemone:fake@",
            "model 'systemone:fake@': nothing follows '@'; write @http://HOST:PORT (or "
            "@https://...) for a base URL, or leave '@' out for the adapter's default server",
        ),
        (
            "openai:gpt@https://",
            "model 'openai:gpt@https://': the base URL 'https://' names no host; write "
            "http://HOST:PORT",
        ),
        (
            "systemone:http://",
            "model 'systemone:http://': the base URL 'http://' names no host; write http://HOST:PORT",
        ),
        (
            "openai:m@ftp://x",
            "model 'openai:m@ftp://x': the base URL 'ftp://x' is not http:// or https://; write "
            "@http://HOST:PORT (or @https://...)",
        ),
        (
            "openai:m@//host",
            "model 'openai:m@//host': the base URL '//host' is not http:// or https://; write "
            "@http://HOST:PORT (or @https://...)",
        ),
    ],
)
def test_a_base_url_left_empty_is_refused_not_sent_to_the_default_server(text: str, message: str):
    """``anthropic:M@$URL`` with ``$URL`` unset reads ``anthropic:M@``: taken for the model name
    ``M@`` it went to the provider's own API (billed to the key), not to the server meant."""
    with pytest.raises(ValueError) as raised:
        adapters.parse_model(text)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("text", "model", "base_url"),
    [
        ("openai:m@HTTPS://x", "m", "https://x"),  # a scheme is case-insensitive (RFC 3986 §3.1)
        ("anthropic:m@ https://x", "m", "https://x"),  # a space after '@'
        ("systemone:HTTP://127.0.0.1:8000", None, "http://127.0.0.1:8000"),
        ("openai:qwen/qwen3@http://h:1/v1", "qwen/qwen3", "http://h:1/v1"),
    ],
)
def test_a_base_url_in_capitals_or_after_a_space_is_a_base_url_not_part_of_the_name(
    text: str, model: str | None, base_url: str
):
    """Taken for part of the model name, these went to the adapter's default server (trial 7)."""
    spec = adapters.parse_model(text)
    assert (spec.model, spec.base_url) == (model, base_url)
