"""A call result's JSON text reaches the worker unread where the worker's reading of it is
provably the runtime's (``flatwire.json_token``), over real gRPC.

The caller (the registry) is a hostile peer too: whatever it sends, forwarded or read here,
the program reads the same value as from the canonical spelling of that text, and a text that
is not lossless JSON is the same ``ToolCallError`` -- in a CPython and a TypeScript worker,
and in a worker whose program lifted its integer-digit limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.worker import flatwire, framing
from tests.runtime.conftest import drive, start_message_in

pb = runtime_pb2
Stub = runtime_pb2_grpc.RuntimeServiceStub
LOSSY = "binding resolution must be lossless JSON"
PAD = '"' + "p" * 300 + '"'  # makes every text long enough to travel as one json token


def deep(levels: int) -> str:
    return "[ " * levels + PAD + " ]" * levels  # not as the runtime spells it


# Texts the runtime reads as lossless JSON, in spellings its encoder never writes.
ACCEPTED = [
    '{ "a" : [ 1 , 2.50 , 1E2 , -3e-2, 1e-400 ] ,\n\t"pad" : ' + PAD + " }",
    '["\\u0041\\/\\n\\ud83d\\ude00", "\\ud800 lone", "\\udc00", ' + PAD + "]",
    '["caf\u00e9 \U0001f600", {"": {"x": [null, true, false]}}, ' + PAD + "]",
    "[" + "9" * 4300 + ", -" + "7" * 4300 + ", " + PAD + "]",
    "[12345678901234567890, 9007199254740993, 0.1, 1.7976931348623157e308, " + PAD + "]",
    f"[{PAD}, [[[[]]]], {{}}, []]",
    deep(100),  # the json token's deepest
    deep(101),  # one level deeper: the token path
    deep(150),
    "  " + PAD + "  ",
    '{"k": "has [[[ and {{{ and \\" and \\\\", "n": ' + PAD + "}",
]
# Texts that are not lossless JSON.
REFUSED = [
    f"[NaN, {PAD}]",
    f"[Infinity, {PAD}]",
    f"[-Infinity, {PAD}]",
    f'{{"a": 1, "a": 2, "p": {PAD}}}',
    f'{{"a": 1, "\\u0061": 2, "p": {PAD}}}',
    f"[-0, {PAD}]",
    f"[-0.0, {PAD}]",
    f"[1e400, {PAD}]",
    f"[-1e-400, {PAD}]",
    f"[1, {PAD},]",
    f"[1, {PAD}",
    f"[1, {PAD}] 2",
    f"[01, {PAD}]",
    f'["tab\there", {PAD}]',
    f"\ufeff[{PAD}]",
    f"[True, {PAD}]",
    "[" + "1" * 4301 + ", " + PAD + "]",
    "[" + "1" * 5000 + ", " + PAD + "]",
    "[" * 120 + "1," + PAD + "]" * 119,  # deep and unclosed
    f"[{PAD}, 'single']",
]
CASES = ACCEPTED + REFUSED
LIFT = "import sys\nsys.set_int_max_str_digits(0)\n"

PYTHON = f"""\
out = []
for i in range({len(CASES)}):
    try:
        out.append(['ok', await tools.t(i)])
    except ToolCallError as exc:
        out.append(['err', str(exc)])
return out
"""
TYPESCRIPT = f"""\
const out = [];
for (let i = 0; i < {len(CASES)}; i++) {{
  try {{
    out.push(['ok', await tools.t(i)]);
  }} catch (e) {{
    out.push(['err', e.message]);
  }}
}}
return out;
"""
PROGRAMS = {"python": PYTHON, "python-lifted": LIFT + PYTHON, "typescript": TYPESCRIPT}


def canonical(text: str) -> str | None:
    """The text the runtime's own encoder spells for ``text``'s value (None: it refuses it,
    as it did before it forwarded texts: not lossless JSON, or more than the channel's digits)."""
    try:
        value = jsonvalue.loads(text)
        framing.pack({"t": "reply", "id": 1, "ok": True, "value": flatwire.encode(value)})
    except ValueError:
        return None
    return jsonvalue.dumps(value)


def test_the_cases_are_what_they_say() -> None:
    assert all(canonical(text) is not None for text in ACCEPTED)
    assert all(canonical(text) is None for text in REFUSED)
    assert all(text != canonical(text) for text in ACCEPTED)  # none is spelled canonically
    # Most travel unread (the others prove the fallbacks): shallow ones, refused ones included.
    forwarded = [flatwire.json_token(text) is not None for text in CASES]
    assert forwarded.count(True) == len(CASES) - 5
    assert not any(flatwire.json_token(text) for text in (deep(101), deep(150)))
    assert not any(flatwire.json_token(text) for text in REFUSED[-4:-1])


async def outcomes(stub: Stub, kind: str, texts: list[str | None]) -> list[Any]:
    language = "typescript" if kind == "typescript" else "python"

    async def answer(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
        text = texts[json.loads(call.arguments_json)]
        if text is None:
            return pb.CallResult(call_id=call.call_id, error_message=LOSSY)
        return pb.CallResult(call_id=call.call_id, value_json=text)

    start = start_message_in(language, PROGRAMS[kind], "t", wall_ms=60_000)
    _, terminal = await drive(stub, start, answer)
    assert terminal.WhichOneof("outcome") == "success", terminal
    result: list[Any] = jsonvalue.loads(terminal.success.value_json)  # type: ignore[assignment]
    return result


@pytest.mark.parametrize("kind", list(PROGRAMS))
async def test_a_program_reads_any_spelling_as_the_canonical_one(stub: Stub, kind: str) -> None:
    raw = await outcomes(stub, kind, list(CASES))
    # What the runtime sent before it forwarded texts: its own spelling of what it read.
    spelled = await outcomes(stub, kind, [canonical(text) for text in CASES])
    assert raw == spelled
    assert [entry[0] for entry in raw] == ["ok"] * len(ACCEPTED) + ["err"] * len(REFUSED)
    assert {entry[1] for entry in raw[len(ACCEPTED) :]} == {LOSSY}
    assert raw[3][1][0] == int("9" * 4300)  # lossless, however the worker reads it


async def test_a_large_shallow_result_is_not_read_by_the_runtime(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of forwarding: no parse (and no re-spelling) of a large result here."""
    big = json.dumps([{"id": i, "name": f"item {i}", "score": i / 2} for i in range(5000)])
    texts: list[str | None] = [big, deep(150)]
    read: list[str] = []
    loads = jsonvalue.loads

    def counting(text: str | bytes, **kwargs: Any) -> jsonvalue.JsonValue:
        if text in texts:
            read.append(str(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(jsonvalue, "loads", counting)
    program = "a = await tools.t(0)\nb = await tools.t(1)\nreturn [len(a), a[-1], len(str(b))]"

    async def answer(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
        text = texts[json.loads(call.arguments_json)]
        return pb.CallResult(call_id=call.call_id, value_json=text)

    _, terminal = await drive(stub, start_message_in("python", program, "t"), answer)
    assert terminal.WhichOneof("outcome") == "success", terminal
    assert json.loads(terminal.success.value_json) == [
        5000,
        {"id": 4999, "name": "item 4999", "score": 2499.5},
        len(str(json.loads(deep(150)))),
    ]
    assert read == [deep(150)]  # only the deep one is read (for the token path)
