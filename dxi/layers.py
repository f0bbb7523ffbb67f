"""Which part of dxi may import which: the layering, written once, checked by tests/test_layers.py and printed
in docs/architecture.md (``table()``; the test asserts the page shows it as it is here).

A *unit* is a top-level folder installed under ``dxi`` (``runner``, ``adapters``, ...: every module under it
and its subfolders) or one module of the ``dxi`` package itself (``dxi.lazy``, ``dxi.hosts``, ...). ``RULES``
maps each unit to the units its modules may import; a unit always imports itself. Every import counts:
at the top of a module, inside a function (deferred for start-up time), under ``TYPE_CHECKING``, and a
module named to ``dxi.lazy.LazyModule`` or ``importlib.import_module`` as a literal. The one
exception is the block ``if __name__ == "__main__":``, which runs only when the module is the program.

The rules read bottom-up: the leaves (``dxi.lazy``, ``dxi.hosts``) import only the standard library and third
parties; ``evals`` and ``cache`` stand on them; ``adapters`` (the wire formats) and ``scoring`` read tasks
from ``evals`` and never each other, nor ``runner`` (``scoring`` takes from ``cache`` the rule of which of a
request's rows counts, ``cache.index.newest``); ``report`` and ``view`` present scoring's tables
(``view`` also reads the cache); ``runner`` (the scheduler, the command line, the distributed code) uses them
all; ``dxi.__main__`` is the program's entry. ``dxi.embedded_worker`` runs in the embedded model's worker
processes (``adapters.embedded`` starts them) and imports nothing of dxi (each worker would pay for it at
start-up)."""
from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

LEAVES = ("dxi.hosts", "dxi.lazy")

RULES: dict[str, tuple[str, ...]] = {
    "dxi.hosts": (),
    "dxi.lazy": (),
    "dxi.layers": (),
    "dxi.embedded_worker": (),
    "evals": LEAVES,
    "cache": LEAVES,
    "adapters": ("evals", "dxi.embedded_worker", *LEAVES),
    "scoring": ("cache", "evals", *LEAVES),
    "report": ("scoring", "evals", *LEAVES),
    "view": ("scoring", "cache", "evals", *LEAVES),
    "runner": ("view", "report", "scoring", "adapters", "cache", "evals", *LEAVES),
    "dxi.__main__": ("runner",),
}

FOLDERS = ("runner", "adapters", "scoring", "cache", "evals", "report", "view")  # installed as dxi.<folder>


def unit_of(module: str, folders: Iterable[str] = FOLDERS) -> str | None:
    """The unit of a dotted module name (``dxi.runner.cli`` -> ``runner``, ``dxi.lazy`` -> ``dxi.lazy``), given
    the installed ``folders``; None for a module outside dxi and for the ``dxi`` package itself (its
    ``__init__`` imports nothing)."""
    parts = module.split(".")
    if parts[0] != "dxi" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in folders else f"dxi.{parts[1]}"


def _is_main_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators))


def imports(source: str, module: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every dxi module or package that ``source`` (the text of module ``module``,
    e.g. ``dxi.view.app``; a package's ``__init__`` as ``dxi.cache.__init__``) imports, relative imports
    resolved; ``from dxi import adapters`` names ``dxi.adapters``. Raises SyntaxError for text that is not
    Python."""
    package = module.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_main_block(child):
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    name = ".".join([*base, child.module] if child.module else base)
                else:
                    name = child.module or ""
                if name == "dxi" or not child.module:  # from dxi import adapters; from .. import scoring
                    found.extend((child.lineno, f"{name}.{alias.name}") for alias in child.names)
                else:
                    found.append((child.lineno, name))
            elif isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant) \
                    and isinstance(child.args[0].value, str):
                func = child.func
                called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if called in ("LazyModule", "import_module"):
                    found.append((child.lineno, child.args[0].value))
            visit(child)

    visit(ast.parse(source))
    return [(line, name) for line, name in found if name == "dxi" or name.startswith("dxi.")]


def violations(graph: Iterable[tuple[str, int, str]], rules: Mapping[str, Iterable[str]] = RULES) -> list[str]:
    """The imports of ``graph`` (``(importing module, line, imported module)``, dotted names under ``dxi``)
    that ``rules`` forbid, one sentence each (``"dxi.view.app:33 imports dxi.adapters.http: view may import
    only ..."``); empty when none does. A module whose unit has no rule is itself reported: a new folder or
    ``dxi`` module is placed in the layering before it imports anything."""
    found = []
    folders = {*FOLDERS, *(unit for unit in rules if not unit.startswith("dxi."))}
    for importer, line, imported in graph:
        source, target = unit_of(importer, folders), unit_of(imported, folders)
        if source is None or target is None or source == target:
            continue
        if source not in rules:
            found.append(f"{importer}:{line}: {source} has no rule in dxi.layers.RULES")
        elif target not in rules[source]:
            allowed = ", ".join(rules[source]) or "nothing of dxi"
            found.append(f"{importer}:{line} imports {imported}: {source} may import only {allowed}")
    return found


def module_name(path: Path, root: Path) -> str:
    """The dotted name a file of the source tree is installed under (``root/view/app.py`` -> ``dxi.view.app``,
    ``root/dxi/lazy.py`` -> ``dxi.lazy``, ``root/cache/__init__.py`` -> ``dxi.cache``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "dxi" else ["dxi", *parts])


def source_files(root: Path) -> list[Path]:
    """Every module of dxi in the source tree ``root`` (the repository): ``dxi/`` and the installed folders."""
    return sorted(p for top in ("dxi", *FOLDERS) for p in (root / top).rglob("*.py"))


def graph(root: Path) -> list[tuple[str, int, str]]:
    """The import graph of the source tree ``root``: ``(importing module, line, imported module)``."""
    edges = []
    for path in source_files(root):
        module = module_name(path, root)
        # a package's __init__ resolves relative imports against itself, a module against its package
        text = path.read_text()
        name = module + ".__init__" if path.name == "__init__.py" else module
        edges.extend((module, line, imported) for line, imported in imports(text, name))
    return edges


def table() -> str:
    """The rules as the text block docs/architecture.md shows: one line per unit, ``unit  may import``."""
    width = max(map(len, RULES)) + 2
    return "\n".join(f"{unit:<{width}}{', '.join(allowed) or '(nothing of dxi)'}" for unit, allowed in RULES.items())
