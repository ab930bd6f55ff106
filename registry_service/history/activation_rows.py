"""The run request records' rows (domain/cordis/activation_records.py), shared by the SQLite
and the PostgreSQL store: the columns, the statements both databases run alike (written with
`?` placeholders; `pg` turns them into psycopg's), and the mapping between a row and a record.
The conditional update takes its allowed states from `MOVES`, so the rule has one home."""

from __future__ import annotations

from collections.abc import Sequence

from registry_service.domain.cordis.activation_records import (
    MOVES,
    OPEN,
    ActivationRecord,
    ActivationState,
    Move,
)

_INSERTED = (
    "request_id, agent, plugin_id, package_id, run_id, mode, name, purpose,"
    " requires_approval, has_host, source_host, source_client, source_truncated, asked_by,"
    " asked_at, state, approved_by, approve_future, settled_by, detail, changed_at"
)
COLUMNS = f"{_INSERTED}, position"
_WIDEST = max(len(states) for states in MOVES.values())
_OPEN_STATES = ", ".join(f"'{s.value}'" for s in sorted(OPEN, key=lambda s: s.value))

INSERT = (
    f"INSERT INTO cordis_activations ({_INSERTED}) VALUES ({', '.join('?' * 21)})"
    f" ON CONFLICT (request_id) DO NOTHING RETURNING {COLUMNS}"
)
# First answer wins: the record moves only from a state `MOVES` allows for the target (the
# list is padded to one width by repeating its first state).
# A NULL value keeps the stored field (each move writes only its own).
MOVE = (
    "UPDATE cordis_activations SET state = ?, approved_by = COALESCE(?, approved_by),"
    " approve_future = COALESCE(?, approve_future), settled_by = COALESCE(?, settled_by),"
    " detail = COALESCE(?, detail), changed_at = ?"
    f" WHERE request_id = ? AND state IN ({', '.join('?' * _WIDEST)})"
    f" RETURNING {COLUMNS}"
)
OPEN_ROWS = (
    f"SELECT {COLUMNS} FROM cordis_activations WHERE state IN ({_OPEN_STATES})"
    " ORDER BY position LIMIT ?"
)
ONE = f"SELECT {COLUMNS} FROM cordis_activations WHERE request_id = ?"
INTERRUPT = (
    "UPDATE cordis_activations SET state = 'interrupted', settled_by = ?, changed_at = ?"
    f" WHERE state IN ({_OPEN_STATES}) AND asked_by <> ?"
)
PRUNE = (
    "DELETE FROM cordis_activations WHERE position IN (SELECT position FROM cordis_activations"
    f" WHERE state NOT IN ({_OPEN_STATES}) AND changed_at < ? ORDER BY position LIMIT ?)"
)

# Page presence: one row per agent and registry.
DETACH_PAGES = "DELETE FROM cordis_pages WHERE agent = ? AND registry = ?"
PAGES_ELSEWHERE = (
    "SELECT agent, registry, address, manifest_json FROM cordis_pages WHERE registry <> ?"
)
ATTACH_PAGES = (
    "INSERT INTO cordis_pages (agent, registry, address, manifest_json) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (agent, registry) DO UPDATE SET address = excluded.address,"
    " manifest_json = excluded.manifest_json"
)


def pg(statement: str) -> str:
    """`statement` with psycopg's placeholders (none of these statements holds a `%`)."""
    return statement.replace("?", "%s")


def insert_values(record: ActivationRecord) -> tuple[object, ...]:
    return (
        record.request_id,
        record.agent,
        record.plugin_id,
        record.package_id,
        record.run_id,
        record.mode,
        record.name,
        record.purpose,
        record.requires_approval,
        record.has_host,
        record.source_host,
        record.source_client,
        record.source_truncated,
        record.asked_by,
        record.asked_at,
        record.state.value,
        record.approved_by,
        record.approve_future,
        record.settled_by,
        record.detail,
        record.changed_at,
    )


def move_values(request_id: str, move: Move) -> tuple[object, ...]:
    """The values of MOVE for `move` (what the domain's `moved` writes, the rest kept)."""
    approving = move.state is ActivationState.APPROVED
    hosting = move.state in (ActivationState.HOSTING, ActivationState.HOST_FAILED)
    final = not approving and not hosting
    allowed = sorted(MOVES[move.state], key=lambda s: s.value)
    padded = [s.value for s in allowed] + [allowed[0].value] * (_WIDEST - len(allowed))
    return (
        move.state.value,
        move.by if approving else None,
        move.approve_future if approving else None,
        move.by if final else None,
        None if approving else move.detail,
        move.at,
        request_id,
        *padded,
    )


def record_of(row: Sequence[object]) -> ActivationRecord:
    (
        request_id,
        agent,
        plugin_id,
        package_id,
        run_id,
        mode,
        name,
        purpose,
        requires_approval,
        has_host,
        source_host,
        source_client,
        source_truncated,
        asked_by,
        asked_at,
        state,
        approved_by,
        approve_future,
        settled_by,
        detail,
        changed_at,
        position,
    ) = row
    return ActivationRecord(
        str(request_id),
        str(agent),
        str(plugin_id),
        str(package_id),
        str(run_id),
        str(mode),
        str(name),
        str(purpose),
        bool(requires_approval),
        bool(has_host),
        str(source_host),
        str(source_client),
        bool(source_truncated),
        str(asked_by),
        float(str(asked_at)),
        ActivationState(str(state)),
        str(approved_by),
        bool(approve_future),
        str(settled_by),
        str(detail),
        None if changed_at is None else float(str(changed_at)),
        int(str(position)),
    )
