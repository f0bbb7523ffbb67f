"""Putting a scoring's outputs in place (``runner.outputs.staging``) killed at each of its steps:
the next command that touches the folder finds the earlier set whole or the new set whole, never
some of each, and says in one line what it repaired.

A SIGKILL runs no code of the process: all that is left of it is the folder. So each step's
folder is copied as it stands after that step (every ``os.replace``, ``mkdir``, ``rmdir``,
``unlink`` and file creation of the commit, ``shutil.rmtree``'s one by one), and each copy is then
settled by ``staging.recover`` as the next command does, the staging folder named with a pid no
process can have (a killed one's)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dxi.runner.outputs import staging

DEAD = 4194305  # above Linux's largest pid_max (2**22): no process has it
OLD = {
    "answers.parquet": b"old answers",
    "report.html": b"<p>old report</p>",
    "summary.json": b'{"old": true}\n',
    "tables/index.csv": b"model,old\n",
    "tables/index.parquet": b"PAR1 old",
}
NEW_SCORE = {"answers.parquet": b"new answers", "summary.json": b'{"new": true}\n'}
NEW_REPORT = {
    **NEW_SCORE,
    "report.html": b"<p>new report</p>",
    "tables/index.csv": b"model,new\n",
    "tables/index.parquet": b"PAR1 new",
}


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path in it -> its bytes (the staging folder's too)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _write(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def _commit_step_by_step(
    out: Path, new: dict[str, bytes], snaps: Path, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Commit ``new`` into ``out`` (holding ``OLD``), copying ``out`` into ``snaps/<k>`` after each
    step k of the commit (0: staged, the commit not begun); the steps, as "op name"."""
    steps: list[str] = []
    busy = []

    def snap() -> None:
        busy.append(1)
        try:
            shutil.copytree(out, snaps / str(len(steps)), symlinks=True)
        finally:
            busy.pop()

    def watched(op: str, real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            creates = op != "open" or args[1] & os.O_CREAT
            if not busy and creates:
                steps.append(f"{op} {Path(args[0]).name}")
                snap()
            return result

        return call

    with staging.Staging(out) as staged:
        for name, data in new.items():
            path = staged.path(name.partition("/")[0])
            if "/" in name:
                path.mkdir(exist_ok=True)
                path = path / name.partition("/")[2]
            path.write_bytes(data)
        snap()
        for op in ("replace", "mkdir", "rmdir", "unlink", "open"):
            monkeypatch.setattr(os, op, watched(op, getattr(os, op)))
        staged.commit()
        monkeypatch.undo()
    return steps


def _killed(snapshot: Path) -> Path:
    """``snapshot`` with its staging folder named as a killed process's."""
    for folder in snapshot.glob(f"{staging.PREFIX}*"):
        folder.rename(snapshot / f"{staging.PREFIX}{DEAD}")
    return snapshot


BACK = (
    "repaired {out}: a dxi killed (pid 4194305) while it put its outputs in place had moved the "
    "earlier ones aside; they were moved back, so {out} is as it was; it holds: answers.parquet, "
    "tables/, report.html, summary.json."
)
FORWARD = (
    "repaired {out}: a dxi killed (pid 4194305) while it put its outputs in place had decided to "
    "(its mark was written); what it had not moved in was moved in: {out} holds that scoring's "
    "outputs, whole ({names})."
)


@pytest.mark.parametrize("new", [NEW_SCORE, NEW_REPORT], ids=["score", "report"])
def test_a_commit_killed_at_any_step_is_settled_whole_by_the_next_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new: dict[str, bytes]
):
    """The earlier set is a report's (summary.json, answers.parquet, report.html, tables/); the new
    one a `dxi score`'s (two outputs: the report taken away) or a `dxi report`'s. Killed before the
    mark (steps 0-5), the folder is settled back to the earlier set, byte for byte; from the mark on
    (step 6), to the new set. The line is said only where an output was moved; the uncut commit
    leaves the new set and nothing else."""
    out = tmp_path / "out"
    out.mkdir()
    _write(out, OLD)
    snaps = tmp_path / "snaps"
    steps = _commit_step_by_step(out, new, snaps, monkeypatch)
    pid = os.getpid()
    placed = [
        n
        for n in ("answers.parquet", "tables", "report.html", "summary.json")
        if n in {k.partition("/")[0] for k in new}
    ]
    # shutil.rmtree of .old: each file, then each folder, deepest first
    old_removed = ["unlink answers.parquet", "unlink index.csv", "unlink index.parquet"]
    assert steps[:6] == [
        "mkdir .old",
        "replace answers.parquet",
        "replace tables",
        "replace report.html",
        "replace summary.json",
        "open .committed",
    ]
    assert steps[6 : 6 + len(placed)] == [f"replace {n}" for n in placed]
    rest = steps[6 + len(placed) :]
    assert rest[-3:] == ["rmdir .old", "unlink .committed", f"rmdir {staging.PREFIX}{pid}"]
    assert sorted(rest[:-3]) == sorted(
        [*old_removed, "rmdir tables", "unlink report.html", "unlink summary.json"]
    )
    assert _files(out) == new  # the commit that was not cut: the new set, nothing else
    assert len(steps) == 6 + len(placed) + 6 + 3
    names = ", ".join(n + ("/" if n == "tables" else "") for n in placed)
    for k in range(len(steps) + 1):
        folder = _killed(snaps / str(k))
        lines = staging.recover(folder)
        if k < 6:  # before the mark: the earlier set, as it was
            assert (_files(folder), lines) == (
                OLD,
                [BACK.format(out=folder)] if 2 <= k else [],
            ), k
        else:  # the mark made: the new set, whole
            moving = k < 6 + len(placed)  # some new outputs were still staged
            assert (_files(folder), lines) == (
                new,
                [FORWARD.format(out=folder, names=names)] if moving else [],
            ), k
        assert staging.recover(folder) == []  # settled once: nothing left to do


def test_a_staging_folder_of_a_running_process_is_left_alone(tmp_path: Path):
    """A staging folder whose process still runs (this test's parent, pid 1 here: any running
    process) is another command's work in progress: neither settled nor removed; one of a process
    that no longer runs, caught while it staged (no commit begun), is removed without a line and
    the folder keeps its outputs."""
    out = tmp_path / "out"
    _write(out, OLD)
    alive = out / f"{staging.PREFIX}{os.getppid()}"
    _write(alive, {".old/summary.json": b"theirs"})
    dead = out / f"{staging.PREFIX}{DEAD}"
    _write(dead, {"summary.json": b"half written"})
    assert staging.recover(out) == []
    assert _files(out) == {**OLD, f"{alive.name}/.old/summary.json": b"theirs"}


@pytest.mark.parametrize("fail_at", [2, 7], ids=["before-the-mark", "after-the-mark"])
def test_an_error_inside_the_commit_is_settled_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
):
    """An error while the commit renames (an EIO at its 2nd rename, an earlier output moved aside;
    at its 7th, the mark made and two new outputs in) is settled in the same process: the earlier
    set put back, or the new one finished, whole, no staging folder left, and the error raised
    again (it once removed the staging folder, with the earlier outputs moved into it)."""
    out = tmp_path / "out"
    _write(out, OLD)
    calls = []
    real = os.replace

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) == fail_at:
            raise OSError(5, "Input/output error")
        return real(*args, **kwargs)

    with staging.Staging(out) as staged:
        _write(staged.dir, NEW_REPORT)
        monkeypatch.setattr(os, "replace", failing)
        with pytest.raises(OSError, match="Input/output error"):
            staged.commit()
        monkeypatch.undo()
    assert _files(out) == (OLD if fail_at == 2 else NEW_REPORT)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("point", ["committing:1", "marked:1"], ids=["before-mark", "after-mark"])
def test_dxi_report_killed_while_it_puts_its_outputs_in_place_is_settled_by_the_next_command(
    data_dir: Path, tmp_path: Path, point: str
):
    """`dxi report` in a process of its own, killed (SIGKILL) inside the step that puts its
    outputs in place: once the earlier outputs are moved aside (``committing``), or once the mark
    is made too (``marked``), no new one renamed in yet. The folder then holds no output at all.
    The next command that writes there, a `dxi score`, settles it first and says so in one line
    (on a copy: it then writes its own outputs); settled so, the folder holds the earlier
    report's files back, byte for byte, or this report's, exactly as it had staged them (before,
    a kill there left the folder empty, and the next command removed the staging folder with
    both sets in it)."""
    import subprocess

    from .conftest import DXI
    from .helpers import events
    from .helpers.runs import copy_model, run_plan

    assert run_plan(data_dir, tmp_path).exit_code == 0
    argv = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
    first = subprocess.run(
        [DXI, "report", *argv, "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out"
    before = _files(out)  # (session.run, as run_plan calls it, keeps no run-history.jsonl)
    copy_model(tmp_path / "cache", "copy", "when2call", 1)
    log = tmp_path / "events.jsonl"
    killed = subprocess.run(
        [DXI, "report", *argv, "-q"],
        cwd=tmp_path,
        env=events.env(log, point),
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -9
    ((_, _, pid, moved),) = events.read(log, "committing")
    assert moved == ["answers.parquet", "tables", "report.html", "summary.json"]
    folder = f"{staging.PREFIX}{pid}"
    assert sorted(p.name for p in out.iterdir()) == [folder]
    staged = {
        k.removeprefix(f"{folder}/"): v
        for k, v in _files(out).items()
        if k.startswith(folder) and "/." not in k
    }
    # the staged set: the earlier one's files, and the comparisons of the two models now there
    assert sorted(set(staged) ^ set(before)) == [
        "tables/comparisons.csv",
        "tables/comparisons.parquet",
    ]
    copy = tmp_path / "copy"  # the same folder, for `dxi score` to settle (and then write)
    shutil.copytree(out, copy)
    done = subprocess.run(
        [DXI, "score", *argv, "--out", "copy", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # the copy's failed answers: provisional
    names = "answers.parquet, tables/, report.html, summary.json"
    if point == "committing:1":
        line = (
            f"note: repaired copy: a dxi killed (pid {pid}) while it put its outputs in place had "
            f"moved the earlier ones aside; they were moved back, so copy is as it was; it holds: "
            f"{names}.\n"
        )
        expected = before
    else:
        line = (
            f"note: repaired copy: a dxi killed (pid {pid}) while it put its outputs in place had "
            "decided to (its mark was written); what it had not moved in was moved in: copy "
            f"holds that scoring's outputs, whole ({names}).\n"
        )
        expected = staged
        assert staged["summary.json"] != before["summary.json"]  # two models now
    assert done.stderr == line, done.stderr
    assert [p.name for p in copy.iterdir() if p.name.startswith(".")] == []
    # settled here as `dxi score` settled it, before it scored: the bytes of one whole set
    assert len(staging.recover(out)) == 1
    assert _files(out) == expected
    assert sorted(p.name for p in out.iterdir()) == [
        "answers.parquet",
        "report.html",
        "summary.json",
        "tables",
    ]


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("point", ["committing:1", "marked:1"], ids=["before-mark", "after-mark"])
def test_dxi_run_killed_while_it_puts_its_outputs_in_place_is_settled_by_the_next_dxi_run(
    data_dir: Path, tmp_path: Path, point: str
):
    """The test above for `dxi run`, which settles a folder first thing (``options.repair``) as
    `dxi score` and `dxi report` do: over a report's outputs, a `dxi run --limit 1` killed
    (SIGKILL) inside the step that puts its outputs in place, before its mark or after it. The
    same command run again says in one line what it repaired, then runs: on one copy of the
    folder to its end (the copy then holds its outputs and its run-history.jsonl, no staging
    folder; rolled back, the earlier report was there again, so it says it took the report
    away), on another killed at its own commit, whose ``.old`` then holds what the repair left
    in the folder: the earlier report's files back, byte for byte, or the killed run's, exactly
    as it had staged them."""
    import subprocess

    from dxi.runner.cli import main

    from .conftest import DXI
    from .helpers import events
    from .helpers.runs import run_plan

    folders = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]

    def dxi_run(out: str, kill_at: str | None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [DXI, "run", "--model", "embedded", "--limit", "1", *folders, "--out", out, "-q"],
            cwd=tmp_path,
            env=events.env(tmp_path / f"{out}.jsonl", kill_at),
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert run_plan(data_dir, tmp_path).exit_code == 0
    out = tmp_path / "out"
    assert main(["report", *folders, "--out", str(out), "-q"]) == 0
    before = _files(out)
    killed = dxi_run("out", point)
    assert killed.returncode == -9, killed.stderr
    ((_, _, pid, moved),) = events.read(tmp_path / "out.jsonl", "committing")
    assert moved == ["answers.parquet", "tables", "report.html", "summary.json"]
    folder = f"{staging.PREFIX}{pid}"
    assert sorted(p.name for p in out.iterdir()) == [folder]  # no output in place
    staged = {k.removeprefix(f"{folder}/"): v for k, v in _files(out).items() if "/." not in k}
    assert sorted(staged) == ["answers.parquet", "summary.json"]  # a run's: no report
    assert staged["summary.json"] != before["summary.json"]  # --limit 1: its own figures
    names = "answers.parquet, tables/, report.html, summary.json"
    if point == "committing:1":
        line = (
            f"had moved the earlier ones aside; they were moved back, so {{out}} is as it was; "
            f"it holds: {names}."
        )
        expected = before
    else:
        line = (
            "had decided to (its mark was written); what it had not moved in was moved in: "
            "{out} holds that scoring's outputs, whole (answers.parquet, summary.json)."
        )
        expected = staged
    repaired = (
        f"note: repaired {{out}}: a dxi killed (pid {pid}) while it put its outputs in place "
        f"{line}\n"
    )
    shutil.copytree(out, tmp_path / "whole")
    shutil.copytree(out, tmp_path / "cut")
    done = dxi_run("whole", None)
    assert (done.returncode, done.stderr) == (0, repaired.format(out="whole"))
    removed = (
        "note: whole/report.html and whole/tables (an earlier scoring's, which summary.json no "
        "longer matches) were removed: `dxi report` writes them for this one\n"
    )
    assert done.stdout.endswith(
        "written to whole/summary.json and whole/answers.parquet\n"
        + (removed if point == "committing:1" else "")
    ), done.stdout[-400:]
    assert sorted(p.name for p in (tmp_path / "whole").iterdir()) == [
        "answers.parquet",
        "run-history.jsonl",
        "summary.json",
    ]
    # the same run cut at its own commit: what its repair left in the folder is in its .old
    cut = dxi_run("cut", "committing:1")
    assert (cut.returncode, cut.stderr) == (-9, repaired.format(out="cut"))
    ((_, _, again, _),) = events.read(tmp_path / "cut.jsonl", "committing")
    old = tmp_path / "cut" / f"{staging.PREFIX}{again}" / staging.OLD
    assert _files(old) == expected
