"""The approval records' rows (domain/approval_records.py), shared by the SQLite and the
PostgreSQL store: the columns, the statements both databases run alike (written with `?`
placeholders; `pg` turns them into psycopg's), and the mapping between a row and a record."""

from __future__ import annotations

from collections.abc import Sequence

from registry_service.domain.approval_records import ANSWERS, ApprovalRecord, ApprovalState

_INSERTED = (
    "approval_id, agent, principal, call_id, tool_name, arguments_json, reason, asked_by,"
    " asked_at, expires_at, state, answered_by, answered_at"
)
COLUMNS = f"{_INSERTED}, position"

INSERT = (
    f"INSERT INTO approvals ({_INSERTED}) VALUES ({', '.join('?' * 13)})"
    f" ON CONFLICT (approval_id) DO NOTHING RETURNING {COLUMNS}"
)
# First answer wins: only a pending record moves, and an answer only before its expiry.
RESOLVE = (
    "UPDATE approvals SET state = ?, answered_by = ?, answered_at = ?"
    " WHERE approval_id = ? AND state = 'pending'"
    " AND (? = 0 OR expires_at IS NULL OR expires_at > ?)"
    f" RETURNING {COLUMNS}"
)
PENDING = (
    f"SELECT {COLUMNS} FROM approvals WHERE state = 'pending' AND position > ?"
    " ORDER BY position LIMIT ?"
)
ONE = f"SELECT {COLUMNS} FROM approvals WHERE approval_id = ?"
INTERRUPT = (
    "UPDATE approvals SET state = 'interrupted', answered_by = ?, answered_at = ?"
    " WHERE state = 'pending' AND asked_by <> ?"
)

# Retention: ended records only (a pending one has no `answered_at`), oldest first, in batches.
PRUNE = (
    "DELETE FROM approvals WHERE position IN (SELECT position FROM approvals"
    " WHERE state <> 'pending' AND answered_at < ? ORDER BY position LIMIT ?)"
)


def pg(statement: str) -> str:
    """`statement` with psycopg's placeholders (none of these statements holds a `%`)."""
    return statement.replace("?", "%s")


def insert_values(record: ApprovalRecord) -> tuple[object, ...]:
    return (
        record.approval_id,
        record.agent,
        record.principal,
        record.call_id,
        record.tool_name,
        record.arguments_json,
        record.reason,
        record.asked_by,
        record.asked_at,
        record.expires_at,
        record.state.value,
        record.answered_by,
        record.answered_at,
    )


def resolve_values(
    approval_id: str, state: ApprovalState, by: str, at: float
) -> tuple[object, ...]:
    if state is ApprovalState.PENDING:
        raise ValueError("an approval is resolved to a final state, not pending")
    answer = int(state in ANSWERS)
    return (state.value, by, at, approval_id, answer, at)


def record_of(row: Sequence[object]) -> ApprovalRecord:
    (
        approval_id,
        agent,
        principal,
        call_id,
        tool_name,
        arguments_json,
        reason,
        asked_by,
        asked_at,
        expires_at,
        state,
        answered_by,
        answered_at,
        position,
    ) = row
    return ApprovalRecord(
        str(approval_id),
        str(agent),
        str(principal),
        str(call_id),
        str(tool_name),
        str(arguments_json),
        str(reason),
        str(asked_by),
        float(str(asked_at)),
        None if expires_at is None else float(str(expires_at)),
        ApprovalState(str(state)),
        str(answered_by),
        None if answered_at is None else float(str(answered_at)),
        int(str(position)),
    )
