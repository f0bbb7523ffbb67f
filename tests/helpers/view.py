"""``dxi view``'s app as the tests drive it: the Browser over a selection (``view_of``), its pages
fetched in-process (``get``, ``fetch``: aiohttp's test client, no port), and the Browser
``dxi view ARGV`` builds (``caught_view``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dxi.runner import rescore
from dxi.runner.cli import main
from dxi.runner.planning.inputs import PlanInputs
from dxi.view.app import make_app
from dxi.view.data import Browser


def view_of(**fields) -> Browser:
    """The Browser ``dxi view`` serves over the selection ``fields`` make (``PlanInputs``):
    ``rescore.browse``, its snapshots (and a remote cache's mirror) in a private folder removed with
    the browser."""
    from dxi.view.home import private_home

    home = private_home()
    try:
        browser, _ = rescore.browse(
            rescore.select(PlanInputs(**fields), mirror=Path(home.name) / "remote"), home
        )
    except BaseException:
        home.cleanup()
        raise
    browser.source.owns_home = True
    return browser


async def fetch(browser: Browser, *paths: str, method: str = "GET") -> list[tuple[int, dict, str]]:
    """Each of ``paths`` requested of ``browser``'s app: ``(status, headers, body)`` each."""
    async with TestClient(TestServer(make_app(browser))) as client:
        out = []
        for path in paths:
            async with client.request(method, path) as resp:
                out.append((resp.status, dict(resp.headers), await resp.text()))
        return out


def get(browser: Browser, *paths: str, method: str = "GET") -> list[tuple[int, dict, str]]:
    """``fetch`` from synchronous code."""
    return asyncio.run(fetch(browser, *paths, method=method))


def caught_view(monkeypatch: pytest.MonkeyPatch, *argv: str) -> Browser:
    """The Browser ``dxi view ARGV`` builds (its server replaced by a catcher)."""
    caught: dict = {}
    monkeypatch.setattr(
        "dxi.view.app.serve", lambda browser, host, port, print_: caught.update(browser=browser)
    )
    assert main(["view", *argv]) == 0
    return caught["browser"]
