"""``--price MODEL=IN/OUT[/CACHED]`` on the command line (issue 23, item 9): a paid model given by
``--model`` can be bounded by ``--max-cost``; ``--help`` states the limits' real defaults.

The fake System One provider (a proxy: it serves every model named) reports ``len(state) // 4 + 8``
input tokens and one output token per question (``tests.fakes.fake_provider.systemone``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from dxi.adapters import Limits
from dxi.adapters.embedded import Embedded
from dxi.adapters.llamacpp import LlamaCpp
from dxi.runner.cli import main, parser
from dxi.runner.errors import EXIT_COST_BOUND, EXIT_USAGE, UsageError
from dxi.runner.planning.config import Price
from dxi.runner.planning.plan import price_flags

from .fakes.fake_provider import FakeProvider
from .helpers.runs import fake_usage, write_run_file
from .helpers.synthetic import data_dir

TASKS = 24


def test_price_items_parse_as_usd_per_million_tokens():
    assert price_flags(["openai:gpt-5-mini=0.25/2/0.025", "m@http://h:1/v1?a=b=1.5/6"]) == {
        "openai:gpt-5-mini": Price(0.25, 2.0, 0.025),
        "m@http://h:1/v1?a=b": Price(1.5, 6.0),
    }
    for item, says in (
        ("m=1", "expected MODEL=IN/OUT"),
        ("=1/2", "expected MODEL=IN/OUT"),
        ("m=1/2/3/4", "expected"),
        ("m=1/x", "'1/x' holds something that is not a number"),
        # Python's float reads "1_0" as 10 (trial 10: priced at $10)
        ("m=1_0/1", "'1_0/1' holds something that is not a number"),
    ):
        with pytest.raises(UsageError, match=says):
            price_flags([item])
    # out of range: negative, not a number, or above $1,000,000 per million tokens (trial 9:
    # 1e308/1e308 made every cost infinite, "about $inf expected")
    for item in ("m=-1/2", "m=nan/2", "m=1e308/1e308", "m=1/2/1000001", "m=inf/1"):
        with pytest.raises(UsageError) as refused:
            price_flags([item])
        assert str(refused.value) == (
            f"--price {item!r}: each price must be a number from 0 to 1,000,000 (USD per million "
            "tokens)"
        )
    assert price_flags(["m=1000000/0"]) == {"m": Price(1e6, 0.0)}
    from dxi.runner.planning import numbers

    assert not numbers.MAX_COST.accepts("1_0") and numbers.MAX_COST.accepts("10")
    with pytest.raises(UsageError, match="--price m: given twice"):
        price_flags(["m=1/2", "m=3/4"])


def _run(*args: str) -> int:
    return main([*args, "-q"])


async def test_max_cost_bounds_a_model_given_by_model_with_its_price_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    data_dir(tmp_path / "data", TASKS)
    common = [
        "--data-dir",
        str(tmp_path / "data"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--evals",
        "when2call",  # the synthetic data: When2Call only
    ]
    async with FakeProvider(model=None) as server:
        model = f"systemone:m1@{server.url}"
        # without a price the bound is refused before anything is sent, naming --price
        assert (
            await asyncio.to_thread(_run, "run", "--model", model, "--max-cost", "1.5", *common)
            == EXIT_USAGE
        )
        assert "give it with --price systemone:m1=IN/OUT" in capsys.readouterr().err
        assert server.stats()["arrivals"] == 0
        # the dry run prices what it would send at the given price
        assert (
            await asyncio.to_thread(
                main,
                ["estimate", "--model", model, "--price", f"{model}=1000/2000", "--json", *common],
            )
            == 0
        )
        (est,) = orjson.loads(capsys.readouterr().out)["models"]
        # (the estimate's token counts are shown rounded: within 0.1%, as tests/test_run_file.py
        # compares them)
        assert est["cost_usd"] == pytest.approx(
            (est["input_tokens"] * 1000 + est["output_tokens"] * 2000) / 1e6, rel=1e-3
        )
        # the model's name (kind:model) names it as well as the model string
        assert (
            await asyncio.to_thread(
                _run,
                "run",
                "--model",
                model,
                "--price",
                "systemone:m1=1000/2000",
                "--max-cost",
                "1.5",
                *common,
            )
            == EXIT_COST_BOUND
        )
        done = server.stats()["arrivals"]
    tokens_in, tokens_out = fake_usage(tmp_path / "cache")
    spent = (tokens_in * 1000 + tokens_out * 2000) / 1e6
    s = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    bound = s["cost_bound"]
    assert 0 < done < TASKS and bound["stopped"] is True and bound["max_cost_usd"] == 1.5
    assert bound["spent_usd"] == pytest.approx(spent, rel=1e-9) and spent <= 1.5
    assert s["models"][0]["usage"]["price"] == {"input": 1000.0, "output": 2000.0}


def test_price_names_a_model_of_the_run_and_overrides_the_run_files(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    data_dir(tmp_path / "data", 2)
    path = write_run_file(
        tmp_path,
        {"p": ("http://127.0.0.1:9", 60)},
        [
            {"provider": "p", "model": "m1", "price": {"input": 1000.0, "output": 2000.0}},
            {"provider": "p", "model": "m2", "name": "Second"},
        ],
    )
    assert main(["estimate", str(path), "--json", "--price", "Second=3000/4000/500"]) == 0
    first, second = orjson.loads(capsys.readouterr().out)["models"]
    assert second["cost_usd"] == pytest.approx(
        (second["input_tokens"] * 3000 + second["output_tokens"] * 4000) / 1e6, rel=1e-3
    )
    assert first["cost_usd"] == pytest.approx(
        (first["input_tokens"] * 1000 + first["output_tokens"] * 2000) / 1e6, rel=1e-3
    )
    assert (
        main(["estimate", str(path), "--json", "--price", "systemone:m1=10000/20000"]) == 0
    )  # over the file's price
    first, _ = orjson.loads(capsys.readouterr().out)["models"]
    assert first["cost_usd"] == pytest.approx(
        (first["input_tokens"] * 10000 + first["output_tokens"] * 20000) / 1e6, rel=1e-3
    )
    assert main(["estimate", str(path), "--price", "m3=1/2"]) == EXIT_USAGE
    assert (
        "--price m3: no model of this run is named so (its models: systemone:m1, Second)"
        in capsys.readouterr().err
    )
    assert (
        main(["estimate", str(path), "--price", "Second=1/2", "--price", "systemone:m2=1/2"])
        == EXIT_USAGE
    )
    assert "name the same model (Second)" in capsys.readouterr().err


def test_help_states_the_limits_real_defaults(capsys: pytest.CaptureFixture):
    for command in ("run", "estimate"):
        with pytest.raises(SystemExit):
            parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "(overrides" not in text
        http, embedded = Limits(), Embedded.default_limits()
        assert (
            f"concurrent requests per provider (default: {http.max_in_flight}; embedded: 2 per CPU core"
            in text
        )
        assert embedded.max_in_flight == 2 * max(1, os.cpu_count() or 1)
        assert (
            "a reply still arriving is never cut (default: "
            f"{http.attempt_timeout_s:g}; embedded "
            f"{embedded.attempt_timeout_s:g}, llamacpp 600)" in text
        )
        assert f"the longest one reply may take in all (default: {http.max_reply_time_s:g})" in text
        assert (
            f"1 = no retry (default: {http.max_attempts}; embedded {embedded.max_attempts}, llamacpp 2)"
            in text
        )
        assert f"(default: {http.backoff_s:g})" in text and f"at most {http.max_wait_s:g}" in text
        assert "requests per minute per provider (default: no limit)" in text
        assert (
            f"(default: {http.max_stated_wait_s:g})" in text
            and f"default: {http.max_reply_bytes} = 4 MiB" in text
        )
        assert "--price MODEL=IN/OUT[/CACHED]" in text


def test_the_local_model_servers_limits_are_those_help_states():
    """llamacpp's limits are built from its options (not a class attribute): 600 s a reply, 2
    attempts, as many in flight as its ``parallel`` slots."""
    from dxi.adapters import ModelSpec, local_models

    a = LlamaCpp(ModelSpec("llamacpp", next(iter(local_models.KNOWN)), None, {}, {"parallel": 3}))
    assert (a.limits.attempt_timeout_s, a.limits.max_attempts, a.limits.max_in_flight) == (
        600.0,
        2,
        3,
    )


def test_the_price_hint_names_a_model_with_spaces_so_that_it_can_be_pasted(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A run file's model "sparrow serve" under a cost bound, without a price: the hint quotes its
    name for the shell (``shlex.quote``), and what it says parses as that model's price."""
    data_dir(tmp_path / "data", TASKS)
    run_file = write_run_file(
        tmp_path,
        {"local": ("http://127.0.0.1:9", 60)},
        [{"name": "sparrow serve", "provider": "local", "model": "m"}],
    )
    assert _run("run", str(run_file), "--max-cost", "1") == EXIT_USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "sparrow serve: a cost bound needs a price for every model; give it with --price "
        "'sparrow serve'=IN/OUT (USD per million input / output tokens)" in err
    )
    assert price_flags(["sparrow serve=1/2"]) == {"sparrow serve": Price(1.0, 2.0)}  # as pasted
