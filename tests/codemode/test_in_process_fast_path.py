"""An in-process tool's nested call skips what its body does not need, never a pipeline step.

What the pipeline saves for an in-process body: the second decode of its arguments (it gets
the value admission decoded), a derived abort signal per call (it gets its call's own), the
rendering of its span's W3C context (spelled only if the body asks), a thread hop for a small
payload, the pretty text of a result nobody reads. What still runs, asserted here over a real
run on a real runtime, traced: rules (a pre-execute deny), approvals (asked and answered over
the Approve stream), the history records of every call, and a span per call.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.policy import Ask, Deny, PreDecision
from tests.codemode.conftest import Stack, value_of

PROGRAM = (
    "out = []\n"
    "for name in ('fast', 'denied', 'asked'):\n"
    "    try:\n"
    "        out.append(await getattr(tools, name)({'n': 1}))\n"
    "    except ToolCallError as e:\n"
    "        out.append(str(e))\n"
    "return out"
)


async def test_every_pipeline_step_runs_for_an_in_process_tool(make_stack: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pre_seen: dict[str, Any] = {}
    bodies: dict[str, Any] = {}

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        pre_seen[e.name] = (e.arguments, e.signal)
        if e.name == "denied":
            return Deny("rules say no")
        if e.name == "asked":
            return Ask("a human decides")
        return d

    def tool(name: str) -> Any:
        async def body(inv: Any) -> Any:
            bodies[name] = inv
            return {"tool": name, "n": inv.arguments["n"]}

        return body

    async with make_stack(tracer_provider=provider) as stack:
        assert isinstance(stack, Stack)
        for name in ("fast", "denied", "asked"):
            stack.registry.register_tool(name, tool(name), concurrency_safe=True)
        stack.registry.catalog.hooks("").pre_execute.append(pre)
        agent = await stack.code_agent()
        approver = stack.stub.Approve()
        await approver.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="human")))
        assert (await approver.read()).WhichOneof("message") == "opened"
        try:
            run = asyncio.create_task(stack.run_code(PROGRAM, agent=agent, call_id="outer"))
            request = (await asyncio.wait_for(approver.read(), 20)).request
            assert (request.call_id, request.tool_name) == ("outer:code:3", "asked")
            allowed = rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
            await approver.write(
                rpb.ApproveRequest(
                    decision=rpb.ApprovalDecision(approval_id=request.approval_id, outcome=allowed)
                )
            )
            events, result = await asyncio.wait_for(run, 20)
        finally:
            approver.cancel()
        assert value_of(result)["result"] == [
            {"tool": "fast", "n": 1},
            "rules say no",
            {"tool": "asked", "n": 1},
        ]
        kinds = [e.WhichOneof("event") for e in events]
        assert "approval_pending" in kinds and "approval_resolved" in kinds
        page = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
        settles = {r.call_id: r for r in page.records if r.kind == "tool/code-dispatch"}
        starts = {r.call_id for r in page.records if r.kind == "tool/code-dispatch-start"}
    subs = [f"outer:code:{n}" for n in (1, 2, 3)]
    assert sorted(settles) == subs and starts == set(subs)
    assert [settles[s].error_code for s in subs] == ["", "DENIED", ""]
    assert sorted(bodies) == ["asked", "fast"]  # the denied body never ran
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for name, outcome in (("fast", "ok"), ("denied", "DENIED"), ("asked", "ok")):
        span = spans[f"execute_tool {name}"]
        assert (span.attributes or {})["codemode.outcome"] == outcome, name
    for name in ("fast", "asked"):
        inv = bodies[name]
        arguments, signal = pre_seen[name]
        # Admission's value and the call's own signal, handed over as they are.
        assert inv.arguments is arguments and inv.signal is signal
        # The context a body passes on names its own call's span, spelled when asked.
        span_id = spans[f"execute_tool {name}"].context.span_id
        assert inv.traceparent.split("-")[2] == f"{span_id:016x}"
    provider.shutdown()
