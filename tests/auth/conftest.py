"""A registry with authentication on, over real gRPC and TLS: certificates and a JWT signing
key made at test time, a static token, a JWKS file, and grants for a handful of principals.

Principals (see `GRANTS`):
- `cert:spiffe://codemode/admin`: manage everything, nothing else;
- `token:alice`: execute, approve and register for `agents/alice`;
- `jwt:bob`: the same for `agents/bob`;
- `cert:spiffe://codemode/provider-*`: register into the global scope and every agent;
- `jwt:carol`: cordis (page runners) for `agents/carol`, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from registry_service.config import RegistrySettings
from registry_service.server import RunningRegistry, start
from tests.auth.certs import Authority
from tests.registry.conftest import echo_tool, harness, make_registry

ISSUER = "https://issuer.test"
AUDIENCE = "codemode-registry"
ALICE_TOKEN = "alice-static-token-0123456789"
AGENTS = ("alice", "bob", "carol")

GRANTS: list[dict[str, Any]] = [
    {"principals": ["cert:spiffe://codemode/admin"], "permissions": ["manage"], "resources": ["*"]},
    {
        "principals": ["token:alice"],
        "permissions": ["execute", "approve", "register"],
        "resources": ["agents/alice"],
    },
    {
        "principals": ["jwt:bob"],
        "permissions": ["execute", "approve", "register"],
        "resources": ["agents/bob"],
    },
    {
        "principals": ["cert:spiffe://codemode/provider-*"],
        "permissions": ["register"],
        "resources": ["global", "agents/*"],
    },
    {"principals": ["jwt:carol"], "permissions": ["cordis"], "resources": ["agents/carol"]},
]


class Signer:
    """Signs JWTs with an RSA key whose public half is in the registry's JWKS file."""

    def __init__(self, kid: str = "k1") -> None:
        self.kid = kid
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self) -> dict[str, Any]:
        jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(self._key.public_key()))
        return {**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}

    def token(self, sub: str, **claims: Any) -> str:
        now = int(time.time())
        body = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600}
        body.update(claims)
        return jwt.encode(body, self._key, algorithm="RS256", headers={"kid": self.kid})


@dataclass
class AuthRegistry:
    running: RunningRegistry
    ca: Authority
    signer: Signer
    files: Path
    _channels: list[grpc.aio.Channel] = field(default_factory=list)

    def stub(
        self, *, cert: str | None = None, bearer: str | None = None
    ) -> tuple[rpb_grpc.RegistryServiceStub, tuple[tuple[str, str], ...]]:
        """A stub over a channel presenting a client certificate with URI SAN `cert` (None:
        one naming nothing), and the call metadata carrying `bearer`."""
        pem = self.ca.client(uri=cert)
        credentials = grpc.ssl_channel_credentials(self.ca.pem, pem.key, pem.cert)
        channel = grpc.aio.secure_channel(f"localhost:{self.running.port}", credentials)
        self._channels.append(channel)
        metadata = () if bearer is None else (("authorization", f"Bearer {bearer}"),)
        return rpb_grpc.RegistryServiceStub(channel), metadata

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def auth_settings(directory: Path, ca: Authority, signer: Signer, **extra: Any) -> RegistrySettings:
    server_cert, server_key = ca.server().write(directory, "server")
    (directory / "ca.pem").write_bytes(ca.pem)
    (directory / "jwks.json").write_text(json.dumps({"keys": [signer.jwk()]}))
    # `extra` may also replace the grants and agents below.
    settings: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "history_path": ":memory:",
        "trace_file": "off",
        "tls_cert_file": server_cert,
        "tls_key_file": server_key,
        "tls_client_ca_file": directory / "ca.pem",
        "auth": {
            "tokens": [{"principal": "alice", "sha256": sha256(ALICE_TOKEN)}],
            "jwt": {"jwks_file": directory / "jwks.json", "issuer": ISSUER, "audience": AUDIENCE},
        },
        "grants": GRANTS,
        "agents": [{"id": name} for name in AGENTS],
    }
    return RegistrySettings(**{**settings, **extra})


@pytest.fixture(scope="session")
def authority() -> Authority:
    return Authority()


@pytest.fixture(scope="session")
def signer() -> Signer:
    return Signer()


@pytest.fixture
async def auth_registry(
    tmp_path: Path, authority: Authority, signer: Signer
) -> AsyncIterator[AuthRegistry]:
    running = await start(auth_settings(tmp_path, authority, signer))
    echo_tool(running.registry, "echo")
    harness = AuthRegistry(running, authority, signer, tmp_path)
    try:
        yield harness
    finally:
        await harness.close()
        await running.stop(0)


@pytest.fixture
def principals(auth_registry: AuthRegistry, signer: Signer) -> dict[str, Any]:
    """Stub and metadata per principal name used in the matrix."""
    return {
        "admin": auth_registry.stub(cert="spiffe://codemode/admin"),
        "alice": auth_registry.stub(bearer=ALICE_TOKEN),
        "bob": auth_registry.stub(bearer=signer.token("bob")),
        "provider": auth_registry.stub(cert="spiffe://codemode/provider-a"),
        "nobody": auth_registry.stub(),
    }


__all__ = ["harness", "make_registry"]  # re-exported fixtures (tests/registry/conftest.py)
