"""The shape of a run's processes: its init from the fork server's nursery, its worker the fork
server's own child born into the init's pid namespace -- attacked from a program and checked
from the host, and what happens when the nursery itself is killed.

Every poll of the host is a bounded loop on an outcome, never a wall-time assertion.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from runtime_service.outcome import BindingCall, BindingResult
from runtime_service.sandbox_uids import UidLeases
from tests.runtime.conftest import can_isolate, child_pids, is_nursery, is_run_init
from tests.runtime.test_run_isolation import private_runtime, run, uid_is_empty, until

pytestmark = pytest.mark.skipif(not can_isolate(), reason="needs root with CAP_SYS_ADMIN")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        stat = handle.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as handle:
        return handle.read().strip()


# From inside: pid 1 is the init, the worker pid 2 with no parent in its namespace; the init
# takes no signal from the program, and what the program orphans is reaped by the init (no
# zombie piles up on the worker or anywhere the program can see).
SHAPE = """\
import os, time
out = {'me': os.getpid(), 'parent': os.getppid()}
try:
    os.kill(1, 9)
    out['kill-init'] = 'sent'
except OSError as exc:
    out['kill-init'] = type(exc).__name__
child = os.fork()
if child == 0:
    if os.fork() == 0:
        os._exit(0)  # the grandchild: orphaned at once, then exits
    time.sleep(0.05)
    os._exit(0)
os.waitpid(child, 0)
for _ in range(500):
    states = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as handle:
                    states[entry] = handle.read().rsplit(')', 1)[1].split()[0]
            except OSError:
                pass
    if 'Z' not in states.values():
        break
    time.sleep(0.01)
out['states'] = states
return out
"""


async def test_a_run_is_an_init_from_the_nursery_and_a_worker_of_the_fork_server() -> None:
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold(call: BindingCall) -> BindingResult:
        held.set()
        await release.wait()
        return BindingResult.success(None)

    async with private_runtime(63_400, 4) as runtime:
        inside = await run(runtime, SHAPE)
        holding = asyncio.ensure_future(run(runtime, "await tools.hold({})\nreturn 1", hold))
        await held.wait()
        (live,) = runtime._live
        assert live._worker is not None
        worker = live._worker.pid
        server = runtime.pool.fork_server
        assert server is not None
        # From the host: the worker is the fork server's child; its init is not its parent
        # but a child of the nursery, itself a child of the fork server.
        assert _parent(worker) == server.pid
        assert _comm(worker) == "codemode-worker"
        inits = [pid for pid in child_pids(fork_servers=True) if is_run_init(pid)]
        assert len(inits) == 1, inits
        assert _comm(inits[0]) == "codemode-init"
        assert is_nursery(_parent(inits[0])) and _parent(_parent(inits[0])) == server.pid
        release.set()
        assert (await holding).value == 1
    assert isinstance(inside.value, dict), inside
    states = inside.value.pop("states")
    assert inside.value == {"me": 2, "parent": 0, "kill-init": "PermissionError"}
    # The init and the worker only: the orphan was reaped, nothing is a zombie. (Whether the
    # init is sleeping or still running at that moment is the scheduler's business.)
    assert sorted(states) == ["1", "2"] and "Z" not in states.values(), states


async def test_killing_the_nursery_ends_runs_as_worker_exit_and_it_comes_back() -> None:
    held = asyncio.Event()

    async def hold(call: BindingCall) -> BindingResult:
        held.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async with private_runtime(63_500, 8, pool_size=1) as runtime:
        server = runtime.pool.fork_server
        assert server is not None
        victim = asyncio.ensure_future(run(runtime, "await tools.hold({})", hold))
        await held.wait()
        (live,) = runtime._live
        assert live._worker is not None
        uid = live._worker.uid
        zygote = server.pid
        nurseries = [pid for pid in child_pids(fork_servers=True) if is_nursery(pid)]
        assert len(nurseries) == 1 and _parent(nurseries[0]) == zygote, nurseries
        os.kill(nurseries[0], signal.SIGKILL)
        result = await victim
        assert result.error is not None and result.error.kind == "worker-exit", result
        await until(lambda: uid_is_empty(uid), what="the run's processes gone with the nursery")
        # Without its nursery the fork server ends itself; the next launch starts a new one.
        for _ in range(3):
            after = await run(runtime, "return 2")
            if after.value == 2:
                break
            # A pooled worker forked before the kill dies with the server: worker-exit.
            assert after.error is not None and after.error.kind == "worker-exit", after
        assert after.value == 2, after
        assert server.pid not in (None, zygote)
    assert uid not in UidLeases.leased()
