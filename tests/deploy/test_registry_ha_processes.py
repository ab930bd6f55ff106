"""Registry processes started from exactly what overlays/ha gives a registry pod (its settings
file and env), on one real PostgreSQL: two serve side by side, and an agent created through one
is found by a replica started after it. Only what a laptop cannot have is changed: the listen
address (loopback, a free port each), the DSN's host, port and database (the tests'
PostgreSQL), and no OTLP export (there is no collector). The DSN's role is the manifests'."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2
from tests.deploy.kustomize import docs, needs_kubectl, pod_start
from tests.deploy.support import ROOT
from tests.postgres_server import PostgresServer, postgres

__all__ = ["postgres"]  # the session's real PostgreSQL fixture

pytestmark = needs_kubectl

# Outcomes are awaited with generous bounds only (a loaded machine): nothing asserts a duration.
START_BOUND_S = 120.0


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def manifest_database(postgres: PostgresServer, tmp_path: Path) -> Iterator[str]:
    """A fresh database owned by the role the HA manifests' DSN names; yields its name."""
    env = pod_start(docs("ha"), "registry", tmp_path).env
    role = conninfo_to_dict(env["CODEMODE_REGISTRY_HISTORY_DSN"])["user"]
    assert isinstance(role, str)
    postgres.admin(
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') "
        f"THEN CREATE ROLE {role} LOGIN; END IF; END $$"
    )
    name = f"t_{uuid.uuid4().hex[:16]}"
    postgres.admin(f"CREATE DATABASE {name} OWNER {role} TEMPLATE template0")
    try:
        yield name
    finally:
        postgres.drop_database(name)


def pod_process(
    tmp_path: Path, postgres: PostgresServer, database: str, listen: str
) -> subprocess.Popen[bytes]:
    """A registry started as the HA pod starts it, with the substitutions named above."""
    start = pod_start(docs("ha"), "registry", tmp_path / listen.rsplit(":", 1)[1])
    env, container = start.env, start.container
    assert start.settings_file is not None

    manifest_dsn = conninfo_to_dict(env["CODEMODE_REGISTRY_HISTORY_DSN"])
    server = conninfo_to_dict(postgres.dsn)
    dsn = make_conninfo(
        "", **{**manifest_dsn, "host": server["host"], "port": server["port"], "dbname": database}
    )
    env = {name: value for name, value in env.items() if not name.startswith("OTEL_EXPORTER")}
    env |= {
        "CODEMODE_REGISTRY_LISTEN": listen,
        "CODEMODE_REGISTRY_HISTORY_DSN": dsn,
        "CODEMODE_REGISTRY_TRACE_FILE": "off",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    argv = [sys.executable, "-m", container["args"][0], "--config", str(start.settings_file)]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def wait_serving(process: subprocess.Popen[bytes], address: str) -> None:
    deadline = time.monotonic() + START_BOUND_S
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                assert process.stderr is not None
                pytest.fail(f"registry {address} exited: {process.stderr.read().decode()}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"registry {address} never served"
            time.sleep(0.2)


def test_ha_registries_share_one_database(
    tmp_path: Path, postgres: PostgresServer, manifest_database: str
) -> None:
    """Two replicas start together on one database (each migrates it at start), an agent
    created through one is stored where a replica started later finds it."""
    addresses = [free_address(), free_address()]
    processes = [pod_process(tmp_path, postgres, manifest_database, a) for a in addresses]
    try:
        for process, address in zip(processes, addresses, strict=True):
            wait_serving(process, address)
        with grpc.insecure_channel(addresses[0]) as first:
            created = rpb_grpc.RegistryServiceStub(first).CreateAgent(
                rpb.CreateAgentRequest(agent_id="ha-agent", agent=scope_pb2.Agent()), timeout=30
            )
        later = free_address()
        processes.append(pod_process(tmp_path, postgres, manifest_database, later))
        wait_serving(processes[-1], later)
        with grpc.insecure_channel(later) as third:
            seen = rpb_grpc.RegistryServiceStub(third).GetAgent(
                rpb.GetAgentRequest(name="agents/ha-agent"), timeout=30
            )
        assert seen.agent.agent_id == created.agent.agent_id != ""
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            assert process.wait(timeout=60) == 0
