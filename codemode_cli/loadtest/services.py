"""The processes a load test needs: runtime and registry (unless one is given), and the peer.

Every service runs in its own process, as deployed (the benchmarks do the same): the driver's
event loop is busy reading thousands of stream events, and sharing it with the registry would
measure the driver as much as the scheduler. Each process's stderr goes to a file so that a
failed start is reported with its own words.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from codemode_cli.loadtest.workload import APPROVE_GLOB

READY_TIMEOUT_S = 60.0


class StartError(RuntimeError):
    """A process the load test needs did not start."""


@contextlib.asynccontextmanager
async def process(
    name: str, args: list[str], ready: str, env: dict[str, str], logs: Path
) -> AsyncIterator[str]:
    """Runs `python <args>` and yields what follows `ready` on its first matching stdout line."""
    log_path = logs / f"{name}.stderr"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=log, env=env
        )
    try:
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                while True:
                    line = (await proc.stdout.readline()).decode()
                    if not line:
                        raise StartError(f"the {name} exited before it was ready{_tail(log_path)}")
                    if line.startswith(ready):
                        break
        except TimeoutError:
            raise StartError(
                f"the {name} was not ready after {READY_TIMEOUT_S:g}s{_tail(log_path)}"
            ) from None
        yield line[len(ready) :].strip()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return (":\n  " + "\n  ".join(text)) if text else ""


@dataclass(frozen=True)
class StackOptions:
    max_parallel: int
    pool_size: int
    trace_file: str  # `off` unless --trace-file


@contextlib.asynccontextmanager
async def own_stack(options: StackOptions, work: Path) -> AsyncIterator[str]:
    """A runtime and a registry wired to it, both on loopback; yields the registry address."""
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
    ) as runtime_port:
        rules = work / "rules.yaml"
        # JSON is YAML: the approval share asks for approval through the product's own rules.
        rules.write_text(
            json.dumps({"rules": [{"tool": APPROVE_GLOB, "action": "ask", "reason": "load test"}]})
        )
        registry_env = {
            **base,
            "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([f"127.0.0.1:{runtime_port}"]),
            "CODEMODE_REGISTRY_HISTORY_PATH": str(work / "history.sqlite3"),
            "CODEMODE_REGISTRY_POLICY_RULES": str(rules),
            "CODEMODE_REGISTRY_MAX_PARALLEL_SUB_CALLS": str(options.max_parallel),
            "CODEMODE_REGISTRY_TRACE_FILE": options.trace_file,
        }
        async with process(
            "registry",
            ["-m", "registry_service", "--listen", "127.0.0.1:0"],
            "registry listening on port ",
            registry_env,
            work,
        ) as registry_port:
            yield f"127.0.0.1:{registry_port}"


@contextlib.asynccontextmanager
async def peer(registry: str, agent: str, work: Path) -> AsyncIterator[None]:
    args = ["-m", "codemode_cli.loadtest.peer", registry, agent]
    async with process("load peer", args, "ready", dict(os.environ), work):
        yield
