"""Pool hand-off, disposal to quiescence, and no orphan processes."""

from __future__ import annotations

import asyncio

import pytest

from runtime_service.errors import RuntimeDisposedError
from runtime_service.outcome import BindingCall, BindingResult, RunFailure
from runtime_service.runtime import Runtime, RuntimeOptions
from tests.runtime.conftest import child_pids, echo_handler


async def test_pool_hands_out_never_used_workers_and_refills() -> None:
    runtime = Runtime(RuntimeOptions(pool_size=2))
    await runtime.start()
    try:
        await runtime.pool.wait_filled()
        first = await runtime.pool.acquire()
        second = await runtime.pool.acquire()
        assert first.pid != second.pid
        await asyncio.gather(first.kill(), second.kill())
        await runtime.pool.wait_filled()
        assert runtime.pool.idle_count == 2
    finally:
        await runtime.dispose()
    assert child_pids(fork_servers=True) == []


async def test_pool_size_zero_spawns_on_demand() -> None:
    runtime = Runtime(RuntimeOptions(pool_size=0))
    await runtime.start()
    try:
        assert runtime.pool.idle_count == 0
        run = runtime.create_run(program="return 5", bindings=[], handler=echo_handler)
        assert (await runtime.execute(run)).value == 5
        assert runtime.pool.idle_count == 0
    finally:
        await runtime.dispose()
    assert child_pids(fork_servers=True) == []


async def test_disposal_aborts_live_runs_and_leaves_no_processes() -> None:
    runtime = Runtime(RuntimeOptions(pool_size=1))
    await runtime.start()
    calls = asyncio.Semaphore(0)

    async def handler(call: BindingCall) -> BindingResult:
        calls.release()
        await asyncio.Event().wait()
        return BindingResult.success(None)

    programs = [
        "await tools.never({})",
        "import asyncio\nasyncio.ensure_future(tools.never({}))\nwhile True:\n    pass",
        "import os, subprocess\n"
        "subprocess.Popen(['sleep', '60'], start_new_session=False)\n"
        "await tools.never({})",
    ]
    runs = [runtime.create_run(program=p, bindings=["never"], handler=handler) for p in programs]
    executions = [asyncio.create_task(runtime.execute(run)) for run in runs]
    for _ in programs:
        await asyncio.wait_for(calls.acquire(), 10)
    assert len(child_pids()) >= 4  # three workers, a grandchild, the pool's idle worker
    await runtime.dispose()
    results = await asyncio.gather(*executions)
    for result in results:
        assert result.error == RunFailure("abort", "runtime disposed")
    assert child_pids(fork_servers=True) == []
    with pytest.raises(RuntimeDisposedError):
        runtime.create_run(program="", bindings=[], handler=echo_handler)


async def test_cancelled_caller_still_ends_the_worker() -> None:
    runtime = Runtime(RuntimeOptions(pool_size=0))
    await runtime.start()
    try:
        run = runtime.create_run(
            program="import asyncio\nawait asyncio.Event().wait()",
            bindings=[],
            handler=echo_handler,
        )
        execution = asyncio.create_task(runtime.execute(run))
        await asyncio.sleep(0.3)
        execution.cancel()
        with pytest.raises(asyncio.CancelledError):
            await execution
        assert run.settled
        assert child_pids() == []
    finally:
        await runtime.dispose()


async def test_many_concurrent_runs_each_get_their_own_worker(runtime: Runtime) -> None:
    runs = [
        runtime.create_run(
            # pid and uid: each run's worker is pid 2 of its own namespace, with its own uid.
            program="import os\nreturn [os.getpid(), os.getuid()]",
            bindings=[],
            handler=echo_handler,
        )
        for _ in range(8)
    ]
    results = await asyncio.gather(*(runtime.execute(run) for run in runs))
    pids: list[tuple[object, ...]] = [tuple(result.value) for result in results]  # type: ignore[arg-type]
    assert len(set(pids)) == 8
