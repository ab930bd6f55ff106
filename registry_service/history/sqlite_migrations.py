"""The SQLite store's schema, as migrations applied in order at start (kept in the repo).

`schema_migrations` lists the versions applied. A database from before that table has its
version in `PRAGMA user_version` (1: the history with `open_calls`), which seeds the list. Each
migration runs in one transaction with its version row: a crash in the middle leaves the
database as it was before it.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


_HISTORY = Migration(
    1,
    "history records, spilled content, open calls (filled from the records once)",
    (
        """CREATE TABLE IF NOT EXISTS records (
          seq INTEGER PRIMARY KEY AUTOINCREMENT,
          agent TEXT NOT NULL,
          kind TEXT NOT NULL,
          call_id TEXT NOT NULL,
          root_call_id TEXT NOT NULL,
          parent_call_id TEXT NOT NULL,
          time REAL NOT NULL,
          body TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS records_agent ON records (agent, seq)",
        "CREATE INDEX IF NOT EXISTS records_call ON records (agent, call_id)",
        "CREATE INDEX IF NOT EXISTS records_root ON records (agent, root_call_id)",
        "CREATE TABLE IF NOT EXISTS spills"
        " (id INTEGER PRIMARY KEY AUTOINCREMENT, content TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS open_calls (
          seq INTEGER PRIMARY KEY,
          agent TEXT NOT NULL,
          kind TEXT NOT NULL,
          call_id TEXT NOT NULL,
          root_call_id TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS open_calls_call ON open_calls (agent, call_id)",
        "CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, at REAL NOT NULL)",
        "DELETE FROM open_calls",
        """INSERT INTO open_calls (seq, agent, kind, call_id, root_call_id)
        SELECT s.seq, s.agent, s.kind, s.call_id, s.root_call_id FROM records s
        WHERE s.kind IN ('tool/call', 'tool/code-dispatch-start') AND NOT EXISTS (
          SELECT 1 FROM records e WHERE e.agent = s.agent AND e.call_id = s.call_id
          AND e.seq > s.seq
          AND e.kind = CASE s.kind WHEN 'tool/call' THEN 'tool/result'
                                   ELSE 'tool/code-dispatch' END)""",
    ),
)

_AGENT_IDS_AND_CATALOG = Migration(
    2,
    "history keyed by stable agent ids (records kept under a name get a new id each); "
    "the durable catalog of presets, agents and restrictions",
    (
        "ALTER TABLE records ADD COLUMN agent_id TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE open_calls ADD COLUMN agent_id TEXT NOT NULL DEFAULT ''",
        # One new id per name the history was kept under: readable by id, and claimed by the
        # agent of that name if the settings declare it again (see catalog_store).
        """CREATE TABLE legacy_agents (
          name TEXT PRIMARY KEY,
          agent_id TEXT NOT NULL UNIQUE
        )""",
        "INSERT INTO legacy_agents (name, agent_id) SELECT agent, lower(hex(randomblob(16)))"
        " FROM (SELECT DISTINCT agent FROM records WHERE agent != '')",
        "UPDATE records SET agent_id ="
        " coalesce((SELECT l.agent_id FROM legacy_agents l WHERE l.name = records.agent), '')",
        "UPDATE open_calls SET agent_id ="
        " coalesce((SELECT l.agent_id FROM legacy_agents l WHERE l.name = open_calls.agent), '')",
        "DROP INDEX records_agent",
        "DROP INDEX records_call",
        "DROP INDEX records_root",
        "DROP INDEX open_calls_call",
        "CREATE INDEX records_agent ON records (agent_id, seq)",
        "CREATE INDEX records_call ON records (agent_id, call_id)",
        "CREATE INDEX records_root ON records (agent_id, root_call_id)",
        "CREATE INDEX open_calls_call ON open_calls (agent_id, call_id)",
        """CREATE TABLE catalog_scopes (
          name TEXT PRIMARY KEY,
          agent_id TEXT NOT NULL,
          preset TEXT NOT NULL,
          mode TEXT,
          language TEXT,
          self_modification INTEGER,
          create_time REAL NOT NULL
        )""",
        """CREATE TABLE catalog_restrictions (
          restriction_id TEXT PRIMARY KEY,
          scope TEXT NOT NULL,
          allow TEXT,
          deny TEXT
        )""",
        "CREATE INDEX catalog_restrictions_scope ON catalog_restrictions (scope)",
    ),
)

_MCP_SERVERS = Migration(
    3,
    "the MCP servers a preset or agent attaches (JSON text, '' for none)",
    ("ALTER TABLE catalog_scopes ADD COLUMN mcp_servers TEXT NOT NULL DEFAULT ''",),
)

_CORDIS_RECORDS = Migration(
    4,
    "Cordis as records: id counters, plugins with pointers and a revision, immutable packages "
    "in define order, package grants (the whole-state snapshot is imported once, then emptied)",
    (
        "CREATE TABLE cordis_ids (kind TEXT PRIMARY KEY, last INTEGER NOT NULL)",
        """CREATE TABLE cordis_plugins (
          plugin_id TEXT PRIMARY KEY,
          owner TEXT NOT NULL,
          owner_id TEXT NOT NULL,
          current_package TEXT,
          next_package TEXT,
          any_version_approved INTEGER NOT NULL,
          revision INTEGER NOT NULL
        )""",
        """CREATE TABLE cordis_packages (
          position INTEGER PRIMARY KEY AUTOINCREMENT,
          plugin_id TEXT NOT NULL,
          package_id TEXT NOT NULL UNIQUE,
          name TEXT NOT NULL,
          purpose TEXT NOT NULL,
          host TEXT,
          client TEXT
        )""",
        "CREATE INDEX cordis_packages_plugin ON cordis_packages (plugin_id)",
        """CREATE TABLE cordis_grants (
          plugin_id TEXT NOT NULL,
          package_id TEXT NOT NULL,
          PRIMARY KEY (plugin_id, package_id)
        )""",
        # Where an older registry kept its whole-state snapshot (`cordis_durable`), so the
        # import finds the table whether or not that registry ever created it.
        "CREATE TABLE IF NOT EXISTS cordis_state"
        " (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL)",
    ),
)

_APPROVALS = Migration(
    5,
    "approvals as records (approvals_in_store): pending until the first answer, an expiry, "
    "an interrupted asker",
    (
        """CREATE TABLE approvals (
          position INTEGER PRIMARY KEY AUTOINCREMENT,
          approval_id TEXT NOT NULL UNIQUE,
          agent TEXT NOT NULL,
          principal TEXT NOT NULL,
          call_id TEXT NOT NULL,
          tool_name TEXT NOT NULL,
          arguments_json TEXT NOT NULL,
          reason TEXT NOT NULL,
          asked_by TEXT NOT NULL,
          asked_at REAL NOT NULL,
          expires_at REAL,
          state TEXT NOT NULL,
          answered_by TEXT NOT NULL,
          answered_at REAL
        )""",
        "CREATE INDEX approvals_pending ON approvals (position) WHERE state = 'pending'",
    ),
)

_HOST_LEASES = Migration(
    6,
    "Cordis host leases: which registry runs a running plugin's host "
    "(domain/cordis/host_leases.py)",
    (
        """CREATE TABLE cordis_host_leases (
          plugin_id TEXT PRIMARY KEY,
          owner TEXT NOT NULL,
          address TEXT NOT NULL,
          epoch INTEGER NOT NULL,
          expires_at REAL NOT NULL
        )""",
    ),
)

_LEASE_PRINCIPALS = Migration(
    7,
    "the principal that activated a leased plugin run: a survivor taking the lease over "
    "reactivates the plugin as it (domain/cordis/host_leases.py)",
    (
        "ALTER TABLE cordis_host_leases ADD COLUMN principal_kind TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE cordis_host_leases ADD COLUMN principal_name TEXT NOT NULL DEFAULT ''",
    ),
)

_ACTIVATIONS = Migration(
    8,
    "pending client-bearing Cordis activations as records (domain/cordis/activation_records.py)",
    (
        """CREATE TABLE cordis_activations (
          position INTEGER PRIMARY KEY AUTOINCREMENT,
          request_id TEXT NOT NULL UNIQUE,
          agent TEXT NOT NULL,
          plugin_id TEXT NOT NULL,
          package_id TEXT NOT NULL,
          run_id TEXT NOT NULL,
          mode TEXT NOT NULL,
          name TEXT NOT NULL,
          purpose TEXT NOT NULL,
          requires_approval INTEGER NOT NULL,
          has_host INTEGER NOT NULL,
          source_host TEXT NOT NULL,
          source_client TEXT NOT NULL,
          source_truncated INTEGER NOT NULL,
          asked_by TEXT NOT NULL,
          asked_at REAL NOT NULL,
          state TEXT NOT NULL,
          approved_by TEXT NOT NULL,
          approve_future INTEGER NOT NULL,
          settled_by TEXT NOT NULL,
          detail TEXT NOT NULL,
          changed_at REAL
        )""",
        "CREATE INDEX cordis_activations_open ON cordis_activations (position)"
        " WHERE state IN ('pending', 'approved', 'hosting', 'host-failed')",
        """CREATE TABLE cordis_pages (
          agent TEXT NOT NULL,
          registry TEXT NOT NULL,
          address TEXT NOT NULL,
          manifest_json TEXT NOT NULL,
          PRIMARY KEY (agent, registry)
        )""",
    ),
)

MIGRATIONS = (
    _HISTORY,
    _AGENT_IDS_AND_CATALOG,
    _MCP_SERVERS,
    _CORDIS_RECORDS,
    _APPROVALS,
    _HOST_LEASES,
    _LEASE_PRINCIPALS,
    _ACTIVATIONS,
)
LATEST = MIGRATIONS[-1].version


def migrate(db: sqlite3.Connection) -> list[int]:
    """Applies the migrations this database lacks, in order; returns their versions."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations"
        " (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    applied = {row[0] for row in db.execute("SELECT version FROM schema_migrations")}
    if not applied:
        # A database from before schema_migrations: `user_version` 1 had the history schema.
        [(user_version,)] = db.execute("PRAGMA user_version").fetchall()
        applied = {m.version for m in MIGRATIONS if m.version <= min(user_version, 1)}
        _record(db, [m for m in MIGRATIONS if m.version in applied])
    done: list[int] = []
    for migration in MIGRATIONS:
        if migration.version in applied:
            continue
        db.execute("BEGIN")
        try:
            for statement in migration.statements:
                db.execute(statement)
            _record(db, [migration])
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        done.append(migration.version)
    return done


def _record(db: sqlite3.Connection, migrations: list[Migration]) -> None:
    db.executemany(
        "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
        [(m.version, m.description, time.time()) for m in migrations],
    )
