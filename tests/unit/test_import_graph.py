"""The whole project's import graph (tests/unit/import_graph.py): no module is in an import
circle, no area (a package's direct sub-package) is in one with another, and each layering rule
below holds. Every import counts, also one under `if TYPE_CHECKING:` or inside a function: a
circle there is still a circle in the design."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tests.unit import import_graph
from tests.unit.import_graph import Graph, a_cycle, imported_modules, strongly_connected, under

# Circles tolerated for now (none): the test fails once one of them is gone, so that the list
# only ever shrinks.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()

_SERVICES = ("registry_service", "runtime_service", "codemode_cli", "benchmarks")
_TRANSPORT = ("grpc", "grpc_status", "google.rpc", "google.protobuf", "codemode_wire.api")


@dataclass(frozen=True)
class Rule:
    """Modules under `importers` import, of the project, only what is under `may_import`
    (None: anything), never anything under `never` (the project's or a third party's), and,
    when `stdlib_only`, no third-party module at all."""

    why: str
    importers: str
    may_import: tuple[str, ...] | None = None
    never: tuple[str, ...] = ()
    stdlib_only: bool = False


RULES = (
    Rule(
        "the domain is pure: no transport, presentation, history store, servicer or service",
        "registry_service.domain",
        may_import=("registry_service.domain", "codemode_wire", "codemode_common"),
        never=_TRANSPORT,
    ),
    Rule(
        "the history stores stand on the domain, never on what serves it",
        "registry_service.history",
        may_import=("registry_service.history", "registry_service.domain", "codemode_wire"),
        never=_TRANSPORT,
    ),
    Rule(
        "presentation renders the domain, never the transport or the history",
        "registry_service.presentation",
        may_import=("registry_service.presentation", "registry_service.domain", "codemode_wire"),
        never=_TRANSPORT,
    ),
    Rule(
        "the run_code transport talks to a runtime through its port, never through grpc",
        "registry_service.codemode",
        may_import=("registry_service.codemode", "registry_service.domain", "codemode_wire"),
        never=("grpc", "codemode_wire.api"),
    ),
    Rule(
        "the wire package every server stands on imports no service and no server helper",
        "codemode_wire",
        may_import=("codemode_wire",),
    ),
    Rule(
        "the servers' shared helpers import no service",
        "codemode_common",
        may_import=("codemode_common", "codemode_wire"),
    ),
    Rule(
        "the runtime never imports the registry (nor the CLI or the client)",
        "runtime_service",
        never=("registry_service", "codemode_cli", "codemode_client", "benchmarks"),
    ),
    Rule(
        "the registry never imports the runtime (nor the CLI or the client)",
        "registry_service",
        never=("runtime_service", "codemode_cli", "codemode_client", "benchmarks"),
    ),
    Rule(
        "the sandboxed worker loads only the standard library and its own tree",
        "runtime_service.worker",
        may_import=("runtime_service.worker", "codemode_wire"),
        stdlib_only=True,
    ),
    Rule(
        "the client library imports no server",
        "codemode_client",
        may_import=("codemode_client", "codemode_wire"),
    ),
)

_PROJECT = ("codemode_common", "codemode_wire", "codemode_client", *_SERVICES)


def _graph() -> Graph:
    if not hasattr(_graph, "cached"):
        _graph.cached = import_graph.build()  # type: ignore[attr-defined]
    return _graph.cached  # type: ignore[attr-defined, no-any-return]


def _breaks(rule: Rule, graph: Graph, module: str) -> list[str]:
    found = [
        t
        for t in graph.edges[module]
        if rule.may_import is not None and not any(under(t, a) for a in rule.may_import)
    ]
    for name in graph.names[module]:
        top = name.split(".")[0]
        if any(under(name, n) for n in rule.never) or (
            rule.stdlib_only
            and top not in _PROJECT
            and top not in sys.stdlib_module_names
            and top != "__future__"
        ):
            found.append(name)
    return sorted(set(found))


def area(graph: Graph, module: str) -> str:
    """A module's area: the sub-package of its top package it lives in (`registry_service.
    domain` for `registry_service.domain.cordis.runner`), the top package for a module directly
    in it, the directory of a worker tree's script."""
    if "/" in module:
        return module.rsplit("/", 1)[0]
    parts = module.split(".")
    package = ".".join(parts[:2])
    if len(parts) > 1 and graph.files[package].name == "__init__.py":
        return package
    return parts[0]


def area_graph(graph: Graph) -> dict[str, set[str]]:
    areas: dict[str, set[str]] = {}
    for source, targets in graph.edges.items():
        mine = area(graph, source)
        areas.setdefault(mine, set()).update(
            area(graph, t) for t in targets if area(graph, t) != mine
        )
    for targets in list(areas.values()):
        for target in targets:
            areas.setdefault(target, set())
    return areas


def test_the_graph_sees_every_package_and_both_worker_trees() -> None:
    graph = _graph()
    for module in (
        "codemode_common.principals",
        "codemode_wire.jsonvalue",
        "codemode_client",
        "codemode_cli.main",
        "registry_service.domain.execution",
        "registry_service.domain.cordis.runner",
        "registry_service.history.postgres.store",
        "registry_service.presentation",
        "registry_service.codemode.bridge",
        "runtime_service.worker.bootstrap",
        "runtime_service/worker_ts/worker.js",
        "benchmarks.run_code",
    ):
        assert module in graph.files, module
    assert not [m for m in graph.files if m.startswith("codemode_wire.api")]  # generated
    # The walk sees imports of every kind: across packages, inside the worker trees.
    assert "registry_service.domain.catalog" in graph.edges["registry_service.domain.execution"]
    assert "registry_service.domain.names" not in graph.edges["registry_service.domain.catalog"]
    assert (
        "runtime_service/worker_ts/flatwire.js"
        in graph.edges["runtime_service/worker_ts/worker.js"]
    )


def test_no_module_is_in_an_import_circle() -> None:
    graph = _graph()
    found = set(strongly_connected(graph.edges))
    new = [" -> ".join(a_cycle(graph.edges, c)) for c in found - KNOWN_CYCLES]
    assert new == [], "import circles"
    gone = [sorted(c) for c in KNOWN_CYCLES - found]
    assert gone == [], "no longer a circle: remove it from KNOWN_CYCLES"


def test_no_area_is_in_an_import_circle_with_another() -> None:
    # e.g. the domain importing the history record while history imports the domain
    areas = area_graph(_graph())
    assert {"registry_service.domain", "registry_service.history"} <= set(areas)
    assert [a_cycle(areas, c) for c in strongly_connected(areas)] == []


def test_every_layering_rule_holds() -> None:
    graph = _graph()
    broken: dict[str, dict[str, list[str]]] = {}
    for rule in RULES:
        modules = [m for m in graph.files if "/" not in m and under(m, rule.importers)]
        assert modules, f"no module under {rule.importers}"
        offenders = {m: found for m in modules if (found := _breaks(rule, graph, m))}
        if offenders:
            broken[rule.why] = offenders
    assert broken == {}


def test_the_walk_counts_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "lazy.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from registry_service.domain import catalog\n"
        "def later():\n    import registry_service.domain.policy\n"
        "    importlib.import_module('registry_service.domain.tools')\n"
    )
    assert {
        "registry_service.domain.catalog",
        "registry_service.domain.policy",
        "registry_service.domain.tools",
    } <= imported_modules(source)


def test_the_walk_reads_every_kind_of_javascript_import(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d", "e"):
        (tmp_path / f"{name}.js").write_text("")
    main = tmp_path / "main.js"
    main.write_text(
        "import x from './a.js';\nimport * as y from \"./b.js\";\n"
        "const z = require('./c');\nexport { w } from './d.js';\n"
        "await import('./e.js');\nimport fs from 'node:fs';\n"
        "// import q from './f.js';\n/* require('./g.js') */\n"
    )
    found = {Path(p).name for p in import_graph.js_imports(main)}
    assert found == {"a.js", "b.js", "c.js", "d.js", "e.js"}


def test_the_cycle_finder_finds_every_circle() -> None:
    graph = {
        "catalog": {"policy"},
        "policy": {"execution"},
        "execution": {"catalog"},
        "a": {"b"},
        "b": {"a", "c"},
        "c": set(),
    }
    found = set(strongly_connected(graph))
    assert found == {frozenset({"catalog", "policy", "execution"}), frozenset({"a", "b"})}
    assert a_cycle(graph, {"catalog", "policy", "execution"}) == [
        "catalog",
        "policy",
        "execution",
        "catalog",
    ]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
