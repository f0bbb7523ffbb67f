"""Rescoring keeps a run's cost: ``dxi score``, ``report``, ``export`` and ``view`` take
``--price`` as ``dxi run`` does, and without it price a model as the last ``dxi run`` into the
output folder recorded it (its line in OUT/run-history.jsonl: ``selection.prices``), saying so
(a note, and summary.json's ``provenance.prices``). Before, ``dxi score`` after ``dxi run --price``
rewrote the model's ``cost_usd`` to null ("no price for ...").

The fake System One provider reports ``len(state) // 4 + 8`` input tokens and one output token per
question (``tests.fakes.fake_provider.systemone``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from dxi.runner.cli import main, parser
from dxi.runner.errors import EXIT_USAGE

from .fakes.fake_provider import FakeProvider
from .helpers.runs import fake_usage
from .helpers.synthetic import data_dir


def _usage(out: Path) -> dict:
    return orjson.loads((out / "summary.json").read_bytes())["models"][0]["usage"]


@pytest.mark.slow
async def test_score_keeps_the_price_the_run_used_and_price_overrides_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    data_dir(tmp_path / "data", 3)
    common = ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
    common += ["--evals", "when2call"]  # the synthetic data's one evaluation (run and rescorings)
    out = tmp_path / "out"
    async with FakeProvider(model=None) as server:
        model = f"systemone:m1@{server.url}"
        run = [
            "run",
            "--model",
            model,
            "--price",
            "systemone:m1=1000/2000",
            "-q",
        ]
        assert await asyncio.to_thread(main, [*run, *common, "--out", str(out)]) == 0
    tokens_in, tokens_out = fake_usage(tmp_path / "cache")
    cost = round((tokens_in * 1000 + tokens_out * 2000) / 1e6, 6)
    assert _usage(out)["cost_usd"] == cost and cost > 0
    (line,) = [orjson.loads(raw) for raw in (out / "run-history.jsonl").read_bytes().splitlines()]
    assert line["selection"]["prices"] == {"systemone:m1": [1000.0, 2000.0]}
    capsys.readouterr()

    # every model of the cache, and the model as dxi run was given it: the run's price
    for given in ([], ["--model", model]):
        assert main(["score", *given, *common, "--out", str(out)]) == 0
        assert _usage(out)["cost_usd"] == cost
        assert _usage(out)["price"] == {"input": 1000.0, "output": 2000.0}
        said = capsys.readouterr().out.replace("\n", " ")
        assert (
            f"systemone:m1: priced at 1000/2000 USD per million input/output tokens, as its dxi run "
            f"of {line['started']} recorded it in {out / 'run-history.jsonl'}"
        ) in said
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["provenance"]["prices"] == {
            "systemone:m1": {
                "price": [1000.0, 2000.0],
                "run_started": line["started"],
                "from": str(out / "run-history.jsonl"),
            }
        }
    # --price (by ADAPTER:MODEL) over the recorded one, and no note of it
    assert main(["score", *common, "--out", str(out), "--price", "systemone:m1=10/20"]) == 0
    assert _usage(out)["cost_usd"] == round((tokens_in * 10 + tokens_out * 20) / 1e6, 6)
    assert "priced at" not in capsys.readouterr().out
    # into another folder no run is recorded: no price, as before
    other = tmp_path / "other"
    assert main(["score", *common, "--out", str(other)]) == 0
    assert _usage(other)["cost_usd"] is None
    # report and export take it too
    assert main(["report", *common, "--out", str(other), "--price", "systemone:m1=1000/2000"]) == 0
    assert _usage(other)["cost_usd"] == cost
    # a MODEL that names no model of the cache
    capsys.readouterr()
    assert main(["score", *common, "--out", str(other), "--price", "m9=1/2"]) == EXIT_USAGE
    assert (
        f"--price m9: no model in {tmp_path / 'cache'} is named so (its models: systemone:m1)"
        in capsys.readouterr().err
    )


def test_the_commands_that_score_take_price():
    for command in ("score", "report", "view"):
        args = parser().parse_args([command, "--price", "m=1/2"])
        assert args.price == ["m=1/2"]
    args = parser().parse_args(["export", "--format", "csv", "t.csv", "--price", "m=1/2"])
    assert args.price == ["m=1/2"]


def test_a_recorded_price_is_noted_with_its_cached_input_price(tmp_path: Path):
    """A run priced ``100/0/10`` (input/output/cached input) was rescored with the note "priced at
    100/0 USD per million input/output tokens", its cached input price left out (trial 9)."""
    import polars as pl

    from dxi.runner.rescore import ToScore, recorded_prices

    line = {"started": "2026-12-05T00:00:00Z", "outcome": "done"}
    line["selection"] = {"prices": {"m": [100, 0, 10]}}
    (tmp_path / "run-history.jsonl").write_bytes(orjson.dumps(line) + b"\n")
    done = recorded_prices(ToScore(pl.DataFrame(), {"m": None}, 1), set(), tmp_path)
    assert done.prices == {"m": (100, 0, 10)}
    assert done.notes == [
        "m: priced at 100/0/10 USD per million input/output/cached input tokens, as its dxi run of "
        f"2026-12-05T00:00:00Z recorded it in {tmp_path / 'run-history.jsonl'} (--price m=IN/OUT "
        "to price it otherwise)"
    ]
