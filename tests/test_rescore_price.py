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


def _line(started: str, prices: dict, cache_dir: Path | None) -> bytes:
    """A run's line of run-history.jsonl as ``dxi run`` writes it (what ``prices`` reads of it):
    its ``selection.prices`` and, unless None (a line of an older dxi), its ``cache_dir``."""
    selection = {"models": list(prices), "prices": prices}
    if cache_dir is not None:
        selection["cache_dir"] = str(cache_dir.resolve())
    return orjson.dumps({"started": started, "outcome": "done", "selection": selection}) + b"\n"


def test_the_recorded_price_is_the_newest_line_about_the_same_cache(tmp_path: Path):
    """Three lines in one output folder, oldest first: an older dxi's (no ``cache_dir``) pricing
    model ``a:m`` at 5/6 and ``a:old`` at 7/8; a run on cache A pricing ``a:m`` at 1/2; a newer run
    on cache B pricing ``a:m`` at 3/4.

    Expected, by hand: for cache A, ``a:m`` at 1/2 (its own line; the old code: 3/4, cache B's, the
    newest line of any cache) and ``a:old`` at 7/8 (no line about A priced it: the older line's);
    for cache B, 3/4; for a cache C no line is about, the older line's 5/6 and 7/8, never a line
    about another cache."""
    from dxi.runner.outputs import history

    out, a, b, c = (tmp_path / name for name in ("out", "a", "b", "c"))
    out.mkdir()
    (out / history.RUNS_FILE).write_bytes(
        _line("T0", {"a:m": [5.0, 6.0], "a:old": [7.0, 8.0]}, None)
        + _line("T1", {"a:m": [1.0, 2.0]}, a)
        + _line("T2", {"a:m": [3.0, 4.0]}, b)
    )
    old = ((7.0, 8.0), "T0")
    assert history.prices(out, a) == {"a:m": ((1.0, 2.0), "T1"), "a:old": old}
    assert history.prices(out, b) == {"a:m": ((3.0, 4.0), "T2"), "a:old": old}
    assert history.prices(out, c) == {"a:m": ((5.0, 6.0), "T0"), "a:old": old}


def test_dxi_score_prices_a_model_as_the_run_on_its_cache_recorded_it(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """The embedded model is run into cache A (its own output folder). In ``out``, a run on cache A
    priced it at 1/2 USD per million input/output tokens, then a newer run of the same model name
    on cache B at 3/4. ``dxi score --cache-dir A --out out``.

    Expected, by hand: priced at 1/2 with the note naming the run on A (T1), and summary.json's
    ``usage.price`` {1, 2} (the old code: 3/4 and T2, the run on cache B)."""
    from .helpers.runs import MODEL, run_into

    cache, out = tmp_path / "a", tmp_path / "out"
    assert run_into(data_dir, cache, tmp_path / "run", evals=("when2call",)).exit_code == 0
    out.mkdir()
    (out / "run-history.jsonl").write_bytes(
        _line("T1", {MODEL: [1.0, 2.0]}, cache) + _line("T2", {MODEL: [3.0, 4.0]}, tmp_path / "b")
    )
    capsys.readouterr()
    where = ["--data-dir", str(data_dir), "--cache-dir", str(cache), "--evals", "when2call"]
    assert main(["score", *where, "--out", str(out)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert _usage(out)["price"] == {"input": 1.0, "output": 2.0}
    assert (
        f"{MODEL}: priced at 1/2 USD per million input/output tokens, as its dxi run of T1 "
        f"recorded it in {out / 'run-history.jsonl'}"
    ) in said, said


def test_a_recorded_price_is_noted_with_its_cached_input_price(tmp_path: Path):
    """A run priced ``100/0/10`` (input/output/cached input) was rescored with the note "priced at
    100/0 USD per million input/output tokens", its cached input price left out (trial 9)."""
    import polars as pl

    from dxi.runner.rescore import ToScore, recorded_prices

    line = {"started": "2026-12-05T00:00:00Z", "outcome": "done"}
    line["selection"] = {"prices": {"m": [100, 0, 10]}}
    (tmp_path / "run-history.jsonl").write_bytes(orjson.dumps(line) + b"\n")
    done = recorded_prices(ToScore(pl.DataFrame(), {"m": None}, 1), set(), tmp_path, tmp_path / "c")
    assert done.prices == {"m": (100, 0, 10)}
    assert done.notes == [
        "m: priced at 100/0/10 USD per million input/output/cached input tokens, as its dxi run of "
        f"2026-12-05T00:00:00Z recorded it in {tmp_path / 'run-history.jsonl'} (--price m=IN/OUT[/CACHED] "
        "to price it otherwise)"
    ]
