"""The layering as a test (``dxi.layers``): no module imports across it, a planted sideways import is caught,
and docs/architecture.md shows the rules as they are and names every module."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dxi import layers

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_the_tree_keeps_the_layering():
    edges = layers.graph(ROOT)
    assert len(edges) > 300  # the graph was read: ~400 imports of dxi modules by dxi modules
    assert layers.violations(edges) == []


def test_every_unit_of_the_tree_has_a_rule_and_every_rule_a_unit():
    units = {layers.unit_of(layers.module_name(p, ROOT)) for p in layers.source_files(ROOT)} - {None}
    assert units == set(layers.RULES)
    assert all(set(allowed) <= set(layers.RULES) for allowed in layers.RULES.values())


def test_the_rules_are_layers_with_no_cycle():
    order: list[str] = []  # a topological order exists: each unit after everything it may import
    pending = dict(layers.RULES)
    while pending:
        ready = [u for u, allowed in pending.items() if set(allowed) <= set(order)]
        assert ready, f"a cycle among {sorted(pending)}"
        order += ready
        for u in ready:
            del pending[u]
    assert order.index("scoring") < order.index("runner") and order.index("adapters") < order.index("runner")


def plant(root: Path, relpath: str, text: str) -> None:
    (root / relpath).parent.mkdir(parents=True, exist_ok=True)
    (root / relpath).write_text(text)


def test_a_planted_sideways_import_fails(tmp_path: Path):
    """Planted in a copy-shaped tree: each way of importing across the layers is reported, with module and
    line; the allowed ones and a ``__main__`` block are not."""
    plant(tmp_path, "scoring/__init__.py", "")
    plant(tmp_path, "scoring/ties.py", "from __future__ import annotations\n\nfrom dxi.adapters.decision import pick\n")
    plant(tmp_path, "scoring/late.py", "def f():\n    from ..runner import plan\n    return plan\n")
    plant(tmp_path, "scoring/fine.py", "from dxi.evals import EVALS\nfrom . import ties\nimport polars\n")
    plant(tmp_path, "view/app.py", "from dxi import adapters, scoring\n")
    plant(tmp_path, "adapters/http.py", "if __name__ == '__main__':\n    from dxi.runner import cli\n")
    plant(tmp_path, "adapters/lazy.py", "from dxi.lazy import LazyModule\n\ncache = LazyModule('dxi.cache.store')\n")
    plant(tmp_path, "cache/store.py", "import dxi.hosts\nimport dxi.scoring.sums\n")
    plant(tmp_path, "dxi/extra.py", "import dxi.lazy\n")
    found = layers.violations(layers.graph(tmp_path))
    allowed = {"adapters": "evals, dxi.embedded_worker, dxi.hosts, dxi.lazy", "scoring": "cache, evals, dxi.hosts, dxi.lazy",
               "view": "scoring, cache, evals, dxi.hosts, dxi.lazy", "cache": "dxi.hosts, dxi.lazy"}
    assert found == [
        f"dxi.adapters.lazy:3 imports dxi.cache.store: adapters may import only {allowed['adapters']}",
        f"dxi.cache.store:2 imports dxi.scoring.sums: cache may import only {allowed['cache']}",
        "dxi.extra:1: dxi.extra has no rule in dxi.layers.RULES",
        f"dxi.scoring.late:2 imports dxi.runner: scoring may import only {allowed['scoring']}",
        f"dxi.scoring.ties:3 imports dxi.adapters.decision: scoring may import only {allowed['scoring']}",
        f"dxi.view.app:1 imports dxi.adapters: view may import only {allowed['view']}",
    ]


def test_the_rule_function_on_a_synthetic_graph():
    rules = {"low": (), "high": ("low",)}
    graph = [("dxi.high.a", 1, "dxi.low.b"), ("dxi.low.b", 7, "dxi.high.a"), ("dxi.low.b", 8, "dxi.low.c"),
             ("dxi.high.a", 2, "json"), ("dxi.new.x", 3, "dxi.low")]
    assert layers.violations(graph, rules) == ["dxi.low.b:7 imports dxi.high.a: low may import only nothing of dxi",
                                               "dxi.new.x:3: dxi.new has no rule in dxi.layers.RULES"]


def test_relative_imports_are_resolved_against_the_module_s_package():
    text = "from . import a\nfrom .b import c\nfrom ..cache import store\nfrom .. import scoring\n"
    assert layers.imports(text, "dxi.view.app") == [(1, "dxi.view.a"), (2, "dxi.view.b"), (3, "dxi.cache"),
                                                    (4, "dxi.scoring")]
    assert layers.imports("from .layout import x\n", "dxi.cache.__init__") == [(1, "dxi.cache.layout")]


def test_the_architecture_page_shows_the_rules_as_they_are():
    text = ARCHITECTURE.read_text()
    block = re.search(r"^## Layers\n.*?^```text\n(.*?)^```$", text, re.M | re.S)
    assert block, "docs/architecture.md has no '## Layers' section with a text block"
    assert block.group(1).rstrip("\n") == layers.table()


@pytest.mark.parametrize("path", [p.relative_to(ROOT) for p in layers.source_files(ROOT) if p.name != "__init__.py"],
                         ids=str)
def test_the_architecture_page_names_every_module(path: Path):
    """Each module by its name (``index.py`` or ``index``), or its subfolder (``commands/``), in the line of its
    folder's part of the page: a new module is placed in the architecture when it is written."""
    text = ARCHITECTURE.read_text()
    names = [path.stem, path.name] + [f"{part}/" for part in path.parts[1:-1]]
    assert any(re.search(rf"(?<![\w./]){re.escape(n)}(?![\w])", text) for n in names), \
        f"docs/architecture.md does not name {path}"
