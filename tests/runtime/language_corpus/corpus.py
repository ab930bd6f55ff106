"""The language conformance corpus (``cases.toml``, sources in ``<language>.toml``) and the
driver that runs its cases through a real ``RuntimeService.Run`` stream."""

from __future__ import annotations

import asyncio
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from tests.runtime.conftest import start_message_in

__all__ = ["BINDINGS", "Case", "answer", "cases", "check", "run_case", "sources"]

pb = runtime_pb2
Stub = runtime_pb2_grpc.RuntimeServiceStub
HERE = Path(__file__).resolve().parent
BINDINGS = ("echo", "fail", "wait", "slow", "raw", "__proto__", "constructor")
_SLOW_S = 1.5  # longer than binding-wait-is-free's compute budget


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    expect: dict[str, Any]
    budgets: dict[str, int] = field(default_factory=dict)
    cancel: str | None = None


@dataclass(slots=True)
class Seen:
    """What one run did, as the caller of ``Run`` saw it."""

    outcome: str
    value_json: str = ""
    message: str = ""
    logs: list[str] = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    """Each binding call's name and arguments JSON text (parsed only where compared: a deep
    value is deeper than the stdlib parser's recursion allows)."""


def cases() -> list[Case]:
    raw = tomllib.loads((HERE / "cases.toml").read_text())["case"]
    return [
        Case(item["id"], item["expect"], item.get("budgets", {}), item.get("cancel"))
        for item in raw
    ]


def sources(language: str) -> dict[str, str]:
    """The language's source of each case it can express (none without a file)."""
    path = HERE / f"{language}.toml"
    if not path.is_file():
        return {}
    table: dict[str, str] = tomllib.loads(path.read_text())["source"]
    return table


async def answer(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult | None:
    """The corpus's bindings (cases.toml says what each one does)."""
    if call.binding_name == "wait":
        return None  # never answered
    if call.binding_name == "raw":  # the arguments' JSON text back, unparsed (any depth)
        return pb.CallResult(call_id=call.call_id, value_json=call.arguments_json)
    if call.binding_name == "slow":
        await asyncio.sleep(_SLOW_S)
    if call.binding_name == "fail":
        return pb.CallResult(call_id=call.call_id, error_message="fail failed")
    args = json.loads(call.arguments_json)
    return pb.CallResult(call_id=call.call_id, value_json=json.dumps({"echo": args}))


async def run_case(stub: Stub, language: str, case: Case, source: str, *, tenant: str = "") -> Seen:
    """Run one case (for ``tenant``, "" for none) to the end of its stream: exactly one
    terminal message, last, and the stream ends OK."""
    call = stub.Run()
    await call.write(start_message_in(language, source, *BINDINGS, tenant=tenant, **case.budgets))
    messages: list[runtime_pb2.RunResponse] = []
    async for message in call:
        messages.append(message)
        kind = message.WhichOneof("kind")
        if kind == "binding_call":
            if case.cancel is not None:
                await call.write(pb.RunRequest(cancel=pb.RunCancel(reason=case.cancel)))
                continue
            result = await answer(message.binding_call)
            if result is not None:
                await call.write(pb.RunRequest(call_result=result))
        elif kind == "terminal":
            await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
    kinds = [m.WhichOneof("kind") for m in messages]
    assert kinds.count("terminal") == 1 and kinds[-1] == "terminal", kinds
    terminal = messages[-1].terminal
    if terminal.WhichOneof("outcome") == "success":
        success = terminal.success
        seen = Seen("success", success.value_json if success.HasField("value_json") else "")
    else:
        name = pb.FailureKind.Name(terminal.failure.kind).removeprefix("FAILURE_KIND_")
        seen = Seen(name.lower().replace("_", "-"), message=terminal.failure.message)
    seen.logs = list(terminal.logs)
    seen.streamed = [m.log.text for m in messages if m.WhichOneof("kind") == "log"]
    seen.calls = [
        (m.binding_call.binding_name, m.binding_call.arguments_json)
        for m in messages
        if m.WhichOneof("kind") == "binding_call"
    ]
    return seen


def check(case: Case, seen: Seen) -> list[str]:
    """How ``seen`` differs from what the case expects (empty: it conforms)."""
    expect = case.expect
    problems: list[str] = []

    def differs(what: str, wanted: object, got: object) -> None:
        if wanted != got:
            problems.append(f"{what}: expected {wanted!r}, got {got!r}")

    differs("outcome", expect["outcome"], seen.outcome)
    if "value_json" in expect:
        differs("value", expect["value_json"], seen.value_json)
    if "deep_value" in expect:
        depth = int(expect["deep_value"]) + 1
        differs("value", "[" * depth + "]" * depth, seen.value_json)
    if "message" in expect:
        differs("message", expect["message"], seen.message)
    if "message_contains" in expect and expect["message_contains"] not in seen.message:
        problems.append(f"message: {expect['message_contains']!r} not in {seen.message!r}")
    if "logs" in expect:
        differs("logs", expect["logs"], seen.logs)
    if seen.outcome != "output-limit":
        # Every log line is streamed as it happens and kept in the terminal alike (over the
        # output budget, the terminal keeps less: room for the failure's own text).
        differs("streamed logs", seen.logs, seen.streamed)
    if "calls" in expect:
        wanted = [(name, json.loads(arguments)) for name, arguments in expect["calls"]]
        got = [(name, json.loads(arguments)) for name, arguments in seen.calls]
        differs("calls", wanted, got)
    return problems


async def conformance(
    stub: Stub, language: str, *, tenant: str = ""
) -> tuple[list[str], dict[str, list[str]]]:
    """Run every case ``language`` has a source for (each for ``tenant``); returns the cases
    run and each nonconforming case's problems."""
    table = sources(language)
    ran: list[str] = []
    failures: dict[str, list[str]] = {}
    for case in cases():
        source = table.get(case.id)
        if source is None:
            continue
        ran.append(case.id)
        problems = check(case, await run_case(stub, language, case, source, tenant=tenant))
        if problems:
            failures[case.id] = problems
    return ran, failures
