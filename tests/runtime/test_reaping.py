"""Nothing of a run is left as a zombie: the orphans this process adopts are reaped
(``runtime_service/reaper.py``), and only those -- never a child another waiter expects.

The test process is a child subreaper (``conftest.py``), as a runtime is where it runs as
a container's pid 1 or under a supervisor that made it one: a worker's descendant, a fork
server's init or worker whose parent died first are reparented here. Every check is on
``/proc`` (what exists, whose child it is, its state), none on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from codemode_cli.processes import start
from runtime_service.outcome import BindingCall, BindingResult
from runtime_service.reaper import ChildReaper
from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.sandbox_uids import UidLeases, live_processes_of
from runtime_service.worker_process import WorkerSpec
from tests.procfs import children
from tests.runtime.conftest import (
    can_isolate,
    child_pids,
    drive,
    no_zombie_left,
    small_budgets,
    zombie_children,
)
from tests.runtime.test_hostile_worker import PRELUDE, hosting, seen_by_worker

pytestmark = pytest.mark.skipif(not can_isolate(), reason="needs root with CAP_SYS_ADMIN")

POLLS = 2000
ROOT = str(Path(__file__).resolve().parents[2])


async def until(condition: object, *, what: str) -> None:
    assert callable(condition)
    for _ in range(POLLS):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"never happened: {what}")


@pytest.fixture
def foreign() -> frozenset[int]:
    """The zombies this process had before the test: a subreaper adopts the orphans of every
    earlier test's subprocesses too, and those are not the runtime's to reap (see the reaper's
    rule for a subreaper), so they are not this test's to count."""
    return frozenset(zombie_children())


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()[0].decode()


# -- a spawned worker's descendant, reparented here when the worker is killed -----------------

ORPHANING_WORKER = (
    PRELUDE
    + """\
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
ready()
finish({'descendant': child})
"""
)


async def test_a_killed_spawned_workers_descendant_is_reaped_not_left_a_zombie(
    tmp_path: Path, foreign: frozenset[int]
) -> None:
    # The worker is killed at its run's end; its descendant (same process group) dies by the
    # group kill after it was reparented to this process. Before the reaper it stayed here as
    # a zombie for good, holding its pid (and, with a sandbox uid, the uid).
    async with hosting(tmp_path, "python", ORPHANING_WORKER) as host:
        for _ in range(3):
            _, terminal = await drive(host.stub, host.start("return 1"))
            descendant = seen_by_worker(terminal)["descendant"]
            await until(lambda d=descendant: state(d) is None, what="the descendant reaped")
            assert descendant in {pid for pid, _ in ChildReaper.reaped}
        await no_zombie_left(ignore=foreign)


# -- the fork server killed with runs in flight --------------------------------------------


async def test_runs_outlived_by_nothing_when_the_fork_server_is_killed_mid_run(
    foreign: frozenset[int],
) -> None:
    # Runs in flight when their fork server is SIGKILLed end as worker-exit; whatever it
    # left is reparented here and reaped: no process of the range and no zombie remain,
    # and every uid of the range can be leased again.
    base, count = 63_760, 4
    worker = WorkerSpec(uid_base=base, uid_count=count)
    # No pool: an idle worker would hold a uid of the range between runs.
    runtime = Runtime(RuntimeOptions(pool_size=0, defaults=small_budgets(), worker=worker))
    await runtime.start()
    try:
        started: list[str] = []

        async def note(call: BindingCall) -> BindingResult:
            started.append(call.name)
            return BindingResult.success(None)

        for _ in range(2):
            started.clear()
            held = [
                runtime.create_run(program=SLEEPER, bindings=["started"], handler=note)
                for _ in range(2)
            ]
            running = [asyncio.ensure_future(runtime.execute(run)) for run in held]
            await until(lambda: len(started) == 2, what="both runs started")
            server = runtime.pool.fork_server
            assert server is not None and server.pid is not None
            os.kill(server.pid, signal.SIGKILL)
            results = await asyncio.gather(*running)
            assert all(result.error is not None for result in results), results
            for run in held:
                await run.worker_gone()
            await until(lambda: _range_empty(base, count), what="nothing left in the range")
            await no_zombie_left(ignore=foreign)
        result = await runtime.execute(
            runtime.create_run(program="return 7", bindings=[], handler=_never_called)
        )
        assert result.value == 7, result
    finally:
        await runtime.dispose()
    assert child_pids(fork_servers=True) == []
    await no_zombie_left(ignore=foreign)
    assert _range_empty(base, count)


SLEEPER = "await tools.started({})\nimport time\ntime.sleep(60)"


async def _never_called(call: BindingCall) -> BindingResult:
    raise AssertionError("no binding expected")


def _range_empty(base: int, count: int) -> bool:
    return all(not live_processes_of(uid, zombies=True) for uid in range(base, base + count))


# -- never another waiter's child ------------------------------------------------------------


async def test_a_child_someone_else_waits_for_keeps_its_status_even_with_a_sandbox_uid() -> None:
    # The test's own helper, with a sandbox uid and a name of its own: the reaper (on every
    # SIGCHLD here) must leave it to its Popen, which then reads its real status.
    uid = 63_770
    helpers = [
        subprocess.Popen(  # noqa: ASYNC220 - started at once, waited below
            ["/bin/sh", "-c", "exit 3"], user=uid, group=uid, extra_groups=[]
        )
        for _ in range(5)
    ]
    await until(lambda: all(state(h.pid) == "Z" for h in helpers), what="the helpers exited")
    assert ChildReaper.sweep() == 0
    await asyncio.sleep(0)  # a sweep scheduled by their SIGCHLD runs
    assert [h.wait() for h in helpers] == [3] * 5


# -- what "a uid is free" means ----------------------------------------------------------------


ZOMBIE_KEEPER = textwrap.dedent(
    """\
    import os, sys, time
    uid = int(sys.argv[1])
    child = os.fork()
    if child == 0:
        os.setgid(uid); os.setuid(uid)
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)  # never reaps it
    """
)


async def test_a_uid_held_by_another_parents_zombie_stays_dirty_and_no_lease_waits(
    foreign: frozenset[int],
) -> None:
    # A zombie counts against its uid's process limit (a worker's exclusivity check fails on
    # it), so its uid is not free; it cannot be killed, and is not ours to reap: the uid stays
    # dirty, reclaiming returns at once, and leases go to the other uids of the range.
    base = 63_780
    keeper = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-c", ZOMBIE_KEEPER, str(base)], stdout=subprocess.PIPE
    )
    try:
        assert keeper.stdout is not None
        zombie = int(keeper.stdout.readline())
        await until(lambda: state(zombie) == "Z", what="the keeper's zombie")
        assert await UidLeases.reclaim_range(base, 2) == []
        assert base in UidLeases.dirty()
        uid = UidLeases.acquire(base, 2)
        try:
            assert uid == base + 1
        finally:
            UidLeases.release(uid)
        # Once its parent is gone it is reparented here; an unnamed process that is not the
        # sandbox's is not the reaper's (conftest: a test's helper may look just like it),
        # so the test reaps it, and the next lease finds the uid free again.
        keeper.kill()
        keeper.wait()
        await until(lambda: zombie in children(os.getpid()), what="the zombie adopted")
        assert ChildReaper.sweep() == 0 and state(zombie) == "Z"
        os.waitpid(zombie, 0)  # noqa: ASYNC222 - a zombie: at once
        again = UidLeases.acquire(base, 1)
        UidLeases.release(again)
        assert again == base and base not in UidLeases.dirty()
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait()
    assert set(zombie_children()) <= foreign


# -- as pid 1 of a container ---------------------------------------------------------------------

AS_INIT = textwrap.dedent(
    """\
    import asyncio, json, os, sys, time
    sys.path.insert(0, sys.argv[1])
    from runtime_service.reaper import ChildReaper

    def orphan(code):
        # A child that leaves a grandchild behind: the grandchild is reparented to pid 1.
        middle = os.fork()
        if middle == 0:
            if os.fork() == 0:
                time.sleep(0.05)
                os._exit(code)
            os._exit(0)
        ChildReaper.claim(middle)
        os.waitpid(middle, 0)
        ChildReaper.release(middle)

    async def main():
        mode = ChildReaper.install()
        for code in range(5):
            orphan(code)
        own = os.fork()
        if own == 0:
            os._exit(9)
        ChildReaper.claim(own)  # before the loop runs again: a sweep never takes it
        while len(ChildReaper.reaped) < 5:
            await asyncio.sleep(0.01)
        _, status = os.waitpid(own, 0)
        ChildReaper.release(own)
        zombies = [e for e in os.listdir("/proc") if e.isdigit()
                   and open(f"/proc/{e}/stat").read().rsplit(")", 1)[1].split()[:2] == ["Z", "1"]]
        own = os.waitstatus_to_exitcode(status)
        reaped = sorted(s for _, s in ChildReaper.reaped)
        print(json.dumps({"pid": os.getpid(), "mode": mode, "own": own, "reaped": reaped,
                          "zombies": zombies}))

    asyncio.run(main())
    """
)


async def test_as_pid_1_every_orphan_is_reaped_and_a_claimed_child_keeps_its_status() -> None:
    # The runtime as a container's entry point: orphans of any origin reach it and are
    # reaped; a child it waits for itself (claimed) is left to that wait. Before the reaper
    # the five orphans stayed zombies of pid 1.
    done = await asyncio.create_subprocess_exec(
        "unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", AS_INIT, ROOT,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await done.communicate()
    assert done.returncode == 0, out
    facts = json.loads(out)
    assert facts == {"pid": 1, "mode": "init", "own": 9, "reaped": [0, 1, 2, 3, 4], "zombies": []}


# -- every way a run can end ------------------------------------------------------------------

FORKING = (
    "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        import time\n"
    "        time.sleep(600)\n"
)
ENDINGS = {
    # the wall budget ends it
    "timeout": (FORKING + "import time\ntime.sleep(600)", {"wall_ms": 1500}),
    # the worker dies by its own hand
    "crash": (FORKING + "os.kill(os.getpid(), 9)", {}),
    "abort-signal": (FORKING + "os.abort()", {}),
    # the program returns while its children live on
    "return": (FORKING + "return 1", {}),
    # cancelled from outside (the caller went away)
    "cancel": (FORKING + "await tools.started({})\nimport time\ntime.sleep(600)", {}),
}


async def test_runs_ended_every_way_leave_no_process_of_their_uid_and_no_zombie(
    foreign: frozenset[int],
) -> None:
    # Each way a run can end, twice, each run forking children that would outlive it; then
    # a runtime stopped with runs in flight. Nothing with a uid of the range is left on the
    # host, no zombie child here, and the range can be leased whole again.
    base, count = 63_790, 4
    worker = WorkerSpec(uid_base=base, uid_count=count)
    # No pool: an idle worker would hold a uid of the range between runs.
    runtime = Runtime(RuntimeOptions(pool_size=0, defaults=small_budgets(), worker=worker))
    await runtime.start()
    started: list[str] = []

    async def note(call: BindingCall) -> BindingResult:
        started.append(call.name)
        return BindingResult.success(None)

    try:
        for _ in range(2):
            for kind, (program, budgets) in ENDINGS.items():
                run = runtime.create_run(
                    program=program, bindings=["started"], handler=note, budgets=dict(budgets)
                )
                started.clear()
                execution = asyncio.ensure_future(runtime.execute(run))
                if kind == "cancel":
                    await until(lambda: started != [], what="the run started")
                    run.abort("the caller went away")
                result = await execution
                await run.worker_gone()
                assert kind == "return" or result.error is not None, (kind, result)
                await until(lambda: _range_empty(base, count), what=f"nothing left ({kind})")
                await no_zombie_left(ignore=foreign)
        # Stopped with runs in flight.
        started.clear()
        held = [
            runtime.create_run(program=ENDINGS["cancel"][0], bindings=["started"], handler=note)
            for _ in range(2)
        ]
        running = [asyncio.ensure_future(runtime.execute(run)) for run in held]
        await until(lambda: len(started) == 2, what="both runs started")
    finally:
        await runtime.dispose()
    results = await asyncio.gather(*running)
    assert all(result.error is not None for result in results), results
    assert child_pids(fork_servers=True) == []
    await until(lambda: _range_empty(base, count), what="nothing left after the stop")
    await no_zombie_left(ignore=foreign)
    leased = [UidLeases.acquire(base, count) for _ in range(count)]
    for uid in leased:
        UidLeases.release(uid)
    assert sorted(leased) == list(range(base, base + count))


# -- a runtime of its own, killed outright ------------------------------------------------------


@pytest.mark.parametrize("launch", ["spawn", "fork-server"])
async def test_the_workers_of_a_sigkilled_runtime_process_are_reaped_here(
    launch: str, foreign: frozenset[int]
) -> None:
    # A runtime subprocess (this process's child) is SIGKILLed with workers up: they are
    # reparented to this process (a subreaper), die, and are reaped here -- spawned ones are
    # python/node with a sandbox uid in a session of their own; forked ones and the fork
    # server by name. Before, they stayed zombies, each holding its sandbox uid.
    base, count = 63_800 + (10 if launch == "spawn" else 0), 4
    ChildReaper.watch_uids(base, count)  # what a runtime of this process on that range does
    env = {
        **os.environ,
        "CODEMODE_RUNTIME_WORKER_UID_BASE": str(base),
        "CODEMODE_RUNTIME_WORKER_UID_COUNT": str(count),
        "CODEMODE_RUNTIME_POOL_SIZE": "2",
        "CODEMODE_RUNTIME_TRACE_FILE": "off",
        "CODEMODE_RUNTIME_WORKER_LAUNCH": launch,
    }
    runtime = await start(
        "-m", "runtime_service", "--listen", "127.0.0.1:0",
        ready="runtime listening on port", env=env,
    )  # fmt: skip
    try:
        await until(lambda: _in_range(base, count) >= 2, what="two pooled workers up")
    finally:
        runtime.proc.send_signal(signal.SIGKILL)
        await runtime.proc.wait()
    await until(lambda: _range_empty(base, count), what="nothing left of the range")
    await no_zombie_left(ignore=foreign)


def _in_range(base: int, count: int) -> int:
    return sum(len(live_processes_of(uid)) for uid in range(base, base + count))
