"""`codemode history export CALL_ID [--format jsonl|otlp-json] [--out FILE]`: one call's
trajectory as a file (codemode_cli/trajectory.py): its history records, the call's and every
nested call's, from the registry (full content, spilled content included), and its spans from
the local trace file, as `codemode trace` reads them. `codemode replay FILE` runs it again.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codemode_cli.exit_codes import ExitCode, for_rpc_failure
from codemode_cli.history_records import list_records, record_to_json
from codemode_cli.registry_access import (
    RPC_TIMEOUT_S,
    add_registry_argument,
    describe_failure,
    registry_credentials,
)
from codemode_cli.trajectory import FORMATS, Trajectory, dumps

if TYPE_CHECKING:
    from codemode_client import RegistryClient
    from codemode_wire.api.registry.v1 import history_pb2

PROG = "codemode history export"
DESCRIPTION = (
    "Write one call's trajectory: its history records (the call and all its nested calls) and "
    "its spans from the local trace file, as JSON lines (jsonl) or the OTLP JSON encoding "
    "(otlp-json). `codemode replay FILE` re-runs its program against the recorded results."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export_call_id", metavar="CALL_ID", help="the outer call's id")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="default %(default)s")
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="write here (default: standard output)"
    )
    parser.add_argument(
        "--trace-file",
        default="var/traces.jsonl",
        metavar="PATH",
        help="the services' trace file, for the spans (default %(default)s; missing: records only)",
    )
    # `codemode history` takes these too: given before `export`, they count as well.
    add_registry_argument(parser, inherit=True)
    parser.add_argument(
        "--agent",
        default=argparse.SUPPRESS,
        help="the call's agent (default: looked up under every agent)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        credentials = registry_credentials(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    status, trajectory = asyncio.run(_fetch(args, credentials))
    if trajectory is None:
        return status
    trajectory.spans.extend(_spans(args.trace_file, trajectory.call_id))
    text = dumps(trajectory, args.format)
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            args.out.write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return ExitCode.USAGE
    nested = sum(r["kind"] == "tool/code-dispatch-start" for r in trajectory.records)
    where = f" to {args.out}" if args.out else ""
    print(
        f"{PROG}: call {trajectory.call_id}: {len(trajectory.records)} records "
        f"({nested} nested calls), {len(trajectory.spans)} spans{where}",
        file=sys.stderr,
    )
    return ExitCode.OK


async def _fetch(args: argparse.Namespace, credentials: Any) -> tuple[int, Trajectory | None]:
    from codemode_client import RegistryClient
    from codemode_client.errors import CodemodeError

    call_id = args.export_call_id
    async with RegistryClient(
        args.registry, timeout=RPC_TIMEOUT_S, credentials=credentials
    ) as client:
        try:
            records = await list_records(client, args.agent, call_id)
            if not records:
                print(f"{PROG}: no records of call {call_id}", file=sys.stderr)
                return ExitCode.NOT_FOUND, None
            agents = {r.agent for r in records}
            if len(agents) > 1:
                names = ", ".join(sorted(agents))
                print(f"{PROG}: call {call_id} exists under {names}; pass --agent", file=sys.stderr)
                return ExitCode.USAGE, None
            (agent,) = agents
            language = (await client.get_agent(agent)).effective_code_language
            exported = [record_to_json(await _whole(client, r)) for r in records]
        except CodemodeError as exc:
            print(f"{PROG}: {describe_failure(exc, args.registry)}", file=sys.stderr)
            return for_rpc_failure(exc), None
    return ExitCode.OK, Trajectory(call_id, agent, language, exported, [])


async def _whole(
    client: RegistryClient, record: history_pb2.HistoryRecord
) -> history_pb2.HistoryRecord:
    """The record with its full content when it holds only a preview of spilled content."""
    if not record.spill_locator:
        return record
    from codemode_wire.api.registry.v1 import history_pb2

    whole = history_pb2.HistoryRecord()
    whole.CopyFrom(record)
    del whole.content[:]
    whole.content.extend(await client.record_content(record.agent, record.seq))
    return whole


def _spans(path: str, call_id: str) -> list[dict[str, Any]]:
    """The spans of the call's trace (its latest, as `codemode trace` picks it), or none."""
    from codemode_cli.trace import find_call
    from codemode_common.telemetry.jsonl import read_spans

    try:
        tree = find_call(read_spans(path), call_id)
    except OSError as exc:
        print(f"{PROG}: no spans: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return []
    if tree is None:
        print(f"{PROG}: no spans of call {call_id} in {path}", file=sys.stderr)
        return []
    spans, pending = [], [tree.root]
    while pending:
        node = pending.pop()
        spans.append(node.span)
        pending.extend(reversed(node.children))
    return spans
