"""The load phase: `concurrency` workers submit run_code calls until the plan or the time runs out.

Each outer call's stream is read to the end: `nested_started` events give the queue wait (the
scheduler's submission-to-start time), `nested_settled` events the nested latency (the
registry's start-to-commit time), `approval_pending` events count the approvals asked,
and the program's own result says how many nested calls it made and when it submitted each.
At the duration limit no new program starts and the calls still in flight are cancelled (the
registry then aborts their runs and reaches quiescence), so the phase ends on time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_status import rpc_status

from codemode_cli.loadtest.progress import Progress
from codemode_cli.loadtest.workload import SAFE, SAFE_APPROVE, Plan, Spec, plan, program
from codemode_client import unbatched
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.grpc_status import retry_delay

OK, FAILED, CANCELLED = "ok", "failed", "cancelled"
# Refused by admission control (RESOURCE_EXHAUSTED): nothing of the call started.
REFUSED = "refused"
UNAVAILABLE = f"rpc:{grpc.StatusCode.UNAVAILABLE.name}"
WARMUP_TIMEOUT_S = 60.0


class SetupError(RuntimeError):
    """The target cannot run the load (no runtime, refused agent, unreachable)."""


@dataclass(frozen=True)
class Target:
    """One channel's stub to one registry replica."""

    address: str
    stub: Any


@dataclass
class Outcome:
    """One outer run_code call."""

    plan: Plan
    call_id: str
    registry: str = ""  # the replica the call went to
    status: str = CANCELLED
    latency_ms: float = 0.0
    ended_s: float = 0.0  # since the load started
    code: str = ""
    message: str = ""
    made: int | None = None  # nested calls the program says it made
    submitted: list[float] = field(default_factory=list)  # wall clock of each submission
    nested_started: int = 0
    nested_settled: int = 0
    approvals: int = 0
    retry_delay_s: float | None = None  # a refusal's RetryInfo


@dataclass
class Load:
    """Everything the load phase observed."""

    outcomes: list[Outcome] = field(default_factory=list)
    nested: list[tuple[float, float]] = field(default_factory=list)  # (since start s, ms)
    nested_by_tool: dict[str, list[float]] = field(default_factory=dict)
    queue_waits: list[float] = field(default_factory=list)  # ms, from nested_started
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], str] = field(default_factory=dict)
    program_errors: list[str] = field(default_factory=list)  # what programs saw, a few
    elapsed_s: float = 0.0
    stopped_by_limit: bool = False

    def error(self, where: str, code: str, example: str) -> None:
        self.errors[(where, code)] += 1
        self.examples.setdefault((where, code), example[:300])


def request(agent: str, call_id: str, code: str) -> rpb.ExecuteToolCallRequest:
    arguments = json.dumps({"code": code, "description": "codemode loadtest program"})
    return rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id=call_id,
        tool_name="run_code",
        arguments_json=arguments,
        progress_events=rpb.PROGRESS_EVENTS_ALL,  # the nested events are the measurements
        batch_progress=True,  # as the clients ask: events that queue up travel together
    )


async def warm_up(stub: Any, agent: str, approvals: bool, call_id: str = "warmup") -> None:
    """One small program end to end, so set-up problems fail fast with their own message."""
    tools = [SAFE, SAFE_APPROVE] if approvals else [SAFE]
    calls = "\n".join(f'await tools["{t}"]({{"p": -1, "i": 0, "sleep_ms": 0}})' for t in tools)
    result = None
    try:
        async with asyncio.timeout(WARMUP_TIMEOUT_S):
            async for message in stub.ExecuteToolCall(
                request(agent, call_id, calls + "\nreturn 1")
            ):
                if message.WhichOneof("event") == "result":
                    result = message.result
    except TimeoutError:
        raise SetupError(f"a warm-up program did not finish in {WARMUP_TIMEOUT_S:g}s") from None
    if result is None or result.is_error:
        detail = "no result" if result is None else f"{result.error.code}: {result.error.message}"
        raise SetupError(f"a warm-up program failed ({detail})")


async def _events(call: Any) -> AsyncIterator[rpb.ExecuteToolCallResponse]:
    async for message in call:
        for event in unbatched(message):
            yield event


class Driver:
    def __init__(self, spec: Spec, targets: list[Target], agent: str, progress: Progress) -> None:
        self.spec = spec
        self.targets = targets
        self.agent = agent
        self.progress = progress
        self.load = Load()
        self._next = itertools.count()
        self._began = 0.0

    async def run(self) -> Load:
        loop = asyncio.get_running_loop()
        self._began = time.perf_counter()
        deadline = loop.time() + self.spec.duration_limit
        self.progress.start()
        workers = min(self.spec.concurrency, self.spec.programs)
        await asyncio.gather(*(self._worker(w, deadline) for w in range(workers)))
        self.load.elapsed_s = time.perf_counter() - self._began
        await self.progress.stop()
        return self.load

    async def _worker(self, worker: int, deadline: float) -> None:
        at = worker % len(self.targets)
        loop = asyncio.get_running_loop()
        while (index := next(self._next)) < self.spec.programs:
            if loop.time() >= deadline:
                self.load.stopped_by_limit = True
                return
            target = self.targets[at]
            outcome = Outcome(plan(self.spec, index), f"lt-{index}", target.address)
            self.load.outcomes.append(outcome)
            await self._one(target.stub, outcome, deadline)
            if outcome.status != CANCELLED:
                self.progress.done += 1
            if outcome.code == UNAVAILABLE:
                # That replica is gone (or going): the next programs go to the next one. The
                # failed program is not sent again: its side effects may have happened.
                at = self._next_replica(at)

    def _next_replica(self, at: int) -> int:
        gone = self.targets[at].address
        for step in range(1, len(self.targets)):
            candidate = (at + step) % len(self.targets)
            if self.targets[candidate].address != gone:
                return candidate
        return at

    async def _one(self, stub: Any, outcome: Outcome, deadline: float) -> None:
        began = time.perf_counter()
        call = stub.ExecuteToolCall(
            request(self.agent, outcome.call_id, program(self.spec, outcome.plan))
        )
        result = None
        try:
            async with asyncio.timeout_at(deadline):
                async for event in _events(call):
                    kind = event.WhichOneof("event")
                    if kind == "nested_settled":
                        self._settled(outcome, event.nested_settled)
                    elif kind == "nested_started":
                        outcome.nested_started += 1
                        self.load.queue_waits.append(event.nested_started.queue_wait_ms)
                    elif kind == "approval_pending":
                        outcome.approvals += 1
                    elif kind == "result":
                        result = event.result
        except TimeoutError:
            call.cancel()
            self.load.stopped_by_limit = True
            return  # stays CANCELLED; the loss check still compares its records
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._refused(outcome, exc)
            else:
                self._failed(outcome, f"rpc:{exc.code().name}", exc.details() or "")
            return
        finally:
            outcome.latency_ms = (time.perf_counter() - began) * 1e3
            outcome.ended_s = time.perf_counter() - self._began
        if result is None:
            self._failed(outcome, "NO_RESULT", "the stream ended without a result")
        elif result.is_error:
            self._failed(outcome, result.error.code or "ERROR", result.error.message)
        else:
            self._completed(outcome, result)

    def _settled(self, outcome: Outcome, settled: Any) -> None:
        outcome.nested_settled += 1
        self.progress.nested += 1
        now = time.perf_counter() - self._began
        self.load.nested.append((now, settled.duration_ms))
        self.load.nested_by_tool.setdefault(settled.tool_name, []).append(settled.duration_ms)
        if settled.is_error:
            self.progress.errors += 1
            self.load.error("nested", settled.error_code or "ERROR", settled.sub_call_id)

    def _failed(self, outcome: Outcome, code: str, message: str) -> None:
        outcome.status, outcome.code, outcome.message = FAILED, code, message
        self.progress.errors += 1
        self.load.error("outer", code, message)

    def _refused(self, outcome: Outcome, exc: grpc.aio.AioRpcError) -> None:
        outcome.status, outcome.code, outcome.message = REFUSED, "RESOURCE_EXHAUSTED", exc.details()
        status = rpc_status.from_call(exc)
        outcome.retry_delay_s = None if status is None else retry_delay(status)

    def _completed(self, outcome: Outcome, result: Any) -> None:
        try:
            value = json.loads(result.value_json)["result"]
            made, submitted = int(value["made"]), [float(t) for t in value["submitted"]]
        except (ValueError, KeyError, TypeError) as exc:
            self._failed(outcome, "BAD_PROGRAM_RESULT", f"unexpected program result: {exc}")
            return
        outcome.status, outcome.made, outcome.submitted = OK, made, submitted
        for message in value.get("errors") or []:
            if len(self.load.program_errors) < 5:
                self.load.program_errors.append(str(message))
