"""P4 with history on each store: one registry on SQLite, one on PostgreSQL, and two registries
sharing one PostgreSQL database, in the same run.

Topology: one runtime, four registries wired to it (each loads the in-process `noop` tool): one
with `history_store: sqlite` in a WAL file, one with `history_store: postgres`, and a pair on a
database of their own, all on a throwaway loopback cluster that `scripts/postgres` starts (and
removes) for this run. The client runs P4's 50 concurrent programs as one agent, so every
nested call writes its start and settle records; on the pair the programs alternate between
the two replicas (the agent made on one is awaited on the other), so both write the same
agent's history and share its seq counter. Rounds alternate between the stacks so drift hits
all alike.

Reported per stack: nested calls per second, the registries' CPU per nested call (both of the
pair's, summed; from /proc) and the PostgreSQL server's (which a SQLite registry does inside
its own process), and that nothing was lost or written twice: the history holds exactly one
settle record per nested call, with distinct call ids. On this 2-core machine the point is the
cost per call of the shared store, not absolute scaling: two registries compete for the same
two cores as the runtime and the server.

    python -m benchmarks.scale_out [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg

from benchmarks._run_code_support import Service, _tree_cpu, service, wait_for_pool
from benchmarks._support import emit
from benchmarks.run_code import P4_PROGRAMS, SETTLE, Client, p4_program
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb

ROOT = Path(__file__).resolve().parents[1]
POOL_SIZE = 56
STACKS = ("sqlite", "postgres", "postgres_x2")


@dataclass
class Postgres:
    dir: Path
    dsn: str

    def server_cpu(self) -> float:
        """CPU seconds of the postmaster and every live backend (the registry's connections
        live through the run, so their work is counted)."""
        pid = int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        return _tree_cpu(pid) or 0.0


@contextlib.contextmanager
def postgres() -> Any:
    script = str(ROOT / "scripts" / "postgres")
    done = subprocess.run([script, "start"], capture_output=True, text=True, check=True)
    values = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
    server = Postgres(Path(values["CODEMODE_PG_DIR"]), values["CODEMODE_PG_DSN"])
    try:
        yield server
    finally:
        subprocess.run([script, "stop", str(server.dir)], check=False)


@contextlib.asynccontextmanager
async def registries(
    runtime: Service, history_dir: str, dsn: str, shared_dsn: str
) -> AsyncIterator[dict[str, list[Service]]]:
    base = {
        "CODEMODE_REGISTRY_DEFAULT_MODE": "code",
        "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([runtime.address]),
        "CODEMODE_REGISTRY_MAX_PARALLEL_SUB_CALLS": "16",
        # P4 runs 50 programs of one agent at once: no admission run limits.
        "CODEMODE_REGISTRY_LIMITS": json.dumps({"max_concurrent_runs": None}),
        "CODEMODE_REGISTRY_AGENT_LIMITS": json.dumps({"max_concurrent_runs": None}),
        "CODEMODE_REGISTRY_PLUGINS": json.dumps(["benchmarks._run_code_tools:install"]),
    }
    sqlite = {**base, "CODEMODE_REGISTRY_HISTORY_PATH": f"{history_dir}/history.sqlite3"}
    pg = {**base, "CODEMODE_REGISTRY_HISTORY_STORE": "postgres"}
    pg["CODEMODE_REGISTRY_HISTORY_DSN"] = dsn
    # The pair shares a database of its own: the single registry's is left alone.
    shared = {**pg, "CODEMODE_REGISTRY_HISTORY_DSN": shared_dsn}
    ready = "registry listening on port "
    async with (
        service("-m", "registry_service", "--listen", "127.0.0.1:0", ready_prefix=ready,
                env=sqlite) as on_sqlite,
        service("-m", "registry_service", "--listen", "127.0.0.1:0", ready_prefix=ready,
                env=pg) as on_postgres,
        service("-m", "registry_service", "--listen", "127.0.0.1:0", ready_prefix=ready,
                env=shared) as first,
        service("-m", "registry_service", "--listen", "127.0.0.1:0", ready_prefix=ready,
                env=shared) as second,
    ):  # fmt: skip
        yield {"sqlite": [on_sqlite], "postgres": [on_postgres], "postgres_x2": [first, second]}


@dataclass
class Round:
    wall_s: float
    registry_cpu_s: float  # every registry of the stack
    server_cpu_s: float


async def p4_round(
    clients: list[Client], agent: str, stack: list[Service], code: str, pg: Postgres | None
) -> Round:
    """P4's programs, spread over the stack's registries (consecutive ones on different
    replicas), all as one agent: on a pair, both write that agent's history."""
    before = sum(registry.cpu().own_s for registry in stack)
    server_before = pg.server_cpu() if pg else 0.0
    started = time.perf_counter()
    await asyncio.gather(
        *(clients[n % len(clients)].checked(code, agent, batch=True) for n in range(P4_PROGRAMS))
    )
    wall = time.perf_counter() - started
    server = (pg.server_cpu() - server_before) if pg else 0.0
    return Round(wall, sum(registry.cpu().own_s for registry in stack) - before, server)


async def _on_every_replica(clients: list[Client], agent: str) -> None:
    """Waits until the agent made on the first replica is on the others (LISTEN/NOTIFY)."""
    for client in clients[1:]:
        for _ in range(600):
            try:
                await client.stub.GetAgent(rpb.GetAgentRequest(name=agent))
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.NOT_FOUND:
                    raise
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"{agent} did not reach every registry replica")


def _database(pg: Postgres, name: str) -> str:
    """A new database in the run's cluster; its DSN."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}".encode())
    return pg.dsn.rsplit("/", 1)[0] + "/" + name


async def run(quick: bool) -> dict[str, Any]:
    sequential, gathers = (50, 5) if quick else (100, 10)
    calls = P4_PROGRAMS * (sequential + 10 * gathers)
    code = p4_program(sequential, gathers)
    load_start = os.getloadavg()[0]
    rounds: dict[str, list[Round]] = {name: [] for name in STACKS}
    history: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-out-") as tmp, postgres() as pg:
        shared_dsn = _database(pg, "bench_shared")
        runtime_env = {"CODEMODE_RUNTIME_POOL_SIZE": str(POOL_SIZE)}
        async with (
            service("-m", "runtime_service", "--listen", "127.0.0.1:0",
                    ready_prefix="runtime listening on port ", env=runtime_env) as runtime,
            registries(runtime, tmp, pg.dsn, shared_dsn) as stacks,
        ):  # fmt: skip
            await wait_for_pool(runtime, POOL_SIZE)
            channels = {
                name: [grpc.aio.insecure_channel(s.address) for s in stack]
                for name, stack in stacks.items()
            }
            try:
                clients = {
                    name: [Client(c, f"bench-r{n}") for n, c in enumerate(replicas)]
                    for name, replicas in channels.items()
                }
                agents = {}
                for name, replicas in clients.items():
                    agents[name] = await replicas[0].create_agent("bench-p4")
                    await _on_every_replica(replicas, agents[name])
                    for client in replicas:  # warm: connections, imports, caches
                        await client.checked(p4_program(5, 1), agents[name])
                for _ in range(1 if quick else 3):
                    for name, replicas in clients.items():
                        await wait_for_pool(runtime, POOL_SIZE)
                        rounds[name].append(
                            await p4_round(
                                replicas,
                                agents[name],
                                stacks[name],
                                code,
                                None if name == "sqlite" else pg,
                            )
                        )
                for name, replicas in clients.items():
                    history[name] = await replicas[0].count_history(agents[name])
            finally:
                for replica_channels in channels.values():
                    for channel in replica_channels:
                        await channel.close()
    result: dict[str, Any] = {
        "benchmark": "scale_out",
        "quick": quick,
        "cpus": os.cpu_count(),
        "load_1m_start": round(load_start, 2),
        "load_1m_end": round(os.getloadavg()[0], 2),
        "programs": P4_PROGRAMS,
        "nested_calls_per_round": calls,
    }
    for name, done in rounds.items():
        total = calls * len(done)
        warm = (5 + 10) * len(clients[name])  # the warm-up programs' nested calls
        rates = [calls / r.wall_s for r in done]
        settled = history[name].get(SETTLE, 0)
        result[name] = {
            "registries": len(clients[name]),
            "P4_nested_calls_per_s": round(max(rates)),
            "P4_rates": [round(r) for r in rates],
            "registry_cpu_us_per_nested_call": round(
                sum(r.registry_cpu_s for r in done) / total * 1e6, 1
            ),
            "postgres_server_cpu_us_per_nested_call": (
                round(sum(r.server_cpu_s for r in done) / total * 1e6, 1)
                if name != "sqlite"
                else None
            ),
            "settle_records": settled,
            # One settle record per nested call, none twice (distinct call ids).
            "nothing_lost": settled == total + warm
            and history[name]["distinct_settled_call_ids"] == settled,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round per store")
    args = parser.parse_args()
    emit(asyncio.run(run(args.quick)))


if __name__ == "__main__":
    main()
