"""History keeps every content block in full: images with their data, and content above the
inline limit spilled (a text preview plus a locator) and readable again with GetRecordContent."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from codemode_client import RegistryClient
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.results import ImageBlock, JsonBlock, TextBlock, ToolResult
from tests.registry.conftest import Harness, blocks_of
from tests.registry.test_scopes import reason_of

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


def _rich(text: str) -> ToolResult:
    return ToolResult(
        content=(
            TextBlock(text),
            ImageBlock("image/png", PNG),
            JsonBlock('{"rows":3}'),
        )
    )


async def _result_record(h: Harness, agent: str, call_id: str) -> Any:
    response = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, call_id=call_id))
    [record] = [r for r in response.records if r.kind == "tool/result"]
    return record


async def test_records_keep_image_data_and_every_block(make_registry: Any) -> None:
    async with make_registry() as h:

        async def picture(invocation: Any) -> ToolResult:
            return _rich("a chart")

        h.registry.register_tool("picture", picture)
        agent = await h.agent("viewer")
        _, result = await h.execute("picture", agent=agent, call_id="p1")
        record = await _result_record(h, agent, "p1")
        expected = [("text", "a chart"), ("image", ("image/png", PNG)), ("json", '{"rows":3}')]
        assert blocks_of(record.content) == expected == blocks_of(result.content)
        assert record.spill_locator == ""
        # Content that was not spilled comes back the same from GetRecordContent.
        full = await h.stub.GetRecordContent(
            rpb.GetRecordContentRequest(agent=agent, seq=record.seq)
        )
        assert blocks_of(full.content) == expected


async def test_large_content_is_spilled_and_read_back_in_full(make_registry: Any) -> None:
    long_text = "line of output\n" * 2000
    async with make_registry(history_max_inline_bytes=4096) as h:

        async def report(invocation: Any) -> ToolResult:
            return _rich(long_text)

        h.registry.register_tool("report", report)
        agent = await h.agent("reader")
        await h.execute("report", agent=agent, call_id="r1")
        record = await _result_record(h, agent, "r1")
        assert record.spill_locator
        [(kind, preview)] = blocks_of(record.content)
        assert kind == "text" and preview.startswith("line of output\n")
        assert len(preview) <= 2048 and "\\n" not in preview  # readable text, not JSON
        full = await h.stub.GetRecordContent(
            rpb.GetRecordContentRequest(agent=agent, seq=record.seq)
        )
        expected = [("text", long_text), ("image", ("image/png", PNG)), ("json", '{"rows":3}')]
        assert blocks_of(full.content) == expected
        async with RegistryClient(h.channel) as client:  # the Python client reads it too
            assert blocks_of(await client.record_content(agent, record.seq)) == expected


async def test_a_spilled_image_is_named_in_the_preview(make_registry: Any) -> None:
    big = PNG * 4  # its base64 is over the smallest inline limit
    async with make_registry(history_max_inline_bytes=256) as h:

        async def picture(invocation: Any) -> ToolResult:
            return ToolResult(content=(ImageBlock("image/png", big),))

        h.registry.register_tool("picture", picture)
        agent = await h.agent("viewer")
        await h.execute("picture", agent=agent, call_id="p1")
        record = await _result_record(h, agent, "p1")
        assert record.spill_locator
        assert blocks_of(record.content) == [("text", f"[image image/png, {len(big)} bytes]")]


@pytest.mark.parametrize("seq", [0, -1, 10_000])
async def test_an_unknown_record_is_not_found(harness: Harness, seq: int) -> None:
    agent = await harness.agent("a")
    request = rpb.GetRecordContentRequest(agent=agent, seq=seq)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.GetRecordContent(request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(caught.value) == "RECORD_NOT_FOUND"


async def test_another_agents_record_is_not_found(harness: Harness) -> None:
    async def tool(invocation: Any) -> Any:
        return 1

    harness.registry.register_tool("t", tool)
    owner, other = await harness.agent("owner"), await harness.agent("other")
    await harness.execute("t", agent=owner, call_id="c1")
    record = await _result_record(harness, owner, "c1")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.GetRecordContent(
            rpb.GetRecordContentRequest(agent=other, seq=record.seq)
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
