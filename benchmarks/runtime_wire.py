"""Writes and CPU per nested call on the worker channel: sequential calls against a gather.

The runtime server runs in its own process, started inside a cgroup of the benchmark's own
(``_cgroup_meter``), so that cgroup's CPU account holds the runtime, its fork server and every
run's processes; this process is the client and answers every binding call on the stream.
Three program shapes run interleaved, ``CONCURRENCY`` at once: no call, ten sequential awaits,
and ten calls in one ``asyncio.gather``. Per call = (the shape's figure per run - the 0-call
run's) / 10, so the run's fixed cost drops out.

- ``worker_writes_per_call``: the worker's channel writes per call, counted by the program
  itself (it wraps ``socket.socket.send``/``sendall``, which the Python worker writes its
  channel with; the count covers the program's calls and nothing else);
- ``runtime_write_syscalls_per_call``: write-type syscalls of the runtime process
  (``/proc/<pid>/io`` ``syscw``: its writes to the worker and its gRPC ``sendmsg``) per call;
- ``cpu_us_per_call``: CPU of the runtime and its workers (the cgroup) per call.

The frames a side makes in one event-loop turn share a write (``framing.TurnBatch``: the first
at once, the rest when the turn ends), so the gather's calls cost the worker two writes and
their replies the runtime about two; a sequential program's calls are one write each, as
before. No same-run baseline exists for an older wire: ``docs/benchmarks.md`` records main's
figures beside these. Target: ``gather.worker_writes_per_call`` <= 0.3.

    .venv/bin/python -m benchmarks.runtime_wire [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json

import grpc

from benchmarks._cgroup_meter import cgroup_meter
from benchmarks._support import service_env, subprocess_service
from benchmarks.runtime_throughput import _runtime_pid, echo_run
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc

CONCURRENCY = 20
CALLS = 10
_COUNT_WRITES = """\
import asyncio, socket
_writes = [0]
_sendall, _send = socket.socket.sendall, socket.socket.send
def _counting_all(self, data, *rest):
    _writes[0] += 1
    return _sendall(self, data, *rest)
def _counting(self, data, *rest):
    _writes[0] += 1
    return _send(self, data, *rest)
socket.socket.sendall, socket.socket.send = _counting_all, _counting
"""
SHAPES = {
    "none": _COUNT_WRITES + "return _writes[0]",
    "sequential": _COUNT_WRITES
    + f"for n in range({CALLS}):\n    await tools.echo(n)\nreturn _writes[0]",
    "gather": _COUNT_WRITES
    + f"await asyncio.gather(*(tools.echo(n) for n in range({CALLS})))\nreturn _writes[0]",
}


def _write_syscalls(pid: int) -> int:
    with open(f"/proc/{pid}/io") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key == "syscw":
                return int(value)
    raise OSError(f"no syscw in /proc/{pid}/io")


async def _one(stub: runtime_pb2_grpc.RuntimeServiceStub, program: str) -> int:
    """One run; returns the worker's write count the program reported."""
    return int(await echo_run(stub, program))


async def _batch(stub: runtime_pb2_grpc.RuntimeServiceStub, program: str, runs: int) -> int:
    """``runs`` runs of ``program``, ``CONCURRENCY`` at once; the workers' writes in total."""
    remaining = runs
    writes = 0

    async def client() -> None:
        nonlocal remaining, writes
        while remaining > 0:
            remaining -= 1
            got = await _one(stub, program)  # (not ``writes += await``: that reads first)
            writes += got

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    return writes


async def main(quick: bool) -> dict[str, object]:
    rounds, per_round = (4, 50) if quick else (10, 100)
    env = service_env(CODEMODE_RUNTIME_POOL_SIZE="8", CODEMODE_RUNTIME_WORKER_UID_COUNT="200")
    totals = {shape: {"cpu_s": 0.0, "syscw": 0, "writes": 0, "runs": 0} for shape in SHAPES}
    with cgroup_meter("codemode-bench-wire") as meter:
        if meter is None:
            raise SystemExit("runtime_wire needs a cgroup of its own (run as root)")
        async with subprocess_service(
            "-m", "runtime_service", "--listen", "127.0.0.1:0",
            ready_prefix="runtime listening on port", env=env,
        ) as port:  # fmt: skip
            meter.leave()  # the runtime and what it starts stay in; the client does not
            runtime = _runtime_pid()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
                for program in SHAPES.values():  # warm-up
                    await _batch(stub, program, CONCURRENCY)
                for _ in range(rounds):
                    for shape, program in SHAPES.items():
                        await asyncio.sleep(0.3)  # the pool refills outside the measurement
                        cpu, syscw = meter.cpu_s(), _write_syscalls(runtime)
                        writes = await _batch(stub, program, per_round)
                        await asyncio.sleep(0.3)  # the last workers are reaped
                        total = totals[shape]
                        total["cpu_s"] += meter.cpu_s() - cpu
                        total["syscw"] += _write_syscalls(runtime) - syscw
                        total["writes"] += writes
                        total["runs"] += per_round
    # The pool's refills between batches are charged to the batch they refill for: the same
    # for every shape, so they cancel in the per-call differences.
    per_run = {
        shape: {key: total[key] / total["runs"] for key in ("cpu_s", "syscw", "writes")}
        for shape, total in totals.items()
    }
    base = per_run["none"]
    figures: dict[str, dict[str, float]] = {}
    for shape in ("sequential", "gather"):
        run = per_run[shape]
        figures[shape] = {
            "worker_writes_per_call": round((run["writes"] - base["writes"]) / CALLS, 3),
            "runtime_write_syscalls_per_call": round((run["syscw"] - base["syscw"]) / CALLS, 3),
            "cpu_us_per_call": round((run["cpu_s"] - base["cpu_s"]) / CALLS * 1e6, 1),
            "cpu_ms_per_run": round(run["cpu_s"] * 1e3, 3),
        }
    gather = figures["gather"]
    return {
        "benchmark": "runtime_wire",
        "quick": quick,
        "concurrency": CONCURRENCY,
        "calls_per_program": CALLS,
        "runs_per_shape": totals["none"]["runs"],
        "worker_writes_per_call": gather["worker_writes_per_call"],
        "cpu_us_per_call": gather["cpu_us_per_call"],
        "sequential": figures["sequential"],
        "gather": gather,
        "none": {"cpu_ms_per_run": round(base["cpu_s"] * 1e3, 3)},
        "cpu_accounting": "cgroup (runtime, fork server, workers, refills)",
        "target": {"gather_worker_writes_per_call_max": 0.3},
        "meets_target": gather["worker_writes_per_call"] <= 0.3,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick))))
