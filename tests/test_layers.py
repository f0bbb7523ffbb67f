"""The layering as a test (``dxi.layers``): no module imports across it, a planted sideways import
is caught, and docs/architecture.md shows the rules as they are and names every module."""

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
    assert layers.unknown(ROOT) == []


def test_the_layering_reads_every_folder_pyproject_installs():
    folders = set(layers.installed(ROOT).values())
    assert folders == {"dxi", *layers.FOLDERS}
    assert set(layers.python_folders(ROOT)) == folders
    read = {p.relative_to(ROOT).parts[0] for p in layers.source_files(ROOT)}
    assert read == folders


def test_runner_s_stages_are_units_in_the_order_data_flows():
    assert layers.unit_of("dxi.runner.sending.limits") == "runner.sending"
    assert layers.unit_of("dxi.runner.cli") == "runner.cli"
    assert layers.unit_of("dxi.runner.session") == "runner"
    assert layers.unit_of("dxi.runner") == "runner"
    stages = [
        "runner.errors",
        "runner.outputs",
        "runner.planning",
        "runner.sending",
        "runner.batch",
        "runner",
        "runner.commands",
        "runner.cli",
    ]
    for low, high in zip(stages, stages[1:], strict=False):
        assert low in layers.RULES[high] and high not in layers.RULES[low], (low, high)
    assert "runner.distributed" not in layers.RULES["runner.batch"]
    assert "runner.batch" not in layers.RULES["runner.distributed"]
    assert (
        "runner.sending" not in layers.RULES["runner.planning"]
    )  # planning sleeps and sends nothing


def test_every_unit_of_the_tree_has_a_rule_and_every_rule_a_unit():
    units = {layers.unit_of(layers.module_name(p, ROOT)) for p in layers.source_files(ROOT)} - {
        None
    }
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
    assert order.index("scoring") < order.index("runner") and order.index("adapters") < order.index(
        "runner"
    )


def plant(root: Path, relpath: str, text: str) -> None:
    (root / relpath).parent.mkdir(parents=True, exist_ok=True)
    (root / relpath).write_text(text)


def test_a_planted_sideways_import_fails(tmp_path: Path):
    """Planted in a copy-shaped tree: each way of importing across the layers is reported, with
    module and line; the allowed ones and a ``__main__`` block are not."""
    plant(tmp_path, "scoring/__init__.py", "")
    plant(
        tmp_path,
        "scoring/ties.py",
        "from __future__ import annotations\n\nfrom dxi.adapters.decision import pick\n",
    )
    plant(tmp_path, "scoring/late.py", "def f():\n    from ..runner import plan\n    return plan\n")
    plant(
        tmp_path,
        "scoring/fine.py",
        "from dxi.evals import EVALS\nfrom . import ties\nimport polars\n",
    )
    plant(tmp_path, "view/app.py", "from dxi import adapters, scoring\n")
    plant(
        tmp_path, "adapters/http.py", "if __name__ == '__main__':\n    from dxi.runner import cli\n"
    )
    plant(
        tmp_path,
        "adapters/lazy.py",
        "from dxi.lazy import LazyModule\n\ncache = LazyModule('dxi.cache.store')\n",
    )
    plant(tmp_path, "cache/store.py", "import dxi.hosts\nimport dxi.scoring.sums\n")
    plant(tmp_path, "dxi/extra.py", "import dxi.lazy\n")
    found = layers.violations(layers.graph(tmp_path))
    allowed = {
        "adapters": "evals, dxi.embedded_worker, dxi.hosts, dxi.lazy, dxi.served, dxi.shown, dxi.stored",
        "scoring": "cache, evals, dxi.hosts, dxi.lazy, dxi.served, dxi.shown, dxi.stored",
        "view": "scoring, cache, evals, dxi.hosts, dxi.lazy, dxi.served, dxi.shown, dxi.stored",
        "cache": "dxi.hosts, dxi.lazy, dxi.served, dxi.shown, dxi.stored",
    }
    assert found == [
        f"dxi.adapters.lazy:3 imports dxi.cache.store: adapters may import only {allowed['adapters']}",
        f"dxi.cache.store:2 imports dxi.scoring.sums: cache may import only {allowed['cache']}",
        "dxi.extra:1: dxi.extra has no rule in dxi.layers.RULES",
        f"dxi.scoring.late:2 imports dxi.runner.plan: scoring may import only {allowed['scoring']}",
        f"dxi.scoring.ties:3 imports dxi.adapters.decision: scoring may import only {allowed['scoring']}",
        f"dxi.view.app:1 imports dxi.adapters: view may import only {allowed['view']}",
    ]


def test_a_planted_import_against_runner_s_stages_fails(tmp_path: Path):
    """Inside runner: a stage importing a later one is reported, by each way of naming it; the
    order's own imports are not."""
    plant(tmp_path, "runner/__init__.py", "")
    plant(
        tmp_path,
        "runner/sending/limits.py",
        "from dxi.runner import cli\nfrom ..planning.tokens import x\n",
    )
    plant(
        tmp_path,
        "runner/sending/retry.py",
        "def f():\n    from ..cli import main\n    return main\n",
    )
    plant(
        tmp_path,
        "runner/planning/plan.py",
        "from ..sending.scheduler import run\nfrom ..errors import E\n",
    )
    plant(tmp_path, "runner/batch/driver.py", "from dxi.runner.distributed import setup\n")
    plant(tmp_path, "runner/outputs/files.py", "from .. import session\n")
    plant(
        tmp_path,
        "runner/commands/run.py",
        "from .. import session\nfrom ..sending import scheduler\n",
    )
    plant(tmp_path, "runner/session.py", "from .commands import run\n")
    found = layers.violations(layers.graph(tmp_path))
    assert [f.split(": ")[0] for f in found] == [
        "dxi.runner.batch.driver:1 imports dxi.runner.distributed",
        "dxi.runner.outputs.files:1 imports dxi.runner.session",
        "dxi.runner.planning.plan:1 imports dxi.runner.sending.scheduler",
        "dxi.runner.sending.limits:1 imports dxi.runner.cli",
        "dxi.runner.sending.retry:2 imports dxi.runner.cli",
        "dxi.runner.session:1 imports dxi.runner.commands",
    ]
    assert found[3].endswith(
        "runner.sending may import only " + ", ".join(layers.RULES["runner.sending"])
    )


def test_a_planted_folder_the_layering_does_not_know_fails(tmp_path: Path):
    """A new top-level folder (``batches/``) is reported whether it imports anything or not: not
    installed, then installed without a rule; and its modules' imports are read."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(pyproject)
    for top in ("dxi", *layers.FOLDERS):
        plant(tmp_path, f"{top}/__init__.py", "")
    assert layers.unknown(tmp_path) == []
    plant(tmp_path, "batches/__init__.py", "")
    plant(tmp_path, "batches/open.py", "from dxi.cache import ledger\n")
    assert layers.unknown(tmp_path) == [
        "batches/ holds Python but pyproject.toml does not install it (nor is it in NOT_PRODUCT)"
    ]
    assert "batches" in {p.relative_to(tmp_path).parts[0] for p in layers.source_files(tmp_path)}
    assert layers.violations(layers.graph(tmp_path)) == [
        "dxi.batches.open:1: dxi.batches has no rule in dxi.layers.RULES"
    ]
    (tmp_path / "pyproject.toml").write_text(
        pyproject.replace(
            '"dxi.view" = "view"\n', '"dxi.view" = "view"\n"dxi.batches" = "batches"\n'
        )
    )
    assert layers.unknown(tmp_path) == [
        "batches/ is installed as dxi.batches but has no rule in dxi.layers.RULES"
    ]


def test_the_rule_function_on_a_synthetic_graph():
    rules = {"low": (), "high": ("low",)}
    graph = [
        ("dxi.high.a", 1, "dxi.low.b"),
        ("dxi.low.b", 7, "dxi.high.a"),
        ("dxi.low.b", 8, "dxi.low.c"),
        ("dxi.high.a", 2, "json"),
        ("dxi.new.x", 3, "dxi.low"),
    ]
    assert layers.violations(graph, rules) == [
        "dxi.low.b:7 imports dxi.high.a: low may import only nothing of dxi",
        "dxi.new.x:3: dxi.new has no rule in dxi.layers.RULES",
    ]


def test_relative_imports_are_resolved_against_the_module_s_package():
    text = "from . import a\nfrom .b import c\nfrom ..cache import store\nfrom .. import scoring\n"
    assert layers.imports(text, "dxi.view.app") == [
        (1, "dxi.view.a"),
        (2, "dxi.view.b"),
        (3, "dxi.cache"),
        (4, "dxi.scoring"),
    ]
    assert layers.imports("from .layout import x\n", "dxi.cache.__init__") == [
        (1, "dxi.cache.layout")
    ]


def test_the_architecture_page_shows_the_rules_as_they_are():
    text = ARCHITECTURE.read_text()
    block = re.search(r"^## Layers\n.*?^```text\n(.*?)^```$", text, re.M | re.S)
    assert block, "docs/architecture.md has no '## Layers' section with a text block"
    assert block.group(1).rstrip("\n") == layers.table()


@pytest.mark.parametrize(
    "path",
    [p.relative_to(ROOT) for p in layers.source_files(ROOT) if p.name != "__init__.py"],
    ids=str,
)
def test_the_architecture_page_names_every_module(path: Path):
    """Each module by its name (``index.py`` or ``index``), or its subfolder (``commands/``), in the
    line of its folder's part of the page: a new module is placed in the architecture when it is
    written."""
    text = ARCHITECTURE.read_text()
    names = [path.stem, path.name] + [f"{part}/" for part in path.parts[1:-1]]
    assert any(re.search(rf"(?<![\w./]){re.escape(n)}(?![\w])", text) for n in names), (
        f"docs/architecture.md does not name {path}"
    )
