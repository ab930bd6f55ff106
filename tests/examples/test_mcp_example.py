"""The README's MCP quick start: an MCP server you already have (examples/mcp/weather_server.py,
streamable HTTP), the registry settings that attach it to a `code` agent
(examples/mcp/registry.yaml), and a model calling its tool through `run_code`
(examples/mcp/model_agent.py, the scripted model offline), printing what its docstring says."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.codemode.conftest import make_stack
from tests.examples.test_examples import printed_lines
from tests.mcp.conftest import tools_of, until

__all__ = ["make_stack"]  # re-exported fixture

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp"
MODEL_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _listening(port: int) -> bool | None:
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.close()
    return True


async def test_a_model_calls_the_mcp_servers_tool_through_run_code(make_stack: Any) -> None:
    port = _free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE / "weather_server.py"),
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await until(lambda: _listening(port), f"the weather server on port {port}")
        settings = yaml.safe_load((EXAMPLE / "registry.yaml").read_text())
        declared = settings["mcp_servers"]["weather"]
        declared["url"] = declared["url"].replace(":8765/", f":{port}/")
        async with make_stack(**settings) as stack:
            await tools_of(stack, "agents/weather", "forecast")
            env = {k: v for k, v in os.environ.items() if k not in MODEL_KEYS}
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, str(EXAMPLE / "model_agent.py"), stack.running.address],
                capture_output=True, text=True, timeout=120, env=env, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == printed_lines(EXAMPLE / "model_agent.py")
    finally:
        server.terminate()
        await server.wait()
