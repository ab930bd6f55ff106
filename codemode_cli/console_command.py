"""`codemode console --registry ADDR --agent AGENT [--port N]`: the web console for one agent.

The console is a Node bridge (`console/` in the repository, built on the TypeScript client) that
serves a page on 127.0.0.1 and is, for the agent, a Cordis page runner (activation approvals,
Client halves in the page, the plugin panel), an approver of its ordinary tool approvals, and a
watcher of its history (live trajectories). This command builds the bridge when its build is
missing or older than its sources, then becomes it (exec): signals and the exit status are the
bridge's own. It prints `console listening on port N` and the page's URL once it serves: the URL
carries a key made for this start, which the browser exchanges for a session cookie; nothing is
served without it.

Toward the registry the console is the principal of `--token-file` (a bearer token) and
`--tls-cert/--tls-key` (a client certificate), the options `codemode run` takes for TLS.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from codemode_cli.exit_codes import ExitCode, for_rpc_failure
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
    import grpc

PROG = "codemode console"
REPO = Path(__file__).resolve().parent.parent
CONSOLE = REPO / "console"
ENTRY = CONSOLE / "dist" / "src" / "main.js"
# What the built bridge and page are made from: a newer file here means a rebuild.
SOURCES = (CONSOLE / "src", CONSOLE / "page", REPO / "clients" / "typescript" / "src")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_registry_argument(parser)
    add_token_argument(parser, "the console acts as that principal")
    parser.add_argument("--agent", required=True, help="the agent, `ID` or `agents/ID`")
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="N",
        help="port for the page (default 0: a free one; the URL is printed)",
    )
    parser.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="IP",
        help="address to serve the page on (default %(default)s). DANGEROUS anywhere but "
        "loopback: whoever on that network learns the URL (sent in plaintext) drives the agent",
    )
    parser.add_argument(
        "--create-agent",
        action="store_true",
        help="create the agent first if it does not exist (mode both, self-modification on)",
    )


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        print(f"{PROG}: --port {args.port} is not a port", file=sys.stderr)
        return 2
    try:
        bind = ipaddress.ip_address(args.bind)
    except ValueError:
        bind = None
    if bind is None or bind.is_unspecified:
        print(f"{PROG}: --bind {args.bind}: name one IP address, not a wildcard", file=sys.stderr)
        return 2
    node = shutil.which("node")
    if node is None:
        print(f"{PROG}: needs Node.js (node on PATH)", file=sys.stderr)
        return 2
    problem = ensure_built()
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    try:
        credentials = registry_credentials(args)
        token = read_token(args.token_file, "--token-file")
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    agent = agent_name(args.agent)
    # Asked here, before the bridge starts, so that an unreachable registry or a missing agent
    # is told in the words `codemode run` uses (not the bridge's raw gRPC error text).
    status, problem = asyncio.run(
        _prepare_agent(args.registry, agent, credentials, token, create=args.create_agent)
    )
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [node, str(ENTRY), "--registry", args.registry, "--agent", agent]
    argv += ["--port", str(args.port), "--bind", args.bind]
    for option, path in (
        ("--tls-ca", args.tls_ca),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
        ("--token-file", args.token_file),
    ):
        if path is not None:
            argv += [option, str(path.resolve())]
    os.execv(node, argv)
    return 0  # not reached


def ensure_built() -> str:
    """Builds the console when its build is missing or stale; a problem's wording, or ""."""
    if not (CONSOLE / "node_modules").is_dir():
        return f"{CONSOLE} has no node_modules: run scripts/bootstrap"
    if ENTRY.exists() and ENTRY.stat().st_mtime >= _newest(SOURCES):
        return ""
    print(f"{PROG}: building {CONSOLE}", file=sys.stderr, flush=True)
    npm = shutil.which("npm")
    if npm is None:
        return "needs npm to build the console"
    built = subprocess.run(
        [npm, "run", "--silent", "build", "--prefix", str(CONSOLE)],
        stdout=sys.stderr,
        check=False,
    )
    return "" if built.returncode == 0 else f"building {CONSOLE} failed"


def _newest(folders: tuple[Path, ...]) -> float:
    return max(
        (p.stat().st_mtime for folder in folders for p in folder.rglob("*") if p.is_file()),
        default=0.0,
    )


async def _prepare_agent(
    registry: str,
    agent: str,
    credentials: grpc.ChannelCredentials | None,
    token: str | None,
    *,
    create: bool,
) -> tuple[int, str]:
    """Checks that the registry answers and the agent exists (creating it with `create`);
    the exit status and wording of a problem, or (0, "")."""
    from codemode_client import RegistryClient
    from codemode_client.errors import CodemodeError

    async with RegistryClient(
        registry, timeout=RPC_TIMEOUT_S, credentials=credentials, bearer_token=token
    ) as client:
        try:
            await client.get_agent(agent)
            return ExitCode.OK, ""
        except CodemodeError as exc:
            if exc.code.name != "NOT_FOUND":
                return for_rpc_failure(exc), describe_failure(exc, registry)
            if not create:
                missing = f"{agent} does not exist at {registry} (pass --create-agent)"
                return ExitCode.NOT_FOUND, missing
        try:
            await client.create_agent(
                agent.removeprefix("agents/"), mode="both", self_modification=True
            )
        except CodemodeError as exc:
            if exc.code.name != "ALREADY_EXISTS":
                return for_rpc_failure(exc), describe_failure(exc, registry)
    return ExitCode.OK, ""
