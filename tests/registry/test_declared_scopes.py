"""Presets and agents declared in the settings: created at start, so they come back after a
restart; read through gRPC. A bad declaration stops the start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from registry_service.config import ConfigError, RegistrySettings, load_settings
from registry_service.registry import build_registry
from tests.registry.conftest import echo_tool

DECLARED: dict[str, Any] = {
    "presets": [{"id": "coders", "mode": "code"}, {"id": "plain"}],
    "agents": [
        {"id": "alice", "preset": "coders"},
        {"id": "bob", "preset": "presets/plain", "mode": "both"},
        {"id": "carol"},
    ],
}


async def test_declared_presets_and_agents_exist_at_start(make_registry: Any) -> None:
    async with make_registry(**DECLARED) as h:
        presets = await h.stub.ListPresets(rpb.ListPresetsRequest())
        assert [p.name for p in presets.presets] == ["presets/coders", "presets/plain"]
        agents = {a.name: a for a in (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents}
        assert sorted(agents) == ["agents/alice", "agents/bob", "agents/carol"]
        assert agents["agents/alice"].preset == "presets/coders"
        modes = {name: agent.effective_mode for name, agent in agents.items()}
        assert modes == {
            "agents/alice": scope_pb2.PRESENTATION_MODE_CODE,  # from its preset
            "agents/bob": scope_pb2.PRESENTATION_MODE_BOTH,  # its own
            "agents/carol": scope_pb2.PRESENTATION_MODE_NATIVE,  # the deployment default
        }
        echo_tool(h.registry, "read")
        assert await h.visible("agents/alice") == ["read", "run_code"]  # code mode
        assert await h.visible("agents/carol") == ["read"]


def test_declarations_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text("presets:\n  - id: coders\n    mode: code\n")
    os.environ["CODEMODE_REGISTRY_AGENTS"] = '[{"id": "alice", "preset": "coders"}]'
    try:
        settings = load_settings(path, history_path=":memory:")
    finally:
        del os.environ["CODEMODE_REGISTRY_AGENTS"]
    registry = build_registry(settings)
    assert registry.catalog.get_agent("agents/alice").preset == "presets/coders"


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"agents": [{"id": "alice", "preset": "nope"}]}, "preset 'presets/nope' does not exist"),
        ({"presets": [{"id": "a"}, {"id": "a"}]}, "already exists"),
        ({"agents": [{"id": "Not Valid"}]}, "agent"),
    ],
)
def test_a_bad_declaration_stops_the_start(declared: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_registry(RegistrySettings(history_path=":memory:", **declared))


@pytest.mark.parametrize(
    "declared",
    [{"agents": [{"id": "a", "mode": "turbo"}]}, {"presets": [{"id": "p", "colour": "red"}]}],
)
def test_an_ill_formed_declaration_is_refused(declared: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        load_settings(history_path=":memory:", **declared)


def test_the_registry_process_refuses_a_bad_declaration(tmp_path: Path) -> None:
    env = {**os.environ, "CODEMODE_REGISTRY_AGENTS": '[{"id": "a", "preset": "missing"}]'}
    done = subprocess.run(
        [sys.executable, "-m", "registry_service", "--listen", "127.0.0.1:0"],
        env={
            **env,
            "CODEMODE_REGISTRY_HISTORY_PATH": ":memory:",
            "CODEMODE_REGISTRY_TRACE_FILE": "off",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "presets/missing" in done.stderr
    assert "Traceback" not in done.stderr
