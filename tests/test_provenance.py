"""Provenance: the dxi version, the git state of the checkout it runs from, Python and the platform,
in summary.json and the Every Eval Ever export (the data's hub revision is in
tests/test_fetch.py)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

import dxi
from dxi.runner import export, rescore
from dxi.runner.outputs import provenance
from dxi.runner.planning.inputs import PlanInputs

from .helpers.runs import MODEL, run_plan

requires_git = pytest.mark.skipif(
    shutil.which("git") is None, reason="git is not installed (apt-get install git)"
)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.process
@requires_git
def test_git_state_names_the_commit_and_whether_tracked_files_changed(tmp_path: Path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    git(repo, "add", "code.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "first")
    head = git(repo, "rev-parse", "HEAD")
    assert provenance.git_state.__wrapped__(repo) == {"commit": head, "dirty": False}
    (repo / "notes.txt").write_text("untracked")  # an output beside the code: not a modification
    assert provenance.git_state.__wrapped__(repo) == {"commit": head, "dirty": False}
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.git_state.__wrapped__(repo) == {"commit": head, "dirty": True}
    # not the top of a checkout (a folder inside one, an installed package): no git state, and git
    # is not asked
    (repo / "pkg").mkdir()
    assert provenance.git_state.__wrapped__(repo / "pkg") is None
    assert provenance.git_state.__wrapped__(tmp_path / "elsewhere") is None


@pytest.mark.process
def test_summary_and_export_record_what_produced_them(data_dir: Path, tmp_path: Path):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    made = summary["provenance"]
    assert list(summary)[:2] == ["prompt_version", "provenance"]
    assert made["dxi_version"] == dxi.__version__
    assert made["python"] == f"{platform.python_version()} ({platform.python_implementation()})"
    assert made["platform"] == platform.platform()
    root = provenance.ROOT
    if (root / ".git").exists() and shutil.which(
        "git"
    ):  # run from this checkout (as the tests are)
        assert made["git"] == {
            "commit": git(root, "rev-parse", "HEAD"),
            "dirty": bool(git(root, "status", "--porcelain", "--untracked-files=no")),
        }
    else:
        assert made["git"] is None
    target = tmp_path / "eee"
    selection = rescore.select(PlanInputs(data_dir=data_dir, cache_dir=tmp_path / "cache"))
    assert export.export(selection, "eee", target).exit_code == 0
    for path in target.rglob("*.json"):
        library = orjson.loads(path.read_bytes())["eval_library"]
        assert library["name"] == "dxi" and library["version"] == dxi.__version__
        details = library["additional_details"]
        assert (details["python"], details["platform"]) == (made["python"], made["platform"])
        if made["git"]:
            assert (details["git_commit"], details["git_dirty"]) == (
                made["git"]["commit"],
                str(made["git"]["dirty"]).lower(),
            )
    assert MODEL in summary["models"][0]["model"]


def test_the_export_names_the_hub_revision_of_fetched_data():
    from dxi.runner.export import _source_data

    data = {
        "files": [
            {
                "path": "when2call/when2call_test_mcq.jsonl",
                "sha256": "f" * 64,
                "rows": 3,
                "hf_repo": "nvidia/When2Call",
                "revision": "b" * 40,
                "requested_revision": "main",
            }
        ],
        "tasks": 3,
    }
    details = _source_data("when2call", data)["additional_details"]
    assert (details["hf_revision"], details["hf_requested_revision"], details["sha256"]) == (
        "b" * 40,
        "main",
        "f" * 64,
    )
    plain = dict(
        data, files=[{"path": "w.jsonl", "sha256": "f" * 64, "rows": 3}]
    )  # not fetched: no revision claimed
    assert "hf_revision" not in _source_data("when2call", plain)["additional_details"]
