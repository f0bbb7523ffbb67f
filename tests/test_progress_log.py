"""A run's progress in a log (not a terminal): one line per model every interval from the start
(docs/runs.md#progress), also before the first reply. With replies slower than the interval (a
long-thinking streamed model, minutes a reply) nothing was printed until the first one arrived (2
min 07 s in a trial): the log looked hung. The requests a worker has taken up count ``in flight``.

The fake System One provider (a proxy: it serves every model named) answers one request per
When2Call task (``tests.fakes.fake_provider``), each after its ``latency``; the interval is made
short through ``runner.sending.progress.INTERVAL_S``."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import pytest

from dxi.runner.cli import main
from dxi.runner.sending import progress

from .fakes.fake_provider import FakeProvider
from .helpers.synthetic import data_dir

STAMP = re.compile(r"\d\d:\d\d:\d\d ")


@pytest.mark.slow
async def test_a_log_gets_progress_lines_before_the_first_reply(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """3 tasks, replies of 1.2 s, an interval of 0.2 s: lines with 0 done and the 3 requests in
    flight come before the first reply (there were none), then the last line once all are in."""
    monkeypatch.setattr(progress, "INTERVAL_S", 0.2)
    data_dir(tmp_path / "data", 3)
    async with FakeProvider(model=None, latency="1.2") as server:
        flags = ["--model", f"systemone:m1@{server.url}", "--evals", "when2call"]
        folders = ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
        argv = ["run", *flags, *folders, "--out", str(tmp_path / "out")]
        assert await asyncio.to_thread(main, argv) == 0
    lines = [
        STAMP.sub("", line, count=1)
        for line in capsys.readouterr().out.splitlines()
        if STAMP.match(line) and " systemone:m1: " in line
    ]
    waiting = (
        "systemone:m1: 0/3 0% 0.0 req/s ETA - no price retries 0 429s 0 invalid replies 0 "
        "failed 0 cached 0 in flight 3"
    )
    assert len(lines) >= 3, lines  # at 0.2, 0.4, ... s: about five before the replies at 1.2 s
    before = len(list(itertools.takewhile(lambda line: line == waiting, lines)))
    assert before >= 2, lines
    for line in lines[before:-1]:  # a loaded machine: a line between two of the replies
        between = re.fullmatch(r"systemone:m1: ([12])/3 .* cached 0 in flight (\d)", line)
        assert between and int(between[1]) + int(between[2]) == 3, line
    assert re.fullmatch(
        r"systemone:m1: 3/3 100% \d+\.\d req/s done no price retries 0 429s 0 invalid replies 0 "
        r"failed 0 cached 0",
        lines[-1],
    ), lines[-1]
