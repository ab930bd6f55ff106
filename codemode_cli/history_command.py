"""`codemode history (--agent AGENT | --call-id ID)`: list history records, optionally follow.

History is per agent (ListHistory/WatchHistory take one), so `--call-id` without `--agent`
looks the call up under every agent. `--watch` continues after the last listed record, so no
record is shown twice or missed between the listing and the stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from codemode_cli import history_export
from codemode_cli.arguments import positive_int
from codemode_cli.exit_codes import ExitCode, for_rpc_failure
from codemode_cli.history_records import list_records, record_time, record_to_json
from codemode_cli.registry_access import (
    RPC_TIMEOUT_S,
    add_registry_argument,
    agent_name,
    describe_failure,
    registry_credentials,
)

if TYPE_CHECKING:
    from codemode_client import RegistryClient
    from codemode_wire.api.registry.v1 import history_pb2

PROG = "codemode history"
_SUMMARY_CHARS = 72
_CALL_KINDS = {"tool/call", "tool/code-dispatch-start"}  # the others record outcomes


class _UsageError(Exception):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List history records of an agent or of one call (the outer call and its nested "
        "calls), a line each: time, kind, call id, tool, summary. At least one of --agent and "
        "--call-id is required."
    )
    add_registry_argument(parser)
    parser.add_argument("--agent", help="the agent, `ID` or `agents/ID`")
    parser.add_argument(
        "--call-id", help="only this call: its records and those of its nested calls"
    )
    parser.add_argument("--watch", action="store_true", help="then follow new records until Ctrl-C")
    parser.add_argument(
        "--limit", type=positive_int, metavar="N", help="show only the last N listed records"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per record")
    actions = parser.add_subparsers(dest="history_action", metavar="[export]")
    export = actions.add_parser(
        "export",
        help="write one call's history and spans to a file (for `codemode replay`)",
        description=history_export.DESCRIPTION,
    )
    history_export.add_arguments(export)


def run(args: argparse.Namespace) -> int:
    if args.history_action == "export":
        return history_export.run(args)
    if not args.agent and not args.call_id:
        print(f"{PROG}: error: one of --agent or --call-id is required", file=sys.stderr)
        return ExitCode.USAGE
    try:
        args.credentials = registry_credentials(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        return asyncio.run(_history(args))
    except KeyboardInterrupt:  # before the watch's own handler is in place
        return ExitCode.OK if args.watch else ExitCode.INTERRUPTED


async def _history(args: argparse.Namespace) -> int:
    from codemode_client import RegistryClient
    from codemode_client.errors import CodemodeError

    async with RegistryClient(
        args.registry, timeout=RPC_TIMEOUT_S, credentials=args.credentials
    ) as client:
        try:
            records = await _list(client, args)
            if not records and args.call_id and not args.watch:
                where = f"under {agent_name(args.agent)}" if args.agent else "under any agent"
                print(f"{PROG}: no records of call {args.call_id} {where}", file=sys.stderr)
                return ExitCode.NOT_FOUND
            shown = records[-args.limit :] if args.limit else records
            printer = _Printer(
                as_json=args.json,
                with_agent=len({r.agent for r in records}) > 1,
                id_width=max((len(r.call_id) for r in shown), default=0),
            )
            for record in shown:
                printer.print(record)
            if args.watch:
                return await _watch(client, args, records, printer)
        except _UsageError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        except CodemodeError as exc:
            print(f"{PROG}: {describe_failure(exc, args.registry)}", file=sys.stderr)
            return for_rpc_failure(exc)
    return ExitCode.OK


async def _list(
    client: RegistryClient, args: argparse.Namespace
) -> list[history_pb2.HistoryRecord]:
    return await list_records(client, args.agent, args.call_id)


async def _watch(
    client: RegistryClient,
    args: argparse.Namespace,
    listed: list[history_pb2.HistoryRecord],
    printer: _Printer,
) -> int:
    """Follows until SIGINT/SIGTERM (status 0) or until the stream fails (UNAVAILABLE)."""
    agents = {agent_name(args.agent)} if args.agent else {r.agent for r in listed}
    if not agents:
        raise _UsageError(
            f"no records of call {args.call_id} yet, so no agent to watch; pass --agent"
        )
    if len(agents) > 1:
        names = ", ".join(sorted(agents))
        raise _UsageError(
            f"call {args.call_id} exists under several agents ({names}); pass --agent"
        )
    (agent,) = agents
    after = max((r.seq for r in listed), default=0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    follow = asyncio.create_task(_follow(client, agent, after, args.call_id, printer))
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({follow, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        stopped.cancel()
        if not follow.done():
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
    if stop.is_set():
        return ExitCode.OK
    follow.result()  # the stream failed: raises its error
    print(f"{PROG}: the registry at {args.registry} ended the watch", file=sys.stderr)
    return ExitCode.UNAVAILABLE


async def _follow(
    client: RegistryClient, agent: str, after: int, call_id: str | None, printer: _Printer
) -> None:
    async for record in client.watch_history(agent, after_seq=after):
        if not call_id or call_id in (record.call_id, record.root_call_id):
            printer.print(record)


@dataclass
class _Printer:
    """A line per record (time, [agent,] kind, call id, tool, summary) or a JSON object."""

    as_json: bool
    with_agent: bool  # only when the records come from several agents
    id_width: int

    def print(self, record: history_pb2.HistoryRecord) -> None:
        if self.as_json:
            from codemode_wire import jsonvalue

            print(jsonvalue.dumps(record_to_json(record)), flush=True)
            return
        when = record_time(record).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        agent = f"{record.agent}  " if self.with_agent else ""
        call_id = f"{record.call_id:<{max(self.id_width, 16)}}"
        line = f"{when}  {agent}{record.kind:<24}  {call_id}  {record.tool_name:<14}  "
        print((line + _summary(record)).rstrip(), flush=True)


def _summary(record: history_pb2.HistoryRecord) -> str:
    """Call and start records: the arguments; result and settle records: the outcome."""
    if record.kind in _CALL_KINDS:
        text = record.arguments_json
    else:
        status = f"error {record.error_code}".strip() if record.is_error else "ok"
        text = " ".join([status, *_texts(record)])
    text = " ".join(text.split())  # one line
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def _texts(record: history_pb2.HistoryRecord) -> list[str]:
    return [b.text.text for b in record.content if b.WhichOneof("block") == "text"]
