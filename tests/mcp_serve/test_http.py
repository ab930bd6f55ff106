"""`codemode mcp serve --transport http`: the official Python MCP client over streamable HTTP,
and what an attacker's page or a rebinding name gets (refusals before anything reaches the
registry), the body limit, the loopback rule and a clean SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.cli._processes import CLI
from tests.codemode.conftest import Stack
from tests.mcp_serve.conftest import (
    INITIALIZE,
    REPO,
    HttpServer,
    child_env,
    register_tools,
    serve_argv,
    start_http,
    stop,
)

MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


async def post(server: HttpServer, body: Any, **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=30) as http:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await http.post(server.url, content=content, headers={**MCP_HEADERS, **headers})


async def test_the_python_client_runs_a_program_over_streamable_http(
    stack: Stack, tmp_path: Path, http_servers: list[HttpServer]
) -> None:
    tools = register_tools(stack)
    agent = await stack.code_agent()
    server = await start_http(stack.running.address, agent, log=tmp_path / "serve.log")
    http_servers.append(server)
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    headers = {"Authorization": f"Bearer {server.secret}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(server.url, http_client=http), mode="legacy") as client,
    ):
        assert [t.name for t in (await client.list_tools()).tools] == ["run_code"]
        program = "return [(await tools.double({'n': n}))['doubled'] for n in (1, 2)]"
        result = await client.call_tool(
            "run_code", {"code": program, "description": "two"}, progress_callback=on_progress
        )
    assert not result.is_error, result.content
    assert result.structured_content == {"logs": [], "result": [2, 4]}
    assert tools.doubled == [1, 2]
    assert [m.split(" ")[0] for m in seen] == ["started", "settled", "started", "settled"]
    assert stop(server.proc) == 0  # SIGTERM: a clean exit
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


async def test_a_foreign_origin_a_rebinding_host_or_no_secret_is_refused(
    stack: Stack, tmp_path: Path, http_servers: list[HttpServer]
) -> None:
    register_tools(stack)
    agent = await stack.code_agent()
    server = await start_http(
        stack.running.address,
        agent,
        "--allow-origin",
        "http://localhost:6274",
        log=tmp_path / "serve.log",
    )
    http_servers.append(server)
    port = server.url.split(":")[2].split("/")[0]
    secret = {"Authorization": f"Bearer {server.secret}"}
    before = len((await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))).records)

    # What a page on another site sends: its own Origin (even holding the secret).
    evil = await post(server, INITIALIZE, Origin="https://evil.example", **secret)
    assert evil.status_code == 403
    # A "simple" cross-site request (no preflight): text/plain, no secret.
    simple = await post(
        server,
        json.dumps(INITIALIZE).encode(),
        **{"Content-Type": "text/plain", "Origin": "https://evil.example"},
    )
    assert simple.status_code in (401, 403)
    # Another loopback port is another origin too.
    other_port = await post(server, INITIALIZE, Origin="http://127.0.0.1:1", **secret)
    assert other_port.status_code == 403
    # DNS rebinding: the attacker's name resolving to 127.0.0.1 arrives as its Host.
    rebound = await post(server, INITIALIZE, Host=f"evil.example:{port}", **secret)
    assert rebound.status_code == 421
    assert (await post(server, INITIALIZE)).status_code == 401  # no secret
    wrong = await post(server, INITIALIZE, Authorization="Bearer guessed")
    assert wrong.status_code == 401

    # The server's own origin, an allowed one, and no Origin (not a browser) are served.
    for origin in (f"http://127.0.0.1:{port}", "http://localhost:6274", None):
        extra = {"Origin": origin} if origin else {}
        answer = await post(server, INITIALIZE, **secret, **extra)
        assert answer.status_code == 200, (origin, answer.text)
    after = len((await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))).records)
    assert after == before  # nothing refused reached the registry


async def test_a_huge_request_is_refused_and_the_server_goes_on(
    stack: Stack, tmp_path: Path, http_servers: list[HttpServer]
) -> None:
    agent = await stack.code_agent()
    server = await start_http(
        stack.running.address, agent, "--max-request-bytes", "65536", log=tmp_path / "serve.log"
    )
    http_servers.append(server)
    secret = {"Authorization": f"Bearer {server.secret}"}
    huge = {**INITIALIZE, "params": {**INITIALIZE["params"], "pad": "x" * 200_000}}  # type: ignore[dict-item]
    assert (await post(server, huge, **secret)).status_code == 413
    assert (await post(server, INITIALIZE, **secret)).status_code == 200


@pytest.mark.parametrize(
    ("listen", "why"),
    [
        ("0.0.0.0:0", "not a wildcard"),
        ("192.0.2.7:8080", "not a loopback address"),
        ("localhost:8080", "name an IP address"),
    ],
)
async def test_a_non_loopback_bind_is_refused_without_the_flag(listen: str, why: str) -> None:
    argv = [*CLI, "mcp", "serve", "--agent", "a", "--transport", "http", "--listen", listen]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=child_env(),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert why in err.decode() and out == b""


async def test_sigterm_while_a_call_runs_ends_the_call_and_the_process(
    stack: Stack, tmp_path: Path
) -> None:
    tools = register_tools(stack)
    agent = await stack.code_agent()
    server = await start_http(stack.running.address, agent, log=tmp_path / "serve.log")
    headers = {"Authorization": f"Bearer {server.secret}"}
    code: int | None = None
    try:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(server.url, http_client=http), mode="legacy") as client,
        ):
            call = asyncio.create_task(
                client.call_tool("run_code", {"code": "await tools.hang({})", "description": "h"})
            )
            await asyncio.wait_for(tools.hang_started.wait(), 30)
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(tools.hang_aborted.wait(), 30)  # the run was aborted
            code = await asyncio.to_thread(server.proc.wait, 30)
            call.cancel()
    except Exception:  # the session breaking as its server goes away is expected here
        pass
    finally:
        stop(server.proc)
    assert code == 0


async def test_a_port_in_use_is_a_usage_error_without_a_traceback(stack: Stack) -> None:
    agent = await stack.code_agent()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = serve_argv(stack.running.address, agent, "--transport", "http")
        argv += ["--listen", f"127.0.0.1:{port}"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=child_env(),
            cwd=REPO,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in err.decode()
    assert "Traceback" not in err.decode() and out == b""
