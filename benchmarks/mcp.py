"""MCP figures: the per-call cost of a tool an MCP server provides against a `ToolProvider`
tool, measured in the same run.

Topology (besides this client): a registry whose agent `agents/bench` attaches the stdio MCP
server `benchmarks/_bench_mcp_server.py` (a child the registry supervises; it runs as the
registry's user here, so the benchmark needs no second interpreter), and a provider process
serving `echo` over its Connect stream (`benchmarks/_bench_provider.py`). Both tools answer
the same arguments with the same value; each call is a model-direct ExecuteToolCall of the
agent, result only. Target: the MCP tool's p50 <= 1.5 x the provider tool's p50.

Reference, not part of the target: the same call made by the SDK's own client straight to the
same server over stdio (no registry), what the server and the SDK cost by themselves; the MCP
tool's p50 over it is what the registry adds (the pipeline, history, the gRPC call).

A second figure, `mcp serve`'s round trip against a direct ExecuteToolCall, comes from
`benchmarks/mcp_serve.py` (`measure(quick) -> dict`) when that module is present.

    python -m benchmarks.mcp [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import yaml
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from benchmarks._support import (
    emit,
    interleaved,
    sequential,
    subprocess_service,
    summary_ms,
)
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

ARGS = '{"path":"/tmp/example.txt","limit":10}'
AGENT = "agents/bench"
TARGET = 1.5


def _settings(path: Path) -> None:
    server = {
        "command": sys.executable,
        "args": ["-m", "benchmarks._bench_mcp_server"],
        "env": {"PYTHONPATH": os.pathsep.join(sys.path), "PATH": os.environ.get("PATH", "")},
        "cwd": os.getcwd(),
    }
    path.write_text(
        yaml.safe_dump(
            {
                "history_path": ":memory:",
                "mcp_servers": {"bench": server},
                "mcp_user": str(os.geteuid()),
                "agents": [{"id": "bench", "mcp_servers": ["bench"]}],
            }
        )
    )


async def _visible(stub: rpb_grpc.RegistryServiceStub, *names: str) -> None:
    for _ in range(3000):
        listed = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=AGENT))
        if {*names} <= {t.name for t in listed.tools}:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"{names} never visible to {AGENT}")


async def tool_vs_provider(quick: bool) -> dict[str, Any]:
    count = 300 if quick else 2000
    with tempfile.TemporaryDirectory() as where:
        config = Path(where, "registry.yaml")
        _settings(config)
        async with subprocess_service(
            "-m",
            "registry_service",
            "--config",
            str(config),
            "--listen",
            "127.0.0.1:0",
            ready_prefix="registry listening on port ",
        ) as port:
            address = f"127.0.0.1:{port}"
            async with subprocess_service(
                "-m", "benchmarks._bench_provider", address, ready_prefix="ready"
            ):
                channel = grpc.aio.insecure_channel(address)
                stub = rpb_grpc.RegistryServiceStub(channel)
                await _visible(stub, "echo", "mcp_echo")
                calls = iter(range(10**9))

                def caller(name: str) -> Callable[[], Awaitable[None]]:
                    async def call() -> None:
                        request = rpb.ExecuteToolCallRequest(
                            agent=AGENT,
                            call_id=f"c{next(calls)}",
                            tool_name=name,
                            arguments_json=ARGS,
                            progress_events=rpb.PROGRESS_EVENTS_NONE,
                        )
                        async for event in stub.ExecuteToolCall(request):
                            if event.WhichOneof("event") == "result":
                                assert not event.result.is_error, event.result
                                return

                    return call

                ops = (caller("mcp_echo"), caller("echo"))
                samples = await interleaved(ops, count)
                await channel.close()
    mcp, provider = summary_ms(samples[ops[0]]), summary_ms(samples[ops[1]])
    ratio = mcp["p50_ms"] / provider["p50_ms"]
    reference = await sdk_client_reference(count)
    return {
        "mcp_tool_1_caller": mcp,
        "baseline": {"tool_provider_tool_1_caller": provider},
        "reference_sdk_client_straight_to_the_server": reference,
        "registry_over_reference_p50_ms": round(mcp["p50_ms"] - reference["p50_ms"], 4),
        "ratio_p50": round(ratio, 3),
        "target": f"MCP tool p50 <= {TARGET} x ToolProvider tool p50",
        "meets_target": ratio <= TARGET,
    }


async def sdk_client_reference(count: int) -> dict[str, float]:
    """The same call from the SDK's own client straight to the same server over stdio, no
    registry: what the MCP server and the SDK cost here (a reference, not in the target)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "benchmarks._bench_mcp_server"],
        env={"PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=os.getcwd(),
    )
    arguments = {"path": "/tmp/example.txt", "limit": 10}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()

        async def call() -> None:
            result = await session.call_tool("mcp_echo", arguments)
            assert not result.is_error

        await sequential(call, 50)
        return summary_ms(await sequential(call, count))


def mcp_serve_round_trip(quick: bool) -> dict[str, Any]:
    """The second figure, from `benchmarks/mcp_serve.py` when it is present."""
    try:
        module = importlib.import_module("benchmarks.mcp_serve")
    except ModuleNotFoundError:
        return {"missing": "benchmarks/mcp_serve.py is not in this tree"}
    figure: dict[str, Any] = module.measure(quick)
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (< 1 minute)")
    quick = parser.parse_args().quick
    figures = {
        "mcp_tool_vs_tool_provider": asyncio.run(tool_vs_provider(quick)),
        # Measured after the first figure's processes are gone (its own event loop).
        "mcp_serve_vs_execute_tool_call": mcp_serve_round_trip(quick),
    }
    emit({"benchmark": "mcp", "quick": quick, "figures": figures})


if __name__ == "__main__":
    main()
