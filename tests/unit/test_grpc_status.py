"""Rich statuses stay small enough for gRPC trailers whatever the error echoes."""

from __future__ import annotations

from codemode_wire.errors import CodemodeError, Status
from codemode_wire.grpc_status import (
    MAX_MESSAGE_BYTES,
    MAX_METADATA_VALUE_BYTES,
    error_info,
    to_status_proto,
)


def test_short_messages_and_metadata_pass_unchanged() -> None:
    error = CodemodeError(
        Status.NOT_FOUND, "AGENT_NOT_FOUND", "agent 'a' does not exist", {"x": "y"}
    )
    status = to_status_proto(error, "codemode.test")
    info = error_info(status)
    assert status.message == error.message
    assert info is not None and dict(info.metadata) == {"x": "y"}
    assert info.reason == "AGENT_NOT_FOUND" and info.domain == "codemode.test"


def test_a_huge_echoed_input_is_shortened_keeping_start_and_end() -> None:
    name = "é" * 10_000  # two bytes each: a cut may fall inside a character
    message = f"agent id {name!r} is invalid: use [a-z0-9-]"
    error = CodemodeError(Status.INVALID_ARGUMENT, "INVALID_RESOURCE_ID", message, {"id": name})
    status = to_status_proto(error, "codemode.test")
    assert len(status.message.encode()) <= MAX_MESSAGE_BYTES
    assert status.message.startswith("agent id 'éé")
    assert status.message.endswith("éé' is invalid: use [a-z0-9-]")
    assert "bytes elided]" in status.message
    info = error_info(status)
    assert info is not None and len(info.metadata["id"].encode()) <= MAX_METADATA_VALUE_BYTES
    assert info.reason == "INVALID_RESOURCE_ID"
