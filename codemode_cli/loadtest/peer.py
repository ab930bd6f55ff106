"""The load peer: serves the load tools into one agent's scope and approves that agent's asks.

    python -m codemode_cli.loadtest.peer REGISTRY AGENT

It runs as its own process so that tool sleeps and approval answers are not delayed by the
driver's event loop (which parses every stream event): the measured body latency stays close
to the requested distribution, as with a real provider. Tools are registered into the agent's
scope, so a shared registry's other agents never see them.

The approver answers only requests of its own agent's load tools. `codemode_client.Approver`
answers every request it receives (first answer wins), which on a shared registry would decide
other agents' approvals, so this is a small loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import grpc

from codemode_cli.loadtest.workload import EXCLUSIVE, EXCLUSIVE_APPROVE, SAFE, SAFE_APPROVE, TOOLS
from codemode_client import ToolProvider, open_channel
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

INPUT_SCHEMA: Any = {
    "type": "object",
    "properties": {
        "p": {"type": "integer"},
        "i": {"type": "integer"},
        "sleep_ms": {"type": "number", "minimum": 0, "maximum": 60_000},
    },
    "required": ["sleep_ms"],
}


async def _work(args: Any, ctx: Any) -> Any:
    await asyncio.sleep(float(args["sleep_ms"]) / 1e3)
    return {"p": args.get("p"), "i": args.get("i")}


def provider(channel: grpc.aio.Channel, agent: str) -> ToolProvider:
    served = ToolProvider(channel, "loadtest")
    for name, safe in ((SAFE, True), (EXCLUSIVE, False), (SAFE_APPROVE, True)):
        served.tool(
            name,
            description=f"Sleeps sleep_ms, then returns its p and i (load test, {name})",
            input_schema=INPUT_SCHEMA,
            concurrency_safe=safe,
            scope=agent,
        )(_work)
    served.tool(
        EXCLUSIVE_APPROVE,
        description="Sleeps sleep_ms, exclusive, needs approval (load test)",
        input_schema=INPUT_SCHEMA,
        scope=agent,
    )(_work)
    return served


async def approve(channel: grpc.aio.Channel, agent: str, ready: asyncio.Event) -> None:
    call = rpb_grpc.RegistryServiceStub(channel).Approve()
    await call.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="loadtest")))
    opened = await call.read()
    if opened is grpc.aio.EOF or opened.WhichOneof("message") != "opened":
        raise RuntimeError("the registry did not open the approver stream")
    ready.set()
    while (message := await call.read()) is not grpc.aio.EOF:
        request = message.request if message.WhichOneof("message") == "request" else None
        if request is None or request.agent != agent or request.tool_name not in TOOLS:
            continue  # not ours: leave it to the other approvers
        decision = rpb.ApprovalDecision(
            approval_id=request.approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
        )
        await call.write(rpb.ApproveRequest(decision=decision))


async def main(address: str, agent: str) -> int:
    async with open_channel(address) as channel:
        approver_ready = asyncio.Event()
        approver = asyncio.create_task(approve(channel, agent, approver_ready))
        async with provider(channel, agent) as served:
            waiter = asyncio.create_task(approver_ready.wait())
            await asyncio.wait({waiter, approver}, return_when=asyncio.FIRST_COMPLETED)
            if approver.done():
                approver.result()  # raises: the approver could not start
            print("ready", flush=True)
            closed = asyncio.create_task(served.closed())
            await asyncio.wait({closed, approver}, return_when=asyncio.FIRST_COMPLETED)
            approver.cancel()
            with contextlib.suppress(BaseException):
                await approver
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m codemode_cli.loadtest.peer REGISTRY AGENT", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(asyncio.run(main(sys.argv[1], sys.argv[2])))
