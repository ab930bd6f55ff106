"""Programs per second on one runtime: 10-call programs, 50 at once.

The runtime server runs in its own process (real gRPC ``RuntimeService.Run`` on loopback);
this process is the client and answers every binding call directly on the stream (no
registry). The same workload runs twice in the same run: with workers from the fork server
(the default) and with a fresh interpreter spawned per worker (``worker_launch: spawn``).

Worker CPU per run covers every process of a run, measured exactly: the runtime is started
from inside a cgroup of the benchmark's own (``_cgroup_meter``), so that cgroup's CPU account
holds the runtime, its fork server and every run's processes (init, worker, whatever the program
forks, their exits); the runtime's own CPU (``/proc/<pid>/stat``) is taken off. Each launch
replaces a worker the workload used, so the fork server's share is per run too.
``worker_cpu_ms_per_run.mean_all_processes`` is that mean (a cgroup has no per-run
distribution; the runs' own clocks give ``p50_own_process``). Where no cgroup can be made (not
root), the figure is the fork server's reaped children from ``/proc``, marked a lower bound:
side by side with the cgroup it said 5.7 ms where the cgroup said 21 ms.

Targets: fork server >= 10 x spawn in programs per second, <= 5 ms of worker CPU per run.

The Monty tier (``monty_*``, ``monty_tier``): the same workload in the opt-in ``monty`` language,
each client a tenant of its own so that its runs share its kept host (``runtime_service/
kept_hosts.py``), beside a bare ``pydantic_monty`` pool in this process (no services, no
sandbox: the same 10 calls answered directly, one thread per CPU). Targets: >= 5 x the fork
tier, >= 0.5 x the bare pool, <= 6 ms of CPU per program over all processes (hosts and runtime).
``monty_bounds`` says whether the rate was bound by the CPUs (``machine_cpus_busy``: the
machine's, other tenants included) or by waiting, and what 0.5 x bare allows per program;
``monty_floor`` what no tuning of the services removes, measured in the same run: the bare
pool driven as the bridge drives Monty (awaited calls as futures: two round trips to the monty
process per call, where the bare pool's synchronous calls take one) and a bare grpc.aio
server carrying a program's stream (11 messages each way, 50 streams at once).
``ten_times_spawn_budget`` says what 10 x spawn leaves per program on this machine: its CPUs'
time divided by that rate, less the runtime's and the client's CPU as measured here (the
worker's share, whatever the worker does). ``benchmarks.runtime_floor`` takes a forked
worker's own CPU apart step by step.

    .venv/bin/python -m benchmarks.runtime_throughput [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from typing import Any

import grpc

from benchmarks._cgroup_meter import cgroup_meter
from benchmarks._support import (
    child_running,
    percentile,
    process_cpu_s,
    service_env,
    subprocess_service,
)
from codemode_common import procfs
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc

PROGRAM = "import time\nfor i in range(10):\n    await tools.echo(i)\nreturn time.process_time()"
CONCURRENCY = 50
# The Monty tier's program: the same 10 calls (Monty has no ``time.process_time``).
MONTY_PROGRAM = "for i in range(10):\n    await tools.echo(i)\nreturn 0.0"
MONTY_LANGUAGES = json.dumps(["python", "monty"])


def _machine_cpu_s() -> float:
    """CPU time of the whole machine (every core, not idle), from /proc/stat."""
    busy = procfs.machine_busy_s()
    if busy is None:
        raise RuntimeError("/proc/stat is not readable")
    return busy


def _reaper_of_workers(runtime_pid: int, launch: str) -> int:
    """The process that reaps the workers: the fork server, or the runtime itself."""
    if launch == "spawn":
        return runtime_pid
    return child_running(runtime_pid, b"runtime_service.worker.zygote")


def _child_running(marker: bytes) -> int:
    """The child of this process whose command line holds ``marker``."""
    return child_running(os.getpid(), marker)


def _runtime_pid() -> int:
    """The runtime process (the only ``runtime_service`` child of this process)."""
    return child_running(os.getpid(), b"runtime_service")


async def echo_run(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
    program: str,
    language: str = "python",
    tenant: str = "",
) -> Any:
    """One run of ``program`` (Python unless told; for ``tenant``, none unless told) whose
    ``echo`` calls are answered with their arguments, on the stream; returns the program's
    (successful) value."""
    call = stub.Run()
    start = pb.RunStart(program=program, language=language, binding_names=["echo"], tenant=tenant)
    await call.write(pb.RunRequest(start=start))
    value: Any = None
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
            value = json.loads(message.terminal.success.value_json)
            break
    await call.done_writing()
    return value


async def _one(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
    program: str = PROGRAM,
    language: str = "python",
    tenant: str = "",
) -> float:
    return float(await echo_run(stub, program, language, tenant))


async def workload(
    launch: str,
    programs: int,
    language: str = "python",
    program: str = PROGRAM,
    *,
    tenants: bool = False,
    one_tenant: bool = False,
    **env: str,
) -> dict[str, float | str]:
    """``programs`` runs of ``program`` in ``language``, ``CONCURRENCY`` at once, on a runtime
    started with ``env`` besides the launch, its figures measured as the module says. With
    ``tenants`` each client is a tenant of its own (its runs may share a kept host); with
    ``one_tenant`` every client is the same tenant (its runs share that tenant's kept hosts)."""
    env = service_env(
        CODEMODE_RUNTIME_WORKER_LAUNCH=launch,
        CODEMODE_RUNTIME_POOL_SIZE="8",
        CODEMODE_RUNTIME_WORKER_UID_COUNT="200",
        **env,
    )
    with cgroup_meter("codemode-bench") as meter:
        async with subprocess_service(
            "-m", "runtime_service", "--listen", "127.0.0.1:0",
            ready_prefix="runtime listening on port", env=env,
        ) as port:  # fmt: skip
            if meter is not None:
                meter.leave()  # the runtime and what it starts stay in; the client does not
            runtime = _runtime_pid()
            reaper = _reaper_of_workers(runtime, launch)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
                names = [f"bench-{i}" if tenants else "" for i in range(CONCURRENCY)]
                if one_tenant:
                    names = ["bench-one"] * CONCURRENCY
                warm = (_one(stub, program, language, name) for name in names[:10] * 2)
                if tenants:  # every tenant's host is booted outside the measurement
                    warm = (_one(stub, program, language, name) for name in names)
                await asyncio.gather(*warm)  # warm-up
                await asyncio.sleep(0.5)  # the pool refills outside the measurement
                remaining = programs
                own: list[float] = []
                walls: list[float] = []

                async def client(tenant: str) -> None:
                    nonlocal remaining
                    while remaining > 0:
                        remaining -= 1
                        began = time.perf_counter()
                        own.append(await _one(stub, program, language, tenant))
                        walls.append(time.perf_counter() - began)

                def read() -> tuple[float, float, float]:
                    if meter is not None:
                        total = meter.cpu_s()
                    else:
                        total = process_cpu_s(reaper, reaped=True)
                    return total, process_cpu_s(runtime), time.process_time()

                total_before, runtime_before, client_before = read()
                machine_before = _machine_cpu_s()
                started = time.perf_counter()
                await asyncio.gather(*(client(name) for name in names))
                took = time.perf_counter() - started
                machine_cpu = _machine_cpu_s() - machine_before
                client_after = time.process_time()
                await asyncio.sleep(0.5)  # the last workers are reaped
                total_after, runtime_after, _ = read()
    runs = len(own)
    runtime_cpu = (runtime_after - runtime_before) / runs
    if meter is not None:  # the cgroup holds the runtime too
        workers = (total_after - total_before) / runs - runtime_cpu
    else:
        workers = (total_after - total_before) / runs
    return {
        "programs_per_s": round(runs / took, 1),
        "worker_cpu_ms_per_run": round(workers * 1e3, 3),
        "worker_cpu_accounting": "cgroup (exact)" if meter else "reaped children (lower bound)",
        "worker_cpu_ms_p50_own_process": round(statistics.median(own) * 1e3, 3),
        "worker_cpu_ms_p99_own_process": round(percentile(own, 99) * 1e3, 3),
        "runtime_cpu_ms_per_run": round(runtime_cpu * 1e3, 3),
        "client_cpu_ms_per_run": round((client_after - client_before) / runs * 1e3, 3),
        "machine_cpu_ms_per_run": round(machine_cpu / runs * 1e3, 3),
        "program_wall_ms_mean": round(statistics.fmean(walls) * 1e3, 3),
        "programs": runs,
    }


def _bare(programs: int) -> dict[str, float]:
    """A bare pydantic_monty pool: ``programs`` runs of the 10-call program, one thread per
    CPU, each call answered at once."""
    import pydantic_monty as pm

    source = "for i in range(10):\n    echo(i)\n0"
    threads = len(os.sched_getaffinity(0))
    remaining = [programs]
    lock = threading.Lock()
    with pm.Monty(min_processes=threads, max_processes=threads) as pool:

        def one() -> None:
            with pool.checkout() as session:
                snapshot: Any = session.feed_start(source)
                while not isinstance(snapshot, pm.MontyComplete):
                    snapshot = snapshot.resume({"return_value": snapshot.args[0]})

        def client() -> None:
            while True:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                one()

        for _ in range(threads * 2):
            one()  # warm-up
        cpu_before, started = _tree_cpu_s(), time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        took = time.perf_counter() - started
        cpu = _tree_cpu_s() - cpu_before
    return {
        "programs_per_s": round(programs / took, 1),
        "cpu_ms_per_program_this_process_and_pool": round(cpu / programs * 1e3, 3),
        "threads": threads,
    }


# The bridge's protocol with pydantic_monty (``runtime_service/worker_monty/bridge.py``): the
# program is the body of an async function whose calls are awaited, each call a future (its
# synchronous client has no other way to await one), so two round trips to the monty process
# per call where the bare pool's synchronous calls take one.
_FUTURES_SOURCE = (
    "import tools\nasync def __program__():\n    for i in range(10):\n"
    "        await tools.echo(i)\n    return 0.0\nawait __program__()\n"
)


def _bare_futures(programs: int) -> dict[str, float]:
    """The 10-call program on a bare pool of one ``monty`` process per CPU, driven as the
    bridge drives it (awaited calls answered as futures, ``tools`` imported), in this process:
    what a kept host's two processes cost per program with no channel, sandbox or runtime."""
    import pydantic_monty as pm

    def unreachable(*args: object) -> object:
        raise AssertionError("answered as futures")

    module = pm.ExternalModule({"echo": unreachable})
    threads = len(os.sched_getaffinity(0))
    remaining = [programs]
    lock = threading.Lock()
    with pm.Monty(min_processes=threads, max_processes=threads) as pool:

        def one() -> None:
            with pool.checkout(external_modules={"tools": module}) as session:
                snapshot: Any = session.feed_start(_FUTURES_SOURCE)
                answers: dict[int, Any] = {}
                while not isinstance(snapshot, pm.MontyComplete):
                    if isinstance(snapshot, pm.FutureSnapshot):
                        ready: dict[int, pm.ExternalSettledResult] = {
                            i: {"return_value": value} for i, value in answers.items()
                        }
                        answers.clear()
                        snapshot = snapshot.resume(ready)
                    elif snapshot.is_os_function:  # the import of ``tools``
                        snapshot = snapshot.resume_auto()
                    else:
                        answers[snapshot.call_id] = snapshot.args[0]
                        snapshot = snapshot.resume({"future": ...})

        def client() -> None:
            while True:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                one()

        for _ in range(threads * 2):
            one()  # warm-up
        cpu_before, started = _tree_cpu_s(), time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        took = time.perf_counter() - started
        cpu = _tree_cpu_s() - cpu_before
    return {
        "programs_per_s": round(programs / took, 1),
        "cpu_ms_per_program_this_process_and_pool": round(cpu / programs * 1e3, 3),
        "threads": threads,
    }


async def _bare_grpc_relay(programs: int) -> dict[str, float]:
    """What a program's stream costs a bare grpc.aio server (``benchmarks._baseline_server``,
    no runtime logic): a bidi stream per program, 11 messages each way (the 10 calls and the
    start/terminal), ``CONCURRENCY`` streams at once; the server's CPU per program."""
    payload = b'{"call_id": 1, "name": "echo", "arguments_json": "0"}'
    async with subprocess_service(
        "-m", "benchmarks._baseline_server", ready_prefix="port "
    ) as port:  # fmt: skip
        server = _child_running(b"_baseline_server")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ping_pong = channel.stream_stream("/bench.Baseline/PingPong")
            remaining = programs

            async def one() -> None:
                call = ping_pong()
                for _ in range(11):
                    await call.write(payload)
                    await call.read()
                await call.done_writing()
                await call.read()

            async def client() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    await one()

            await asyncio.gather(*(one() for _ in range(CONCURRENCY)))  # warm-up
            before = process_cpu_s(server)
            await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
            cpu = process_cpu_s(server) - before
    return {"server_cpu_ms_per_program": round(cpu / programs * 1e3, 3), "programs": programs}


def _tree_cpu_s() -> float:
    """This process's CPU and its live children's (the pool's monty processes)."""
    children = procfs.children(os.getpid(), ended=False)
    return time.process_time() + sum(procfs.cpu_s(child) or 0.0 for child in children)


async def monty_tier(programs: int, forked: dict[str, float | str]) -> dict[str, object]:
    """The Monty tier beside ``forked`` (the CPython fork tier of the same run): each of the
    50 clients a tenant of its own, so its runs share that tenant's kept host; and a bare
    ``pydantic_monty`` pool (no services, no sandbox) in this process."""
    monty = await workload(
        "fork-server", programs, "monty", MONTY_PROGRAM, tenants=True,
        CODEMODE_RUNTIME_LANGUAGES=MONTY_LANGUAGES,
    )  # fmt: skip
    bare = await asyncio.to_thread(_bare, programs * 2)
    futures = await asyncio.to_thread(_bare_futures, programs * 2)
    relay = await _bare_grpc_relay(programs)
    rate = float(monty["programs_per_s"])
    all_processes = float(monty["worker_cpu_ms_per_run"]) + float(monty["runtime_cpu_ms_per_run"])
    cpus = len(os.sched_getaffinity(0))
    others = float(monty["runtime_cpu_ms_per_run"]) + float(monty["client_cpu_ms_per_run"])
    # Whether the rate is bound by the CPUs or by waiting: the rate the CPUs allow at what each
    # program cost the hosts, the runtime and the client here, the share of the CPUs the
    # workload kept busy, and the rate they would allow if the hosts cost nothing at all.
    workload_cpu_ms = float(monty["worker_cpu_ms_per_run"]) + others
    bounds = {
        "cpus": cpus,
        "cpu_bound_programs_per_s": round(cpus * 1e3 / workload_cpu_ms, 1),
        "cpus_busy_with_the_workload": round(rate * workload_cpu_ms / 1e3 / cpus, 3),
        "free_host_programs_per_s": round(cpus * 1e3 / others, 1),
        "machine_cpu_ms_per_program": monty["machine_cpu_ms_per_run"],
        # Every process on the machine (other tenants of its CPUs included): near 1, the CPUs
        # were saturated during the workload and the rate is CPU-bound, not bound by waiting.
        "machine_cpus_busy": round(rate * float(monty["machine_cpu_ms_per_run"]) / 1e3 / cpus, 3),
        "program_wall_ms_mean": monty["program_wall_ms_mean"],
        "programs_per_s_at_half_bare": round(float(bare["programs_per_s"]) / 2, 1),
        "cpu_ms_per_program_allowed_at_half_bare": round(
            cpus * 1e3 / (float(bare["programs_per_s"]) / 2), 3
        ),
    }
    busy = float(bounds["machine_cpus_busy"])
    bounds["bound"] = "cpu (the machine's, other tenants included)" if busy >= 0.9 else "waiting"
    # What no tuning of the services removes, measured in the same run: the host's two
    # processes doing only the bridge's part with Monty (two round trips per awaited call) and
    # a bare gRPC server carrying the program's stream (what the runtime does at the least).
    host_floor = float(futures["cpu_ms_per_program_this_process_and_pool"])
    runtime_floor = float(relay["server_cpu_ms_per_program"])
    floor = {
        "host_bare_futures_cpu_ms": host_floor,
        "runtime_bare_grpc_stream_cpu_ms": runtime_floor,
        "sum_cpu_ms": round(host_floor + runtime_floor, 3),
        "measured_hosts_cpu_ms": monty["worker_cpu_ms_per_run"],
        "measured_runtime_cpu_ms": monty["runtime_cpu_ms_per_run"],
        "bare_sync_calls_cpu_ms": bare["cpu_ms_per_program_this_process_and_pool"],
    }
    return {
        "monty_programs_per_s": rate,
        "monty_bare_programs_per_s": bare["programs_per_s"],
        "monty_cpu_ms_per_program": round(all_processes, 3),
        "monty_cpu_ms_per_program_hosts_only": monty["worker_cpu_ms_per_run"],
        "monty_vs_cpython_fork": round(rate / float(forked["programs_per_s"]), 2),
        "monty_vs_bare": round(rate / float(bare["programs_per_s"]), 3),
        "monty": monty,
        "monty_bare": bare,
        "monty_bounds": bounds,
        "monty_floor": floor,
        "monty_bare_futures": futures,
        "monty_bare_grpc_relay": relay,
        "monty_target": {
            "vs_cpython_fork_min": 5,
            "vs_bare_min": 0.5,
            "monty_cpu_ms_per_program_max": 6.0,
        },
        "monty_meets_target": rate >= 5 * float(forked["programs_per_s"])
        and rate >= 0.5 * float(bare["programs_per_s"])
        and all_processes <= 6.0,
    }


async def main(quick: bool) -> dict[str, object]:
    forked = await workload("fork-server", 300 if quick else 2000)
    spawned = await workload("spawn", 60 if quick else 300)
    monty = await monty_tier(1000 if quick else 5000, forked)
    ratio = float(forked["programs_per_s"]) / float(spawned["programs_per_s"])
    return {
        **monty,
        "benchmark": "runtime_throughput",
        "quick": quick,
        "concurrency": CONCURRENCY,
        "calls_per_program": 10,
        "programs_per_s": forked["programs_per_s"],
        "spawn_programs_per_s": spawned["programs_per_s"],
        "speedup": round(ratio, 1),
        "worker_cpu_ms_per_run": {
            "mean_all_processes": forked["worker_cpu_ms_per_run"],
            "p50_own_process": forked["worker_cpu_ms_p50_own_process"],
            "accounting": forked["worker_cpu_accounting"],
        },
        "spawn_worker_cpu_ms_per_run": spawned["worker_cpu_ms_per_run"],
        "fork_server": forked,
        "spawn": spawned,
        "target": {"speedup_min": 10, "worker_cpu_ms_per_run_max": 5.0},
        "meets_target": ratio >= 10 and float(forked["worker_cpu_ms_per_run"]) <= 5.0,
        "ten_times_spawn_budget": _budget_at(10 * float(spawned["programs_per_s"]), forked),
    }


def _budget_at(programs_per_s: float, forked: dict[str, float | str]) -> dict[str, float]:
    """What ``programs_per_s`` allows per program on this machine's CPUs, and what of it is
    left for the worker once the runtime and the client (as measured) took theirs."""
    cpus = len(os.sched_getaffinity(0))
    allowed = cpus * 1000 / programs_per_s
    others = float(forked["runtime_cpu_ms_per_run"]) + float(forked["client_cpu_ms_per_run"])
    return {
        "programs_per_s": round(programs_per_s, 1),
        "cpus": cpus,
        "machine_cpu_ms_per_program": round(allowed, 3),
        "runtime_and_client_cpu_ms_per_program": round(others, 3),
        "left_for_the_worker_ms": round(allowed - others, 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick))))
