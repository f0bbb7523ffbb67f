"""The test suite's own layout: shared code lives in ``tests/helpers/`` and ``tests/fakes/`` (each
module saying what it holds), never in a test file another test file imports nor beside the test
files at the top of ``tests/``; ``pytest --fast`` (``make test-fast``)
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


def stray_modules(tests: Path) -> list[str]:
    """The names of the Python modules at the top of ``tests`` that are neither a test file
    (``test_*.py``) nor ``conftest.py`` or ``__init__.py``: shared code that belongs in
    ``tests/helpers/`` or ``tests/fakes/``."""
    return sorted(
        p.name
        for p in tests.glob("*.py")
        if not p.name.startswith("test_") and p.name not in {"conftest.py", "__init__.py"}
    )


def test_no_shared_module_sits_beside_the_test_files():
    assert stray_modules(TESTS) == []


def test_the_check_sees_a_shared_module_beside_the_test_files(tmp_path: Path):
    for name in ("conftest.py", "__init__.py", "test_a.py", "fake_thing.py", "servers.py"):
        (tmp_path / name).write_text('"""x"""\n')
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "runs.py").write_text('"""x"""\n')
    assert stray_modules(tmp_path) == ["fake_thing.py", "servers.py"]


def test_every_helper_module_says_what_it_holds():
    modules = sorted((TESTS / "helpers").rglob("*.py")) + sorted((TESTS / "fakes").rglob("*.py"))
    assert len(modules) >= 20
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
