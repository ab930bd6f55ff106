"""The PostgreSQL schema, as numbered migrations kept here and applied at start.

`codemode_schema_versions` records what was applied. Migrations only ever add (a new number
for each change, never an edit of an applied one); a database whose version is newer than this
code knows is refused rather than written with an older layout. Two registries starting at once
serialize on an advisory lock, so each migration runs once."""

from __future__ import annotations

import psycopg

# pg_advisory_lock key: "codemode" in ASCII, so other users of the database are not hit.
_LOCK_KEY = 0x636F64656D6F6465

_VERSIONS = """
CREATE TABLE IF NOT EXISTS codemode_schema_versions (
  version integer PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
)
"""

# Version -> SQL. Records are keyed by (agent_id, seq), the agent's stable identity (its name,
# `agent`, is only carried): seq comes from the agent id's counter row in
# history_agents, taken in the writing transaction, so several registries never hand out the
# same seq and commit in seq order per agent (the row lock is held to the commit).
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
CREATE TABLE history_agents (
  agent_id text PRIMARY KEY,
  last_seq bigint NOT NULL
);
CREATE TABLE history_spills (
  id bigserial PRIMARY KEY,
  content text NOT NULL
);
CREATE TABLE history_records (
  agent_id text NOT NULL,
  seq bigint NOT NULL,
  agent text NOT NULL,
  kind text NOT NULL,
  call_id text NOT NULL,
  root_call_id text NOT NULL,
  parent_call_id text NOT NULL,
  time double precision NOT NULL,
  name text NOT NULL,
  arguments_json text NOT NULL,
  content_json text NOT NULL,
  is_error boolean NOT NULL,
  error_code text NOT NULL,
  spill_id bigint,
  PRIMARY KEY (agent_id, seq)
);
CREATE INDEX history_records_call ON history_records (agent_id, call_id);
CREATE INDEX history_records_root ON history_records (agent_id, root_call_id);
-- A registry process writing to this database; its lease is renewed while it lives. The calls
-- it left open are closed (as interrupted) only once its lease expired or it closed.
CREATE TABLE history_writers (
  id text PRIMARY KEY,
  started_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL
);
CREATE TABLE history_open_calls (
  id bigserial PRIMARY KEY,
  agent_id text NOT NULL,
  seq bigint NOT NULL,
  kind text NOT NULL,
  call_id text NOT NULL,
  root_call_id text NOT NULL,
  writer text NOT NULL
);
CREATE INDEX history_open_calls_call ON history_open_calls (agent_id, call_id);
CREATE INDEX history_open_calls_writer ON history_open_calls (writer);
CREATE TABLE cordis_state (
  id integer PRIMARY KEY CHECK (id = 1),
  body text NOT NULL
);
""",
    ),
    (
        2,
        """
-- The durable catalog: presets and agents declared over the API, and their restrictions
-- (tools are not stored: they come back with their providers' streams).
CREATE TABLE catalog_scopes (
  name text PRIMARY KEY,
  agent_id text NOT NULL,
  preset text NOT NULL,
  mode text,
  language text,
  self_modification boolean,
  create_time double precision NOT NULL
);
CREATE TABLE catalog_restrictions (
  restriction_id text PRIMARY KEY,
  scope text NOT NULL,
  allow jsonb,
  deny jsonb
);
CREATE INDEX catalog_restrictions_scope ON catalog_restrictions (scope);
""",
    ),
    (
        3,
        """
-- The MCP servers a preset or agent attaches (JSON text, '' for none).
ALTER TABLE catalog_scopes ADD COLUMN mcp_servers text NOT NULL DEFAULT '';
""",
    ),
    (
        4,
        """
-- Cordis as records (domain/cordis/state.py): the id counters, plugins with their pointers
-- and a revision (a pointer write names the revision it read), immutable packages in define
-- order, and package grants. `cordis_state` (one whole snapshot) is read once, by the first
-- registry that starts, and emptied.
CREATE TABLE cordis_ids (
  kind text PRIMARY KEY,
  last bigint NOT NULL
);
CREATE TABLE cordis_plugins (
  plugin_id text PRIMARY KEY,
  owner text NOT NULL,
  owner_id text NOT NULL,
  current_package text,
  next_package text,
  any_version_approved boolean NOT NULL,
  revision bigint NOT NULL
);
CREATE TABLE cordis_packages (
  position bigserial PRIMARY KEY,
  plugin_id text NOT NULL,
  package_id text NOT NULL UNIQUE,
  name text NOT NULL,
  purpose text NOT NULL,
  host text,
  client text
);
CREATE INDEX cordis_packages_plugin ON cordis_packages (plugin_id);
CREATE TABLE cordis_grants (
  plugin_id text NOT NULL,
  package_id text NOT NULL,
  PRIMARY KEY (plugin_id, package_id)
);
""",
    ),
    (
        5,
        """
-- Approvals as records (domain/approval_records.py, `approvals_in_store`): every registry on
-- the database sees a pending one and the first answer wins (a conditional update on
-- `state`); `asked_by` is the asking registry's history writer, whose lease tells whether it
-- still waits.
CREATE TABLE approvals (
  position bigserial PRIMARY KEY,
  approval_id text NOT NULL UNIQUE,
  agent text NOT NULL,
  principal text NOT NULL,
  call_id text NOT NULL,
  tool_name text NOT NULL,
  arguments_json text NOT NULL,
  reason text NOT NULL,
  asked_by text NOT NULL,
  asked_at double precision NOT NULL,
  expires_at double precision,
  state text NOT NULL,
  answered_by text NOT NULL,
  answered_at double precision
);
CREATE INDEX approvals_pending ON approvals (position) WHERE state = 'pending';
""",
    ),
    (
        6,
        """
-- Cordis host leases (domain/cordis/host_leases.py): the registry that runs a running
-- plugin's host, where its peer service answers, until when (by this database's clock), and
-- a fencing epoch raised on every change of hands.
CREATE TABLE cordis_host_leases (
  plugin_id text PRIMARY KEY,
  owner text NOT NULL,
  address text NOT NULL,
  epoch bigint NOT NULL,
  expires_at timestamptz NOT NULL
);
""",
    ),
    (
        7,
        """
-- The principal that activated a leased plugin run (domain/cordis/host_leases.py): a survivor
-- taking the lease over reactivates the plugin as it. '' (a lease from before): anonymous.
ALTER TABLE cordis_host_leases ADD COLUMN principal_kind text NOT NULL DEFAULT '';
ALTER TABLE cordis_host_leases ADD COLUMN principal_name text NOT NULL DEFAULT '';
""",
    ),
    (
        8,
        """
-- Pending client-bearing Cordis activations (domain/cordis/activation_records.py): every
-- registry on the database shows an open one to its pages and the first answer wins (a
-- conditional update on `state`); `asked_by` is the asking registry's history writer, whose
-- lease tells whether it still holds the attempt.
CREATE TABLE cordis_activations (
  position bigserial PRIMARY KEY,
  request_id text NOT NULL UNIQUE,
  agent text NOT NULL,
  plugin_id text NOT NULL,
  package_id text NOT NULL,
  run_id text NOT NULL,
  mode text NOT NULL,
  name text NOT NULL,
  purpose text NOT NULL,
  requires_approval boolean NOT NULL,
  has_host boolean NOT NULL,
  source_host text NOT NULL,
  source_client text NOT NULL,
  source_truncated boolean NOT NULL,
  asked_by text NOT NULL,
  asked_at double precision NOT NULL,
  state text NOT NULL,
  approved_by text NOT NULL,
  approve_future boolean NOT NULL,
  settled_by text NOT NULL,
  detail text NOT NULL,
  changed_at double precision
);
CREATE INDEX cordis_activations_open ON cordis_activations (position)
  WHERE state IN ('pending', 'approved', 'hosting', 'host-failed');
-- Which registry has page runners of an agent attached (and their client inspect manifest,
-- and where its peer channel answers): client-half calls of programs elsewhere go there.
CREATE TABLE cordis_pages (
  agent text NOT NULL,
  registry text NOT NULL,
  address text NOT NULL,
  manifest_json text NOT NULL,
  PRIMARY KEY (agent, registry)
);
""",
    ),
)
LATEST = MIGRATIONS[-1][0]


class SchemaTooNew(Exception):
    """The database was migrated by a newer version of the registry."""


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """Applies the migrations this database lacks, each in its own transaction, under the
    advisory lock; returns the version it is at. `conn` is in autocommit mode."""
    conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        conn.execute(_VERSIONS)
        rows = conn.execute("SELECT version FROM codemode_schema_versions").fetchall()
        applied = {int(str(version)) for (version,) in rows}
        if applied and max(applied) > LATEST:
            raise SchemaTooNew(
                f"the database schema is at version {max(applied)}, newer than this registry's "
                f"{LATEST}: upgrade the registry"
            )
        for version, sql in MIGRATIONS:
            if version in applied:
                continue
            with conn.transaction():
                conn.execute(sql.encode())
                conn.execute(
                    "INSERT INTO codemode_schema_versions (version) VALUES (%s)", (version,)
                )
        return LATEST
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
