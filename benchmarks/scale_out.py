"""P4 with history on each store: one registry on SQLite and one on PostgreSQL, in the same run.

Topology: one runtime, two registries wired to it (each loads the in-process `noop` tool), one
with `history_store: sqlite` in a WAL file, one with `history_store: postgres` on a throwaway
loopback cluster that `scripts/postgres` starts (and removes) for this run. The client runs
P4's 50 concurrent programs as an agent, so every nested call writes its start and settle
records; rounds alternate between the registries so drift hits both alike.

Reported per store: nested calls per second, the registry's CPU per nested call (and the
PostgreSQL server's, which a SQLite registry does inside its own process), and that nothing was
lost: the history holds exactly one settle record per nested call. On this 2-core machine the
point is the cost per call of the store, not absolute scaling.

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

from benchmarks._run_code_support import Service, _tree_cpu, service, wait_for_pool
from benchmarks._support import emit
from benchmarks.run_code import P4_PROGRAMS, SETTLE, Client, p4_program

ROOT = Path(__file__).resolve().parents[1]
POOL_SIZE = 56


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
    runtime: Service, history_dir: str, dsn: str
) -> AsyncIterator[dict[str, Service]]:
    base = {
        "CODEMODE_REGISTRY_DEFAULT_MODE": "code",
        "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([runtime.address]),
        "CODEMODE_REGISTRY_MAX_PARALLEL_SUB_CALLS": "16",
        "CODEMODE_REGISTRY_PLUGINS": json.dumps(["benchmarks._run_code_tools:install"]),
    }
    sqlite = {**base, "CODEMODE_REGISTRY_HISTORY_PATH": f"{history_dir}/history.sqlite3"}
    pg = {**base, "CODEMODE_REGISTRY_HISTORY_STORE": "postgres"}
    pg["CODEMODE_REGISTRY_HISTORY_DSN"] = dsn
    ready = "registry listening on port "
    async with (
        service("-m", "registry_service", "--listen", "127.0.0.1:0", ready_prefix=ready,
                env=sqlite) as on_sqlite,
        service("-m", "registry_service", "--listen", "127.0.0.1:0", ready_prefix=ready,
                env=pg) as on_postgres,
    ):  # fmt: skip
        yield {"sqlite": on_sqlite, "postgres": on_postgres}


@dataclass
class Round:
    wall_s: float
    registry_cpu_s: float
    server_cpu_s: float


async def p4_round(
    client: Client, agent: str, registry: Service, code: str, pg: Postgres | None
) -> Round:
    before = registry.cpu().own_s
    server_before = pg.server_cpu() if pg else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(client.checked(code, agent, batch=True) for _ in range(P4_PROGRAMS)))
    wall = time.perf_counter() - started
    server = (pg.server_cpu() - server_before) if pg else 0.0
    return Round(wall, registry.cpu().own_s - before, server)


async def run(quick: bool) -> dict[str, Any]:
    sequential, gathers = (50, 5) if quick else (100, 10)
    calls = P4_PROGRAMS * (sequential + 10 * gathers)
    code = p4_program(sequential, gathers)
    load_start = os.getloadavg()[0]
    rounds: dict[str, list[Round]] = {"sqlite": [], "postgres": []}
    history: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-out-") as tmp, postgres() as pg:
        runtime_env = {"CODEMODE_RUNTIME_POOL_SIZE": str(POOL_SIZE)}
        async with (
            service("-m", "runtime_service", "--listen", "127.0.0.1:0",
                    ready_prefix="runtime listening on port ", env=runtime_env) as runtime,
            registries(runtime, tmp, pg.dsn) as stacks,
        ):  # fmt: skip
            await wait_for_pool(runtime, POOL_SIZE)
            channels = {name: grpc.aio.insecure_channel(s.address) for name, s in stacks.items()}
            try:
                clients = {name: Client(channel) for name, channel in channels.items()}
                agents = {name: await c.create_agent("bench-p4") for name, c in clients.items()}
                for name, client in clients.items():  # warm: connections, imports, caches
                    await client.checked(p4_program(5, 1), agents[name])
                for _ in range(1 if quick else 3):
                    for name, client in clients.items():
                        await wait_for_pool(runtime, POOL_SIZE)
                        rounds[name].append(
                            await p4_round(
                                client,
                                agents[name],
                                stacks[name],
                                code,
                                pg if name == "postgres" else None,
                            )
                        )
                for name, client in clients.items():
                    counts = await client.count_history(agents[name])
                    history[name] = counts.get(SETTLE, 0)
            finally:
                for channel in channels.values():
                    await channel.close()
    warm = 5 + 10  # the warm-up program's nested calls
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
        rates = [calls / r.wall_s for r in done]
        result[name] = {
            "P4_nested_calls_per_s": round(max(rates)),
            "P4_rates": [round(r) for r in rates],
            "registry_cpu_us_per_nested_call": round(
                sum(r.registry_cpu_s for r in done) / total * 1e6, 1
            ),
            "postgres_server_cpu_us_per_nested_call": (
                round(sum(r.server_cpu_s for r in done) / total * 1e6, 1)
                if name == "postgres"
                else None
            ),
            "settle_records": history[name],
            "nothing_lost": history[name] == total + warm,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round per store")
    args = parser.parse_args()
    emit(asyncio.run(run(args.quick)))


if __name__ == "__main__":
    main()
