"""What forwarding costs a dynamic tool call whose plugin host runs in another registry.

Topology: two registries in this process on one PostgreSQL database (a throwaway loopback
cluster that `scripts/postgres` starts and removes), sharing a peer secret, with a minimal
plugin host of the seam in each (`echo` returns its arguments; no runtime, so the figure is
the registries' own cost). The plugin runs on A. Interleaved series of model-direct calls of
`echo`: on A (the owner: the baseline) and on B (B's pipeline, then the peer channel to A's
host). Reported: latency per series, and the process CPU per call of each series (both
registries and the client live in this process, so forwarding's CPU on both ends is counted).

Target: a forwarded call costs at most one extra loopback unary gRPC round trip over the
direct call, here taken as at most 2x the direct call's p50 latency and CPU.

With `--tls` both registries serve TLS (the test certificates in tests/tls/) and the peer
channel dials TLS (`cordis_peer_tls_ca_file`); the client's calls go over TLS too, so the
baseline is the same call on the owner over TLS.

    python -m benchmarks.cordis_forward [--quick] [--tls]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from benchmarks._support import emit, interleaved, summary_ms
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2
from codemode_wire.jsonvalue import JsonValue
from registry_service.config import RegistrySettings
from registry_service.domain.plugin_hosts import (
    ActivationSpec,
    DynamicToolSpec,
    HostEvents,
    HostRegistrations,
    ServiceSpec,
)
from registry_service.domain.signals import AbortSignal
from registry_service.registry import build_registry
from registry_service.server import RunningRegistry, start

ROOT = Path(__file__).resolve().parents[1]
TLS = ROOT / "tests" / "tls"
AGENT = "agents/bench"
ECHO = DynamicToolSpec("echo", "Echo.", {"type": "object", "additionalProperties": True})


class _EchoHost:
    registrations = HostRegistrations(tools=(ECHO,))

    async def call_tool(self, name: str, arguments: JsonValue, signal: AbortSignal) -> JsonValue:
        return arguments

    async def call_service(
        self, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        return None

    def update_services(self, services: tuple[ServiceSpec, ...]) -> None:
        return None

    def deliver_event(self, event: str, payload: JsonValue) -> None:
        return None

    async def call_handler(self, method: str, args: JsonValue) -> JsonValue:
        return None

    async def retract(self) -> None:
        return None


class _EchoHosts:
    async def activate(self, spec: ActivationSpec, events: HostEvents) -> _EchoHost:
        return _EchoHost()


@contextlib.contextmanager
def _postgres() -> Any:
    script = str(ROOT / "scripts" / "postgres")
    done = subprocess.run([script, "start"], capture_output=True, text=True, check=True)
    values = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
    try:
        yield values["CODEMODE_PG_DSN"]
    finally:
        subprocess.run([script, "stop", values["CODEMODE_PG_DIR"]], check=False)


@contextlib.asynccontextmanager
async def _registry(dsn: str, tls: bool) -> AsyncIterator[tuple[RunningRegistry, Any]]:
    served: dict[str, Any] = (
        {
            "tls_cert_file": TLS / "server.pem",
            "tls_key_file": TLS / "server.key",
            "cordis_peer_tls_ca_file": TLS / "ca.pem",
        }
        if tls
        else {}
    )
    config = RegistrySettings(
        listen="127.0.0.1:0",
        history_store="postgres",
        history_dsn=dsn,
        token_key="5e" * 32,
        self_modification=True,
        trace_file="off",
        **served,
    )
    running = await start(config, build_registry(config, plugin_hosts=_EchoHosts()))
    channel = (
        grpc.aio.secure_channel(
            running.address, grpc.ssl_channel_credentials((TLS / "ca.pem").read_bytes())
        )
        if tls
        else grpc.aio.insecure_channel(running.address)
    )
    try:
        yield running, rpb_grpc.RegistryServiceStub(channel)
    finally:
        await channel.close()
        await running.stop(0)


async def _call(stub: Any, name: str, arguments: Any) -> Any:
    request = rpb.ExecuteToolCallRequest(
        agent=AGENT, call_id="c", tool_name=name, arguments_json=jsonvalue.dumps(arguments)
    )
    events = [e async for e in stub.ExecuteToolCall(request)]
    result = events[-1].result
    if result.is_error:
        raise RuntimeError(result.error.message)
    return jsonvalue.loads(result.value_json)


async def _until(check: Any) -> None:
    for _ in range(3000):
        with contextlib.suppress(grpc.aio.AioRpcError, RuntimeError):
            if await check():
                return
        await asyncio.sleep(0.02)
    raise RuntimeError("not ready within 60 s")


async def run(quick: bool, tls: bool = False) -> dict[str, Any]:
    count = 200 if quick else 2000
    with _postgres() as dsn:
        async with _registry(dsn, tls) as (_a, stub_a), _registry(dsn, tls) as (_b, stub_b):
            await stub_a.CreateAgent(
                rpb.CreateAgentRequest(
                    agent_id="bench",
                    agent=scope_pb2.Agent(
                        mode=scope_pb2.PRESENTATION_MODE_NATIVE, self_modification=True
                    ),
                )
            )
            defined = await _call(
                stub_a,
                "cordis_define",
                {
                    "plugin": {"kind": "new", "idPrefix": "echo"},
                    "name": "Echo",
                    "purpose": "Echo.",
                    "code": {"host": "return apply"},
                },
            )
            await _until(
                lambda: _call(stub_b, "cordis_inspect_self", {"pluginId": defined["pluginId"]})
            )
            await _call(
                stub_a,
                "cordis_run",
                {"pluginId": defined["pluginId"], "packageId": defined["packageId"], "mode": "run"},
            )
            await _until(lambda: _call(stub_b, "echo", {"x": 1}))
            cpu: dict[str, float] = {"direct": 0.0, "forwarded": 0.0}

            def timed(label: str, stub: Any) -> Any:
                async def op() -> None:
                    start = time.process_time()
                    await _call(stub, "echo", {"x": 1})
                    cpu[label] += time.process_time() - start

                return op

            direct, forwarded = timed("direct", stub_a), timed("forwarded", stub_b)
            samples = await interleaved([direct, forwarded], count)
            n = len(samples[direct])
            warm = 50
            direct_ms, forwarded_ms = summary_ms(samples[direct]), summary_ms(samples[forwarded])
            direct_cpu = cpu["direct"] / (n + warm) * 1e6
            forwarded_cpu = cpu["forwarded"] / (n + warm) * 1e6
    return {
        "benchmark": "cordis_forward",
        "tls": tls,
        "calls_per_series": n,
        "direct_on_owner": {**direct_ms, "process_cpu_us_per_call": round(direct_cpu, 1)},
        "forwarded_from_other_registry": {
            **forwarded_ms,
            "process_cpu_us_per_call": round(forwarded_cpu, 1),
        },
        "latency_ratio_p50": round(forwarded_ms["p50_ms"] / direct_ms["p50_ms"], 3),
        "cpu_ratio": round(forwarded_cpu / direct_cpu, 3),
        "target": "latency_ratio_p50 <= 2 and cpu_ratio <= 2",
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 calls per series")
    parser.add_argument("--tls", action="store_true", help="registries and peers over TLS")
    args = parser.parse_args()
    emit(asyncio.run(run(args.quick, args.tls)))


if __name__ == "__main__":
    main()
