"""One load test end to end: services, agent, peer, warm-up, load, history check, report."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import json
import math
import os
import secrets
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from codemode_cli.loadtest import environment, losscheck, plot, report
from codemode_cli.loadtest.driver import FAILED, OK, Driver, SetupError, Target, warm_up
from codemode_cli.loadtest.progress import Progress
from codemode_cli.loadtest.services import StackOptions, own_stack, peer
from codemode_cli.loadtest.workload import TOOLS, Spec
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2

STREAMS_PER_CHANNEL = 100  # HTTP/2 servers commonly cap concurrent streams per connection
CONNECT_TIMEOUT_S = 10.0
REPLICA_WAIT_S = 30.0  # for the agent, then its tools, to be on every replica


@dataclass(frozen=True)
class Options:
    registries: tuple[str, ...]  # empty: start own services
    max_parallel: int
    trace_file: str
    out: Path
    quiet: bool
    admission_limit: int | None = None


async def execute(spec: Spec, options: Options) -> int:
    progress = Progress(spec.programs, options.quiet)
    pool = min(spec.concurrency, 16)
    external = bool(options.registries)
    services: dict[str, Any] = {
        "mode": "external" if external else "started",
        "registry": options.registries[0] if external else None,
        "registries": list(options.registries),
        "max_parallel_sub_calls": None if external else options.max_parallel,
        "runtime_pool_size": None if external else pool,
        "trace_file": None if external else options.trace_file,
        "admission_limit": options.admission_limit,
    }
    where = {
        **environment.commit(),
        "machine": environment.machine(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_average_start": environment.load_average(),
    }
    pids: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="codemode-loadtest-") as tmp:
        work = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            addresses = list(options.registries)
            if not addresses:
                progress.note("loadtest: starting the runtime and the registry")
                stack_options = StackOptions(
                    options.max_parallel, pool, options.trace_file, options.admission_limit
                )
                started = await stack.enter_async_context(own_stack(stack_options, work))
                addresses, pids = [started.address], dict(started.pids)
                services["registry"] = addresses[0]
                services["registries"] = addresses
            # Each replica's share of the concurrency, over as many channels as it needs;
            # worker w starts on targets[w % len]: consecutive workers on different replicas.
            per_replica = math.ceil(spec.concurrency / len(addresses))
            rows: list[list[Target]] = []
            for address in addresses:
                row = []
                for _ in range(math.ceil(per_replica / STREAMS_PER_CHANNEL)):
                    channel = grpc.aio.insecure_channel(
                        address, options=[("grpc.use_local_subchannel_pool", 1)]
                    )
                    stack.push_async_callback(channel.close)
                    row.append(Target(address, rpb_grpc.RegistryServiceStub(channel)))
                rows.append(row)
                await _reach(channel, address)
            targets = [t for column in itertools.zip_longest(*rows) for t in column if t]
            first = {address: row[0].stub for address, row in zip(addresses, rows, strict=True)}
            agent = await _create_agent(first[addresses[0]])
            services["agent"] = agent
            if external:  # a shared registry keeps nothing of ours afterwards
                stack.push_async_callback(_delete_agent, list(first.values()), agent)
            await _everywhere(first, agent, lambda stub: _has_agent(stub, agent), "the agent")
            pids["peer"] = await stack.enter_async_context(peer(addresses, agent, work))
            await _everywhere(first, agent, lambda stub: _has_tools(stub, agent), "the tools")
            progress.note("loadtest: warming up")
            for n, stub in enumerate(first.values()):
                await warm_up(stub, agent, spec.approval_share > 0, f"warmup-{n}")
            before = environment.snapshot(pids)
            load = await Driver(spec, targets, agent, progress).run()
            after = environment.snapshot(pids)
            progress.note("loadtest: checking history")
            reader = await _live(first)
            tallies = await losscheck.scan(reader, agent, load.outcomes, progress)
            await progress.stop()
    where["load_average_end"] = environment.load_average()
    nested = len(load.nested)
    programs = sum(1 for o in load.outcomes if o.status in (OK, FAILED))
    cpu = environment.cpu(before, after, nested=nested, programs=programs)
    loss = losscheck.check(load.outcomes, tallies)
    waits, negative = losscheck.program_queue_waits(load.outcomes, tallies)
    document = report.build(
        spec,
        services=services,
        environment=where,
        cpu=cpu,
        load=load,
        loss=loss,
        program_waits=waits,
        negative_waits=negative,
    )
    lines = report.summary_lines(document)
    totals = document["totals"]
    if external and totals["approvals_planned"] and not totals["approvals_asked"]:
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


async def _everywhere(
    stubs: dict[str, Any], agent: str, ready: Callable[[Any], Awaitable[bool]], what: str
) -> None:
    """Waits until `ready` holds on every replica (a change made on one reaches the others
    through the shared store, within about a second)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + REPLICA_WAIT_S
    for address, stub in stubs.items():
        while not await ready(stub):
            if loop.time() > until:
                raise SetupError(f"{what} of {agent} did not reach the registry at {address}")
            await asyncio.sleep(0.05)


async def _has_agent(stub: Any, agent: str) -> bool:
    try:
        await stub.GetAgent(rpb.GetAgentRequest(name=agent))
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


async def _has_tools(stub: Any, agent: str) -> bool:
    listed = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
    return set(TOOLS) <= {tool.name for tool in listed.tools}


async def _live(stubs: dict[str, Any]) -> Any:
    """The first replica that still answers (the loss check reads the shared history there)."""
    for stub in stubs.values():
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.ListAgents(rpb.ListAgentsRequest(page_size=1), timeout=CONNECT_TIMEOUT_S)
            return stub
    raise SetupError("no registry answers to check the history")


async def _create_agent(stub: Any) -> str:
    agent_id = f"loadtest-{os.getpid()}-{secrets.token_hex(3)}"
    request = rpb.CreateAgentRequest(
        agent_id=agent_id, agent=scope_pb2.Agent(mode=scope_pb2.PRESENTATION_MODE_CODE)
    )
    try:
        return str((await stub.CreateAgent(request)).agent.name)
    except grpc.aio.AioRpcError as exc:
        raise SetupError(f"the registry refused the load agent: {exc.details()}") from None


async def _delete_agent(stubs: list[Any], agent: str) -> None:
    for stub in stubs:  # the first replica that still answers deletes it for all
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent), timeout=CONNECT_TIMEOUT_S)
            return


def report_failure(exc: BaseException) -> int:
    if isinstance(exc, grpc.aio.AioRpcError):
        message = f"the registry failed mid-run: {exc.code().name}: {exc.details()}"
    else:
        message = f"set-up failed: {exc}"
    print(f"codemode loadtest: {message}", file=sys.stderr)
    return 1
