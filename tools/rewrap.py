"""Re-wrap the docstrings and ``#`` comments that ``ruff format`` leaves over the line length.

``ruff format`` lays out code but never re-flows prose: a docstring paragraph or a comment block
stays as long as it was written. This tool re-fills, with the same words in the same order, only the
paragraphs that hold a line over ``--width`` (default 100, pyproject's ``[tool.ruff] line-length``):

* docstring paragraphs (every string statement: module, class and function docstrings and the
  strings under attributes), keeping their indentation, the hanging indent of ``-``/``*``/``1.``
  list items and blank lines; indented blocks (code, trees, doctests ``>>>``, tables, aligned
  columns, Markdown code fences) are never joined or split;
* blocks of full-line comments, with the same column and ``#`` prefix; a section rule
  (``# ---- name -----``) is shortened instead; ``#!``, ``# noqa``, ``# type:``, ``# fmt:`` and
  ``# pragma`` lines are left alone;
* a comment at the end of a code line that is too long with it but fits without it moves above that
  line (at the line's indentation), unless a comment line is already there.

A word longer than the width (a URL, a long ``code`` span) gets a line of its own and is never
broken; a line never starts with a word that would read as a list marker. Nothing else is touched:
other string literals, code, and paragraphs whose lines all fit. Each file's syntax tree is compared
before and after (docstrings with their whitespace normalised; comments are not in the tree); a file
whose tree would differ is left as it was and reported, and the tool exits 1.

Usage (from the repository root; ``make format`` runs ``ruff format``, this, ``ruff format``)::

    python tools/rewrap.py [PATH ...]            # re-wrap in place (default: .)
    python tools/rewrap.py --check [PATH ...]    # exit 1 if a file would change (make lint, CI)
    python tools/rewrap.py --report [PATH ...]   # the lines still too long, by kind
    python tools/rewrap.py --budget 1 [PATH ...] # exit 1 if over 1% of the lines are too long

Running it twice changes nothing the second time (tests/test_rewrap.py).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

WIDTH = 100
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "site", "node_modules", "__pycache__", "out"}

# a list item's marker: "- ", "* ", "+ ", "• ", "1. ", "2) ", "(a) "
MARKER = re.compile(r"([-*+•]|\d{1,3}[.)]|\([a-z0-9]{1,3}\))(?=\s)")
# a line kept as written: a doctest, a table row, a tree, aligned columns, a heading rule, a
# directive
VERBATIM = re.compile(r"^\s*(>>>|\.\.\. |\||[│├└┌┐┘┬┴┼─]|\.\. |[-=~^*#]{3,}\s*$)|\S {3,}\S")
FENCE = re.compile(r"(`{3,}|~{3,})[\w+-]*$")  # a Markdown code fence: ``` or ```python
WORD = re.compile(r"``[^`\s][^`]{0,38}?``\S*|\S+")  # a short ``code`` span stays on one line
RULE = re.compile(r"^(#+ ?[-=]{2,} .*?\S) ?([-=])\2{3,}$")  # "# ---- name -----": a section rule
KEEP = re.compile(r"#!|#\s*(noqa|type:|fmt:|pragma|pyright:|mypy:|-\*-)", re.I)
TRAILING_KEEP = re.compile(r"#\s*(noqa|type:|fmt:|pragma|pyright:|mypy:|completed:)", re.I)


@dataclass
class Unit:
    """A paragraph or list item that may be re-filled: lines ``first`` to ``last`` (indices into the
    block's lines), the first line's lead (its text before the first word) and the
    continuation's."""

    first: int
    last: int
    lead: str
    hang: str


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def units(lines: list[str], base: int, first_lead: str | None = None) -> list[Unit]:
    """The paragraphs and list items of ``lines`` (a docstring's or a comment block's text, without
    the ``#``) whose text starts at column ``base``, in order; a list item may start deeper (a
    nested list). ``first_lead``: line 0's text before its first word when it is not spaces (a
    docstring's opening quotes); line 0 then counts as starting at ``base``. Lines of indented,
    fenced or verbatim blocks belong to no unit."""
    out: list[Unit] = []
    current: Unit | None = None
    fenced = doctest = False
    for i, line in enumerate(lines):
        own = line[len(first_lead) :] if i == 0 and first_lead is not None else line
        text = own.strip()
        if FENCE.match(text):
            fenced, current = not fenced, None
            continue
        if not text or fenced:
            current, doctest = None, doctest and bool(text)
            continue
        if doctest or VERBATIM.search(own) or "\t" in line:
            doctest = doctest or text.startswith(">>>")
            current = None
            continue
        indent = base if i == 0 and first_lead is not None else _indent(line)
        lead = first_lead if i == 0 and first_lead is not None else " " * indent
        marker = MARKER.match(text)
        if marker and indent >= base:
            rest = text[marker.end() :]
            hang = " " * (indent + marker.end() + len(rest) - len(rest.lstrip(" ")))
            current = Unit(i, i, lead + text[: len(hang) - indent], hang)
            out.append(current)
        elif current is not None and indent == len(current.hang):
            current.last = i
        elif indent == base:
            current = Unit(i, i, lead, " " * base)
            out.append(current)
        else:  # deeper than the paragraph around it: a block kept as written
            current = None
    return out


def _bad_start(word: str) -> bool:
    """Whether a line starting with ``word`` would read as a list item or a line kept as written."""
    return bool(
        MARKER.match(word + " ")
        or VERBATIM.match(word + " x")
        or VERBATIM.match(word)
        or FENCE.match(word)
    )


def fill(words: list[str], lead: str, hang: str, width: int) -> list[str]:
    """``words`` greedily into lines of at most ``width`` characters, the first starting with
    ``lead``, the others with ``hang``; a word too long for any line has one of its own. A line
    never starts with a word that would make it read as a list item (``_bad_start``): the word
    before goes down too."""
    lines: list[list[str]] = [[]]
    for word in words:
        line = lines[-1]
        size = len(lead if len(lines) == 1 else hang) + sum(len(w) + 1 for w in line) + len(word)
        if line and size > width:
            moved: list[str] = []
            while _bad_start(moved[0] if moved else word) and len(line) > 1:
                moved.insert(0, line.pop())
            lines.append([*moved, word])
        else:
            line.append(word)
    return [(lead if n == 0 else hang) + " ".join(line) for n, line in enumerate(lines)]


def rewrap_lines(
    lines: list[str],
    width: int,
    base: int,
    first_lead: str | None = None,
    long: Iterable[int] | None = None,
) -> list[str]:
    """``lines`` with every unit (``units``) that holds a line over ``width`` (or one of the indices
    ``long``) re-filled; the rest as given."""
    over = set(long) if long is not None else {i for i, x in enumerate(lines) if len(x) > width}
    out = list(lines)
    for unit in reversed(units(lines, base, first_lead)):
        if not over & set(range(unit.first, unit.last + 1)):
            continue
        chunk = lines[unit.first : unit.last + 1]
        words = WORD.findall(" ".join([chunk[0][len(unit.lead) :], *chunk[1:]]))
        out[unit.first : unit.last + 1] = fill(words, unit.lead, unit.hang, width)
    return out


@dataclass
class Edit:
    """Replace physical lines ``start`` to ``end`` (0-based, inclusive) with ``lines``."""

    start: int
    end: int
    lines: list[str]


def _chars(line: str, offset: int) -> int:
    """The character column of the UTF-8 byte ``offset`` in ``line`` (``ast`` counts bytes)."""
    return len(line.encode()[:offset].decode())


def _docstrings(tree: ast.AST) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.value


def docstring_edits(lines: list[str], tree: ast.AST, width: int) -> Iterator[Edit]:
    """Re-filled docstring paragraphs. A docstring is handled when it is one triple-quoted string
    (no implicit concatenation), with no tab and no backslash at a line's end."""
    for node in _docstrings(tree):
        start, end = node.lineno - 1, node.end_lineno - 1
        physical = lines[start : end + 1]
        if not any(len(x) > width for x in physical):
            continue
        col = _chars(lines[start], node.col_offset)
        match = re.match(r"[rRuU]?(\'\'\'|\"\"\")", lines[start][col:])
        closing = _chars(lines[end], node.end_col_offset) - 3
        if not match or lines[end][closing : closing + 3] != match.group(1):
            continue
        if "\t" in "".join(physical) or any(x.endswith("\\") for x in physical[:-1]):
            continue
        text = list(physical)
        first = lines[start][: closing if start == end else None]
        lead = first[: col + match.end()] + re.match(r" *", first[col + match.end() :]).group()
        # closing quotes after text belong to the last word; on a line of their own they stay there
        glued = start == end or bool(physical[-1][:closing].strip())
        if not glued:
            text[-1] = ""
        base = min((_indent(x) for x in text[1:] if x.strip()), default=col)
        over = {i for i, x in enumerate(physical) if len(x) > width}
        new = rewrap_lines(text, width, base, lead, over)
        if not glued:
            new[-1] = physical[-1]
        if new != physical:
            yield Edit(start, end, new)


def _comment_blocks(source: str, alone: set[int] = frozenset()) -> Iterator[tuple[int, int, int]]:
    """(first line, last line, column) of each run of full-line comments at one column (0-based);
    a line in ``alone`` (an end comment just moved) is a block of its own."""
    rows = {
        tok.start[0] - 1: tok.start[1]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip()
    }
    block: list[int] = []
    for row in sorted(rows):
        if block and (
            row != block[-1] + 1 or rows[row] != rows[block[0]] or {row, block[-1]} & alone
        ):
            yield block[0], block[-1], rows[block[0]]
            block = []
        block.append(row)
    if block:
        yield block[0], block[-1], rows[block[0]]


def _fill_comments(texts: list[str], col: int, prefix: str, width: int) -> list[str]:
    """A run of comment lines' texts (after ``prefix``) re-filled, as lines at column ``col``."""
    base = min((_indent(t) for t in texts if t.strip()), default=1)
    return [
        (" " * col + prefix + t).rstrip()
        for t in rewrap_lines(texts, width - col - len(prefix), base)
    ]


def comment_edits(
    source: str, lines: list[str], width: int, alone: set[int] = frozenset()
) -> Iterator[Edit]:
    """Re-filled comment paragraphs and shortened section rules. A block is cut into runs of lines
    with one prefix (``#`` or ``#:``); lines ``KEEP`` matches stay as written."""
    for start, end, col in _comment_blocks(source, alone):
        block = lines[start : end + 1]
        if not any(len(x) > width for x in block):
            continue
        new: list[str] = []
        run: list[str] = []
        prefix = ""
        for line in block:
            comment = line[col:]
            own = re.match(r"#:?", comment).group()
            rule = RULE.match(comment)
            if KEEP.match(comment) or rule or own != prefix:
                new += _fill_comments(run, col, prefix, width) if run else []
                run = []
            dashes = width - col - len(rule.group(1)) - 1 if rule else 0
            if KEEP.match(comment) or (rule and len(line) <= width):
                new.append(line)
            elif rule and dashes >= 4:
                new.append(" " * col + rule.group(1) + " " + rule.group(2) * dashes)
            elif (
                rule
            ):  # a title too long for a rule: the rule's end goes, the title is filled as text
                prefix = own
                run.append(rule.group(1)[len(own) :])
            else:
                prefix = own
                run.append(comment[len(own) :])
        new += _fill_comments(run, col, prefix, width) if run else []
        if new != block:
            yield Edit(start, end, new)


def trailing_edits(source: str, lines: list[str], width: int) -> Iterator[Edit]:
    """A too-long line's end comment moved above it when the line fits without it (below it, into
    the block, when the line opens a block: ``else:  # why``). Left where it is when the line goes
    on a line before (a string, a backslash), starts with a closing bracket, or when a comment is
    already next to where it would go (it would read as part of that one)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    commented = {t.start[0] - 1 for t in tokens if t.type == tokenize.COMMENT}
    continued = {r for t in tokens for r in range(t.start[0], t.end[0])}  # 0-based, after the first
    for tok in tokens:
        if tok.type != tokenize.COMMENT or not tok.line[: tok.start[1]].strip():
            continue
        row = tok.start[0] - 1
        code = lines[row][: tok.start[1]].rstrip()  # tokenize counts characters
        if (
            len(lines[row]) <= width
            or len(code) > width
            or TRAILING_KEEP.match(tok.string)
            or row in continued
            or code.lstrip()[:1] in ")]}"
            or (row > 0 and lines[row - 1].endswith("\\"))
        ):
            continue
        below = _indent(lines[row + 1]) if row + 1 < len(lines) else 0
        if code.endswith(":") and below > _indent(code):  # a block's header: first in the block
            if row + 1 not in commented:
                yield Edit(row, row, [code, " " * below + tok.string])
        elif row - 1 not in commented:
            yield Edit(row, row, [" " * _indent(code) + tok.string, code])


def normalised(tree: ast.AST) -> str:
    """``ast.dump`` of ``tree`` with every string statement's whitespace runs made one space."""
    for node in _docstrings(tree):
        node.value = " ".join(node.value.split())
    return ast.dump(tree)


def _apply(lines: list[str], edits: list[Edit]) -> list[str]:
    out = list(lines)
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        out[edit.start : edit.end + 1] = edit.lines
    return out


def rewrap(source: str, width: int = WIDTH) -> str:
    """``source`` with its docstrings and comments re-wrapped to ``width``. Raises ValueError when
    the result's syntax tree differs from the source's (a bug of this tool: nothing is written)."""
    lines = source.split("\n")
    if all(len(line) <= width for line in lines):
        return source
    moved = sorted(trailing_edits(source, lines, width), key=lambda e: e.start)
    # where each moved comment lands, counting the lines the moves above it added
    alone = {e.start + n + (not e.lines[0].lstrip().startswith("#")) for n, e in enumerate(moved)}
    lines = _apply(lines, moved)
    text = "\n".join(lines)
    edits = list(docstring_edits(lines, ast.parse(text), width))
    taken = {r for e in edits for r in range(e.start, e.end + 1)}
    edits += [
        e
        for e in comment_edits(text, lines, width, alone)
        if not taken & set(range(e.start, e.end + 1))
    ]
    result = "\n".join(_apply(lines, edits))
    if result != source and normalised(ast.parse(result)) != normalised(ast.parse(source)):
        raise ValueError("re-wrapping would change the code")
    return result


def python_files(paths: Iterable[Path]) -> list[Path]:
    """The ``.py`` files under ``paths``, without virtual environments, build outputs and hidden
    folders."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
            continue
        for p in sorted(path.rglob("*.py")):
            parts = p.relative_to(path).parts[:-1]
            if not any(part in SKIP_DIRS or part.startswith(".") for part in parts):
                found.append(p)
    return found


def long_lines(source: str, width: int = WIDTH) -> list[tuple[int, str]]:
    """(line number from 1, kind) of each line over ``width``; kinds: docstring, comment, trailing
    comment, string (a literal in code), code."""
    doc = {r for n in _docstrings(ast.parse(source)) for r in range(n.lineno, n.end_lineno + 1)}
    strings: set[int] = set()
    comments: dict[int, bool] = {}  # line -> a full-line comment (True) or an end comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING or tok.type in (
            getattr(tokenize, "FSTRING_START", -1),
            getattr(tokenize, "FSTRING_MIDDLE", -1),
        ):
            strings.update(range(tok.start[0], tok.end[0] + 1))
        elif tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = not tok.line[: tok.start[1]].strip()
    found = []
    for n, line in enumerate(source.splitlines(), 1):
        if len(line) > width:
            if n in doc:
                kind = "docstring"
            elif n in comments:
                kind = "comment" if comments[n] else "trailing comment"
            else:
                kind = "string" if n in strings else "code"
            found.append((n, kind))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/rewrap.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[Path(".")])
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a file would change"
    )
    parser.add_argument(
        "--report", action="store_true", help="print the lines still over the width, by kind"
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="PERCENT",
        help="change nothing; exit 1 if more than PERCENT%% of the lines are over the width",
    )
    args = parser.parse_args(argv)
    files = python_files(args.paths)
    if args.report or args.budget is not None:
        total, kinds = 0, Counter()
        for path in files:
            source = path.read_text(encoding="utf-8")
            total += len(source.splitlines())
            for n, kind in long_lines(source, args.width):
                kinds[kind] += 1
                if args.report:
                    print(f"{path}:{n}: {kind}")
        over = sum(kinds.values())
        share = 100 * over / max(total, 1)
        print(
            f"{over} of {total} lines over {args.width} columns ({share:.2f}%): "
            + ", ".join(f"{k} {v}" for k, v in kinds.most_common())
        )
        return 1 if args.budget is not None and share > args.budget else 0
    changed, failed = [], []
    for path in files:
        source = path.read_text(encoding="utf-8")
        try:
            result = rewrap(source, args.width)
        except (ValueError, SyntaxError, tokenize.TokenError) as exc:
            failed.append(f"{path}: {exc}")
            continue
        if result != source:
            changed.append(path)
            if not args.check:
                path.write_text(result, encoding="utf-8")
    for line in failed:
        print(f"error: {line}; left as it was", file=sys.stderr)
    for path in changed:
        print(f"{'would re-wrap' if args.check else 're-wrapped'} {path}")
    return 1 if failed or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
