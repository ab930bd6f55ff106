"""One call's trajectory as the registry's history recorded it, with assertions that explain.

    trajectory = await Trajectory.load(client, agent, call_id)
    trajectory.assert_nested(expect("add", {"a": 2, "b": 3}, result=5), expect("greet"))
    trajectory.assert_recorded()

A failing assertion raises `AssertionError` whose message names what differs and draws the
whole trajectory, so a test's output says what the program did.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue

if TYPE_CHECKING:
    from codemode_client.client import RegistryClient
    from codemode_wire.api.registry.v1 import history_pb2

CALL, RESULT = "tool/call", "tool/result"
NESTED_START, NESTED_SETTLE = "tool/code-dispatch-start", "tool/code-dispatch"


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Final[Any] = _Any()
"""Matches any value in `expect(...)`."""


def _text(record: history_pb2.HistoryRecord) -> str:
    return "\n".join(b.text.text for b in record.content if b.WhichOneof("block") == "text")


def _arguments(record: history_pb2.HistoryRecord) -> JsonValue:
    return jsonvalue.loads(record.arguments_json) if record.arguments_json else None


def _outcome(record: history_pb2.HistoryRecord | None) -> tuple[bool, bool, str, str]:
    """(ended, is_error, error_code, text) of a settle or result record (None: not written)."""
    if record is None:
        return False, False, "", ""
    return True, record.is_error, record.error_code, _text(record)


def _short(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class NestedCall:
    """A call a program made: its start and (unless abandoned) its settle record."""

    call_id: str
    tool_name: str
    arguments: JsonValue
    settled: bool
    is_error: bool
    error_code: str
    text: str
    """What the call returned as the history shows it (a value: its JSON; a failure: its
    message)."""

    @property
    def result(self) -> JsonValue:
        """`text` read as JSON when it is JSON (what a tool's value renders as), else the text."""
        try:
            return jsonvalue.loads(self.text)
        except ValueError:
            return self.text

    def line(self) -> str:
        if not self.settled:
            outcome = "never settled"
        elif self.is_error:
            outcome = f"error {self.error_code}: {_short(self.text)}".rstrip(": ")
        else:
            outcome = f"-> {_short(self.text)}"
        return f"{self.call_id} {self.tool_name} {_short(self.arguments)} {outcome}"


@dataclass(frozen=True)
class Expected:
    """What `assert_nested` expects of one nested call (`ANY`: not checked)."""

    tool_name: str
    arguments: Any = ANY
    result: Any = ANY
    error_code: Any = ANY
    """"" expects a success; a code expects a failure with it."""

    def mismatches(self, call: NestedCall) -> list[str]:
        wrong: list[str] = []
        if call.tool_name != self.tool_name:
            wrong.append(f"tool {call.tool_name!r}, expected {self.tool_name!r}")
        if self.arguments is not ANY and call.arguments != self.arguments:
            wrong.append(f"arguments {_short(call.arguments)}, expected {_short(self.arguments)}")
        if self.error_code is not ANY:
            if not call.settled:
                wrong.append("it never settled")
            elif call.error_code != self.error_code or call.is_error != bool(self.error_code):
                got = f"error {call.error_code}" if call.is_error else "success"
                want = f"error {self.error_code}" if self.error_code else "success"
                wrong.append(f"{got}, expected {want}")
        if self.result is not ANY:
            recorded = call.text if isinstance(self.result, str) else call.result
            if recorded != self.result:
                wrong.append(f"result {_short(recorded)}, expected {_short(self.result)}")
        return wrong

    def line(self) -> str:
        parts = [self.tool_name]
        if self.arguments is not ANY:
            parts.append(_short(self.arguments))
        if self.error_code is not ANY:
            parts.append(f"error {self.error_code}" if self.error_code else "ok")
        if self.result is not ANY:
            parts.append(f"-> {_short(self.result)}")
        return " ".join(parts)


def expect(
    tool_name: str,
    arguments: Any = ANY,
    *,
    result: Any = ANY,
    error_code: Any = ANY,
) -> Expected:
    """One nested call `assert_nested` expects: its tool, and optionally its arguments, its
    result (a `str` is compared with the recorded text, anything else with it read as JSON)
    and `error_code` ("" for a success)."""
    return Expected(tool_name, arguments, result, error_code)


@dataclass(frozen=True)
class Trajectory:
    """An outer call (a model's tool call, typically `run_code`) and its nested calls, in the
    order the program made them."""

    call_id: str
    tool_name: str
    arguments: JsonValue
    finished: bool
    is_error: bool
    error_code: str
    text: str
    """What the model was shown."""
    nested: tuple[NestedCall, ...]
    records: tuple[history_pb2.HistoryRecord, ...] = field(repr=False)

    @property
    def kinds(self) -> list[str]:
        """The records' kinds in history order."""
        return [record.kind for record in self.records]

    @property
    def tools(self) -> list[str]:
        """The nested calls' tool names, in order."""
        return [call.tool_name for call in self.nested]

    @staticmethod
    async def load(client: RegistryClient, agent: str, call_id: str) -> Trajectory:
        """Reads the call's records from the registry's history (written before its result
        was returned, so a finished call's trajectory is complete)."""
        return Trajectory.from_records(await client.history(agent, call_id=call_id), call_id)

    @staticmethod
    def from_records(records: Sequence[history_pb2.HistoryRecord], call_id: str) -> Trajectory:
        outer = [r for r in records if r.call_id == call_id]
        call = next((r for r in outer if r.kind == CALL), None)
        result = next((r for r in outer if r.kind == RESULT), None)
        if call is None:
            kinds = sorted({r.kind for r in records})
            raise AssertionError(f"no {CALL} record of call {call_id} in the history ({kinds})")
        starts = [r for r in records if r.kind == NESTED_START and r.parent_call_id == call_id]
        settles = {
            r.call_id: r for r in records if r.kind == NESTED_SETTLE and r.parent_call_id == call_id
        }
        nested = tuple(
            NestedCall(
                start.call_id,
                start.tool_name,
                _arguments(start),
                *_outcome(settles.get(start.call_id)),
            )
            for start in starts
        )
        return Trajectory(
            call_id, call.tool_name, _arguments(call), *_outcome(result), nested, tuple(records)
        )

    def render(self) -> str:
        """The trajectory as an indented tree, one line per call."""
        if not self.finished:
            outcome = "no result recorded"
        elif self.is_error:
            outcome = f"error {self.error_code}: {_short(self.text)}"
        else:
            outcome = f"-> {_short(self.text)}"
        lines = [f"{self.tool_name} {self.call_id} {outcome}"]
        lines += [f"  {i}. {call.line()}" for i, call in enumerate(self.nested, 1)]
        if not self.nested:
            lines.append("  (no nested calls)")
        return "\n".join(lines)

    def _fail(self, message: str) -> AssertionError:
        return AssertionError(f"{message}\ntrajectory:\n{self.render()}")

    def call(self, tool_name: str, index: int = 0) -> NestedCall:
        """The `index`-th nested call of `tool_name` (0: the first)."""
        calls = [c for c in self.nested if c.tool_name == tool_name]
        if index >= len(calls):
            raise self._fail(f"{len(calls)} nested call(s) of {tool_name!r}, wanted #{index + 1}")
        return calls[index]

    def assert_nested(self, *expected: Expected | str) -> None:
        """The program made exactly these nested calls, in this order (a `str` is
        `expect(name)`)."""
        wanted = [expect(e) if isinstance(e, str) else e for e in expected]
        problems = []
        for i, (want, call) in enumerate(zip(wanted, self.nested, strict=False), 1):
            problems += [f"  call {i} ({call.call_id}): {p}" for p in want.mismatches(call)]
        if len(wanted) != len(self.nested):
            problems.append(f"  {len(self.nested)} nested calls, expected {len(wanted)}")
        if problems:
            listing = "\n".join(f"  {i}. {w.line()}" for i, w in enumerate(wanted, 1))
            raise self._fail(
                f"nested calls of {self.call_id} differ:\n"
                + "\n".join(problems)
                + f"\nexpected:\n{listing or '  (none)'}"
            )

    def assert_succeeded(self) -> None:
        """The outer call has a result and it is not an error."""
        if not self.finished or self.is_error:
            raise self._fail(f"{self.call_id} did not succeed")

    def assert_recorded(self) -> None:
        """The history holds the outer call and result and, for every nested call, its start
        and settle records, each settle after its start and all of them before the result."""
        problems = []
        if CALL not in self.kinds or not self.finished:
            problems.append(f"the outer {CALL}/{RESULT} pair is incomplete: {self.kinds}")
        position = {(r.kind, r.call_id): i for i, r in enumerate(self.records)}
        end = position.get((RESULT, self.call_id), len(self.records))
        for call in self.nested:
            start = position[(NESTED_START, call.call_id)]
            settle = position.get((NESTED_SETTLE, call.call_id))
            if settle is None:
                problems.append(f"{call.call_id} has no {NESTED_SETTLE} record")
            elif not start < settle < end:
                problems.append(f"{call.call_id}'s records are out of order")
        if problems:
            raise self._fail("history records:\n  " + "\n  ".join(problems))
