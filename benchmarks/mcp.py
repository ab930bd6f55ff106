"""MCP figures: the per-call cost of a tool an MCP server provides against a `ToolProvider`
tool, measured in the same run.

Topology (besides this client): a registry whose agent `agents/bench` attaches the stdio MCP
server `benchmarks/_bench_mcp_server.py` (a child the registry supervises; it runs as the
registry's user here, so the benchmark needs no second interpreter), and a provider process
serving `echo` over its Connect stream (`benchmarks/_bench_provider.py`). Both tools answer
the same arguments with the same value; each call is a model-direct ExecuteToolCall of the
agent, result only. Target: the MCP tool's p50 <= 1.5 x the provider tool's p50.

References, not part of the target: the same call made by the SDK's own client straight to the
same server over stdio (no registry), what the server and the SDK cost by themselves; the MCP
tool's p50 over it is what the registry adds (the pipeline, history, the gRPC call). And the same
call made by a line client (one JSON-RPC line written, one read: `benchmarks.mcp_serve`'s
`LineClient`) straight to the same server: the server's own round trip, pipes included, with no
client SDK, the floor under any MCP client's hop to it.

CPU per call (`cpu_us_per_call`: each process's threads' `/proc/<pid>/task/*/schedstat`, over
`CPU_CALLS` more calls of each path after the sampled ones, interleaved): the registry's for each
path, and the tool's own process (the MCP server, the provider). The registry's MCP figure minus
its provider figure is what its MCP client costs against its provider stream; the split holds
under load, where the latency ratio swings (`uptime` beside each run).

A second figure, `mcp serve`'s round trip against a direct ExecuteToolCall, comes from
`benchmarks/mcp_serve.py` (`measure(quick) -> dict`) when that module is present.

    python -m benchmarks.mcp [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    child_running,
    emit,
    interleaved,
    sequential,
    subprocess_service,
    summary_ms,
)
from benchmarks.mcp_serve import LineClient
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

ARGS = '{"path":"/tmp/example.txt","limit":10}'
AGENT = "agents/bench"
TARGET = 1.5
CPU_CALLS = 500  # per path, in five interleaved blocks after the sampled calls
SERVER_MODULE = "benchmarks._bench_mcp_server"


def _cpu_s(pid: int) -> float:
    """CPU time process `pid` used so far, all its threads (`schedstat`: nanoseconds, where
    `/proc/<pid>/stat` counts 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(FileNotFoundError),  # a thread that just ended
            open(f"/proc/{pid}/task/{task}/schedstat") as handle,
        ):
            total += int(handle.read().split()[0])
    return total / 1e9


def _child(parent: int, marker: str) -> int:
    """The pid of `parent`'s child whose command line holds `marker` (this benchmark's own
    service processes, and the registry's MCP server child)."""
    return child_running(parent, marker.encode())


async def _cpu_per_call(
    ops: tuple[Callable[[], Awaitable[None]], ...], pids: tuple[tuple[int, ...], ...]
) -> list[list[float]]:
    """Microseconds of CPU per call of each op that each of its `pids` used, over `CPU_CALLS`
    calls of each taken in five interleaved blocks (drift hits every op alike)."""
    used = [[0.0] * len(p) for p in pids]
    for _ in range(5):
        for i, op in enumerate(ops):
            before = [_cpu_s(pid) for pid in pids[i]]
            await sequential(op, CPU_CALLS // 5)
            for j, pid in enumerate(pids[i]):
                used[i][j] += _cpu_s(pid) - before[j]
    return [[round(u / CPU_CALLS * 1e6, 1) for u in row] for row in used]


def _settings(path: Path) -> None:
    server = {
        "command": sys.executable,
        "args": ["-m", SERVER_MODULE],
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
                registry = _child(os.getpid(), "registry_service")
                server = _child(registry, SERVER_MODULE)
                provider_process = _child(os.getpid(), "benchmarks._bench_provider")
                mcp_cpu, provider_cpu = await _cpu_per_call(
                    ops, ((registry, server), (registry, provider_process))
                )
                await channel.close()
    mcp, provider = summary_ms(samples[ops[0]]), summary_ms(samples[ops[1]])
    ratio = mcp["p50_ms"] / provider["p50_ms"]
    reference = await sdk_client_reference(count)
    line = await line_client_reference(count)
    return {
        "mcp_tool_1_caller": mcp,
        "baseline": {"tool_provider_tool_1_caller": provider},
        "reference_sdk_client_straight_to_the_server": reference,
        "reference_line_client_straight_to_the_server": line,
        "registry_over_reference_p50_ms": round(mcp["p50_ms"] - reference["p50_ms"], 4),
        "cpu_us_per_call": {
            "registry_mcp_tool": mcp_cpu[0],
            "registry_tool_provider_tool": provider_cpu[0],
            "registry_mcp_over_provider": round(mcp_cpu[0] - provider_cpu[0], 1),
            "mcp_server_process": mcp_cpu[1],
            "tool_provider_process": provider_cpu[1],
        },
        "ratio_p50": round(ratio, 3),
        "target": f"MCP tool p50 <= {TARGET} x ToolProvider tool p50",
        "meets_target": ratio <= TARGET,
    }


async def sdk_client_reference(count: int) -> dict[str, float]:
    """The same call from the SDK's own client straight to the same server over stdio, no
    registry: what the MCP server and the SDK cost here (a reference, not in the target)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", SERVER_MODULE],
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


async def line_client_reference(count: int) -> dict[str, float]:
    """The same call from a line client straight to the same server: the server's own round
    trip over its pipes, no client SDK on this side (a reference, not in the target)."""
    client = await LineClient.start(sys.executable, "-m", SERVER_MODULE)
    try:
        await client.request("tools/list", {})
        params = {"name": "mcp_echo", "arguments": {"path": "/tmp/example.txt", "limit": 10}}

        async def call() -> None:
            answer = await client.request("tools/call", params)
            assert not answer["result"].get("isError"), answer

        await sequential(call, 50)
        return summary_ms(await sequential(call, count))
    finally:
        await client.close()


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
