"""The commands in README.md and docs/*.md work when pasted: every fenced ``bash`` block preceded by
the line ``<!-- runnable -->`` is run, in order, page by page, in bash (``set -euo pipefail``) from
a fresh folder holding the fixture data as ``./data`` (the default data folder), the repository's
``examples/`` and a ``.venv`` that is this one, with this environment's ``dxi`` on PATH. A block
that names a server on 127.0.0.1:PORT gets the fake provider there (every model it is asked for).
Blocks without the marker (API keys, hours-long runs, ``make test`` itself) are not run.
docs/index.md is the README (asserted below), so its blocks are run once, as the README's.

The pages name the servers' usual ports (8080 for an OpenAI-compatible server, 8000 for a System One
one), which may be taken on the machine running the tests: each port a block names is served by a
fake provider on a free port the system picks, and the block runs with that port in place of the
named one (only in ``127.0.0.1:PORT``, the server's address, so the text run is the page's but for
that number)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import FIXTURES, write_wildguard_parquet

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "<!-- runnable -->"
BLOCK = re.compile(r"^" + re.escape(MARKER) + r"\n```bash\n(.*?)^```$", re.M | re.S)
SERVER = re.compile(r"http://127\.0\.0\.1:(\d+)")


def runnable(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def test_the_marker_is_used_as_documented():
    """A marker not followed by a ```bash block is a typo that would skip a snippet silently."""
    for page in PAGES:
        text = page.read_text()
        assert text.count(MARKER) == len(runnable(page)), page.name
    assert len(runnable(ROOT / "README.md")) >= 1 and len(runnable(ROOT / "docs" / "index.md")) >= 1


def workspace(tmp: Path) -> Path:
    work = tmp / "work"
    for src, dst in (
        ("omniscience.jsonl", "omniscience-standin/omniscience.jsonl"),
        ("hle_split.json", "hle/hle_mcqa.json"),
        ("when2call.jsonl", "when2call/when2call_test_mcq.jsonl"),
    ):
        (work / "data" / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / src, work / "data" / dst)
    write_wildguard_parquet(work / "data" / "wildguardtest" / "wildguardtest.parquet")
    shutil.copytree(ROOT / "examples", work / "examples")
    (work / ".venv").symlink_to(Path(sys.prefix))
    return work


def fake_provider() -> tuple[subprocess.Popen, int]:
    """The fake provider (every model it is asked for) on a free port of 127.0.0.1, and that
    port."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.fake_provider",
            "--port",
            "0",
            "--config",
            '{"model": null, "p_first": null, "p_yes": null, "record": false}',
            "--until-stdin-closes",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    line = proc.stdout.readline().decode().strip()
    found = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/?", line)
    assert found, f"the fake provider did not start ({line!r})"
    return proc, int(found.group(1))


def on_ports(block: str, ports: dict[str, int]) -> str:
    """``block`` with each server address ``127.0.0.1:<named>`` on the port ``ports[named]``
    instead."""
    return SERVER.sub(lambda m: f"http://127.0.0.1:{ports[m.group(1)]}", block)


def test_a_block_runs_on_the_ports_given_and_only_its_server_addresses_change():
    block = (
        "dxi run --model openai:q@http://127.0.0.1:8080/v1 --port 8080\n"
        "dxi run --model systemone:http://127.0.0.1:8000 --sample 8000\n"
    )
    assert on_ports(block, {"8080": 41234, "8000": 41235}) == (
        "dxi run --model openai:q@http://127.0.0.1:41234/v1 --port 8080\n"
        "dxi run --model systemone:http://127.0.0.1:41235 --sample 8000\n"
    )


@pytest.fixture
def named_ports_taken():
    """The ports the pages name, held by this process (where they are free) for the test: a snippet
    must run though they are taken, as they may be on a machine running the tests."""
    with contextlib.ExitStack() as stack:
        for page in PAGES:
            for port in {int(p) for block in runnable(page) for p in SERVER.findall(block)}:
                sock = stack.enter_context(socket.socket())
                with contextlib.suppress(OSError):  # taken already: all the same
                    sock.bind(("127.0.0.1", port))
                    sock.listen()
        yield


@pytest.mark.process
@pytest.mark.parametrize(
    "page", [p for p in PAGES if runnable(p) and p.name != "index.md"], ids=lambda p: p.name
)
def test_the_runnable_snippets_work_when_pasted(
    page: Path, tmp_path: Path, named_ports_taken: None
):
    work = workspace(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DXI_DATA_DIR", "VIRTUAL_ENV")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for n, block in enumerate(runnable(page), 1):
        servers, ports = [], {}
        try:
            for named in sorted(set(SERVER.findall(block))):
                proc, ports[named] = fake_provider()
                servers.append(proc)
            done = subprocess.run(
                ["bash", "-c", "set -euo pipefail\n" + on_ports(block, ports)],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            for s in servers:
                s.stdin.close()
                s.wait(10)
        assert done.returncode == 0, (
            f"{page.name}, runnable block {n} exited {done.returncode}:\n{block}\n"
            f"--- stderr ---\n{done.stderr[-3000:]}\n--- stdout ---\n{done.stdout[-2000:]}"
        )


def landing(readme: str) -> str:
    """The site's home page from the README: the same text, links relative to docs/."""
    return readme.replace(
        "The reference is in [`docs/`](docs/index.md), a MkDocs site",
        "The reference is in these pages",
    ).replace("](docs/", "](")


def test_the_sites_home_page_is_the_readme():
    """docs/index.md is README.md with its links made relative to docs/ (edit the README, then copy
    it so)."""
    assert (ROOT / "docs" / "index.md").read_text() == landing((ROOT / "README.md").read_text())
    assert len((ROOT / "README.md").read_text()) <= 10_000


@pytest.mark.process
def test_the_readme_tour_after_make_run_scores_its_own_sample_and_leaves_make_runs_summary(
    tmp_path: Path,
):
    """Issue 32: after ``make run`` (every task, in the same cache) the tour's
    ``dxi score --out out/tour`` and ``dxi report`` scored every task and overwrote the tour's
    20-task summary. Here ``make run``'s command (the Makefile's ``run`` target, on a data folder of
    60 When2Call tasks and the fixtures of the other three), then the README's tour as written:
    out/tour holds the 20 tasks the tour ran, out/ make run's 60."""
    import orjson

    from .conftest import fixture_data
    from .helpers.synthetic import data_dir

    work = tmp_path / "work"
    # every evaluation (dxi run refuses one selected without data): the fixtures' few tasks, and 60
    # When2Call tasks over the fixture's 3
    fixture_data(work / "data")
    data_dir(work / "data", 60)
    (work / ".venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if k not in ("DXI_DATA_DIR", "VIRTUAL_ENV")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    make_run = re.search(
        r"^run: .*\n\t\$\(BIN\)/(dxi run .*)$", (ROOT / "Makefile").read_text(), re.M
    ).group(1)
    make_run = (
        make_run.replace("$(MODEL)", "embedded:sparrow-nano-general-v1.1")
        .replace("$(DATA)", "data")
        .replace("$(CACHE)", ".dxi-cache")
        .replace("$(OUT)", "out")
    )
    assert "$(" not in make_run, make_run
    tour = runnable(ROOT / "README.md")[0]
    assert "dxi score" in tour and "dxi report" in tour
    for script in (make_run + " -q", tour):
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (script, done.stderr[-3000:])
    tasks = {
        out: orjson.loads((work / out / "summary.json").read_bytes())["data"]["when2call"]["tasks"]
        for out in ("out", "out/tour")
    }
    assert tasks == {"out": 60, "out/tour": 20}
    assert (work / "out" / "tour" / "report.html").is_file()


def test_every_option_of_the_fake_provider_is_documented():
    """docs/benchmarks.md's table of the fake provider's ``--config`` names each of its options and
    each fault rate (``routes`` and ``route_factories`` are Python objects and ``--route``)."""
    import dataclasses
    import inspect

    from .fakes.fake_provider import FakeProvider, Faults

    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text.split("## The fake provider's options", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", section))
    options = set(inspect.signature(FakeProvider.__init__).parameters) - {
        "self",
        "routes",
        "route_factories",
    }
    faults = {f.name for f in dataclasses.fields(Faults)}
    assert (options | faults) - named == set()
    assert len(options) == 17 and len(faults) == 6
