"""Shared benchmark helpers: subprocess services, percentiles, JSON output."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from codemode_cli.processes import running
from codemode_common import procfs


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    """p50/p99/mean in milliseconds from samples in seconds."""
    return {
        "p50_ms": round(statistics.median(samples) * 1e3, 4),
        "p99_ms": round(percentile(samples, 99) * 1e3, 4),
        "mean_ms": round(statistics.fmean(samples) * 1e3, 4),
        "n": len(samples),
    }


async def sequential(op: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    """`count` awaits of `op()` one after another: each one's duration in seconds."""
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await op()
        samples.append(time.perf_counter() - start)
    return samples


async def interleaved(
    ops: Sequence[Callable[[], Awaitable[Any]]], count: int, *, warm_up: int = 50
) -> dict[Any, list[float]]:
    """`count` samples of each op, after `warm_up` unsampled awaits of each (connections and
    code paths), taken in five interleaved blocks, so drift on a shared machine hits every
    series alike."""
    for op in ops:
        await sequential(op, warm_up)
    samples: dict[Any, list[float]] = {op: [] for op in ops}
    for _ in range(5):
        for op in ops:
            samples[op] += await sequential(op, count // 5)
    return samples


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, indent=2, sort_keys=False))


# Latency benchmarks measure the services without tracing (`benchmarks.tracing_overhead`
# measures what tracing adds); an explicit setting in the environment wins.
UNTRACED = {"CODEMODE_REGISTRY_TRACE_FILE": "off", "CODEMODE_RUNTIME_TRACE_FILE": "off"}


def service_env(**extra: str) -> dict[str, str]:
    """The environment for a benchmark's service processes: untraced unless told otherwise."""
    return {**UNTRACED, **os.environ, **extra}


@asynccontextmanager
async def subprocess_service(
    *args: str, ready_prefix: str, env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """Starts `python <args>` (in `service_env()` unless given `env`) and yields the rest of its
    first stdout line starting with `ready_prefix`."""
    async with running(
        *args, ready=ready_prefix, env=service_env() if env is None else env
    ) as started:
        yield started.rest


def process_cpu_s(pid: int, *, reaped: bool = False) -> float:
    """CPU seconds of a benchmark's process (``reaped``: with its waited-for children's); a
    process gone mid-measurement is an error, never a zero."""
    cpu = procfs.cpu_s(pid, reaped=reaped)
    if cpu is None:
        raise ProcessLookupError(pid)
    return cpu


def child_running(parent: int, marker: bytes) -> int:
    """The pid of ``parent``'s child whose command line holds ``marker`` (a benchmark's own
    service processes, the fork server below a runtime, a registry's MCP server child)."""
    for child in procfs.children(parent, ended=False):
        if marker in (procfs.cmdline(child) or b""):
            return child
    raise RuntimeError(f"no child of {parent} runs {marker!r}")
