"""Provenance: what produced a result, so that a published number can be reproduced exactly.

``provenance()`` is summary.json's ``provenance`` block (and the Every Eval Ever export's
``eval_library``): the ``dxi_version`` installed, the ``git`` state of the checkout ``dxi`` runs
from (``{"commit", "dirty"}``: the commit of HEAD, and whether tracked files differ from it; null
when ``dxi`` is not run from a git checkout, e.g. installed from a wheel, or git cannot say), the
``python`` version and implementation, and the ``platform``. The data's own provenance (each file's
sha256 and, for files ``dxi data fetch`` downloaded, the hub revision) is in the summary's ``data``
block (``evals``).

git is asked once per process, and only for a result (scoring), never on the request path:
``dxi run`` asks on the thread that prepares the scoring while its requests are on the wire
(``session.prepare_scoring``; git, the version's metadata and ``platform.platform()`` took ~0.2 s
together on a loaded machine), so neither its start-up nor its tail waits for it; ``dxi score`` asks
when it scores.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path

ROOT = (
    Path(__file__).resolve().parent.parent
)  # the folder holding runner/, scoring/, ...: a checkout's top
GIT_TIMEOUT_S = 10.0


def provenance() -> dict:
    """summary.json's ``provenance`` block: ``dxi_version``, ``git`` (``{"commit", "dirty"}`` or
    null), ``python`` ("3.11.7 (CPython)"), ``platform`` (``platform.platform()``, e.g.
    "Linux-6.1-x86_64-with-glibc2.36"). A new dict on each call; what it holds is looked up once per
    process (``_facts``)."""
    version, git, python, system = _facts()
    return {
        "dxi_version": version,
        "git": dict(git) if git else None,
        "python": python,
        "platform": system,
    }


@functools.cache
def _facts() -> tuple[str, dict | None, str, str]:
    import dxi

    return (
        dxi.__version__,
        git_state(ROOT),
        f"{platform.python_version()} ({platform.python_implementation()})",
        platform.platform(),
    )


@functools.lru_cache(maxsize=4)
def git_state(root: Path) -> dict | None:
    """``{"commit": sha of HEAD, "dirty": tracked files modified (staged or not)}`` of the git
    checkout at ``root``, or None when ``root`` is not the top of one (no ``.git`` there: an
    installed package, a source archive) or git is missing or fails (within ``GIT_TIMEOUT_S``
    seconds). Untracked files do not make a tree dirty (``git status --untracked-files=no``):
    outputs and caches live beside the code."""
    if not (
        root / ".git"
    ).exists():  # a folder, or a file in a worktree: never ask git about a parent folder
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}
