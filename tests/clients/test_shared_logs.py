"""A run_code result's logs travel once (`ToolResult.shared_logs`), over real gRPC: a registry
with a small `max_message_bytes`, a real runtime, the Python client and raw stubs.

What the model is shown and the value a caller gets are the same as in the whole form; only the
wire carries the logs once, so output up to about the whole limit (not half of it) arrives."""

from __future__ import annotations

from typing import Any

import pytest

from codemode_client import RegistryClient
from codemode_wire import jsonvalue, shared_logs
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service import convert
from registry_service.codemode.bridge import render_output
from registry_service.domain.results import TextBlock
from registry_service.runtime_client import payload_limit
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from tests.codemode.conftest import Stack

MESSAGE_BYTES = 64 * 1024
LIMIT = payload_limit(MESSAGE_BYTES)
# ~60% of the limit: fits once, not twice.
LINES: list[JsonValue] = [
    f"line {i:04d} " + "é" * 40 for i in range(int(MESSAGE_BYTES * 0.6) // 90)
]
PROGRAM = (
    f"for i in range({len(LINES)}):\n    print(f'line {{i:04d}} ' + 'é' * 40)\n"
    "return {'n': 1, 'big': 2**70}"
)


async def _raw(stack: Stack, agent: str, code: str, call_id: str, *, share: bool) -> Any:
    request = rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id=call_id,
        tool_name="run_code",
        arguments_json=jsonvalue.dumps({"code": code, "description": "print a lot"}),
        progress_events=rpb.PROGRESS_EVENTS_NONE,
        share_logs=share,
    )
    events = [e async for e in stack.stub.ExecuteToolCall(request)]
    return events[-1].result


async def test_output_over_half_the_limit_arrives_once_and_whole(make_stack: Any) -> None:
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:
        agent = await stack.code_agent()
        expected_value: dict[str, JsonValue] = {"logs": LINES, "result": {"n": 1, "big": 2**70}}
        assert len(jsonvalue.dumps(LINES).encode()) > 0.55 * MESSAGE_BYTES
        assert len(jsonvalue.dumps(LINES).encode()) < payload_limit(MESSAGE_BYTES)

        # Whole (a request that did not ask to share): the logs twice are over the limit.
        whole = await _raw(stack, agent, PROGRAM, "whole", share=False)
        assert whole.is_error and whole.error.code == "RESULT_TOO_LARGE", whole.error.message
        assert not whole.shared_logs

        # Shared on the wire: the logs once, out of the value and out of the text.
        wire = await _raw(stack, agent, PROGRAM, "wire", share=True)
        assert not wire.is_error, wire.error.message
        assert list(wire.shared_logs) == LINES
        assert jsonvalue.loads(wire.value_json) == {"result": {"n": 1, "big": 2**70}}
        # ... and the result once, in the value (the text is restored from it).
        assert wire.shared_result and wire.content[0].text.text == ""
        assert wire.ByteSize() < MESSAGE_BYTES
        print(f"run_code result with shared logs: {wire.ByteSize()} bytes ({whole.error.message})")

        # The client restores it: the value and the model's text as the whole form has them.
        async with RegistryClient(stack.running.address) as client:
            result = await client.run_code(PROGRAM, "print a lot", agent=agent, call_id="c")
        assert not result.is_error, result.error_message
        assert result.value == expected_value
        assert result.text == render_output(expected_value)
        assert result.raw is not None and not result.raw.shared_logs
        assert [b.text.text for b in result.raw.content] == [render_output(expected_value)]
        assert result.raw.value_json == jsonvalue.dumps(expected_value)


async def test_restored_results_equal_the_whole_ones_byte_for_byte(make_stack: Any) -> None:
    programs = {
        "logs and result": "print('a')\nprint('b\\nc')\nreturn [1, 'x']",
        "logs only": "print('only')",
        "result only": "return 'text'",
        "empty line logged": "print('')",
        "logs and None": "print('x')\nreturn None",
        "trailing newline in the result": "print('x')\nreturn 'y\\n'",
        "nothing": "pass",
        "a string result alone": "return 'only the result'",
        "logs and an object": "print('a')\nreturn {'f': 1.0, 'e': 1e16, 'big': -2**70, 'u': 'é😀'}",
        "an object alone": "return {'k': [[[[[[1, {'d': 0.5}]]]]]], 'empty': [], 'o': {}}",
        "an empty container": "return []",
        "a number": "print('a')\nreturn 0.1",
        "a failure with output": "print('a')\nprint('b')\nraise ValueError('boom')",
        "a failure without output": "raise ValueError('boom')",
    }
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:
        agent = await stack.code_agent()
        for i, (name, code) in enumerate(programs.items()):
            whole = await _raw(stack, agent, code, f"w{i}", share=False)
            wire = await _raw(stack, agent, code, f"s{i}", share=True)
            assert whole.is_error == ("failure" in name), (name, whole.error.message)
            restored = tool_pb2.ToolResult()
            restored.CopyFrom(wire)
            shared_logs.restore(restored)
            assert restored == whole, name


async def test_a_string_result_over_half_the_limit_travels_once_and_arrives(
    make_stack: Any,
) -> None:
    # It was in the value and, as it is, in the text: twice over the limit, RESULT_TOO_LARGE.
    size = int(MESSAGE_BYTES * 0.6)
    code = f"print('a')\nreturn 'r' * {size}"
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:
        agent = await stack.code_agent()
        wire = await _raw(stack, agent, code, "wire", share=True)
        assert not wire.is_error, wire.error.message
        assert wire.shared_result and wire.content[0].text.text == ""
        async with RegistryClient(stack.running.address) as client:
            result = await client.run_code(code, "a big string", agent=agent)
        assert not result.is_error, result.error_message
        assert result.value == {"logs": ["a"], "result": "r" * size}
        assert result.text == "a\n" + "r" * size
        assert result.raw is not None and not result.raw.shared_result


# ~60% of the limit as `value_json` (393 entries of 100 bytes); its pretty text is ~1.8 times
# that: whole (value and text) over the limit, once well under it.
BIG_DICT = (
    "return {'k%05d' % i: {'f': i + 0.5, 'big': 2**70 + i, 's': 'é' * 8, "
    f"'deep': [[[[[[i, 1.0]]]]]]}} for i in range({int(MESSAGE_BYTES * 0.6) // 100})}}"
)


async def test_an_object_result_over_half_the_limit_travels_once_and_arrives(
    make_stack: Any,
) -> None:
    # It was in the value and, as pretty JSON, in the text: RESULT_TOO_LARGE.
    result_value: dict[str, JsonValue] = {
        f"k{i:05d}": {"f": i + 0.5, "big": 2**70 + i, "s": "é" * 8, "deep": [[[[[[i, 1.0]]]]]]}
        for i in range(int(MESSAGE_BYTES * 0.6) // 100)
    }
    expected: dict[str, JsonValue] = {"logs": ["a"], "result": result_value}
    code = "print('a')\n" + BIG_DICT
    assert len(jsonvalue.dumps(result_value).encode()) > 0.59 * MESSAGE_BYTES
    # The whole form, as the registry would send it (were it not over the limit).
    whole = tool_pb2.ToolResult(
        value_json=jsonvalue.dumps(expected),
        content=[tool_pb2.ContentBlock(text=tool_pb2.TextContent(text=render_output(expected)))],
    )
    assert whole.ByteSize() > MESSAGE_BYTES
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:
        agent = await stack.code_agent()
        refused = await _raw(stack, agent, code, "whole", share=False)
        assert refused.is_error and refused.error.code == "RESULT_TOO_LARGE"
        wire = await _raw(stack, agent, code, "wire", share=True)
        assert not wire.is_error, wire.error.message
        assert wire.shared_result and list(wire.shared_logs) == ["a"]
        assert wire.content[0].text.text == ""
        assert wire.value_json == jsonvalue.dumps({"result": result_value})
        print(f"object result shared: {wire.ByteSize()} bytes, whole {whole.ByteSize()}")
        restored = tool_pb2.ToolResult()
        restored.CopyFrom(wire)
        shared_logs.restore(restored)
        assert restored.SerializeToString() == whole.SerializeToString()
        async with RegistryClient(stack.running.address) as client:
            result = await client.run_code(code, "a big object", agent=agent)
        assert not result.is_error, result.error_message
        assert result.value == expected
        assert result.text == render_output(expected)
        assert result.raw is not None and not result.raw.shared_result
        assert result.raw.value_json == whole.value_json


async def test_output_over_the_budget_ends_output_limit_with_the_logs_kept(
    make_stack: Any,
) -> None:
    # The run's logs fill its budget; the failure carried them twice (error message and
    # content text), over the limit: RESULT_TOO_LARGE, and the output was lost.
    code = "print('a' * 100)\nprint('x' * 1_000_000)"
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:
        agent = await stack.code_agent()
        async with RegistryClient(stack.running.address) as client:
            result = await client.run_code(code, "too much output", agent=agent)
    assert result.is_error and result.error_code == "CODE_RUN_FAILED", result.error_message
    head = f"code run failed (output-limit): outer output exceeded {LIMIT} bytes"
    assert result.error_message.startswith(head + shared_logs.CAPTURED + "a" * 100 + "\nxxx")
    kept = result.error_message[len(head + shared_logs.CAPTURED) :]
    assert len(kept) > LIMIT - 200 - 2 * LOG_LINE_OVERHEAD, len(kept)
    assert result.text == "Error: " + result.error_message


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"logs": ["a"], "result": 1}, "b\n1"),  # the text does not start with the logs
        ({"result": 1, "logs": ["a"]}, "a\n1"),  # logs is not the value's first key
        ({"logs": ["a"]}, "a\n"),  # a trailing newline would not come back
    ],
)
def test_what_cannot_be_restored_exactly_goes_whole(value: Any, text: str) -> None:
    message = tool_pb2.ToolResult(
        value_json=jsonvalue.dumps(value),
        content=[tool_pb2.ContentBlock(text=tool_pb2.TextContent(text=text))],
    )
    before = message.SerializeToString()
    assert not shared_logs.share(message, value["logs"])
    assert message.SerializeToString() == before


def test_a_provider_result_with_shared_logs_means_the_same_to_the_registry() -> None:
    value: JsonValue = {"logs": ["a", "b"], "result": 1}
    message = tool_pb2.ToolResult(
        value_json=jsonvalue.dumps(value),
        content=[tool_pb2.ContentBlock(text=tool_pb2.TextContent(text="a\nb\n1"))],
    )
    whole = convert.result_from_proto(message)
    assert shared_logs.share(message, ["a", "b"])
    assert convert.result_from_proto(message) == whole
    assert whole.value == value and whole.content == (TextBlock("a\nb\n1"),)
    broken = tool_pb2.ToolResult(shared_logs=["a"], value_json="{}")
    with pytest.raises(CodemodeError, match="no text block") as caught:
        convert.result_from_proto(broken)
    assert caught.value.reason == "INVALID_SHARED_LOGS"


@pytest.mark.parametrize(
    ("value_json", "why"),
    [
        ('{"x":1}', "no result to restore"),
        ("[1]", "no result to restore"),
        ('{"result":""}', "empty result"),
    ],
)
def test_a_shared_result_with_nothing_to_restore_is_refused(value_json: str, why: str) -> None:
    broken = tool_pb2.ToolResult(
        value_json=value_json,
        content=[tool_pb2.ContentBlock(text=tool_pb2.TextContent(text="t"))],
        shared_result=True,
    )
    with pytest.raises(CodemodeError, match=why) as caught:
        convert.result_from_proto(broken)
    assert caught.value.reason == "INVALID_SHARED_LOGS"


def test_a_provider_result_with_a_shared_object_result_means_the_same() -> None:
    result: JsonValue = {"a": [1.0, 2**70], "b": {}}
    value: dict[str, JsonValue] = {"result": result}
    text = render_output(value)
    message = tool_pb2.ToolResult(
        value_json=jsonvalue.dumps(value),
        content=[tool_pb2.ContentBlock(text=tool_pb2.TextContent(text=text))],
    )
    whole = convert.result_from_proto(message)
    assert shared_logs.share(message, [], result)
    assert message.shared_result and message.content[0].text.text == ""
    assert convert.result_from_proto(message) == whole
