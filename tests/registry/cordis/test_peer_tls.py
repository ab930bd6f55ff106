"""The Cordis peer channel under TLS, with two registries serving TLS on one real PostgreSQL
(the test certificates in tests/tls/): the peer channel dials TLS trusting
`cordis_peer_tls_ca_file` (and presents `cordis_peer_tls_cert_file` where the registries
require client certificates), so a call of a plugin's tool through B runs in A; a peer that
trusts another CA, one without the client certificate mTLS asks for, and a plaintext one are
refused before the peer token could be read, and nothing runs; a tenant's own TLS channel
without the peer token is refused UNAUTHENTICATED. Settings that cannot work stop
the start; TLS without the peer CA leaves the channel off, as before. Plugin hosts are the
in-process hosts of the seam; every wait is a latch."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from codemode_common.tls import ClientTls
from codemode_wire.api.registry.v1 import cordis_peer_pb2 as peer_pb
from codemode_wire.api.registry.v1 import cordis_peer_pb2_grpc as peer_grpc
from registry_service.config import RegistrySettings
from registry_service.cordis_peers import GrpcPeers
from registry_service.domain.cordis.placement import OwnerLost
from registry_service.registry import build_registry
from registry_service.server import start
from tests.registry.conftest import BOTH
from tests.registry.cordis.conftest import CordisHarness
from tests.registry.cordis.hosts import InProcessHosts
from tests.registry.cordis.test_host_owner import AGENT, activations, hosts_of, visible
from tests.registry.cordis.test_replicas import seen

TLS = Path(__file__).resolve().parents[2] / "tls"
SERVER = {"tls_cert_file": TLS / "server.pem", "tls_key_file": TLS / "server.key"}
PEER_CA = {"cordis_peer_tls_ca_file": TLS / "ca.pem"}
PEER_CLIENT = {
    "cordis_peer_tls_cert_file": TLS / "client.pem",
    "cordis_peer_tls_key_file": TLS / "client.key",
}
# Client certificates required: every call also needs a principal and a grant (the harness's
# bearer token); the peer channel has its own check, the peer token.
HARNESS_TOKEN = "harness-token-0123456789abcdef"
MUTUAL = {
    "tls_client_ca_file": TLS / "ca.pem",
    "auth": {
        "tokens": [
            {"principal": "harness", "sha256": hashlib.sha256(HARNESS_TOKEN.encode()).hexdigest()}
        ]
    },
    "grants": [
        {
            "principals": ["token:harness"],
            "permissions": ["manage", "execute", "cordis"],
            "resources": ["*"],
        }
    ],
}


def _pem(name: str) -> bytes:
    return (TLS / name).read_bytes()


@pytest.fixture
def make_tls(pg_database: str) -> Callable[..., Any]:
    """A registry serving TLS on the shared PostgreSQL, with a TLS harness channel (a client
    certificate too, for registries that require one)."""

    @contextlib.asynccontextmanager
    async def factory(**settings: Any) -> AsyncIterator[CordisHarness]:
        config = RegistrySettings(
            **{
                "listen": "127.0.0.1:0",
                "history_store": "postgres",
                "history_dsn": pg_database,
                "token_key": "5e" * 32,
                "cordis_host_lease_s": 3.0,
                **SERVER,
                **settings,
            }
        )
        hosts = InProcessHosts()
        running = await start(config, build_registry(config, plugin_hosts=hosts))
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(_pem("ca.pem"), _pem("client.key"), _pem("client.pem")),
            grpc.access_token_call_credentials(HARNESS_TOKEN),
        )
        channel = grpc.aio.secure_channel(running.address, credentials)
        harness = CordisHarness(running, channel)
        harness.hosts = hosts
        try:
            yield harness
        finally:
            await channel.close()
            await running.stop(0)

    return factory


async def _run_on_a(a: CordisHarness, b: CordisHarness) -> None:
    await a.agent("coder", mode=BOTH)

    async def listed() -> bool:
        try:
            result = await b.call(AGENT, "cordis_inspect_self", {})
        except grpc.aio.AioRpcError:  # NOT_FOUND until B has heard of the agent
            return False
        return not result.is_error

    await seen(listed, bool, "the agent on B")
    await a.define(AGENT)
    await a.ok(AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"})


def _placement(h: CordisHarness) -> Any:
    placement = h.registry.cordis.runner.placement
    assert placement is not None
    return placement


async def _follows(peers: GrpcPeers, address: str) -> str:
    """What following clock-1 at `address` through `peers` gets: its run, or the failure."""
    try:
        async for remote in peers.follow(address, "clock-1"):
            return remote.run_id
    except OwnerLost as exc:
        return f"lost: {exc}"
    finally:
        await peers.close()
    return "ended"


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
async def test_a_forwarded_call_runs_in_the_owner_over_tls(
    make_tls: Callable[..., Any], mutual: bool
) -> None:
    settings = {**PEER_CA, **(PEER_CLIENT | MUTUAL if mutual else {})}
    async with make_tls(**settings) as a, make_tls(**settings) as b:
        await _run_on_a(a, b)
        await seen(lambda: visible(b), lambda names: "clock_now" in names, "the tool on B")
        assert (await b.ok(AGENT, "clock_now", {"via": "b"}))["time"] == "12:00"
        assert hosts_of(a).probe.seen == ["now"]
        assert activations(a) == 1 and activations(b) == 0
        token = RegistrySettings(history_path=":memory:", token_key="5e" * 32).cordis_peer_token()
        assert token is not None
        address = _placement(a).address
        # The same token over a peer channel A does not accept: refused before anything runs.
        stranger = ClientTls(root_ca=_pem("stranger.pem"))  # trusts another CA only
        refusals = [GrpcPeers(token, 1 << 20, tls=stranger), GrpcPeers(token, 1 << 20)]
        if mutual:  # trusts A, but brings no client certificate
            refusals.append(GrpcPeers(token, 1 << 20, tls=ClientTls(root_ca=_pem("ca.pem"))))
        for peers in refusals:
            assert (await _follows(peers, address)).startswith("lost: "), peers
        # A tenant's own TLS channel (its client certificate and bearer token) without the
        # peer token: refused before anything runs, whatever its rights as a caller.
        stub = peer_grpc.CordisPeerServiceStub(a.channel)
        forged = peer_pb.PeerCallToolRequest(
            plugin_id="clock-1", run_id="run-1", tool="clock_now", arguments_json="{}"
        )
        for metadata in ((), (("x-codemode-peer", "guess"),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.PeerCallTool(forged, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        client = (_pem("client.pem"), _pem("client.key")) if mutual else (None, None)
        trusted = ClientTls(_pem("ca.pem"), *client)
        assert await _follows(GrpcPeers(token, 1 << 20, tls=trusted), address) == "run-1"
        assert hosts_of(a).probe.seen == ["now"]  # nothing more ran


async def test_a_peer_that_trusts_another_ca_never_reaches_the_owner(
    make_tls: Callable[..., Any],
) -> None:
    """B trusts a CA that did not sign A's certificate: B never follows A's run (its tool
    stays off B), and A ran nothing for B."""
    async with (
        make_tls(**PEER_CA) as a,
        make_tls(cordis_peer_tls_ca_file=TLS / "stranger.pem") as b,
    ):
        await _run_on_a(a, b)
        # B hears of the lease (the store is shared) and fails to follow it at A.
        runner_b = b.registry.cordis.runner

        async def tried() -> bool:
            await runner_b._look_at_leases(_placement(b), None)
            following = runner_b._following.get("clock-1")
            if following is None:
                return False
            with contextlib.suppress(BaseException):
                await following[1]
            return True

        await seen(tried, bool, "B's attempt to follow A")
        plugin = runner_b.find(AGENT, "clock-1")
        assert plugin is not None and plugin.run is None
        assert "clock_now" not in await visible(b)
        assert hosts_of(a).probe.seen == [] and activations(b) == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (PEER_CA, "this registry serves plaintext"),
        ({**SERVER, **MUTUAL, **PEER_CA}, "the peer channel needs one"),
        ({**SERVER, "cordis_peer_tls_cert_file": TLS / "client.pem"}, "go together"),
        ({**SERVER, "cordis_peer_tls_server_name": "x"}, "needs cordis_peer_tls_ca_file"),
    ],
)
def test_peer_tls_settings_that_cannot_work_stop_the_start(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        RegistrySettings(history_path=":memory:", **settings)


async def test_tls_without_the_peer_ca_keeps_the_peer_channel_off(
    make_tls: Callable[..., Any],
) -> None:
    async with make_tls() as h:
        assert h.registry.cordis.runner.placement is None
