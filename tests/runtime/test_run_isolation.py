"""Attacks on the unit of isolation, the *run*: its processes, its uid, its descriptors.

Each test performs the attack from a real program (through the runtime's API; over gRPC
against a runtime subprocess where the runtime itself is killed) and checks the host from
outside: /proc in the host's view, as root. What a per-process sandbox let through: processes that
outlived a SIGKILLed runtime and kept their uid, dumpable workers whose memory another run
rewrote, uids leased while a process still held them, and CLONE_PARENT zombies.

Every poll of the host is a bounded loop on an outcome (a process gone), never a wall-time
assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from codemode_cli.processes import running
from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.budgets import Budgets
from runtime_service.outcome import BindingCall, BindingResult, RunResult
from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.sandbox_uids import UidLeases, live_processes_of
from runtime_service.worker.sandbox_child import REPORT_KEYS
from runtime_service.worker_process import WorkerProcess, WorkerSpec
from tests.runtime.conftest import (
    can_isolate,
    child_pids,
    secret_file,
    start_message,
    without_pivot_root,
)

pb = runtime_pb2
PROJECT_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not can_isolate(), reason="needs root with CAP_SYS_ADMIN")

POLLS = 1000  # bounded polls of the host (each ~10 ms apart): an outcome, never a duration
BUDGETS = Budgets(compute_ms=10_000, wall_ms=60_000, memory_bytes=256 << 20)


async def until(condition: object, *, what: str) -> None:
    """Poll ``condition()`` until true, a bounded number of times."""
    assert callable(condition)
    for _ in range(POLLS):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"never happened: {what}")


def uid_is_empty(uid: int) -> bool:
    """No process at all (zombies included) with ``uid`` on the host."""
    return not live_processes_of(uid, zombies=True)


@contextlib.asynccontextmanager
async def private_runtime(
    base: int, count: int, pool_size: int = 1, **spec: object
) -> AsyncIterator[Runtime]:
    """An in-process runtime on a uid range no other test uses."""
    worker = WorkerSpec(uid_base=base, uid_count=count, **spec)  # type: ignore[arg-type]
    runtime = Runtime(RuntimeOptions(pool_size=pool_size, defaults=BUDGETS, worker=worker))
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.dispose()
    assert child_pids(fork_servers=True) == []


async def run(runtime: Runtime, program: str, handler: object = None) -> RunResult:
    async def echo(call: BindingCall) -> BindingResult:
        return BindingResult.success(call.arguments)

    created = runtime.create_run(
        program=program,
        bindings=["echo", "hold"],
        handler=handler or echo,  # type: ignore[arg-type]
    )
    result = await runtime.execute(created)
    await created.worker_gone()  # its uid is free again (one-uid ranges run one at a time)
    return result


def sleeper_as(uid: int) -> subprocess.Popen[bytes]:
    """A process of ``uid`` started by root: what a crashed runtime's run leaves behind."""
    return subprocess.Popen(
        ["/bin/sleep", "600"],
        user=uid,
        group=uid,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
    )


async def reaped(process: subprocess.Popen[bytes]) -> int:
    """The exit status of our own child, polled (bounded)."""
    for _ in range(POLLS):
        if (code := process.poll()) is not None:
            return code
        await asyncio.sleep(0.01)
    process.kill()
    process.wait()
    pytest.fail("the process was never killed")


# -- finding 1: everything of a run dies with it, also when the runtime is SIGKILLed ------------

DAEMON = """\
import os, time
pid = os.fork()
if pid == 0:
    if os.fork() == 0:      # the grandchild: a daemon whose parent is gone at once
        time.sleep(600)
    os._exit(0)
os.waitpid(pid, 0)
await tools.hold({"uid": os.getuid()})
"""


async def test_a_daemon_of_a_run_dies_when_the_runtime_is_sigkilled() -> None:
    base = 62_100
    env = {
        **os.environ,
        "CODEMODE_RUNTIME_WORKER_UID_BASE": str(base),
        "CODEMODE_RUNTIME_WORKER_UID_COUNT": "4",
        "CODEMODE_RUNTIME_POOL_SIZE": "1",
        "CODEMODE_RUNTIME_TRACE_FILE": "off",
        # TEST_WORKER_LAUNCH=spawn shows the attack succeeding without pid namespaces.
        "CODEMODE_RUNTIME_WORKER_LAUNCH": os.environ.get("TEST_WORKER_LAUNCH", "fork-server"),
    }
    async with (
        running(
            "-m", "runtime_service", "--listen", "127.0.0.1:0",
            ready="runtime listening on port", env=env,
        ) as started,
        grpc.aio.insecure_channel(f"127.0.0.1:{started.rest}") as channel,
    ):  # fmt: skip
        stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
        call = stub.Run()
        await call.write(start_message(DAEMON, "hold"))
        async for message in call:
            assert message.WhichOneof("kind") == "binding_call", message
            uid = json.loads(message.binding_call.arguments_json)["uid"]
            break
        # The worker and its daemon are alive, both with the run's uid.
        assert len(live_processes_of(uid)) >= 2
        started.proc.send_signal(signal.SIGKILL)
        await started.proc.wait()
        call.cancel()
    await until(lambda: uid_is_empty(uid), what=f"every process of uid {uid} gone")


async def test_a_run_sees_only_its_own_processes_and_no_worker_is_dumpable() -> None:
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold(call: BindingCall) -> BindingResult:
        held.set()
        await release.wait()
        return BindingResult.success(None)

    async with private_runtime(62_200, 8, pool_size=2) as runtime:
        victim = asyncio.ensure_future(run(runtime, "await tools.hold({})\nreturn 'intact'", hold))
        await held.wait()
        (victim_run,) = runtime._live
        victim_worker = victim_run._worker
        assert victim_worker is not None
        pid, uid = victim_worker.pid, victim_worker.uid
        # From another run: the victim is not even there, and the run sees only itself and
        # the child it started.
        attacker = await run(
            runtime,
            "import os, time\nchild = os.fork()\n"
            "if child == 0:\n    time.sleep(600)\n"
            "out = {'pids': sorted((e for e in os.listdir('/proc') if e.isdigit()), key=int)}\n"
            "out['me'] = os.getpid()\n"
            "out['names'] = [open(f'/proc/{p}/comm').read().strip() for p in ('1', 'self')]\n"
            f"try:\n    open('/proc/{pid}/mem', 'r+b')\n    out['mem'] = 'opened'\n"
            "except OSError as exc:\n    out['mem'] = type(exc).__name__\n"
            f"try:\n    os.kill({pid}, 9)\n    out['kill'] = 'sent'\n"
            "except OSError as exc:\n    out['kill'] = type(exc).__name__\n"
            "return out",
        )
        assert attacker.error is None, attacker.error
        # pid 1 is the run's init, 2 the worker, then the child it forked (only: whatever pid
        # the kernel gave it).
        assert isinstance(attacker.value, dict)
        pids = attacker.value.pop("pids")
        assert pids[:2] == ["1", "2"] and len(pids) == 3, pids
        assert attacker.value == {
            "me": 2,
            # What ps and top show an operator: the run's init and its worker.
            "names": ["codemode-init", "codemode-worker"],
            "mem": "FileNotFoundError",
            "kill": "ProcessLookupError",
        }
        # Even a process of the victim's own uid on the host cannot open its memory: the
        # worker is not dumpable (a survivor of a crashed run held the next tenant's uid).
        probe = await asyncio.to_thread(
            subprocess.run,
            ["/bin/sh", "-c",
             f"if (exec 3<>/proc/{pid}/mem) 2>/dev/null; then echo opened; else echo refused; fi"],
            user=uid, group=uid, extra_groups=[], capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert probe.stdout.strip() == "refused"
        release.set()
        result = await victim
        assert result.value == "intact", result


# -- a uid is never leased while a process holds it -----------------------------------------------


async def test_the_runtime_kills_what_a_previous_runtime_left_in_its_range() -> None:
    base = 62_300
    survivor = sleeper_as(base)
    try:
        await until(lambda: live_processes_of(base), what="the survivor started")
        async with private_runtime(base, 2) as runtime:
            # Killed during start, before any uid of the range was leased.
            assert await reaped(survivor) == -signal.SIGKILL
            result = await run(runtime, "import os\nreturn os.getuid()")
            assert result.value in (base, base + 1), result
    finally:
        if survivor.poll() is None:
            survivor.kill()
            survivor.wait()


async def test_a_uid_held_on_the_host_is_never_handed_to_a_run() -> None:
    base = 62_400
    async with private_runtime(base, 2, pool_size=0) as runtime:
        # Appears after the start (another runtime's survivor, a process someone started).
        intruder = sleeper_as(base)
        try:
            await until(lambda: live_processes_of(base), what="the intruder started")
            uids = []
            for _ in range(4):
                result = await run(runtime, "import os\nreturn os.getuid()")
                assert result.error is None, result.error
                uids.append(result.value)
                if intruder.poll() is None:
                    assert result.value == base + 1, uids  # never the held one
            # The worker that found base held refused to run, and the runtime killed the
            # intruder (it held the uid's lease by then).
            assert await reaped(intruder) == -signal.SIGKILL
        finally:
            if intruder.poll() is None:
                intruder.kill()
                intruder.wait()


# -- finding 4: no process, no zombie left, whatever the program does ------------------------------

CLONE_AND_BOMB = """\
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_clone = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
CLONE_PARENT, SIGCHLD = 0x8000, 17
refused = []
child = os.fork()
if child == 0:  # not the init of the namespace: CLONE_PARENT would make pid 1 the parent
    for _ in range(31):
        pid = libc.syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
        if pid == 0:
            os._exit(0)
    os._exit(0)
os.waitpid(child, 0)
for _ in range(31):
    pid = libc.syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    refused.append(ctypes.get_errno() if pid < 0 else 0)
forks = 0
try:
    while True:
        if os.fork() == 0:
            try:
                os.fork()
            except OSError:
                pass
            time.sleep(600)
        forks += 1
except OSError as exc:
    stopped = exc.errno
return {"refused": sorted(set(refused)), "forks": forks > 0, "stopped": stopped}
"""


async def test_clone_parent_and_a_fork_bomb_leave_no_process_and_no_zombie() -> None:
    base = 62_500
    async with private_runtime(base, 1, pool_size=0) as runtime:  # one uid: the same for all
        result = await run(runtime, CLONE_AND_BOMB)
        assert result.error is None, result.error
        assert result.value == {"refused": [1], "forks": True, "stopped": 11}  # EPERM, EAGAIN
        await until(lambda: uid_is_empty(base), what="nothing left of the run")
        after = await run(runtime, "import os\npid = os.fork()\nif pid == 0:\n    os._exit(3)\n"
                                   "return [os.getuid(), os.waitpid(pid, 0)[1] >> 8]")  # fmt: skip
        assert after.value == [base, 3], after


# -- what a child inherits from the fork server ---------------------------------------------------

FDS = """\
import os
kinds = {}
for fd in sorted(int(e) for e in os.listdir('/proc/self/fd')):
    try:
        target = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        continue  # the listing's own descriptor, closed already
    kinds[str(fd)] = target
return kinds
"""


async def test_a_worker_holds_only_its_own_descriptors() -> None:
    async with private_runtime(62_600, 8) as runtime:
        server = runtime.pool.fork_server
        assert server is not None and server.pid is not None
        zygote_targets = set()
        for fd in os.listdir(f"/proc/{server.pid}/fd"):
            # A descriptor of a fork in progress (its report socket) may close meanwhile.
            with contextlib.suppress(FileNotFoundError):
                zygote_targets.add(os.readlink(f"/proc/{server.pid}/fd/{fd}"))
        result = await run(runtime, FDS)
    assert isinstance(result.value, dict), result
    fds = {int(fd): target for fd, target in result.value.items()}
    assert fds[0] == "/dev/null"
    assert fds[1].startswith("pipe:") and fds[2].startswith("pipe:")
    assert fds[3].startswith("socket:")
    others = [target for fd, target in fds.items() if fd > 3]
    # The program's own event loop: its epoll and its self-pipe (a socket pair), nothing else.
    assert sorted(t.split("[")[0] for t in others) == ["anon_inode:", "socket:", "socket:"], fds
    assert "anon_inode:[eventpoll]" in others
    # Nothing the fork server holds (its control socket, pidfds, wake-up pipe, namespace).
    assert not (set(fds.values()) - {"/dev/null"}) & zygote_targets


async def test_the_fork_server_never_ran_a_program_and_cannot_be_signalled() -> None:
    async with private_runtime(62_700, 8) as runtime:
        server = runtime.pool.fork_server
        assert server is not None and server.pid is not None
        zygote = server.pid
        result = await run(
            runtime,
            "import os, signal\nout = []\n"
            f"for pid in ({zygote}, {os.getpid()}, -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n        out.append('sent')\n"
            "    except OSError as exc:\n        out.append(type(exc).__name__)\n"
            "return out",
        )
        # Nobody else it may signal in its pid namespace (kill(-1) spares itself and the
        # run's init, which runs as another user).
        assert result.value == ["ProcessLookupError", "ProcessLookupError", "ProcessLookupError"]
        assert server.pid == zygote and server.running
        again = await run(runtime, "return 1")
        assert again.value == 1


# -- the root template every forked run starts from ------------------------------------------------

MOUNTS = """\
import os
open('/tmp/mine', 'w').write('x')
mounts = {}
for line in open('/proc/self/mountinfo'):
    fields, _, rest = line.partition(' - ')
    parts = fields.split()
    # id, parent, device, root, mount point, options, then the optional fields (propagation)
    mounts[parts[4]] = {'device': parts[2], 'propagation': parts[6:]}
held = await tools.hold({})
return {'mounts': mounts, 'tmp': sorted(os.listdir('/tmp'))}
"""


def template_listing(zygote: int) -> dict[str, list[str]]:
    """What the fork server's root template holds in /tmp and /proc, seen from inside it
    (nsenter on the namespace descriptor the fork server keeps; no process lives there)."""
    (template,) = [
        f"/proc/{zygote}/fd/{fd}"
        for fd in os.listdir(f"/proc/{zygote}/fd")
        if os.readlink(f"/proc/{zygote}/fd/{fd}").startswith("mnt:")
    ]
    listing = subprocess.run(
        ["nsenter", f"--mount={template}", "/bin/sh", "-c",
         "echo tmp: $(ls -A /tmp); echo proc: $(ls -A /proc)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {
        name: rest.split()
        for name, _, rest in (line.partition(":") for line in listing.stdout.splitlines())
    }


async def test_runs_start_from_a_root_template_and_share_no_mount_with_it_or_each_other() -> None:
    both_held = asyncio.Event()
    holding = 0

    async def hold(call: BindingCall) -> BindingResult:
        nonlocal holding
        holding += 1
        if holding == 2:
            both_held.set()
        await both_held.wait()  # both runs mounted and wrote their /tmp before either ends
        return BindingResult.success(None)

    async with private_runtime(63_100, 8, pool_size=2) as runtime:
        worker = await runtime.pool.acquire()
        report = dict(worker.sandbox)
        await worker.kill()
        first, second = await asyncio.gather(run(runtime, MOUNTS, hold), run(runtime, MOUNTS, hold))
        server = runtime.pool.fork_server
        assert server is not None and server.pid is not None
        # The template kept nothing of either run: no /proc mounted, an empty /tmp.
        assert await asyncio.to_thread(template_listing, server.pid) == {"tmp": [], "proc": []}
    assert report["root-switch"] == "template (pivot_root)"
    assert report["filesystem"] == "private-root"
    assert isinstance(first.value, dict) and isinstance(second.value, dict), (first, second)
    assert first.value["tmp"] == second.value["tmp"] == ["mine"]
    for result in (first.value, second.value):
        # Every mount private: nothing one run mounts propagates to the template or to
        # another run's copy of it.
        assert all(m["propagation"] == [] for m in result["mounts"].values()), result["mounts"]
        assert {"/", "/usr", "/proc", "/tmp", "/dev/null"} <= set(result["mounts"])
    mounts = first.value["mounts"], second.value["mounts"]
    # Each run's /proc and /tmp are its own filesystems; the trees come from the template.
    assert mounts[0]["/proc"]["device"] != mounts[1]["/proc"]["device"]
    assert mounts[0]["/tmp"]["device"] != mounts[1]["/tmp"]["device"]
    assert mounts[0]["/usr"]["device"] == mounts[1]["/usr"]["device"]


# Container runtimes' default seccomp profiles refuse pivot_root: the template's root is then
# moved over / (the host's root stays below it, out of reach without CAP_SYS_CHROOT).
NO_PIVOT_ROOT_ZYGOTE = without_pivot_root("runtime_service.worker.zygote")


def escape(secret: str) -> str:
    """A program that looks for the host's files from a run and tries to leave its root."""
    return f"""\
import os
out = {{'root': sorted(os.listdir('/'))}}
for path in ({str(PROJECT_ROOT / "pyproject.toml")!r}, '/etc/hostname', {secret!r}):
    try:
        os.stat(path)
        out[path] = 'there'
    except OSError as exc:
        out[path] = type(exc).__name__
try:
    os.chroot('/')
    out['chroot'] = 'done'
except OSError as exc:
    out['chroot'] = type(exc).__name__
out['up'] = sorted(os.listdir('/../../..'))
return out
"""


async def test_without_pivot_root_the_template_is_moved_over_the_host_root_and_still_hides_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime_service import zygote

    monkeypatch.setattr(zygote, "_LOADER", NO_PIVOT_ROOT_ZYGOTE)
    async with private_runtime(63_200, 8) as runtime:
        worker = await runtime.pool.acquire()
        report = dict(worker.sandbox)
        await worker.kill()
        with secret_file("/root") as secret:
            result = await run(runtime, escape(secret))
    assert report["root-switch"] == "template (move)"
    assert {key: report.get(key) for key in REPORT_KEYS} == REPORT_KEYS
    assert isinstance(result.value, dict), result
    listing = result.value.pop("root")
    assert "work" not in listing and "home" not in listing and "tmp" in listing
    assert result.value.pop("up") == listing
    assert result.value == {
        str(PROJECT_ROOT / "pyproject.toml"): "FileNotFoundError",
        "/etc/hostname": "FileNotFoundError",
        secret: "FileNotFoundError",
        "chroot": "PermissionError",
    }


# -- the fork server dies --------------------------------------------------------------------------


async def test_killing_the_fork_server_ends_runs_as_worker_exit_and_it_comes_back() -> None:
    held = asyncio.Event()

    async def hold(call: BindingCall) -> BindingResult:
        held.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async with private_runtime(62_800, 8, pool_size=1) as runtime:
        server = runtime.pool.fork_server
        assert server is not None
        victim = asyncio.ensure_future(run(runtime, "await tools.hold({})", hold))
        await held.wait()
        (live,) = runtime._live
        assert live._worker is not None
        uid = live._worker.uid
        zygote = server.pid
        assert zygote is not None
        os.kill(zygote, signal.SIGKILL)
        result = await victim
        assert result.error is not None and result.error.kind == "worker-exit", result
        await until(lambda: uid_is_empty(uid), what="the run's processes gone with the server")
        # The next launch starts a new fork server and runs normally.
        for _ in range(3):
            after = await run(runtime, "return 2")
            if after.value == 2:
                break
            # A pooled worker forked before the kill dies with the server: worker-exit.
            assert after.error is not None and after.error.kind == "worker-exit", after
        assert after.value == 2, after
        assert server.pid not in (None, zygote)
        assert server.restarts >= 1
    assert uid not in UidLeases.leased()


async def test_the_spawn_launch_still_works_and_reports_no_pid_namespace() -> None:
    async with private_runtime(62_900, 8, launch="spawn") as runtime:
        assert runtime.pool.fork_server is None
        worker = await runtime.pool.acquire()
        report = dict(worker.sandbox)
        await worker.kill()
        result = await run(runtime, "import os\nreturn os.getpid() > 1")
    assert report["pid-namespace"].startswith("host")
    assert report["dumpable"] == "no"
    assert result.value is True


async def test_a_forked_worker_cannot_be_handed_the_zygote_s_state() -> None:
    """The fork server imported the worker's modules but holds no program state: a program
    sees a fresh interpreter (no other program's globals, modules or tools)."""
    async with private_runtime(63_000, 8) as runtime:
        first = await run(
            runtime, "import sys\nsys.modules['planted'] = 1\nglobal x\nx = 1\nreturn 1"
        )
        second = await run(
            runtime,
            "import sys\nreturn ['planted' in sys.modules, 'x' in globals(), "
            "'runtime_service.zygote' in sys.modules, 'grpc' in sys.modules, "
            "sorted(k for k in __import__('os').environ)]",
        )
    assert first.value == 1
    assert second.value == [False, False, False, False, []]


def test_worker_process_spawn_without_a_fork_server_spawns() -> None:
    assert WorkerSpec().forks and not WorkerSpec(launch="spawn").forks
    assert not WorkerSpec(loader="pass").forks  # fake workers always spawn
    assert WorkerProcess.spawn.__kwdefaults__ == {"background": False, "fork_server": None}
