"""A pool refill boots a Node worker at the lowest CPU priority, every thread of it, and the
hand-off gives every thread the normal priority back. (Node's boot costs a hundred ms and more
of CPU on several threads; booted at normal priority it competed with the programs running
meanwhile, which on a 2-CPU host slowed each of their binding calls.)"""

from __future__ import annotations

import os

import pytest

from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.worker_process import _BOOT_NICE, _can_renice
from tests.runtime.conftest import child_pids, small_budgets

pytestmark = pytest.mark.skipif(
    not _can_renice(), reason="the runtime may not lower a niceness again (no CAP_SYS_NICE)"
)


def nice_of_threads(pid: int) -> list[int]:
    """The niceness of each thread of ``pid`` (field 19 of /proc/<pid>/task/<tid>/stat)."""
    values = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as handle:
            values.append(int(handle.read().rsplit(")", 1)[1].split()[16]))
    return values


async def test_a_refilled_node_worker_boots_niced_and_runs_at_normal_priority() -> None:
    runtime = Runtime(
        RuntimeOptions(pool_size=0, pool_sizes={"typescript": 1}, defaults=small_budgets())
    )
    if "typescript" not in runtime.languages:
        pytest.skip("no Node on this host")
    await runtime.start()
    try:
        pool = runtime.pools["typescript"]
        await pool.wait_filled()
        (pid,) = child_pids()  # the idle Node worker (no Python worker is pooled)
        booting = nice_of_threads(pid)
        assert len(booting) > 1, "Node runs helper threads"
        assert set(booting) == {_BOOT_NICE}, booting
        worker = pool.take_idle()
        assert worker is not None and worker.pid == pid
        running = nice_of_threads(pid)
        print(f"threads: {len(running)}; niceness booting {booting}, after the hand-off {running}")
        assert set(running) == {0}, running
        await worker.kill()
    finally:
        await runtime.dispose()
