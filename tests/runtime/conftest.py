"""Shared fixtures: a runtime with a small pool, and helpers to run programs through it, in
process or through the gRPC service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.budgets import Budgets
from runtime_service.config import RuntimeSettings
from runtime_service.outcome import BindingCall, BindingResult, RunResult
from runtime_service.reaper import ChildReaper
from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.server import RunningRuntime, start
from runtime_service.worker_process import WorkerSpec
from tests.procfs import alive, children, descendants, parent

pb = runtime_pb2

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
    before = frozenset(zombie_children())
    rt = Runtime(RuntimeOptions(pool_size=2, defaults=small_budgets()))
    await rt.start()
    try:
        yield rt
    finally:
        await rt.dispose()
        left = child_pids(fork_servers=True)
        assert left == [], f"a worker outlived the runtime: {describe(left)}"
        await no_zombie_left(ignore=before)


@pytest.fixture
def run_program(runtime: Runtime) -> ProgramRunner:
    return ProgramRunner(runtime)


# -- through the gRPC service -----------------------------------------------------------------


def grpc_settings(**overrides: Any) -> RuntimeSettings:
    """Settings of a loopback runtime for tests (one pooled worker, a short shutdown grace)."""
    values: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "pool_size": 1,
        "typescript_pool_size": 0,  # TypeScript workers on demand (tests that want one ask)
        "shutdown_grace_s": 0.2,
    }
    return RuntimeSettings(**{**values, **overrides})


@contextlib.asynccontextmanager
async def serving(settings: RuntimeSettings) -> AsyncIterator[RunningRuntime]:
    """A real RuntimeService on loopback; on exit it is stopped and no worker may be left."""
    before = frozenset(zombie_children())
    running = await start(settings)
    try:
        yield running
    finally:
        await running.stop(0)
    left = child_pids(fork_servers=True)
    assert left == [], f"a worker outlived the runtime: {describe(left)}"
    await no_zombie_left(ignore=before)


@contextlib.asynccontextmanager
async def connected(running: RunningRuntime) -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    async with grpc.aio.insecure_channel(running.address) as channel:
        yield runtime_pb2_grpc.RuntimeServiceStub(channel)


@pytest.fixture
async def server() -> AsyncIterator[RunningRuntime]:
    async with serving(grpc_settings()) as running:
        yield running


@pytest.fixture
async def stub(server: RunningRuntime) -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    async with connected(server) as client:
        yield client


def start_message(
    program: str, *names: str, timeout_ms: int | None = None, **budgets: int
) -> runtime_pb2.RunRequest:
    return start_message_in("python", program, *names, timeout_ms=timeout_ms, **budgets)  # type: ignore[arg-type]


def start_message_in(
    language: str,
    program: str,
    *names: str,
    timeout_ms: int | None = None,
    tenant: str = "",
    **budgets: int,
) -> runtime_pb2.RunRequest:
    """The start of a run of ``program`` in ``language`` with bindings ``names`` (for
    ``tenant``: "" for none)."""
    start = pb.RunStart(
        program=program,
        language=language,
        binding_names=list(names),
        token=b"parent-token",
        budgets=pb.RunBudgets(**budgets),
        tenant=tenant,
    )
    if timeout_ms is not None:
        start.timeout.FromMilliseconds(timeout_ms)
    return pb.RunRequest(start=start)


Answer = Callable[[runtime_pb2.BindingCall], Awaitable[runtime_pb2.CallResult | None]]


async def echo_answer(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
    """Answers every binding call with ``{"echo": arguments}``."""
    args = json.loads(call.arguments_json)
    return pb.CallResult(call_id=call.call_id, value_json=json.dumps({"echo": args}))


async def never_answer(call: runtime_pb2.BindingCall) -> None:
    return None


async def drive(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
    first: runtime_pb2.RunRequest,
    answer: Answer = echo_answer,
) -> tuple[list[runtime_pb2.RunResponse], runtime_pb2.RunTerminal]:
    """Run one program to the end of its stream, answering binding calls with ``answer`` (None:
    no answer). Asserts that the stream ends OK with exactly one terminal message, last."""
    call = stub.Run()
    await call.write(first)
    seen: list[runtime_pb2.RunResponse] = []
    async for message in call:
        seen.append(message)
        kind = message.WhichOneof("kind")
        if kind == "binding_call":
            result = await answer(message.binding_call)
            if result is not None:
                await call.write(pb.RunRequest(call_result=result))
        elif kind == "terminal":
            await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
    kinds = [m.WhichOneof("kind") for m in seen]
    assert kinds.count("terminal") == 1 and kinds[-1] == "terminal", kinds
    return seen, seen[-1].terminal


def streamed_logs(seen: list[runtime_pb2.RunResponse]) -> list[str]:
    return [m.log.text for m in seen if m.WhichOneof("kind") == "log"]


def child_pids(parent: int | None = None, *, fork_servers: bool = False) -> list[int]:
    """Live (non-zombie) descendants of ``parent`` (this process by default), from /proc:
    the workers (and what they started); with ``fork_servers`` also the fork servers, their
    nurseries and each run's init (pid 1 of its namespace, a child of the nursery)."""
    found = descendants(os.getpid() if parent is None else parent, live_only=True)
    if not fork_servers:
        found = {
            pid
            for pid in found
            if not is_fork_server(pid) and not is_nursery(pid) and not is_run_init(pid)
        }
    return sorted(found)


async def no_child_left(slack_s: float = 10.0) -> None:
    """Waits until this process has no live worker descendants (a killed worker may take a
    moment to be reaped on a loaded host); fails naming what is left after ``slack_s``."""
    deadline = time.monotonic() + slack_s
    while left := child_pids():
        assert time.monotonic() < deadline, f"processes left behind: {describe(left)}"
        await asyncio.sleep(0.01)


def describe(pids: list[int]) -> list[str]:
    """Each process as ``pid (parent, state): command line``, to tell what was left."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
            state, ppid = stat[stat.rfind(b")") + 2 :].decode().split()[:2]
        except OSError:
            out.append(f"{pid} (gone)")
            continue
        out.append(f"{pid} (parent {ppid}, {state}): {argv}")
    return out


def is_run_init(pid: int) -> bool:
    """Whether ``pid`` is a run's init: a child of a fork server's nursery."""
    try:
        return is_nursery(parent(pid))
    except ProcessLookupError:
        return False


def is_nursery(pid: int) -> bool:
    """Whether ``pid`` is a fork server's nursery (its inits inherit its command line)."""
    try:
        return _runs_code(pid, b"runtime_service.worker.nursery") and not _runs_code(
            parent(pid), b"runtime_service.worker.nursery"
        )
    except ProcessLookupError:
        return False


def is_fork_server(pid: int) -> bool:
    """Whether ``pid`` runs the fork server's code and is not one of its children (forked
    workers inherit its command line)."""
    try:
        return _runs_fork_server_code(pid) and not _runs_fork_server_code(parent(pid))
    except ProcessLookupError:
        return False


def _runs_fork_server_code(pid: int) -> bool:
    return _runs_code(pid, b"runtime_service.worker.zygote")


def _runs_code(pid: int, module: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return module in handle.read()
    except OSError:
        return False


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
    """Orphans of our workers re-parent to the test process, so ``child_pids`` sees them; and
    the runtime's reaper reaps those of the sandbox (``runtime_service/reaper.py``), as it
    would where it is pid 1 or a subreaper itself: a zombie left here would hold its uid."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    ChildReaper.install()
    # The runtimes tests start as subprocesses lease the default range: the workers of one
    # killed outright are reparented here, and a zombie of them would hold its uid for the
    # rest of the session (a runtime of this process watches its range the same way).
    default = WorkerSpec()
    ChildReaper.watch_uids(default.uid_base, default.uid_count)


_become_subreaper()


def zombie_children() -> list[int]:
    """This process's children that have exited and are not reaped yet."""
    me = os.getpid()
    return sorted(pid for pid in children(me) if not alive(pid))


async def no_zombie_left(slack_s: float = 10.0, ignore: frozenset[int] = frozenset()) -> None:
    """Waits until no child of this process is a zombie (the reaper sweeps on the loop's next
    turn after SIGCHLD); fails naming what is left after ``slack_s``. ``ignore``: the zombies
    there before the runtime started (another test's own child left unwaited is that test's
    business, and would otherwise fail every later runtime of the process)."""
    deadline = time.monotonic() + slack_s
    while left := [pid for pid in zombie_children() if pid not in ignore]:
        assert time.monotonic() < deadline, f"zombies left behind: {describe(left)}"
        await asyncio.sleep(0.01)


@contextlib.contextmanager
def secret_file(directory: str) -> Iterator[str]:
    """A world-readable file: only the sandbox, not file permissions, can keep it away."""
    path = os.path.join(directory, f"codemode-secret-{uuid.uuid4().hex}")
    with open(path, "w") as handle:
        handle.write("secret")
    os.chmod(path, 0o644)
    try:
        yield path
    finally:
        os.unlink(path)


def without_pivot_root(module: str) -> str:
    """A loader (``python -c``) running ``module``'s ``main`` with ``pivot_root`` refused, as
    container runtimes' default seccomp profiles refuse it (the sandbox's only raw syscall)."""
    return (
        "import errno, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from runtime_service.worker import sandbox_child\n"
        "def refuse(*args, **kwargs):\n"
        "    raise OSError(errno.EPERM, 'Operation not permitted')\n"
        "sandbox_child._Libc.syscall = refuse\n"
        f"from {module} import main\n"
        "main()\n"
    )
