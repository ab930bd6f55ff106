"""When registries place plugin hosts under leases, and how they find and trust each other:
only on a shared PostgreSQL store with a shared secret (`cordis_peer_secret`, else `token_key`);
the peer token is the same for registries sharing the secret and differs otherwise; a SQLite or
in-memory registry keeps running the hosts it activates (no placement, no peer service); the
peer address is `cordis_peer_address`, else the `listen` host, else this machine's address."""

from __future__ import annotations

import socket
from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import cordis_peer_pb2 as peer_pb
from codemode_wire.api.registry.v1 import cordis_peer_pb2_grpc as peer_grpc
from registry_service.config import RegistrySettings
from registry_service.server import peer_address


def _settings(**values: Any) -> RegistrySettings:
    return RegistrySettings(**{"history_path": ":memory:", **values})


def test_the_peer_token_derives_from_the_shared_secret_or_the_token_key() -> None:
    assert _settings().cordis_peer_token() is None
    one, same = _settings(token_key="5e" * 32), _settings(token_key="5e" * 32)
    assert one.cordis_peer_token() == same.cordis_peer_token() is not None
    assert _settings(token_key="6f" * 32).cordis_peer_token() != one.cordis_peer_token()
    secret = _settings(token_key="5e" * 32, cordis_peer_secret="s3cret")
    assert secret.cordis_peer_token() == _settings(cordis_peer_secret="s3cret").cordis_peer_token()
    assert secret.cordis_peer_token() != one.cordis_peer_token()
    assert "s3cret" not in str(secret.cordis_peer_token())


async def test_the_peer_address_is_set_or_the_listen_host_or_this_machine() -> None:
    assert await peer_address(_settings(cordis_peer_address="10.1.2.3:7"), 50051) == "10.1.2.3:7"
    assert await peer_address(_settings(listen="127.0.0.1:0"), 4242) == "127.0.0.1:4242"
    wildcard = await peer_address(_settings(listen="0.0.0.0:50051"), 50051)
    host = wildcard.rsplit(":", 1)[0].strip("[]")
    assert host not in ("0.0.0.0", "") and wildcard.endswith(":50051")
    assert host in {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), 50051)} | {
        socket.gethostname()
    }


async def test_a_registry_without_a_shared_store_runs_its_hosts_and_serves_no_peers(
    make_cordis: Any, pg_database: str
) -> None:
    for settings in (
        {"token_key": "5e" * 32},
        {"history_store": "postgres", "history_dsn": pg_database},
    ):
        async with make_cordis(**settings) as h:
            assert h.registry.cordis.runner.placement is None
            stub = peer_grpc.CordisPeerServiceStub(h.channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.PeerStopHost(peer_pb.PeerStopHostRequest(plugin_id="clock-1"))
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
