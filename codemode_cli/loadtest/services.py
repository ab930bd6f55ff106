"""The processes a load test needs: runtime and registry (unless one is given), and the peer.

Every service runs in its own process, as deployed (the benchmarks do the same): the driver's
event loop is busy reading thousands of stream events, and sharing it with the registry would
measure the driver as much as the scheduler. Each process's stderr goes to a file so that a
failed start is reported with its own words.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from codemode_cli.loadtest.workload import APPROVE_GLOB
from codemode_cli.processes import Started, StartError, running

__all__ = ["OwnStack", "StackOptions", "StartError", "own_stack", "peer", "process"]


@contextlib.asynccontextmanager
async def process(
    name: str, args: list[str], ready: str, env: dict[str, str], logs: Path
) -> AsyncIterator[Started]:
    """Runs `python <args>` and yields it once it printed `ready` (`rest`: what follows on that
    line); its stderr goes to `<logs>/<name>.stderr`, quoted in the `StartError` of a failed
    start."""
    async with running(
        *args, ready=ready, env=env, stderr=logs / f"{name}.stderr", label=f"the {name}"
    ) as started:
        yield started


@dataclass(frozen=True)
class StackOptions:
    max_parallel: int
    pool_size: int
    trace_file: str  # `off` unless --trace-file
    admission_limit: int | None = None  # each agent's max_concurrent_runs (--admission-limit)


@dataclass(frozen=True)
class OwnStack:
    address: str  # the registry's
    pids: dict[str, int] = field(default_factory=dict)  # runtime, registry (their CPU is measured)


@contextlib.asynccontextmanager
async def own_stack(options: StackOptions, work: Path) -> AsyncIterator[OwnStack]:
    """A runtime and a registry wired to it, both on loopback."""
    base = dict(os.environ)
    runtime_env = {
        **base,
        "CODEMODE_RUNTIME_TRACE_FILE": options.trace_file,
        "CODEMODE_RUNTIME_POOL_SIZE": str(options.pool_size),
    }
    async with process(
        "runtime",
        ["-m", "runtime_service", "--listen", "127.0.0.1:0"],
        "runtime listening on port ",
        runtime_env,
        work,
    ) as runtime:
        rules = work / "rules.yaml"
        # JSON is YAML: the approval share asks for approval through the product's own rules.
        rules.write_text(
            json.dumps({"rules": [{"tool": APPROVE_GLOB, "action": "ask", "reason": "load test"}]})
        )
        registry_env = {
            **base,
            "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([f"127.0.0.1:{runtime.rest}"]),
            "CODEMODE_REGISTRY_HISTORY_PATH": str(work / "history.sqlite3"),
            "CODEMODE_REGISTRY_POLICY_RULES": str(rules),
            "CODEMODE_REGISTRY_MAX_PARALLEL_SUB_CALLS": str(options.max_parallel),
            "CODEMODE_REGISTRY_TRACE_FILE": options.trace_file,
        }
        # The load is the measure: no run limit (null) unless --admission-limit asks for one
        # per agent; the registry's own sandbox limit is lifted so it is the only one.
        registry_env["CODEMODE_REGISTRY_LIMITS"] = json.dumps({"max_concurrent_runs": None})
        registry_env["CODEMODE_REGISTRY_AGENT_LIMITS"] = json.dumps(
            {"max_concurrent_runs": options.admission_limit}
        )
        async with process(
            "registry",
            ["-m", "registry_service", "--listen", "127.0.0.1:0"],
            "registry listening on port ",
            registry_env,
            work,
        ) as registry:
            pids = {"runtime": runtime.proc.pid, "registry": registry.proc.pid}
            yield OwnStack(f"127.0.0.1:{registry.rest}", pids)


@contextlib.asynccontextmanager
async def peer(registries: list[str], agent: str, work: Path) -> AsyncIterator[int]:
    """The load peer (tool provider + auto-approver); yields its pid."""
    args = ["-m", "codemode_cli.loadtest.peer", ",".join(registries), agent]
    async with process("load peer", args, "ready", dict(os.environ), work) as started:
        yield started.proc.pid
