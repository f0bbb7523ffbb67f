"""What start-up and the tail do (issue 14): which modules a command imports, the suite read once,
the progress without a total, the command's exit codes. Speed itself is measured by `make bench`."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from io import StringIO
from itertools import islice
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from dxi.evals import EVALS, Exclusions, Suite, discover, gold_frames, when2call
from dxi.runner.sending.progress import RunProgress
from dxi.runner.sending.scheduler import Stats

from .helpers.synthetic import data_dir as synthetic_data

HEAVY = (
    "polars",
    "pyarrow",
    "numpy",
    "dxi.scoring",
    "dxi.cache",
    "uvloop",
    "rich",
    "aiohttp",
    "matplotlib",
    "jinja2",
)


def _imported_by(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    return set(out.split())


@pytest.mark.process
def test_the_command_line_and_help_import_none_of_the_heavy_modules():
    loaded = _imported_by(
        "from dxi.runner import cli\n"
        "try:\n    cli.parser().parse_args(['run', '--help'])\nexcept SystemExit:\n    pass"
    )
    assert sorted(m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY)) == []


@pytest.mark.process
def test_dxi_help_imports_no_command_module_nor_the_library():
    """``dxi --help`` lists the commands from their declarations (``runner.commands.HELP``): it
    imports no command's module, no evaluations, adapters or asyncio (issue 33: 0.20 s when it built
    every command)."""
    loaded = _imported_by(
        "import contextlib, io\nimport dxi.__main__\nfrom dxi.runner import signals\n"
        "from dxi.runner.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['--help']) == 0"
    )
    dxi = sorted(m for m in loaded if m.startswith("dxi."))
    assert dxi == [
        "dxi.__main__",
        "dxi.lazy",
        "dxi.runner",
        "dxi.runner.cli",
        "dxi.runner.commands",
        "dxi.runner.errors",
        "dxi.runner.signals",
        # standard output and error guarded against a reader gone (stdlib only)
        "dxi.runner.streams",
    ]
    assert not {"asyncio", "dxi.evals", "dxi.adapters", *HEAVY} & loaded
    only_run = _imported_by("from dxi.runner import cli\ncli.parser(['run'])")
    assert {"dxi.runner.commands.run", "dxi.runner.commands.options"} <= only_run
    assert (
        not {f"dxi.runner.commands.{m}" for m in ("view", "export", "batches", "score")} & only_run
    )


@pytest.mark.process
def test_reading_tasks_imports_no_polars():
    loaded = _imported_by(
        "from pathlib import Path\nfrom dxi.evals import Suite, discover\n"
        f"print(sum(1 for _ in Suite(discover(Path({str(Path(__file__).parent / 'fixtures')!r}))).tasks()))"
    )
    assert "polars" not in loaded and "pyarrow" not in loaded


def test_the_survey_reads_the_tasks_once_and_matches_counting_and_gold_frames(
    tmp_path: Path, monkeypatch
):
    suite = Suite(discover(synthetic_data(tmp_path, 700)))
    reads = []

    def load(*args, **kwargs):
        reads.append(1)
        return when2call.load(*args, **kwargs)

    monkeypatch.setitem(EVALS, "when2call", dataclasses.replace(EVALS["when2call"], load=load))
    steps = list(suite.surveying(every=256))
    assert len(steps) == 2  # 700 tasks: a pause after 256 and after 512
    assert reads == [1]
    assert suite.survey().tasks == {"when2call": 700}
    assert suite.data_block()["when2call"]["tasks"] == 700
    gold, categories = suite.gold_frames()
    assert reads == [1]  # the data block and the gold frames came from the one pass
    expected_gold, expected_categories = gold_frames(suite.tasks())
    assert reads == [1, 1]
    assert (
        gold.height == 700 and gold.equals(expected_gold) and categories.equals(expected_categories)
    )
    assert categories.height == 4 * 700
    assert suite.gold_frames()[0] is gold and reads == [1, 1]  # kept, not read again
    survey = suite.survey()  # the counts kept, the rows (now in the frames) let go
    assert (
        survey.tasks == {"when2call": 700}
        and survey.gold == []
        and survey.categories == []
        and reads == [1, 1]
    )


def test_validating_the_files_makes_the_survey_in_the_same_pass(tmp_path: Path, monkeypatch):
    data = discover(synthetic_data(tmp_path, 700))
    first, second = [t.id for t in islice(Suite(data).tasks(), 2)]
    reads = []

    def numbered(*args, **kwargs):
        reads.append(1)
        return when2call.numbered(*args, **kwargs)

    monkeypatch.setitem(
        EVALS, "when2call", dataclasses.replace(EVALS["when2call"], numbered=numbered)
    )
    suite = Suite(data, exclusions=Exclusions({first, f"{second}:answer"}), limit=500)
    suite.validate()
    assert (
        reads == [1] and list(suite.surveying()) == []
    )  # the survey came with the check: no second pass
    assert suite.survey().tasks == {
        "when2call": 500
    }  # the two excluded tasks are not among the 500
    gold, categories = suite.gold_frames()
    expected_gold, expected_categories = gold_frames(suite.tasks())
    assert (
        gold.equals(expected_gold) and categories.equals(expected_categories) and gold.height == 500
    )
    assert suite.data_block()["when2call"]["excluded"] == {"listed": 2, "matched": 2}


def test_progress_without_a_total_until_it_is_given():
    out = StringIO()
    t0 = time.monotonic()
    p = RunProgress(Console(file=out, width=200), {}, interval_s=3600, started=t0)
    s = Stats(sent=5, ok=5, attempts=5, started=t0)
    assert (
        p.line("m", s, now=t0 + 10.0)
        == "5/? - 0.5 req/s ETA - $0.0000 retries 0 429s 0 invalid replies 0 failed 0 cached 0"
    )
    with p:
        p.update(
            "m", s
        )  # not a terminal: no line before the interval, even though no total is known
        assert out.getvalue() == ""
        p.set_totals({"m": 5})
        p.update("m", s)  # finished: its line at once
    line = out.getvalue().split(" m: ", 1)[1]  # the rate moves with the clock: the rest is exact
    assert line.startswith("5/5 100% ") and line.endswith(
        " req/s done $0.0000 retries 0 429s 0 invalid replies 0 failed 0 cached 0\n"
    )


@pytest.mark.process
def test_the_command_exits_with_mains_code_and_flushes(tmp_path: Path):
    def dxi(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "from dxi.__main__ import command; command()", *args],
            capture_output=True,
            text=True,
        )

    r = dxi("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: dxi")
    r = dxi("run")
    assert r.returncode == 2 and "name the models" in r.stderr
    r = dxi("nonsense")
    assert r.returncode == 2 and "unknown command 'nonsense'" in r.stderr
    data = synthetic_data(tmp_path / "data", 3)
    r = dxi(
        "run",
        "--model",
        "embedded:sparrow-nano-general-v1.1",
        "--data-dir",
        str(data),
        "--evals",
        "when2call",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
    )
    assert r.returncode == 0, r.stderr
    assert "Decision Index" in r.stdout and r.stdout.rstrip().endswith("answers.parquet")
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert summary["data"]["when2call"]["tasks"] == 3
    assert summary["models"][0]["requests"]["sent"] == 3
    assert list((tmp_path / "cache" / "wal").iterdir()) == []  # closed: compacted into a shard
    assert len(list((tmp_path / "cache" / "shards").iterdir())) == 1


@pytest.mark.process
def test_a_first_run_reaches_its_first_request_without_polars_pyarrow_numpy_or_the_scoring(
    tmp_path: Path,
):
    # what `dxi run` does before its first request: plan (the files checked whole), open an empty
    # cache, look keys up, encode; then its first replies' rows appended. PyArrow and NumPy come
    # with the first compaction, tenacity with the first retry.
    data = synthetic_data(tmp_path / "data", 5)
    loaded = _imported_by(
        "from pathlib import Path\nfrom dxi.runner import cli\nfrom dxi.runner.commands import options\n"
        "from dxi.runner.sending.scheduler import run\n"
        "from dxi.runner.sending.cost import Budget\nfrom dxi.runner.sending.progress import RunProgress\n"
        "from dxi.cache import Cache\n"
        f"args = cli.parser().parse_args(['run', '--model', 'systemone:m@http://127.0.0.1:9', '--data-dir', {str(data)!r}])\n"
        "plan = options.plan_of(args)\n"
        f"cache = Cache(Path({str(tmp_path / 'cache')!r}))\n"
        "m = plan.models[0]\n"
        "requests = [m.adapter.encode(t) for t in plan.suite.tasks()]\n"
        "assert cache.has_many([r.key for r in requests]) == [False] * 5\n"
        "cache.append({'key': requests[0].key, 'status': 'ok'})\n"
        "assert cache.has_many([r.key for r in requests]) == [True] + [False] * 4"
    )
    heavy = sorted(
        m for m in loaded if m.split(".")[0] in ("polars", "pyarrow", "numpy", "tenacity")
    )
    assert heavy == [] and "dxi.scoring" not in loaded
    assert (
        "dxi.runner.outputs.provenance" not in loaded
    )  # git is asked when the result is written, not before
    assert "dxi.cache.store" in loaded  # the probe did open the cache


@pytest.mark.process
def test_dxi_run_hands_its_plan_to_the_session_before_polars_or_the_scoring_is_imported(
    tmp_path: Path,
):
    # `dxi run`'s own command module (runner.commands.run.main), up to the call that sends: what it
    # imports first delays the first request (the summary's printer loads Polars: imported once the
    # summary is ready)
    data = synthetic_data(tmp_path / "data", 5)
    loaded = _imported_by(
        "from dxi.runner import cli, session\n"
        "def stop_here(plan, **kwargs):\n    raise SystemExit(' '.join(sorted(sys.modules)))\n"
        "session.run = stop_here\n"
        "try:\n"
        f"    cli.main(['run', '--model', 'systemone:m@http://127.0.0.1:9', '--data-dir', {str(data)!r}, '--cache-dir', "
        f"{str(tmp_path / 'cache')!r}, '--out', {str(tmp_path / 'out')!r}, '-q'])\n"
        "except SystemExit as stop:\n    sys.modules = dict.fromkeys(str(stop.code).split())"
    )
    assert (
        "dxi.runner.commands.run" in loaded
    )  # the probe did reach the session through the command
    assert sorted(m for m in loaded if m.split(".")[0] in ("polars", "pyarrow", "numpy")) == []
    assert "dxi.scoring" not in loaded and "dxi.runner.outputs.files" not in loaded


async def test_progress_lines_go_on_while_no_reply_arrives():
    out = StringIO()
    p = RunProgress(Console(file=out, width=200), {"m": 10}, interval_s=0.05)
    s = Stats(sent=3, ok=3, attempts=3)
    with p:
        p.update(
            "m", s
        )  # the one reply of the run so far (not a terminal: no line before the interval)
        await asyncio.sleep(0.28)  # a provider that is down: no reply, yet the count is shown again
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 6 and all(" m: 3/10 30% " in line for line in lines)
    s.ok = s.sent = s.attempts = 10
    with p:
        p.update("m", s)  # finished: its line once, not again at every tick
        await asyncio.sleep(0.12)
    assert sum(" m: 10/10 100% " in line for line in out.getvalue().splitlines()) == 1
