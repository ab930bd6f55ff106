"""The compose stack (deploy/compose): valid against the vendored compose spec, scalable runtime,
registry balancing over every runtime replica, tracing wired, working gRPC health checks."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from registry_service.config import RegistrySettings
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


def registries(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The registry replicas: every service running `registry_service`."""
    return {
        name: service
        for name, service in services(compose).items()
        if service.get("command", [""])[0] == "registry_service"
    }


def a_registry(compose: dict[str, Any]) -> dict[str, Any]:
    """One replica, where all of them are alike (test_registry_replicas_are_alike)."""
    return next(iter(registries(compose).values()))


def test_compose_matches_the_compose_spec() -> None:
    result = run([tool("check-jsonschema"), "--schemafile", str(SCHEMA), str(COMPOSE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_spec_rejects_unknown_keys(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    # An unknown key beside every `read_only: true`, at its indentation.
    text = re.sub(r"(?m)^( *)read_only: true$", r"\1read_only: true\n\1ro: 1", COMPOSE.read_text())
    broken.write_text(text)
    result = run([tool("check-jsonschema"), "--schemafile", str(SCHEMA), str(broken)])
    assert result.returncode != 0
    assert "'ro' was unexpected" in result.stdout


def test_runtime_scales_behind_the_registry(compose: dict[str, Any]) -> None:
    runtime = services(compose)["runtime"]
    assert "ports" not in runtime, "a published host port would stop the runtime from scaling"
    assert "container_name" not in runtime
    assert isinstance(runtime["deploy"]["replicas"], int) and runtime["deploy"]["replicas"] >= 2
    assert runtime["expose"] == ["50052"]
    for registry in registries(compose).values():
        targets = json.loads(registry["environment"]["CODEMODE_REGISTRY_RUNTIME_TARGETS"])
        assert targets == ["dns:///runtime:50052"]
        assert all(port.startswith("127.0.0.1:") for port in registry["ports"])


def test_services_load_their_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secrets = make_secrets_as_compose_does(compose, tmp_path)
    chosen = {**dict.fromkeys(registries(compose), "registry"), "runtime": "runtime"}
    for service_name, name in chosen.items():
        service = services(compose)[service_name]
        env: dict[str, str] = service["environment"]
        command: list[str] = service["command"]
        assert command[0] == f"{name}_service"
        config = in_volume(service, command[2], secrets) if name == "registry" else None
        settings = load_service_settings(monkeypatch, f"CODEMODE_{name.upper()}_", env, config)
        assert settings.listen.startswith("0.0.0.0:")
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
        assert env["OTEL_SERVICE_NAME"] == f"codemode-{name}"
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
        if isinstance(settings, RegistrySettings):
            assert settings.history_store == "postgres"
            # Every replica loads the same file: one token key for all of them.
            assert len(bytes.fromhex(settings.token_key)) == 32
            # ... from which the Cordis peer secret derives (one live host per plugin).
            assert settings.cordis_peer_token() is not None and settings.tls_cert_file is None
            assert settings.cordis_peer_address == f"{service_name}:50051"
    for registry in registries(compose).values():
        assert "user" not in registry, "the registry keeps the image's uid"


def make_secrets_as_compose_does(compose: dict[str, Any], directory: Path) -> Path:
    """Runs the `registry-secrets` service's command as its container would (the image's
    entrypoint is `python -m`), its volume being `directory`; returns `directory`."""
    service = services(compose)["registry-secrets"]
    (bind,) = [v for v in service["volumes"] if v.startswith("./")]
    source, target, _ = bind.split(":")
    assert Path(target).parent == Path(service["working_dir"])
    module, volume_path = service["command"]
    assert Path(target).name == f"{module}.py"
    assert in_volume(service, volume_path, directory) == directory
    done = run(
        [sys.executable, "-m", module, str(directory)], cwd=COMPOSE_DIR / Path(source).parent
    )
    assert done.returncode == 0, done.stderr
    return directory


def in_volume(service: dict[str, Any], path: str, directory: Path) -> Path:
    """`path` inside `service`'s `codemode-secrets` mount, found under `directory`."""
    (mount,) = [v for v in service["volumes"] if v.startswith("codemode-secrets:")]
    target = Path(mount.split(":")[1])
    return directory / Path(path).relative_to(target)


def test_registries_reach_postgres_with_the_made_password(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secrets = make_secrets_as_compose_does(compose, tmp_path)
    postgres = services(compose)["postgres"]
    registry = a_registry(compose)
    config = in_volume(registry, registry["command"][2], secrets)
    settings = load_service_settings(
        monkeypatch, "CODEMODE_REGISTRY_", registry["environment"], config
    )
    assert isinstance(settings, RegistrySettings)
    dsn = conninfo_to_dict(settings.history_dsn.get_secret_value())
    env = postgres["environment"]
    password = in_volume(postgres, env["POSTGRES_PASSWORD_FILE"], secrets).read_text()
    assert len(password) >= 32
    assert dsn == {
        "host": "postgres",
        "port": postgres["expose"][0],
        "user": env["POSTGRES_USER"],
        "password": password,
        "dbname": env["POSTGRES_DB"],
    }
    # Nothing secret in the compose file itself.
    assert password not in COMPOSE.read_text() and settings.token_key not in COMPOSE.read_text()


def test_secrets_are_made_once_for_their_readers_only(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    make_secrets_as_compose_does(compose, tmp_path)
    made = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert set(made) == {"postgres-password", "registry.yaml"}
    # A second `up` keeps them: the database was initialised with this password.
    make_secrets_as_compose_does(compose, tmp_path)
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == made
    readers = {
        "postgres-password": int(services(compose)["postgres"]["user"].split(":")[0]),
        "registry.yaml": image_uid(),
    }
    for name, uid in readers.items():
        status = (tmp_path / name).stat()
        assert stat.S_IMODE(status.st_mode) == 0o400, name
        # As root (as in its container) each file goes to its reader; otherwise it stays ours.
        assert status.st_uid == (uid if os.geteuid() == 0 else os.geteuid()), name


def image_uid() -> int:
    """The uid the codemode image runs as (the Dockerfile's last USER)."""
    users = [
        line.split()[1]
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("USER ")
    ]
    return int(users[-1].split(":")[0])


def test_postgres_gates_the_registries(compose: dict[str, Any]) -> None:
    postgres = services(compose)["postgres"]
    # The official image at an exact release by default.
    image = re.fullmatch(r"\$\{POSTGRES_IMAGE:-(.+)\}", postgres["image"])
    assert image and re.fullmatch(
        r"postgres:\d+\.\d+(-[a-z0-9.]+)?(@sha256:[0-9a-f]{64})?", image[1]
    )
    test = postgres["healthcheck"]["test"]
    assert test[:2] == ["CMD", "pg_isready"]
    assert test[test.index("-h") + 1] == "127.0.0.1"
    assert test[test.index("-U") + 1] == postgres["environment"]["POSTGRES_USER"]
    assert "ports" not in postgres, "only the compose network reaches the database"
    assert "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]
    assert "postgres-data" in compose["volumes"]
    for name, service in services(compose).items():
        needs = service.get("depends_on", {})
        if "postgres" in needs:
            assert needs["postgres"]["condition"] == "service_healthy", name
    for name in registries(compose):
        assert services(compose)[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in [*registries(compose), "postgres"]:
        condition = services(compose)[name]["depends_on"]["registry-secrets"]["condition"]
        assert condition == "service_completed_successfully", name


def test_compose_spec_rejects_an_unknown_dependency_condition(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    text = COMPOSE.read_text()
    assert text.count("condition: service_healthy") >= 2
    broken.write_text(text.replace("condition: service_healthy", "condition: healthy"))
    result = run([tool("check-jsonschema"), "--schemafile", str(SCHEMA), str(broken)])
    assert result.returncode != 0


def test_registry_replicas_are_alike(compose: dict[str, Any]) -> None:
    replicas = registries(compose)
    assert len(replicas) >= 2
    # The same registry but for its host port and the Cordis peer address it advertises:
    # one settings file, hence one token key (and one peer secret).
    peer = "CODEMODE_REGISTRY_CORDIS_PEER_ADDRESS"
    alike = [
        {
            **{k: v for k, v in r.items() if k not in ("ports", "environment")},
            "environment": {k: v for k, v in r["environment"].items() if k != peer},
        }
        for r in replicas.values()
    ]
    assert all(one == alike[0] for one in alike)
    # Each advertises the name that resolves to it alone on the compose network (its service
    # name; `registry` resolves to every replica), on the port it listens on.
    for name, replica in replicas.items():
        listen_port = replica["environment"]["CODEMODE_REGISTRY_LISTEN"].rsplit(":", 1)[1]
        assert replica["environment"][peer] == f"{name}:{listen_port}"
    ports = [r["ports"] for r in replicas.values()]
    host_ports = set()
    for (port,) in ports:
        host, published, container = port.split(":")
        assert host == "127.0.0.1" and container == "50051"
        host_ports.add(published)
    assert len(host_ports) == len(replicas), "two replicas on one host port would not start"
    for replica in replicas.values():
        assert "container_name" not in replica
        # Inside the network, `registry` resolves to every replica (a ReplicaSet's name).
        assert replica["networks"]["default"]["aliases"] == ["registry"]
    runtime = services(compose)["runtime"]
    assert "50053" not in {p.split(":")[1] for p in runtime.get("ports", [])}


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
    for name, port in ((next(iter(registries(compose))), 50051), ("runtime", 50052)):
        test = services(compose)[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"]
        assert "HealthStub" in test[3]
        assert test[4] == f"127.0.0.1:{port}"


def test_healthcheck_command_against_a_live_registry(compose: dict[str, Any]) -> None:
    code = a_registry(compose)["healthcheck"]["test"][3]
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
