"""``dxi run`` in its own process, stopped by a signal: no process outlives it (the embedded model's workers
and multiprocessing's resource tracker die with it however it ends), SIGTERM stops it as Ctrl-C does (exit
143), a first Ctrl-C or SIGTERM drains (the requests in flight finish and are stored, nothing new is sent)
while a second aborts at once, and a Ctrl-C while Python is still importing prints no traceback.

Process trees are read from ``/proc`` (no psutil): ``dxi`` is started in a session of its own, so every
process it starts shares its process group, which outlives it (orphans are adopted, not moved)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import DXI
from .synthetic import data_dir

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process trees from /proc")


def group(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid``: pid -> command line (zombies, already dead, left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended while we looked
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found[int(entry.name)] = cmdline
    return found


def wait_for(condition, timeout: float, what: str):
    """Poll ``condition()`` every 20 ms until it returns something true (returned), failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def started(cmd: list[str], tmp_path: Path) -> subprocess.Popen:
    """``cmd`` in a session of its own, its output to ``tmp_path``/stdout and /stderr (files, not pipes: a
    process that outlived it would hold a pipe open)."""
    with (tmp_path / "stdout").open("wb") as out, (tmp_path / "stderr").open("wb") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)


def output(tmp_path: Path) -> tuple[str, str]:
    return (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()


def embedded_run(tmp_path: Path, tasks: int, *extra: str) -> subprocess.Popen:
    data = data_dir(tmp_path / "data", tasks)
    return started([DXI, "run", "--model", "embedded", "--data-dir", str(data), "--cache-dir", str(tmp_path / "cache"),
                    "--out", str(tmp_path / "out"), *extra], tmp_path)


# ---- the embedded model's worker processes die with their parent, whatever kills it -----------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["INT", "KILL"])
def test_no_embedded_worker_nor_resource_tracker_outlives_dxi(tmp_path: Path, sig: signal.Signals):
    from dxi.adapters.embedded import WORKERS

    proc = embedded_run(tmp_path, 20_000, "-q")
    try:
        # dxi, its workers and the resource tracker, once the run is answering (its log has rows)
        wait_for(lambda: len(group(proc.pid)) >= WORKERS + 2 and any((tmp_path / "cache").glob("wal/*.jsonl")),
                 120, "the embedded model's workers")
        children = set(group(proc.pid)) - {proc.pid}
        assert any("resource_tracker" in group(proc.pid).get(p, "") for p in children)
        proc.send_signal(sig)
        assert proc.wait(60) == {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -signal.SIGKILL}[sig]
        if sig != signal.SIGKILL:
            stdout, stderr = output(tmp_path)
            assert "Traceback" not in stderr, stderr
            assert "rerun the same command to continue" in stdout
        left = {}
        try:
            wait_for(lambda: not group(proc.pid), 20, "the workers and the tracker to end")
        except AssertionError:
            left = group(proc.pid)
        assert left == {}, f"outlived dxi (killed by {sig.name}): {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in group(proc.pid):
            os.kill(pid, signal.SIGKILL)
