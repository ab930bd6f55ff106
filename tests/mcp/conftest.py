"""Registries whose scopes attach real MCP servers (tests/mcp/mcp_test_server.py, written with
the official SDK), over stdio as the registry's supervised children and over streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from tests.codemode.conftest import make_stack
from tests.registry.conftest import Harness, database, make_registry, pg_database, postgres

# Re-exported fixtures.
__all__ = ["database", "make_registry", "make_stack", "pg_database", "postgres"]

SERVER = Path(__file__).with_name("mcp_test_server.py")
RAW_SERVER = Path(__file__).with_name("mcp_raw_server.py")
RAW_MODES = ("malformed", "silent")
SITE = sysconfig.get_paths()["purelib"]


def interpreter() -> str:
    """A Python the MCP user can run: as root the registry runs stdio servers as `nobody`, who
    cannot reach a venv under /root; the system interpreter of the same version with the
    venv's packages on PYTHONPATH then serves."""
    if os.geteuid() != 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    return system or sys.executable


@pytest.fixture
def mark_dir() -> Iterator[Path]:
    """Where the test servers leave marks: writable by the unprivileged MCP user."""
    path = Path(tempfile.mkdtemp(prefix="codemode-mcp-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def stdio_server(mode: str, marks: Path) -> dict[str, Any]:
    """The settings of a stdio test server (its whole environment is these two variables)."""
    return {
        "command": interpreter(),
        "args": [str(RAW_SERVER if mode in RAW_MODES else SERVER), mode],
        "env": {"PYTHONPATH": SITE, "MCP_TEST_DIR": str(marks)},
        "cwd": "/",
    }


def mcp_settings(marks: Path, *modes: str, **extra: Any) -> dict[str, Any]:
    return {"mcp_servers": {mode: stdio_server(mode, marks) for mode in modes}, **extra}


async def attach(
    h: Harness, agent_id: str, *servers: scope_pb2.McpServer | str, mode: int = 0
) -> str:
    attached = [
        s if isinstance(s, scope_pb2.McpServer) else scope_pb2.McpServer(server=s) for s in servers
    ]
    response = await h.stub.CreateAgent(
        rpb.CreateAgentRequest(
            agent_id=agent_id,
            agent=scope_pb2.Agent(mode=mode, mcp_servers=attached),  # type: ignore[arg-type]
        )
    )
    return str(response.agent.name)


async def until(check: Any, what: str, attempts: int = 1500) -> Any:
    """Polls `check()` (sync or async) until it returns something truthy (bounded)."""
    for _ in range(attempts):
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"never: {what}")


async def tools_of(h: Harness, scope: str, *names: str) -> list[str]:
    async def listed() -> list[str] | None:
        visible = await h.visible(scope)
        return visible if all(n in visible for n in names) else None

    result: list[str] = await until(listed, f"{names} visible in {scope}")
    return result


async def server_status(h: Harness, agent: str) -> scope_pb2.McpServer:
    response = await h.stub.GetAgent(rpb.GetAgentRequest(name=agent))
    status: scope_pb2.McpServer = response.agent.mcp_servers[0]
    return status


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def http_server(marks: Path, port: int = 0) -> AsyncIterator[str]:
    """The test server over streamable HTTP on loopback (on `port`, else a free one); yields
    its endpoint URL."""
    port = port or free_port()
    env = {**os.environ, "MCP_TEST_DIR": str(marks)}
    process = subprocess.Popen(  # noqa: ASYNC220 - it returns at once
        [sys.executable, str(SERVER), "http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        await until(listening, "the HTTP MCP server listens")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def alive(pid: int) -> bool:
    """Whether a process (not a zombie) with this pid exists."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def servers_of(marks: Path) -> list[int]:
    """Live processes whose environment names `marks`: the test servers of one test."""
    wanted = f"MCP_TEST_DIR={marks}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if wanted in environ.split(b"\0") and alive(int(entry.name)):
            found.append(int(entry.name))
    return found
