"""TLS through real gRPC: a registry serving TLS (optionally requiring client certificates), a
registry reaching its runtime over mutual TLS, the CLI's TLS options, and settings that name
files which cannot work. The certificates in tests/tls/ are test-only (a CA, `localhost` /
127.0.0.1 server and client certificates, and a stranger signed by another CA)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from registry_service.config import ConfigError, RegistrySettings, load_settings
from registry_service.server import RunningRegistry
from registry_service.server import start as start_registry
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.codemode.fake_runtime import CHANNELS
from tests.registry.conftest import error_info_of

TLS = Path(__file__).resolve().parents[1] / "tls"


def _pem(name: str) -> bytes:
    return (TLS / name).read_bytes()


def _credentials(client: str | None = "client") -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(_pem("ca.pem"))
    return grpc.ssl_channel_credentials(
        _pem("ca.pem"), _pem(f"{client}.key"), _pem(f"{client}.pem")
    )


async def _visible(channel: grpc.aio.Channel) -> list[str]:
    stub = rpb_grpc.RegistryServiceStub(channel)
    response = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest(), timeout=5)
    return [tool.name for tool in response.tools]


async def _refused(channel: grpc.aio.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _visible(channel)
    return caught.value.code()


@pytest.fixture
async def tls_registry() -> AsyncIterator[RunningRegistry]:
    settings = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        tls_cert_file=TLS / "server.pem",
        tls_key_file=TLS / "server.key",
    )
    running = await start_registry(settings)
    yield running
    await running.stop(0)


async def test_a_tls_registry_serves_tls_only(tls_registry: RunningRegistry) -> None:
    address = tls_registry.address
    async with grpc.aio.secure_channel(address, _credentials(None)) as channel:
        assert "run_code" not in await _visible(channel)  # native default: the call works
    async with grpc.aio.insecure_channel(address) as plaintext:
        assert await _refused(plaintext) == grpc.StatusCode.UNAVAILABLE
    wrong_ca = grpc.ssl_channel_credentials(_pem("stranger.pem"))  # trusts nobody we serve
    async with grpc.aio.secure_channel(address, wrong_ca) as untrusting:
        assert await _refused(untrusting) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate_from_its_ca() -> None:
    settings = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        tls_cert_file=TLS / "server.pem",
        tls_key_file=TLS / "server.key",
        tls_client_ca_file=TLS / "ca.pem",
    )
    running = await start_registry(settings)
    try:
        address = running.address
        async with grpc.aio.secure_channel(address, _credentials("client")) as channel:
            # The handshake passes; then the call needs a principal, which this certificate
            # (no URI or DNS SAN) does not name, and a grant (tests/auth covers both).
            assert await _refused(channel) == grpc.StatusCode.UNAUTHENTICATED
        for credentials in (_credentials(None), _credentials("stranger")):
            async with grpc.aio.secure_channel(address, credentials) as refused:
                assert await _refused(refused) == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop(0)


@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize("target", ["localhost:{port}", "dns:///localhost:{port}"])
async def test_runs_reach_a_runtime_over_mutual_tls(channel: str, target: str) -> None:
    """Also through a `dns:` name, which the multiplexed channel resolves to a channel per
    address: each is reached under the name, so the certificate is checked for it."""
    runtime = await start_runtime(
        RuntimeSettings(
            listen="127.0.0.1:0",
            pool_size=1,
            trace_file="off",
            tls_cert_file=TLS / "server.pem",
            tls_key_file=TLS / "server.key",
            tls_client_ca_file=TLS / "ca.pem",
        )
    )
    common: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "history_path": ":memory:",
        "runtime_targets": [target.format(port=runtime.port)],
        "runtime_tls_ca_file": TLS / "ca.pem",
        "default_mode": "code",
        "runtime_channel": channel,
    }
    with_cert = await start_registry(
        RegistrySettings(
            **common,
            runtime_tls_cert_file=TLS / "client.pem",
            runtime_tls_key_file=TLS / "client.key",
        )
    )
    without_cert = await start_registry(RegistrySettings(**common))
    try:
        assert await _run_code(with_cert) == {"logs": ["over TLS"], "result": 2}
        # The runtime refuses its handshake: no runtime is reachable for this registry.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _run_code(without_cert)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "CODE_RUNTIME_UNAVAILABLE"
        assert info.metadata["phase"] == "connect"
    finally:
        await with_cert.stop(0)
        await without_cert.stop(0)
        await runtime.stop(0)


async def _run_code(registry: RunningRegistry) -> Any:
    async with grpc.aio.insecure_channel(registry.address) as channel:
        stub = rpb_grpc.RegistryServiceStub(channel)
        request = rpb.ExecuteToolCallRequest(
            call_id="tls-1",
            tool_name="run_code",
            arguments_json=jsonvalue.dumps(
                {"code": "print('over TLS')\nreturn 1 + 1", "description": "tls"}
            ),
            progress_events=rpb.PROGRESS_EVENTS_NONE,
        )
        [response] = [r async for r in stub.ExecuteToolCall(request, timeout=30)]
    result = response.result
    if result.is_error:
        return {"code": result.error.code, "message": result.error.message}
    return jsonvalue.loads(result.value_json)


async def test_the_cli_connects_with_its_tls_options(tls_registry: RunningRegistry) -> None:
    async def history(*tls: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "codemode_cli", "history", "--agent", "nobody"],
            *["--registry", tls_registry.address, *tls],
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
        return await process.wait(), stderr.decode()

    # The registry answers over TLS: the agent does not exist (a refusal, not a transport error).
    code, stderr = await history("--tls-ca", str(TLS / "ca.pem"))
    assert code != 0 and "AGENT_NOT_FOUND" in stderr, stderr
    _, stderr = await history()
    assert "cannot reach the registry" in stderr, stderr
    code, stderr = await history("--tls-ca", str(TLS / "absent.pem"))
    assert code == 2 and "--tls-ca: cannot read" in stderr, stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tls_cert_file": TLS / "server.pem"}, "tls_cert_file and tls_key_file go together"),
        ({"tls_client_ca_file": TLS / "ca.pem"}, "tls_client_ca_file needs tls_cert_file"),
        (
            {"tls_cert_file": TLS / "absent.pem", "tls_key_file": TLS / "server.key"},
            "tls_cert_file: cannot read",
        ),
        (
            {"tls_cert_file": Path(__file__), "tls_key_file": TLS / "server.key"},
            "holds no PEM data",
        ),
        ({"runtime_tls_cert_file": TLS / "client.pem"}, "go together"),
        (
            {"runtime_tls_cert_file": TLS / "client.pem", "runtime_tls_key_file": TLS / "x.key"},
            "runtime_tls_key_file: cannot read",
        ),
        ({"runtime_tls_server_name": "runtime"}, "runtime_tls_server_name needs"),
    ],
)
def test_tls_settings_that_cannot_work_stop_the_start(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(history_path=":memory:", **settings)
