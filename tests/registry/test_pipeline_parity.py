"""Pipeline parity: every scenario runs model-direct and nested, with the same outcome.

Each scenario installs recording plugins (pre-execute, guards, around, post-execute, result
observers: global hooks, as a `CODEMODE_REGISTRY_PLUGINS` entry would) and an approver, then
calls the tool `t` twice on one registry with a real runtime:

- model-direct: `ExecuteToolCall(t)` over gRPC for an agent in mode `both`;
- nested: `ExecuteToolCall(run_code)` whose program calls `tools.t(...)`, on a real worker.

Both must give the same history record (error flag, error code, content), the same view for the
program/model (the value, or the error message) and the same stages, in the same order. The
model-direct behaviour (docs/pipeline.md, "The stages") is the specification;
where it and the nested path disagree the nested one is wrong (docs/architecture.md, invariant 2).

Cancellation scenarios cancel the RPC (the direct call's, or the outer `run_code`'s) while one
stage's hook is waiting for the call's abort signal; the hook then carries on as usual, so the
rest of the pipeline sees an aborted call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import history_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.execution import ToolCallFailure
from registry_service.domain.policy import (
    Accept,
    Allow,
    Ask,
    Block,
    Deny,
    PostDecision,
    PreDecision,
)
from registry_service.domain.results import TextBlock, ToolResult, error_result, success
from tests.codemode.conftest import Stack, make_stack, value_of
from tests.registry.conftest import BOTH, blocks_of

TOOL = "t"
INPUT_SCHEMA: JsonValue = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}
OUTPUT_SCHEMA: JsonValue = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
}
GOOD_ARGUMENTS: dict[str, object] = {"n": 1}

# Stages a hook can hold until the call is aborted (cancellation during that stage).
HoldStage = Literal["pre", "approval", "around", "body", "around-out", "post"]


@dataclass(frozen=True)
class Scenario:
    id: str
    pre: Literal["pass", "allow", "deny", "ask", "throw"] = "pass"
    approver: Literal["absent", "allow", "reject", "hold"] = "absent"
    guard: Literal["pass", "deny", "throw"] = "pass"
    around: Literal["pass", "throw", "short", "replace"] = "pass"
    body: Literal["ok", "throw", "invalid-output"] = "ok"
    post: Literal["accept", "replace-value", "replace-content", "block", "throw"] = "accept"
    observer_throws: bool = False
    arguments: dict[str, object] = field(default_factory=lambda: dict(GOOD_ARGUMENTS))
    cancel_in: HoldStage | None = None  # that stage waits for the abort, then carries on


SCENARIOS = [
    Scenario("allow-default"),
    Scenario("allow-explicit", pre="allow"),
    Scenario("deny", pre="deny"),
    Scenario("pre-execute-throw", pre="throw"),
    Scenario("ask-approval-allowed", pre="ask", approver="allow"),
    Scenario("ask-approval-rejected", pre="ask", approver="reject"),
    Scenario("ask-approval-unavailable", pre="ask", approver="absent"),
    Scenario("ask-approval-cancelled", pre="ask", approver="hold", cancel_in="approval"),
    Scenario("guard-deny", guard="deny"),
    Scenario("guard-throw", guard="throw"),
    Scenario("around-throw", around="throw"),
    Scenario("around-short-circuit", around="short"),
    Scenario("around-replace", around="replace"),
    Scenario("body-throw", body="throw"),
    Scenario("invalid-args", arguments={"n": "one"}),
    Scenario("invalid-output", body="invalid-output"),
    Scenario("post-accept", post="accept"),
    Scenario("post-replace-value", post="replace-value"),
    Scenario("post-replace-content", post="replace-content"),
    Scenario("post-block", post="block"),
    Scenario("post-throw", post="throw"),
    Scenario("post-on-denied", pre="deny", post="replace-content"),
    Scenario("observer-throw", observer_throws=True),
    # Cancellation before and during each stage (a stage that waits is "during" it and
    # "before" the next).
    Scenario("cancel-during-pre-execute", cancel_in="pre"),
    Scenario("cancel-before-approval", pre="ask", approver="allow", cancel_in="pre"),
    Scenario("cancel-during-approval", pre="ask", approver="hold", cancel_in="approval"),
    Scenario("cancel-before-guards", pre="allow", guard="deny", cancel_in="pre"),
    Scenario("cancel-before-body", cancel_in="around"),
    Scenario("cancel-during-body", cancel_in="body"),
    Scenario("cancel-before-post-execute", cancel_in="around-out"),
    Scenario("cancel-during-post-execute", cancel_in="post"),
    Scenario("cancel-during-post-of-denied", pre="deny", cancel_in="post"),
]


@dataclass(frozen=True)
class Outcome:
    """What one path produced: its settle record, what the caller saw, the stages run."""

    is_error: bool
    error_code: str
    content: list[tuple[str, Any]]
    seen_by_caller: dict[str, Any] | None  # {"ok": value} or {"error": message}; None if cancelled
    stages: list[str]


class Plugins:
    """The scenario's hooks and tool, recording every invocation for the tool `t`."""

    def __init__(self, stack: Stack, scenario: Scenario) -> None:
        self.scenario = scenario
        self.stages: list[str] = []
        self.holding = asyncio.Event()  # the held stage has been entered
        registry = stack.registry
        hooks = registry.catalog.hooks("")
        hooks.pre_execute.append(self.pre)
        hooks.guards.append(self.guard)
        hooks.around.append(self.around)
        hooks.post_execute.append(self.post)
        hooks.observers.append(self.observe)
        registry.register_tool(
            TOOL, self.body, input_schema=INPUT_SCHEMA, output_schema=OUTPUT_SCHEMA
        )
        # The approval stage, seen where the pipeline asks the broker (the approver's side
        # may read a request only after a cancelled call has moved on).
        broker = registry.approvals
        ask = broker.request

        async def request(req: Any, signal: Any, **options: Any) -> Any:
            if req.tool_name == TOOL:
                self.stages.append("approval")
            return await ask(req, signal, **options)

        broker.request = request  # type: ignore[method-assign,assignment]

    def reset(self) -> None:
        self.stages = []
        self.holding = asyncio.Event()

    async def _hold(self, stage: HoldStage, e: Any) -> None:
        if self.scenario.cancel_in == stage:
            self.holding.set()
            await asyncio.wait_for(e.signal.wait(), 30)

    async def pre(self, e: Any, d: PreDecision) -> PreDecision:
        if e.name != TOOL:
            return d
        self.stages.append("pre")
        await self._hold("pre", e)
        match self.scenario.pre:
            case "allow":
                return Allow()
            case "deny":
                return Deny("denied by the test")
            case "ask":
                return Ask("the test asks")
            case "throw":
                raise RuntimeError("pre-execute failed")
        return d

    def guard(self, e: Any) -> str | None:
        if e.name != TOOL:
            return None
        self.stages.append("guard")
        if self.scenario.guard == "deny":
            return "guarded by the test"
        if self.scenario.guard == "throw":
            raise RuntimeError("guard failed")
        return None

    async def around(self, e: Any, proceed: Callable[[], Any]) -> ToolResult:
        if e.name != TOOL:
            result: ToolResult = await proceed()
            return result
        self.stages.append("around")
        await self._hold("around", e)
        match self.scenario.around:
            case "throw":
                raise ToolCallFailure("wrapper failed", "MY_CODE")
            case "short":
                return error_result("wrapper refused", "WRAPPER_REFUSED")
        result = await proceed()
        self.stages.append("around-out")
        await self._hold("around-out", e)
        if self.scenario.around == "replace":
            return success({"n": 99}, ())
        return result

    async def body(self, invocation: Any) -> Any:
        self.stages.append("body")
        if self.scenario.cancel_in == "body":
            self.holding.set()
            await asyncio.wait_for(invocation.signal.wait(), 30)
        if self.scenario.body == "throw":
            raise ToolCallFailure("body failed", "BODY_CODE")
        if self.scenario.body == "invalid-output":
            return {"n": "not a number"}
        return {"n": invocation.arguments["n"]}

    async def post(self, e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.name != TOOL:
            return d
        self.stages.append("post")
        await self._hold("post", e)
        match self.scenario.post:
            case "replace-value":
                return Accept(value={"n": 42}, replace_value=True)
            case "replace-content":
                return Accept(content=(TextBlock("content replaced by the test"),))
            case "block":
                return Block((TextBlock("blocked by the test"),))
            case "throw":
                raise RuntimeError("post-execute failed")
        return d

    def observe(self, e: Any, r: ToolResult) -> None:
        if e.name != TOOL:
            return
        self.stages.append("observe")
        if self.scenario.observer_throws:
            raise RuntimeError("observer failed")


class Approver:
    """An approver over the `Approve` stream, answering requests for `t` as told."""

    def __init__(self, stack: Stack, plugins: Plugins) -> None:
        self.stack = stack
        self.plugins = plugins
        self.stream: Any = None
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self.stream = self.stack.stub.Approve()
        await self.stream.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="test")))
        assert (await self.stream.read()).WhichOneof("message") == "opened"
        self.task = asyncio.create_task(self._answer())

    async def _answer(self) -> None:
        mode = self.plugins.scenario.approver
        while True:
            message = await self.stream.read()
            if message.WhichOneof("message") != "request" or message.request.tool_name != TOOL:
                continue
            if mode == "hold":
                self.plugins.holding.set()
                continue
            outcome = (
                rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
                if mode == "allow"
                else rpb.APPROVAL_OUTCOME_REJECTED
            )
            await self.stream.write(
                rpb.ApproveRequest(
                    decision=rpb.ApprovalDecision(
                        approval_id=message.request.approval_id, outcome=outcome
                    )
                )
            )

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.stream is not None:
            self.stream.cancel()


def program(arguments: dict[str, object]) -> str:
    return (
        "try:\n"
        f"    return {{'ok': await tools.{TOOL}({arguments!r})}}\n"
        "except ToolCallError as e:\n"
        "    return {'error': str(e)}"
    )


async def record_of(stack: Stack, agent: str, call_id: str, kind: str) -> history_pb2.HistoryRecord:
    """The call's settle record, once written (a cancelled call's lands after its RPC ended)."""
    for _ in range(1500):
        page = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, call_id=call_id))
        for record in page.records:
            if record.kind == kind:
                found: history_pb2.HistoryRecord = record
                return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {kind} record for {call_id!r} within 30 s")


async def run_path(
    stack: Stack, plugins: Plugins, agent: str, path: Literal["direct", "nested"]
) -> Outcome:
    scenario = plugins.scenario
    plugins.reset()
    call_id = f"{path}-1"
    if path == "direct":
        name, arguments = TOOL, scenario.arguments
        settle_id, kind = call_id, "tool/result"
    else:
        name = "run_code"
        arguments = {"code": program(scenario.arguments), "description": "parity"}
        settle_id, kind = f"{call_id}:code:1", "tool/code-dispatch"
    call = stack.stub.ExecuteToolCall(
        rpb.ExecuteToolCallRequest(
            agent=agent, call_id=call_id, tool_name=name, arguments_json=jsonvalue.dumps(arguments)
        )
    )

    async def consume() -> list[rpb.ExecuteToolCallResponse]:
        return [message async for message in call]

    consumer = asyncio.create_task(consume())
    seen: dict[str, Any] | None = None
    if scenario.cancel_in is not None:
        await asyncio.wait_for(plugins.holding.wait(), 30)
        call.cancel()
        with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
            await consumer
    else:
        messages = await asyncio.wait_for(consumer, 60)
        result = messages[-1].result
        if path == "nested":
            seen = value_of(result)["result"]
        elif result.is_error:
            seen = {"error": result.error.message}
        else:
            seen = {"ok": jsonvalue.loads(result.value_json)}
    record = await record_of(stack, agent, settle_id, kind)
    return Outcome(
        is_error=record.is_error,
        error_code=record.error_code,
        content=blocks_of(record.content),
        seen_by_caller=seen,
        stages=list(plugins.stages),
    )


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
async def test_direct_and_nested_calls_run_the_same_pipeline(
    make_stack: Any, scenario: Scenario
) -> None:
    async with make_stack(pool_size=1) as stack:
        agent = await stack.agent("parity", mode=BOTH)
        plugins = Plugins(stack, scenario)
        approver = Approver(stack, plugins)
        if scenario.approver != "absent":
            await approver.open()
        try:
            direct = await run_path(stack, plugins, agent, "direct")
            nested = await run_path(stack, plugins, agent, "nested")
        finally:
            await approver.close()
    print(f"{scenario.id}: direct={direct}\n{scenario.id}: nested={nested}")
    assert nested == direct
    assert EXPECTED[scenario.id] == (direct.error_code, direct.stages)
    assert bool(direct.error_code) == direct.is_error  # no failure without its code


# The model-direct behaviour each scenario must show (docs/pipeline.md): the error code
# and the stages run. A table of its own, so a change that alters both paths alike still fails.
_ALL = ["pre", "guard", "around", "body", "around-out", "post", "observe"]
EXPECTED: dict[str, tuple[str, list[str]]] = {
    "allow-default": ("", _ALL),
    "allow-explicit": ("", _ALL),
    "deny": ("DENIED", ["pre", "post", "observe"]),
    "pre-execute-throw": ("TOOL_FAILED", ["pre", "observe"]),
    "ask-approval-allowed": ("", ["pre", "approval", *_ALL[1:]]),
    "ask-approval-rejected": ("DENIED", ["pre", "approval", "post", "observe"]),
    "ask-approval-unavailable": ("DENIED", ["pre", "approval", "post", "observe"]),
    "ask-approval-cancelled": ("ABORTED_BEFORE_DISPATCH", ["pre", "approval", "post", "observe"]),
    "guard-deny": ("DENIED", ["pre", "guard", "post", "observe"]),
    "guard-throw": ("TOOL_FAILED", ["pre", "guard", "observe"]),
    "around-throw": ("MY_CODE", ["pre", "guard", "around", "observe"]),
    "around-short-circuit": ("WRAPPER_REFUSED", ["pre", "guard", "around", "post", "observe"]),
    "around-replace": ("", _ALL),
    "body-throw": ("BODY_CODE", _ALL),
    "invalid-args": ("INVALID_ARGS", ["pre", "guard", "around", "around-out", "post", "observe"]),
    "invalid-output": ("INVALID_TOOL_OUTPUT", _ALL),
    "post-accept": ("", _ALL),
    "post-replace-value": ("", _ALL),
    "post-replace-content": ("", _ALL),
    "post-block": ("BLOCKED", _ALL),
    "post-throw": ("TOOL_FAILED", _ALL),
    "post-on-denied": ("DENIED", ["pre", "post", "observe"]),
    "observer-throw": ("", _ALL),
    "cancel-during-pre-execute": ("ABORTED_BEFORE_DISPATCH", ["pre", "guard", "post", "observe"]),
    "cancel-before-approval": (
        "ABORTED_BEFORE_DISPATCH",
        ["pre", "approval", "post", "observe"],
    ),
    "cancel-during-approval": (
        "ABORTED_BEFORE_DISPATCH",
        ["pre", "approval", "post", "observe"],
    ),
    "cancel-before-guards": ("DENIED", ["pre", "guard", "post", "observe"]),
    "cancel-before-body": (
        "ABORTED_BEFORE_DISPATCH",
        ["pre", "guard", "around", "around-out", "post", "observe"],
    ),
    "cancel-during-body": ("ABORTED", _ALL),
    "cancel-before-post-execute": ("ABORTED", _ALL),
    "cancel-during-post-execute": ("ABORTED", _ALL),
    "cancel-during-post-of-denied": ("DENIED", ["pre", "post", "observe"]),
}


@pytest.mark.parametrize("path", ["direct", "nested"])
async def test_a_call_runs_the_plan_resolved_at_its_creation(make_stack: Any, path: str) -> None:
    """Hooks and the tool are resolved once, at create: a hook registered while a call runs
    observes the next call, not this one; both paths alike."""
    async with make_stack(pool_size=1) as stack:
        agent = await stack.agent("plan", mode=BOTH)
        hooks = stack.registry.catalog.hooks("")
        seen: list[str] = []

        async def pre(e: Any, d: PreDecision) -> PreDecision:
            if e.name == TOOL and not seen:
                seen.append(f"pre {e.call_id}")
                hooks.observers.append(late)
            return d

        def late(e: Any, r: ToolResult) -> None:
            if e.name == TOOL:
                seen.append(f"late observer {e.call_id}")

        async def body(invocation: Any) -> Any:
            return {"n": 1}

        hooks.pre_execute.append(pre)
        stack.registry.register_tool(TOOL, body)
        for n in (1, 2):
            if path == "direct":
                _, result = await stack.execute(TOOL, {}, agent=agent, call_id=f"c{n}")
                assert not result.is_error
            else:
                _, result = await stack.run_code(program({}), agent=agent, call_id=f"c{n}")
                assert value_of(result)["result"] == {"ok": {"n": 1}}
        first, second = ("c1", "c2") if path == "direct" else ("c1:code:1", "c2:code:1")
        assert seen == [f"pre {first}", f"late observer {second}"]


__all__ = ["make_stack"]  # the fixture, imported
