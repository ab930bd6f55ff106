"""Shared fixtures: a runtime with a small pool, and helpers to run programs through it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from runtime_service.budgets import Budgets
from runtime_service.outcome import BindingCall, BindingResult, RunResult
from runtime_service.runtime import Runtime, RuntimeOptions
from tests.procfs import descendants

Handler = Callable[[BindingCall], Awaitable[BindingResult]]


async def echo_handler(call: BindingCall) -> BindingResult:
    if call.name == "fail":
        return BindingResult.failure(f"{call.name} refused")
    if call.name == "slow":
        assert isinstance(call.arguments, dict)
        await asyncio.sleep(float(call.arguments.get("s", 0.5)))
    if call.name == "never":
        await asyncio.Event().wait()
    return BindingResult.success(call.arguments)


class ProgramRunner:
    """Runs programs on one runtime; ``bindings`` are answered by ``handler``."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def __call__(
        self,
        program: str,
        *,
        bindings: tuple[str, ...] = ("echo", "fail", "slow", "never", "my-tool"),
        handler: Handler = echo_handler,
        logs: list[str] | None = None,
        **budgets: Any,
    ) -> RunResult:
        run = self.runtime.create_run(
            program=program,
            bindings=bindings,
            handler=handler,
            budgets=budgets,
            on_log=logs.append if logs is not None else None,
        )
        return await self.runtime.execute(run)


def small_budgets() -> Budgets:
    return Budgets(compute_ms=5_000, wall_ms=20_000, memory_bytes=256 << 20)


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    rt = Runtime(RuntimeOptions(pool_size=2, defaults=small_budgets()))
    await rt.start()
    try:
        yield rt
    finally:
        await rt.dispose()
        assert child_pids() == [], "a worker outlived the runtime"


@pytest.fixture
def run_program(runtime: Runtime) -> ProgramRunner:
    return ProgramRunner(runtime)


def child_pids(parent: int | None = None) -> list[int]:
    """Live (non-zombie) descendants of ``parent`` (this process by default), from /proc."""
    return sorted(descendants(os.getpid() if parent is None else parent, live_only=True))


def can_isolate() -> bool:
    """Whether this host lets workers build the full sandbox: root with CAP_SYS_ADMIN (and
    CAP_SETUID). Where it does, the isolation tests demand every protection in force."""
    if os.geteuid() != 0:
        return False
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                return bool(caps & (1 << 21)) and bool(caps & (1 << 7))
    return False


def _become_subreaper() -> None:
    """Orphans of our workers re-parent to the test process, so ``child_pids`` sees them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


_become_subreaper()
