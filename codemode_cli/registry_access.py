"""What the commands that call the registry share: the registry address, TLS and bearer-token
options, agent names, and one-line wording of RPC failures that names the address."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

    from codemode_client.errors import CodemodeError

DEFAULT_REGISTRY = "127.0.0.1:50051"  # the registry's default `listen`
RPC_TIMEOUT_S = 10.0


def add_registry_argument(
    parser: argparse.ArgumentParser,
    *,
    default: str | None = DEFAULT_REGISTRY,
    help: str = "registry address, host:port (default %(default)s)",
    inherit: bool = False,
) -> None:
    """`--registry` and the TLS options. `inherit`: a subcommand's copy of its parent
    command's options, which leaves what was given before the subcommand as it was (argparse
    would set the subcommand's defaults over it)."""
    if inherit:
        default = argparse.SUPPRESS
        help = help.replace("%(default)s", DEFAULT_REGISTRY)
    tls_default = argparse.SUPPRESS if inherit else None
    parser.add_argument("--registry", default=default, metavar="ADDR", help=help)
    parser.add_argument(
        "--tls-ca",
        type=Path,
        default=tls_default,
        metavar="PEM",
        help="connect with TLS, trusting this CA bundle (default: plaintext)",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        default=tls_default,
        metavar="PEM",
        help="client certificate (mTLS)",
    )
    parser.add_argument(
        "--tls-key", type=Path, default=tls_default, metavar="PEM", help="its private key"
    )


def registry_credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """TLS credentials from `--tls-ca/--tls-cert/--tls-key` (None: plaintext); TlsFileError
    (a ValueError) names an unreadable file or an incomplete combination."""
    import grpc

    from codemode_common.tls import client_tls

    names = ("--tls-ca", "--tls-cert", "--tls-key", "")
    tls = client_tls(args.tls_ca, args.tls_cert, args.tls_key, names=names)
    if tls is None:
        return None
    return grpc.ssl_channel_credentials(tls.root_ca, tls.private_key, tls.certificate_chain)


def add_token_argument(parser: argparse.ArgumentParser, acting: str) -> None:
    """`--token-file`; `acting` ends its help (what the command does as that principal)."""
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help=f"send the bearer token this file holds with every registry call ({acting})",
    )


def read_token(path: Path | None, option: str) -> str | None:
    """The token a file holds (surrounding whitespace dropped), None without a file; ValueError
    names a file that cannot be read or holds no single token."""
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{option}: cannot read {path}: {exc}") from exc
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"{option}: {path} must hold one token (no spaces)")
    return token


def agent_name(agent: str) -> str:
    """`coder` and `agents/coder` both name the agent `agents/coder`."""
    return agent if agent.startswith("agents/") else f"agents/{agent}"


def describe_failure(exc: CodemodeError, registry: str) -> str:
    """One line: the registry's own refusals carry a reason; transport failures do not."""
    code = exc.code.name
    if code == "UNAVAILABLE" and not exc.reason:
        return f"cannot reach the registry at {registry} ({code})"
    if code == "DEADLINE_EXCEEDED" and not exc.reason:
        return f"the registry at {registry} did not answer in time ({code})"
    why = f"{code}, {exc.reason}" if exc.reason else code
    return f"the registry at {registry} refused: {exc.message} ({why})"
