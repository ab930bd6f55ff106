"""What the PostgreSQL store adds to the store contract, because one database may be shared by
several registries: seq stays strictly increasing per agent with several writers at once; calls
left open are closed only once their writer is gone (a registry SIGKILLed: its lease expires),
exactly once when several registries sweep; migrations run once when registries start together;
a schema newer than the code, or a bad DSN, stops the start."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import psycopg
import pytest

from registry_service.domain.records import INTERRUPTED, TOOL_CALL, TOOL_RESULT
from registry_service.history.postgres.migrations import LATEST, MIGRATIONS
from registry_service.history.postgres.store import PostgresHistory
from registry_service.history.store import StoreOpenError, StoreState
from tests.postgres_server import PostgresServer
from tests.registry.history.test_store_conformance import everything, rec, shape

# A writer in a process of its own: opens a call and blocks, until the test SIGKILLs it.
_CRASHING_WRITER = """
import asyncio, sys, time
from registry_service.history.postgres.store import PostgresHistory
from registry_service.domain.records import Record

async def main() -> None:
    store = PostgresHistory(sys.argv[1], lease_s=float(sys.argv[2]))
    now = time.time()
    for call_id in ("crashed-1", "crashed-2"):
        await store.append(Record("tool/call", "agents/a", call_id, call_id, "", "t", time=now,
                                  agent_id="agents/a"))
    print("open", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_several_writers_keep_seq_strictly_increasing_per_agent(pg_database: str) -> None:
    stores = [PostgresHistory(pg_database) for _ in range(3)]
    try:
        # Every store writes batches for both agents at the same time as the others.
        async def write(n: int, store: PostgresHistory) -> list[str]:
            ids: list[str] = []
            for batch in range(8):
                records = [
                    rec(TOOL_CALL, f"w{n}-{batch}-{k}", agent=f"agents/{'ab'[k % 2]}")
                    for k in range(6)
                ]
                await asyncio.gather(*map(store.submit, records))
                ids += [r.call_id for r in records]
            return ids

        written = await asyncio.gather(*(write(n, s) for n, s in enumerate(stores)))
        for agent in ("agents/a", "agents/b"):
            listed = await everything(stores[0], agent)
            seqs = [r.seq for r in listed]
            assert seqs == list(range(1, len(seqs) + 1))  # no gap, no repeat, in order
            assert len(listed) == 3 * 8 * 3
            for n, ids in enumerate(written):  # each writer's own order is kept
                mine = [r.call_id for r in listed if r.call_id.startswith(f"w{n}-")]
                assert mine == [i for i in ids if i in set(mine)]
    finally:
        for store in stores:
            await store.close()


async def test_only_calls_of_writers_that_are_gone_are_closed_and_only_once(
    pg_database: str,
) -> None:
    lease = 2.0
    crashed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHING_WRITER, pg_database, str(lease),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    alive = PostgresHistory(pg_database, lease_s=lease)
    sweepers: list[PostgresHistory] = []
    try:
        assert crashed.stdout is not None
        line = await asyncio.wait_for(crashed.stdout.readline(), 60)
        assert line.strip() == b"open"
        await alive.append(rec(TOOL_CALL, "in-flight"))  # a live registry's call
        crashed.kill()  # SIGKILL: its lease is not given back, it expires
        await asyncio.wait_for(crashed.wait(), 10)

        # Two registries start while the lease still holds: nothing of the others is theirs.
        sweepers = [PostgresHistory(pg_database, lease_s=lease) for _ in range(2)]
        for sweeper in sweepers:
            assert await sweeper.close_interrupted() == []

        # Once it expired, the sweeps (both registries renew and sweep on their own) close
        # the dead writer's calls, exactly once between them; the live one's stays open.
        deadline = time.monotonic() + 60
        while len([r for r in await everything(alive) if r.kind == TOOL_RESULT]) < 2:
            assert time.monotonic() < deadline, shape(await everything(alive))
            await asyncio.sleep(0.2)
        await asyncio.sleep(lease)  # a few more sweep rounds: none may close them again
        records = await everything(alive)
        ends = [r for r in records if r.kind == TOOL_RESULT]
        assert sorted(r.call_id for r in ends) == ["crashed-1", "crashed-2"]
        assert all(r.is_error and r.error_code == INTERRUPTED for r in ends)
        assert ("in-flight", TOOL_RESULT) not in shape(records)
    finally:
        if crashed.returncode is None:
            crashed.kill()
            await crashed.wait()
        for store in [alive, *sweepers]:
            await store.close()


async def test_a_closed_writer_leaves_its_open_calls_to_the_next_start(pg_database: str) -> None:
    first = PostgresHistory(pg_database)
    await first.append(rec(TOOL_CALL, "cut"))
    await first.close()  # a graceful stop gives the lease back at once
    second = PostgresHistory(pg_database)
    try:
        closed = await second.close_interrupted()
        assert [(r.call_id, r.kind, r.error_code) for r in closed] == [
            ("cut", TOOL_RESULT, INTERRUPTED)
        ]
    finally:
        await second.close()


def test_registries_starting_at_once_migrate_once(pg_database: str) -> None:
    opened: list[PostgresHistory] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        start.wait()
        try:
            opened.append(PostgresHistory(pg_database))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(opened) == 4
    with psycopg.connect(pg_database) as conn:
        versions = conn.execute("SELECT version FROM codemode_schema_versions").fetchall()
        writers = conn.execute("SELECT count(*) FROM history_writers").fetchone()
    assert [v for (v,) in versions] == [v for v, _ in MIGRATIONS]
    assert writers == (4,)  # one lease per process


def test_a_schema_newer_than_the_code_is_refused(pg_database: str) -> None:
    PostgresHistory(pg_database)  # migrated to this code's version
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO codemode_schema_versions (version) VALUES (%s)", (LATEST + 1,))
    with pytest.raises(StoreOpenError, match=f"schema is at version {LATEST + 1}, newer"):
        PostgresHistory(pg_database)


def test_an_unreachable_server_stops_the_start_without_showing_the_password() -> None:
    with socket_closed_port() as port:
        dsn = f"postgresql://someone:s3cret@127.0.0.1:{port}/codemode"
        with pytest.raises(StoreOpenError) as failed:
            PostgresHistory(dsn)
    message = str(failed.value)
    assert message.startswith(f"cannot open history database postgresql://127.0.0.1:{port}/")
    assert "s3cret" not in message


class socket_closed_port:
    """A loopback port nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def __exit__(self, *_: object) -> None:
        return None


async def test_a_watch_follows_records_another_registry_writes(pg_database: str) -> None:
    here, there = PostgresHistory(pg_database), PostgresHistory(pg_database)
    try:
        first = await here.append(rec(TOOL_CALL, "before"))
        seen: list[str] = []
        following = asyncio.Event()

        async def watch() -> None:
            async for record in here.watch("agents/a", 0):
                seen.append(record.call_id)
                following.set()
                if len(seen) == 7:
                    return

        task = asyncio.create_task(watch())
        await asyncio.wait_for(following.wait(), 10)
        # Written elsewhere, here, and both at once: the watch sees each once, in seq order.
        await there.append(rec(TOOL_CALL, "there-1"))
        await here.append(rec(TOOL_CALL, "here-1"))
        await asyncio.gather(
            there.append(rec(TOOL_CALL, "there-2")),
            here.append(rec(TOOL_CALL, "here-2")),
            there.append(rec(TOOL_CALL, "there-3")),
        )
        await there.append(rec(TOOL_CALL, "other", agent="agents/b"))
        await there.append(rec(TOOL_CALL, "there-4"))  # only a notification tells of it
        await asyncio.wait_for(task, 30)
        listed = await everything(there)
        assert seen == [r.call_id for r in listed] and len(seen) == 7
        assert listed[0].seq == first.seq
    finally:
        await here.close()
        await there.close()


async def test_a_server_restarted_while_idle_costs_no_caller_an_error(
    postgres: PostgresServer, pg_database: str
) -> None:
    store = PostgresHistory(pg_database)
    try:
        written = await store.append(rec(TOOL_CALL, "before"))
        assert await store.list("agents/a", after_seq=0, limit=10) == [written]
        postgres.halt()
        postgres.resume()
        # Both of the store's connections ended with the server: found before they are used.
        after = await store.append(rec(TOOL_CALL, "after"))
        assert await store.list("agents/a", after_seq=0, limit=10) == [written, after]
        assert store.state is StoreState.OK
    finally:
        await store.close()
