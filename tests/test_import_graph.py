"""The import graph of ``statekeeper``, read from the source with `ast` (nothing imported).

Every ``import`` statement counts, wherever it is: at module level, inside
``if TYPE_CHECKING:`` and inside functions. So neither a type-only import nor a lazy
function-level import can hide a cycle: a cycle must be fixed, not deferred. An edge
goes to the most specific statekeeper module named (``from a.b import c`` is an edge to
``a.b.c`` when that is a module, else to ``a.b``); importing a submodule is not counted
as importing its parent packages (Python runs those first, and ``statekeeper/__init__``
re-exports half the library, so counting it would make every module a cycle).

Checked:
- no cycle among statekeeper modules;
- no cycle among its top-level parts (``statekeeper.runs``, ``statekeeper.codec``, ...):
  imports point one way between layers, as in ``docs/architecture.md``;
- ``statekeeper.runtime`` and ``statekeeper.runs`` import no backend: of ``stores`` they
  use only the protocol (``statekeeper.stores``, ``statekeeper.stores.base``);
- every package's ``__all__`` names what it defines or imports.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import statekeeper

ROOT = Path(statekeeper.__file__).resolve().parent
BACKENDS = ("memory", "sqlite", "postgres", "redis", "files")
STORE_PROTOCOL = {"statekeeper.stores", "statekeeper.stores.base"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = ["statekeeper", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported(module: str, source: str, *, is_package: bool) -> Iterator[str]:
    """The statekeeper modules ``module`` imports, anywhere in its ``source``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [n if n in MODULES else base for n in names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import statekeeper.x.y` names y's module
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


def _graph() -> dict[str, set[str]]:
    return {
        module: set(
            _imported(
                module, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py"
            )
        )
        for module, path in MODULES.items()
    }


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str:
    return ".".join(module.split(".")[:2])


GRAPH = _graph()


def test_the_reader_sees_the_kinds_of_import_that_hide_cycles() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from statekeeper.runs.state import RunState\n"
        "def later():\n"
        "    import statekeeper.codec\n"
        "    from statekeeper.stores import base, open_store\n"
        "    from . import ids\n"
        "import json\n"
    )
    found = set(_imported("statekeeper.sessions.x", source, is_package=False))
    assert found == {
        "statekeeper.runs.state",
        "statekeeper.codec",
        "statekeeper.stores.base",
        "statekeeper.stores",
        "statekeeper.sessions",
    }
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(GRAPH) == []


def test_no_import_cycle_between_layers() -> None:
    layers: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        layers.setdefault(_layer(module), set()).update(
            _layer(t) for t in targets if _layer(t) != _layer(module)
        )
    assert _cycles(layers) == []
    assert "statekeeper.runs" not in layers["statekeeper.codec"]


@pytest.mark.parametrize("layer", ["statekeeper.runtime", "statekeeper.runs"])
def test_runtime_and_runs_use_only_the_store_protocol(layer: str) -> None:
    used = {
        (module, target)
        for module, targets in GRAPH.items()
        if module == layer or module.startswith(f"{layer}.")
        for target in targets
        if _layer(target) == "statekeeper.stores"
    }
    assert used, "expected some use of the store protocol"
    backends = {
        (module, target)
        for module, target in used
        if any(
            target == f"statekeeper.stores.{b}" or target.startswith(f"statekeeper.stores.{b}.")
            for b in BACKENDS
        )
    }
    assert backends == set()
    assert {target for _, target in used} <= STORE_PROTOCOL


@pytest.mark.parametrize(
    "package", sorted(m for m, p in MODULES.items() if p.name == "__init__.py")
)
def test_every_name_in_all_exists(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in getattr(module, "__all__", ()) if not hasattr(module, name)]
    assert missing == []
