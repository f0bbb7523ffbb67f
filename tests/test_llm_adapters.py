"""The openai, anthropic, gemini, openai-decisions and logprobs adapters against real HTTP on
127.0.0.1 (``tests/fakes/fake_llm_server.py`` serving the documented wire formats of
``tests/fakes/wire_formats.py``): parsed answers, usage, every invalid-reply rule, the runner's
retry rules, keys, and the CLI's counts."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi import adapters
from dxi.adapters import llm
from dxi.adapters.errors import UNREACHABLE
from dxi.evals import Suite, discover
from dxi.runner import rescore
from dxi.runner.cli import main
from dxi.runner.planning.inputs import PlanInputs

from .fakes import wire_formats
from .fakes.fake_llm_server import FakeLLM
from .fakes.fake_provider import FakeProvider
from .helpers.runs import FAST, run_model

KINDS = ("openai", "anthropic", "gemini", "openai-decisions", "logprobs")
NAMES = {
    "openai": "gpt-fake",
    "anthropic": "claude-fake",
    "gemini": "gemini-fake",
    "openai-decisions": "luna-fake",
    "logprobs": "qwen-fake",
}
KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "openai-decisions": "OPENAI_API_KEY",
    "logprobs": "OPENAI_API_KEY",
}
RESPONDER = {
    "openai": wire_formats.openai_chat,
    "logprobs": wire_formats.openai_chat,
    "anthropic": wire_formats.anthropic_messages,
    "gemini": wire_formats.gemini_generate,
    "openai-decisions": wire_formats.openai_decisions,
}


def model(kind: str, server: FakeLLM) -> str:
    return f"{kind}:{NAMES[kind]}@{server.base_url(kind)}"


def tasks(data_dir: Path) -> list:
    return list(Suite(discover(data_dir)).tasks())


def expected(task, kind: str) -> list[tuple[str, str, float | None]]:
    """The fake model's answers: the last allowed answer of each question, with its probability."""
    p = {
        "openai-decisions": wire_formats.P_LAST,
        "logprobs": wire_formats.P_LAST / (wire_formats.P_LAST + 0.3),
    }.get(kind)
    return [(q.id, q.answer_ids[-1], p) for q in task.questions]


# ---- pure: request bodies and every reply mode ---------------------------------------------------
def test_request_bodies_follow_each_wire_format(data_dir: Path):
    task = next(t for t in tasks(data_dir) if t.eval == "wildguardtest")
    schema = llm.answer_schema(task)
    body = {
        k: orjson.loads(adapters.get(f"{k}:{NAMES[k]}@http://127.0.0.1:1").encode(task).body)
        for k in KINDS
    }
    assert body["openai"] == {
        "model": "gpt-fake",
        "messages": llm.messages(task),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answers", "strict": True, "schema": schema},
        },
    }
    assert body["anthropic"] == {
        "model": "claude-fake",
        "max_tokens": 1024,
        "system": llm.SYSTEM_PROMPT,
        "messages": [{"role": "user", "content": llm.render(task)}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    assert orjson.loads(offline("anthropic-tool").encode(task).body) == {
        "model": "claude-fake",
        "max_tokens": 1024,
        "system": llm.SYSTEM_PROMPT,
        "messages": [{"role": "user", "content": llm.render(task)}],
        "tools": [
            {
                "name": "answer",
                "description": "Record the answer picked for every question.",
                "input_schema": schema,
            }
        ],
        "tool_choice": {"type": "tool", "name": "answer"},
    }
    assert body["gemini"] == {
        "systemInstruction": {"parts": [{"text": llm.SYSTEM_PROMPT}]},
        "contents": [{"role": "user", "parts": [{"text": llm.render(task)}]}],
        "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": schema},
    }
    assert body["openai-decisions"] == {
        "model": "luna-fake",
        "input": task.state,
        "questions": [
            {"type": "predicate", "name": q.id, "instructions": q.text} for q in task.questions
        ],
    }
    assert body["logprobs"] == [
        {
            "model": "qwen-fake",
            "messages": llm.logprob_messages(task, q),
            "logprobs": True,
            "max_tokens": 1,
            "top_logprobs": 20,
        }
        for q in task.questions
    ]
    choice = next(t for t in tasks(data_dir) if t.eval == "when2call")
    decision = orjson.loads(
        adapters.get("openai-decisions:x@http://127.0.0.1:1").encode(choice).body
    )
    assert decision["questions"] == [
        {
            "type": "choice",
            "name": "answer",
            "instructions": choice.questions[0].text,
            "choices": [
                {"value": o.id, "description": o.text} for o in choice.questions[0].options
            ],
        }
    ]


def test_endpoint_in_the_key_is_the_full_url_and_params_are_in_body_and_key(data_dir: Path):
    task = tasks(data_dir)[0]
    a = adapters.get("openai:qwen2.5@http://127.0.0.1:8080/v1")
    b = adapters.get("openai:qwen2.5@http://127.0.0.1:8081/v1")
    assert a.encode(task).endpoint == "http://127.0.0.1:8080/v1/chat/completions"
    assert a.encode(task).key != b.encode(task).key
    spec = adapters.parse_model("openai:qwen2.5@http://127.0.0.1:8080/v1")
    spec.params = {"temperature": 0, "seed": 7}
    c = adapters.get(spec)
    request = c.encode(task)
    assert (
        orjson.loads(request.body)["temperature"] == 0 and orjson.loads(request.body)["seed"] == 7
    )
    assert request.params == '{"seed":7,"temperature":0}' and request.key != a.encode(task).key
    assert adapters.get("gemini:models/gemini-x").url == (
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-x:generateContent"
    )


def test_model_strings_and_bad_configuration():
    assert adapters.parse_model("openai:qwen2.5@http://127.0.0.1:8080/v1") == adapters.ModelSpec(
        "openai", "qwen2.5", "http://127.0.0.1:8080/v1"
    )
    assert adapters.get("openai:gpt-5-mini").url == "https://api.openai.com/v1/chat/completions"
    assert adapters.get("anthropic:claude-x").url == "https://api.anthropic.com/v1/messages"
    assert adapters.get("openai-decisions:gpt-6-luna").url == "https://api.openai.com/v1/decisions"
    with pytest.raises(ValueError, match="name the model: openai:MODEL"):
        adapters.get("openai:")
    with pytest.raises(ValueError, match="set by the adapter itself"):
        adapters.get(adapters.ModelSpec("openai", "m", params={"messages": []}))
    with pytest.raises(ValueError, match="unknown option"):
        adapters.get(adapters.ModelSpec("anthropic", "m", options={"ctx_size": 4}))


MODES = [
    ("openai", "fenced", None),
    ("openai", "prose", llm.NOT_JSON),
    ("openai", "truncated", llm.TRUNCATED.format("finish_reason length", "max_completion_tokens")),
    (
        "openai",
        "truncated_empty",
        llm.TRUNCATED_THINKING.format("finish_reason length", "max_completion_tokens"),
    ),
    ("openai", "refusal", "refusal: I'm sorry, I cannot help with that request."),
    ("openai", "empty", llm.EMPTY),
    ("openai", "reasoning", llm.REASONING_ONLY),
    (
        "openai",
        "content_filter",
        "blocked by the provider's content filter (finish_reason content_filter)",
    ),
    ("anthropic", "fenced", None),
    ("anthropic", "prose", llm.NOT_JSON),
    ("anthropic", "text", llm.NOT_JSON),
    ("anthropic", "empty", llm.EMPTY),
    ("anthropic", "refusal", "refusal (stop_reason refusal)"),
    ("anthropic", "truncated", llm.TRUNCATED.format("stop_reason max_tokens", "max_tokens")),
    ("anthropic", "thinking", llm.REASONING_ONLY),
    (
        "anthropic",
        "truncated_empty",
        llm.TRUNCATED_THINKING.format("stop_reason max_tokens", "max_tokens"),
    ),
    (
        "anthropic-tool",
        "truncated_empty",
        llm.TRUNCATED_THINKING.format("stop_reason max_tokens", "max_tokens"),
    ),
    ("anthropic-tool", "refusal", "refusal (stop_reason refusal)"),
    ("anthropic-tool", "truncated", llm.TRUNCATED.format("stop_reason max_tokens", "max_tokens")),
    ("anthropic-tool", "text", "no 'answer' tool call: the model replied in text"),
    ("anthropic-tool", "thinking", llm.REASONING_ONLY),
    ("gemini", "fenced", None),
    ("gemini", "prose", llm.NOT_JSON),
    ("gemini", "truncated", llm.TRUNCATED.format("finishReason MAX_TOKENS", "maxOutputTokens")),
    (
        "gemini",
        "truncated_empty",
        llm.TRUNCATED_THINKING.format("finishReason MAX_TOKENS", "maxOutputTokens"),
    ),
    ("gemini", "safety", "no usable answer (finishReason SAFETY)"),
    ("gemini", "blocked", "prompt blocked (promptFeedback.blockReason SAFETY)"),
    ("gemini", "thought", llm.REASONING_ONLY),
]


def offline(kind: str) -> adapters.Adapter:
    """The adapter of ``kind`` on an unused loopback URL (encode and decode only);
    ``anthropic-tool``: the anthropic adapter with the forced tool of older models."""
    if kind == "anthropic-tool":
        return adapters.get(
            adapters.ModelSpec(
                "anthropic",
                NAMES["anthropic"],
                "http://127.0.0.1:1",
                options={"structured": "tool"},
            )
        )
    return adapters.get(f"{kind}:{NAMES[kind]}@http://127.0.0.1:1")


@pytest.mark.parametrize("kind, mode, reason", MODES)
def test_every_reply_mode_decodes_to_the_rule(
    data_dir: Path, kind: str, mode: str, reason: str | None
):
    adapter = offline(kind)
    for task in tasks(data_dir):
        reply = adapter.decode(
            task,
            orjson.dumps(
                RESPONDER[kind.removesuffix("-tool")](orjson.loads(adapter.encode(task).body), mode)
            ),
        )
        if reason is None:
            assert reply.repaired and [(a.question_id, a.predicted) for a in reply.answers] == [
                (q, p) for q, p, _ in expected(task, kind)
            ]
        else:
            assert not reply.repaired and reply.status == "invalid"
            assert [a.error for a in reply.answers] == [reason] * len(task.questions)


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_missing_question_and_value_outside_the_enum(data_dir: Path, kind: str):
    adapter = adapters.get(f"{kind}:{NAMES[kind]}@http://127.0.0.1:1")
    task = next(t for t in tasks(data_dir) if t.eval == "wildguardtest")
    request = orjson.loads(adapter.encode(task).body)
    missing = adapter.decode(task, orjson.dumps(RESPONDER[kind](request, "missing")))
    assert [(a.status, a.error) for a in missing.answers] == [
        ("invalid", "missing from the reply"),
        ("ok", None),
        ("ok", None),
    ]
    outside = adapter.decode(task, orjson.dumps(RESPONDER[kind](request, "outside")))
    assert outside.answers[0].error == '"Z9" is not one of the allowed answers (yes, no)'
    assert outside.answers[1].status == "ok"


def test_decisions_refusal_and_bad_probabilities_are_invalid_per_question(data_dir: Path):
    adapter = adapters.get("openai-decisions:luna@http://127.0.0.1:1")
    task = next(t for t in tasks(data_dir) if t.eval == "wildguardtest")
    request = orjson.loads(adapter.encode(task).body)
    refused = adapter.decode(task, orjson.dumps(wire_formats.openai_decisions(request, "refusal")))
    assert [(a.status, a.error) for a in refused.answers] == [
        ("invalid", "refusal: the model declined this question"),
        ("ok", None),
        ("ok", None),
    ]
    assert refused.answers[1].p_yes == pytest.approx(0.4)
    w2c = next(t for t in tasks(data_dir) if t.eval == "when2call")
    bad = adapter.decode(
        w2c,
        orjson.dumps(
            wire_formats.openai_decisions(orjson.loads(adapter.encode(w2c).body), "bad_sum")
        ),
    )
    # 0.5 (bent) + 0.1333 + 0.1333 + 0.6 (the last option)
    assert bad.answers[0].error == "probabilities sum to 1.366600, not 1 (tolerance 0.001)"


def test_logprobs_without_logprobs_or_allowed_tokens_are_invalid(data_dir: Path):
    adapter = adapters.get("logprobs:qwen@http://127.0.0.1:1")
    task = next(t for t in tasks(data_dir) if t.eval == "when2call")
    bodies = orjson.loads(adapter.encode(task).body)
    for mode, error in (
        (
            "no_logprobs",
            "the reply has no top_logprobs (does the server support logprobs and top_logprobs?)",
        ),
        (
            "off_answers",
            "none of the allowed answers (A, B, C, D) is among the top 20 first tokens",
        ),
    ):
        reply = adapter.decode(
            task, orjson.dumps([wire_formats.openai_chat(b, mode) for b in bodies])
        )
        assert [a.error for a in reply.answers] == [error]
    with pytest.raises(adapters.MalformedReply, match="expected a JSON array of 1 replies"):
        adapter.decode(task, b"{}")


# ---- over HTTP, through the runner ---------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
async def test_success_parses_answers_and_usage(data_dir: Path, tmp_path: Path, kind: str):
    async with FakeLLM() as server:
        adapter, stats, rows = await run_model(
            model(kind, server), data_dir, tmp_path / "c", limit=None, evals=None
        )
    assert (stats.sent, stats.ok, stats.attempts) == (12, 12, 12)
    assert adapter.label == f"{kind}:{NAMES[kind]}"
    by_task = {r["task_id"]: r for r in rows.iter_rows(named=True)}
    sent = {}
    for path, body in server.requests:
        sent.setdefault(path, []).append(body)
    for task in tasks(data_dir):
        row = by_task[task.id]
        assert [
            (a["question_id"], a["predicted"], a["p_predicted"] and round(a["p_predicted"], 6))
            for a in row["answers"]
        ] == [(q, p, pr and round(pr, 6)) for q, p, pr in expected(task, kind)]
        request = orjson.loads(row["request_body"])
        requests = request if kind == "logprobs" else [request]
        n_out = {"openai-decisions": 0, "logprobs": 1}.get(
            kind, wire_formats.OUTPUT_TOKENS_PER_QUESTION
        )
        assert row["input_tokens"] == sum(wire_formats.prompt_tokens(r) for r in requests)
        assert row["output_tokens"] == n_out * len(task.questions)
        assert row["repaired"] is False
    n_http = 12 + (2 * 3 if kind == "logprobs" else 0)  # logprobs: one HTTP request per question
    assert sum(len(v) for v in sent.values()) == n_http


@pytest.mark.parametrize(
    "kind, status", [(k, "429") for k in KINDS] + [("anthropic", "529"), ("openai", "503")]
)
async def test_retry_after_is_honoured(data_dir: Path, tmp_path: Path, kind: str, status: str):
    async with FakeLLM(script=[f"{status}:1"]) as server:
        _, stats, rows = await run_model(model(kind, server), data_dir, tmp_path / "c")
    assert len(server.requests) == 2
    assert server.times[1] - server.times[0] >= 1.0  # the server's number, not the 0.01 s backoff
    assert (stats.attempts, stats.rate_limited, stats.ok) == (2, 1, 1)
    assert rows["attempts"].to_list() == [2]


async def test_gemini_retry_delay_in_the_error_body_is_honoured(data_dir: Path, tmp_path: Path):
    async with FakeLLM(script=["429body:1"]) as server:
        _, stats, _ = await run_model(model("gemini", server), data_dir, tmp_path / "c")
    assert server.times[1] - server.times[0] >= 1.0  # the body's 1 s, not the 0.01 s backoff
    assert (stats.attempts, stats.rate_limited, stats.ok) == (2, 1, 1)


@pytest.mark.parametrize(
    "kind, script",
    [(k, s) for k in KINDS for s in (["500", "503"], ["malformed"], ["drop"])]
    + [("anthropic", ["529"])],
)
async def test_server_errors_and_malformed_bodies_are_retried(
    data_dir: Path, tmp_path: Path, kind: str, script: list[str]
):
    async with FakeLLM(script=list(script)) as server:
        _, stats, rows = await run_model(model(kind, server), data_dir, tmp_path / "c")
    assert (stats.ok, stats.attempts) == (1, len(script) + 1)
    assert rows["status"].to_list() == ["ok"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_400_fails_fast_naming_the_model_and_what_to_check(
    data_dir: Path, tmp_path: Path, kind: str
):
    async with FakeLLM(default="400") as server:
        _, stats, rows = await run_model(model(kind, server), data_dir, tmp_path / "c")
    assert len(server.requests) == 1
    row = rows.row(0, named=True)
    assert (row["status"], row["error_kind"], row["http_status"], row["attempts"]) == (
        "failed",
        "fatal",
        400,
        1,
    )
    assert row["error"].startswith(
        f"{kind}:{NAMES[kind]}: HTTP 400 (check the model's parameters and that the server "
        "supports this request): "
    )
    assert "injected 400" in row["error"]


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini", "openai-decisions"])
async def test_refusal_is_stored_invalid_with_its_reason(data_dir: Path, tmp_path: Path, kind: str):
    async with FakeLLM(default="refusal" if kind != "gemini" else "safety") as server:
        _, stats, rows = await run_model(model(kind, server), data_dir, tmp_path / "c")
    row = rows.row(0, named=True)
    assert (stats.invalid, row["status"], row["answers"][0]["status"]) == (1, "invalid", "invalid")
    assert row["raw_reply"] and orjson.loads(row["raw_reply"])  # the raw reply is kept
    assert (
        row["error"]
        == "answer: "
        + {
            "openai": "refusal: I'm sorry, I cannot help with that request.",
            "anthropic": "refusal (stop_reason refusal)",
            "gemini": "no usable answer (finishReason SAFETY)",
            "openai-decisions": "refusal: the model declined this question",
        }[kind]
    )


def test_anthropic_refuses_sampling_parameters_at_2026_10_21_unless_the_old_version_is_pinned(
    data_dir: Path,
):
    """API version 2026-10-21 answers temperature, top_p or top_k with HTTP 400 at any value (the
    migration guide): refused before anything is sent, naming the version and the way to pin
    2023-06-01, which still takes them."""
    task = tasks(data_dir)[0]
    for params, named in (
        ({"temperature": 0}, "temperature"),
        ({"top_p": 0.9}, "top_p"),
        ({"top_k": 5, "temperature": 1.0}, "temperature, top_k"),
    ):
        with pytest.raises(ValueError) as refused:
            adapters.get(adapters.ModelSpec("anthropic", "claude-sonnet-5-5", params=params))
        assert str(refused.value) == (
            f"anthropic: API version 2026-10-21 refuses {named} (HTTP 400, even at the default "
            "value): leave it out, or pin the deprecated version with --option "
            'api_version=2023-06-01 (a run file: options = {api_version = "2023-06-01"})'
        )
    old = {"api_version": "2023-06-01"}
    pinned = adapters.get(
        adapters.ModelSpec("anthropic", "claude-sonnet-5-5", params={"temperature": 0}, options=old)
    )
    assert pinned.extra_headers() == {"anthropic-version": "2023-06-01"}
    assert orjson.loads(pinned.encode(task).body)["temperature"] == 0
    with pytest.raises(ValueError) as unknown:
        adapters.get(adapters.ModelSpec("anthropic", "m", options={"api_version": "2024-01-01"}))
    assert str(unknown.value) == (
        "anthropic: the option api_version is one of 2026-10-21, 2023-06-01 (the "
        "anthropic-version header), not '2024-01-01'"
    )
    # the version is not in the cache key: a body both versions take means the same at both
    default = adapters.get("anthropic:claude-sonnet-5-5")
    same = adapters.get(adapters.ModelSpec("anthropic", "claude-sonnet-5-5", options=old))
    assert default.extra_headers() == {"anthropic-version": "2026-10-21"}
    assert (same.encode(task).key, same.encode(task).body) == (
        default.encode(task).key,
        default.encode(task).body,
    )


async def test_anthropic_sends_the_pinned_version_on_every_request(data_dir: Path, tmp_path: Path):
    async with FakeLLM() as server:
        spec = adapters.ModelSpec(
            "anthropic",
            "claude-x",
            server.base_url("anthropic"),
            {"temperature": 0},
            {"api_version": "2023-06-01"},
        )
        _, stats, rows = await run_model(spec, data_dir, tmp_path / "c", limit=2)
    assert {h["anthropic-version"] for h in server.headers} == {"2023-06-01"}
    assert [b["temperature"] for _, b in server.requests] == [0, 0]
    assert (stats.ok, rows.height) == (2, 2)


HEADERS = {
    "openai": ("Authorization", "Bearer {}"),
    "logprobs": ("Authorization", "Bearer {}"),
    "openai-decisions": ("Authorization", "Bearer {}"),
    "anthropic": ("x-api-key", "{}"),
    "gemini": ("x-goog-api-key", "{}"),
}


@pytest.mark.parametrize("kind", KINDS)
async def test_api_key_is_sent_in_its_header_and_never_stored(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
):
    secret = "sk-test-do-not-store-0123456789"
    monkeypatch.setenv(KEY_ENV[kind], secret)
    limiters: dict = {}
    async with FakeLLM(script=["401", "ok"]) as server:
        _, stats, rows = await run_model(
            model(kind, server),
            data_dir,
            tmp_path / "c",
            replace(FAST, max_in_flight=1),
            limit=2,
            limiters=limiters,
        )
    header, value = HEADERS[kind]
    assert {h[header] for h in server.headers} == {value.format(secret)}
    if kind == "anthropic":
        assert {h["anthropic-version"] for h in server.headers} == {"2026-10-21"}
    # a refused key stops the provider: the second request is not sent, neither is stored (the next
    # run sends them)
    (limiter,) = limiters.values()
    assert (len(server.requests), stats.sent, stats.refused, stats.not_sent, rows.height) == (
        1,
        0,
        1,
        1,
        0,
    )
    assert limiter.halted.cause == "API key refused" and "check the API key" in str(limiter.halted)
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_key_the_provider_echoes_back_is_redacted_everywhere(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
):
    secret = "test-key-echoed-by-the-provider-42"
    monkeypatch.setenv(KEY_ENV[kind], secret)
    limiters: dict = {}
    async with FakeLLM(default="echo401") as server:
        _, stats, rows = await run_model(
            model(kind, server), data_dir, tmp_path / "c", limit=1, limiters=limiters
        )
    assert (stats.refused, rows.height) == (1, 0)
    error = str(next(iter(limiters.values())).halted)
    assert "Incorrect API key provided" in error and "[REDACTED]" in error and secret not in error
    for path in (tmp_path / "c").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


async def test_logprobs_retry_sends_only_the_questions_still_unanswered(
    data_dir: Path, tmp_path: Path
):
    """A WildGuardTest task is one request per question: when the second fails (500), the retry
    sends the second and third only; the first, answered, is neither sent nor paid again."""
    async with FakeLLM(script=["ok", "500"]) as server:
        _, stats, rows = await run_model(
            model("logprobs", server), data_dir, tmp_path / "c", limit=1, evals=("wildguardtest",)
        )
    assert (stats.ok, stats.attempts, len(server.requests)) == (
        1,
        2,
        4,
    )  # 3 questions, the second twice
    questions = [body["messages"][-1]["content"] for _, body in server.requests]
    assert questions[1] == questions[2] and len(set(questions)) == 3
    (answers,) = rows["answers"].to_list()
    assert [a["status"] for a in answers] == ["ok", "ok", "ok"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_missing_key_is_a_clear_error_except_on_loopback(
    monkeypatch: pytest.MonkeyPatch, kind: str
):
    monkeypatch.delenv(KEY_ENV[kind], raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)  # Gemini's other variable
    also = r" \(or GOOGLE_API_KEY\)" if kind == "gemini" else ""
    with pytest.raises(
        adapters.Fatal, match=f"the environment variable {KEY_ENV[kind]}{also} is not set"
    ):
        await adapters.get(f"{kind}:{NAMES[kind]}@https://api.example.com/v1").start()
    spec = adapters.ModelSpec(
        kind, NAMES[kind], "https://api.example.com", options={"api_key_env": "MY_PROXY_KEY"}
    )
    monkeypatch.delenv("MY_PROXY_KEY", raising=False)
    with pytest.raises(adapters.Fatal, match="MY_PROXY_KEY is not set"):
        await adapters.get(spec).start()
    async with FakeProvider() as server:  # a loopback server needs no key
        local = adapters.get(
            f"{kind}:{NAMES[kind]}@{server.url.replace('127.0.0.1', 'localhost')}/v1"
        )
        await local.start()
        await local.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_server_that_cannot_be_reached_fails_at_start(kind: str):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(
        adapters.ProviderStop,
        match=rf"cannot reach http://127.0.0.1:{port}/v1 \(ConnectionRefusedError",
    ) as stop:
        await adapters.get(f"{kind}:{NAMES[kind]}@http://127.0.0.1:{port}/v1").start()
    assert stop.value.cause == UNREACHABLE  # its provider alone is stopped (runner.sending.stops)


# ---- the CLI: --param, --option, invalid and repaired counted per model and evaluation -----------
def summary(out: Path) -> dict:
    return orjson.loads((out / "summary.json").read_bytes())


async def _cli(server: FakeLLM, default: str, data_dir: Path, tmp_path: Path, *extra: str) -> int:
    """``dxi run`` on the openai adapter against ``server`` answering in mode ``default``; clears
    its log first."""
    import asyncio

    server.default, server.requests = default, []
    args = [
        "run",
        "--model",
        model("openai", server),
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "-q",
        *extra,
    ]
    return await asyncio.to_thread(main, args)


@pytest.mark.slow
async def test_cli_counts_repaired_and_invalid_per_model_and_evaluation(
    data_dir: Path, tmp_path: Path
):
    async with FakeLLM() as server:
        assert (
            await _cli(
                server,
                "fenced",
                data_dir,
                tmp_path,
                "--param",
                "temperature=0",
                "--param",
                "seed=7",
            )
            == 0
        )
        assert {(b["temperature"], b["seed"]) for _, b in server.requests} == {(0, 7)}
        (m,) = summary(tmp_path / "out")["models"]
        assert {e: (b["invalid"], b["repaired"]) for e, b in m["evals"].items()} == {
            "aa_omniscience_decision": (0, 4),
            "hle_multichoice": (0, 2),
            "when2call": (0, 3),
            "wildguardtest": (0, 9),
        }
        assert (m["requests"]["repaired"], m["requests"]["invalid"]) == (12, 0)
        answers = pl.read_parquet(tmp_path / "out" / "answers.parquet")
        assert answers["repaired"].to_list() == [True] * 18
        # the same command again sends nothing; scoring from the cache counts the same
        assert (
            await _cli(
                server,
                "fenced",
                data_dir,
                tmp_path,
                "--param",
                "temperature=0",
                "--param",
                "seed=7",
            )
            == 0
        )
        assert server.requests == []
        inputs = PlanInputs(
            data_dir=data_dir, cache_dir=tmp_path / "cache", out=tmp_path / "scored"
        )
        assert rescore.rescore(rescore.select(inputs)).exit_code == 0
        scored = summary(tmp_path / "scored")["models"][0]
        assert scored["evals"] == m["evals"] and scored["requests"]["repaired"] == 12
        # other sampling parameters are other requests: here every reply is prose, so every answer
        # is invalid
        assert await _cli(server, "prose", data_dir, tmp_path, "--param", "temperature=0.5") == 0
        assert len(server.requests) == 12
    (m,) = summary(tmp_path / "out")["models"]
    assert {e: (b["invalid"], b["repaired"], b.get("accuracy")) for e, b in m["evals"].items()} == {
        "aa_omniscience_decision": (4, 0, 0.0),
        "hle_multichoice": (2, 0, 0.0),
        "when2call": (3, 0, 0.0),
        "wildguardtest": (9, 0, None),
    }
    assert m["requests"]["invalid"] == 12
    (reason,) = m["invalid_reasons"]  # every answer invalid for the one reason: prose, not JSON
    assert reason["count"] == 18 and "JSON" in reason["error"]


def test_parameters_in_any_order_or_form_make_the_same_request(data_dir: Path):
    task = next(t for t in tasks(data_dir) if t.eval == "when2call")
    keys = set()
    for params in (
        {"temperature": 0, "max_tokens": 64},
        {"max_tokens": 64, "temperature": 0.0},
        {"max_tokens": 64.0, "temperature": -0.0},
    ):
        adapter = adapters.get(adapters.ModelSpec("openai", "m", "http://127.0.0.1:1/v1", params))
        request = adapter.encode(task)
        keys.add((request.key, request.body, adapter.params_key))
    assert len(keys) == 1
    ((_, body, params_key),) = keys
    assert (
        b'"max_tokens":64,"temperature":0' in body
        and params_key == '{"max_tokens":64,"temperature":0}'
    )


@pytest.mark.slow
async def test_score_and_report_find_a_language_model_as_run_named_it(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """``dxi score --model M --param ...`` scores the configuration
    ``dxi run --model M --param ...`` ran, under the same name; the same model from another server,
    or under other parameters, is not mixed in."""
    import asyncio

    where = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
    async with FakeLLM() as one, FakeLLM() as two:
        assert await _cli(one, "ok", data_dir, tmp_path, "--param", "seed=1", "temperature=0") == 0
        assert (
            await _cli(two, "prose", data_dir, tmp_path, "--param", "temperature=0", "seed=1") == 0
        )  # all invalid
        assert (
            await _cli(
                one, "ok", data_dir, tmp_path, "--param", "temperature=0", "--param", "seed=1"
            )
            == 0
        )
        assert one.requests == []  # the order of the flags does not matter
        capsys.readouterr()
        run = ["score", "--model", model("openai", one), *where, "-q"]
        assert (
            await asyncio.to_thread(
                main, [*run, "--out", str(tmp_path / "a"), "--param", "temperature=0", "seed=1"]
            )
            == 0
        )
        (m,) = summary(tmp_path / "a")["models"]
        assert m["model"] == "openai:gpt-fake" and {b["invalid"] for b in m["evals"].values()} == {
            0
        }
        assert (
            await asyncio.to_thread(main, [*run, "--out", str(tmp_path / "b")]) == 2
        )  # without its parameters
        err = capsys.readouterr().err
        assert "openai:gpt-fake: no such model in" in err and '"seed":1' in err
        assert (
            await asyncio.to_thread(main, ["score", *where, "--out", str(tmp_path / "all"), "-q"])
            == 0
        )
    labels = {m["model"]: m["requests"]["invalid"] for m in summary(tmp_path / "all")["models"]}
    assert labels == {
        f"openai:gpt-fake @{one.url}/v1/chat/completions": 0,
        f"openai:gpt-fake @{two.url}/v1/chat/completions": 12,
    }


def test_cli_rejects_flags_no_model_uses(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    base = [
        "run",
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / "o"),
        "-q",
    ]
    assert main([*base, "--model", "embedded", "--param", "temperature=0"]) == 2
    assert "no model of this run takes sampling parameters" in capsys.readouterr().err
    assert main([*base, "--model", "openai:m@http://127.0.0.1:1/v1", "--option", "ctx_size=5"]) == 2
    assert "--option ctx_size: no model of this run knows this option" in capsys.readouterr().err
    assert main([*base, "--model", "openai:m@http://127.0.0.1:1/v1", "--param", "novalue"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


ODD_BODIES = [
    b"[]",
    b"{}",
    b"null",
    b'"text"',
    b'{"choices": "x"}',
    b'{"choices": [1]}',
    b'{"choices": [{"message": 5}]}',
    b'{"choices": [{"message": {"content": ["part"]}, "finish_reason": 7}]}',
    b'{"choices": [{"logprobs": {"content": [{"top_logprobs": [{"token": "A", "logprob": 1e308}]}]}}]}',
    b'{"content": "x"}',
    b'{"content": [1, {"type": "tool_use", "name": "answer", "input": [1]}]}',
    b'{"candidates": [1]}',
    b'{"candidates": [{"content": {"parts": "abc"}, "finishReason": 3}]}',
    b'{"candidates": [], "promptFeedback": 4}',
    b'{"answers": [1, {"type": "choice", "name": "answer", '
    b'"choice": [1], "probabilities": [{"value": [1], "probability": 1}, 5]}]}',
    b'{"answers": {}}',
]


@pytest.mark.parametrize("kind", KINDS)
def test_odd_bodies_give_invalid_answers_or_a_malformed_reply_never_a_crash(
    data_dir: Path, kind: str
):
    adapter = adapters.get(f"{kind}:{NAMES[kind]}@http://127.0.0.1:1")
    task = next(t for t in tasks(data_dir) if t.eval == "when2call")
    decoded = 0
    for body in ODD_BODIES:
        for wrapped in (body, b"[" + body + b"]"):  # logprobs replies come as an array
            try:
                reply = adapter.decode(task, wrapped)
            except adapters.MalformedReply:
                continue
            decoded += 1
            assert reply.status == "invalid" and all(a.error for a in reply.answers)
    assert decoded > 0


def test_param_and_option_take_several_settings_at_once(data_dir: Path):
    from dxi.runner.cli import parser
    from dxi.runner.planning.plan import from_args

    args = parser().parse_args(
        [
            "run",
            "--model",
            "openai:m@http://127.0.0.1:1/v1",
            "--data-dir",
            str(data_dir),
            "--param",
            "seed=1",
            "temperature=0",
            "--param",
            "max_tokens=9",
            "--option",
            "api_key_env=K1",
        ]
    )
    (m,) = from_args(args).models
    assert (
        m.adapter.params == {"max_tokens": 9, "seed": 1, "temperature": 0}
        and m.adapter.key_env == "K1"
    )
