"""A provider's result value is decoded once and written canonical in the same pass
(registry_service/convert.py): no decode -> encode -> decode of the wire text, the same value,
text and refusals as before."""

from __future__ import annotations

from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.errors import CodemodeError
from registry_service import convert
from registry_service.domain.results import JsonBlock

WIRE = '{ "rows" : [ {"id": 1, "name": "a"} , {"id": 2, "name": "b"} ], "n": 2.5 }'


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    for name in ("loads", "loads_canonical", "dumps", "snapshot_with_text"):
        real: Any = getattr(jsonvalue, name)

        def counting(arg: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            seen.append(_name)
            return _real(arg, *args, **kw)

        monkeypatch.setattr(jsonvalue, name, counting)
    return seen


def test_a_provider_value_is_decoded_once_and_canonical(decodes: list[str]) -> None:
    message = tool_pb2.ToolResult(value_json=WIRE)
    message.content.add().json.json = WIRE
    result = convert.result_from_proto(message)
    assert result.value == {"rows": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], "n": 2.5}
    canonical = '{"rows":[{"id":1,"name":"a"},{"id":2,"name":"b"}],"n":2.5}'
    assert result.value_json == canonical
    (block,) = result.content
    assert block == JsonBlock(canonical)
    assert decodes == ["loads_canonical", "loads_canonical"]  # the block's, the value's


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a": 1, "a": 2}', "INVALID_JSON"),
        ("[-0.0]", "INVALID_JSON"),
        ("[[[1]]]", "VALUE_TOO_DEEP"),
    ],
)
def test_a_lossy_or_too_deep_provider_value_is_refused(text: str, reason: str) -> None:
    with pytest.raises(CodemodeError) as caught:
        convert.result_from_proto(tool_pb2.ToolResult(value_json=text), max_depth=1)
    assert caught.value.reason == reason


def test_an_empty_value_text_is_null() -> None:
    result = convert.result_from_proto(tool_pb2.ToolResult(value_json=""))
    assert result.has_value and result.value is None and result.value_json == "null"
