"""What the report's and the view's tests share: a hostile second model in a cache (markup in its
name and its errors, ``add_hostile_model``) and Debian's headless Chromium (``chromium``,
``CHROMIUM_FLAGS``)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from dxi.cache.layout import read_nested
from dxi.cache.schema import SCHEMA

from .servers import need

HOSTILE_MODEL = '<script>alert("model")</script>$x$'
HOSTILE_ERROR = "<script>alert(1)</script> & <b>not bold</b>"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def add_hostile_model(cache_dir: Path) -> None:
    """A second model in the cache (as a server-reported name could be): the embedded model's rows
    under a name holding markup, its When2Call requests failed with an error quoting markup."""
    rows = pl.concat(
        [
            pl.from_arrow(read_nested(p, SCHEMA.names))
            for p in sorted(cache_dir.glob("shards/*.parquet"))
        ]
    )
    w2c = pl.col("eval") == "when2call"
    evil = rows.with_columns(
        pl.lit(HOSTILE_MODEL).alias("model"),
        pl.lit(HOSTILE_MODEL).alias("served_model"),  # the model its replies name (``dxi.served``)
        pl.when(w2c).then(pl.lit("failed")).otherwise(pl.col("status")).alias("status"),
        pl.when(w2c).then(pl.lit(HOSTILE_ERROR)).otherwise(pl.col("error")).alias("error"),
        pl.when(w2c).then(pl.lit("fatal")).otherwise(pl.col("error_kind")).alias("error_kind"),
        pl.when(w2c)
        .then(pl.col("answers").list.head(0))
        .otherwise(pl.col("answers"))
        .alias("answers"),
    )
    pq.write_table(evil.to_arrow().cast(SCHEMA), cache_dir / "shards" / "hostile.parquet")


def chromium() -> str:
    """The path of Debian's chromium, else a skip (a failure under CI)."""
    return need(
        "chromium", "the report is opened in Debian's headless chromium (apt-get install chromium)"
    )
