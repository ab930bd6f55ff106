"""`codemode mcp serve --agent AGENT`: serve one agent as an MCP server (docs/mcp-serve.md).

Over stdio (the default: an MCP client starts this command) or streamable HTTP on loopback
(`--transport http --listen 127.0.0.1:PORT`). Toward the registry it is exactly the principal
of `--token-file` and `--tls-cert/--tls-key`, the options `codemode console` takes. It reads
the agent's presentation once before serving, so a wrong address, agent or credential fails at
start (exit 2) instead of inside the MCP client. Exit status: 0 after stdin closes or
SIGTERM/SIGINT, 2 usage, file or connection errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from codemode_cli.arguments import host_port, positive_int, positive_seconds
from codemode_cli.registry_access import (
    RPC_TIMEOUT_S,
    add_registry_argument,
    add_token_argument,
    agent_name,
    describe_failure,
    read_token,
    registry_credentials,
)

if TYPE_CHECKING:
    import socket

    import grpc

    from codemode_cli.mcp_adapter import AgentServer

PROG = "codemode mcp serve"
DEFAULT_LISTEN = "127.0.0.1:0"
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True, help="the agent, `ID` or `agents/ID`")
    add_registry_argument(parser)
    add_token_argument(parser, "the MCP server acts as that principal, and only as it")
    parser.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default: the MCP client starts this command) or streamable HTTP",
    )
    parser.add_argument(
        "--listen",
        type=host_port,
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help="HTTP address (default %(default)s: a free loopback port, printed)",
    )
    parser.add_argument(
        "--allow-non-loopback",
        action="store_true",
        help="allow --listen on an address other than loopback. DANGEROUS: the secret and "
        "every call cross that network in plaintext",
    )
    parser.add_argument(
        "--http-secret-file",
        type=Path,
        metavar="FILE",
        help="the bearer secret HTTP clients must send (default: a new one, printed at start)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="also admit HTTP requests whose Origin is this (e.g. http://localhost:6274); "
        "repeatable. Requests with another Origin are refused (403)",
    )
    parser.add_argument(
        "--elicit-approvals",
        action="store_true",
        help="ask the MCP client's user (MCP elicitation) to approve this server's calls that "
        "need approval; needs the approve permission. While it runs, the agent always has an "
        "approver connected, so approvals of others' calls wait for another approver",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="N",
        help="largest MCP message accepted (default %(default)s)",
    )
    parser.add_argument(
        "--call-timeout",
        type=positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="deadline of each tool call; the registry aborts it after that (default 300)",
    )
    parser.add_argument(
        "--watch-interval",
        type=positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often the agent's tools are re-read to announce changes (default 2)",
    )


def _check_listen(args: argparse.Namespace) -> str:
    """Why `--listen` is refused, or ""."""
    host = args.listen[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"--listen {host}: name an IP address (e.g. 127.0.0.1), not a host name"
    if address.is_unspecified:
        return f"--listen {host}: name one IP address, not a wildcard"
    if not address.is_loopback and not args.allow_non_loopback:
        return (
            f"--listen {host} is not a loopback address: whoever reaches it drives the agent; "
            "pass --allow-non-loopback to do it anyway"
        )
    return ""


def _closed_stdio() -> str:
    """Why stdio cannot be served: stdin or stdout not open. Checked before anything opens a
    file, which would otherwise take the free descriptor and be served as the wire."""
    closed = []
    for fd, name in ((0, "stdin"), (1, "stdout")):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(name)
    if not closed:
        return ""
    return f"{' and '.join(closed)} not open: --transport stdio serves the MCP client on both"


def run(args: argparse.Namespace) -> int:
    if args.transport == "stdio" and (problem := _closed_stdio()):
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    if args.transport == "http" and (problem := _check_listen(args)):
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    try:
        credentials = registry_credentials(args)
        token = read_token(args.token_file, "--token-file")
        secret = read_token(args.http_secret_file, "--http-secret-file")
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"{PROG}: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(args, credentials, token, secret))
    return 0


async def _serve(
    args: argparse.Namespace,
    credentials: grpc.ChannelCredentials | None,
    token: str | None,
    secret: str | None,
) -> int:
    from codemode_cli.mcp_adapter import AgentServer, fetch_presentation
    from codemode_cli.mcp_approvals import ElicitedApprovals
    from codemode_client import RegistryClient
    from codemode_client.errors import CodemodeError

    agent = agent_name(args.agent)
    async with RegistryClient(
        args.registry,
        timeout=RPC_TIMEOUT_S,
        credentials=credentials,
        bearer_token=token,
    ) as client:
        try:
            presentation = await fetch_presentation(client, agent)
        except CodemodeError as exc:
            print(f"{PROG}: {agent}: {describe_failure(exc, args.registry)}", file=sys.stderr)
            return 2
        approvals = ElicitedApprovals(client.channel, agent) if args.elicit_approvals else None
        server = AgentServer(
            client, agent, presentation, call_timeout_s=args.call_timeout, approvals=approvals
        )
        watcher = asyncio.create_task(server.watch_catalog(args.watch_interval))
        if approvals is not None:
            await approvals.start()
        try:
            if args.transport == "stdio":
                return await _serve_stdio(server, args.max_request_bytes)
            return await _serve_http(args, server, secret)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if approvals is not None:
                await approvals.close()


async def _serve_stdio(server: AgentServer, max_request_bytes: int) -> int:
    from codemode_cli.mcp_stdio import serve_stdio

    await serve_stdio(server, max_request_bytes)  # until stdin closes or SIGTERM/SIGINT
    return 0


async def _serve_http(args: argparse.Namespace, server: AgentServer, secret: str | None) -> int:
    from codemode_cli.mcp_http import HttpEndpoint, bind, serve_http

    host, port = args.listen[0].strip("[]"), args.listen[1]
    try:
        sock: socket.socket = bind(host, port)
    except OSError as exc:
        print(f"{PROG}: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    endpoint = HttpEndpoint(
        host,
        sock.getsockname()[1],
        secret or secrets.token_urlsafe(32),
        tuple(args.allow_origin),
    )
    print(f"mcp serve: {server.agent} on {endpoint.url}", flush=True)
    if secret is None:
        print(f"mcp serve: clients send Authorization: Bearer {endpoint.secret}", flush=True)
    if not ipaddress.ip_address(host).is_loopback:
        print(f"{PROG}: SECURITY WARNING: serving {server.agent} on {host}", file=sys.stderr)
    await serve_http(server, sock, endpoint, args.max_request_bytes)
    return 0
