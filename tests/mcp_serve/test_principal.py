"""`codemode mcp serve` acts as exactly the principal of its credentials and for its one agent:
with authorization on it cannot serve another principal's agent, and nothing an MCP client sends
reaches a tool of another agent."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from mcp import Client

from tests.auth.certs import Authority
from tests.mcp_serve.conftest import register_tools, serve_process, stdio_server

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"


def auth(**extra: Any) -> dict[str, Any]:
    def digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    return {
        "auth": {
            "tokens": [
                {"principal": "alice", "sha256": digest(ALICE)},
                {"principal": "bob", "sha256": digest(BOB)},
            ]
        },
        "grants": [
            {
                "principals": ["token:alice"],
                "permissions": ["execute"],
                "resources": ["agents/alice"],
            },
            {"principals": ["token:bob"], "permissions": ["execute"], "resources": ["agents/bob"]},
        ],
        "agents": [{"id": "alice"}, {"id": "bob"}],
        **extra,
    }


async def serve_exit(registry: str, agent: str, *extra: str) -> tuple[int | None, str]:
    proc = await serve_process(registry, agent, *extra)
    _, err = await asyncio.wait_for(proc.communicate(b""), 60)
    return proc.returncode, err.decode()


async def test_it_cannot_serve_another_principals_agent(make_stack: Any, tmp_path: Path) -> None:
    (tmp_path / "alice.token").write_text(ALICE + "\n")
    alice = ("--token-file", str(tmp_path / "alice.token"))
    async with make_stack(**auth()) as stack:
        register_tools(stack, scope="agents/bob")
        address = stack.running.address
        code, err = await serve_exit(address, "agents/bob", *alice)
        assert code == 2
        assert "PERMISSION_DENIED" in err and "token:alice" in err
        code, err = await serve_exit(address, "agents/alice")  # no credentials at all
        assert code == 2 and "UNAUTHENTICATED" in err


async def test_nothing_an_mcp_client_sends_reaches_another_agents_tools(
    make_stack: Any, tmp_path: Path
) -> None:
    (tmp_path / "alice.token").write_text(ALICE)
    async with make_stack(**auth()) as stack:
        bobs = register_tools(stack, scope="agents/bob")  # bob's own tools only
        server = stdio_server(
            stack.running.address, "agents/alice", "--token-file", str(tmp_path / "alice.token")
        )
        async with Client(server, mode="legacy") as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["run_code"]
            assert "double" not in str(client.instructions)
            direct = await client.call_tool("double", {"n": 1})
            assert direct.is_error and direct.meta is not None
            assert direct.meta["codemode"]["error_code"] == "UNKNOWN_TOOL"
            nested = await client.call_tool(
                "run_code",
                {"code": "return await tools.double({'n': 1})", "description": "reach bob"},
            )
            assert nested.is_error
            # An argument naming another agent is only an argument of alice's run_code.
            program = "return await tools.double({'n': 2})"
            sneaky = await client.call_tool(
                "run_code", {"code": program, "description": "x", "agent": "agents/bob"}
            )
            assert sneaky.is_error and "double" in str(sneaky.content)
    assert bobs.doubled == []


async def test_over_mutual_tls_it_acts_as_its_certificates_principal(
    make_stack: Any, tmp_path: Path
) -> None:
    """`--tls-ca/--tls-cert/--tls-key`: the client certificate's URI SAN is the principal, which
    may run its own agent's programs and is refused another principal's agent."""
    ca = Authority()
    server_cert, server_key = ca.server().write(tmp_path, "server")
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    cert, key = ca.client(uri="spiffe://codemode/alice").write(tmp_path, "alice")
    settings = {
        "tls_cert_file": server_cert,
        "tls_key_file": server_key,
        "tls_client_ca_file": tmp_path / "ca.pem",
        "grants": [
            {
                "principals": ["cert:spiffe://codemode/alice"],
                "permissions": ["execute"],
                "resources": ["agents/alice"],
            }
        ],
        "agents": [{"id": "alice", "mode": "code"}, {"id": "bob", "mode": "code"}],
    }
    tls = ("--tls-ca", str(tmp_path / "ca.pem"), "--tls-cert", str(cert), "--tls-key", str(key))
    async with make_stack(**settings) as stack:
        tools = register_tools(stack)
        address = stack.running.address
        async with Client(stdio_server(address, "agents/alice", *tls), mode="legacy") as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["run_code"]
            result = await client.call_tool(
                "run_code", {"code": "return await tools.double({'n': 3})", "description": "x"}
            )
        assert not result.is_error, result.content
        assert result.structured_content == {"logs": [], "result": {"doubled": 6}}
        assert tools.doubled == [3]
        code, err = await serve_exit(address, "agents/bob", *tls)
        assert code == 2
        assert "PERMISSION_DENIED" in err and "cert:spiffe://codemode/alice" in err
        code, err = await serve_exit(address, "agents/alice")  # plaintext: no handshake
        assert code != 0
