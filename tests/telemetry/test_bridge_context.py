"""The registry continues each nested call from the trace context of its binding call.

No processes: a scripted runtime (the `RuntimePort` seam) sends binding calls with and without
a `traceparent`, and one with a forged token; the registry is driven directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from registry_service.codemode.runtime_port import BindingCall, RunSpec, RunTerminal
from registry_service.config import RegistrySettings
from registry_service.domain.execution import ExecutionInput
from registry_service.domain.scopes import Mode
from registry_service.domain.signals import never
from registry_service.domain.tools import Invocation
from registry_service.registry import build_registry
from tests.telemetry.conftest import Captured

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{TRACE_ID}-00f067aa0ba902b7-01"  # the backend's span, parent of the outer call
RUN_SPAN = "b7ad6b7169203331"  # the runtime's run span, parent of nested call 1


class _ScriptedRuntime:
    def __init__(self) -> None:
        self.spec: RunSpec | None = None
        self.replies: dict[int, tuple[bool, str]] = {}
        self.answered = asyncio.Event()

    async def open_run(self, spec: RunSpec) -> Any:
        self.spec = spec
        runtime = self

        class Stream:
            async def events(self) -> AsyncIterator[Any]:
                yield BindingCall(1, "echo", "{}", spec.token, f"00-{TRACE_ID}-{RUN_SPAN}-01")
                yield BindingCall(2, "echo", "{}", spec.token)  # no context: the outer span
                yield BindingCall(3, "echo", "{}", b"forged")
                await runtime.answered.wait()
                yield RunTerminal(logs=())

            def reply(self, call_id: int, ok: bool, payload: str) -> None:
                runtime.replies[call_id] = (ok, payload)
                if len(runtime.replies) == 3:
                    runtime.answered.set()

            def cancel(self, reason: str) -> None:
                pass

            async def close(self) -> None:
                pass

        return Stream()


async def test_nested_spans_continue_the_binding_call_context(captured: Captured) -> None:
    runtime = _ScriptedRuntime()
    registry = build_registry(
        RegistrySettings(history_path=":memory:", default_mode=Mode.CODE),
        runtime,
        tracer_provider=captured.registry.tracer_provider,
        meter_provider=captured.registry.meter_provider,
    )
    current: list[int] = []

    async def echo(invocation: Invocation) -> Any:
        current.append(trace.get_current_span().get_span_context().span_id)
        return invocation.traceparent

    registry.register_tool("echo", echo, concurrency_safe=True)
    try:
        result = await registry.execute(
            ExecutionInput(
                call_id="call-1",
                name="run_code",
                arguments={"code": "...", "description": "scripted"},
                signal=never(),
                traceparent=CALLER,
            )
        )
    finally:
        await registry.close()
    assert not result.is_error
    assert runtime.replies[3][0] is False

    spans = captured.spans()
    (outer,) = [s for s in spans if s.name == "execute_tool run_code"]
    assert outer.parent is not None and outer.parent.is_remote
    assert f"{outer.context.trace_id:032x}" == TRACE_ID
    assert f"{outer.parent.span_id:016x}" == "00f067aa0ba902b7"
    # The run was opened with the outer call's own span as its parent.
    assert runtime.spec is not None
    assert runtime.spec.traceparent == f"00-{TRACE_ID}-{outer.context.span_id:016x}-01"

    nested = sorted(
        (s for s in spans if s.name == "execute_tool echo"),
        key=lambda s: str((s.attributes or {})["gen_ai.tool.call.id"]),
    )
    assert [(s.attributes or {})["gen_ai.tool.call.id"] for s in nested] == [
        "call-1:code:1",
        "call-1:code:2",
    ]
    first, second = nested
    assert first.parent is not None and f"{first.parent.span_id:016x}" == RUN_SPAN
    assert second.parent is not None and second.parent.span_id == outer.context.span_id
    for span in nested:
        assert span.kind is SpanKind.INTERNAL
        assert span.context.trace_id == outer.context.trace_id
    # In-process bodies run with their call's span current, and hand it on as the parent.
    assert sorted(current) == sorted(s.context.span_id for s in nested)
    ok, value = runtime.replies[1]
    assert ok and value == f'"00-{TRACE_ID}-{first.context.span_id:016x}-01"'

    # The forged call never became a nested call: an event on the run_code span and a count.
    events = [e for e in outer.events if e.name == "nested_call_refused"]
    assert [(e.attributes or {})["codemode.refusal"] for e in events] == ["invalid_token"]
    refused = captured.registry.by("codemode.nested_calls.refused", "codemode.refusal")
    assert refused == {"invalid_token": 1}
    assert outer.status.status_code is StatusCode.UNSET
