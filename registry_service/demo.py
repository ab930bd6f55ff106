"""The demo: a registry, a provider in its own process, and model-direct calls in each mode.

`python -m registry_service.demo` (the README's first command). It shows the presentation modes,
the executor collapse under `code`, policy (a rules file asking for approval) and an approver.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import grpc

from codemode_common.api.registry.v1 import registry_service_pb2 as rpb
from codemode_common.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_common.api.registry.v1 import scope_pb2
from registry_service.config import RegistrySettings
from registry_service.server import start

RULES = """\
rules:
  - tool: write_file
    action: ask
    reason: writing changes the workspace
"""


def _show(label: str, events: list[rpb.ExecuteToolCallResponse]) -> None:
    print(f"\n▶ {label}")
    for event in events:
        kind = event.WhichOneof("event") or ""
        if kind == "result":
            r = event.result
            text = " ".join(b.text.text for b in r.content if b.WhichOneof("block") == "text")
            status = f"error {r.error.code or r.error.name}" if r.is_error else "ok"
            print(f"  result [{status}] {text[:200]}")
        else:
            print(f"  {kind}: {str(getattr(event, kind)).strip()}".replace("\n", " "))


async def _call(
    stub: rpb_grpc.RegistryServiceStub, agent: str, call_id: str, tool: str, args: str
) -> list[rpb.ExecuteToolCallResponse]:
    request = rpb.ExecuteToolCallRequest(
        agent=agent, call_id=call_id, tool_name=tool, arguments_json=args
    )
    return [event async for event in stub.ExecuteToolCall(request)]


async def _approve_everything(stub: rpb_grpc.RegistryServiceStub) -> None:
    call = stub.Approve()
    await call.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="demo-human")))
    async for message in call:
        if message.WhichOneof("message") == "request":
            seen = f"{message.request.tool_name} {message.request.arguments_json}"
            print(f"  (approver sees: {seen}; allowing once)")
            decision = rpb.ApprovalDecision(
                approval_id=message.request.approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
            )
            await call.write(rpb.ApproveRequest(decision=decision))


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.yaml"
        rules.write_text(RULES)
        running = await start(RegistrySettings(listen="127.0.0.1:0", policy_rules=rules))
        print(f"registry on {running.address}")
        provider = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "codemode_client.demo_tools",
            running.address,
            stdout=asyncio.subprocess.PIPE,
        )
        channel = grpc.aio.insecure_channel(running.address)
        approver: asyncio.Task[None] | None = None
        try:
            assert provider.stdout is not None
            await asyncio.wait_for(provider.stdout.readline(), 30)
            stub = rpb_grpc.RegistryServiceStub(channel)
            native = (
                await stub.CreateAgent(rpb.CreateAgentRequest(agent_id="native-agent"))
            ).agent.name
            code = (
                await stub.CreateAgent(
                    rpb.CreateAgentRequest(
                        agent_id="code-agent",
                        agent=scope_pb2.Agent(mode=scope_pb2.PRESENTATION_MODE_CODE),
                    )
                )
            ).agent.name
            for agent in (native, code):
                tools = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
                print(f"{agent}: visible tools {[t.name for t in tools.tools]}")
            _show(
                "native agent reads a file",
                await _call(stub, native, "c1", "read_file", '{"path":"README.md"}'),
            )
            _show(
                "native agent passes bad arguments",
                await _call(stub, native, "c2", "read_file", '{"file":1}'),
            )
            _show(
                "code agent calls read_file directly (collapsed)",
                await _call(stub, code, "c3", "read_file", '{"path":"README.md"}'),
            )
            _show(
                "native agent writes with no approver connected",
                await _call(stub, native, "c4", "write_file", '{"path":"a","text":"b"}'),
            )
            approver = asyncio.create_task(_approve_everything(stub))
            await asyncio.sleep(0.2)
            _show(
                "native agent writes with an approver",
                await _call(stub, native, "c5", "write_file", '{"path":"a","text":"b"}'),
            )
        finally:
            if approver is not None:
                approver.cancel()
            provider.kill()
            await provider.wait()
            await channel.close()
            await running.stop(1)


if __name__ == "__main__":
    asyncio.run(main())
