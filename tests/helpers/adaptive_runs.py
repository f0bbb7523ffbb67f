"""Running ``dxi`` over the ten models of ``tests.helpers.adaptive_models`` (a loopback System One
server: ``tests.fakes.fake_provider.serve(model=None, route_factories=ROUTE, record=False)``), for
the adaptive-run tests: ``dxi run`` / ``dxi score`` in process, summary.json read back, the figures
two scorings of one cache share (``figures``), ``dxi view``'s overview page and the rounds replayed
by hand (``replay``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import polars as pl

from dxi import scoring
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION, Suite, discover
from dxi.runner.cli import main
from dxi.scoring.sequential import Until, aim, round_sizes, standings

from .adaptive_models import MODELS
from .runs import dxi_args

ROUTE = {"/v1/systemone": "tests.helpers.adaptive_models:knowing"}


def served(url: str, models=MODELS) -> list[str]:
    """The model strings ``systemone:NAME@URL`` of ``models`` (served at ``url``)."""
    return [f"systemone:{m}@{url}" for m in models]


def dxi_run(url: str, data: Path, cache: Path, out: Path, *extra: str, models=MODELS) -> int:
    """``dxi run`` of ``models`` on ``data`` into ``cache`` and ``out`` (32 in flight, quiet),
    with the flags ``extra``; its exit code."""
    return main(
        dxi_args(
            data, cache, out, "--max-in-flight", "32", *extra, "-q", models=served(url, models)
        )
    )


def dxi_score(url: str, data: Path, cache: Path, out: Path, models=MODELS, *extra: str) -> int:
    """``dxi score`` of ``models`` over ``cache`` (the cache alone: the server is only named, as
    the run named it), with the flags ``extra``."""
    return main(
        dxi_args(data, cache, out, *extra, "-q", models=served(url, models), command="score")
    )


def summary(out: Path) -> dict:
    """``out/summary.json``, parsed."""
    return orjson.loads((out / "summary.json").read_bytes())


def figures(doc: dict) -> dict:
    """summary.json without what differs between a run and ``dxi score`` of its cache by nature:
    ``provenance`` (when, by what) and each model's ``requests`` (a run's counts of what it sent;
    the cache's of what it holds)."""
    return {k: v for k, v in doc.items() if k != "provenance"} | {
        "models": [{k: v for k, v in m.items() if k != "requests"} for m in doc["models"]]
    }


def overview(data: Path, cache: Path) -> str:
    """``dxi view``'s overview page over ``cache`` (its browser, served in process)."""
    return page(data, cache, "/")


def page(data: Path, cache: Path, path: str) -> str:
    """``dxi view``'s page at ``path`` (e.g. "/task/<id>") over ``cache`` (its browser, served in
    process); asserts it answers 200."""
    from aiohttp.test_utils import TestClient, TestServer

    from dxi.runner import rescore
    from dxi.runner.planning.inputs import PlanInputs
    from dxi.view.app import make_app
    from dxi.view.home import private_home

    home = private_home()
    browser, _ = rescore.browse(rescore.select(PlanInputs(data_dir=data, cache_dir=cache)), home)
    browser.source.owns_home = True

    async def fetch() -> str:
        async with TestClient(TestServer(make_app(browser))) as client, client.get(path) as resp:
            assert resp.status == 200
            return await resp.text()

    try:
        return asyncio.run(fetch())
    finally:
        browser.close()


def replay(data: Path, cache: Path, until: Until, order_file: Path, *, targets: list | None = None):
    """The rounds by hand: the recorded order, ``round_sizes`` (aimed by ``aim``) and ``standings``
    over every answer the cache holds (``scoring.answers``), each model cut to what it was asked.
    Label -> (the round it stopped after, what it was asked, its Standing then); with
    ``targets``, also the list of what each round brought the running models to."""
    evals = {n: list(s) for n, s in orjson.loads(order_file.read_bytes())["evals"].items()}
    populations = {n: len(s) for n, s in evals.items()}
    gold, categories = Suite(discover(data)).gold_frames()
    with Cache(cache) as c:
        models = c.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
        answers = c.read(lambda rows: scoring.answers(rows, models, gold, categories, 1))
    answers = answers.with_columns(
        pl.col("label").cast(pl.String), pl.col("task_id").cast(pl.String)
    )
    asked_of = {label: dict.fromkeys(evals, 0) for label in models["label"].to_list()}
    running, asked, stopped, k = set(asked_of), dict.fromkeys(evals, 0), {}, 0
    now: dict = {}
    while running:
        # under precision=P a round stops where the next running model is predicted to settle
        more = round_sizes(asked, populations, aim=aim(now[m] for m in running if m in now))
        asked = {n: asked[n] + more[n] for n in evals}
        if targets is not None:
            targets.append(dict(asked))
        k += 1
        for label in running:
            asked_of[label] = dict(asked)
        keep = pl.DataFrame(
            [
                (label, t)
                for label, a in asked_of.items()
                for n, c in a.items()
                for t in evals[n][:c]
            ],
            schema={"label": pl.String, "task_id": pl.String},
            orient="row",
        )
        now = standings(
            answers.join(keep, on=["label", "task_id"], how="semi"),
            populations,
            until,
            order=evals,
        )
        for label in sorted(running):
            if now[label].settled:
                stopped[label] = (k, dict(asked), now[label])
        running -= set(stopped)
    return stopped
