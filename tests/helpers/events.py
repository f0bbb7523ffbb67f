"""Events of a ``dxi`` process that a test can see and kill at: ``env(...)`` gives the environment
for a process started by the test; Python then loads ``events_site/sitecustomize.py`` at start-up,
which watches a few points of dxi's own code and appends one JSON line per occurrence to ``log``:

* ``["compaction", n, pid]``: a log's rows were written as a shard file
  (``cache.layout.write_shard`` returned), before the shard is renamed into place and the log
  deleted: *mid-compaction*;
* ``["append", n, pid, rows]``: rows were appended to the cache in one write (``Cache.append_many``
  returned: batch mode stores each piece of results so);
* ``["booking", n, pid, booked_at, turn]``: the coordinator booked an attempt's turn
  (``SharedLimiter._slot``): when Redis booked it and when it may go, both on Redis's clock
  (seconds);
* ``["pacing", n, pid, rate, cost, turn]``: a process's own pacer booked ``cost`` units at ``rate``
  units per second (``runner.sending.limits.Pacer.reserve``: a run without a coordinator, or one
  fallen back from it), ``turn`` being when they may go on that process's monotonic clock (seconds).

* ``["committing", n, pid, moved]``: a scoring's outputs are being put in place: the earlier ones
  (``moved``, their names) moved out of ``OUT``, the new ones not yet renamed in
  (``runner.outputs.staging._clear`` returned, inside the step that holds signals).
* ``["marked", n, pid]``: then the mark that decides the new set was made, none of the new
  outputs renamed in yet (``runner.outputs.staging._mark`` returned): a commit killed from here on
  is finished by the next command, one killed before it undone.
* ``["returned", n, pid, code]``: the command returned its exit code (``runner.cli.main``
  returned, in ``dxi.__main__.command``): its work is done, the process is only ending.

``kill_at="compaction:2"`` kills the process (SIGKILL) right after the 2nd occurrence is written
(``"committing:1/INT"``: sends it SIGINT, a Ctrl-C, instead), so
a kill test chooses its kill points from the run's events instead of a random delay, and ``reached``
proves each was reached. Batch mode has its own named steps for that (``DXI_FAILPOINT``,
``runner.batch.failpoint``).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import orjson

SITE = Path(__file__).with_name("events_site")


def env(
    log: Path, kill_at: str | None = None, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of a process whose events go to ``log`` (appended: several processes may
    share it), killed at ``kill_at`` (``"<event>:<n>"``; None: never), on top of ``base`` (default:
    this one's)."""
    out = dict(os.environ if base is None else base)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), out.get("PYTHONPATH", "")) if p)
    out["DXI_TEST_EVENTS"] = str(log)
    out.pop("DXI_TEST_KILL_AT", None)
    if kill_at is not None:
        out["DXI_TEST_KILL_AT"] = kill_at
    return out


def read(log: Path, name: str | None = None) -> list[list]:
    """The events written to ``log`` (all, or those called ``name``), in the order they were
    written."""
    if not log.exists():
        return []
    events = [orjson.loads(line) for line in log.read_bytes().splitlines() if line.strip()]
    return [e for e in events if name is None or e[0] == name]


def reached(log: Path, point: str) -> bool:
    """Whether ``point`` (``"<event>:<n>"``) occurred in some process writing to ``log``."""
    name, _, n = point.rpartition(":")
    return any(e[1] == int(n) for e in read(log, name))


def wait(log: Path, point: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until ``point`` (``"<event>:<n>"``) is reached; fails if ``proc`` ends first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not reached(log, point):
        assert proc.poll() is None, f"the run ended before {point}"
        assert time.monotonic() < deadline, f"no {point} within {timeout} s"
        time.sleep(0.02)
