"""Shared benchmark helpers: subprocess services, percentiles, JSON output."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any


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
    """Starts `python <args>` and yields the rest of its first stdout line starting with prefix."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=service_env() if env is None else env,
    )
    try:
        assert proc.stdout is not None
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            if not line:
                raise RuntimeError(f"{args} exited before becoming ready")
            if line.startswith(ready_prefix):
                yield line[len(ready_prefix) :].strip()
                break
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
