"""The one rule of who may call which tool (registry_service/domain/tool_access.py): its table,
the refusal and its audit record, and the view a principal is shown."""

from __future__ import annotations

import json

import pytest

from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.access import AccessPolicy, Grant, Permission
from registry_service.domain.catalog import Catalog
from registry_service.domain.cordis.names import NAMES as CORDIS_TOOLS
from registry_service.domain.records import ACCESS_DENIED, AUDIT_LOG, Record
from registry_service.domain.scopes import Mode
from registry_service.domain.tool_access import CallKind, ToolAuthority, kind_of
from registry_service.domain.tools import RUN_CODE, Invocation, ToolDefinition

EXECUTE_ONLY = Principal("jwt", "erin")
WITH_CORDIS = Principal("jwt", "frank")
POLICY = AccessPolicy(
    [
        Grant(("jwt:erin",), frozenset({Permission.EXECUTE}), ("agents/a",)),
        Grant(("jwt:frank",), frozenset({Permission.EXECUTE, Permission.CORDIS}), ("agents/a",)),
    ],
    enforced=True,
)


async def _body(invocation: Invocation) -> JsonValue:
    return None


def test_the_table() -> None:
    assert kind_of("echo") is CallKind.TOOL
    assert kind_of(RUN_CODE) is CallKind.TOOL
    assert {kind_of(name) for name in CORDIS_TOOLS} == {CallKind.CORDIS}
    authority = ToolAuthority(POLICY)
    erin, frank = (
        authority.access(EXECUTE_ONLY, "agents/a"),
        authority.access(WITH_CORDIS, "agents/a"),
    )
    assert erin.may_call("echo") and not erin.may_call("cordis_define")
    assert frank.may_call("echo") and frank.may_call("cordis_define")
    # A plugin host's calls need cordis; nothing is allowed elsewhere or to nobody.
    assert frank.may(CallKind.HOST) and not erin.may(CallKind.HOST)
    assert not authority.access(WITH_CORDIS, "agents/b").may_call("echo")
    assert not authority.access(ANONYMOUS, "agents/a").may_call("echo")
    # Open (no authentication configured): everyone may call everything.
    open_access = ToolAuthority(AccessPolicy((), enforced=False)).access(ANONYMOUS, "")
    assert open_access.may_call("cordis_define") and open_access.may(CallKind.HOST)


async def test_a_refusal_names_what_is_missing_and_is_audited() -> None:
    written: list[Record] = []

    async def audit(record: Record) -> None:
        written.append(record)

    authority = ToolAuthority(POLICY, audit)
    await authority.authorize(EXECUTE_ONLY, "agents/a", "echo", call_id="c-1", via="direct")
    assert written == []
    with pytest.raises(CodemodeError) as caught:
        await authority.authorize(
            EXECUTE_ONLY, "agents/a", "cordis_run", call_id="", via="run_code", parent_call_id="r"
        )
    assert caught.value.reason == "PERMISSION_DENIED"
    assert caught.value.metadata["permission"] == "cordis"
    (record,) = written
    assert (record.kind, record.agent, record.name) == (ACCESS_DENIED, AUDIT_LOG, "cordis_run")
    assert (record.is_error, record.error_code) == (True, "PERMISSION_DENIED")
    assert json.loads(record.arguments_json) == {
        "principal": "jwt:erin",
        "permission": "cordis",
        "resource": "agents/a",
        "agent": "agents/a",
        "tool": "cordis_run",
        "call_id": "",
        "parent_call_id": "r",
        "via": "run_code",
    }


def test_a_principal_sees_only_what_it_may_call() -> None:
    run_code = ToolDefinition(RUN_CODE, "run", {"type": "object"}, {}, _body)
    catalog = Catalog(Mode.BOTH, run_code, default_self_modification=True)
    catalog.declare_agent("a", "", None)
    catalog.install_cordis_tools(
        [ToolDefinition(n, n, {"type": "object"}, {}, _body) for n in CORDIS_TOOLS]
    )
    catalog.register("", [ToolDefinition("echo", "echo", {"type": "object"}, {}, _body)])
    view = catalog.view("agents/a")
    authority = ToolAuthority(POLICY)
    erin = authority.access(EXECUTE_ONLY, "agents/a").restrict(view)
    frank = authority.access(WITH_CORDIS, "agents/a").restrict(view)
    assert set(erin.visible) == {"echo", RUN_CODE}
    assert not erin.self_modification
    assert frank is view  # holding every permission: the view itself
    assert (
        authority.access(EXECUTE_ONLY, "agents/a").key
        != authority.access(WITH_CORDIS, "agents/a").key
    )
