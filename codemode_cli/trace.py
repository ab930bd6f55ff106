"""`codemode trace <call_id>`: one tool call's span tree from the local JSON-lines trace file.

The registry and the runtime append their spans to the same file by default
(`var/traces.jsonl`, settings `trace_file`), and so may tool providers: the tree shows the
call's `execute_tool` span, the runtime's run, every nested call and the providers' spans,
each with its service, start offset, duration and outcome.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codemode_cli.exit_codes import ExitCode
from codemode_common.telemetry.jsonl import read_spans

__all__ = ["CallTree", "find_call", "render", "run_trace"]

CALL_ID = "gen_ai.tool.call.id"


@dataclass
class Node:
    span: dict[str, Any]
    children: list[Node] = field(default_factory=list)

    @property
    def start_ns(self) -> int:
        return int(self.span.get("start_ns") or 0)

    @property
    def duration_ms(self) -> float:
        end = int(self.span.get("end_ns") or 0)
        return max(0, end - self.start_ns) / 1e6


@dataclass
class CallTree:
    trace_id: str
    call_id: str
    root: Node


def find_call(spans: Iterable[dict[str, Any]], call_id: str) -> CallTree | None:
    """The tree under the latest `execute_tool` span of `call_id` (None if there is none)."""
    records = list(spans)
    roots = [
        s
        for s in records
        if s.get("attributes", {}).get(CALL_ID) == call_id
        and str(s.get("name", "")).startswith("execute_tool")
    ]
    if not roots:
        return None
    root = max(roots, key=lambda s: int(s.get("start_ns") or 0))
    trace_id = root["trace_id"]
    nodes: dict[str, Node] = {}
    for record in records:
        if record.get("trace_id") == trace_id:
            nodes[record["span_id"]] = Node(record)
    for node in nodes.values():
        parent = nodes.get(node.span.get("parent_span_id") or "")
        if parent is not None:
            parent.children.append(node)
    for node in nodes.values():
        node.children.sort(key=lambda n: (n.start_ns, n.span.get("name", "")))
    return CallTree(trace_id, call_id, nodes[root["span_id"]])


def _label(node: Node, origin: int, root: bool) -> str:
    span = node.span
    attributes = span.get("attributes", {})
    parts = [str(span.get("name", "?"))]
    call_id = attributes.get(CALL_ID)
    if call_id and not root:
        parts.append(str(call_id))
    parts.append(f"[{span.get('service') or '?'}]")
    if not root:
        parts.append(f"+{(node.start_ns - origin) / 1e6:.1f} ms")
    parts.append(f"{node.duration_ms:.1f} ms")
    outcome = attributes.get("codemode.outcome") or attributes.get("codemode.run.terminal_kind")
    if outcome:
        parts.append(str(outcome))
    elif span.get("status") == "ERROR":
        parts.append("error")
    if span.get("status") == "ERROR" and span.get("status_description"):
        parts.append(f"— {_error_lines(node)[0]}")
    return " ".join(parts)


def _error_lines(node: Node) -> list[str]:
    """An error span's description, every line of it (a traceback stays whole)."""
    if node.span.get("status") != "ERROR":
        return []
    return str(node.span.get("status_description") or "").splitlines()


def _events(node: Node, origin: int) -> list[str]:
    lines = []
    for event in node.span.get("events", []):
        attributes = dict(event.get("attributes", {}))
        duration = attributes.pop("duration_ms", None)
        offset = (int(event.get("time_ns") or 0) - origin) / 1e6
        text = f"· {event.get('name')} +{offset:.1f} ms"
        if duration is not None:
            text += f" {float(duration):.1f} ms"
        extra = " ".join(f"{k}={v}" for k, v in sorted(attributes.items()))
        lines.append(f"{text} {extra}".rstrip())
    return lines


def render(tree: CallTree, *, events: bool = False) -> list[str]:
    """The tree as text lines: one line per span, children in start order."""
    origin = tree.root.start_ns
    lines = [f"trace {tree.trace_id} · call {tree.call_id}", _label(tree.root, origin, True)]

    def walk(node: Node, prefix: str) -> None:
        lines.extend(
            f"{prefix}{'│ ' if node.children else '  '}   {line}" for line in _error_lines(node)[1:]
        )
        if events:
            lines.extend(
                f"{prefix}{'│ ' if node.children else '  '} {e}" for e in _events(node, origin)
            )
        for index, child in enumerate(node.children):
            last = index == len(node.children) - 1
            lines.append(f"{prefix}{'└─ ' if last else '├─ '}{_label(child, origin, False)}")
            walk(child, prefix + ("   " if last else "│  "))

    walk(tree.root, "")
    return lines


def run_trace(call_id: str, path: str, *, events: bool = False) -> int:
    try:
        tree = find_call(read_spans(path), call_id)
    except FileNotFoundError:
        print(f"codemode trace: no trace file {path}{_where(path)}", file=sys.stderr)
        return ExitCode.NOT_FOUND
    except OSError as exc:
        print(f"codemode trace: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.USAGE
    if tree is None:
        print(
            f"codemode trace: no execute_tool span for call {call_id!r} in {path}", file=sys.stderr
        )
        return ExitCode.NOT_FOUND
    print("\n".join(render(tree, events=events)))
    return ExitCode.OK


def _where(path: str) -> str:
    """Where a relative trace file was looked for, and how to name another one."""
    folder = "" if Path(path).is_absolute() else f" in {Path.cwd()}"
    return (
        f"{folder}. The services append spans to their setting trace_file (default "
        "var/traces.jsonl, relative to the folder they were started in; `codemode demo` "
        "writes there too): run this in that folder, or pass --file PATH"
    )
