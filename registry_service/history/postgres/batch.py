"""One write transaction of the PostgreSQL history store: a batch of records, the interrupted
ends owed from failed batches, and the sweep of calls whose writers are gone.

A batch costs a fixed number of statements, whatever its size (each one over every record at
once, through arrays): the seq counters, the open calls the batch's end records close, the
records, the open calls it leaves, and a notification per agent for the other registries'
watches. The transaction's caller runs it again when PostgreSQL rolls it back (a deadlock), so
nothing here changes state outside the database."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from registry_service.domain.records import CRASHED, END_OF, Record, content_preview, interrupted

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

NOTIFY_CHANNEL = "codemode_history"
START_OF = {end: start for start, end in END_OF.items()}
COLUMNS = (
    "agent_id",
    "seq",
    "agent",
    "kind",
    "call_id",
    "root_call_id",
    "parent_call_id",
    "time",
    "name",
    "arguments_json",
    "content_json",
    "is_error",
    "error_code",
    "spill_id",
)
_TYPES = ("text", "int8", "text", "text", "text", "text", "text", "float8", "text", "text",
          "text", "bool", "text", "int8")  # fmt: skip
SELECT_COLUMNS = ", ".join(COLUMNS)
_INSERT_RECORDS = (
    f"INSERT INTO history_records ({SELECT_COLUMNS}) SELECT * FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in _TYPES)
    + ")"
)


@dataclass
class Written:
    """What a committed batch wrote, in write order."""

    swept: list[Record]  # the interrupted ends of the sweep
    records: list[Record]  # the batch's own records, in submission order
    all: list[Record]  # everything, for the watchers


async def write(
    conn: Conn,
    writer_id: str,
    *,
    records: Sequence[Record],
    owed: Sequence[Record],
    sweep: bool,
    own: bool,
    renew_s: float | None,
    max_inline: int,
) -> Written:
    """Runs the batch in one transaction on `conn` (autocommit outside it)."""
    async with conn.transaction():
        if renew_s is not None:
            await conn.execute(
                "INSERT INTO history_writers (id, expires_at)"
                " VALUES (%s, now() + make_interval(secs => %s))"
                " ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
                (writer_id, renew_s),
            )
        swept = await _gone_calls(conn, writer_id, own=own) if sweep else []
        closes = [open_id for open_id, _ in swept]
        plan = [interrupted(start, CRASHED) for _, start in swept]
        # Owed ends first (only while their call is still open: the failed end may have been
        # written after all), then the batch, matched with the open calls they close.
        ends = [r for r in (*owed, *records) if r.kind in START_OF]
        open_ids = await _open_calls(conn, ends, skip=set(closes))
        opened: dict[tuple[str, str, str], deque[int]] = defaultdict(deque)
        opening: list[int] = []  # indexes into plan of starts that stay open
        for n, record in enumerate((*owed, *records)):
            if n < len(owed):
                ids = open_ids.get(_key(record))
                if not ids:
                    continue
                closes.append(ids.popleft())
            elif record.kind in END_OF:
                opened[(record.agent_id, record.call_id, record.kind)].append(len(plan))
                opening.append(len(plan))
            elif record.kind in START_OF:
                if ids := open_ids.get(_key(record)):
                    closes.append(ids.popleft())  # the oldest open call, older than the batch
                elif local := opened.get(_key(record)):
                    opening.remove(local.popleft())  # opened and closed in this batch
            plan.append(record)
        seqs = await _take_seqs(conn, [record.agent_id for record in plan])
        rows = [
            await _spill(conn, dataclasses.replace(r, seq=next(seqs[r.agent_id])), max_inline)
            for r in plan
        ]
        await conn.execute(_INSERT_RECORDS, _arrays(rows))
        if opening:
            starts = [rows[n] for n in opening]
            await conn.execute(
                "INSERT INTO history_open_calls"
                " (agent_id, seq, kind, call_id, root_call_id, writer)"
                " SELECT a, s, k, c, r, %s FROM unnest(%s::text[], %s::int8[], %s::text[],"
                " %s::text[], %s::text[]) AS t(a, s, k, c, r)",
                (
                    writer_id,
                    [r.agent_id for r in starts],
                    [r.seq for r in starts],
                    [r.kind for r in starts],
                    [r.call_id for r in starts],
                    [r.root_call_id for r in starts],
                ),
            )
        if closes:
            await conn.execute(
                "DELETE FROM history_open_calls WHERE id = ANY(%s::int8[])", (closes,)
            )
        if rows:
            last: dict[str, int] = {}
            for row in rows:
                last[row.agent_id] = row.seq
            payloads = [json.dumps({"w": writer_id, "a": a, "s": s}) for a, s in last.items()]
            await conn.execute(
                "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", (NOTIFY_CHANNEL, payloads)
            )
    done_owed = len(plan) - len(records)
    return Written(swept=rows[: len(swept)], records=rows[done_owed:], all=rows)


async def _gone_calls(conn: Conn, writer_id: str, *, own: bool) -> list[tuple[int, Record]]:
    """Removes the writers whose lease expired and returns the open calls of writers that are
    gone (and this process's own when `own`), newest first: nested starts come after their
    outer call's. SKIP LOCKED: a registry sweeping at the same time takes other rows or none,
    never the same, and never waits on this one."""
    await conn.execute(
        "DELETE FROM history_writers WHERE id IN (SELECT id FROM history_writers"
        " WHERE expires_at < now() AND id <> %s FOR UPDATE SKIP LOCKED)",
        (writer_id,),
    )
    cursor = await conn.execute(
        "SELECT o.id, " + ", ".join(f"r.{c}" for c in COLUMNS) + " FROM history_open_calls o"
        " JOIN history_records r ON r.agent_id = o.agent_id AND r.seq = o.seq"
        " WHERE (o.writer = %s AND %s) OR NOT EXISTS"
        " (SELECT 1 FROM history_writers w WHERE w.id = o.writer)"
        " ORDER BY o.id DESC FOR UPDATE OF o SKIP LOCKED",
        (writer_id, own),
    )
    return [(int(row[0]), record_of(row[1:])) for row in await cursor.fetchall()]


def _key(end: Record) -> tuple[str, str, str]:
    """The open call an end record closes: its agent id, call id and start kind."""
    return (end.agent_id, end.call_id, START_OF[end.kind])


async def _open_calls(
    conn: Conn, ends: Sequence[Record], *, skip: set[int]
) -> dict[tuple[str, str, str], deque[int]]:
    """The open calls in the database that `ends` may close, oldest first per key (a call id
    may be reused after its call ended), locked for this transaction."""
    keys = sorted({_key(end) for end in ends})
    if not keys:
        return {}
    cursor = await conn.execute(
        "SELECT o.id, o.agent_id, o.call_id, o.kind FROM history_open_calls o"
        " JOIN unnest(%s::text[], %s::text[], %s::text[]) AS k(agent_id, call_id, kind)"
        " ON o.agent_id = k.agent_id AND o.call_id = k.call_id AND o.kind = k.kind"
        " ORDER BY o.id FOR UPDATE OF o",
        ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]),
    )
    found: dict[tuple[str, str, str], deque[int]] = defaultdict(deque)
    for open_id, agent, call_id, kind in await cursor.fetchall():
        if int(open_id) not in skip:
            found[(str(agent), str(call_id), str(kind))].append(int(open_id))
    return found


async def _take_seqs(conn: Conn, agents: Sequence[str]) -> dict[str, Iterator[int]]:
    """Reserves consecutive seqs for each agent id. The counter rows are taken in id order (two
    writers locking rows in one order cannot deadlock) and held to the commit, so per agent
    the seqs are committed in order and without gaps."""
    counts = sorted(Counter(agents).items())
    if not counts:
        return {}
    cursor = await conn.execute(
        "INSERT INTO history_agents AS h (agent_id, last_seq)"
        " SELECT * FROM unnest(%s::text[], %s::int8[]) ORDER BY 1"
        " ON CONFLICT (agent_id) DO UPDATE SET last_seq = h.last_seq + excluded.last_seq"
        " RETURNING agent_id, last_seq",
        ([a for a, _ in counts], [n for _, n in counts]),
    )
    last = {str(agent): int(seq) for agent, seq in await cursor.fetchall()}
    return {agent: iter(range(last[agent] - n + 1, last[agent] + 1)) for agent, n in counts}


async def _spill(conn: Conn, record: Record, max_inline: int) -> Record:
    """The record as stored: content larger than `max_inline` goes to its own row, the record
    keeps a text preview and the locator."""
    if len(record.content_json) <= max_inline:
        return record
    cursor = await conn.execute(
        "INSERT INTO history_spills (content) VALUES (%s) RETURNING id", (record.content_json,)
    )
    row = await cursor.fetchone()
    assert row is not None
    preview = content_preview(record.content_json, min(2048, max_inline))
    return dataclasses.replace(
        record,
        content_json=json.dumps([{"type": "text", "text": preview}]),
        spilled=f"spill:{int(row[0])}",
    )


def _arrays(rows: Sequence[Record]) -> list[list[Any]]:
    def spill_id(record: Record) -> int | None:
        return int(record.spilled.partition(":")[2]) if record.spilled else None

    values = [
        (r.agent_id, r.seq, r.agent, r.kind, r.call_id, r.root_call_id, r.parent_call_id,
         r.time, r.name, r.arguments_json, r.content_json, r.is_error, r.error_code,
         spill_id(r))
        for r in rows
    ]  # fmt: skip
    return (
        [list(column) for column in zip(*values, strict=True)] if values else [[] for _ in COLUMNS]
    )


def record_of(row: Sequence[Any]) -> Record:
    agent_id, seq, agent, kind, call_id, root, parent, time, name, arguments, content = row[:11]
    error, code, spill = row[11:]
    return Record(
        kind=str(kind),
        agent=str(agent),
        agent_id=str(agent_id),
        call_id=str(call_id),
        root_call_id=str(root),
        parent_call_id=str(parent),
        name=str(name),
        arguments_json=str(arguments),
        content_json=str(content),
        is_error=bool(error),
        error_code=str(code),
        time=float(time),
        seq=int(seq),
        spilled="" if spill is None else f"spill:{spill}",
    )
