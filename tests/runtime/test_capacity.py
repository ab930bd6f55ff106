"""A runtime with no sandbox free (every uid of its range held by a live worker) refuses the
run or plugin host it cannot start: RESOURCE_EXHAUSTED with ErrorInfo `RUNTIME_AT_CAPACITY` and
RetryInfo, nothing ran; never a `worker-exit` terminal that reads as the program's failure.
Through the real RuntimeService on loopback, with a runtime of one sandbox."""

from __future__ import annotations

import asyncio

import grpc
from grpc_status import rpc_status

from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.grpc_status import error_info, retry_delay
from runtime_service.sandbox_uids import UidLeases
from tests.runtime.conftest import connected, drive, grpc_settings, serving, start_message

# A range no other test uses: with one uid, one live worker is the whole capacity.
UID_BASE = 63_710
DELAY_S = 2.5


def _refused_for_capacity(error: grpc.aio.AioRpcError) -> None:
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
    status = rpc_status.from_call(error)
    assert status is not None
    info = error_info(status)
    assert info is not None and info.reason == "RUNTIME_AT_CAPACITY", info
    assert info.domain == "codemode.runtime"
    assert retry_delay(status) == DELAY_S
    assert "nothing ran" in error.details()


async def test_a_full_runtime_refuses_runs_and_hosts_with_retry_info() -> None:
    settings = grpc_settings(
        pool_size=0,
        worker_uid_base=UID_BASE,
        worker_uid_count=1,
        capacity_retry_delay_s=DELAY_S,
    )
    async with serving(settings) as running, connected(running) as stub:
        # The one sandbox: a run waiting on a binding call that is answered only at the end.
        holder = stub.Run()
        await holder.write(start_message("return await tools.wait({})", "wait"))
        first = await holder.read()
        assert first.WhichOneof("kind") == "binding_call", first

        second = stub.Run()
        await second.write(start_message("return 1"))
        try:
            async for message in second:
                assert message.WhichOneof("kind") != "terminal", message.terminal
            raise AssertionError("a run without a sandbox ended OK")
        except grpc.aio.AioRpcError as error:
            _refused_for_capacity(error)

        host = stub.Host()
        source = "async def apply(ctx):\n    pass\n\nreturn apply\n"
        await host.write(pb.HostRequest(start=pb.HostStart(source=source, plugin_id="p-1")))
        try:
            async for message in host:
                raise AssertionError(f"a plugin host without a sandbox said {message}")
        except grpc.aio.AioRpcError as error:
            _refused_for_capacity(error)

        # The sandbox comes back when its run ends: the same request then runs.
        call_id = first.binding_call.call_id
        answer = pb.CallResult(call_id=call_id, value_json="7")
        await holder.write(pb.RunRequest(call_result=answer))
        while (message := await holder.read()) is not grpc.aio.EOF:
            if message.WhichOneof("kind") == "terminal":
                assert message.terminal.success.value_json == "7"
                await holder.done_writing()
        assert await holder.code() is grpc.StatusCode.OK
        # Its uid is free once every process of the run is reaped (just after the terminal).
        for _ in range(1000):
            if UID_BASE not in UidLeases.leased():
                break
            await asyncio.sleep(0.01)
        _, terminal = await drive(stub, start_message("return 1"))
        assert terminal.success.value_json == "1"
