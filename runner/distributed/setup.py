"""The command line's part in running past one machine (docs/distributed.md): ``--shard``
(``runner.planning.shard``), ``--cache-remote`` (``cache.remote``) and ``--coordinator``
(``runner.distributed.coordinator``).

Without these flags (or their run-file keys ``cache_remote`` and ``coordinator``) nothing here runs:
the commands take exactly their single-machine path.

Exit code ``EXIT_UPLOAD`` (5, ``runner.errors``): the run is done and every reply is in the local
cache, but some shards could not be uploaded to the remote cache (the warnings say why); the next
run with the same ``--cache-remote`` uploads them (uploads are idempotent by name).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dxi.shown import shown

from ..errors import EXIT_UPLOAD, UsageError
from ..outputs import amounts
from ..planning import numbers

# Light at import (the command line's parser reads add_flags): what a run needs is imported when it
# runs.
if TYPE_CHECKING:
    from dxi.cache import Cache
    from dxi.cache.remote import Remote

    from ..planning.plan import Plan
    from ..planning.shard import Shard
    from ..sending.cost import Budget
    from ..sending.limits import ProviderLimiter

ROLL_S = (
    60.0  # with a remote tier, a log rolls over (and its shard is uploaded) at least this often
)


def _shard_text(text: str) -> str:
    """``--shard``'s value, checked as it is parsed (``runner.planning.shard.parse``: K/N with 0 <=
    K < N <= 1,000,000, auto or auto/N; auto's index comes from the scheduler's environment when the
    run starts, ``setup``); argparse's usage error otherwise."""
    from ..planning.shard import ShardError, parse

    auto = text.strip().partition("/")[0] == "auto"
    try:
        parse(text, {"SLURM_ARRAY_TASK_ID": "0", "DXI_SHARD_COUNT": "1"} if auto else None)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_flags(p: argparse.ArgumentParser, command: str) -> None:
    """The flags of ``command`` (run, estimate, score, report)."""
    if command in ("run", "estimate"):
        p.add_argument(
            "--shard",
            type=_shard_text,
            metavar="K/N",
            help="only the requests whose cache key falls in shard K of N (K from 0); auto/N: K from "
            "SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX (auto: N from DXI_SHARD_COUNT)",
        )
    p.add_argument(
        "--cache-remote",
        metavar="URI",
        help="a shared remote cache: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX "
        "or file:///DIR (S3 endpoint: ?endpoint=URL or AWS_ENDPOINT_URL_S3; credentials from the environment)",
    )
    if command == "run":
        p.add_argument(
            "--coordinator",
            metavar="URI",
            help="share each provider's limits and the cost bound with the other "
            "processes of the run through Redis: redis://HOST:PORT/DB (the distributed extra)",
        )
        p.add_argument(
            "--upload-every",
            type=numbers.UPLOAD_EVERY,
            metavar="SECONDS",
            default=ROLL_S,
            help=f"with --cache-remote: roll the log over and upload it at least this often (default {ROLL_S:g} s): "
            "at most this window of replies is only on this machine",
        )


def _note(text: str) -> None:  # as the console writes it: no control character of a name given
    sys.stderr.write(f"{shown(text, keep=chr(10))}\n")
    sys.stderr.flush()


@dataclass
class Distributed:
    """What a run or an estimate does past one machine: its ``shard``, its ``remote`` tier and its
    ``coordinator`` (each None when not asked for)."""

    shard: Shard | None = None
    remote: Remote | None = None
    coordinator: object | None = (
        None  # runner.distributed.coordinator.Coordinator (imported only when asked for)
    )
    roll_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def budget(self, max_cost: float | None) -> Budget:
        """The run's Budget: shared through the coordinator when there is one."""
        from ..sending.cost import Budget

        if self.coordinator is None:
            self._budget = Budget(max_cost)
        else:
            from .shared_limits import budget

            self._budget = budget(self.coordinator, max_cost)
        return self._budget

    def limiters(self, models: list) -> dict[str, ProviderLimiter]:
        """Limiters shared through the coordinator (empty without one: ``run`` makes local ones).
        Call inside the event loop."""
        if self.coordinator is None:
            return {}
        from .shared_limits import limiters

        return limiters(self.coordinator, models)

    async def rolling(self, cache: Cache) -> None:
        """With a remote tier: roll the log over once it is ``roll_s`` old, looking every second (or
        every ``roll_s / 4``, when shorter); runs until cancelled."""
        if self.remote is None or self.roll_s is None:
            return
        while True:
            await asyncio.sleep(min(1.0, self.roll_s / 4))
            cache.roll_if_due()

    async def close(self) -> None:
        if self.coordinator is not None:
            budget = getattr(self, "_budget", None)
            if budget is not None and budget.max_usd is not None:
                spent = budget.spent_by_all_usd = await budget.spent_by_all()
                if spent is not None:
                    _note(
                        f"cost bound {amounts.usd(budget.max_usd)}, shared by every process of run {self.coordinator.run}: "
                        f"${spent:.6f} spent by all so far (this process: ${budget.spent:.6f})"
                    )
            await self.coordinator.close()

    def finish(self) -> int | None:
        """Wait for the uploads and upload what is missing; ``EXIT_UPLOAD`` if some could not be,
        else None."""
        if self.remote is None:
            return None
        failed = self.remote.finish()
        if failed:
            _note(
                f"error: {len(failed)} shard(s) could not be uploaded to {self.remote.name} (see the warnings); every "
                "reply is in the local cache, and the next run with the same --cache-remote uploads them."
            )
            return EXIT_UPLOAD
        if self.remote.uploaded:
            _note(f"uploaded {self.remote.uploaded} shard(s) to {self.remote.name}")
        return None

    def shard_note(self) -> None:
        """After a shard's summary: it is partial until every shard is done."""
        if self.shard is not None and self.shard.count > 1:
            how = (
                f"`dxi score --cache-remote {self.remote.name}`"
                if self.remote is not None
                else "`dxi score` on a cache holding every shard's rows (see --cache-remote)"
            )
            _note(
                f"shard {self.shard}: the summary above scores the rows in this shard's cache folder; once every "
                f"shard is done, {how} scores the whole run"
            )


def remote_for(
    uri: str | None,
    cache_dir: Path,
    mirror: Path | None = None,
    shard: Shard | None = None,
    writable: bool = False,
) -> Remote | None:
    """The remote tier at ``uri`` for ``cache_dir`` (created), checked (``Remote.check``: its bucket
    exists and can be listed, and with ``writable`` written) and pulled into ``cache_dir``/remote,
    or into ``mirror`` when given (``dxi view``: its own folder; ``cache_dir`` is then neither
    created nor written). A ``shard`` of several reads only its part, index columns only
    (``cache.remote``). UsageError (exit code 2, before anything is sent) when it cannot be reached,
    listed or written."""
    if not uri:
        return None
    from dxi.cache.remote import Remote, RemoteError

    if mirror is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        remote = Remote(
            uri, cache_dir, mirror, None if shard is None else (shard.index, shard.count)
        )
        remote.check(writable)
        fetched = remote.pull()
    except RemoteError as exc:
        raise UsageError(f"remote cache: {exc}") from None
    if fetched:
        what = "the index of" if remote.keys_only else "the rows of"
        _note(
            f"fetched {what} {fetched} object(s) from {remote.name}"
            + (f" (shard {shard}'s part)" if remote.keys_only else "")
        )
    return remote


def setup(args: argparse.Namespace | None, plan: Plan, sending: bool) -> Distributed:
    """Read ``--shard``, ``--coordinator`` and ``--cache-remote`` (``args``: the parsed flags; None:
    none given, the plan's own ``coordinator`` and ``cache_remote``) (``sending``: a run, not an
    estimate): divide the limits and the cost bound by N when no coordinator shares them (saying
    so), connect the coordinator, pull the remote's shards. UsageError (exit code 2) for a bad
    value."""
    from ..planning.shard import ShardError, keep_share, parse

    d = Distributed()
    if getattr(args, "shard", None):
        try:
            d.shard = parse(args.shard)
        except ShardError as exc:
            raise UsageError(str(exc)) from None
    n = d.shard.count if d.shard is not None else 1
    uri = getattr(args, "coordinator", None) or plan.coordinator
    if sending and uri:
        from . import coordinator

        try:
            c = coordinator.Coordinator(
                uri, coordinator.run_id(sys.argv[1:]), n, d.shard.index if d.shard else 0
            )
        except coordinator.CoordinatorError as exc:
            raise UsageError(str(exc)) from None
        d.coordinator = (
            c  # reachable or not: one that is not falls back to 1/N, and rejoins once it is
        )
        if c.connect():
            _note(
                f"coordinator {c.name}: limits and cost bound shared by every process of run {c.run}"
            )
    if d.shard is not None:
        _note(f"shard {d.shard} (from {d.shard.source})")
    if (
        sending and n > 1 and (d.coordinator is None or d.coordinator.down)
    ):  # (an estimate sends nothing)
        divided, d.notes = keep_share(plan.models, plan.max_cost, n, apply=d.coordinator is None)
        if d.coordinator is None:
            plan.max_cost = divided
        if d.notes:
            _note(
                f"{'without a coordinator' if d.coordinator is None else 'until it reaches the coordinator'}, this "
                f"process keeps to 1/{n} of each provider's limits and of the cost bound:"
            )
            for line in d.notes:
                _note(f"  {line}")
    d.remote = remote_for(
        getattr(args, "cache_remote", None) or plan.cache_remote,
        plan.cache_dir,
        shard=d.shard,
        writable=sending,
    )
    if d.remote is not None and sending:
        d.roll_s = getattr(args, "upload_every", None) or ROLL_S
    return d
