"""`codemode run PROGRAM --agent AGENT`: execute a program as the agent's `run_code` call.

Nested calls are printed as they start and settle, then the outer result (what the model would
see). Exit status (codemode_cli/exit_codes.py): 0 success, 1 the outer result is an error,
2 usage or file errors, 3 no such agent, 4 registry unreachable, 5 --timeout expired,
6 refused, 130 interrupted (the call is cancelled with the RPC).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from codemode_cli.arguments import positive_seconds
from codemode_cli.exit_codes import ExitCode, for_rpc_failure
from codemode_cli.registry_access import (
    RPC_TIMEOUT_S,
    add_registry_argument,
    agent_name,
    describe_failure,
    registry_credentials,
)

if TYPE_CHECKING:
    from codemode_client import RegistryClient
    from codemode_client.client import Language
    from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
    from codemode_wire.api.registry.v1 import tool_pb2
    from codemode_wire.jsonvalue import JsonValue

PROG = "codemode run"
LANGUAGES = ("python", "typescript")
EXTENSIONS = {".py": "python", ".ts": "typescript"}
"""A program file's language by its extension, unless `--language` says otherwise."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Execute PROGRAM_FILE as a run_code call for AGENT through the registry, printing each "
        "nested call as it starts and settles, then the outer result. Exit status: 0 ok, "
        "1 the result is an error, 2 usage, 3 no such agent, 4 registry unreachable, "
        "5 --timeout expired, 6 refused (docs/cli.md)."
    )
    parser.add_argument("program", metavar="PROGRAM_FILE", help="program file; - reads stdin")
    parser.add_argument("--agent", required=True, help="the agent, `ID` or `agents/ID`")
    parser.add_argument(
        "--language",
        choices=LANGUAGES,
        help="the program's language (default: from the extension, .py or .ts; for stdin, the "
        "agent's); the agent must run programs of it, or is created with it by --create-agent",
    )
    add_registry_argument(parser)
    parser.add_argument("--call-id", help="the outer call id (default: run-<random>)")
    parser.add_argument(
        "--description", help="run_code's description (default: `codemode run <file>`)"
    )
    parser.add_argument(
        "--create-agent",
        action="store_true",
        help="create the agent in code mode (with the program's language) if it does not exist",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="deadline of the whole call; the registry aborts the run after it (default 300)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object {call_id, agent, nested, result, is_error, error_code, "
        "value} instead",
    )


def program_language(args: argparse.Namespace) -> str | None:
    """`--language`, else the file's by its extension; None for stdin (the agent's language).
    Raises ValueError for an extension that names no language."""
    if args.language:
        return str(args.language)
    if args.program == "-":
        return None
    suffix = Path(args.program).suffix
    if suffix not in EXTENSIONS:
        known = ", ".join(f"{ext} is {lang}" for ext, lang in EXTENSIONS.items())
        raise ValueError(
            f"cannot tell the language of {args.program} from its extension ({known}); "
            "pass --language python|typescript"
        )
    return EXTENSIONS[suffix]


def run(args: argparse.Namespace) -> int:
    try:
        args.language = program_language(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        if args.program == "-":
            program = sys.stdin.read()
            label = "stdin"
        else:
            program = Path(args.program).read_text(encoding="utf-8")
            label = Path(args.program).name
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"{PROG}: cannot read {args.program}: {reason}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        args.credentials = registry_credentials(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    call_id = args.call_id or f"run-{uuid.uuid4().hex[:12]}"
    description = args.description or f"codemode run {label}"
    try:
        return asyncio.run(_run(args, program, description, call_id))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; call {call_id} was cancelled", file=sys.stderr)
        return ExitCode.INTERRUPTED


@dataclass
class _Nested:
    sub_call_id: str
    tool_name: str
    is_error: bool | None = None  # None: never settled
    error_code: str = ""
    duration_ms: float | None = None


@dataclass
class _Progress:
    """The nested calls seen so far, printed live unless JSON output was asked for."""

    live: bool
    width: int
    nested: dict[str, _Nested] = field(default_factory=dict)
    answered: bool = False  # the call's stream has started

    def greet(self, header: str) -> None:
        """The header line, once the registry has answered (not before a connection error)."""
        if self.live and not self.answered:
            print(header, flush=True)
        self.answered = True

    def on_event(self, event: rpb.ExecuteToolCallResponse) -> None:
        kind = event.WhichOneof("event")
        if kind == "nested_started":
            started = event.nested_started
            entry = _Nested(started.sub_call_id, started.tool_name)
            self.nested[entry.sub_call_id] = entry
            self._line("started", entry, "")
        elif kind == "nested_settled":
            s = event.nested_settled
            entry = self.nested.setdefault(s.sub_call_id, _Nested(s.sub_call_id, s.tool_name))
            entry.is_error, entry.error_code, entry.duration_ms = (
                s.is_error,
                s.error_code,
                s.duration_ms,
            )
            status = f"error {s.error_code}".strip() if s.is_error else "ok"
            self._line("settled", entry, f"{status:<16} {s.duration_ms:8.1f} ms")

    def _line(self, what: str, entry: _Nested, tail: str) -> None:
        if self.live:
            line = f"  {what}  {entry.sub_call_id:<{self.width}}  {entry.tool_name:<16} {tail}"
            print(line.rstrip(), flush=True)


async def _ensure_agent(client: RegistryClient, agent: str, language: Language | None) -> None:
    from codemode_client.errors import AlreadyExists, NotFound

    try:
        await client.get_agent(agent)
    except NotFound:
        with contextlib.suppress(AlreadyExists):  # created concurrently: fine
            await client.create_agent(agent.removeprefix("agents/"), mode="code", language=language)


async def _language_mismatch(client: RegistryClient, agent: str, language: str) -> str | None:
    """Why the agent cannot run a program of `language` (its run_code takes the agent's
    declared language, so a mismatch would only fail later as a syntax error), or None."""
    declared = (await client.get_agent(agent)).effective_code_language
    if declared == language:
        return None
    return (
        f"{agent} runs {declared} programs, not {language}; use an agent declared with "
        f"code_language {language} (or pass --language {declared} if the program is {declared})"
    )


async def _run(args: argparse.Namespace, program: str, description: str, call_id: str) -> int:
    from codemode_client import RegistryClient
    from codemode_client.errors import CodemodeError, DeadlineExceeded, NotFound

    agent = agent_name(args.agent)
    progress = _Progress(live=not args.json, width=len(call_id) + 8)
    result: tool_pb2.ToolResult | None = None
    async with RegistryClient(
        args.registry, timeout=RPC_TIMEOUT_S, read_retries=0, credentials=args.credentials
    ) as client:
        try:
            if args.create_agent:
                await _ensure_agent(client, agent, args.language)
            if args.language and (
                mismatch := await _language_mismatch(client, agent, args.language)
            ):
                print(f"{PROG}: {mismatch}", file=sys.stderr)
                return ExitCode.USAGE
            arguments: JsonValue = {"code": program, "description": description}
            async for event in client.execute(
                "run_code", arguments, agent=agent, call_id=call_id, deadline=args.timeout
            ):
                progress.greet(f"run_code {call_id} · {agent} · registry {args.registry}")
                if event.WhichOneof("event") == "result":
                    result = event.result
                else:
                    progress.on_event(event)
        except CodemodeError as exc:
            message = describe_failure(exc, args.registry)
            if isinstance(exc, NotFound) and exc.reason == "AGENT_NOT_FOUND":
                message = f"{agent} does not exist at {args.registry} (pass --create-agent)"
            elif isinstance(exc, DeadlineExceeded) and progress.answered:
                message = (
                    f"call {call_id} did not finish within --timeout {args.timeout:g} s "
                    "(DEADLINE_EXCEEDED); the registry aborts it"
                )
            print(f"{PROG}: {message}", file=sys.stderr)
            return for_rpc_failure(exc)
    if result is None:
        print(f"{PROG}: the registry ended call {call_id} without a result", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    _print_result(args, call_id, agent, progress, result)
    return ExitCode.FAILED if result.is_error else ExitCode.OK


def _print_result(
    args: argparse.Namespace,
    call_id: str,
    agent: str,
    progress: _Progress,
    result: tool_pb2.ToolResult,
) -> None:
    from codemode_wire import jsonvalue

    text = "\n".join(b.text.text for b in result.content if b.WhichOneof("block") == "text")
    if not args.json:
        status = f"error {result.error.code}".strip() if result.is_error else "ok"
        settled = sum(n.is_error is not None for n in progress.nested.values())
        print(f"result [{status}] ({settled} nested calls):")
        print(text)
        return
    value: JsonValue = jsonvalue.loads(result.value_json) if result.HasField("value_json") else None
    nested: list[JsonValue] = [
        {
            "sub_call_id": n.sub_call_id,
            "tool_name": n.tool_name,
            "is_error": n.is_error,
            "error_code": n.error_code,
            "duration_ms": n.duration_ms,
        }
        for n in progress.nested.values()
    ]
    print(
        jsonvalue.dumps(
            {
                "call_id": call_id,
                "agent": agent,
                "nested": nested,
                "result": text,
                "is_error": result.is_error,
                "error_code": result.error.code,
                "value": value,
            }
        )
    )
