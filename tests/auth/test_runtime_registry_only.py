"""The runtime accepts `Run` and `Host` only from registries (no client may run programs on
the RuntimeService directly, bypassing the registry): real mutual TLS with generated certificates;
a certificate the same CA signed for someone else is refused at its first message, before
anything runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from registry_service.config import RegistrySettings
from registry_service.server import start as start_registry
from runtime_service import server as runtime_server
from runtime_service.config import ConfigError, RuntimeSettings, load_settings
from runtime_service.registry_only import RegistryOnly
from runtime_service.server import start as start_runtime
from tests.auth.certs import Authority
from tests.registry.conftest import error_info_of

REGISTRY = "spiffe://codemode/registry"


def _runtime_settings(tmp_path: Path, ca: Authority, **extra: Any) -> RuntimeSettings:
    cert, key = ca.server().write(tmp_path, "runtime")
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    return RuntimeSettings(
        listen="127.0.0.1:0",
        pool_size=1,
        trace_file="off",
        tls_cert_file=cert,
        tls_key_file=key,
        tls_client_ca_file=tmp_path / "ca.pem",
        **extra,
    )


async def _stream_refusal(channel: grpc.aio.Channel, method: str) -> grpc.aio.AioRpcError:
    stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
    message = {
        "Run": runtime_pb2.RunRequest(),
        "Multiplex": runtime_pb2.MultiplexRequest(),
        "Host": runtime_pb2.HostRequest(),
    }[method]
    call = getattr(stub, method)(iter([message]), timeout=30)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    return caught.value


async def test_only_registries_may_run(tmp_path: Path) -> None:
    ca = Authority()
    runtime = await start_runtime(
        _runtime_settings(tmp_path, ca, registry_identities=[f"cert:{REGISTRY}"])
    )
    intruder = ca.client(uri="spiffe://codemode/intruder")
    credentials = grpc.ssl_channel_credentials(ca.pem, intruder.key, intruder.cert)
    try:
        async with grpc.aio.secure_channel(f"localhost:{runtime.port}", credentials) as channel:
            for method in ("Run", "Multiplex", "Host"):
                error = await _stream_refusal(channel, method)
                assert error.code() is grpc.StatusCode.PERMISSION_DENIED, error
                info = error_info_of(error)
                assert info is not None and info.reason == "NOT_A_REGISTRY"
                assert info.domain == "codemode.runtime"
                assert info.metadata["principal"] == "cert:spiffe://codemode/intruder"
            # Describing itself is not running anything: open to any certificate of the CA.
            stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
            await stub.GetCapabilities(runtime_pb2.GetCapabilitiesRequest(), timeout=30)
        # A registry whose certificate names the allowed identity runs programs.
        cert, key = ca.client(uri=REGISTRY).write(tmp_path, "registry")
        registry = await start_registry(
            RegistrySettings(
                listen="127.0.0.1:0",
                history_path=":memory:",
                trace_file="off",
                default_mode="code",
                runtime_targets=[f"localhost:{runtime.port}"],
                runtime_tls_ca_file=tmp_path / "ca.pem",
                runtime_tls_cert_file=cert,
                runtime_tls_key_file=key,
            )
        )
        try:
            async with grpc.aio.insecure_channel(registry.address) as channel:
                request = rpb.ExecuteToolCallRequest(
                    call_id="r-1",
                    tool_name="run_code",
                    arguments_json=jsonvalue.dumps({"code": "return 40 + 2", "description": "d"}),
                    progress_events=rpb.PROGRESS_EVENTS_NONE,
                )
                registry_stub = rpb_grpc.RegistryServiceStub(channel)
                call = registry_stub.ExecuteToolCall(request, timeout=60)
                [response] = [r async for r in call]
            assert not response.result.is_error, response.result.error.message
            value: Any = jsonvalue.loads(response.result.value_json)
            assert value["result"] == 42
        finally:
            await registry.stop(0)
    finally:
        await runtime.stop(0)


async def test_a_refusal_reaches_a_client_whose_first_write_is_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's first message is written only once the guard has refused: a status sent
    before that write arrives failed it, and grpc.aio's client then reported INTERNAL
    "Internal error from Core" instead of the refusal (most of the time, not always)."""
    refused = asyncio.Event()

    class Watched(RegistryOnly):
        async def __call__(self, context: Any, method: str, request: Any | None) -> Any:
            try:
                return await super().__call__(context, method, request)
            except Exception:
                refused.set()
                raise

    monkeypatch.setattr(runtime_server, "RegistryOnly", Watched)
    ca = Authority()
    runtime = await start_runtime(
        _runtime_settings(tmp_path, ca, registry_identities=[f"cert:{REGISTRY}"])
    )
    intruder = ca.client(uri="spiffe://codemode/intruder")
    credentials = grpc.ssl_channel_credentials(ca.pem, intruder.key, intruder.cert)
    try:
        async with grpc.aio.secure_channel(f"localhost:{runtime.port}", credentials) as channel:
            stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
            for method in ("Run", "Host") * 5:
                refused.clear()
                message = runtime_pb2.RunRequest() if method == "Run" else runtime_pb2.HostRequest()

                async def late(message: Any = message) -> AsyncIterator[Any]:
                    await refused.wait()
                    yield message

                call = getattr(stub, method)(late(), timeout=30)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    async for _ in call:
                        pass
                error = caught.value
                assert error.code() is grpc.StatusCode.PERMISSION_DENIED, error.details()
                info = error_info_of(error)
                assert info is not None and info.reason == "NOT_A_REGISTRY"
    finally:
        await runtime.stop(0)


def test_registry_identities_need_client_certificates() -> None:
    with pytest.raises(ConfigError, match="registry_identities needs tls_client_ca_file"):
        load_settings(None, registry_identities=[f"cert:{REGISTRY}"])


async def test_an_open_runtime_on_a_public_address_warns_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = RuntimeSettings(listen="0.0.0.0:0", pool_size=0, trace_file="off")
    with caplog.at_level(logging.WARNING):
        runtime = await start_runtime(settings)
        await runtime.stop(0)
    warnings = [r.getMessage() for r in caplog.records if "SECURITY WARNING" in r.getMessage()]
    assert len(warnings) == 1 and "runtime" in warnings[0], warnings


async def test_a_plaintext_health_port_beside_a_mutual_tls_one(tmp_path: Path) -> None:
    """Probes that speak no TLS (the kubelet's) check health on `health_listen`; nothing else
    is served there, and the RuntimeService port still requires a certificate."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    ca = Authority()
    runtime = await start_runtime(
        _runtime_settings(
            tmp_path,
            ca,
            registry_identities=[f"cert:{REGISTRY}"],
            health_listen="127.0.0.1:0",
        )
    )
    try:
        assert runtime.health_port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.health_port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            reply = await check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetCapabilities(runtime_pb2.GetCapabilitiesRequest(), timeout=10)
            assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as plaintext:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await health_pb2_grpc.HealthStub(plaintext).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        await runtime.stop(0)
