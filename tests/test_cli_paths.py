"""Every path a command writes, made unwritable in turn, in a real ``dxi``: the command stops before
the first request (or before scoring), with one line naming the flag and the path, exit code 2 (bad
input) or 4 (a cache folder that cannot be written), never a traceback (issue 32:
``dxi run --out README.md/x`` sent every request, then died with ``NotADirectoryError``, exit 1; an
unwritable ``--cache-dir`` printed three chained tracebacks; ``dxi export --format csv /proc/x.csv``
a Polars traceback).

The tests run as root, whom permissions do not stop: the unwritable places are a path under a
regular file, ``/proc`` (nothing can be created there), ``/sys`` (refused to root too) and a
read-only bind mount (where the machine lets root mount; skipped otherwise)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dxi.runner.errors import EXIT_CACHE_WRITE, EXIT_USAGE

from .conftest import DXI
from .helpers.synthetic import data_dir

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(
        not Path("/proc/self").exists() or not Path("/sys").is_dir(),
        reason="uses /proc and /sys as places nothing can be written",
    ),
]


def dxi(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DXI, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd
    )


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> Path:
    """A folder with ``data`` (3 When2Call tasks) and ``cache`` (the embedded model's replies to
    them)."""
    root = tmp_path_factory.mktemp("scored")
    data_dir(root / "data", 3)
    done = dxi(
        "run",
        "--model",
        "embedded",
        "--data-dir",
        "data",
        "--evals",
        "when2call",  # the synthetic data: When2Call only
        "--cache-dir",
        "cache",
        "--out",
        "out",
        "-q",
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture(scope="module")
def read_only() -> Iterator[Path | None]:
    """A read-only bind mount of an empty folder (None where root may not mount)."""
    import tempfile

    source = Path(tempfile.mkdtemp(prefix="dxi-ro-src-"))
    target = Path(tempfile.mkdtemp(prefix="dxi-ro-"))
    mounted = (
        subprocess.run(
            ["mount", "--bind", str(source), str(target)], capture_output=True
        ).returncode
        == 0
    )
    if (
        mounted
        and subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(target)], capture_output=True
        ).returncode
    ):
        subprocess.run(["umount", str(target)], capture_output=True)
        mounted = False
    try:
        yield target if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", str(target)], capture_output=True)
        os.rmdir(target)
        os.rmdir(source)


def place(kind: str, root: Path, read_only: Path | None) -> Path:
    """An unwritable folder path of ``kind``: under a regular file, in /proc, in /sys, on a
    read-only mount."""
    if kind == "under-a-file":
        (root / "README.md").write_text("a file, not a folder\n")
        return root / "README.md" / "x"
    if kind == "proc":
        return Path("/proc/dxi-test-x")
    if kind == "sys":
        return Path("/sys/dxi-test-x")
    if read_only is None:
        pytest.skip("root cannot mount a read-only bind mount here")
    return read_only / "x"


KINDS = ["under-a-file", "proc", "sys", "read-only"]


def no_shard_written(cache: Path) -> bool:
    return not list(cache.rglob("*.parquet"))


def one_error_line(done: subprocess.CompletedProcess, code: int, *named: str) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"dxi( [a-z-]+)+: error: ", lines[0]), done.stderr
    for text in named:
        assert text in lines[0], (text, lines[0])


@pytest.mark.parametrize("kind", KINDS)
def test_run_out_that_cannot_be_written_stops_before_the_first_request(
    tmp_path: Path, read_only, kind: str
):
    data_dir(tmp_path / "data", 3)
    out = place(kind, tmp_path, read_only)
    done = dxi(
        "run",
        "--model",
        "embedded",
        "--data-dir",
        "data",
        "--evals",
        "when2call",  # the synthetic data: When2Call only
        "--cache-dir",
        "cache",
        "--out",
        out,
        cwd=tmp_path,
    )
    one_error_line(done, EXIT_USAGE, f"--out {out}: cannot write there")
    assert no_shard_written(tmp_path / "cache")  # nothing was sent
    if kind == "under-a-file":
        assert f"({tmp_path / 'README.md'} is a file, not a folder)" in done.stderr


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("under-a-file", EXIT_USAGE),
        ("proc", EXIT_CACHE_WRITE),
        ("sys", EXIT_CACHE_WRITE),
        ("read-only", EXIT_CACHE_WRITE),
        ("read-only-itself", EXIT_CACHE_WRITE),
    ],
)
def test_run_cache_that_cannot_be_written_stops_before_the_first_request(
    tmp_path: Path, read_only, kind: str, code: int
):
    """A file in the way is a bad --cache-dir (2); a folder that cannot be created or written is
    exit code 4, as a cache write that fails during a run (an empty read-only folder: a cache that
    was never made; before issue 32 an OSError from the cache's own start-up)."""
    data_dir(tmp_path / "data", 3)
    if kind == "read-only-itself":
        if read_only is None:
            pytest.skip("root cannot mount a read-only bind mount here")
        cache = read_only
    else:
        cache = place(kind, tmp_path, read_only)
    done = dxi(
        "run",
        "--model",
        "embedded",
        "--data-dir",
        "data",
        "--evals",
        "when2call",  # the synthetic data: When2Call only
        "--cache-dir",
        cache,
        "--out",
        "out",
        cwd=tmp_path,
    )
    one_error_line(done, code, f"--cache-dir {cache}: ", "nothing was sent")
    assert not (tmp_path / "out").exists()


def test_a_run_files_paths_are_named_as_the_run_file_gives_them(tmp_path: Path):
    data_dir(tmp_path / "data", 3)
    (tmp_path / "README.md").write_text("a file\n")
    (tmp_path / "run.toml").write_text(
        'data_dir = "data"\nout = "README.md/out"\n\n[[models]]\nprovider = "embedded"\n'
        '[evals]\nselect = ["when2call"]\n'
    )
    done = dxi("run", "run.toml", "--cache-dir", "cache", cwd=tmp_path)
    one_error_line(
        done, EXIT_USAGE, "out of run.toml README.md/out: cannot write there (README.md is a file"
    )


@pytest.mark.parametrize("command", ["score", "report"])
@pytest.mark.parametrize("kind", KINDS)
def test_score_and_report_out_that_cannot_be_written(
    scored: Path, read_only, command: str, kind: str, tmp_path
):
    out = place(kind, tmp_path, read_only)
    data = ["--data-dir", "data", "--evals", "when2call"]  # the synthetic data: When2Call only
    done = dxi(command, *data, "--cache-dir", "cache", "--out", out, cwd=scored)
    one_error_line(done, EXIT_USAGE, f"--out {out}: cannot write there")


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl", "eee"])
@pytest.mark.parametrize("kind", KINDS)
def test_export_target_that_cannot_be_written(
    scored: Path, read_only, fmt: str, kind: str, tmp_path
):
    target = place(kind, tmp_path, read_only) / ("answers." + fmt if fmt != "eee" else "records")
    done = dxi(
        "export", "--format", fmt, target, "--data-dir", "data", "--cache-dir", "cache", cwd=scored
    )
    one_error_line(done, EXIT_USAGE, f"TARGET {target}: cannot write there")


def test_export_to_a_folder_where_a_file_is_expected(scored: Path):
    done = dxi(
        "export",
        "--format",
        "csv",
        "data",
        "--data-dir",
        "data",
        "--cache-dir",
        "cache",
        cwd=scored,
    )
    one_error_line(done, EXIT_USAGE, "TARGET data is a folder: give the file to write")


@pytest.mark.parametrize("kind", ["under-a-file", "proc", "sys"])
def test_data_fetch_and_fetch_model_folders_that_cannot_be_written(tmp_path: Path, kind: str):
    """Checked before the first download (the mirror is never read)."""
    folder = place(kind, tmp_path, None)
    done = dxi(
        "data", "fetch", "--data-dir", folder, "--mirror", tmp_path / "no-mirror", cwd=tmp_path
    )
    one_error_line(done, EXIT_USAGE, f"--data-dir {folder}: cannot write there")
    done = dxi("fetch-model", "--dir", folder, "--no-hub", cwd=tmp_path)
    one_error_line(done, EXIT_USAGE, f"--dir {folder}: cannot write there")


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("under-a-file", EXIT_USAGE),
        ("proc", EXIT_CACHE_WRITE),
        ("sys", EXIT_CACHE_WRITE),
        ("read-only", EXIT_CACHE_WRITE),
    ],
)
def test_estimate_of_a_cache_it_cannot_create(
    scored: Path, read_only, kind: str, code: int, tmp_path: Path
):
    """``dxi estimate`` opens (so creates) the cache it prices against: one it cannot create is said
    so."""
    cache = place(kind, tmp_path, read_only)
    done = dxi(
        "estimate",
        "--model",
        "embedded",
        "--data-dir",
        "data",
        "--evals",
        "when2call",
        "--cache-dir",
        cache,
        cwd=scored,
    )
    one_error_line(done, code, f"--cache-dir {cache}: ")


@pytest.mark.parametrize(
    "args",
    [
        ["estimate", "--model", "embedded", "--data-dir", "data", "--evals", "when2call"],
        ["batches", "list"],
        ["batches", "cancel", "--all"],
        ["score", "--data-dir", "data", "--evals", "when2call"],
    ],
)
def test_a_cache_read_under_a_file_is_bad_input(scored: Path, args: list[str], tmp_path: Path):
    (tmp_path / "README.md").write_text("a file\n")
    cache = tmp_path / "README.md" / "cache"
    done = dxi(*args, "--cache-dir", cache, cwd=scored)
    assert done.returncode == EXIT_USAGE and "Traceback" not in done.stderr, done.stderr
    assert str(cache) in done.stderr


# ---- the cache folder is the cache's own (trial 9) -----------------------------------------------
@pytest.mark.parametrize(
    ("command", "out"),
    [("run", "cache/shards"), ("run", "cache"), ("score", "cache/shards"), ("report", "cache/x")],
)
def test_an_out_inside_the_cache_folder_is_refused(
    scored: Path, command: str, out: str, tmp_path: Path
):
    """``dxi run --cache-dir C --out C/shards`` wrote answers.parquet into shards/, which every
    command then read as a shard and stopped on (exit 70)."""
    shutil.copytree(scored / "cache", tmp_path / "cache")
    data = ["--data-dir", scored / "data", "--evals", "when2call"]
    model = ["--model", "embedded"] if command == "run" else []
    done = dxi(command, *model, *data, "--cache-dir", "cache", "--out", out, cwd=tmp_path)
    one_error_line(
        done,
        EXIT_USAGE,
        f"--out {out}: inside the cache folder cache, which holds only the cache's own files; "
        "nothing was done: give a folder outside it",
    )
    assert sorted(p.name for p in (tmp_path / "cache" / "shards").iterdir()) == sorted(
        p.name for p in (scored / "cache" / "shards").iterdir()
    )


def test_export_into_the_cache_folder_is_refused(scored: Path, tmp_path: Path):
    shutil.copytree(scored / "cache", tmp_path / "cache")
    data = ["--data-dir", scored / "data", "--evals", "when2call"]
    done = dxi(
        "export", "--format", "parquet", "cache/shards/a.parquet", *data, "--cache-dir", "cache",
        cwd=tmp_path,
    )  # fmt: skip
    one_error_line(done, EXIT_USAGE, "TARGET cache/shards/a.parquet: inside the cache folder cache")
    assert not (tmp_path / "cache" / "shards" / "a.parquet").exists()


def test_a_parquet_file_in_shards_that_is_no_shard_is_named_and_skipped(
    scored: Path, tmp_path: Path
):
    shutil.copytree(scored / "cache", tmp_path / "cache")
    shutil.copy(scored / "out" / "answers.parquet", tmp_path / "cache" / "shards")
    data = ["--data-dir", scored / "data", "--evals", "when2call"]
    done = dxi("score", *data, "--cache-dir", "cache", "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "cache: cache/shards/answers.parquet is not a cache shard (no key column: another program's Parquet file?); "
        "skipped: move it out of the cache's shards/ folder"
    ) in done.stderr
    assert (tmp_path / "out" / "answers.parquet").read_bytes() == (
        scored / "out" / "answers.parquet"
    ).read_bytes()


def test_a_shard_of_a_layout_this_version_does_not_know_is_refused_by_name(
    scored: Path, tmp_path: Path
):
    import pyarrow.parquet as pq

    shutil.copytree(scored / "cache", tmp_path / "cache")
    (shard,) = (tmp_path / "cache" / "shards").glob("*.parquet")
    table = pq.read_table(shard)
    future = tmp_path / "cache" / "shards" / "zz-future.parquet"
    pq.write_table(table.replace_schema_metadata({b"dxi.layout": b"99"}), future)
    data = ["--data-dir", scored / "data", "--evals", "when2call"]
    for command in (["score"], ["run", "--model", "embedded"]):
        done = dxi(*command, *data, "--cache-dir", "cache", "--out", "out", cwd=tmp_path)
        one_error_line(
            done,
            EXIT_USAGE,
            "cache/shards/zz-future.parquet: shard layout '99' is not one this version of dxi reads (1, 2): written "
            "by a newer version? Upgrade dxi to read this cache, or move the file out of its "
            "shards/ folder (its requests are then sent again)",
        )
