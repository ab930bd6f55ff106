"""The compose stack (deploy/compose): valid against the vendored compose spec, scalable runtime,
registry balancing over every runtime replica, tracing wired, working gRPC health checks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import DEPLOY, ROOT, load_service_settings, load_yaml, run, tool

COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
SCHEMA = COMPOSE_DIR / "schema" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def test_compose_matches_the_compose_spec() -> None:
    result = run([tool("check-jsonschema"), "--schemafile", str(SCHEMA), str(COMPOSE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_spec_rejects_unknown_keys(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("read_only: true", "read_only: true\n    ro: 1"))
    result = run([tool("check-jsonschema"), "--schemafile", str(SCHEMA), str(broken)])
    assert result.returncode != 0
    assert "'ro' was unexpected" in result.stdout


def test_runtime_scales_behind_the_registry(compose: dict[str, Any]) -> None:
    runtime = services(compose)["runtime"]
    assert "ports" not in runtime, "a published host port would stop the runtime from scaling"
    assert "container_name" not in runtime
    assert isinstance(runtime["deploy"]["replicas"], int) and runtime["deploy"]["replicas"] >= 2
    assert runtime["expose"] == ["50052"]
    registry = services(compose)["registry"]
    targets = json.loads(registry["environment"]["CODEMODE_REGISTRY_RUNTIME_TARGETS"])
    assert targets == ["dns:///runtime:50052"]
    assert all(port.startswith("127.0.0.1:") for port in registry["ports"])


def test_services_load_their_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("registry", "runtime"):
        service = services(compose)[name]
        env: dict[str, str] = service["environment"]
        settings = load_service_settings(monkeypatch, f"CODEMODE_{name.upper()}_", env, None)
        assert settings.listen.startswith("0.0.0.0:")
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
        assert env["OTEL_SERVICE_NAME"] == f"codemode-{name}"
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
        assert service["command"] == [f"{name}_service"]
    assert "user" not in services(compose)["registry"], "the registry keeps the image's uid"


def test_tracing_pipeline_reaches_jaeger(compose: dict[str, Any]) -> None:
    collector = services(compose)["otel-collector"]
    (mount,) = collector["volumes"]
    config = load_yaml(COMPOSE_DIR / mount.split(":")[0])
    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        for component in pipeline[kind]:
            assert component in config[kind], f"{kind}: {component} is not defined"
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    assert config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert services(compose)["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_healthchecks_speak_grpc_health(compose: dict[str, Any]) -> None:
    for name, port in (("registry", 50051), ("runtime", 50052)):
        test = services(compose)[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"]
        assert "HealthStub" in test[3]
        assert test[4] == f"127.0.0.1:{port}"


def test_healthcheck_command_against_a_live_registry(compose: dict[str, Any]) -> None:
    code = services(compose)["registry"]["healthcheck"]["test"][3]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"

    def check() -> int:
        return run([sys.executable, "-c", code, address]).returncode

    assert check() != 0, "healthy before the registry started"
    registry = subprocess.Popen(
        [sys.executable, "-m", "registry_service", "--listen", address],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "CODEMODE_REGISTRY_HISTORY_PATH": ":memory:"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while check() != 0:
            assert registry.poll() is None, "the registry exited"
            assert time.monotonic() < deadline, "the registry never became healthy"
            time.sleep(0.2)
    finally:
        registry.terminate()
        registry.wait(timeout=15)
