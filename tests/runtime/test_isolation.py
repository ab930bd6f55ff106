"""Programs cannot reach the runtime's files, environment, sockets or processes.

Every test checks reality from inside a real worker and compares it with what the worker's
sandbox report (and so the runtime's capabilities) claims. On a host that allows the full
sandbox (root with CAP_SYS_ADMIN, as CI), every protection must be in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime_service.capabilities import describe_isolation
from runtime_service.outcome import RunFailure
from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.sandbox_uids import UidLeaseError
from runtime_service.worker.sandbox_child import PID_NAMESPACE_OWN, REPORT_KEYS
from runtime_service.worker_process import UidLeases, WorkerProcess, WorkerSpec
from tests.runtime.conftest import (
    ProgramRunner,
    can_isolate,
    child_pids,
    echo_handler,
    secret_file,
    without_pivot_root,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ISOLATED = can_isolate()


@pytest.fixture
async def report(runtime: Runtime) -> dict[str, str]:
    worker = await runtime.pool.acquire()
    try:
        return dict(worker.sandbox)
    finally:
        await worker.kill()


def own_pid_ns(report: dict[str, str]) -> bool:
    return report.get("pid-namespace") == PID_NAMESPACE_OWN


def held(report: dict[str, str], key: str) -> bool:
    return report.get(key) == REPORT_KEYS[key]


async def test_full_sandbox_where_the_host_allows_it(report: dict[str, str]) -> None:
    if not ISOLATED:
        pytest.skip("needs root with CAP_SYS_ADMIN")
    assert {key: report.get(key) for key in REPORT_KEYS} == REPORT_KEYS


async def test_runtime_files_are_absent(run_program: ProgramRunner, report: dict[str, str]) -> None:
    config = Path(tempfile.gettempdir()) / f"codemode-runtime-{uuid.uuid4().hex}.yaml"
    config.write_text("pool_size: 1\n")
    config.chmod(0o644)
    try:
        with secret_file("/root") as in_root, secret_file(tempfile.gettempdir()) as in_tmp:
            paths = [
                str(PROJECT_ROOT / "pyproject.toml"),
                str(PROJECT_ROOT / "runtime_service" / "worker" / "bootstrap.py"),
                in_root,
                in_tmp,
                str(config),
                "/etc/passwd",
            ]
            program = (
                "out = {}\n"
                f"for path in {paths!r}:\n"
                "    try:\n        out[path] = open(path).read()\n"
                "    except OSError as exc:\n        out[path] = type(exc).__name__\n"
                "import os\nout['/'] = sorted(os.listdir('/'))\n"
                "return out"
            )
            result = await run_program(program)
    finally:
        config.unlink()
    assert result.error is None, result.error
    seen = result.value
    assert isinstance(seen, dict)
    if held(report, "filesystem"):
        for path in paths:
            assert seen[path] == "FileNotFoundError", path
        assert set(seen["/"]) <= {"usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32",
                                  "etc", "dev", "proc", "tmp", "root", "opt", "home"}  # fmt: skip
    else:  # the report says the filesystem is shared: then it must really be
        assert seen[paths[0]] != "FileNotFoundError"


async def test_python_installation_is_read_only_and_its_site_packages_hidden(
    run_program: ProgramRunner, report: dict[str, str]
) -> None:
    if not held(report, "filesystem"):
        pytest.skip("filesystem not isolated on this host (reported as such)")
    program = (
        "import os, sys, json\nout = []\n"
        "stdlib = os.path.dirname(os.__file__)\n"
        "out.append(json.dumps([1]))\n"  # the stdlib is importable
        "try:\n    open(os.path.join(stdlib, 'x.py'), 'w')\n"
        "except OSError as exc:\n    out.append(type(exc).__name__)\n"
        "try:\n    out.append(os.listdir(os.path.join(stdlib, 'site-packages')))\n"
        "except OSError as exc:\n    out.append(type(exc).__name__)\n"
        "return out"
    )
    result = await run_program(program)
    assert result.value in (["[1]", "OSError", "PermissionError"], ["[1]", "OSError", []])


async def test_runtime_environment_and_process_are_unreachable(
    run_program: ProgramRunner, report: dict[str, str]
) -> None:
    os.environ["CODEMODE_TEST_SECRET"] = "runtime-secret"
    pid = os.getpid()
    program = (
        "import os, ctypes\nout = {}\n"
        "for name in ('environ', 'cmdline', 'status'):\n"
        f"    try:\n        out[name] = open('/proc/{pid}/' + name, 'rb').read().hex()\n"
        "    except OSError as exc:\n        out[name] = type(exc).__name__\n"
        "found = []\n"
        "for entry in os.listdir('/proc'):\n"
        "    try:\n        data = open('/proc/' + entry + '/environ', 'rb').read()\n"
        "    except OSError:\n        continue\n"
        "    if b'runtime-secret' in data:\n        found.append(entry)\n"
        "out['found'] = found\n"
        f"try:\n    os.kill({pid}, 0)\n    out['kill'] = 'sent'\n"
        "except OSError as exc:\n    out['kill'] = type(exc).__name__\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"out['ptrace'] = [libc.ptrace(16, {pid}, 0, 0), ctypes.get_errno()]\n"
        "return out"
    )
    try:
        result = await run_program(program)
    finally:
        del os.environ["CODEMODE_TEST_SECRET"]
    seen = result.value
    assert isinstance(seen, dict), result.error
    assert seen["found"] == []
    if held(report, "proc"):
        assert seen["environ"] == seen["cmdline"] == seen["status"] == "FileNotFoundError"
    if held(report, "user"):
        # Not even there in the run's own pid namespace; another uid in the host's.
        expected = "ProcessLookupError" if own_pid_ns(report) else "PermissionError"
        assert seen["kill"] == expected
        assert seen["ptrace"] == [-1, 1]  # EPERM
    else:
        assert seen["kill"] == "sent"


async def test_other_workers_cannot_be_signalled(
    runtime: Runtime, run_program: ProgramRunner, report: dict[str, str]
) -> None:
    if not held(report, "user"):
        pytest.skip("workers run as the runtime's user on this host (reported as such)")
    neighbour = await runtime.pool.acquire()
    try:
        result = await run_program(
            f"import os, signal\ntry:\n    os.kill({neighbour.pid}, signal.SIGKILL)\n"
            "except OSError as exc:\n    return type(exc).__name__\nreturn 'killed'"
        )
        expected = "ProcessLookupError" if own_pid_ns(report) else "PermissionError"
        assert result.value == expected
        assert neighbour.alive
    finally:
        await neighbour.kill()


@pytest.fixture
async def listeners() -> AsyncIterator[tuple[int, str, str, list[str]]]:
    """A loopback TCP port, a world-writable Unix socket path and an abstract Unix socket,
    all accepting; the list records every connection they get."""
    accepted: list[str] = []

    def on_connect(name: str) -> object:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(name)
            writer.close()

        return handler

    directory = tempfile.mkdtemp(prefix="codemode-sock-")
    os.chmod(directory, 0o777)
    path = os.path.join(directory, "runtime.sock")
    abstract = f"\0codemode-test-{uuid.uuid4().hex}"
    tcp = await asyncio.start_server(on_connect("tcp"), "127.0.0.1", 0)  # type: ignore[arg-type]
    unix = await asyncio.start_unix_server(on_connect("unix"), path)  # type: ignore[arg-type]
    os.chmod(path, 0o777)
    abstract_server = await asyncio.start_unix_server(on_connect("abstract"), abstract)  # type: ignore[arg-type]
    port = tcp.sockets[0].getsockname()[1]
    try:
        yield port, path, abstract, accepted
    finally:
        for server in (tcp, unix, abstract_server):
            server.close()
            await server.wait_closed()
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.rmdir(directory)


async def test_runtime_sockets_are_unreachable(
    run_program: ProgramRunner,
    report: dict[str, str],
    listeners: tuple[int, str, str, list[str]],
) -> None:
    port, path, abstract, accepted = listeners
    # The same probe from this process succeeds: the listeners are real.
    probe = socket.create_connection(("127.0.0.1", port), timeout=2)
    probe.close()
    program = (
        "import socket\nout = {}\n"
        "def attempt(name, family, address):\n"
        "    s = socket.socket(family, socket.SOCK_STREAM)\n"
        "    s.settimeout(2)\n"
        "    try:\n        s.connect(address)\n        out[name] = 'connected'\n"
        "    except OSError as exc:\n        out[name] = type(exc).__name__\n"
        "    finally:\n        s.close()\n"
        f"attempt('tcp', socket.AF_INET, ('127.0.0.1', {port}))\n"
        f"attempt('unix', socket.AF_UNIX, {path!r})\n"
        f"attempt('abstract', socket.AF_UNIX, {abstract!r})\n"
        "return out"
    )
    result = await run_program(program)
    await asyncio.sleep(0.05)
    assert accepted == ["tcp"]  # only the probe above
    seen = result.value
    assert isinstance(seen, dict), result.error
    if held(report, "network"):
        assert seen["tcp"] != "connected"
        assert seen["abstract"] != "connected"
    if held(report, "filesystem"):
        assert seen["unix"] == "FileNotFoundError"


async def test_worker_runs_unprivileged(run_program: ProgramRunner, report: dict[str, str]) -> None:
    program = (
        "import os\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "return [os.getuid(), os.geteuid(), os.getgid(), os.getgroups(),"
        " int(status['CapEff'], 16), int(status['NoNewPrivs']), int(status['Seccomp'])]"
    )
    results = await asyncio.gather(run_program(program), run_program(program))
    first, second = (result.value for result in results)
    assert isinstance(first, list) and isinstance(second, list)
    if held(report, "user"):
        uid, euid, gid, groups, caps, no_new_privs, _ = first
        assert uid == euid == gid != 0
        assert groups == []
        assert caps == 0
        assert no_new_privs == 1
        assert first[0] != second[0]  # each live worker has a uid of its own
    else:
        assert first[0] == os.getuid()
    assert (first[6] == 2) == held(report, "seccomp")


async def test_descendants_cannot_leave_the_process_group(
    runtime: Runtime, run_program: ProgramRunner, report: dict[str, str]
) -> None:
    if not held(report, "seccomp"):
        pytest.skip("no seccomp filter on this host (reported as such)")
    program = (
        "import os, subprocess\nout = []\n"
        "for attempt in (os.setsid, lambda: os.setpgid(0, 0),\n"
        "                lambda: subprocess.Popen(['sleep', '60'], start_new_session=True),\n"
        "                lambda: subprocess.Popen(['sleep', '60'], process_group=0)):\n"
        "    try:\n        attempt()\n        out.append('escaped')\n"
        "    except OSError as exc:\n        out.append(type(exc).__name__)\n"
        # A double fork: the grandchild is orphaned but stays in the group.
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    if os.fork() == 0:\n        import time\n        time.sleep(60)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "return out"
    )
    result = await run_program(program)
    assert result.value == ["PermissionError"] * 4
    await runtime.pool.wait_filled()
    idle = {worker.pid for worker in runtime.pool._idle}
    for _ in range(50):  # the killed grandchild may take a moment to be reaped
        if set(child_pids()) <= idle:
            break
        await asyncio.sleep(0.02)
    assert set(child_pids()) <= idle


async def test_process_count_is_limited(run_program: ProgramRunner, report: dict[str, str]) -> None:
    if not held(report, "user"):
        pytest.skip("RLIMIT_NPROC does not bind root (reported as not enforced)")
    program = (
        "import os, time\ncount = 0\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        count += 1\n"
        "except OSError as exc:\n    return [count, type(exc).__name__]\n"
        "return [count, 'unlimited']"
    )
    result = await run_program(program)
    assert isinstance(result.value, list), result.error
    count, error = result.value
    assert error == "BlockingIOError"
    assert count < 32


async def test_working_directory_is_private_and_capped(
    run_program: ProgramRunner, report: dict[str, str]
) -> None:
    if not held(report, "filesystem"):
        pytest.skip("filesystem not isolated on this host (reported as such)")
    program = (
        "import os\nopen('note.txt', 'w').write('x')\n"
        "fs = os.statvfs('.')\n"
        "return [os.getcwd(), sorted(os.listdir('.')), fs.f_blocks * fs.f_frsize]"
    )
    first = await run_program(program)
    second = await run_program(program)
    assert first.value == second.value == ["/tmp", ["note.txt"], WorkerSpec().tmp_bytes]


def test_describe_isolation_lists_what_is_missing() -> None:
    spec = WorkerSpec()
    full = describe_isolation(dict(REPORT_KEYS), spec)
    cgroup = "+cgroup" if spec.cgroup_host().available else ""
    assert full.mechanism == "process+namespaces+seccomp" + cgroup
    for topic in ("filesystem:", "processes:", "privileges:", "system calls:", "network:"):
        assert any(item.startswith(topic) for item in full.enforced), topic
        assert not any(item.startswith(topic) for item in full.not_enforced), topic
    degraded = describe_isolation({"network": "shared (Operation not permitted)"}, spec)
    assert degraded.mechanism == "process"
    for topic in ("filesystem:", "processes:", "privileges:", "system calls:", "network:"):
        assert any(item.startswith(topic) for item in degraded.not_enforced), topic
        assert not any(item.startswith(topic) for item in degraded.enforced), topic
    assert any("Operation not permitted" in item for item in degraded.not_enforced)
    assert any(item.startswith("open files:") for item in full.enforced)
    limited = describe_isolation({**REPORT_KEYS, "rlimit-7": "Invalid argument"}, spec)
    assert not any(item.startswith("open files:") for item in limited.enforced)
    assert any("Invalid argument" in item for item in limited.not_enforced)


# A worker on a host that refuses namespaces, uid changes and seccomp, simulated by making
# those calls fail the way an unprivileged container makes them fail.
UNPRIVILEGED_LOADER = """\
import errno, sys
sys.path.insert(0, sys.argv[1])
from runtime_service.worker import sandbox_child
def refuse(*args, **kwargs):
    raise OSError(errno.EPERM, 'Operation not permitted')
sandbox_child._Libc.unshare = refuse
sandbox_child._Libc.mount = refuse
sandbox_child.os.setgroups = refuse
sandbox_child._install_seccomp = lambda libc, arch, report: report.update(seccomp='off (EPERM)')
from runtime_service.worker.bootstrap import main
main()
"""


async def test_a_degraded_sandbox_is_reported_truthfully() -> None:
    spec = WorkerSpec(loader=UNPRIVILEGED_LOADER)
    runtime = Runtime(RuntimeOptions(pool_size=0, worker=spec))
    try:
        worker = await WorkerProcess.spawn(spec)
        report = dict(worker.sandbox)
        workdir = worker.workdir  # no private root: a host directory, removed afterwards
        assert workdir is not None and await asyncio.to_thread(os.path.isdir, workdir)
        await worker.kill()
        await worker.closed
        assert not await asyncio.to_thread(os.path.exists, workdir)
        isolation = describe_isolation(report, spec)
        project_file = str(PROJECT_ROOT / "pyproject.toml")
        run = runtime.create_run(
            program=f"import os\nreturn [os.getuid(), len(open({project_file!r}).read()) > 0]",
            bindings=[],
            handler=echo_handler,
        )
        result = await runtime.execute(run)
    finally:
        await runtime.dispose()
    assert result.error is None, result.error
    assert result.value == [os.getuid(), True]
    # What the report admits is really so: the runtime's files are readable, same user.
    for topic in ("filesystem:", "privileges:", "system calls:", "network:"):
        assert any(item.startswith(topic) for item in isolation.not_enforced), topic
    assert not UidLeases.leased()


async def test_failure_outcomes_still_work_inside_the_sandbox(run_program: ProgramRunner) -> None:
    result = await run_program("import os\nos._exit(7)")
    assert result.error == RunFailure("worker-exit", "worker exited with code 7 before completing")


# Container runtimes' default seccomp profiles refuse pivot_root; the worker then moves its
# root over / and chroots into it.
NO_PIVOT_ROOT_LOADER = without_pivot_root("runtime_service.worker.bootstrap")


async def test_root_switch_without_pivot_root_still_hides_the_runtime() -> None:
    if not ISOLATED:
        pytest.skip("needs root with CAP_SYS_ADMIN")
    spec = WorkerSpec(loader=NO_PIVOT_ROOT_LOADER)
    runtime = Runtime(RuntimeOptions(pool_size=0, worker=spec))
    project_file = str(PROJECT_ROOT / "pyproject.toml")
    try:
        worker = await WorkerProcess.spawn(spec)
        report = dict(worker.sandbox)
        await worker.kill()
        run = runtime.create_run(
            program=(
                "import os\nout = [sorted(os.listdir('/'))]\n"
                f"try:\n    open({project_file!r})\n    out.append('read')\n"
                "except OSError as exc:\n    out.append(type(exc).__name__)\n"
                "try:\n    os.chroot('/')\n"
                "except OSError as exc:\n    out.append(type(exc).__name__)\n"
                "return out"
            ),
            bindings=[],
            handler=echo_handler,
        )
        result = await runtime.execute(run)
    finally:
        await runtime.dispose()
    assert report["root-switch"] == "move+chroot"
    assert {key: report.get(key) for key in REPORT_KEYS} == REPORT_KEYS
    assert isinstance(result.value, list), result.error
    listing, opened, chroot = result.value
    assert "work" not in listing and opened == "FileNotFoundError"
    assert chroot == "PermissionError"


def test_uid_leases_skip_uids_held_by_other_processes() -> None:
    base = 59_990  # a range no runtime here uses
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(f"\0codemode-sandbox-uid-{base}")  # as another runtime on this host would
    try:
        uid = UidLeases.acquire(base, 2)
        assert uid == base + 1
        with pytest.raises(UidLeaseError, match="no free sandbox uid"):
            UidLeases.acquire(base, 2)
        UidLeases.release(uid)
        assert UidLeases.acquire(base, 2) == base + 1
        UidLeases.release(base + 1)
    finally:
        other.close()
    assert base not in UidLeases.leased() and base + 1 not in UidLeases.leased()
