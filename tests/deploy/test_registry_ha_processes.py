"""Registry processes started from exactly what overlays/ha gives a registry pod (its settings
file and env), on one real PostgreSQL: two serve side by side, and an agent created through one
is found by a replica started after it; a Cordis plugin activated through one is called through
the other, in the first one's plugin host, over the peer channel. Only what a laptop cannot have
is changed: the listen address (loopback, a free port each) and so the pod IP in the advertised
peer address, the DSN's host, port and database (the tests' PostgreSQL), the runtime's address
(a real runtime process on loopback), and no OTLP export (there is no collector). The DSN's role
and the token key the peer secret derives from are the manifests'."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2
from tests.deploy.kustomize import FIELDS, docs, needs_kubectl, pod_start
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
    tmp_path: Path, postgres: PostgresServer, database: str, listen: str, runtime: str = ""
) -> subprocess.Popen[bytes]:
    """A registry started as the HA pod starts it, with the substitutions named above; its
    stderr goes to a file (a pipe nobody reads could fill and block it)."""
    port = listen.rsplit(":", 1)[1]
    start = pod_start(docs("ha"), "registry", tmp_path / port)
    env, container = start.env, start.container
    assert start.settings_file is not None
    # The pod advertises `$(POD_IP):<the port it listens on>`; here that is `listen`.
    manifest_port = env["CODEMODE_REGISTRY_LISTEN"].rsplit(":", 1)[1]
    peer = env["CODEMODE_REGISTRY_CORDIS_PEER_ADDRESS"]
    assert peer == f"{FIELDS['status.podIP']}:{manifest_port}"

    manifest_dsn = conninfo_to_dict(env["CODEMODE_REGISTRY_HISTORY_DSN"])
    server = conninfo_to_dict(postgres.dsn)
    dsn = make_conninfo(
        "", **{**manifest_dsn, "host": server["host"], "port": server["port"], "dbname": database}
    )
    env = {name: value for name, value in env.items() if not name.startswith("OTEL_EXPORTER")}
    env |= {
        "CODEMODE_REGISTRY_LISTEN": listen,
        "CODEMODE_REGISTRY_CORDIS_PEER_ADDRESS": listen,
        "CODEMODE_REGISTRY_HISTORY_DSN": dsn,
        "CODEMODE_REGISTRY_TRACE_FILE": "off",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    if runtime:
        env["CODEMODE_REGISTRY_RUNTIME_TARGETS"] = json.dumps([runtime])
    argv = [sys.executable, "-m", container["args"][0], "--config", str(start.settings_file)]
    with stderr_of(tmp_path, listen).open("wb") as stderr:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def stderr_of(tmp_path: Path, address: str) -> Path:
    return tmp_path / f"{address.rsplit(':', 1)[1]}.stderr"


def wait_serving(process: subprocess.Popen[bytes], address: str, log: Path) -> None:
    deadline = time.monotonic() + START_BOUND_S
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                text = log.read_text(errors="replace")
                pytest.fail(f"{address} exited ({process.returncode}): {text}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"{address} never served"
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
            wait_serving(process, address, stderr_of(tmp_path, address))
        with grpc.insecure_channel(addresses[0]) as first:
            created = rpb_grpc.RegistryServiceStub(first).CreateAgent(
                rpb.CreateAgentRequest(agent_id="ha-agent", agent=scope_pb2.Agent()), timeout=30
            )
        later = free_address()
        processes.append(pod_process(tmp_path, postgres, manifest_database, later))
        wait_serving(processes[-1], later, stderr_of(tmp_path, later))
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


HOST = """\
async def now(args):
    return {"time": "12:00", "args": args}

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="clock_now", description="The time.",
        parameters={"type": "object", "properties": {}, "additionalProperties": True},
        execute=now))

return apply
"""


def execute(channel: grpc.Channel, agent: str, name: str, arguments: Any, call_id: str) -> Any:
    """One model-direct call: its result's JSON value, or `{"error": <its message>}`."""
    request = rpb.ExecuteToolCallRequest(
        agent=agent, call_id=call_id, tool_name=name, arguments_json=json.dumps(arguments)
    )
    *_, last = rpb_grpc.RegistryServiceStub(channel).ExecuteToolCall(request, timeout=60)
    result = last.result
    return {"error": result.error.message} if result.is_error else json.loads(result.value_json)


def runtime_process(tmp_path: Path, listen: str) -> subprocess.Popen[bytes]:
    """A real runtime on loopback (the pods' `dns:///runtime…` name resolves nowhere here)."""
    env = {
        "CODEMODE_RUNTIME_LISTEN": listen,
        "CODEMODE_RUNTIME_POOL_SIZE": "1",
        "CODEMODE_RUNTIME_TYPESCRIPT_POOL_SIZE": "0",
        "CODEMODE_RUNTIME_SHUTDOWN_GRACE_S": "1",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    argv = [sys.executable, "-m", "runtime_service"]
    with stderr_of(tmp_path, listen).open("wb") as stderr:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def lease_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT plugin_id, address, epoch FROM cordis_host_leases ORDER BY plugin_id"
        ).fetchall()


def test_a_plugin_activated_on_one_replica_is_called_through_the_other(
    tmp_path: Path, postgres: PostgresServer, manifest_database: str
) -> None:
    """With nothing but the overlay's settings and env (the peer secret from the shared token
    key, the advertised pod address), the plugin's host runs in A alone, under A's lease, and
    B serves its tool by calling A over the peer channel."""
    runtime, a, b = free_address(), free_address(), free_address()
    processes = [runtime_process(tmp_path, runtime)]
    try:
        wait_serving(processes[0], runtime, stderr_of(tmp_path, runtime))
        for address in (a, b):
            processes.append(pod_process(tmp_path, postgres, manifest_database, address, runtime))
        for process, address in zip(processes[1:], (a, b), strict=True):
            wait_serving(process, address, stderr_of(tmp_path, address))
        database = make_conninfo(
            "", **{**conninfo_to_dict(postgres.dsn), "dbname": manifest_database}
        )
        agent = "agents/coder"
        with grpc.insecure_channel(a) as on_a, grpc.insecure_channel(b) as on_b:
            rpb_grpc.RegistryServiceStub(on_a).CreateAgent(
                rpb.CreateAgentRequest(
                    agent_id="coder",
                    agent=scope_pb2.Agent(
                        mode=scope_pb2.PRESENTATION_MODE_BOTH, self_modification=True
                    ),
                ),
                timeout=30,
            )
            definition = {
                "plugin": {"kind": "new", "idPrefix": "clock"},
                "name": "Clock",
                "purpose": "Tell the time.",
                "code": {"host": HOST},
            }
            defined = execute(on_a, agent, "cordis_define", definition, "define")
            assert "error" not in defined, defined
            plugin, package = defined["pluginId"], defined["packageId"]
            run = {"pluginId": plugin, "packageId": package, "mode": "run"}
            started = execute(on_a, agent, "cordis_run", run, "run")
            assert started.get("status") == "running", started
            assert lease_rows(database) == [(plugin, a, 1)]

            # B learns of the run from the store; until then its catalog lacks the tool.
            deadline = time.monotonic() + START_BOUND_S
            listed = rpb.ListVisibleToolsRequest(scope=agent)
            stub_b = rpb_grpc.RegistryServiceStub(on_b)
            while "clock_now" not in [t.name for t in stub_b.ListVisibleTools(listed).tools]:
                assert time.monotonic() < deadline, "B never listed the plugin's tool"
                time.sleep(0.1)
            answered = execute(on_b, agent, "clock_now", {"n": 1}, "through-b")
            assert answered == {"time": "12:00", "args": {"n": 1}}
            # Served by A's host: the lease never moved (B took none and started no host).
            assert lease_rows(database) == [(plugin, a, 1)]
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            assert process.wait(timeout=60) == 0
