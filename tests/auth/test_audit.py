"""Administrative changes are recorded in the audit log (the global scope's history, read with
ListHistory for the empty agent) with the principal who made them; refused changes are not."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from tests.auth.conftest import AuthRegistry
from tests.registry.conftest import Harness


async def _audit_log(stub: Any, metadata: Any) -> list[tuple[str, str, str]]:
    page = await stub.ListHistory(rpb.ListHistoryRequest(agent=""), metadata=metadata, timeout=10)
    out = []
    for record in page.records:
        assert record.kind == "admin/audit"
        details = json.loads(record.arguments_json)
        out.append((record.tool_name, details["principal"], details["resource"]))
    return out


async def test_changes_are_audited_with_their_principal(
    auth_registry: AuthRegistry, principals: dict[str, Any]
) -> None:
    admin, admin_md = principals["admin"]
    alice, alice_md = principals["alice"]
    with pytest.raises(grpc.aio.AioRpcError):  # refused: no audit record
        await alice.AddRestriction(
            rpb.AddRestrictionRequest(scope="agents/alice", deny=["echo"]), metadata=alice_md
        )
    await admin.AddRestriction(
        rpb.AddRestrictionRequest(scope="agents/alice", deny=["echo"]), metadata=admin_md
    )
    await admin.CreateAgent(rpb.CreateAgentRequest(agent_id="dave"), metadata=admin_md)
    await admin.SetPresentationMode(
        rpb.SetPresentationModeRequest(scope="agents/dave", mode=scope_pb2.PRESENTATION_MODE_CODE),
        metadata=admin_md,
    )
    await admin.DeleteAgent(rpb.DeleteAgentRequest(name="agents/carol"), metadata=admin_md)
    who = "cert:spiffe://codemode/admin"
    assert await _audit_log(admin, admin_md) == [
        ("AddRestriction", who, "agents/alice"),
        ("CreateAgent", who, "agents/dave"),
        ("SetPresentationMode", who, "agents/dave"),
        ("DeleteAgent", who, "agents/carol"),
    ]
    # The audit log is the managers' to read, not an agent's.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _audit_log(alice, alice_md)
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED


async def test_the_open_default_audits_the_anonymous_principal(harness: Harness) -> None:
    await harness.stub.CreatePreset(rpb.CreatePresetRequest(preset_id="p"))
    await harness.stub.DeletePreset(rpb.DeletePresetRequest(name="presets/p"))
    assert await _audit_log(harness.stub, ()) == [
        ("CreatePreset", "anonymous", "presets/p"),
        ("DeletePreset", "anonymous", "presets/p"),
    ]
