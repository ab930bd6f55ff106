"""Programs per second on one runtime: 10-call programs, 50 at once (issue 14).

The runtime server runs in its own process (real gRPC ``RuntimeService.Run`` on loopback);
this process is the client and answers every binding call directly on the stream (no
registry). The same workload runs twice in the same run: with workers from the fork server
(the default) and with a fresh interpreter spawned per worker (``worker_launch: spawn``).

Worker CPU per run covers every process of a run. Each program reports its own process's
CPU clock at the end (boot since fork or exec, isolation, the program); what it cannot see
-- its exit and teardown, the run's init, the fork itself -- is measured from the parent
that reaps them: the fork server's own CPU plus the CPU of every process it (and, below it,
each run's init) reaped (``/proc/<pid>/stat`` utime+stime+cutime+cstime), or the runtime's
reaped children for spawned workers. ``worker_cpu_ms_per_run.p50`` is the p50 of the
programs' own figure plus the mean of what they cannot see; ``mean_all_processes`` is the
reaper's total divided by the runs. (Once runs have their own cgroups, their CPU usage can
replace this.)

Targets: fork server >= 10 x spawn in programs per second, <= 5 ms of worker CPU per run.

    .venv/bin/python -m benchmarks.runtime_throughput [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import grpc

from benchmarks._support import percentile, service_env, subprocess_service
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc

PROGRAM = "import time\nfor i in range(10):\n    await tools.echo(i)\nreturn time.process_time()"
CONCURRENCY = 50
_TICKS = os.sysconf("SC_CLK_TCK")


def _reaper_cpu_s(pid: int, *, children: bool = True) -> float:
    """utime + stime (+ cutime + cstime: its reaped children's) of ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        stat = handle.read()
    fields = stat[stat.rfind(b")") + 2 :].split()
    return sum(int(value) for value in fields[11 : 15 if children else 13]) / _TICKS


def _machine_cpu_s() -> float:
    """CPU time of the whole machine (every core, user + system + irq), from /proc/stat."""
    with open("/proc/stat", "rb") as handle:
        fields = handle.readline().split()[1:]
    busy = [int(value) for index, value in enumerate(fields) if index not in (3, 4)]
    return sum(busy) / _TICKS


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        if int(stat[stat.rfind(b")") + 2 :].split()[1]) == pid:
            found.append(int(entry))
    return found


def _reaper_of_workers(runtime_pid: int, launch: str) -> int:
    """The process that reaps the workers: the fork server, or the runtime itself."""
    if launch == "spawn":
        return runtime_pid
    for child in _children(runtime_pid):
        with open(f"/proc/{child}/cmdline", "rb") as handle:
            if b"runtime_service.worker.zygote" in handle.read():
                return child
    raise RuntimeError("no fork server below the runtime")


def _runtime_pid() -> int:
    """The runtime process (the only ``runtime_service`` child of this process)."""
    for child in _children(os.getpid()):
        with open(f"/proc/{child}/cmdline", "rb") as handle:
            if b"runtime_service" in handle.read():
                return child
    raise RuntimeError("runtime process not found")


async def _one(stub: runtime_pb2_grpc.RuntimeServiceStub) -> float:
    call = stub.Run()
    await call.write(
        pb.RunRequest(start=pb.RunStart(program=PROGRAM, language="python", binding_names=["echo"]))
    )
    cpu = float("nan")
    async for message in call:
        kind = message.WhichOneof("kind")
        if kind == "binding_call":
            result = pb.CallResult(
                call_id=message.binding_call.call_id,
                value_json=message.binding_call.arguments_json,
            )
            await call.write(pb.RunRequest(call_result=result))
        elif kind == "terminal":
            outcome = message.terminal.WhichOneof("outcome")
            assert outcome == "success", message.terminal
            cpu = float(json.loads(message.terminal.success.value_json))
            break
    await call.done_writing()
    return cpu


async def _workload(launch: str, programs: int) -> dict[str, float]:
    env = service_env(
        CODEMODE_RUNTIME_WORKER_LAUNCH=launch,
        CODEMODE_RUNTIME_POOL_SIZE="8",
        CODEMODE_RUNTIME_WORKER_UID_COUNT="200",
    )
    async with subprocess_service(
        "-m", "runtime_service", "--listen", "127.0.0.1:0",
        ready_prefix="runtime listening on port", env=env,
    ) as port:  # fmt: skip
        runtime = _runtime_pid()
        reaper = _reaper_of_workers(runtime, launch)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
            await asyncio.gather(*(_one(stub) for _ in range(10)))  # warm-up
            await asyncio.sleep(0.5)  # the pool refills outside the measurement
            remaining = programs
            own: list[float] = []

            async def client() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    own.append(await _one(stub))

            cpu_before = _reaper_cpu_s(reaper)
            runtime_before = _reaper_cpu_s(runtime, children=False)
            client_before = time.process_time()
            machine_before = _machine_cpu_s()
            started = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
            took = time.perf_counter() - started
            client_cpu = time.process_time() - client_before
            machine_cpu = _machine_cpu_s() - machine_before
            await asyncio.sleep(0.5)  # the last workers are reaped
            cpu_after = _reaper_cpu_s(reaper)
            runtime_after = _reaper_cpu_s(runtime, children=False)
    mean_all = (cpu_after - cpu_before) / len(own)
    unseen = max(0.0, mean_all - statistics.fmean(own))
    return {
        "programs_per_s": round(len(own) / took, 1),
        "worker_cpu_ms_p50": round((statistics.median(own) + unseen) * 1e3, 3),
        "worker_cpu_ms_p99_own": round(percentile(own, 99) * 1e3, 3),
        "worker_cpu_ms_mean_all_processes": round(mean_all * 1e3, 3),
        "runtime_cpu_ms_per_run": round((runtime_after - runtime_before) / len(own) * 1e3, 3),
        "client_cpu_ms_per_run": round(client_cpu / len(own) * 1e3, 3),
        "machine_cpu_ms_per_run": round(machine_cpu / len(own) * 1e3, 3),
        "programs": len(own),
    }


async def main(quick: bool) -> dict[str, object]:
    forked = await _workload("fork-server", 300 if quick else 2000)
    spawned = await _workload("spawn", 60 if quick else 300)
    ratio = forked["programs_per_s"] / spawned["programs_per_s"]
    return {
        "benchmark": "runtime_throughput",
        "quick": quick,
        "concurrency": CONCURRENCY,
        "calls_per_program": 10,
        "programs_per_s": forked["programs_per_s"],
        "spawn_programs_per_s": spawned["programs_per_s"],
        "speedup": round(ratio, 1),
        "worker_cpu_ms_per_run": {
            "p50": forked["worker_cpu_ms_p50"],
            "p99_own_process": forked["worker_cpu_ms_p99_own"],
            "mean_all_processes": forked["worker_cpu_ms_mean_all_processes"],
        },
        "spawn_worker_cpu_ms_per_run": {
            "p50": spawned["worker_cpu_ms_p50"],
            "mean_all_processes": spawned["worker_cpu_ms_mean_all_processes"],
        },
        "fork_server": forked,
        "spawn": spawned,
        "target": {"speedup_min": 10, "worker_cpu_ms_per_run_max": 5.0},
        "meets_target": ratio >= 10 and forked["worker_cpu_ms_p50"] <= 5.0,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick))))
