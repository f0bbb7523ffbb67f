"""The test suite's own layout: shared code lives in ``tests/helpers/`` (each module saying what it
holds), never in a test file another test file imports; ``pytest --fast`` (``make test-fast``)
leaves out every test marked as starting a server or a process, or slow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import FAST_EXCLUDES

TESTS = Path(__file__).parent


def imported_test_modules(path: Path) -> set[str]:
    """The test modules (``test_*``) that the module at ``path`` imports, relatively or as
    ``tests.``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            name = node.module.removeprefix("tests.") if node.level == 0 else node.module
            if (node.level > 0 or node.module.startswith("tests.")) and name.split(".")[
                -1
            ].startswith("test_"):
                found.add(name)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tests.test_")}
    return found


def test_no_test_file_imports_another():
    assert {
        p.name: imported_test_modules(p)
        for p in sorted(TESTS.glob("test_*.py"))
        if imported_test_modules(p)
    } == {}


def test_the_check_sees_each_way_of_importing_a_test_file(tmp_path: Path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "from .test_cli import MODEL\nfrom tests.test_view import get\nimport tests.test_batch\n"
        "from .helpers.runs import run_plan\nfrom . import wire_formats\n"
    )
    assert imported_test_modules(planted) == {"test_cli", "test_view", "tests.test_batch"}


def test_every_helper_module_says_what_it_holds():
    modules = sorted((TESTS / "helpers").rglob("*.py"))
    assert len(modules) >= 8
    assert [
        p.relative_to(TESTS).as_posix()
        for p in modules
        if not ast.get_docstring(ast.parse(p.read_text()))
    ] == []


@pytest.mark.parametrize("mark", FAST_EXCLUDES)
def test_every_mark_fast_leaves_out_is_registered(mark: str, pytestconfig: pytest.Config):
    registered = {
        line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")
    }
    assert mark in registered
