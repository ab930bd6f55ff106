"""Principal × RPC × scope → allowed or denied, through real gRPC with real certificates, a
static token and JWTs (tests/auth/conftest.py). A denial is PERMISSION_DENIED with ErrorInfo
naming the permission and the resource, and changes nothing; missing or bad credentials are
UNAUTHENTICATED."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from codemode_wire.api.registry.v1 import page_runner_pb2, scope_pb2
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.rpc_access import RULES
from tests.auth.conftest import ALICE_TOKEN, AUDIENCE, AuthRegistry, Signer
from tests.registry.conftest import error_info_of

STREAMING_OUT = {"ExecuteToolCall", "WatchHistory"}
DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def request_for(rpc: str, resource: str) -> Message:
    scope = "" if resource == "global" else resource
    match rpc:
        case "ExecuteToolCall":
            return rpb.ExecuteToolCallRequest(
                agent=scope,
                call_id="m-1",
                tool_name="echo",
                arguments_json="{}",
                progress_events=rpb.PROGRESS_EVENTS_NONE,
            )
        case "ListHistory":
            return rpb.ListHistoryRequest(agent=scope)
        case "WatchHistory":
            return rpb.WatchHistoryRequest(agent=scope)
        case "GetRecordContent":
            return rpb.GetRecordContentRequest(agent=scope, seq=1)
        case "ResolvePluginReferences":
            return rpb.ResolvePluginReferencesRequest(agent=scope, text="hello")
        case "GetSystemPrompt":
            return ppb.GetSystemPromptRequest(scope=scope)
        case "ListVisibleTools":
            return rpb.ListVisibleToolsRequest(scope=scope)
        case "AddRestriction":
            return rpb.AddRestrictionRequest(scope=scope, deny=["echo"])
        case "SetPresentationMode":
            return rpb.SetPresentationModeRequest(
                scope=scope, mode=scope_pb2.PRESENTATION_MODE_CODE
            )
        case "DeleteAgent":
            return rpb.DeleteAgentRequest(name=scope)
        case "GetAgent":
            return rpb.GetAgentRequest(name=scope)
        case "CreateAgent":
            return rpb.CreateAgentRequest(agent_id=scope.removeprefix("agents/"))
        case "ListAgents":
            return rpb.ListAgentsRequest()
    raise AssertionError(rpc)


async def invoke(
    stub: Any, metadata: Any, rpc: str, request: Message
) -> tuple[grpc.StatusCode, grpc.aio.AioRpcError | None]:
    method = getattr(stub, rpc)
    try:
        if rpc in STREAMING_OUT:
            # An admitted watch waits for records: its deadline passing shows it was admitted.
            async for _ in method(request, metadata=metadata, timeout=3):
                pass
        else:
            await method(request, metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as error:
        return error.code(), error
    return grpc.StatusCode.OK, None


async def snapshot(auth: AuthRegistry) -> Any:
    """What a denied call must not have changed: agents, their tools, modes, history."""
    registry = auth.running.registry
    catalog = registry.catalog
    agents = [a.name for a in catalog.list_agents(1000, "")[0]]
    return (
        agents,
        {a: sorted(catalog.view(a).visible) for a in agents},
        {a: catalog.declared_mode(a) for a in agents},
        {a: len(await registry.history.list(a, after_seq=0, limit=100)) for a in agents},
    )


MATRIX: list[tuple[str, str, str, bool]] = [
    # Tool calls as an agent: only that agent's principal.
    ("alice", "ExecuteToolCall", "agents/alice", True),
    ("alice", "ExecuteToolCall", "agents/bob", False),
    ("alice", "ExecuteToolCall", "global", False),
    ("bob", "ExecuteToolCall", "agents/bob", True),
    ("bob", "ExecuteToolCall", "agents/alice", False),
    ("admin", "ExecuteToolCall", "agents/alice", False),
    ("provider", "ExecuteToolCall", "agents/alice", False),
    # History, prompts, tool lists: no cross-agent reads.
    ("alice", "ListHistory", "agents/alice", True),
    ("alice", "ListHistory", "agents/bob", False),
    ("bob", "ListHistory", "agents/alice", False),
    ("alice", "WatchHistory", "agents/alice", True),
    ("alice", "WatchHistory", "agents/bob", False),
    ("alice", "GetRecordContent", "agents/alice", True),
    ("alice", "GetRecordContent", "agents/bob", False),
    ("alice", "GetSystemPrompt", "agents/alice", True),
    ("alice", "GetSystemPrompt", "agents/bob", False),
    ("alice", "ListVisibleTools", "agents/carol", False),
    ("alice", "GetAgent", "agents/alice", True),
    ("alice", "GetAgent", "agents/bob", False),
    ("alice", "ResolvePluginReferences", "agents/alice", False),  # no cordis grant
    # Administration: only the manager.
    ("alice", "AddRestriction", "agents/alice", False),
    ("admin", "AddRestriction", "agents/alice", True),
    ("bob", "SetPresentationMode", "agents/bob", False),
    ("admin", "SetPresentationMode", "agents/bob", True),
    ("alice", "DeleteAgent", "agents/alice", False),
    ("bob", "DeleteAgent", "agents/alice", False),
    ("admin", "DeleteAgent", "agents/carol", True),
    ("alice", "CreateAgent", "agents/new-one", False),
    ("admin", "CreateAgent", "agents/new-one", True),
    ("alice", "ListAgents", "agents/*", False),
    ("admin", "ListAgents", "agents/*", True),
]


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: "-".join(map(str, c)))
async def test_matrix(
    auth_registry: AuthRegistry, principals: dict[str, Any], case: tuple[str, str, str, bool]
) -> None:
    who, rpc, resource, allowed = case
    stub, metadata = principals[who]
    before = await snapshot(auth_registry)
    code, error = await invoke(stub, metadata, rpc, request_for(rpc, resource))
    if allowed:
        assert code not in DENIED, error
        return
    assert code is grpc.StatusCode.PERMISSION_DENIED, error
    assert error is not None
    info = error_info_of(error)
    assert info is not None
    assert (info.reason, info.domain) == ("PERMISSION_DENIED", "codemode.registry")
    assert info.metadata["resource"] == resource
    assert info.metadata["permission"] == RULES[rpc].permissions[0].value
    assert await snapshot(auth_registry) == before


def test_every_registry_method_has_a_rule() -> None:
    registry = rpb.DESCRIPTOR.services_by_name["RegistryService"]
    pages = page_runner_pb2.DESCRIPTOR.services_by_name["PageRunnerService"]
    methods = [m.name for m in [*registry.methods, *pages.methods]]
    assert len(set(methods)) == len(methods)  # the table is keyed by method name alone
    assert sorted(methods) == sorted(RULES)


@pytest.mark.parametrize(
    "rpc", ["ExecuteToolCall", "ListHistory", "GetSystemPrompt", "ListAgents", "DeleteAgent"]
)
async def test_no_credentials_is_unauthenticated(
    auth_registry: AuthRegistry, principals: dict[str, Any], rpc: str
) -> None:
    stub, metadata = principals["nobody"]  # a certificate the CA signed, naming no one
    before = await snapshot(auth_registry)
    code, error = await invoke(stub, metadata, rpc, request_for(rpc, "agents/alice"))
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert error is not None
    info = error_info_of(error)
    assert info is not None and info.reason == "CREDENTIALS_REQUIRED"
    assert await snapshot(auth_registry) == before


def _bad_tokens(signer: Signer) -> dict[str, str]:
    now = int(time.time())
    forger = Signer(kid=signer.kid)  # same kid, another key
    unsigned = signer.token("bob").rsplit(".", 1)[0] + "."
    return {
        "unknown static token": ALICE_TOKEN + "x",
        "empty": "",
        "expired": signer.token("bob", exp=now - 3600, iat=now - 7200),
        "wrong audience": signer.token("bob", aud=AUDIENCE + "-other"),
        "wrong issuer": signer.token("bob", iss="https://evil.test"),
        "forged signature": forger.token("bob"),
        "unknown key id": Signer(kid="k2").token("bob"),
        "no signature": unsigned,
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown static token",
        "empty",
        "expired",
        "wrong audience",
        "wrong issuer",
        "forged signature",
        "unknown key id",
        "no signature",
    ],
)
async def test_bad_bearer_tokens_are_unauthenticated(
    auth_registry: AuthRegistry, signer: Signer, case: str
) -> None:
    # Even beside a certificate that names a principal: a token that is sent must verify.
    stub, metadata = auth_registry.stub(
        cert="spiffe://codemode/admin", bearer=_bad_tokens(signer)[case]
    )
    code, error = await invoke(stub, metadata, "ListAgents", request_for("ListAgents", ""))
    assert code is grpc.StatusCode.UNAUTHENTICATED, error
    assert error is not None
    info = error_info_of(error)
    assert info is not None and info.reason == "INVALID_CREDENTIALS"
