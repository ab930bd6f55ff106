"""A history database written before agents had ids (records keyed by the agent's name, schema
`user_version` 1) is migrated at start: its records stay readable, each name's under a new id;
an agent the settings declare again takes over its own history, the others stay readable by id
only (and a new agent of such a name starts empty); a call it left open is closed once. The
migrations are recorded, in order, and applied once."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.history.sqlite_migrations import LATEST, MIGRATIONS
from registry_service.history.stores import StoreOptions, open_store

# The schema as the store wrote it before schema_migrations (PRAGMA user_version = 1).
_OLD_SCHEMA = """
CREATE TABLE records (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, agent TEXT NOT NULL, kind TEXT NOT NULL,
  call_id TEXT NOT NULL, root_call_id TEXT NOT NULL, parent_call_id TEXT NOT NULL,
  time REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX records_agent ON records (agent, seq);
CREATE INDEX records_call ON records (agent, call_id);
CREATE INDEX records_root ON records (agent, root_call_id);
CREATE TABLE spills (id INTEGER PRIMARY KEY AUTOINCREMENT, content TEXT NOT NULL);
CREATE TABLE open_calls (
  seq INTEGER PRIMARY KEY, agent TEXT NOT NULL, kind TEXT NOT NULL, call_id TEXT NOT NULL,
  root_call_id TEXT NOT NULL);
CREATE INDEX open_calls_call ON open_calls (agent, call_id);
CREATE TABLE probe (id INTEGER PRIMARY KEY, at REAL NOT NULL);
PRAGMA user_version = 1;
"""


def _old_database(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(_OLD_SCHEMA)
    body = json.dumps(
        {
            "name": "echo",
            "arguments_json": "{}",
            "content_json": '[{"type":"text","text":"ok"}]',
            "is_error": False,
            "error_code": "",
            "spilled": "",
        }
    )
    rows = [
        ("agents/writer", "tool/call", "w1"),
        ("agents/writer", "tool/result", "w1"),
        ("agents/gone", "tool/call", "g1"),
        ("agents/gone", "tool/result", "g1"),
        ("agents/gone", "tool/call", "g2"),  # left open by a crash
    ]
    for seq, (agent, kind, call_id) in enumerate(rows, 1):
        db.execute(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?, '', ?, ?)",
            (seq, agent, kind, call_id, call_id, 1_700_000_000.0 + seq, body),
        )
    db.execute("INSERT INTO open_calls VALUES (5, 'agents/gone', 'tool/call', 'g2', 'g2')")
    db.commit()
    db.close()


async def _history(h: Any, agent: str = "", agent_id: str = "") -> list[tuple[str, str, str]]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, agent_id=agent_id))
    return [(r.call_id, r.kind, r.error_code) for r in page.records]


async def test_records_kept_under_names_are_migrated_to_ids(
    make_registry: Any, tmp_path: Path
) -> None:
    path = tmp_path / "history.sqlite3"
    _old_database(path)

    stores = open_store("sqlite", StoreOptions(path=str(path)))
    legacy = dict((await stores.catalog.load()).legacy_agents)
    await stores.history.close()
    assert set(legacy) == {"agents/writer", "agents/gone"}
    assert all(len(agent_id) == 32 for agent_id in legacy.values())
    db = sqlite3.connect(path)
    applied = [row[0] for row in db.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    db.close()
    assert applied == [m.version for m in MIGRATIONS] and applied[-1] == LATEST

    async with make_registry(history_path=str(path), agents=[{"id": "writer"}]) as h:
        # Declared again by the settings: the agent takes over the history of its name.
        writer = (await h.stub.GetAgent(rpb.GetAgentRequest(name="agents/writer"))).agent
        assert writer.agent_id == legacy["agents/writer"]
        assert await _history(h, agent="agents/writer") == [
            ("w1", "tool/call", ""),
            ("w1", "tool/result", ""),
        ]
        # Not declared: readable by id only, with its open call closed at this start.
        assert await _history(h, agent_id=legacy["agents/gone"]) == [
            ("g1", "tool/call", ""),
            ("g1", "tool/result", ""),
            ("g2", "tool/call", ""),
            ("g2", "tool/result", "INTERRUPTED"),
        ]
        # A new agent of that name does not read its predecessor's records.
        await h.agent("gone")
        assert await _history(h, agent="agents/gone") == []

    async with make_registry(history_path=str(path)) as h:  # applied once, closed once
        assert len(await _history(h, agent_id=legacy["agents/gone"])) == 4
        assert len(await _history(h, agent="agents/writer")) == 2
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("SELECT name FROM legacy_agents").fetchall() == [("agents/gone",)]
    db.close()
