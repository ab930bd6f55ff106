"""One cgroup per run: memory (shmem and tmpfs included), process count and CPU time of every
process of a run, attacked through `RuntimeService.Run` over real gRPC on this host (cgroup
v1 here; v2 on Kubernetes nodes).

The kernel's own accounting is the witness: each run's cgroup is captured when the runtime
creates it, and what it measured (peak memory, CPU of all its processes) is read back after it
was removed. No test asserts on wall-clock time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2
from runtime_service import run_cgroup
from runtime_service.run_cgroup import CgroupHost, RunCgroup
from tests.runtime.conftest import connected, drive, grpc_settings, serving, start_message

pb = runtime_pb2
HOST = run_cgroup.shared_host()
needs_cgroups = pytest.mark.skipif(
    not HOST.available, reason=f"no run cgroups on this host: {HOST.reason}"
)
MIB = 1 << 20


@pytest.fixture
def created(monkeypatch: pytest.MonkeyPatch) -> list[RunCgroup]:
    """Every run cgroup the runtime creates during the test."""
    made: list[RunCgroup] = []
    original = CgroupHost.create
    monkeypatch.setattr(RunCgroup, "keep_usage", True)

    def create(self: CgroupHost) -> RunCgroup:
        cgroup = original(self)
        made.append(cgroup)
        return cgroup

    monkeypatch.setattr(CgroupHost, "create", create)
    return made


def used(cgroups: list[RunCgroup]) -> list[run_cgroup.CgroupUsage]:
    """What each run's cgroup measured; every one must have been removed."""
    for cgroup in cgroups:
        assert cgroup.final_usage is not None, f"{cgroup.name} was never removed"
        assert cgroup.dirs == {}, f"{cgroup.name} left {cgroup.dirs}"
        for controller, base in cgroup.host.bases.items():
            assert not os.path.exists(os.path.join(base, cgroup.name)), controller
    return [cgroup.final_usage for cgroup in cgroups if cgroup.final_usage is not None]


def held_mib(logs: list[str]) -> int:
    """MiB the program reported holding (``+<n>`` per chunk, from any of its processes)."""
    return sum(int(n) for n in re.findall(r"\+(\d+)", "".join(logs)))


# Each process holds 32 MiB chunks in memfds (RLIMIT_AS does not see them: nothing is
# mapped), reporting each chunk on fd 1 as it lands. Four children and the worker together
# try for 1.25 GiB against a 160 MiB budget.
MEMFD_PROGRAM = """\
import os, time
def hold(chunks):
    fds = []
    block = b"x" * (1 << 20)
    for i in range(chunks):
        fd = os.memfd_create(f"chunk{i}")
        for _ in range(32):
            os.write(fd, block)
        fds.append(fd)
        os.write(1, b"+32\\n")
    return fds
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        try:
            hold(8)
            time.sleep(30)
        finally:
            os._exit(0)
    children.append(pid)
kept = hold(8)
for pid in children:
    os.waitpid(pid, 0)
return "held everything"
"""

TMP_PROGRAM = """\
import json
import os
block = b"x" * (1 << 20)
try:
    for i in range(16):
        with open(f"/tmp/fill{i}", "wb") as handle:
            for _ in range(32):
                handle.write(block)
        os.write(1, b"+32\\n")
except OSError as exc:
    return ["refused", exc.errno]
return "held everything"
"""


@needs_cgroups
async def test_memfd_pages_of_every_process_count_against_the_run_budget(
    created: list[RunCgroup],
) -> None:
    budget = 160 * MIB
    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as stub:
        seen, terminal = await drive(
            stub, start_message(MEMFD_PROGRAM, memory_bytes=budget, wall_ms=60_000)
        )
    logs = [m.log.text for m in seen if m.WhichOneof("kind") == "log"]
    peaks = [usage.memory_peak_bytes for usage in used(created)]
    print(f"held {held_mib(logs)} MiB reported, cgroup peaks {[p and p >> 20 for p in peaks]} MiB")
    assert terminal.WhichOneof("outcome") == "failure", terminal
    assert terminal.failure.kind == pb.FAILURE_KIND_WORKER_EXIT
    assert terminal.failure.message.startswith("run exceeded its memory budget (160 MiB"), (
        terminal.failure.message
    )
    assert all(peak is not None and peak <= budget for peak in peaks), peaks
    # Chunks reported by a process the OOM killer then ended were freed with it; allow the
    # chunks in flight until the runtime noticed (one poll), far below the 1.25 GiB tried.
    assert held_mib(logs) <= budget // MIB + 4 * 32


@needs_cgroups
async def test_tmp_files_count_against_the_run_budget(created: list[RunCgroup]) -> None:
    budget = 128 * MIB
    # /tmp's own cap far above the run's budget: only the cgroup can stop the writes.
    settings = grpc_settings(pool_size=0, worker_tmp_bytes=512 * MIB)
    async with serving(settings) as running, connected(running) as stub:
        seen, terminal = await drive(
            stub, start_message(TMP_PROGRAM, memory_bytes=budget, wall_ms=60_000)
        )
    logs = [m.log.text for m in seen if m.WhichOneof("kind") == "log"]
    peaks = [usage.memory_peak_bytes for usage in used(created)]
    print(f"held {held_mib(logs)} MiB of /tmp files, cgroup peaks {peaks}")
    assert held_mib(logs) < budget // MIB
    assert all(peak is not None and peak <= budget for peak in peaks), peaks
    if terminal.WhichOneof("outcome") == "failure":
        assert terminal.failure.kind == pb.FAILURE_KIND_WORKER_EXIT, terminal
        assert "memory budget (128 MiB" in terminal.failure.message
    else:  # the write itself was refused
        assert terminal.success.value_json in ('["refused",12]', '["refused",28]'), terminal


SPINNING_CHILDREN = """\
import json
import os
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)  # blocked: the worker itself burns nothing
return "never"
"""


@needs_cgroups
async def test_compute_budget_counts_every_process_of_the_run(created: list[RunCgroup]) -> None:
    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as stub:
        _, terminal = await drive(
            stub, start_message(SPINNING_CHILDREN, compute_ms=300, wall_ms=30_000)
        )
    assert terminal.WhichOneof("outcome") == "failure", terminal
    assert (terminal.failure.kind, terminal.failure.message) == (
        pb.FAILURE_KIND_TIMEOUT,
        "compute budget exhausted (300ms busy)",
    )
    # The first cgroup is the worker GetCapabilities probed at start; the last one the run's.
    usage = used(created)[-1]
    assert usage.cpu_s is not None
    print(f"the run's processes used {usage.cpu_s * 1000:.0f} ms of CPU (budget 300 ms)")
    # Budget, plus what two spinning children burn between two 25 ms polls and until the
    # kill lands, generously for a loaded machine (without the cgroup: ~60 CPU-s).
    assert usage.cpu_s < 1.0


@needs_cgroups
async def test_waiting_on_a_binding_call_is_still_free(created: list[RunCgroup]) -> None:
    import asyncio

    async def late(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
        await asyncio.sleep(0.5)
        return pb.CallResult(call_id=call.call_id, value_json='"late"')

    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as stub:
        _, terminal = await drive(
            stub, start_message("return await tools.t(1)", "t", compute_ms=100), late
        )
        probed = len(running.runtime.languages)
    assert terminal.success.value_json == '"late"', terminal
    # The capabilities probe's workers (one per language) and the run's.
    assert len(used(created)) == probed + 1


@needs_cgroups
async def test_process_count_is_limited_per_run(created: list[RunCgroup]) -> None:
    # Threads count too: a run may not have more than pids_max tasks at once, whatever its
    # uid (below RLIMIT_NPROC's 32 here, so that only the cgroup can stop it).
    program = (
        "import threading, time\ncount = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "        count += 1\n"
        "except RuntimeError:\n    return count\n"
        "return 'unlimited'"
    )
    settings = grpc_settings(pool_size=0, worker_pids_max=12)
    async with serving(settings) as running, connected(running) as stub:
        _, terminal = await drive(stub, start_message(program, wall_ms=30_000))
    assert terminal.WhichOneof("outcome") == "success", terminal
    count = int(terminal.success.value_json)
    assert count < 12
    used(created)


def mechanisms(caps: runtime_pb2.GetCapabilitiesResponse) -> dict[str, tuple[bool, int, str]]:
    return {m.name: (m.enforced, m.scope, m.detail) for m in caps.isolation.mechanisms}


@needs_cgroups
async def test_capabilities_report_per_run_cgroup_mechanisms() -> None:
    async with serving(grpc_settings()) as running, connected(running) as stub:
        caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
    found = mechanisms(caps)
    for name in ("memory", "pids", "compute", "cleanup"):
        enforced, scope, detail = found[name]
        assert (enforced, scope) == (True, pb.ISOLATION_SCOPE_PER_RUN), (name, detail)
        assert HOST.version is not None
    assert f"{HOST.version} memory." in found["memory"][2]
    assert "memfd" in found["memory"][2]
    assert {"network", "filesystem", "seccomp", "uid", "pid-namespace", "rlimits"} <= set(found)
    assert caps.isolation.mechanism.endswith("+cgroup")
    assert any(item.startswith("memory: per-run") for item in caps.isolation.enforced)


async def test_without_cgroups_capabilities_say_per_process_and_why(tmp_path: Path) -> None:
    # A cgroup root with no cgroup filesystem below it, as on a host without delegation.
    settings = grpc_settings(cgroup_root=str(tmp_path), pool_size=0)
    async with serving(settings) as running, connected(running) as stub:
        caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
        _, terminal = await drive(stub, start_message("return 1"))
    assert terminal.success.value_json == "1"
    found = mechanisms(caps)
    for name in ("memory", "compute", "cleanup"):
        enforced, scope, detail = found[name]
        assert (enforced, scope) == (True, pb.ISOLATION_SCOPE_PER_PROCESS), (name, detail)
        assert f"no run cgroup: no cgroup2 mount under {tmp_path}" in detail, detail
    assert "not shared-memory, memfd or /tmp pages" in found["memory"][2]
    assert not caps.isolation.mechanism.endswith("+cgroup")
    assert any(item.startswith("memory: per-process") for item in caps.isolation.not_enforced)
    assert not any(item.startswith("memory:") for item in caps.isolation.enforced)


async def test_cgroups_off_is_reported_as_configured() -> None:
    async with serving(grpc_settings(cgroups="off")) as running, connected(running) as stub:
        caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
    enforced, scope, detail = mechanisms(caps)["compute"]
    assert (enforced, scope) == (True, pb.ISOLATION_SCOPE_PER_PROCESS)
    assert "disabled by configuration (cgroups: off)" in detail


@needs_cgroups
def test_stale_run_cgroups_of_a_dead_runtime_are_swept_with_their_processes() -> None:
    # A run cgroup named after a runtime that is gone (pid 1 with another start time), still
    # holding a process, as a SIGKILLed runtime leaves it; and one of this live runtime.
    stale = RunCgroup(HOST, "codemode-run-1.999999999-7", {})
    live = HOST.create()
    for controller, base in HOST.bases.items():
        path = os.path.join(base, stale.name)
        os.mkdir(path)
        stale.dirs[controller] = path
    survivor = subprocess.Popen(["sleep", "600"])
    try:
        for path in stale.paths:
            with open(os.path.join(path, "cgroup.procs"), "w") as procs:
                procs.write(str(survivor.pid))
        # Others may be swept too: runtimes other tests SIGKILLed (tests/codemode/test_faults).
        assert HOST.sweep_stale() >= 1
        assert survivor.wait(timeout=10) == -signal.SIGKILL
        assert not any(os.path.exists(path) for path in stale.paths)
        assert all(os.path.isdir(path) for path in live.paths)  # a live runtime's: untouched
    finally:
        survivor.kill()
        survivor.wait()
        assert live.try_remove()


def test_tmp_cap_may_not_exceed_the_largest_memory_budget() -> None:
    from runtime_service.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match=r"worker_tmp_bytes .* must not exceed max_memory_bytes"):
        load_settings(worker_tmp_bytes=(512 << 20) + 1)
    assert load_settings(worker_tmp_bytes=512 << 20).worker_tmp_bytes == 512 << 20


REMOUNT_PROBE = """\
import json, subprocess
from runtime_service import run_cgroup
point = next(m.point for m in run_cgroup._mounts() if m.fstype == "cgroup2")
subprocess.run(["mount", "-o", "remount,bind,ro", point], check=True)  # as a container has it
refused = run_cgroup.detect("v2", remount=False).reason
run_cgroup.detect("v2", remount=True)
after = next(m for m in run_cgroup._mounts() if m.point == point)
print(json.dumps([point, refused, after.read_only]))
"""


def test_a_read_only_cgroup2_mount_is_remounted_only_when_configured() -> None:
    # In a mount namespace of its own (nothing changes for this host), the cgroup2 mount is
    # made read-only the way container runtimes mount it.
    mounts = [m for m in run_cgroup._mounts() if m.fstype == "cgroup2"]
    if os.geteuid() != 0 or not mounts or not os.path.exists("/usr/bin/unshare"):
        pytest.skip("needs root, a cgroup2 mount and unshare(1)")
    import json
    import sys

    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", REMOUNT_PROBE],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    point, refused, read_only_after = json.loads(done.stdout)
    assert refused == (
        f"cgroup v2 mount {point} is read-only (set cgroup_remount to remount it read-write, "
        "as the deploy/ manifests do)"
    )
    assert read_only_after is False
    assert not next(m for m in run_cgroup._mounts() if m.point == point).read_only


def test_v2_file_protocol_on_a_stand_in_directory(tmp_path: Path) -> None:
    # This host's v2 mount has no memory controller, so the v2 writes and reads are checked on
    # plain files laid out as a v2 run cgroup (what the kernel would show there).
    host = CgroupHost("v2", "test", dict.fromkeys(("memory", "pids", "cpu"), str(tmp_path)))
    cgroup = host.create()
    (path,) = cgroup.paths
    files = {
        # Written files start empty: plain files, unlike cgroup files, keep old bytes.
        "memory.max": "", "memory.swap.max": "", "memory.oom.group": "",
        "pids.max": "", "cgroup.kill": "", "cgroup.procs": "4242\n",
        "cpu.stat": "usage_usec 1250000\nuser_usec 1000000\nsystem_usec 250000\n",
        "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        "memory.peak": "134217728\n",
    }  # fmt: skip
    for name, text in files.items():
        Path(path, name).write_text(text)
    cgroup.set_memory_limit(128 * MIB)
    cgroup.set_pids_limit(64)
    cgroup.mark_start()
    assert [Path(path, name).read_text() for name in ("memory.max", "memory.swap.max")] == [
        str(128 * MIB),
        "0",
    ]
    assert Path(path, "memory.oom.group").read_text() == "1"
    assert Path(path, "pids.max").read_text() == "64"
    assert cgroup.cpu_seconds() == 1.25
    assert cgroup.oom_killed() and cgroup.oom_kills() == 1
    assert cgroup.memory_peak() == 128 * MIB
    assert cgroup.procs() == {4242}
    cgroup.kill_all()  # populated: one write to cgroup.kill, no signal sent by pid
    assert Path(path, "cgroup.kill").read_text() == "1"


def test_v1_memory_limits_of_a_kept_host_rise_and_fall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 refuses a memory limit above memsw (EINVAL): a kept host's run with a larger budget
    than the last raises memsw first, a smaller one lowers memory first; the same budget as
    the last run writes nothing (stand-in files, the kernel's rule applied to the writes)."""
    host = CgroupHost("v1", "test", {"memory": str(tmp_path)})
    cgroup = host.create()
    (path,) = cgroup.paths
    written: list[tuple[str, int]] = []
    limits = {"memory.limit_in_bytes": 1 << 62, "memory.memsw.limit_in_bytes": 1 << 62}

    def write(target: str, value: str) -> None:
        name = os.path.basename(target)
        limits[name] = int(value)
        if limits["memory.limit_in_bytes"] > limits["memory.memsw.limit_in_bytes"]:
            raise OSError(22, "Invalid argument")
        written.append((name, int(value)))

    monkeypatch.setattr(run_cgroup, "_write", write)
    cgroup.set_memory_limit(64 * MIB)  # from no limit: lower memory, then memsw
    cgroup.set_memory_limit(256 * MIB)  # up: memsw, then memory
    cgroup.set_memory_limit(256 * MIB)  # the same: nothing
    cgroup.set_memory_limit(128 * MIB)  # down: memory, then memsw
    memory, memsw = "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
    assert written == [
        (memory, 64 * MIB), (memsw, 64 * MIB),
        (memsw, 256 * MIB), (memory, 256 * MIB),
        (memory, 128 * MIB), (memsw, 128 * MIB),
    ]  # fmt: skip
    assert path == str(tmp_path / cgroup.name)


@needs_cgroups
async def test_a_forked_runs_init_and_worker_are_both_in_the_run_cgroup(
    created: list[RunCgroup],
) -> None:
    # The worker's cgroup namespace is rooted at the run's cgroup (it unshares after it
    # joined): a process of the run shows "/" in every hierarchy, one outside it "/.."-paths.
    # Pid 1 of the run's pid namespace is its init (a fork of the fork server): it joins the
    # cgroup before it forks the worker, so nothing of the run is ever outside it.
    program = (
        "def read(pid):\n"
        "    with open(f'/proc/{pid}/cgroup') as f:\n"
        "        return sorted(line.strip() for line in f)\n"
        "return [read(1), read('self')]"
    )
    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as stub:
        _, terminal = await drive(stub, start_message(program))
    assert terminal.WhichOneof("outcome") == "success", terminal
    init, worker = json.loads(terminal.success.value_json)
    if not any(line.endswith(":/") for line in worker):
        pytest.skip(f"no cgroup namespace for the worker: {worker}")
    assert init == worker, (init, worker)
    assert all(line.endswith(":/") for line in init), init
    used(created)
