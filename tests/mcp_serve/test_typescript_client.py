"""The official TypeScript MCP client (`@modelcontextprotocol/sdk`, tests/mcp_serve/node) against
`codemode mcp serve` over stdio: the same tools, instructions, progress and error codes as the
Python client sees."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from tests.codemode.conftest import Stack
from tests.mcp_serve.conftest import REPO, child_env, register_tools, serve_argv

NODE_DIR = REPO / "tests" / "mcp_serve" / "node"
PROGRAM = "return sum([(await tools.double({'n': n}))['doubled'] for n in range(3)])"


async def test_the_typescript_client_runs_a_program_and_sees_codes(stack: Stack) -> None:
    assert (NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(), (
        "run scripts/bootstrap (it installs tests/mcp_serve/node)"
    )
    tools = register_tools(stack)
    agent = await stack.code_agent()
    prompt = (await stack.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=agent))).text
    env = {
        **child_env(),
        "MCP_SERVE_ARGV": json.dumps(serve_argv(stack.running.address, agent)),
        "MCP_PROGRAM": PROGRAM,
    }
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / "client.mjs"),
        env=env,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    seen: dict[str, Any] = json.loads(out)
    assert seen["instructions"] == prompt
    assert [t["name"] for t in seen["tools"]] == ["run_code"]
    assert "def double" in seen["tools"][0]["description"]
    result = seen["result"]
    assert not result.get("isError"), result
    assert result["structuredContent"] == {"logs": [], "result": 6}
    assert sorted(tools.doubled) == [0, 1, 2]
    messages = [p.get("message", "") for p in seen["progress"]]
    assert sum(m.startswith("settled tools.double") for m in messages) == 3
    failed = seen["failed"]
    assert failed["isError"] is True
    assert failed["_meta"]["codemode"]["error_code"] == "UNKNOWN_TOOL"
