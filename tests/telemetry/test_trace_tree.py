"""One run_code call reads as one trace across the registry, the runtime and a provider process.

The program mixes parallel and exclusive nested calls, a call denied by policy, a call that
needs an approval (an approver stream answers it) and a failing call. The test asserts the
exact tree, our own attributes and the stage events; transport spans only by kind and place.
"""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stdout
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from codemode_cli.main import main as cli
from codemode_client.approver import Approver
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.codemode.conftest import Stack, value_of
from tests.codemode.fake_runtime import CHANNELS
from tests.registry.conftest import NATIVE
from tests.telemetry.conftest import REGISTRY, RUNTIME, Captured

PROGRAM = """\
import asyncio
first, note, second, third = await asyncio.gather(
    tools.lookup({"key": "a"}),
    tools.write_note({"text": "x"}),
    tools.lookup({"key": "b"}),
    tools.lookup({"key": "c"}),
)
errors = []
try:
    await tools.forbidden({})
except ToolCallError as e:
    errors.append(str(e))
try:
    await tools.fail_tool({})
except ToolCallError as e:
    errors.append(str(e))
secret = await tools.secret({})
return {"keys": [first["key"], second["key"], third["key"]], "errors": errors, **secret}
"""
STAGES = ["pre_execute", "guards", "body", "post_execute"]
QUEUED = ["queue_wait", *STAGES]
# (tool, outcome, execution mode, stage events) per nested call, in submission order.
NESTED = [
    ("lookup", "ok", "parallel", QUEUED),
    ("write_note", "ok", "exclusive", QUEUED),
    ("lookup", "ok", "parallel", QUEUED),
    ("lookup", "ok", "parallel", QUEUED),
    ("forbidden", "DENIED", "exclusive", ["queue_wait", "pre_execute", "post_execute"]),
    ("fail_tool", "BOOM", "exclusive", QUEUED),
    ("secret", "ok", "exclusive", ["queue_wait", "pre_execute", "approval_wait", *STAGES[1:]]),
]
SERVED = [n for n, (tool, *_rest) in enumerate(NESTED, 1) if tool != "forbidden"]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    found = [
        s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]
    return sorted(found, key=lambda s: s.start_time or 0)


def service(span: ReadableSpan) -> str:
    return str(span.resource.attributes["service.name"])


def number(value: object) -> float:
    assert isinstance(value, int | float), value
    return float(value)


def event(span: ReadableSpan, name: str) -> tuple[int, int]:
    """(start, end) of a stage event in epoch ns."""
    (found,) = [e for e in span.events if e.name == name]
    duration_ms = number(dict(found.attributes or {})["duration_ms"])
    return found.timestamp, found.timestamp + int(duration_ms * 1e6)


def _complete(spans: list[ReadableSpan]) -> bool:
    names = [s.name for s in spans]
    return (
        "run_program" in names
        and sum(n.startswith("execute_tool") for n in names) >= 8
        and any(s.kind is SpanKind.SERVER and service(s) == RUNTIME for s in spans)
        and any(s.name.endswith("ExecuteToolCall") for s in spans)
    )


@pytest.mark.parametrize("runtime_channel", CHANNELS)
async def test_run_code_call_is_one_tree(
    traced_stack: Stack, captured: Captured, provider_process: None, runtime_channel: str
) -> None:
    agent = await traced_stack.code_agent()

    async def decide(request: rpb.ApprovalRequest) -> bool:
        await asyncio.sleep(0.05)  # the approval wait the trace and the histogram show
        return request.tool_name == "secret"

    async with Approver(traced_stack.channel, "test-approver", decide):
        _events, result = await traced_stack.run_code(PROGRAM, agent=agent, call_id="call-1")
    value = value_of(result)
    assert value["result"]["keys"] == ["a", "b", "c"]
    assert value["result"]["secret"] == 42
    assert "forbidden by policy" in value["result"]["errors"][0]

    spans = await captured.wait_for(_complete)
    # The outer call: execute_tool run_code, a child of the ExecuteToolCall server span.
    (root,) = [s for s in spans if s.name == "execute_tool run_code"]
    assert root.kind is SpanKind.INTERNAL and service(root) == REGISTRY
    assert root.parent is not None
    parent_id = root.parent.span_id
    (server,) = [s for s in spans if s.context.span_id == parent_id]
    assert server.kind is SpanKind.SERVER and server.name.endswith("/ExecuteToolCall")
    skipped = ("gen_ai.operation", "gen_ai.tool.description")
    assert {k: v for k, v in attrs(root).items() if not k.startswith(skipped)} == {
        "gen_ai.tool.call.id": "call-1",
        "gen_ai.tool.name": "run_code",
        "codemode.root_call_id": "call-1",
        "codemode.agent": agent,
        "codemode.outcome": "ok",
    }
    assert str(attrs(root)["gen_ai.tool.description"]).startswith("Execute a Python program")
    assert root.status.status_code is not StatusCode.ERROR
    assert [e.name for e in root.events] == STAGES

    if runtime_channel == "per-run":
        # Under it: the transport span of the Run stream (client → runtime server) and the run.
        client, run = children(spans, root)
        assert client.kind is SpanKind.CLIENT and client.name.endswith("RuntimeService/Run")
        (runtime_server,) = children(spans, client)
        assert runtime_server.kind is SpanKind.SERVER and service(runtime_server) == RUNTIME
    else:
        # The run alone: the one Multiplex stream serves every run, so it has no transport
        # span (it would be in no run's trace), on either side.
        (run,) = children(spans, root)
        assert not [s for s in spans if s.name.endswith(("RuntimeService/Run", "/Multiplex"))]
    assert run.name == "run_program" and service(run) == RUNTIME
    assert attrs(run)["codemode.run.terminal_kind"] == "ok"
    assert [e.name for e in run.events] == ["worker_handoff", "terminal"]

    # Every nested call is a child of the run, in submission order, with our attributes.
    nested = children(spans, run)
    assert [s.name for s in nested] == [f"execute_tool {tool}" for tool, *_ in NESTED]
    for n, (span, (tool, outcome, mode, stages)) in enumerate(zip(nested, NESTED, strict=True), 1):
        assert span.kind is SpanKind.INTERNAL and service(span) == REGISTRY
        assert span.context.trace_id == root.context.trace_id
        a = attrs(span)
        assert a["gen_ai.tool.call.id"] == f"call-1:code:{n}"
        assert a["gen_ai.tool.name"] == tool
        assert a["codemode.root_call_id"] == "call-1"
        assert a["codemode.parent_call_id"] == "call-1"
        assert a["codemode.agent"] == agent
        assert a["gen_ai.tool.description"]  # every nested tool has one here
        assert a["codemode.outcome"] == outcome
        assert a["codemode.execution_mode"] == mode
        assert [e.name for e in span.events] == stages, tool
        failed = outcome != "ok"
        assert (span.status.status_code is StatusCode.ERROR) == failed, tool
        assert children(spans, span) == []  # provider spans live in the provider's file

    # Scheduling as the trace shows it: the exclusive write waits for lookup a to drain and
    # runs alone; lookups b and c wait for its commit, then overlap each other.
    lookup_a, note, lookup_b, lookup_c = nested[:4]
    assert event(lookup_a, "body")[1] <= event(note, "body")[0]
    assert event(note, "queue_wait")[1] - event(note, "queue_wait")[0] >= 30e6
    assert event(note, "body")[1] <= min(event(lookup_b, "body")[0], event(lookup_c, "body")[0])
    assert event(lookup_b, "body")[0] < event(lookup_c, "body")[1]
    assert event(lookup_c, "body")[0] < event(lookup_b, "body")[1]
    (approval,) = [e for e in nested[6].events if e.name == "approval_wait"]
    approval_attributes = dict(approval.attributes or {})
    assert approval_attributes["outcome"] == "allowed-once"
    assert number(approval_attributes["duration_ms"]) >= 40

    # The provider process's own spans join the trace under the nested call spans.
    by_call = {attrs(s)["gen_ai.tool.call.id"]: s for s in nested}
    provider = await captured.file_spans(
        lambda records: sum(r["name"].startswith("serve_tool") for r in records) >= len(SERVED)
    )
    served = [r for r in provider if r["name"].startswith("serve_tool")]
    assert sorted(r["attributes"]["gen_ai.tool.call.id"] for r in served) == sorted(
        f"call-1:code:{n}" for n in SERVED
    )
    for record in served:
        parent = by_call[record["attributes"]["gen_ai.tool.call.id"]]
        assert record["trace_id"] == f"{root.context.trace_id:032x}"
        assert record["parent_span_id"] == f"{parent.context.span_id:016x}"
        assert record["kind"] == "SERVER" and record["service"] == "telemetry-tools"
        assert record["name"] == f"serve_tool {attrs(parent)['gen_ai.tool.name']}"
        failed = record["attributes"]["gen_ai.tool.name"] == "fail_tool"
        assert record["status"] == ("ERROR" if failed else "UNSET")
        assert record["attributes"]["codemode.outcome"] == ("BOOM" if failed else "ok")

    # The same tree, printed by `codemode trace` from the shared JSON-lines file.
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["trace", "call-1", "--events", "--file", str(captured.trace_file)]) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == f"trace {root.context.trace_id:032x} · call call-1"
    assert lines[1].startswith("execute_tool run_code [codemode-registry]")
    assert lines[1].endswith(" ok")
    tree = "\n".join(lines)
    run_stream = "├─ /codemode.runtime.v1.RuntimeService/Run [codemode-registry]"
    assert (run_stream in tree) == (runtime_channel == "per-run")
    assert "└─ run_program [codemode-runtime]" in tree
    assert "   ├─ execute_tool lookup call-1:code:1 [codemode-registry]" in tree
    assert "   │  └─ serve_tool lookup call-1:code:1 [telemetry-tools]" in tree
    assert "   ├─ execute_tool forbidden call-1:code:5 [codemode-registry]" in tree
    assert "   └─ execute_tool secret call-1:code:7 [codemode-registry]" in tree
    assert sum(line.lstrip("│ ├└─").startswith("serve_tool") for line in lines) == len(SERVED)

    # Metrics: nested-call latency by tool and outcome, queue and approval waits, refusals,
    # and nothing left in flight; the runtime's hand-off, run duration and terminal kind.
    registry = captured.registry
    latency = {
        dict(k)["gen_ai.tool.name"] + "/" + dict(k)["codemode.outcome"]: p.count
        for k, p in registry.points("codemode.nested_call.duration").items()
    }
    assert latency == {
        "lookup/ok": 3,
        "write_note/ok": 1,
        "forbidden/DENIED": 1,
        "fail_tool/BOOM": 1,
        "secret/ok": 1,
    }
    assert sum(registry.total("codemode.scheduler.queue_wait", "count")) == 7
    waits = registry.by("codemode.approval.wait", "codemode.approval.outcome", "sum")
    assert list(waits) == ["allowed-once"] and waits["allowed-once"] >= 0.04
    refused = registry.by("codemode.nested_calls.refused", "codemode.refusal")
    assert refused == {"denied": 1}
    assert registry.total("codemode.nested_calls.active") == [0]
    assert registry.total("codemode.runs.active") == [0]
    runtime = captured.runtime
    assert runtime.total("codemode.runtime.worker.handoff", "count") == [1]
    kind = "codemode.run.terminal_kind"
    assert runtime.by("codemode.runtime.run.duration", kind, "count") == {"ok": 1}
    assert runtime.by("codemode.runtime.runs.terminal", kind) == {"ok": 1}
    assert runtime.total("codemode.runtime.runs.active") == [0]
    (idle,) = runtime.total("codemode.runtime.pool.idle")
    assert 0 <= idle <= 1


async def test_model_direct_calls(
    traced_stack: Stack, captured: Captured, provider_process: None
) -> None:
    native = await traced_stack.agent("native-agent", mode=NATIVE)
    coder = await traced_stack.code_agent()
    _events, ok = await traced_stack.execute("lookup", {"key": "k"}, agent=native, call_id="d-1")
    assert value_of(ok) == {"key": "k"}
    _events, refused = await traced_stack.execute("lookup", {}, agent=coder, call_id="d-2")
    assert refused.is_error and refused.error.code == "UNKNOWN_TOOL"

    spans = await captured.wait_for(
        lambda s: sum(x.name.endswith("/ExecuteToolCall") for x in s) >= 2
    )
    calls = {attrs(s)["gen_ai.tool.call.id"]: s for s in spans if s.name == "execute_tool lookup"}
    assert set(calls) == {"d-1", "d-2"}
    for call_id, agent, outcome in (("d-1", native, "ok"), ("d-2", coder, "UNKNOWN_TOOL")):
        span = calls[call_id]
        a = attrs(span)
        assert a["codemode.agent"] == agent and a["codemode.outcome"] == outcome
        assert a["codemode.root_call_id"] == call_id
        assert "codemode.parent_call_id" not in a
        assert span.parent is not None
        (server,) = [s for s in spans if s.context.span_id == span.parent.span_id]
        assert server.kind is SpanKind.SERVER and server.name.endswith("/ExecuteToolCall")
    # The collapse refuses the call at creation: no stage ran, and the span is an error.
    assert list(calls["d-2"].events) == []
    assert calls["d-2"].status.status_code is StatusCode.ERROR
    assert attrs(calls["d-2"])["error.type"] == "UNKNOWN_TOOL"
    assert "error.type" not in attrs(calls["d-1"])
    assert attrs(calls["d-1"])["gen_ai.tool.description"]  # the resolved tool's description
    assert "gen_ai.tool.description" not in attrs(calls["d-2"])  # refused: no tool resolved
    assert [e.name for e in calls["d-1"].events] == STAGES

    provider = await captured.file_spans(lambda r: any(x["name"] == "serve_tool lookup" for x in r))
    (served,) = [r for r in provider if r["name"] == "serve_tool lookup"]
    assert served["trace_id"] == f"{calls['d-1'].context.trace_id:032x}"
    assert served["parent_span_id"] == f"{calls['d-1'].context.span_id:016x}"


async def test_failed_rpcs_are_errors_on_their_server_spans(
    traced_stack: Stack, captured: Captured
) -> None:
    """The services end failed RPCs through `abort`, which the OpenTelemetry interceptor sees
    (`abort_with_status` bypassed it and every failed RPC was traced as OK). The status code
    is on the span; a NOT_FOUND is the caller's error, so the server span's status stays
    unset (ERROR is for server-side codes such as UNAVAILABLE or INTERNAL)."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await traced_stack.stub.GetAgent(rpb.GetAgentRequest(name="agents/nobody"))
    assert failed.value.code() is grpc.StatusCode.NOT_FOUND
    await traced_stack.stub.GetAgent(rpb.GetAgentRequest(name=await traced_stack.agent("here")))
    spans = await captured.wait_for(lambda s: sum(x.name.endswith("/GetAgent") for x in s) >= 2)
    servers = [s for s in spans if s.name.endswith("/GetAgent") and s.kind is SpanKind.SERVER]
    codes = sorted(attrs(s).get("rpc.grpc.status_code", 0) for s in servers)
    assert codes == [grpc.StatusCode.OK.value[0], grpc.StatusCode.NOT_FOUND.value[0]]
