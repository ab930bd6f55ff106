"""One load test end to end: services, agent, peer, warm-up, load, history check, report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from codemode_cli.loadtest import losscheck, plot, report
from codemode_cli.loadtest.driver import Driver, SetupError, warm_up
from codemode_cli.loadtest.progress import Progress
from codemode_cli.loadtest.services import StackOptions, own_stack, peer
from codemode_cli.loadtest.workload import Spec
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2

STREAMS_PER_CHANNEL = 100  # HTTP/2 servers commonly cap concurrent streams per connection
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Options:
    registry: str | None
    max_parallel: int
    trace_file: str
    out: Path
    quiet: bool
    admission_limit: int | None = None


async def execute(spec: Spec, options: Options) -> int:
    progress = Progress(spec.programs, options.quiet)
    pool = min(spec.concurrency, 16)
    services: dict[str, Any] = {
        "mode": "external" if options.registry else "started",
        "registry": options.registry,
        "max_parallel_sub_calls": None if options.registry else options.max_parallel,
        "runtime_pool_size": None if options.registry else pool,
        "trace_file": None if options.registry else options.trace_file,
        "admission_limit": options.admission_limit,
    }
    with tempfile.TemporaryDirectory(prefix="codemode-loadtest-") as tmp:
        work = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            address = options.registry
            if address is None:
                progress.note("loadtest: starting the runtime and the registry")
                stack_options = StackOptions(
                    options.max_parallel, pool, options.trace_file, options.admission_limit
                )
                address = await stack.enter_async_context(own_stack(stack_options, work))
                services["registry"] = address
            channels = [
                grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(math.ceil(spec.concurrency / STREAMS_PER_CHANNEL))
            ]
            for channel in channels:
                stack.push_async_callback(channel.close)
            stubs = [rpb_grpc.RegistryServiceStub(c) for c in channels]
            await _reach(channels[0], address)
            agent = await _create_agent(stubs[0])
            services["agent"] = agent
            if options.registry:  # a shared registry keeps nothing of ours afterwards
                stack.push_async_callback(_delete_agent, stubs[0], agent)
            await stack.enter_async_context(peer(address, agent, work))
            progress.note("loadtest: warming up")
            await warm_up(stubs[0], agent, spec.approval_share > 0)
            load = await Driver(spec, stubs, agent, progress).run()
            progress.note("loadtest: checking history")
            tallies = await losscheck.scan(stubs[0], agent, load.outcomes, progress)
            await progress.stop()
    loss = losscheck.check(load.outcomes, tallies)
    waits, negative = losscheck.program_queue_waits(load.outcomes, tallies)
    document = report.build(
        spec, services=services, load=load, loss=loss, program_waits=waits, negative_waits=negative
    )
    lines = report.summary_lines(document)
    totals = document["totals"]
    if options.registry and totals["approvals_planned"] and not totals["approvals_asked"]:
        lines.append(
            "  note: no approval was asked: the target registry needs a policy rule "
            "`{tool: work_*_approve, action: ask}` for --approval-share to take effect"
        )
    json_path, html_path = options.out / "loadtest.json", options.out / "loadtest.html"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    html_path.write_text(plot.page(document, lines))
    print("\n".join(lines))
    print(f"wrote {json_path}\nwrote {html_path}")
    clean = loss["lost"] == 0 and loss["extra"] == 0 and not document["errors"]
    return 0 if clean else 1


async def _reach(channel: Any, address: str) -> None:
    try:
        await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
    except TimeoutError:
        raise SetupError(f"cannot reach a registry at {address}") from None


async def _create_agent(stub: Any) -> str:
    agent_id = f"loadtest-{os.getpid()}-{secrets.token_hex(3)}"
    request = rpb.CreateAgentRequest(
        agent_id=agent_id, agent=scope_pb2.Agent(mode=scope_pb2.PRESENTATION_MODE_CODE)
    )
    try:
        return str((await stub.CreateAgent(request)).agent.name)
    except grpc.aio.AioRpcError as exc:
        raise SetupError(f"the registry refused the load agent: {exc.details()}") from None


async def _delete_agent(stub: Any, agent: str) -> None:
    with contextlib.suppress(grpc.aio.AioRpcError):
        await stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent))


def report_failure(exc: BaseException) -> int:
    if isinstance(exc, grpc.aio.AioRpcError):
        message = f"the registry failed mid-run: {exc.code().name}: {exc.details()}"
    else:
        message = f"set-up failed: {exc}"
    print(f"codemode loadtest: {message}", file=sys.stderr)
    return 1
