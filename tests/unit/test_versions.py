"""One version and one license for every package of this repository, and dependency floors the
generated code can run on.

The root pyproject.toml's `version` is the source of truth; the client's pyproject.toml, the
npm packages' package.json and their lock files must carry the same (to release, change them
all: this test names each one that differs). Each package ships a copy of the root LICENSE,
since a package holds only files under its own folder."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
NPM_PACKAGES = ("clients/typescript", "console")
LICENSE_COPIES = ("clients/python/LICENSE", "clients/typescript/LICENSE")
PYPROJECTS = ("pyproject.toml", "clients/python/pyproject.toml")


def _pyproject(path: str) -> dict[str, Any]:
    project = tomllib.loads((ROOT / path).read_text())["project"]
    assert isinstance(project, dict)
    return project


def versions() -> dict[str, str]:
    """Every place a package version is written, by file (and field)."""
    found = {path: str(_pyproject(path)["version"]) for path in PYPROJECTS}
    for package in NPM_PACKAGES:
        manifest = json.loads((ROOT / package / "package.json").read_text())
        lock = json.loads((ROOT / package / "package-lock.json").read_text())
        found[f"{package}/package.json"] = manifest["version"]
        found[f"{package}/package-lock.json"] = lock["version"]
        found[f"{package}/package-lock.json packages['']"] = lock["packages"][""]["version"]
    return found


def test_every_package_has_the_root_version() -> None:
    found = versions()
    truth = found["pyproject.toml"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", truth)
    differ = {where: v for where, v in found.items() if v != truth}
    assert not differ, f"these differ from pyproject.toml's version {truth}: {differ}"


def test_the_console_depends_on_the_client_of_the_same_tree() -> None:
    lock = json.loads((ROOT / "console" / "package-lock.json").read_text())
    linked = lock["packages"]["../clients/typescript"]
    assert linked["version"] == versions()["pyproject.toml"]
    assert linked["license"] == "Apache-2.0"


def test_every_package_ships_the_apache_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    for copy in LICENSE_COPIES:
        assert (ROOT / copy).read_text() == text, f"{copy} is not the root LICENSE"
    for path in PYPROJECTS:
        project = _pyproject(path)
        assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    manifest = json.loads((ROOT / "clients" / "typescript" / "package.json").read_text())
    assert manifest["license"] == "Apache-2.0"


def _generated_floors() -> dict[str, str]:
    """The protobuf and grpcio versions the generated code was made for (older runtimes refuse
    to import it)."""
    api = ROOT / "codemode_wire" / "api" / "registry" / "v1"
    pb2 = (api / "tool_pb2.py").read_text()
    protobuf = re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", pb2)
    grpc = (api / "registry_service_pb2_grpc.py").read_text()
    grpcio = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", grpc)
    assert protobuf is not None and grpcio is not None
    return {"protobuf": ".".join(protobuf.groups()), "grpcio": grpcio.group(1)}


@pytest.mark.parametrize("path", PYPROJECTS)
def test_dependency_floors_admit_no_runtime_the_generated_code_refuses(path: str) -> None:
    requirements = {
        Requirement(spec).name: Requirement(spec) for spec in _pyproject(path)["dependencies"]
    }
    for name, floor in _generated_floors().items():
        specifier = requirements[name].specifier
        major, minor, patch = (int(part) for part in floor.split("."))
        older = f"{major}.{minor - 1}.0" if patch == 0 else f"{major}.{minor}.{patch - 1}"
        assert specifier.contains(floor), f"{path}: {name}{specifier} refuses {floor}"
        assert not specifier.contains(older), f"{path}: {name}{specifier} admits {older}"
