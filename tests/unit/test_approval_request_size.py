"""The size the approval broker compares with an approver's receive limit is exactly what
protobuf encodes, though it is computed without encoding the (possibly huge) arguments."""

from __future__ import annotations

import pytest

from registry_service.convert import approval_request_bytes, approver_message
from registry_service.domain.approvals import ApprovalRequest


@pytest.mark.parametrize(
    "arguments",
    ["", "{}", '{"path":"/etc/cron.d/x"}', '"é"' * 50, "x" * 127, "x" * 128, "x" * 16_383,
     "x" * 16_384, '{"b":"' + "é" * (3 << 20) + '"}'],
)  # fmt: skip
def test_the_computed_size_is_the_encoded_size(arguments: str) -> None:
    request = ApprovalRequest("approval-7", "call-1", "agents/a", "write_file", arguments, "why")
    assert approval_request_bytes(request) == approver_message(request).ByteSize()
