"""Page runners under authorization: attaching needs `cordis`, and only for the agents the
principal holds it on (the stream's `open` names the agent)."""

from __future__ import annotations

from typing import Any

import grpc

from codemode_wire.api.registry.v1 import page_runner_pb2 as pages
from codemode_wire.api.registry.v1 import page_runner_pb2_grpc
from tests.auth.conftest import ALICE_TOKEN, AuthRegistry, Signer


async def attach(registry: AuthRegistry, agent: str, **who: str) -> Any:
    registry.stub(**who)  # opens the principal's channel
    stub = page_runner_pb2_grpc.PageRunnerServiceStub(registry._channels[-1])
    bearer = who.get("bearer")
    metadata = () if bearer is None else (("authorization", f"Bearer {bearer}"),)
    call = stub.Attach(metadata=metadata)
    try:
        # A refusal at the stream's start may end the call before this write is done: the
        # write then raises the status itself.
        await call.write(pages.AttachRequest(open=pages.AttachOpen(agent=agent, page_name="test")))
        first = await call.read()
    except grpc.aio.AioRpcError as error:
        return error.code()
    finally:
        call.cancel()
    return first.WhichOneof("message")


async def test_a_page_attaches_only_for_agents_its_principal_may_run_plugins_of(
    auth_registry: AuthRegistry, signer: Signer
) -> None:
    carol = signer.token("carol")
    assert await attach(auth_registry, "agents/carol", bearer=carol) == "attached"
    # Its grant does not cover another agent: refused at `open`, nothing attached.
    assert await attach(auth_registry, "agents/alice", bearer=carol) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    # Execute/approve/register on an agent is not cordis: refused at the stream's start.
    assert await attach(auth_registry, "agents/alice", bearer=ALICE_TOKEN) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert await attach(auth_registry, "agents/carol") == grpc.StatusCode.UNAUTHENTICATED
