"""Shared helpers for the deployment checks: paths, pinned tools, settings loading."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from registry_service.config import RegistrySettings
from registry_service.config import load_settings as load_registry_settings
from runtime_service.config import RuntimeSettings
from runtime_service.config import load_settings as load_runtime_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def tool(name: str) -> str:
    """A pinned tool from requirements/deploy.lock, installed beside this interpreter."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} is missing: pip install -r requirements/deploy.lock into .venv")
    return str(path)


def run(
    argv: list[str], stdin: str | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path}: expected a mapping"
    return data


def settings_env(prefix: str, env: dict[str, str]) -> dict[str, str]:
    """The CODEMODE_* variables of one service, each checked to name a real setting."""
    model = RegistrySettings if prefix == "CODEMODE_REGISTRY_" else RuntimeSettings
    chosen: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith("CODEMODE_"):
            continue
        assert name.startswith(prefix), f"{name} set on the wrong service (expected {prefix}*)"
        field = name.removeprefix(prefix).lower()
        assert field in model.model_fields, f"{name}: no such setting in {model.__name__}"
        chosen[name] = value
    return chosen


def load_service_settings(
    monkeypatch: pytest.MonkeyPatch, prefix: str, env: dict[str, str], config: Path | None
) -> RegistrySettings | RuntimeSettings:
    """Loads settings exactly as the service would at start: config file, then env vars (the
    standard OTEL_* ones included: telemetry settings fall back to them)."""
    for name in [n for n in os.environ if n.startswith(("CODEMODE_", "OTEL_"))]:
        monkeypatch.delenv(name)
    otel = {name: value for name, value in env.items() if name.startswith("OTEL_")}
    for name, value in {**settings_env(prefix, env), **otel}.items():
        monkeypatch.setenv(name, value)
    if prefix == "CODEMODE_REGISTRY_":
        return load_registry_settings(config)
    return load_runtime_settings(config)


# What the Secrets the manifests refer to hold in a cluster, made up here: the manifests never
# carry them (deploy/README.md, "High availability"), the operator creates them.
STAND_IN_SECRETS: dict[tuple[str, str], str] = {
    ("codemode-registry-auth", "token-key"): "5e" * 32,
    ("codemode-postgres", "password"): "stand-in-password",
    ("codemode-postgres-dsn", "dsn"): (
        "postgresql://codemode:stand-in-password@db.example.com:5432/codemode?sslmode=verify-full"
    ),
}


def resolve_env(entries: list[dict[str, Any]], fields: dict[str, str]) -> dict[str, str]:
    """A container's env as the kubelet expands it: `$(NAME)` refers to earlier entries only;
    Secret keys hold their `STAND_IN_SECRETS` value (an unknown one fails the test)."""
    env: dict[str, str] = {}
    for entry in entries:
        if "value" in entry:
            value = str(entry["value"])
            for name in _REFERENCE.findall(value):
                assert name in env, f"{entry['name']} refers to $({name}) before it is defined"
            env[entry["name"]] = _REFERENCE.sub(lambda m: env[m.group(1)], value)
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) in STAND_IN_SECRETS, f"{entry['name']}: {ref}"
            env[entry["name"]] = STAND_IN_SECRETS[ref["name"], ref["key"]]
        else:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            env[entry["name"]] = fields[path]
    return env
