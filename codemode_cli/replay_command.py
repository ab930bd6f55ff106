"""`codemode replay FILE [--registry ADDR]`: run an exported trajectory's program again against
its recorded tool results, with no providers, and report the first call that diverges.

The program runs through the real pipeline: a `run_code` call of a fresh agent (code mode, the
recorded language) on a registry and runtime (started here, or `--registry`'s). Its tools are
served by this process, a `ToolProvider` (codemode_cli/replay_tools.py) with one tool per
recorded tool name that answers the program's n-th nested call with the recording's n-th
result when its tool name and arguments are the recorded ones. The first call that differs
(another tool, other arguments, a call the recording does not have, or a recorded call the
program no longer makes) is the divergence: exit status 7 (codemode_cli/exit_codes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

from codemode_cli.exit_codes import ExitCode, for_rpc_failure
from codemode_cli.registry_access import (
    RPC_TIMEOUT_S,
    add_registry_argument,
    describe_failure,
    registry_credentials,
)
from codemode_cli.trajectory import Trajectory, TrajectoryError, loads

if TYPE_CHECKING:
    import grpc

    from codemode_cli.replay_tools import Divergence
    from codemode_client.client import Language

PROG = "codemode replay"
RUN_TIMEOUT_S = 300.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Re-run the program of FILE (from `codemode history export`) against its recorded tool "
        "results, with no providers, and report the first divergent call. Exit status: 0 no "
        "divergence, 7 a divergence, 2 usage or an unreadable file, 4 registry unreachable."
    )
    parser.add_argument("file", metavar="FILE", help="a trajectory file (jsonl or otlp-json)")
    add_registry_argument(
        parser,
        default=None,  # none given: start a runtime and a registry here
        help="use this registry, host:port (default: start a runtime and a registry)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=RUN_TIMEOUT_S,
        metavar="SECONDS",
        help="deadline of the replayed run (default %(default)g)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        trajectory = loads(Path(args.file).read_text(encoding="utf-8"))
        program, description = trajectory.program()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"{PROG}: cannot read {args.file}: {reason}", file=sys.stderr)
        return ExitCode.USAGE
    except TrajectoryError as exc:
        print(f"{PROG}: {args.file}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        credentials = registry_credentials(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    return asyncio.run(_replay(args, trajectory, (program, description), credentials))


async def _replay(
    args: argparse.Namespace,
    trajectory: Trajectory,
    program: tuple[str, str],
    credentials: grpc.ChannelCredentials | None,
) -> int:
    from codemode_cli.processes import StartError

    try:
        async with _registry(args.registry, trajectory.language) as registry:
            return await _against(registry, args, trajectory, program, credentials)
    except StartError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return ExitCode.UNAVAILABLE


@contextlib.asynccontextmanager
async def _registry(given: str | None, language: str) -> AsyncIterator[str]:
    """`given`, else a runtime and a registry started here (temporary history, no tracing)."""
    if given:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="codemode-replay-") as folder:
        work = Path(folder)
        runtime_env = {**os.environ, "CODEMODE_RUNTIME_TRACE_FILE": "off"}
        async with _serving("runtime", runtime_env, work) as runtime_port:
            languages = ["python", "typescript"] if language == "typescript" else ["python"]
            registry_env = {
                **os.environ,
                "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([f"127.0.0.1:{runtime_port}"]),
                "CODEMODE_REGISTRY_RUNTIME_LANGUAGES": json.dumps(languages),
                "CODEMODE_REGISTRY_HISTORY_PATH": str(work / "history.sqlite3"),
                "CODEMODE_REGISTRY_TRACE_FILE": "off",
            }
            async with _serving("registry", registry_env, work) as registry_port:
                yield f"127.0.0.1:{registry_port}"


@contextlib.asynccontextmanager
async def _serving(service: str, env: dict[str, str], work: Path) -> AsyncIterator[str]:
    """`python -m <service>_service` on a free loopback port; yields the port."""
    from codemode_cli.processes import running

    async with running(
        "-m",
        f"{service}_service",
        "--listen",
        "127.0.0.1:0",
        ready=f"{service} listening on port ",
        env=env,
        stderr=work / f"{service}.stderr",
        label=f"the replay's {service}",
    ) as started:
        yield started.rest


async def _against(
    registry: str,
    args: argparse.Namespace,
    trajectory: Trajectory,
    program: tuple[str, str],
    credentials: grpc.ChannelCredentials | None,
) -> int:
    from codemode_cli.replay_tools import ReplayTools
    from codemode_client import RegistryClient
    from codemode_client.errors import CodemodeError

    token = uuid.uuid4().hex[:12]
    agent_id, call_id = f"replay-{token}", f"replay-{token}"
    recorded = trajectory.nested_calls()
    async with RegistryClient(registry, timeout=RPC_TIMEOUT_S, credentials=credentials) as client:
        try:
            language = cast("Language | None", trajectory.language or None)
            agent = await client.create_agent(agent_id, mode="code", language=language)
        except CodemodeError as exc:
            print(f"{PROG}: {describe_failure(exc, registry)}", file=sys.stderr)
            return for_rpc_failure(exc)
        try:
            tools = ReplayTools(client.channel, agent.name, call_id, recorded)
            async with tools.provider():
                code, description = program
                result = await client.run_code(
                    code,
                    description or "codemode replay",
                    agent=agent.name,
                    call_id=call_id,
                    deadline=args.timeout,
                )
        except CodemodeError as exc:
            print(f"{PROG}: {describe_failure(exc, registry)}", file=sys.stderr)
            return for_rpc_failure(exc)
        finally:
            with contextlib.suppress(CodemodeError):
                await client.delete_agent(agent.name)
    divergence = tools.divergence()
    if divergence is not None:
        print(_describe(divergence), file=sys.stderr)
        return ExitCode.DIVERGED
    status = "an error" if result.is_error else "ok"
    print(f"replayed {len(recorded)} calls, no divergence (the result is {status})")
    return ExitCode.OK


def _describe(divergence: Divergence) -> str:
    expected, actual = divergence.expected, divergence.actual
    lines = [f"{PROG}: divergence at call {divergence.index}: {divergence.reason}"]
    if expected is not None:
        lines.append(f"  expected: {expected.tool_name} {_json(expected.arguments)}")
    else:
        lines.append("  expected: no call (the recording ends here)")
    if actual is not None:
        lines.append(f"  actual:   {actual.tool_name} {_json(actual.arguments)}")
    else:
        lines.append("  actual:   no call (the program made no more calls)")
    return "\n".join(lines)


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
