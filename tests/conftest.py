"""Shared test fixtures: the hand-written fixture data laid out like ``shared/data``, and the real
data."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REAL_DATA = (Path(__file__).parents[1] / ".." / "shared" / "data").resolve()

requires_real_data = pytest.mark.skipif(
    not REAL_DATA.is_dir(), reason=f"real data not found at {REAL_DATA}"
)
DXI = str(
    Path(sys.executable).with_name("dxi")
)  # the installed command, for runs in their own process


def without_requests(summary: dict) -> dict:
    """A summary.json without each model's ``requests`` block (which differs between a run and its
    rerun) and without the measured call latencies of its ``measures`` blocks (``scoring.measures``:
    two runs that send the same requests take their own time)."""

    def timeless(m: dict) -> dict:
        m = {k: v for k, v in m.items() if k != "requests"}
        if "measures" in m:
            m["measures"] = {k: v for k, v in m["measures"].items() if k != "latency"}
            m["evals"] = {
                name: {**e, "measures": {k: v for k, v in e["measures"].items() if k != "latency"}}
                if "measures" in e
                else e
                for name, e in m["evals"].items()
            }
        return m

    return {**summary, "models": [timeless(m) for m in summary["models"]]}


def write_wildguard_parquet(path: Path) -> Path:
    """The WildGuardTest fixture (JSON, hand-written) as a Parquet file like the real one."""
    rows = orjson.loads((FIXTURES / "wildguardtest.json").read_bytes())
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory laid out like ``shared/data`` holding the small fixtures: 4 Omniscience
    rows, 2 HLE rows (pre-split shape), 3 When2Call rows, 5 WildGuardTest rows (3 fully agreed)."""
    return fixture_data(tmp_path / "data")


def fixture_data(root: Path) -> Path:
    """The ``data_dir`` fixture's files under ``root`` (for fixtures of a wider scope)."""
    for src, dst in (
        ("omniscience.jsonl", "omniscience-standin/omniscience.jsonl"),
        ("hle_split.json", "hle/hle_mcqa.json"),
        ("when2call.jsonl", "when2call/when2call_test_mcq.jsonl"),
    ):
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / src, root / dst)
    write_wildguard_parquet(root / "wildguardtest" / "wildguardtest.parquet")
    return root


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under CI a test that needs a missing server or program fails (``servers.needs``), never
    skips."""
    mark = item.get_closest_marker("needs_in_ci")
    if mark is not None:
        pytest.fail(f"CI must run this test: {mark.args[0]} (.ci/run installs it)", pytrace=False)


# ---- `pytest --fast` (`make test-fast`): the inner loop ------------------------------------------
FAST_EXCLUDES = ("server", "process", "slow", "local_llm", "wheel")
# a test of the fast set over this long (its call alone) is named at the end: mark it ``slow``
SLOW_S = 2.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"the library and unit tests only: none marked {', '.join(FAST_EXCLUDES)} "
        f"(make test-fast); tests of that set over {SLOW_S:g} s are named at the end",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--fast``, deselect every test carrying one of ``FAST_EXCLUDES``' marks."""
    if not config.getoption("fast"):
        return
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in FAST_EXCLUDES) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """With ``--fast``, name the tests whose call took over ``SLOW_S`` seconds: the fast set stays
    fast only if they are marked ``slow`` (or ``process`` / ``server``, for what they start)."""
    if not config.getoption("fast"):
        return
    slow = sorted(
        (
            (r.duration, r.nodeid)
            for stat in ("passed", "failed")
            for r in terminalreporter.stats.get(stat, [])
            if r.when == "call" and r.duration > SLOW_S
        ),
        reverse=True,
    )
    if slow:
        terminalreporter.section(f"tests over {SLOW_S:g} s in --fast: mark them slow")
        for duration, nodeid in slow:
            terminalreporter.line(f"{duration:6.1f} s  {nodeid}")
