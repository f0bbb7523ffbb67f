"""Batch mode as the tests run it against the fake's batch server: the model string of a provider
``kind`` (``model``), ``dxi run --batch`` as a command (``command``) or as a library call (``run``),
and what two runs must agree on (``same_answers``)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import polars as pl

from dxi.cache import Cache
from dxi.runner import session
from dxi.runner.batch.options import BatchOptions
from dxi.runner.planning import plan
from dxi.runner.planning.deadline import parse_deadline

from ..conftest import without_requests
from .runs import dxi_command

URLS = {"openai": "{}/v1", "anthropic": "{}", "gemini": "{}"}
"""The base URL of each batch provider kind at a fake's URL."""
POLL = ("--poll", "0.02")


def model(kind: str, url: str) -> str:
    """The model string of provider ``kind``'s model "m" at the fake on ``url``."""
    return f"{kind}:m@{URLS[kind].format(url)}"


def command(
    kind: str, url: str, data: Path, tmp: Path, *extra: str, quiet: bool = True
) -> list[str]:
    """``dxi run --batch --poll 0.05`` of ``model(kind, url)`` on ``data``, caching in ``tmp/cache``
    and writing to ``tmp/out`` (``-q`` unless ``quiet`` is False), then ``extra``."""
    return dxi_command(
        data,
        tmp / "cache",
        tmp / "out",
        "--batch",
        "--poll",
        "0.05",
        *(["-q"] if quiet else []),
        *extra,
        models=[model(kind, url)],
    )


def run_plan(
    p: plan.Plan, deadline: str | None = None, fallback: str = "none", poll: bool = True
) -> int:
    """``session.run`` of ``p`` as ``dxi run [--poll 0.02] -q`` runs it (``poll``: the short wait):
    its exit code."""
    options = BatchOptions(
        deadline=None if deadline is None else parse_deadline(deadline),
        **({"poll_s": float(POLL[1])} if poll else {}),
    )
    return session.run(p, batch_options=options, fallback_sync=fallback == "sync").exit_code


def run(
    kind: str,
    url: str,
    data: Path,
    tmp: Path,
    cache: str = "cache",
    out: str = "out",
    batch: bool = True,
    deadline: str | None = None,
    fallback: str = "none",
    **fields,
) -> int:
    """``dxi run [--batch --poll 0.02] --model KIND:m@URL -q``'s work (``session.run``) with
    ``fields`` (``PlanInputs``) and ``deadline`` / ``fallback`` as ``--deadline`` /
    ``--deadline-fallback`` take them: its exit code."""
    return run_plan(
        plan.build(
            models=[model(kind, url)],
            data_dir=data,
            cache_dir=tmp / cache,
            out=tmp / out,
            batch=batch,
            **fields,
        ),
        deadline,
        fallback,
        poll=batch,
    )


def summary(path: Path) -> dict:
    """The summary.json in ``path``."""
    return orjson.loads((path / "summary.json").read_bytes())


def same_answers(s: dict) -> dict:
    """A summary without what depends on the run (``requests`` and the measured latencies:
    ``without_requests``) or records the transport (``usage.batch``)."""
    out = without_requests(s)
    for m in out["models"]:
        m["usage"] = {k: v for k, v in m["usage"].items() if k != "batch"}
    return out


def rows(cache: Path) -> pl.DataFrame:
    """The rows of the cache in ``cache``, sorted by key."""
    return Cache(cache).scan().collect().sort("key")


def iso_in(seconds: float) -> str:
    """A local ISO time ``seconds`` from now (as a user writes --deadline)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + seconds))
