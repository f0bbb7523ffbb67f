"""``dxi cache compact``: merge a local cache's small shards and rewrite its old ones in the flat
layout (``cache.Cache.compact_shards``), or merge the remote cache's small shards
(``cache.remote.Remote.compact``). Its options, and ``main``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from ..planning import numbers
from . import options

if TYPE_CHECKING:
    from rich.console import Console


EXIT_CODES = options.tool_exit_codes(
    {
        0: "compacted, or nothing to compact",
        EXIT_USAGE: "not a cache, a remote cache that cannot be used, or shards that cannot "
        "be rewritten\n       (permissions, a full disk), with a message; the cache is "
        "left as it was",
        EXIT_INTERRUPTED: options.STOPPED + "; the cache is left whole",
    }
)


def add_parser(sub) -> None:
    """``dxi cache compact``: merge a local cache's small shards and rewrite its old ones in the
    flat layout, or merge the remote cache's small shards."""
    c = sub.add_parser(
        "cache",
        help=options.HELP["cache"],
        description="Maintain the cache.",
        epilog=EXIT_CODES,
        formatter_class=options.Formatter,
    )
    csub = c.add_subparsers(dest="cache_command", required=True)
    k = csub.add_parser(
        "compact",
        help="merge a local cache's small shards into fewer and rewrite those of the old "
        "nested layout in the flat one, or with --cache-remote rewrite the remote "
        "cache, one object a key partition (idempotent; "
        "safe beside running writers)",
        epilog=EXIT_CODES,
        formatter_class=options.Formatter,
    )
    k.add_argument(
        "--cache-remote",
        metavar="URI",
        help="the remote cache (as for dxi run): rewrite it whole, each "
        "partition's objects merged, split into finer partitions where they are large, the old layout moved in",
    )
    k.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".dxi-cache"),
        help="the local cache to compact; with --cache-remote, a local folder for temporary files "
        "(default .dxi-cache)",
    )
    k.add_argument(
        "--target-rows",
        type=numbers.TARGET_ROWS,
        default=None,
        help="merge shards smaller than this into shards of up to this many rows (default 1,000,000); with "
        "--cache-remote, the rows a partition holds before it is split (default 20,000)",
    )


def main(args: argparse.Namespace, console: Console) -> int:
    """``dxi cache compact``: prints what was merged or rewritten; exit code 0, or 2 when the cache
    (or the remote) cannot be used."""
    if args.cache_remote is None:
        return _compact_local(args.cache_dir, args.target_rows or 1_000_000, console)
    from dxi.cache.remote import TARGET_ROWS, Remote, RemoteError

    args.cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        remote = Remote(args.cache_remote, args.cache_dir)
        remote.check(writable=True)
        merged, written = remote.compact(args.target_rows or TARGET_ROWS)
    except (RemoteError, OSError) as exc:
        raise UsageError(f"remote cache: {exc}") from None
    console.print(
        f"{remote.name}: merged {merged} object(s) into {written}"
        if merged
        else f"{remote.name}: nothing to merge (every node holds one object, at the level its rows call for)"
    )
    return 0


def _compact_local(cache_dir: Path, target_rows: int, console) -> int:
    """``dxi cache compact --cache-dir DIR``: the local cache's shards merged and rewritten in the
    flat layout (``Cache.compact_shards``), one line per shard written, then a total."""
    from dxi.cache import Cache, CacheWriteError

    if not (cache_dir / "shards").is_dir():
        raise UsageError(f"{cache_dir} is not a cache (it has no shards/ folder)")
    try:
        with Cache(cache_dir) as cache:
            done = cache.compact_shards(
                target_rows,
                on_wait=lambda: console.print(
                    f"{cache_dir}: another `dxi cache compact` is compacting this cache; waiting for it to end"
                ),
            )
    except (CacheWriteError, OSError) as exc:
        raise UsageError(
            f"cache {cache_dir}: cannot compact its shards ({exc.strerror or exc})"
        ) from None
    for shard, rows, held in done:
        console.print(f"wrote {shard} ({rows:,} rows, flat layout) from {len(held)} shard(s)")
    console.print(
        f"{cache_dir}: {sum(len(h) for _, _, h in done)} shard(s) rewritten as {len(done)}"
        if done
        else f"{cache_dir}: nothing to compact (every shard is flat, none to merge below {target_rows:,} rows)"
    )
    return 0
