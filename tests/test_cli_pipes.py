"""``dxi`` writing into a pipe whose reader goes away (``dxi run | head -3``): the output ends
quietly, the work does not (``runner.streams``): a run still gathering answers stores every reply
and writes its outputs, and the exit code is the command's own."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import orjson
import pytest

from dxi.cache import Cache
from dxi.runner.streams import Guarded

from .conftest import DXI
from .fakes.fake_provider import serve
from .helpers.runs import served_run
from .helpers.synthetic import data_dir


def test_a_write_to_a_pipe_its_reader_closed_is_dropped_and_points_the_fd_at_devnull():
    read, write = os.pipe()
    os.close(read)  # the reader is gone
    raw = io.TextIOWrapper(os.fdopen(write, "wb", buffering=0), write_through=True)
    stream = Guarded(raw)
    assert stream.write("first line\n") == 11  # dropped, not raised
    assert stream.closed_by_reader is True
    assert os.path.samefile(f"/proc/self/fd/{write}", os.devnull)
    assert stream.write("more\n") == 5
    stream.flush()  # nothing left to fail
    raw.close()


def test_a_stream_whose_reader_stays_writes_through():
    read, write = os.pipe()
    raw = io.TextIOWrapper(os.fdopen(write, "wb", buffering=0), write_through=True)
    stream = Guarded(raw)
    assert stream.write("kept\n") == 5
    stream.flush()
    assert os.read(read, 100) == b"kept\n" and stream.closed_by_reader is False
    raw.close()
    os.close(read)


@pytest.mark.process
def test_a_run_whose_reader_closes_the_pipe_mid_run_finishes_quietly_and_exits_0(tmp_path: Path):
    """64 requests at 0.3 s each, 8 at a time (2.4 s): the reader takes the first line and closes
    the pipe while the run is still sending. The run goes on to the end: every reply is stored,
    summary.json and answers.parquet are written, nothing is said, exit code 0."""
    tasks = 64
    data = data_dir(tmp_path / "data", tasks)
    with serve(model="fake", p_first=None, p_yes=None, latency="0.3") as server:
        cmd = served_run(server.url, data, tmp_path)
        with (tmp_path / "stderr").open("wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
        try:
            first = proc.stdout.readline()
            at_close = server.stats()
            proc.stdout.close()  # `| head -1`
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
        done = server.stats()
    assert first.startswith(b"Running 1 model (systemone:fake) on 64 tasks")
    assert at_close["ok"] < tasks  # the pipe broke while the run was sending
    assert (code, (tmp_path / "stderr").read_text()) == (0, "")
    assert (done["arrivals"], done["ok"]) == (tasks, tasks)
    with Cache(tmp_path / "cache") as cache:
        stored = cache.scan().collect()
    assert stored.height == stored["key"].n_unique() == tasks
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert [m["model"] for m in summary["models"]] == ["systemone:fake"]
    assert (tmp_path / "out" / "answers.parquet").is_file()


@pytest.mark.process
@pytest.mark.parametrize(
    "words",
    [["--help"], ["run", "--help"], ["batches", "list", "--all"]],
    ids=["help", "run-help", "batches-list"],
)
def test_a_command_whose_reader_is_gone_before_it_writes_exits_quietly(
    tmp_path: Path, words: list[str]
):
    """The pipe closed before ``dxi`` writes a byte: no output, nothing on standard error, the
    command's own exit code (0)."""
    if words[0] == "batches":
        (tmp_path / ".dxi-cache").mkdir()
    proc = subprocess.Popen(
        [DXI, *words], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert (proc.wait(60), err) == (0, b"")
