"""`codemode mcp serve --transport http`: the SDK's streamable HTTP transport, guarded.

Who may drive the agent through this port (the threat model is in docs/security.md): a local
MCP client that holds the per-start secret. Every request must carry
`Authorization: Bearer <secret>` (401 otherwise); `Host` must be exactly the bound address
(421: a DNS-rebinding name never matches); an `Origin`, which browsers send, must be the
server's own or one given with `--allow-origin` (403: a page on another site cannot use a
local MCP server even when it guesses the port); bodies over `--max-request-bytes` get 413.
The Host and Origin checks and the body limit are the SDK's own, given exact lists here (its
loopback default admits any port); the secret is checked before them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from codemode_cli.mcp_adapter import AgentServer

PATH = "/mcp"
GRACE_S = 3.0  # open SSE streams are cut after this on shutdown


@dataclass(frozen=True)
class HttpEndpoint:
    """Where the server listens and whom it admits."""

    host: str
    port: int
    secret: str
    extra_origins: tuple[str, ...] = ()

    @property
    def _authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self._authority}{PATH}"

    def security(self) -> TransportSecuritySettings:
        hosts = [self._authority]
        if ipaddress.ip_address(self.host).is_loopback:
            hosts.append(f"localhost:{self.port}")
        origins = [f"http://{h}" for h in hosts] + list(self.extra_origins)
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        )


class RequireSecret:
    """ASGI middleware: 401 unless `Authorization: Bearer <secret>` (constant-time compare)."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app = app
        self._expected = f"Bearer {secret}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self._expected):
                response = Response(
                    "missing or wrong bearer secret",
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (bound before the app is built, so port 0 resolves first)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling: `serve_http` stops it on SIGTERM/SIGINT
    and the process then exits 0 (uvicorn would re-raise the signal after shutting down)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(
    agent: AgentServer, sock: socket.socket, endpoint: HttpEndpoint, max_request_bytes: int
) -> None:
    """Serves MCP clients on `sock` until SIGTERM or SIGINT."""
    app = agent.server.streamable_http_app(
        streamable_http_path=PATH,
        transport_security=endpoint.security(),
        max_request_body_size=max_request_bytes,
        host=endpoint.host,
    )
    config = uvicorn.Config(
        RequireSecret(app, endpoint.secret),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(GRACE_S),
        h11_max_incomplete_event_size=64 * 1024,
    )
    server = _Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    try:
        await server.serve(sockets=[sock])
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
