"""A worker's json token text goes on to the caller as the arguments (or completion) text it
is, once the runtime has read it as a lossless value -- no second spelling -- against fake
workers speaking raw frames to the real RuntimeService over gRPC.

The worker is hostile: a text in any spelling reaches the caller as a text of the same value,
a text the runtime cannot vouch for (raw surrogates) is spelled by the runtime as before, and
one that is not lossless JSON fails its call as before -- in small frames (read on the event
loop) and in frames over ``LARGE_FRAME_BYTES`` (read on the decoding threads).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.runtime.v1 import runtime_pb2
from runtime_service.frame_decoding import LARGE_FRAME_BYTES
from runtime_service.worker import flatwire
from tests.runtime.conftest import drive
from tests.runtime.test_hostile_worker import (
    Host,
    assert_no_worker_left,
    binding_calls,
    hosting,
    seen_by_worker,
    success,
)

pb = runtime_pb2
LOSSY = "tool arguments must be lossless JSON"
PAD = '"' + "p" * 300 + '"'
LARGE = "[ " + " , ".join(f'{{ "id" : {i} , "x" : 1E1 }}' for i in range(40_000)) + " ]"
assert len(LARGE) > LARGE_FRAME_BYTES

RELAYED = [
    f'{{ "a" : [ 1 , 2.50 , -3e-2 ] , "pad" : {PAD} }}',
    f'["\\u0041\\/", "caf\u00e9", {PAD}]',
    f'["lone \ud800 surrogate", {PAD}]',  # raw in the token's text: the runtime spells it
    LARGE,
]
REFUSED = [
    f"[NaN, {PAD}]",
    f'{{"a": 1, "a": 2, "p": {PAD}}}',
    f"[-0, {PAD}]",
    "[" * 101 + PAD + "]" * 101,
    f"[1, {PAD}",
    "[" + "1" * 4301 + "]",
    LARGE[:-1] + ", NaN]",
]
TEXTS = RELAYED + REFUSED

CALLS = f"""\
ready()
TEXTS = {TEXTS!r}
for i, text in enumerate(TEXTS, 1):
    send({{'t': 'call', 'id': i, 'name': 'echo', 'args': [{{'kind': 'json', 'text': text}}]}})
replies = {{}}
while len(replies) < len(TEXTS):
    reply = recv()
    replies[reply['id']] = reply
finish([replies[i] for i in range(1, len(TEXTS) + 1)])
"""


async def echo(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
    return pb.CallResult(call_id=call.call_id, value_json=call.arguments_json)


def value_of(text: str) -> object:
    """The value the worker's text holds (read as the runtime reads its frames: raw surrogates
    are characters here)."""
    return json.loads(text)


async def test_a_json_token_goes_on_as_a_text_of_its_value(tmp_path: Path) -> None:
    async with hosting(tmp_path) as host:
        host.fake_workers(CALLS)
        seen, terminal = await drive_echo(host)
        await assert_no_worker_left(host)
    relayed = binding_calls(seen)
    assert [(seq, name) for seq, name, _ in relayed] == [(i, "echo") for i in range(1, 5)]
    texts = [text for _, _, text in relayed]
    assert [jsonvalue.loads(text) for text in texts] == [value_of(t) for t in RELAYED]
    # Read, not spelled again: the worker's own spelling goes on (the registry spells it
    # canonically); the one with a raw surrogate is the runtime's spelling, escaped.
    assert texts[:2] == RELAYED[:2] and texts[3] == LARGE
    assert texts[2] == jsonvalue.dumps(["lone \ud800 surrogate", "p" * 300])
    replies = seen_by_worker(terminal)
    answered = replies[: len(RELAYED)]
    assert all(reply["ok"] is True for reply in answered)
    assert [flatwire.decode(reply["value"]) for reply in answered] == [value_of(t) for t in RELAYED]
    assert [(reply["ok"], reply["message"]) for reply in replies[len(RELAYED) :]] == [
        (False, LOSSY)
    ] * len(REFUSED)


async def drive_echo(host: Host) -> tuple[list[runtime_pb2.RunResponse], runtime_pb2.RunTerminal]:
    return await drive(host.stub, host.start("return 1", "echo", wall_ms=60_000), echo)


@pytest.mark.parametrize("text", [RELAYED[0], LARGE], ids=["small", "large"])
async def test_a_json_token_completion_goes_on_as_a_text_of_its_value(
    tmp_path: Path, text: str
) -> None:
    async with hosting(tmp_path) as host:
        host.fake_workers(
            f"ready()\nsend({{'t': 'done', 'value': [{{'kind': 'json', 'text': {text!r}}}]}})\n"
            "time.sleep(60)\n"
        )
        _, terminal = await drive_echo(host)
        await assert_no_worker_left(host)
    assert success(terminal) == json.loads(text)
    assert terminal.success.value_json == text
