"""The project's import graph: every module of every package, and what each imports.

A node is a Python module (dotted name, `pkg` for `pkg/__init__.py`) or a JavaScript module of a
worker tree (its path from the repository root). An edge is one module importing another of the
project. Every import counts: one under `if TYPE_CHECKING:`, one inside a function, and
`importlib.import_module("literal")` (a circle through a lazy import is still a circle in the
design). An import names the module it names: `from pkg import mod` is an edge to `pkg.mod`
when that is a module, else to `pkg`; importing `a.b.c` is not also an edge to `a` and `a.b`
(Python runs their `__init__` first, but a package that only groups modules is no dependency).

Run as `python -m tests.unit.import_graph [ROOT]` to print the graph's size and its cycles.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (directory from the root, the package name it is imported as)
PYTHON_TREES = (
    ("codemode_common", "codemode_common"),
    ("codemode_wire", "codemode_wire"),
    ("registry_service", "registry_service"),
    ("runtime_service", "runtime_service"),
    ("codemode_cli", "codemode_cli"),
    ("clients/python/codemode_client", "codemode_client"),
    ("benchmarks", "benchmarks"),
)
# Generated code: its imports are protoc's, not the design's.
GENERATED = ("codemode_wire/api",)
# Directories whose top-level `*.js` files are ES modules of one worker tree.
JS_TREES = ("runtime_service/worker_ts",)

# `import x from './y.js'`, `import './y.js'`, `export { x } from './y.js'`, `import('./y.js')`,
# `require('./y.js')`: only relative specifiers name a module of the tree.
_JS_SPECIFIER = re.compile(
    r"""(?:\bimport\s*\(\s*|\brequire\s*\(\s*|\bfrom\s+|^\s*import\s+)(['"])(\.{1,2}/[^'"]+)\1""",
    re.MULTILINE,
)
_JS_COMMENT = re.compile(r"/\*.*?\*/|(?<![:'\"\\])//[^\n]*", re.DOTALL)


def imported_modules(path: Path) -> set[str]:
    """Every module name a Python file may import, absolute: for `from m import a` both `m`
    and `m.a` (a relative import is refused: name the module in full)."""
    return {name for names in _import_statements(path) for name in names}


def _import_statements(path: Path) -> Iterator[tuple[str, ...]]:
    """Per imported name, the modules it may be, most specific first: `import a.b` is
    (`a.b`,), `from a import b` is (`a.b`, `a`): `a.b` when that is a module, else `a`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield (alias.name,)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for alias in node.names:
                yield (f"{node.module}.{alias.name}", node.module)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import (name the module in full)")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield (node.args[0].value,)


@dataclass(frozen=True)
class Graph:
    edges: dict[str, set[str]]  # module -> the project's modules it imports
    files: dict[str, Path]
    names: dict[str, set[str]]  # Python module -> every name it may import (`imported_modules`)

    @property
    def edge_count(self) -> int:
        return sum(len(targets) for targets in self.edges.values())

    def importers_of(self, prefix: str) -> Iterator[tuple[str, str]]:
        """(importer, imported) for every edge into a module under `prefix`."""
        for source, targets in self.edges.items():
            for target in targets:
                if under(target, prefix):
                    yield source, target


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".") or module.startswith(prefix + "/")


def _python_modules(root: Path) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for directory, package in PYTHON_TREES:
        base = root / directory
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if any(relative.startswith(g + "/") for g in GENERATED):
                continue
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _resolve(names: tuple[str, ...], modules: dict[str, Path]) -> str | None:
    """The project module an import names: the first of `names` that is one (or a module a
    prefix of it names: `import a.b.c.func` cannot be, but `a.b.c` is), else None."""
    for name in names:
        if name in modules:
            return name
    parts = names[-1].split(".")
    for end in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _js_modules(root: Path) -> dict[str, Path]:
    return {
        path.relative_to(root).as_posix(): path
        for tree in JS_TREES
        for path in sorted((root / tree).glob("*.js"))
    }


def js_imports(path: Path) -> set[str]:
    """The relative specifiers a JavaScript module imports, resolved to paths from its
    directory (comments removed first: a specifier in a comment is no import)."""
    text = _JS_COMMENT.sub("", path.read_text())
    found: set[str] = set()
    for match in _JS_SPECIFIER.finditer(text):
        target = (path.parent / match.group(2)).resolve()
        if target.suffix == "":
            target = target.with_suffix(".js")
        found.add(str(target))
    return found


def build(root: Path = ROOT) -> Graph:
    modules = _python_modules(root)
    edges: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    for module, path in modules.items():
        statements = list(_import_statements(path))
        names[module] = {name for candidates in statements for name in candidates}
        targets = {_resolve(candidates, modules) for candidates in statements}
        edges[module] = {t for t in targets if t is not None and t != module}
    scripts = _js_modules(root)
    by_path = {str(path.resolve()): name for name, path in scripts.items()}
    for name, path in scripts.items():
        edges[name] = {by_path[t] for t in js_imports(path) if t in by_path} - {name}
    return Graph(edges, {**modules, **scripts}, names)


def strongly_connected(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The graph's cycles: every strongly connected component of more than one module (Tarjan,
    iterative: the graph is deep enough to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def a_cycle(edges: dict[str, set[str]], component: Iterable[str]) -> list[str]:
    """One concrete circle through a component's modules (first == last), to print."""
    members = set(component)
    start = min(members)
    path = [start]
    seen = {start}
    node = start
    while True:
        following = sorted(t for t in edges[node] if t in members)
        if start in following and len(path) > 1:
            return [*path, start]
        unseen = [t for t in following if t not in seen]
        node = unseen[0] if unseen else following[0]
        if node in seen:  # closed on an inner module: print the circle from there
            return [*path[path.index(node) :], node]
        path.append(node)
        seen.add(node)


def main(argv: list[str]) -> None:
    graph = build(Path(argv[1]) if len(argv) > 1 else ROOT)
    cycles = strongly_connected(graph.edges)
    print(f"modules {len(graph.edges)}, edges {graph.edge_count}, cycles {len(cycles)}")
    for component in cycles:
        print("  " + " -> ".join(a_cycle(graph.edges, component)))


if __name__ == "__main__":
    main(sys.argv)
