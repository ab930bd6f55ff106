"""A PostgreSQL connection lost around a COMMIT: the server committed the batch, the store never
heard so and failed its writes (HISTORY_UNAVAILABLE). A call whose start record was in that
batch is in the history although its caller saw the failure: the store closes it, as
interrupted, with its next write, instead of leaving it open for as long as this registry
lives. The connection is cut for real, by a TCP proxy between the store and the server that
forwards the COMMIT and drops the server's answer."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from codemode_wire.errors import CodemodeError
from registry_service.domain.records import INTERRUPTED, TOOL_CALL, TOOL_RESULT
from registry_service.history.postgres.store import PostgresHistory
from registry_service.history.store import HISTORY_UNAVAILABLE
from tests.registry.history.test_store_conformance import everything, rec

# A simple-protocol `COMMIT` query, as psycopg ends a transaction block.
_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"


class CommitCutter:
    """Forwards connections to the server, on a thread of its own (the store opens its first
    connection blocking); once armed, the next connection to send a COMMIT has it delivered,
    and is closed on both sides when the server's answer comes back (the answer never reaches
    the client)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.armed = threading.Event()
        self.cut = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(30)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._target)
        committing = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self.armed.is_set() and _COMMIT in data:
                    self.armed.clear()
                    committing.set()
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if committing.is_set():  # the COMMIT's answer: the client never sees it
                    break
                client_w.write(data)
                await client_w.drain()
            for writer in (client_w, server_w):
                writer.close()
            if committing.is_set():
                self.cut.set()

        with contextlib.suppress(Exception):
            await asyncio.gather(upstream(), downstream())


async def test_a_start_record_committed_as_its_connection_was_lost_is_closed(
    pg_database: str,
) -> None:
    params = conninfo_to_dict(pg_database)
    cutter = CommitCutter(str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432))))
    dsn = make_conninfo(pg_database, host="127.0.0.1", port=str(cutter.port))
    store = PostgresHistory(dsn, lease_s=600)  # no lease renewal commits meanwhile
    try:
        await store.append(rec(TOOL_CALL, "before"))
        cutter.armed.set()
        with pytest.raises(CodemodeError) as lost:
            await store.append(rec(TOOL_CALL, "doubt"))
        assert lost.value.reason == HISTORY_UNAVAILABLE
        assert cutter.cut.is_set()  # the COMMIT was delivered, its answer dropped
        after = await store.append(rec(TOOL_CALL, "after"))  # a new connection: works
        records = await everything(store)
        assert [(r.call_id, r.kind, r.error_code) for r in records] == [
            ("before", TOOL_CALL, ""),
            ("doubt", TOOL_CALL, ""),  # committed after all
            ("doubt", TOOL_RESULT, INTERRUPTED),  # closed by the next write
            ("after", TOOL_CALL, ""),
        ]
        assert records[-1] == after
    finally:
        await store.close()
        cutter.close()
