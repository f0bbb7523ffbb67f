"""Which part of dxi may import which: the layering, written once, checked by tests/test_layers.py
and printed in docs/architecture.md (``table()``; the test asserts the page shows it as it is here).

A *unit* is a top-level folder installed under ``dxi`` (``runner``, ``adapters``, ...: every module
under it and its subfolders), one stage of ``runner`` (``runner.planning``, ..., ``RUNNER_UNITS``: a
sub-package, or the modules ``runner.errors`` and ``runner.cli``; the rest of ``runner``'s top
level, the library's entries, is the unit ``runner``) or one module of the ``dxi`` package itself
(``dxi.lazy``, ``dxi.hosts``, ...). ``RULES`` maps each unit to the units its modules may import; a
unit always imports itself. Every import counts: at the top of a module, inside a function (deferred
for start-up time), under ``TYPE_CHECKING``, and a module named to ``dxi.lazy.LazyModule`` or
``importlib.import_module`` as a literal. The one exception is the block
``if __name__ == "__main__":``, which runs only when the module is the program.

The rules read bottom-up: the leaves (``dxi.lazy``, ``dxi.hosts``, ``dxi.served``, ``dxi.shown``,
``dxi.stored``) import only the standard library and third parties; ``evals`` and ``cache`` stand on
them; ``adapters`` (the wire formats) and ``scoring`` read tasks from ``evals`` and never each
other, nor ``runner`` (``scoring`` takes from ``cache`` the rule of which of a request's rows
counts, ``cache.index.newest``); ``report`` and ``view`` present scoring's tables (``view`` also
reads the cache); ``runner`` (the scheduler, the command line, the distributed code) uses them all;
``dxi.__main__`` is the program's entry.

Inside ``runner`` the stages import in the order data flows: ``runner.errors`` (the exit codes,
imported everywhere) <- ``runner.outputs`` <- ``runner.planning`` (nothing sleeps or sends) <-
``runner.sending`` <- ``runner.batch`` and ``runner.distributed`` (neither imports the other) <-
``runner`` (the library's entries: session, dispatch, rescore, export, open_batches, signals, crash,
completion) <- ``runner.commands`` <- ``runner.cli``.

The tree read is every top-level folder holding Python but ``NOT_PRODUCT`` (``source_files``);
``unknown`` reports a folder that is neither installed by pyproject.toml nor known here, and an
installed one with no rule. ``dxi.embedded_worker`` runs in the embedded model's worker processes
(``adapters.embedded`` starts them) and imports nothing of dxi (each worker would pay for it at
start-up)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

LEAVES = ("dxi.hosts", "dxi.lazy", "dxi.served", "dxi.shown", "dxi.stored")
PACKAGES = (
    "dxi",
    "dxi.runner",
)  # packages whose __init__ holds nothing: a name imported from one is a module

_BELOW_RUNNER = ("view", "report", "scoring", "adapters", "cache", "evals", *LEAVES)

RULES: dict[str, tuple[str, ...]] = {
    "dxi.hosts": (),
    "dxi.lazy": (),
    "dxi.served": (),
    "dxi.shown": (),
    "dxi.stored": (),
    "dxi.layers": (),
    "dxi.embedded_worker": (),
    "evals": LEAVES,
    "cache": LEAVES,
    "adapters": ("evals", "dxi.embedded_worker", *LEAVES),
    "scoring": ("cache", "evals", *LEAVES),
    "report": ("scoring", "evals", *LEAVES),
    "view": ("scoring", "cache", "evals", *LEAVES),
    "runner.errors": (),
    "runner.outputs": ("runner.errors", *_BELOW_RUNNER),
    "runner.planning": ("runner.outputs", "runner.errors", *_BELOW_RUNNER),
    "runner.sending": ("runner.planning", "runner.outputs", "runner.errors", *_BELOW_RUNNER),
    "runner.batch": (
        "runner.sending",
        "runner.planning",
        "runner.outputs",
        "runner.errors",
        *_BELOW_RUNNER,
    ),
    "runner.distributed": (
        "runner.sending",
        "runner.planning",
        "runner.outputs",
        "runner.errors",
        *_BELOW_RUNNER,
    ),
    "runner": (
        "runner.batch",
        "runner.distributed",
        "runner.sending",
        "runner.planning",
        "runner.outputs",
        "runner.errors",
        *_BELOW_RUNNER,
    ),
    "runner.commands": (
        "runner",
        "runner.batch",
        "runner.distributed",
        "runner.sending",
        "runner.planning",
        "runner.outputs",
        "runner.errors",
        *_BELOW_RUNNER,
    ),
    "runner.cli": ("runner.commands", "runner", "runner.errors", *_BELOW_RUNNER),
    "dxi.__main__": ("runner.cli", "runner", "runner.errors"),
}

FOLDERS = (
    "runner",
    "adapters",
    "scoring",
    "cache",
    "evals",
    "report",
    "view",
)  # installed as dxi.<folder>
# runner's stages, each a unit: its sub-packages, and two of its top-level modules
# (dxi.runner.errors, .cli)
RUNNER_UNITS = (
    "errors",
    "outputs",
    "planning",
    "sending",
    "batch",
    "distributed",
    "commands",
    "cli",
)
# the top-level folders holding Python that are not installed (nor read for the layering)
NOT_PRODUCT = ("tests", "benchmarks", "tools", "examples", "docs", "site", "build", "dist")


def unit_of(module: str, folders: Iterable[str] = FOLDERS) -> str | None:
    """The unit of a dotted module name (``dxi.view.app`` -> ``view``, ``dxi.runner.session`` ->
    ``runner``, ``dxi.runner.sending.limits`` -> ``runner.sending``, ``dxi.runner.cli`` ->
    ``runner.cli``, ``dxi.lazy`` -> ``dxi.lazy``), given the installed ``folders``; None for a
    module outside dxi and for the ``dxi`` package itself (its ``__init__`` imports nothing)."""
    parts = module.split(".")
    if parts[0] != "dxi" or len(parts) == 1:
        return None
    if parts[1] == "runner" and len(parts) > 2 and parts[2] in RUNNER_UNITS:
        return f"runner.{parts[2]}"
    return parts[1] if parts[1] in folders else f"dxi.{parts[1]}"


def _is_main_block(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and any(
            isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators
        )
    )


def imports(source: str, module: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every dxi module or package that ``source`` (the text of module
    ``module``, e.g. ``dxi.view.app``; a package's ``__init__`` as ``dxi.cache.__init__``) imports,
    relative imports resolved; ``from dxi import adapters`` names ``dxi.adapters`` and
    ``from dxi.runner import cli`` ``dxi.runner.cli`` (the names imported from a package split into
    units, ``PACKAGES``, are its modules). Raises SyntaxError for text that is not Python."""
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
                    base = base[: len(base) - (child.level - 1)]
                    name = ".".join([*base, child.module] if child.module else base)
                else:
                    name = child.module or ""
                if (
                    name in PACKAGES or not child.module
                ):  # from dxi import adapters; from .. import scoring
                    found.extend((child.lineno, f"{name}.{alias.name}") for alias in child.names)
                else:
                    found.append((child.lineno, name))
            elif (
                isinstance(child, ast.Call)
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                func = child.func
                called = (
                    func.id
                    if isinstance(func, ast.Name)
                    else func.attr
                    if isinstance(func, ast.Attribute)
                    else ""
                )
                if called in ("LazyModule", "import_module"):
                    found.append((child.lineno, child.args[0].value))
            visit(child)

    visit(ast.parse(source))
    return [(line, name) for line, name in found if name == "dxi" or name.startswith("dxi.")]


def violations(
    graph: Iterable[tuple[str, int, str]], rules: Mapping[str, Iterable[str]] = RULES
) -> list[str]:
    """The imports of ``graph`` (``(importing module, line, imported module)``, dotted names under
    ``dxi``) that ``rules`` forbid, one sentence each (``"dxi.view.app:33 imports dxi.adapters.http:
    view may import only ..."``); empty when none does. An import of dxi by a module whose unit has
    no rule is reported too (``"dxi.new.x:3: dxi.new has no rule ..."``); a folder whose modules
    import nothing of dxi is ``unknown``'s to report."""
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
            found.append(
                f"{importer}:{line} imports {imported}: {source} may import only {allowed}"
            )
    return found


def module_name(path: Path, root: Path) -> str:
    """The dotted name a file of the source tree is installed under (``root/view/app.py`` ->
    ``dxi.view.app``, ``root/dxi/lazy.py`` -> ``dxi.lazy``, ``root/cache/__init__.py`` ->
    ``dxi.cache``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "dxi" else ["dxi", *parts])


def python_folders(root: Path) -> list[str]:
    """The top-level folders of the source tree ``root`` that hold Python (a ``.py`` file anywhere
    under them), but ``NOT_PRODUCT`` and hidden ones (``.venv``, ``.git``)."""
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and p.name not in NOT_PRODUCT
        and not p.name.endswith(".egg-info")
        and next(p.rglob("*.py"), None) is not None
    )


def installed(root: Path) -> dict[str, str]:
    """The top-level packages pyproject.toml (in ``root``) installs and their folders, from
    ``[tool.setuptools.package-dir]``: ``{"dxi": "dxi", "dxi.runner": "runner", ...}``. Raises
    FileNotFoundError without a pyproject.toml, KeyError without that table."""
    import tomllib

    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    return dict(table)


def unknown(root: Path) -> list[str]:
    """What the layering does not know in the source tree ``root``, one sentence each: a top-level
    folder holding Python that pyproject.toml does not install (nor ``NOT_PRODUCT``), and an
    installed folder that has no rule (not in ``FOLDERS``); empty when it knows every folder."""
    packages = installed(root)
    folders = set(packages.values())
    found = [
        f"{top}/ holds Python but pyproject.toml does not install it (nor is it in NOT_PRODUCT)"
        for top in python_folders(root)
        if top not in folders
    ]
    found += [
        f"{folder}/ is installed as {name} but has no rule in dxi.layers.RULES"
        for name, folder in sorted(packages.items())
        if folder != "dxi" and folder not in FOLDERS
    ]
    return found


def source_files(root: Path) -> list[Path]:
    """Every module of the source tree ``root`` (the repository) the layering reads: every top-level
    folder holding Python (``python_folders``: ``dxi/``, the installed folders, and any folder new
    to the tree, whose modules ``violations`` and ``unknown`` then report)."""
    return sorted(p for top in python_folders(root) for p in (root / top).rglob("*.py"))


def graph(root: Path) -> list[tuple[str, int, str]]:
    """The import graph of the source tree ``root``: ``(importing module, line, imported
    module)``."""
    edges = []
    for path in source_files(root):
        module = module_name(path, root)
        # a package's __init__ resolves relative imports against itself, a module against its
        # package
        text = path.read_text()
        name = module + ".__init__" if path.name == "__init__.py" else module
        edges.extend((module, line, imported) for line, imported in imports(text, name))
    return edges


def table() -> str:
    """The rules as the text block docs/architecture.md shows: one line per unit,
    ``unit  may import``."""
    width = max(map(len, RULES)) + 2
    return "\n".join(
        f"{unit:<{width}}{', '.join(allowed) or '(nothing of dxi)'}"
        for unit, allowed in RULES.items()
    )
