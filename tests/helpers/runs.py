"""Runs as the tests make them, through the library: ``run_model`` (one adapter through the
scheduler, ``runner.run``, against a fake) with the fast limits ``FAST`` / ``ONE``, and ``run_plan``
/ ``run_into`` (``dxi run``'s work, ``session.run``, with the embedded model ``MODEL`` unless told
otherwise) and ``run_fake`` (the same of the System One fake);
``fail_rows`` turns cached rows into failures, as a provider that stopped answering leaves them,
``copy_model`` copies a model's rows under another name with some of them failed;
``write_run_file`` writes a run file, ``fake_usage`` sums the tokens a fake reported;
``dxi_command`` / ``served_run`` write out a ``dxi run`` command line for a process of its own,
``dxi_args`` its arguments (for ``dxi.runner.cli.main`` in this process)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pyarrow.parquet as pq

from dxi import adapters
from dxi.adapters import Limits
from dxi.cache import Cache
from dxi.cache.layout import read_nested
from dxi.cache.schema import SCHEMA
from dxi.evals import EVALS, Suite, discover
from dxi.runner import session
from dxi.runner.planning import plan
from dxi.runner.sending.scheduler import run

from ..conftest import DXI

MODEL = "embedded:sparrow-nano-general-v1.1"
FAST = Limits(max_in_flight=4, attempt_timeout_s=5, max_attempts=4, backoff_s=0.01, max_wait_s=5)
"""Limits for a fake on 127.0.0.1: short timeouts and backoffs (seconds), 4 attempts."""
ONE = replace(FAST, max_in_flight=1)
"""``FAST``, one request at a time."""
RUN_OPTIONS = {
    "console",
    "grace",
    "fsync",
    "retry_invalid",
    "retry_failed",
    "dist",
    "batch_options",
    "fallback_sync",
    "on_summary",
}  # session.run's keywords; the others are the plan's (runner.inputs.PlanInputs)


async def run_model(
    model: str,
    data_dir: Path,
    cache_dir: Path,
    limits: Limits = FAST,
    limit: int | None = 1,
    evals: tuple[str, ...] | None = ("when2call",),
    limiters: dict | None = None,
    **cache_options,
):
    """Run ``model`` (a model string) on the first ``limit`` tasks (None: all) of ``evals`` in
    ``data_dir``, caching in ``cache_dir`` (``Cache(cache_dir, **cache_options)``): ``(adapter, its
    Stats, the cache's rows)``. ``limiters`` as ``runner.run.run`` takes them (filled in: the
    limiter used, for its counters)."""
    adapter = adapters.get(model, limits)
    await adapter.start()
    try:
        with Cache(cache_dir, **cache_options) as cache:
            stats = await run(
                [adapter],
                Suite(discover(data_dir), limit=limit, evals=evals),
                cache,
                limiters=limiters,
            )
            rows = cache.scan().collect()
    finally:
        await adapter.close()
    return adapter, stats[adapter.label], rows


def run_plan(data: Path, tmp: Path, out: str = "out", **fields) -> session.RunResult:
    """``dxi run``'s work as a library call: ``session.run`` (no console) of
    ``plan.build(**fields)`` with the embedded model (unless ``models`` is given) on ``data``,
    caching in ``tmp/cache`` and writing to ``tmp/out``."""
    return run_into(data, tmp / "cache", tmp / out, **fields)


def run_into(data: Path, cache: Path, out: Path, **fields) -> session.RunResult:
    """``run_plan`` caching in the folder ``cache`` and writing to the folder ``out``, both named
    whole: ``session.run`` (no console; given those of ``fields`` in ``RUN_OPTIONS``) of
    ``plan.build(**fields)`` (``models`` by default ``[MODEL]``) on ``data``."""
    options = {k: fields.pop(k) for k in RUN_OPTIONS & set(fields)}
    fields.setdefault("models", [MODEL])
    return session.run(plan.build(data_dir=data, cache_dir=cache, out=out, **fields), **options)


def run_fake(url: str, data: Path, cache: Path, out: Path, **fields) -> int:
    """``dxi run --model systemone:fake@URL -q``'s work in this process (``run_into``: the System
    One fake ``fake`` served at ``url``, caching in ``cache``, writing ``out``, with the plan's
    ``fields``): its exit code."""
    return run_into(data, cache, out, models=[f"systemone:fake@{url}"], **fields).exit_code


def fail_rows(cache_dir: Path, eval_name: str, n: int, kind: str = "transient") -> list[str]:
    """Turn the first ``n`` cache rows of ``eval_name`` by task id and sample (not by the order the
    replies arrived in, which differs from run to run: the tasks failed, and so the figures, would
    too) into final failures of ``kind`` (transient: requested again by the next run; fatal: kept),
    as a provider that stopped answering leaves them; their task ids, in that order."""
    shards = sorted(cache_dir.glob("shards/*.parquet"))
    frames = [pl.from_arrow(read_nested(shard, SCHEMA.names)) for shard in shards]
    keys = (
        pl.concat(
            [f.filter(pl.col("eval") == eval_name).select("task_id", "sample") for f in frames]
        )
        .unique()
        .sort("task_id", "sample")
        .head(n)
    )
    key = pl.concat_str("task_id", pl.col("sample").cast(pl.String), separator="\0")
    chosen = keys.select(key.alias("key"))["key"]
    for shard, frame in zip(shards, frames, strict=True):
        mine = (pl.col("eval") == eval_name) & key.is_in(chosen.implode())
        shard.unlink()
        pq.write_table(_failed(frame, mine, kind).to_arrow().cast(SCHEMA), shard)
    return keys["task_id"].to_list()


def _failed(frame: pl.DataFrame, mine: pl.Expr, kind: str) -> pl.DataFrame:
    """``frame``'s cache rows where ``mine`` holds made final failures of ``kind`` (no answers)."""
    return frame.with_columns(
        pl.when(mine).then(pl.lit("failed")).otherwise(pl.col("status")).alias("status"),
        pl.when(mine).then(pl.lit("HTTP 503")).otherwise(pl.col("error")).alias("error"),
        pl.when(mine).then(pl.lit(kind)).otherwise(pl.col("error_kind")).alias("error_kind"),
        pl.when(mine)
        .then(pl.col("answers").list.head(0))
        .otherwise(pl.col("answers"))
        .alias("answers"),
    )


def copy_model(cache_dir: Path, model: str, eval_name: str, n: int) -> str:
    """A copy of the cache's rows (one model's) under the name ``model``, its first ``n`` rows of
    ``eval_name`` (by task id) final failures (fatal: kept), in a shard of its own; the copy's
    label. Its replies name it as the model that served them (a System One reply naming another
    model is set aside: ``dxi.served``)."""
    rows = pl.concat(
        [pl.from_arrow(read_nested(p, SCHEMA.names)) for p in sorted(cache_dir.glob("shards/*"))]
    ).sort("eval", "task_id", "sample")
    mine = (pl.col("eval") == eval_name) & (pl.int_range(pl.len()).over("eval") < n)
    copy = _failed(
        rows.with_columns(model=pl.lit(model), served_model=pl.lit(model)), mine, "fatal"
    )
    pq.write_table(copy.to_arrow().cast(SCHEMA), cache_dir / "shards" / f"{model}.parquet")
    return f"{rows['provider'][0]}:{model}"


def write_run_file(
    tmp: Path, providers: dict[str, tuple[str, int]], models: list[dict], **top: object
) -> Path:
    """A run file in ``tmp``: ``providers`` name -> (url, rpm); ``models`` as TOML inline values.
    Its ``[evals] select`` names the evaluations ``tmp/data`` holds when it does not hold all four
    (``select_flags``: ``dxi run`` refuses a selected evaluation without data)."""
    lines = ['data_dir = "data"', 'cache_dir = "cache"', 'out = "out"']
    lines += [f"{k} = {orjson.dumps(v).decode()}" for k, v in top.items()]
    chosen = held(tmp / "data")
    if (tmp / "data").is_dir() and len(chosen) < len(EVALS):
        evals = ["[evals]", f"select = {orjson.dumps(chosen).decode()}", ""]
    else:
        evals = []
    for name, (url, rpm) in providers.items():
        lines += [
            f"[providers.{name}]",
            'kind = "systemone"',
            f'base_url = "{url}"',
            f"rpm = {rpm}",
            "max_in_flight = 4",
            "",
        ]
    for m in models:
        lines.append("[[models]]")
        for k, v in m.items():
            value = (
                ("{ " + ", ".join(f"{a} = {b}" for a, b in v.items()) + " }")
                if isinstance(v, dict)
                else orjson.dumps(v).decode()
            )
            lines.append(f"{k} = {value}")
    path = tmp / "run.toml"
    path.write_text("\n".join(lines + evals) + "\n")
    return path


def fake_usage(cache_dir: Path, model: str | None = None) -> tuple[int, int]:
    """(input, output) tokens the fake provider reported for the cached rows (of ``model``)."""
    with Cache(cache_dir) as cache:
        rows = cache.scan().collect()
    if model is not None:
        rows = rows.filter(pl.col("model") == model)
    return int(rows["input_tokens"].sum()), int(rows["output_tokens"].sum())


def dxi_args(
    data: Path,
    cache: Path,
    out: Path | None,
    *extra: str,
    models: Sequence[str] = (),
    command: str = "run",
) -> list[str]:
    """The arguments (after ``dxi``) of ``dxi run`` (or ``command``: ``score``, ``estimate``...) of
    ``models`` (model strings, one ``--model`` each, in order; none: no ``--model``) on the data dir
    ``data``, caching in ``cache`` and writing ``out`` (None: no ``--out``, as ``dxi estimate``
    takes none), then the flags ``extra`` as given: for ``dxi.runner.cli.main`` in this process.
    ``dxi run``, ``estimate`` and the commands that score (``score``, ``report``, ``export``) of a
    folder without all four evaluations select those it holds (``select_flags``), unless ``extra``
    selects: so a rescoring selects what its run did."""
    chosen = command in ("run", "estimate", "score", "report", "export") and not any(
        str(x).startswith("--evals") for x in extra
    )
    return [
        command,
        *(flag for model in models for flag in ("--model", model)),
        "--data-dir",
        str(data),
        "--cache-dir",
        str(cache),
        *(() if out is None else ("--out", str(out))),
        *(select_flags(data) if chosen else ()),
        *extra,
    ]


def held(data: Path) -> list[str]:
    """The evaluations whose files the data folder ``data`` holds (``evals.discover``), in index
    order."""
    return [name for name, found in discover(data).items() if found.file is not None]


def select_flags(data: Path) -> list[str]:
    """``--evals`` naming the evaluations ``data`` holds when it does not hold all four (the
    synthetic folders hold When2Call only: ``helpers.synthetic.data_dir``), else nothing: ``dxi
    run`` and ``dxi estimate`` refuse a selected evaluation without data
    (``Plan.check_data``)."""
    names = held(data)
    return [] if len(names) == len(discover(data)) else ["--evals", ",".join(names)]


def dxi_command(*args: Any, **options: Any) -> list[str]:
    """``dxi_args(*args, **options)`` (its parameters) as the command line of a process of its own:
    the ``dxi`` executable first."""
    return [DXI, *dxi_args(*args, **options)]


def served_run(url: str, data: Path, tmp: Path, *extra: str) -> list[str]:
    """``dxi run`` of the System One fake ``fake`` served at ``url`` on ``data``, caching in
    ``tmp/cache`` and writing ``tmp/out``, 8 in flight, with the flags ``extra``: the command
    line (for a process of its own)."""
    return dxi_command(
        data,
        tmp / "cache",
        tmp / "out",
        "--max-in-flight",
        "8",
        *extra,
        models=[f"systemone:fake@{url}"],
    )
