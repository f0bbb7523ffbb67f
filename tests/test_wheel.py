"""The package as a stranger installs it: ``python -m build`` makes the wheel and the sdist, the
wheel goes into a fresh virtual environment outside the checkout, and ``dxi`` runs from there on the
embedded model (a short run, then the HTML report: this catches package data left out, such as the
report's templates). Dependencies come from PyPI (through uv's cache when there is one), so this
takes a minute or so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("runner", "adapters", "scoring", "cache", "evals", "report")

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def test_the_wheel_and_sdist_hold_the_package_under_one_namespace(dist: Path):
    (wheel,) = dist.glob("decision_index-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert not tops & set(TOP_LEVEL)  # nothing named runner, cache, ... in site-packages
    assert {
        "dxi/runner/cli.py",
        "dxi/runner/commands/run.py",
        "dxi/cache/__init__.py",
        "dxi/report/html.py",
    } <= set(names)
    assert any(n.startswith("dxi/report/templates/") and n.endswith(".j2") for n in names)
    (sdist,) = dist.glob("decision_index-*.tar.gz")
    members = tarfile.open(sdist).getnames()
    assert any(m.endswith("/report/templates/report.html.j2") for m in members)
    assert any(m.endswith("/runner/cli.py") for m in members)


def test_dxi_runs_from_a_fresh_environment_outside_the_checkout(
    dist: Path, data_dir: Path, tmp_path: Path
):
    (wheel,) = dist.glob("decision_index-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    install = (
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)]
        if uv
        else [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(wheel),
        ]
    )
    subprocess.run(install, check=True, capture_output=True, timeout=900)
    work = (
        tmp_path / "work"
    )  # outside the checkout: nothing of the repository is importable from here
    work.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DXI_DATA_DIR")
    }
    dxi = str(venv / "bin" / "dxi")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [dxi, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )

    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("dxi 0.")
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import dxi.runner.cli as c; print(c.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(ROOT)
    done = run("run", "--model", "embedded", "--data-dir", str(data_dir), "--limit", "2", "-q")
    assert done.returncode == 0, done.stderr
    summary = orjson.loads((work / "out" / "summary.json").read_bytes())
    assert summary["models"][0]["requests"]["sent"] == 8
    report = run("report", "--data-dir", str(data_dir), "--limit", "2", "-q")
    assert report.returncode == 0, report.stderr
    assert (work / "out" / "report.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert run("completion", "bash").stdout.count("_python_argcomplete") >= 2
