"""tools/rewrap.py, the docstring and comment re-wrapper ``make format`` runs after ``ruff format``:
exact before/after texts at a width of 40 columns, idempotence, the syntax-tree guard, and the
repository held to it (``ruff format --check`` and at most 1% of the lines over 100 columns)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("rewrap", ROOT / "tools" / "rewrap.py")
rewrap = sys.modules.setdefault("rewrap", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(rewrap)


def wrap(source: str) -> str:
    return rewrap.rewrap(source, width=40)


def test_a_docstring_list_keeps_its_hanging_indent_and_a_short_paragraph_is_left_as_written():
    before = '''def f():
    """One summary line that is much too long.

    A short one
    stays as it was.

    - an item whose text runs past the width
    - short
    1. numbered, also past the width here
    """
'''
    after = '''def f():
    """One summary line that is much too
    long.

    A short one
    stays as it was.

    - an item whose text runs past the
      width
    - short
    1. numbered, also past the width
       here
    """
'''
    assert wrap(before) == after
    assert wrap(after) == after


def test_closing_quotes_stay_on_the_last_word_and_an_unbreakable_url_gets_a_line_of_its_own():
    before = '''"""See https://example.com/a/very/long/path/that/cannot/break for it."""
'''
    after = '''"""See
https://example.com/a/very/long/path/that/cannot/break
for it."""
'''
    assert wrap(before) == after
    assert wrap(after) == after


def test_a_comment_block_keeps_its_column_and_prefix_and_a_rule_is_shortened():
    before = """def f():
    # a comment paragraph that is far too long for the width
    #
    # - a list item in a comment, also long
    return 1  # noqa: E501 (a trailing comment kept where it is)


# ---- section -------------------------------------------
"""
    after = """def f():
    # a comment paragraph that is far
    # too long for the width
    #
    # - a list item in a comment, also
    #   long
    return 1  # noqa: E501 (a trailing comment kept where it is)


# ---- section -------------------------
"""
    assert wrap(before) == after
    assert wrap(after) == after


def test_a_long_end_comment_moves_above_its_line_or_into_the_block_it_opens():
    before = """if x:  # the reason why the branch is taken here
    y = 1

z = 2  # why two and not three, at some length
"""
    after = """if x:
    # the reason why the branch is taken
    # here
    y = 1

# why two and not three, at some length
z = 2
"""
    assert wrap(before) == after
    assert wrap(after) == after
    beside = "# a comment of its own\nz = 2  # why two and not three, at some length\n"
    assert wrap(beside) == beside  # it would read as the comment above's second line


def test_blocks_kept_as_written_and_other_strings_are_never_touched():
    before = '''"""Intro.

    Tree
    ├── Retryable      retried with backoff and more words
    >>> f("a long doctest line, past the width of 40")
"""
X = "a string literal past the width of forty columns"
'''
    assert wrap(before) == before


def test_a_line_never_starts_with_a_word_that_reads_as_a_list_marker():
    source = '"""Costs are one thing, and the pricing - the other - are more words."""\n'
    after = '"""Costs are one thing, and the\npricing - the other - are more words."""\n'
    assert wrap(source) == after  # not "...the pricing" then "- the other ..." (a list item)
    assert wrap(after) == after


def test_widths_count_characters_not_bytes():
    source = '"""A × B − C ≥ D, counted in characters: twelve more words here."""\n'
    assert wrap(source) == '"""A × B − C ≥ D, counted in characters:\ntwelve more words here."""\n'


def test_the_tree_guard_normalises_docstring_whitespace_only():
    a = 'def f():\n    """Two  words\n    here."""\n    return "x  y"\n'
    b = 'def f():\n    """Two words here."""\n    return "x  y"\n'
    c = 'def f():\n    """Two words here."""\n    return "x y"\n'
    assert rewrap.normalised(ast.parse(a)) == rewrap.normalised(ast.parse(b))
    assert rewrap.normalised(ast.parse(b)) != rewrap.normalised(ast.parse(c))


def test_the_command_line_checks_and_rewrites(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text('"""' + "word " * 30 + '"""\n')
    tool = [sys.executable, str(ROOT / "tools" / "rewrap.py")]
    check = subprocess.run([*tool, "--check", str(tmp_path)], capture_output=True, text=True)
    assert check.returncode == 1 and check.stdout == f"would re-wrap {module}\n"
    assert subprocess.run([*tool, str(tmp_path)], capture_output=True).returncode == 0
    assert max(len(line) for line in module.read_text().splitlines()) <= 100
    assert subprocess.run([*tool, "--check", str(tmp_path)], capture_output=True).returncode == 0
    budget = subprocess.run([*tool, "--budget", "1", str(tmp_path)], capture_output=True, text=True)
    assert budget.returncode == 0 and budget.stdout.startswith("0 of 2 lines over 100 columns")


@pytest.mark.parametrize("check", ["format", "rewrap", "budget"])
def test_the_repository_is_formatted_and_at_most_1_percent_of_its_lines_are_over_100(check: str):
    """What ``make lint`` runs (issue 33): ``ruff format --check``, the re-wrapper's ``--check`` and
    the long-line budget, over the repository's Python files."""
    commands = {
        "format": [sys.executable, "-m", "ruff", "format", "--check", "."],
        "rewrap": [sys.executable, "tools/rewrap.py", "--check", "."],
        "budget": [sys.executable, "tools/rewrap.py", "--budget", "1", "."],
    }
    done = subprocess.run(commands[check], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_report_names_each_long_line_s_kind():
    long = "x" * 40
    source = (
        f'"""Doc.\n\n    {long}   {long}\n"""\n'  # aligned columns: kept as written
        f"# {long} {long}\n"
        f'X = "{long} {long}"\n'
        f"Y = 1  # {long} {long}\n"
        f"def {long}{long}(): pass\n"
    )
    assert rewrap.long_lines(source, width=40) == [
        (3, "docstring"),
        (5, "comment"),
        (6, "string"),
        (7, "trailing comment"),
        (8, "code"),
    ]
