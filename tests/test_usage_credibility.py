"""A reply's usage that no reply can state (more cached input than input, a count below 0, an
output count missing or not a number) is not kept: the request is charged its reservation, its cost
is unknown, a warning names the counts; no cost is ever negative (trial 9)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import polars as pl
import pytest

from .fakes.fake_llm_server import FakeLLM

MODELS = {
    "openai": "openai:gpt-fake@{}/v1",
    "gemini": "gemini:gemini-fake@{}",
    "anthropic": "anthropic:claude-fake@{}",
}
LABELS = {"openai": "openai:gpt-fake", "gemini": "gemini:gemini-fake"}
LABELS["anthropic"] = "anthropic:claude-fake"
CAPS = {"openai": "max_completion_tokens", "gemini": "maxOutputTokens", "anthropic": "max_tokens"}
KEYS = {"openai": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


async def run(
    kind: str,
    usage: dict,
    price: str,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: str = "never",
    behaviour: str = "usageof",
    more: tuple[str, ...] = (),
) -> tuple[int, dict, dict, pl.DataFrame, list[int]]:
    """Two When2Call requests of ``kind`` (capped at 100 output tokens, under --max-cost 1) to a
    server whose replies state ``usage`` (``behaviour``: the FakeLLM mode given it; ``more``: more
    arguments): (exit code, the model's ``requests`` block, the run's
    ``cost_bound`` block, the cache rows, the request bodies' sizes)."""
    from dxi.runner.cli import main

    monkeypatch.setenv(KEYS[kind], "sk-test-key")
    cache, out = tmp_path / "cache", tmp_path / "out"
    async with FakeLLM(default=f"{behaviour}:{orjson.dumps(usage).decode()}") as server:
        argv = ["run", "--model", MODELS[kind].format(server.url), "--evals", "when2call"]
        argv += ["--limit", "2", "--max-cost", "1", "--price", f"{LABELS[kind]}={price}"]
        argv += ["--param", f"{CAPS[kind]}=100"]
        argv += ["--stream", stream, "--data-dir", str(data_dir)]
        argv += ["--cache-dir", str(cache), "--out", str(out), "-q", *more]
        code = await asyncio.to_thread(main, argv)
        sizes = [len(orjson.dumps(body)) for _, body in server.requests]
    summary = orjson.loads((out / "summary.json").read_bytes())
    (model,) = summary["models"]
    rows = pl.read_parquet(next(cache.rglob("*.parquet")))
    return code, model["requests"], summary["cost_bound"], rows, sizes


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not credible" in r.getMessage()]


@pytest.mark.parametrize(
    ("kind", "usage", "what"),
    [
        (
            "openai",
            {
                "prompt_tokens": 10,
                "completion_tokens": 0,
                "total_tokens": 10,
                "prompt_tokens_details": {"cached_tokens": 900},
            },
            "openai:gpt-fake: a reply's usage is not credible (cached_input_tokens 900 > "
            "input_tokens 10, which include them): not kept, its cost is unknown",
        ),
        (
            "gemini",
            {"promptTokenCount": 10, "candidatesTokenCount": 5, "cachedContentTokenCount": 900},
            "gemini:gemini-fake: a reply's usage is not credible (cached_input_tokens 900 > "
            "input_tokens 10, which include them): not kept, its cost is unknown",
        ),
    ],
)
async def test_more_cached_input_than_input_is_not_kept_and_never_a_negative_cost(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    usage: dict,
    what: str,
):
    """OpenAI's ``cached_tokens`` and Gemini's ``cachedContentTokenCount`` are counted within the
    prompt tokens: 900 cached of 10 is no reply's usage. At $100 per million input tokens, $0
    cached and output free, the old code priced each reply at (10·100 − 900·100) / 1e6 = −$0.089:
    −$0.178 spent, "$-0.1780" and a bound it let others pass. Now: each reply warned of, its usage
    not kept (the rows hold no counts), each request charged its reservation (its body's bytes at
    $100 per million: the output is free), the cost unknown ("at most")."""
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        code, requests, bound, rows, sizes = await run(
            kind, usage, "100/0/0", data_dir, tmp_path, monkeypatch
        )
    assert code == 0
    reserved = round(sum(sizes) * 100 / 1e6, 6)
    assert (bound["spent_usd"], requests["cost_usd"]) == (pytest.approx(reserved),) * 2
    assert requests["cost_at_reservation_usd"] == pytest.approx(reserved) and reserved > 0
    assert (requests["sent"], requests["input_tokens"], requests["output_tokens"]) == (2, 0, 0)
    assert warnings(caplog) == [what]  # once per model (cost._warn)
    assert (
        rows.select("input_tokens", "cached_input_tokens", "output_tokens").rows()
        == [(None, None, None)] * 2
    )


def test_no_cost_is_negative_and_a_cache_rows_inconsistent_counts_are_no_usage():
    """``cost_usd`` refuses a negative figure (it returned −0.089); ``known_cost`` of a row with
    900 cached of 10 input tokens (as an earlier version kept) is unknown (None), not −$0.089; a
    count below 0 likewise; a consistent row is priced: 100 input of which 90 cached at
    $100 / $0 / $0 is (100·100 − 90·100) / 1e6 = $0.001."""
    from dxi.scoring.cost import cost_usd, inconsistent, known_cost

    with pytest.raises(ValueError, match=r"^a negative cost \(-0\.089000 USD\): 10 input tokens"):
        cost_usd(10, 0, 100, 0, 0, cached_tokens=900)
    price = (100.0, 0.0, 0.0)
    row = {"input_tokens": 10, "output_tokens": 0, "cached_input_tokens": 900}
    assert known_cost(row, price) is None
    assert inconsistent(row) == "cached_input_tokens 900 > input_tokens 10, which include them"
    assert inconsistent({"input_tokens": 10, "output_tokens": -5}) == "output_tokens -5 < 0"
    assert known_cost(row | {"cached_input_tokens": 90, "input_tokens": 100}, price) == 0.001


@pytest.mark.parametrize(
    ("kind", "usage", "stream", "what"),
    [
        ("openai", {"prompt_tokens": 100}, "never", "input_tokens 100 without output_tokens"),
        (
            "openai",
            {"prompt_tokens": 100, "completion_tokens": None, "total_tokens": 150},
            "never",
            "not a count of tokens: usage.completion_tokens null",
        ),
        (
            "openai",
            {"prompt_tokens": 100, "completion_tokens": "50"},
            "never",
            'not a count of tokens: usage.completion_tokens "50"',
        ),
        (
            "openai",
            {"prompt_tokens": 100, "completion_tokens": -50, "total_tokens": 50},
            "always",
            "not a count of tokens: usage.completion_tokens -50",
        ),
        ("anthropic", {"input_tokens": 100}, "never", "input_tokens 100 without output_tokens"),
        (
            "anthropic",
            {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": -100000},
            "never",
            "not a count of tokens: usage.cache_read_input_tokens -100000",
        ),
        (
            "gemini",
            {"promptTokenCount": 100, "candidatesTokenCount": 5, "thoughtsTokenCount": -1000},
            "never",
            "not a count of tokens: usageMetadata.thoughtsTokenCount -1000",
        ),
    ],
)
async def test_an_output_count_missing_or_not_a_count_is_not_priced_as_0_output(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    usage: dict,
    stream: str,
    what: str,
):
    """Output at $100 per million tokens, input free, a cap of 100 output tokens: a reply whose
    output count is missing, null, a string or below 0 (whole or streamed; a thought count below
    0; a cache read below 0, which was read as 0) was priced as 0 output: $0 for the two requests,
    so the bound never stopped a model whose every reply says so. Now each is warned of, its
    usage not kept, each request charged its reservation, 100 · 100 / 1e6 = $0.01 (the input is
    free): $0.02, at most."""
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        code, requests, bound, rows, _ = await run(
            kind, usage, "0/100", data_dir, tmp_path, monkeypatch, stream
        )
    assert code == 0
    assert (bound["spent_usd"], requests["cost_usd"]) == (0.02, 0.02)
    assert requests["cost_at_reservation_usd"] == 0.02
    assert rows.select("status", "input_tokens", "output_tokens").rows() == [("ok", None, None)] * 2
    label = LABELS[kind]
    said = f"{label}: a reply's usage is not credible ({what}): not kept, its cost is unknown"
    assert warnings(caplog) == [said]  # once per model (cost._warn)


async def test_a_gemini_count_left_out_is_0_as_the_api_leaves_out_a_count_of_0(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """Gemini leaves a count of 0 out of its JSON: ``{"promptTokenCount": 100}`` is 100 input
    tokens and 0 output, believed (no warning): at $1 / $100 per million, 100 · 1 / 1e6 = $0.0001 a
    reply, $0.0002 for two, a known cost (no "at most"); the rows hold 0 output tokens (the old code
    kept null there, while pricing it as 0)."""
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        code, requests, bound, rows, _ = await run(
            "gemini", {"promptTokenCount": 100}, "1/100", data_dir, tmp_path, monkeypatch
        )
    assert code == 0 and warnings(caplog) == []
    assert (bound["spent_usd"], requests["cost_usd"]) == (0.0002, 0.0002)
    assert "cost_at_reservation_usd" not in requests
    assert rows.select("input_tokens", "output_tokens").rows() == [(100, 0)] * 2


@pytest.mark.parametrize(
    ("kind", "usage"),
    [
        (
            "openai",
            {
                "prompt_tokens": 100,
                "completion_tokens": 10,
                "total_tokens": 110,
                "prompt_tokens_details": {"cached_tokens": None, "audio_tokens": None},
                "completion_tokens_details": {"reasoning_tokens": None},
            },
        ),
        ("openai", {"prompt_tokens": 100.0, "completion_tokens": 10.0, "total_tokens": 110.0}),
        (
            "anthropic",
            {
                "input_tokens": 100,
                "output_tokens": 10,
                "cache_read_input_tokens": None,
                "cache_creation_input_tokens": None,
                "cache_creation": None,
            },
        ),
        (
            "gemini",
            {
                "promptTokenCount": 100,
                "candidatesTokenCount": 10,
                "thoughtsTokenCount": None,
                "cachedContentTokenCount": None,
            },
        ),
    ],
    ids=["openai-null-details", "openai-integral-floats", "anthropic-null-cache", "gemini-null"],
)
async def test_a_null_sub_count_or_an_integral_float_is_a_usage_believed(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    usage: dict,
):
    """A sub-count that is ``null`` (cached, cache writes, reasoning, thoughts: ``Optional[int]``
    in the openai, anthropic and google-genai SDKs; LiteLLM writes ``"cached_tokens": null``)
    states nothing, as one left out, and ``100.0`` is the count 100: 100 input and 10 output
    tokens at $1 / $100 per million are 100 · 1 / 1e6 + 10 · 100 / 1e6 = $0.0011 a reply, $0.0022
    for two, a known cost, the counts kept, no warning. The old code threw the whole usage away
    (charged each request its reservation, tokens never stored)."""
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        code, requests, bound, rows, _ = await run(
            kind, usage, "1/100", data_dir, tmp_path, monkeypatch
        )
    assert code == 0 and warnings(caplog) == []
    assert (bound["spent_usd"], requests["cost_usd"]) == (0.0022, 0.0022)
    assert "cost_at_reservation_usd" not in requests
    assert rows.select("input_tokens", "output_tokens").rows() == [(100, 10)] * 2


@pytest.mark.parametrize(
    ("usage", "known"),
    [({"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}, True), (None, False)],
    ids=["usage-stated", "no-usage"],
)
async def test_an_error_inside_a_200_is_charged_the_usage_it_states_else_its_reservation(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    usage: dict | None,
    known: bool,
):
    """OpenRouter's error mid-generation (``finish_reason: "error"`` with an ``error`` object, in a
    200) was generated and is billed. Two requests, 3 attempts each (all errors): with a usage of
    100 input and 10 output tokens at $1 / $100 per million each attempt is charged
    100 · 1 / 1e6 + 10 · 100 / 1e6 = $0.0011, 6 · 0.0011 = $0.0066, a known cost; without usage,
    each attempt its reservation (its body's bytes at $1 per million + 100 output tokens at $100
    per million = $0.01 + bytes / 1e6), at most. The old code charged $0 for both (an HTTP error
    status), and retried it free to the end of its attempts."""
    code, requests, bound, rows, sizes = await run(
        "openai",
        usage,
        "1/100",
        data_dir,
        tmp_path,
        monkeypatch,
        behaviour="error200of",
        more=("--max-attempts", "3", "--backoff", "0"),
    )
    assert (code, len(sizes), rows["status"].to_list()) == (1, 6, ["failed"] * 2)
    expected = 0.0066 if known else round(sum(sizes) / 1e6 + 6 * 0.01, 6)
    assert (bound["spent_usd"], requests["cost_usd"]) == (pytest.approx(expected),) * 2
    assert requests.get("cost_at_reservation_usd") == (None if known else pytest.approx(expected))


OVER_CAP = (
    "a reply's output passes its request's own cap (output_tokens {} > 100, the request's own cap)"
)


async def test_output_past_its_cap_but_plausible_is_kept_and_charged_at_least_its_reservation(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """A cap of 100 output tokens, and replies stating 100 input and 2000 output tokens (a provider
    whose cap leaves out its reasoning: billed 2000): at $0 / $100 per million each is billed
    2000 · 100 / 1e6 = $0.20, $0.40 for two, charged so (a known cost: the larger of it and the
    reservation, 100 · 100 / 1e6 = $0.01), the counts kept, each reply warned of. The old code
    threw the usage away and charged the reservations, $0.02 of the $0.40 billed."""
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        usage = {"prompt_tokens": 100, "completion_tokens": 2000, "total_tokens": 2100}
        code, requests, bound, rows, _ = await run(
            "openai", usage, "0/100", data_dir, tmp_path, monkeypatch
        )
    assert code == 0
    assert (bound["spent_usd"], requests["cost_usd"]) == (0.4, 0.4)
    assert "cost_at_reservation_usd" not in requests
    assert rows.select("input_tokens", "output_tokens").rows() == [(100, 2000)] * 2
    said = (
        "openai:gpt-fake: "
        + OVER_CAP.format(2000)
        + (": its usage is kept, and charged at least its reservation")
    )
    assert [r.getMessage() for r in caplog.records if "own cap" in r.getMessage()] == [said]


async def test_output_past_its_cap_costing_less_than_the_reservation_is_charged_the_reservation(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """100 input and 150 output tokens (cap 100) at $100 / $1 per million: stated
    100 · 100 / 1e6 + 150 / 1e6 = $0.01015 a reply, below its reservation (its body's bytes at $100
    per million + 100 output tokens at $1): charged the reservation ("at most"), the counts kept."""
    usage = {"prompt_tokens": 100, "completion_tokens": 150, "total_tokens": 250}
    code, requests, bound, rows, sizes = await run(
        "openai", usage, "100/1", data_dir, tmp_path, monkeypatch
    )
    reserved = round(sum(sizes) * 100 / 1e6 + 2 * 100 / 1e6, 6)
    assert code == 0 and reserved > 2 * 0.01015
    assert (bound["spent_usd"], requests["cost_usd"]) == (pytest.approx(reserved),) * 2
    assert requests["cost_at_reservation_usd"] == pytest.approx(reserved)
    assert rows.select("input_tokens", "output_tokens").rows() == [(100, 150)] * 2


async def test_output_past_what_any_reply_holds_is_not_kept_though_capped(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """1,048,577 output tokens under a cap of 100: past ``MAX_REPLY_OUTPUT``, not plausible: not
    kept, each request charged its reservation (100 · 100 / 1e6 = $0.01, input free)."""
    usage = {"prompt_tokens": 100, "completion_tokens": 1_048_577}
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        code, requests, bound, rows, _ = await run(
            "openai", usage, "0/100", data_dir, tmp_path, monkeypatch
        )
    assert (code, bound["spent_usd"], requests["cost_at_reservation_usd"]) == (0, 0.02, 0.02)
    assert rows.select("input_tokens", "output_tokens").rows() == [(None, None)] * 2
    assert warnings(caplog) == [
        "openai:gpt-fake: a reply's usage is not credible (output_tokens 1048577 > 1,048,576, "
        "more than any provider's model writes in one reply (its own cap is 100)): not kept, its "
        "cost is unknown"
    ]


def test_a_main_count_null_or_a_fraction_is_still_named():
    """Only a sub-count's ``null`` states nothing: a main count ``null`` or a fraction (100.5) is
    named, a sub-count that is a string or below 0 too; ``as_count`` reads 100.0 as 100."""
    from dxi.adapters.anthropic import usage_of
    from dxi.adapters.http import as_count
    from dxi.adapters.openai import usage_problem_of

    doc = {"usage": {"prompt_tokens": None, "completion_tokens": 10.5}}
    assert usage_problem_of(doc) == "usage.prompt_tokens null; usage.completion_tokens 10.5"
    doc = {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    doc["usage"]["prompt_tokens_details"] = {"cached_tokens": "5"}
    assert usage_problem_of(doc) == 'usage.prompt_tokens_details.cached_tokens "5"'
    assert usage_of({"usage": {"input_tokens": 10, "output_tokens": None}})["usage_problem"] == (
        "usage.output_tokens null"
    )
    assert (as_count(100.0), as_count(100.5), as_count(True), as_count(-1.0)) == (
        100,
        None,
        None,
        None,
    )


def test_a_count_that_is_infinity_or_a_fraction_is_named_not_read_as_absent():
    """``Infinity`` (which the reply parser reads as a float) and 0.5 are no counts: the decoded
    reply names them (``Reply.usage_problem``) and ``incredible`` does not believe it; a count left
    out is not named."""
    from dxi.adapters.openai import usage_problem_of

    doc = {"usage": {"prompt_tokens": 100.9, "completion_tokens": float("inf")}}
    assert usage_problem_of(doc) == ("usage.prompt_tokens 100.9; usage.completion_tokens Infinity")
    assert usage_problem_of({"usage": {"prompt_tokens": 100}}) is None


def test_a_cache_rows_counts_no_reply_can_state_are_counted_as_no_usage():
    """Rows an earlier version kept: 100 input and 10 output tokens (believed), 10 input of which
    900 cached, and 100 input without an output count. At $100 / $100 / $0 per million the old
    usage block summed them all: 210 input tokens, (210·100 + 10·100 − 900·100) / 1e6 = −$0.068.
    Now the two are replies without usage: 100 input, 10 output, the cost unknown (null, with the
    reason), never negative."""
    import numpy as np

    from dxi.scoring.cost import usage_blocks
    from dxi.scoring.pipeline import usage_table

    found = pl.DataFrame(
        {
            "eval": ["when2call"] * 3,
            "status": ["ok"] * 3,
            "input_tokens": [100, 10, 100],
            "output_tokens": [10, 0, None],
            "cached_input_tokens": [0, 900, None],
            "cache_write_tokens": [None] * 3,
            "cache_write_1h_tokens": [None] * 3,
            "transport": [None] * 3,
        },
        schema_overrides={"cache_write_tokens": pl.Int64, "cache_write_1h_tokens": pl.Int64},
    )
    table = usage_table(found, np.zeros(3, np.int64), pl.DataFrame({"label": ["a"]}))
    per_model, run = usage_blocks(table, ["a"], {"a": (100.0, 100.0, 0.0)})
    block = per_model["a"]
    assert run["cost_usd"] is None and run["cost_reason"] == "replies of a reported no usage"
    assert (block["replies"], block["with_usage"]) == (3, 1)
    assert (block["input_tokens"], block["output_tokens"], block["cached_input_tokens"]) == (
        100,
        10,
        0,
    )
    assert block["cost_usd"] is None
    assert block["cost_reason"] == "2 replies reported no usage: their cost is unknown"


async def test_a_reply_of_another_model_is_charged_its_reservation_not_its_absurd_usage(
    data_dir: Path, tmp_path: Path
):
    """A System One server now serving another model answers with a usage of 10^12 input tokens:
    the provider stops (the reply is not the model's, not stored) and the request is charged as any
    reply whose usage is not credible, its reservation. Before, the served-model check came before
    the credibility check, so the stop kept the raw usage: 10^12 tokens at $1 per million charged
    $1,000,000 against a $1 bound."""
    from dxi import adapters
    from dxi.cache import Cache
    from dxi.evals import Suite, discover
    from dxi.runner.planning.plan import ModelRun
    from dxi.runner.sending.cost import Budget
    from dxi.runner.sending.scheduler import run as run_models

    from .fakes.fake_provider import FakeProvider, systemone
    from .helpers.runs import FAST

    other = systemone("fake-robot", 0.7, 0.8)

    def respond(payload: dict) -> dict:
        return other(payload) | {"usage": {"input_tokens": 10**12, "output_tokens": 1}}

    async with FakeProvider(model="fake-decider", routes={"/v1/systemone": respond}) as server:
        adapter = adapters.get(f"systemone:fake-decider@{server.url}", FAST)
        await adapter.start()
        budget = Budget(1.0)
        try:
            with Cache(tmp_path / "c") as cache:
                await run_models(
                    [ModelRun(adapter, price=(1.0, 1.0))],
                    Suite(discover(data_dir), limit=1, evals=("when2call",)),
                    cache,
                    budget=budget,
                )
                rows = cache.scan().collect()
        finally:
            await adapter.close()
    assert rows.height == 0  # another model's reply: never stored
    assert 0 < budget.spent == budget.spent_at_reservation < 0.01


def test_every_format_gives_an_error_inside_a_200_the_usage_it_states():
    """Each decoder raises ``ErrorIn200`` carrying the usage the error body states (Anthropic's
    cache reads added to its input: 10 + 4 = 14), or None when it states none."""
    from dxi.adapters.anthropic import decode_messages
    from dxi.adapters.errors import ErrorIn200
    from dxi.adapters.gemini import decode_generate
    from dxi.adapters.gemini_decisions import decode_decision
    from dxi.adapters.openai import decode_chat
    from dxi.adapters.openai_decisions import decode_decisions
    from dxi.adapters.systemone import decode_body

    error = {"error": {"message": "upstream died"}}
    cases = [
        (decode_chat, {"prompt_tokens": 10, "completion_tokens": 5}, "usage", (10, 5)),
        (decode_decisions, {"input_tokens": 10, "output_tokens": 5}, "usage", (10, 5)),
        (decode_body, {"input_tokens": 10, "output_tokens": 5}, "usage", (10, 5)),
        (
            decode_messages,
            {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 4},
            "usage",
            (14, 5),
        ),
        (
            decode_generate,
            {"promptTokenCount": 10, "candidatesTokenCount": 5},
            "usageMetadata",
            (10, 5),
        ),
        (decode_decision, {"total_input_tokens": 10, "total_output_tokens": 5}, "usage", (10, 5)),
    ]
    for decode, usage, key, counts in cases:
        with pytest.raises(ErrorIn200) as raised:
            decode(None, orjson.dumps(error | {key: usage}))
        assert (raised.value.usage.input_tokens, raised.value.usage.output_tokens) == counts
        assert str(raised.value) == "an error inside a 200 reply: upstream died"
        with pytest.raises(ErrorIn200) as raised:
            decode(None, orjson.dumps(error))
        assert raised.value.usage is None


def test_a_system_one_servers_own_prompt_is_believed_and_charged_as_stated(
    caplog: pytest.LogCaptureFixture,
):
    """A System One server wraps the questions in its own prompt template: 1500 input tokens for a
    376-byte request (trial 10 F) are its usage, kept without a warning (the old code: "not
    credible", dropped, a warning per reply, even without a price), charged the larger of its cost
    and the reservation: at $1 per million input tokens, 1500 / 1e6 = $0.0015 (the reservation,
    376 input tokens and 1 output token at $0, is $0.000376). Past 1,048,576 input tokens it is
    not believed; an OpenAI request's input past its bytes is still not."""
    from types import SimpleNamespace

    from dxi.adapters import Reply, Request, get, parse_model
    from dxi.runner.sending.cost import Budget, Charge, credible

    adapter = get(parse_model("systemone:decider@http://127.0.0.1:9"))
    task = SimpleNamespace(questions=("q",))  # one question: one output token
    request = Request("systemone", "decider", "http://127.0.0.1:9", b"x" * 376)
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        kept = credible(Reply((), 1500, 1), adapter, task, request)
    assert (kept.input_tokens, kept.output_tokens, kept.over_cap) == (1500, 1, True)
    assert caplog.records == []
    charge = Charge(Budget(1.0), (1.0, 0.0))
    reserved = charge.bound(adapter, task, request)
    assert (reserved, charge.settle(reserved, kept, None)) == (0.000376, (0.0015, False, True))
    assert credible(Reply((), 1_048_577, 1), adapter, task, request).input_tokens is None
    openai = get(parse_model("openai:gpt-x@http://127.0.0.1:9/v1"))
    assert credible(Reply((), 1500, 1), openai, task, request).input_tokens is None


def test_a_warning_of_a_reply_s_usage_is_given_once_per_model_then_at_10_100_with_its_count(
    caplog: pytest.LogCaptureFixture,
):
    """250 replies of one model whose output passes the cap, 3 of another model: 3 lines for the
    first (its 1st, 10th and 100th such reply), 1 for the second, not 253 (trial 10 G: one line per
    reply)."""
    from types import SimpleNamespace

    from dxi.adapters import Reply, Request, get, parse_model
    from dxi.runner.sending.cost import credible

    task = SimpleNamespace(questions=("q",))
    one, two = (get(parse_model(f"systemone:{m}@http://127.0.0.1:9")) for m in ("d1", "d2"))
    request = Request("systemone", "d1", "http://127.0.0.1:9", b"x" * 376)
    with caplog.at_level(logging.WARNING, "dxi.cost"):
        for adapter, n in ((one, 250), (two, 3)):
            for _ in range(n):
                assert credible(Reply((), 10, 2), adapter, task, request).over_cap
    said = (
        "systemone:{}: a reply's output passes its request's own cap (output_tokens 2 > 1, the "
        "request's own cap): its usage is kept, and charged at least its reservation"
    )
    assert [r.getMessage() for r in caplog.records] == [
        said.format("d1"),
        said.format("d1") + " (the 10th such reply of systemone:d1)",
        said.format("d1") + " (the 100th such reply of systemone:d1)",
        said.format("d2"),
    ]
