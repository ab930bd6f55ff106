"""The demo provider process (`python -m codemode_client.demo_tools`): a command line that says
how to use it, and tools that come back after a registry restart, saying so on stderr."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

from tests.clients.test_provider_reconnect import _free_port, _registry, _visible

COMMAND = [sys.executable, "-m", "codemode_client.demo_tools"]


def test_no_address_prints_usage_and_exits_2() -> None:
    done = subprocess.run(COMMAND, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python -m codemode_client.demo_tools")
    assert "the following arguments are required: address" in done.stderr
    assert "Traceback" not in done.stderr


def test_help_prints_help() -> None:
    done = subprocess.run(
        [*COMMAND, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m codemode_client.demo_tools")
    assert "the registry's address" in done.stdout


async def _line(stream: asyncio.StreamReader, wanted: str, within: float = 60) -> str:
    async with asyncio.timeout(within):
        while line := (await stream.readline()).decode():
            if wanted in line:
                return line.strip()
    raise AssertionError(f"the stream ended without a line containing {wanted!r}")


async def test_the_demo_provider_reconnects_after_a_registry_restart_and_says_so() -> None:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    first = await _registry(port)
    proc = await asyncio.create_subprocess_exec(
        *COMMAND, address, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    second = None
    try:
        await _line(proc.stdout, "ready")
        assert "read_file" in await _visible(address, tool="read_file")
        await first.stop(grace=1)  # ends the provider's stream
        lost = await _line(proc.stderr, "reconnecting")
        assert lost.startswith("demo_tools: tool provider 'demo-files': the stream to the registry")
        assert proc.returncode is None  # still running: waiting for a registry
        second = await _registry(port)
        back = await _line(proc.stderr, "registered again")
        assert back == "demo_tools: tool provider 'demo-files': reconnected, tools registered again"
        visible = await _visible(address, tool="read_file")
        assert {"list_files", "read_file", "write_file"} <= set(visible)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if second is not None:
            await second.stop(0)
