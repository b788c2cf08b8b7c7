"""The house keeps its shape: every module of the package sits in a layer of the import
contract (lint-imports, run by ./test.sh, checks the order), there is no import cycle between
modules, and the Agent stays a composition root that no step imports.

A new top-level module or package that nobody placed in a layer would be checked by no
contract at all: this test is what makes "every module in a contract" hold.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "reconciler"


def contracts() -> list[dict[str, object]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["contracts"])


def top_layers() -> set[str]:
    """The names in the package-level layers contract (the one without containers)."""
    [main] = [c for c in contracts() if c["type"] == "layers" and not c.get("containers")]
    names: set[str] = set()
    for layer in main["layers"]:  # type: ignore[attr-defined]
        names.update(part.strip() for part in str(layer).replace(":", "|").split("|"))
    return names


def test_every_module_of_the_package_is_in_a_layer() -> None:
    placed = top_layers()
    tops = {f"reconciler.{p.stem}" for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    tops |= {f"reconciler.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert tops - placed == set(), "modules in no layer of pyproject.toml's import contract"
    assert placed - tops == set(), "layers that name no module"


def test_the_type_checking_imports_are_counted() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert tomllib.load(f)["tool"]["importlinter"]["exclude_type_checking_imports"] is False


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("reconciler", exclude_type_checking_imports=False, cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and not imported.startswith(module + ".") and not module.startswith(imported + ".") \
                    and graph.chain_exists(importer=imported, imported=module):
                cycles.append((module, imported))
    assert cycles == []


def test_nothing_imports_the_agent_but_the_edges() -> None:
    graph = grimp.build_graph("reconciler", exclude_type_checking_imports=False, cache_dir=None)
    importers = graph.find_modules_that_directly_import("reconciler.agent")
    assert {m.split(".")[1] for m in importers} <= {"cli", "daemon"}, sorted(importers)
