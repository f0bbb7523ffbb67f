"""Running ``dxi`` over the ten models of ``tests.helpers.adaptive_models`` (a loopback System One
server: ``tests.fakes.fake_provider.serve(model=None, route_factories=ROUTE, record=False)``), for
the adaptive-run tests: ``dxi run`` / ``dxi score`` in process, summary.json read back, the figures
two scorings of one cache share (``figures``) and ``dxi view``'s overview page."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from dxi.runner.cli import main

from .adaptive_models import MODELS

ROUTE = {"/v1/systemone": "tests.helpers.adaptive_models:knowing"}


def flags(url: str, models=MODELS) -> list[str]:
    """``--model systemone:NAME@URL`` for each of ``models`` (served at ``url``)."""
    return [a for m in models for a in ("--model", f"systemone:{m}@{url}")]


def dxi_run(url: str, data: Path, cache: Path, out: Path, *extra: str, models=MODELS) -> int:
    """``dxi run`` of ``models`` on ``data`` into ``cache`` and ``out`` (32 in flight, quiet),
    with the flags ``extra``; its exit code."""
    return main(
        [
            "run",
            *flags(url, models),
            "--data-dir",
            str(data),
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
            "--max-in-flight",
            "32",
            *extra,
            "-q",
        ]
    )


def dxi_score(url: str, data: Path, cache: Path, out: Path, models=MODELS, *extra: str) -> int:
    """``dxi score`` of ``models`` over ``cache`` (the cache alone: the server is only named, as
    the run named it), with the flags ``extra``."""
    return main(
        [
            "score",
            *flags(url, models),
            "--data-dir",
            str(data),
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
            *extra,
            "-q",
        ]
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
