"""The Python client's distribution (`codemode_client`, under clients/python, and
`codemode_wire`, top level, shipped by it) imports only itself, the standard library and what
its pyproject declares: never the servers' packages, which a user who installs only the client
does not have. Every import counts, also one inside a function.
(tests/clients/test_client_package.py proves it by installing it.)"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.unit.import_graph import imported_modules

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
# The import names of the declared distributions (a distribution's name is not its modules').
PROVIDED = {
    "grpcio": {"grpc"},
    "grpcio-status": {"grpc_status"},
    "protobuf": {"google.protobuf"},
    "googleapis-common-protos": {"google.rpc"},
    "pydantic": {"pydantic"},
    "opentelemetry-api": {"opentelemetry"},
}
OWN = {"codemode_client", "codemode_wire"}
# An extra's packages, by import name, and the only modules that may import them (a user who
# installs the base client never imports those modules; the vendor SDK extras bring clients a
# user passes in, which no module imports).
EXTRAS: dict[str, tuple[dict[str, set[str]], set[str]]] = {
    "testing": (
        {"pytest": {"pytest"}, "pytest-asyncio": {"pytest_asyncio"}},
        {"codemode_client/testing/plugin.py"},
    ),
    "pydantic-ai": (
        {"pydantic-ai-slim": {"pydantic_ai", "pydantic_core"}},
        {"codemode_client/model_sdks/pydantic_ai_toolset.py"},
    ),
    "openai": ({"openai": set()}, set()),
    "anthropic": ({"anthropic": set()}, set()),
}


def _declared() -> set[str]:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    names = {Requirement(spec).name for spec in project["dependencies"]}
    assert names == set(PROVIDED), "map the import names of a new dependency in PROVIDED"
    return set().union(*PROVIDED.values())


def _extras(path: str) -> set[str]:
    """The import names the extras that own module `path` add."""
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert set(project["optional-dependencies"]) == set(EXTRAS), "map a new extra in EXTRAS"
    names: set[str] = set()
    for extra, (provided, modules) in EXTRAS.items():
        specs = project["optional-dependencies"][extra]
        assert {Requirement(spec).name for spec in specs} == set(provided), extra
        if path in modules:
            names |= set().union(*provided.values())
    return names


def _allowed(module: str, declared: set[str]) -> bool:
    top = module.split(".", maxsplit=1)[0]
    if top in OWN or top in sys.stdlib_module_names or top == "__future__":
        return True
    if module.startswith("opentelemetry.sdk"):
        return False  # the API only: the SDK is the servers' (and not declared)
    return any(module == d or module.startswith(d + ".") for d in declared)


def test_the_client_distribution_imports_only_what_it_declares() -> None:
    declared = _declared()
    offenders = {
        name: sorted(m for m in imported_modules(path) if not _allowed(m, declared | _extras(name)))
        for package in OWN
        for path in (CLIENT / package).rglob("*.py")  # the generated stubs too
        for name in [str(path.relative_to(CLIENT))]
    }
    assert {path: found for path, found in offenders.items() if found} == {}
