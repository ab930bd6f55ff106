"""What `codemode run` and `codemode history` share: the registry address option, agent names,
and one-line wording of RPC failures that names the address."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from codemode_client.errors import CodemodeError

DEFAULT_REGISTRY = "127.0.0.1:50051"  # the registry's default `listen`
RPC_TIMEOUT_S = 10.0


def add_registry_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry",
        default=DEFAULT_REGISTRY,
        metavar="ADDR",
        help="registry address, host:port (default %(default)s)",
    )


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
