"""Replies that report 0 tokens (``sparrow-decider serve``, the embedded model: servers that count
none) teach the token estimates nothing: ``dxi estimate`` and ``dxi plan`` of a priced model give
what they give with no usage cached (bytes / 4; one output token per question of a decision model),
never 0 tokens and $0 (a trial: 80 new requests estimated at $0.0000 that cost $0.0283)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from dxi.cache import Cache
from dxi.runner.cli import main
from dxi.runner.planning import plan

from .fakes.fake_provider import FakeProvider, systemone
from .helpers.rows import row

URL = "http://127.0.0.1:9"  # nothing listens: the estimate warns, sends nothing
FAKE = f"systemone:fake@{URL}"
PRICED = ["--price", "systemone:fake=1/0"]  # $1 per million input tokens
EVALS = ("aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest")
NOT_COUNTED = "bytes / 4 (this model's cached replies reported 0 tokens: a server that counts none)"
OTHERS_NOT_COUNTED = (  # the zero-token replies are another model's: said so, not as fake's own
    "bytes / 4 (no usage of this model in the cache yet; other systemone models' cached replies "
    "reported 0 tokens: a server that counts none)"
)
NO_USAGE = "bytes / 4 (no usage in the cache yet)"
OTHERS = "estimated from other systemone models' cached usage"


def _estimate(where: list[str], capsys: pytest.CaptureFixture) -> dict:
    capsys.readouterr()
    assert main(["estimate", "--model", FAKE, *PRICED, *where, "--json"]) == 0
    (m,) = orjson.loads(capsys.readouterr().out)["models"]
    return m


def _bytes(data_dir: Path, cache: Path) -> dict[str, int]:
    """The request bytes of fake's requests per evaluation (what bytes / 4 divides)."""
    built = plan.build(models=[FAKE], data_dir=data_dir, cache_dir=cache)
    sizes = dict.fromkeys(EVALS, 0)
    for task, _, request in built.models[0].requests(built.suite):
        sizes[task.eval] += len(request.body)
    return sizes


def _zero(model: str, n: int = 5) -> list[dict]:
    """``n`` ok replies of each evaluation of System One ``model`` that reported 0 tokens (keys no
    request of fake has)."""
    return [
        row(
            f"{model}-{e}-{i}",
            provider="systemone",
            model=model,
            eval=e,
            request_body="x" * 800,
            input_tokens=0,
            output_tokens=0,
        )
        for e in EVALS
        for i in range(n)
    ]


def test_replies_of_zero_tokens_teach_the_estimate_nothing(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cache = tmp_path / "c"
    where = ["--data-dir", str(data_dir), "--cache-dir", str(cache)]
    sizes = _bytes(data_dir, cache)
    total = sum(sizes.values())
    # 12 requests, 18 questions (WildGuardTest asks three): one output token per question
    empty = _estimate(where, capsys)
    assert (empty["new"], empty["basis"]) == (12, {NO_USAGE: 12})
    assert (empty["input_tokens"], empty["output_tokens"]) == (round(total / 4), 18)
    assert empty["cost_usd"] == round(total / 4 / 1e6, 6) > 0
    figures = ("input_tokens", "output_tokens", "cost_usd", "bound_usd", "evals")

    # another System One model's replies, all of 0 tokens: not a ratio of 0 for fake
    with Cache(cache) as opened:
        opened.append_many(_zero("sparrow"))
    other = _estimate(where, capsys)
    assert {k: other[k] for k in figures} == {k: empty[k] for k in figures}
    assert other["basis"] == {OTHERS_NOT_COUNTED: 12}
    # ... nor fake's own replies of 0 tokens (other tasks)
    with Cache(cache) as opened:
        opened.append_many(_zero("fake"))
    own = _estimate(where, capsys)
    assert {k: own[k] for k in figures} == {k: empty[k] for k in figures}
    assert own["basis"] == {NOT_COUNTED: 12}

    # a model that counted its tokens on When2Call (2 tokens per request byte: input 200 of 400
    # bytes, output 2): fake's When2Call is learned from it alone, the 0s left out (pooled with
    # them the ratio would be 200·4·5 / (400·5 + 800·10) = 0.4, not 2)
    with Cache(cache) as opened:
        opened.append_many(
            [
                row(
                    f"counted-{i}",
                    provider="systemone",
                    model="counted",
                    eval="when2call",
                    request_body="x" * 400,
                    input_tokens=200,
                    output_tokens=2,
                )
                for i in range(5)
            ]
        )
    mixed = _estimate(where, capsys)
    assert mixed["evals"]["when2call"] == {
        "new": 3,
        "input_tokens": round(sizes["when2call"] / 4 * 2),
        "output_tokens": 3 * 2,
        "cost_usd": round(sizes["when2call"] / 4 * 2 / 1e6, 6),
    }
    assert {e: mixed["evals"][e] for e in EVALS if e != "when2call"} == {
        e: empty["evals"][e] for e in EVALS if e != "when2call"
    }
    assert mixed["basis"] == {NOT_COUNTED: 9, OTHERS: 3}


def test_the_terminal_says_where_the_figure_comes_from(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cache = tmp_path / "c"
    with Cache(cache) as opened:
        opened.append_many(_zero("sparrow"))
    capsys.readouterr()
    where = ["--data-dir", str(data_dir), "--cache-dir", str(cache)]
    assert main(["estimate", "--model", FAKE, *PRICED, *where]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"systemone:fake: tokens: {OTHERS_NOT_COUNTED} (12)" in out
    assert "estimated from other" not in out and "$0.0000" not in out


def _plan(where: list[str], capsys: pytest.CaptureFixture, model: str = FAKE) -> dict:
    capsys.readouterr()
    args = ["plan", "--model", model, *where, "--precision", "0.01", "--runs", "1", "--json"]
    assert main(args) == 0
    (m,) = orjson.loads(capsys.readouterr().out)["models"]
    return m


def test_a_plan_is_not_priced_from_replies_of_zero_tokens(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cache = tmp_path / "c"
    where = ["--data-dir", str(data_dir), "--cache-dir", str(cache), *PRICED]
    empty = _plan(where, capsys)
    assert empty["tokens_basis"] == {NO_USAGE: 12}
    assert empty["adaptive"]["cost_usd"] > 0
    with Cache(cache) as opened:
        opened.append_many(_zero("sparrow"))
    after = _plan(where, capsys)
    assert after["adaptive"] == empty["adaptive"] and after["whole"] == empty["whole"]
    assert after["tokens_basis"] == {OTHERS_NOT_COUNTED: 12}


async def test_a_priced_model_whose_server_counts_no_tokens_is_planned_at_its_bytes(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """Every request of the model cached, each reply of 0 tokens: the plan's tokens estimate them
    as if new (it had recorded 0 tokens), but none is sent again: the run costs $0, as `dxi
    estimate` says; another priced model of the adapter is estimated as on an empty cache."""
    import asyncio

    counted = systemone(None, 0.7, 0.8)

    def uncounted(payload: dict) -> dict:
        return counted(payload) | {"usage": {"input_tokens": 0, "output_tokens": 0}}

    cache = tmp_path / "c"
    async with FakeProvider(model=None, routes={"/v1/systemone": uncounted}) as server:
        model = f"systemone:sparrow@{server.url}"
        price = ["--price", "systemone:sparrow=1/0"]
        where = ["--data-dir", str(data_dir), "--cache-dir", str(cache), *price]
        empty = await asyncio.to_thread(_plan, where, capsys, model)
        run = ["run", "--model", model, *where, "--out", str(tmp_path / "o"), "-q"]
        assert await asyncio.to_thread(main, run) == 0
    with Cache(cache, read_only=True) as opened:
        rows = opened.scan().collect()
    assert rows.height == 12 and set(rows["input_tokens"]) == {0}
    after = await asyncio.to_thread(_plan, where, capsys, model)
    tokens = ("requests", "input_tokens", "output_tokens")
    assert {k: after["adaptive"][k] for k in tokens} == {k: empty["adaptive"][k] for k in tokens}
    assert empty["adaptive"]["cost_usd"] > 0 and empty["adaptive"]["new_requests"] == 12
    assert (after["adaptive"]["cost_usd"], after["adaptive"]["cached_requests"]) == (0.0, 12.0)
    assert after["whole"]["cost_usd"] == 0.0
    assert after["tokens_basis"] == {NOT_COUNTED: 12}  # sparrow's own replies
    sizes = _bytes(data_dir, cache)
    fake = await asyncio.to_thread(
        _estimate, ["--data-dir", str(data_dir), "--cache-dir", str(cache)], capsys
    )
    assert (fake["input_tokens"], fake["output_tokens"]) == (round(sum(sizes.values()) / 4), 18)
    assert fake["basis"] == {OTHERS_NOT_COUNTED: 12}  # sparrow's replies, not fake's


async def test_a_plan_names_a_system_one_model_as_its_server_does(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A System One model given without its name (``systemone:URL``, a run file's provider without
    ``model``) is named by its server (GET /health), as `dxi estimate` and `dxi run` name it: the
    plan reads its own answers and usage in the cache, not the prior and other models' usage."""
    import asyncio

    cache = tmp_path / "c"
    async with FakeProvider() as server:  # serves "fake-decider", counts its tokens
        where = ["--data-dir", str(data_dir), "--cache-dir", str(cache)]
        unnamed = f"systemone:{server.url}"
        run = ["run", "--model", unnamed, *where, "--out", str(tmp_path / "o"), "-q"]
        assert await asyncio.to_thread(main, run) == 0
        planned = await asyncio.to_thread(_plan, where, capsys, unnamed)
    assert planned["model"] == "systemone:fake-decider"
    assert planned["profile"] == "its answers in the cache"
    assert planned["tokens_basis"] == {"recorded by its cached replies": 12}


def test_a_plan_estimates_a_models_requests_once(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """Every request of fake in the cache, no reply of it counting tokens: each evaluation is
    estimated as if new (bytes / 4, as with an empty cache). ``dxi plan`` estimated the model
    twice for that (every request encoded again, cached ones too); once now, the same plan."""
    from dxi.runner.planning import estimate as estimating

    cache = tmp_path / "c"
    where = ["--data-dir", str(data_dir), "--cache-dir", str(cache), *PRICED]
    empty = _plan(where, capsys)
    built = plan.build(models=[FAKE], data_dir=data_dir, cache_dir=cache)
    requests = [(t.eval, r.key) for t, _, r in built.models[0].requests(built.suite)]
    with Cache(cache) as opened:
        opened.append_many(
            [row(key, provider="systemone", model="fake", eval=e) for e, key in requests]
        )
    estimated, real = [], estimating._estimate_one
    monkeypatch.setattr(
        estimating, "_estimate_one", lambda m, *a: estimated.append(m.adapter.label) or real(m, *a)
    )
    cached = _plan(where, capsys)
    assert estimated == ["systemone:fake"]  # once, not twice
    assert cached["tokens_basis"] == {NO_USAGE: 12} == empty["tokens_basis"]
    tokens = ("requests", "input_tokens", "output_tokens")
    for part in ("adaptive", "whole"):
        assert {k: cached[part][k] for k in tokens} == {k: empty[part][k] for k in tokens}
        assert empty[part]["cost_usd"] > 0 and empty[part]["cached_requests"] == 0
        assert (cached[part]["cost_usd"], cached[part]["cached_requests"]) == (0.0, 12.0)
