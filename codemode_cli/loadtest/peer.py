"""The load peer: serves the load tools into one agent's scope and approves that agent's asks.

    python -m codemode_cli.loadtest.peer REGISTRY[,REGISTRY...] AGENT

Several registries are replicas sharing one store: the peer serves each (one provider stream
and one approver stream per replica, `ReplicaSet`), as a deployed provider does, so that a
call landing on any replica finds the tools; a replica that goes away is retried in the
background while the others go on.

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
from codemode_client import ToolProvider
from codemode_client.replicas import ReplicaSet
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

RETRY_S = 0.5  # between attempts to open a lost approver stream

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


def provider(channel: grpc.aio.Channel | None, agent: str) -> ToolProvider:
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


class _Approver:
    """One replica's approver stream (a `Served` for the ReplicaSet), opened again when lost."""

    def __init__(self, channel: grpc.aio.Channel, agent: str, opened: asyncio.Event) -> None:
        self._channel = channel
        self._agent = agent
        self._opened = opened
        self._call: Any = None
        self._closing = False

    async def serve(self) -> None:
        while not self._closing:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._approve()
            if not self._closing:
                await asyncio.sleep(RETRY_S)

    async def close(self) -> None:
        self._closing = True
        if self._call is not None:
            self._call.cancel()

    async def _approve(self) -> None:
        call = self._call = rpb_grpc.RegistryServiceStub(self._channel).Approve(wait_for_ready=True)
        await call.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="loadtest")))
        opened = await call.read()
        if opened is grpc.aio.EOF or opened.WhichOneof("message") != "opened":
            raise RuntimeError("the registry did not open the approver stream")
        self._opened.set()
        while (message := await call.read()) is not grpc.aio.EOF:
            request = message.request if message.WhichOneof("message") == "request" else None
            if request is None or request.agent != self._agent or request.tool_name not in TOOLS:
                continue  # not ours: leave it to the other approvers
            decision = rpb.ApprovalDecision(
                approval_id=request.approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
            )
            await call.write(rpb.ApproveRequest(decision=decision))


async def main(addresses: list[str], agent: str) -> int:
    served = provider(None, agent)
    opened: list[asyncio.Event] = []  # one per replica's approver, set once its stream opened

    def approver(channel: grpc.aio.Channel) -> _Approver:
        opened.append(asyncio.Event())
        return _Approver(channel, agent, opened[-1])

    async def fixed() -> list[str]:
        return addresses

    providers = ReplicaSet(addresses[0], served.on_channel, resolve=fixed)
    approvers = ReplicaSet(addresses[0], approver, resolve=fixed)
    tasks = [asyncio.create_task(providers.serve()), asyncio.create_task(approvers.serve())]
    try:
        await approvers.resolved()
        await asyncio.gather(*(event.wait() for event in opened))
        # The provider streams register on their own: the load test waits until every
        # replica lists the tools.
        print("ready", flush=True)
        await asyncio.Event().wait()  # until the load test ends this process
    finally:
        await providers.close()
        await approvers.close()
        await asyncio.gather(*tasks, return_exceptions=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(
            "usage: python -m codemode_cli.loadtest.peer REGISTRY[,REGISTRY...] AGENT",
            file=sys.stderr,
        )
        raise SystemExit(2)
    raise SystemExit(asyncio.run(main(sys.argv[1].split(","), sys.argv[2])))
