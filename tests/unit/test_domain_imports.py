"""The domain's import graph: no module imports presentation (or grpc), and no two domain
modules import each other, directly or around a circle. Every import counts, also one under
`if TYPE_CHECKING:` or inside a function: a circle there is still a circle in the design."""

from __future__ import annotations

import ast
from pathlib import Path

import registry_service.domain

DOMAIN = Path(registry_service.domain.__file__).parent
PACKAGE = "registry_service.domain"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            # `from registry_service.domain import catalog` names a module too
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path.name}: relative import (name the module in full)")
    return names


def domain_graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in DOMAIN.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {
            imported.removeprefix(f"{PACKAGE}.").split(".")[0]
            for imported in imported_modules(path)
            if imported.startswith(f"{PACKAGE}.")
        } & set(modules)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of module names (first == last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == "open":
                return [*stack[stack.index(successor) :], successor]
            if successor not in state:
                found = visit(successor)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_domain_module_imports_presentation_or_grpc() -> None:
    offenders = {
        path.name: sorted(
            m
            for m in imported_modules(path)
            if m.startswith("registry_service.presentation") or m.split(".")[0] == "grpc"
        )
        for path in DOMAIN.glob("*.py")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_domain_modules_import_each_other_without_a_circle() -> None:
    graph = domain_graph()
    assert {"catalog", "policy", "execution"} <= set(graph)  # the walk sees them
    assert "catalog" in graph["execution"] and "policy" in graph["catalog"]
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"catalog": {"policy"}, "policy": {"execution"}, "execution": {"catalog"}}
    assert find_cycle(graph) == ["catalog", "policy", "execution", "catalog"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
