"""Raw frames on the worker channel (``runtime_service/worker/framing.py``): a value's JSON text
beside the message, unescaped, read as the plain frame whose field is that text's lone json
token -- so it is checked exactly as that frame is.

Against fake workers speaking raw frames to the real RuntimeService over gRPC (the worker is
hostile: a header length that lies, a body that is not UTF-8, not JSON or not lossless, a body
over the call's limit, raw frames cut into pieces and interleaved with plain ones), and the
codec and the runtime's frame reader on their own. Real workers send and read raw frames in
every test that moves a large plain value (``test_forwarded_results.py``, the benchmarks).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2
from runtime_service.frame_decoding import LARGE_FRAME_BYTES
from runtime_service.frame_reader import SMALL_FRAME_BYTES, FrameLimits, FrameReader, Oversized
from runtime_service.protocol import CallMessage, DoneMessage, parse_worker_message
from runtime_service.worker import flatwire, framing
from tests.runtime.conftest import drive
from tests.runtime.test_frames import hosting as frames_hosting
from tests.runtime.test_hostile_worker import (
    Host,
    assert_no_worker_left,
    binding_calls,
    failure,
    hosting,
    seen_by_worker,
    success,
)

pb = runtime_pb2
LOSSY = "tool arguments must be lossless JSON"
PAD = '"' + "p" * 300 + '"'
LARGE = "[" + ",".join(f'{{"id":{i},"name":"caf\u00e9 {i}"}}' for i in range(60_000)) + "]"
assert len(LARGE) > LARGE_FRAME_BYTES


def raw_payload(message: dict[str, object], body: bytes, *, head: int | None = None) -> bytes:
    """A raw frame's payload; ``head``: the message length it claims (a lie, if given)."""
    text = json.dumps(message, separators=(",", ":")).encode()
    return b"\0" + struct.pack(">I", len(text) if head is None else head) + text + body


def framed(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


# -- the codec --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ['{"a":[1,2.5,"caf\u00e9"]}', LARGE], ids=["small", "large"])
def test_pack_spells_a_lone_json_token_raw_and_unpack_reads_it_back(text: str) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"t": "call", "id": 3, "name": "echo", "args": [{"kind": "json", "text": text}]}, "args"),
        ({"t": "done", "value": [{"kind": "json", "text": text}]}, "value"),
        ({"t": "reply", "id": 9, "ok": True, "value": [{"kind": "json", "text": text}]}, "value"),
    ]
    for message, field in cases:
        frame = framing.pack(message, raw=field)
        plain = framing.pack(message)
        assert frame[4] == framing.RAW and plain[4:5] == b"{"
        (length,) = framing.HEADER.unpack_from(frame)
        assert length == len(frame) - 4
        assert frame.endswith(text.encode())  # unescaped, in UTF-8
        assert len(frame) < len(plain)  # no escapes
        assert framing.unpack(frame[4:], flatwire.loads_strict) == (message, None)
        assert framing.unpack(plain[4:], flatwire.loads_strict) == (message, None)


def test_pack_keeps_the_plain_spelling_for_anything_but_a_lone_json_token() -> None:
    for tokens in (
        [1],
        [{"kind": "array", "length": 1}, 1],
        [{"kind": "json", "text": "[1]"}, 2],
        [{"kind": "json", "text": "[1]", "extra": 1}],
        [{"kind": "json", "text": 5}],
        [{"kind": "json", "text": '["lone \ud800"]'}],  # UTF-8 cannot spell it: escaped
    ):
        message = {"t": "call", "id": 1, "name": "n", "args": tokens}
        assert framing.pack(message, raw="args") == framing.pack(message)


def test_unpack_refuses_what_is_no_raw_frame() -> None:
    def refused(payload: bytes) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 -- the codec's errors, as loads raises
            framing.unpack(payload, flatwire.loads_strict)

    call = {"t": "call", "id": 1, "name": "echo"}
    refused(b"\0\0\0")  # shorter than its header length
    refused(raw_payload(call, b"[1]", head=10_000))  # a header length past the frame's end
    refused(raw_payload(call, b"[1]", head=5))  # cuts the message: not JSON
    refused(b"\0" + struct.pack(">I", 3) + b"[1]" + b"[2]")  # not an object
    refused(raw_payload({"t": "log", "text": "x"}, b"[1]"))  # no raw type
    refused(raw_payload({"t": "call", "id": 1, "name": "e", "args": [1]}, b"[2]"))  # both


def test_a_body_that_is_not_utf8_still_counts_its_value_does_not() -> None:
    payload = raw_payload({"t": "call", "id": 4, "name": "echo"}, b'["\xff\xfe"]')
    assert framing.unpack(payload, flatwire.loads_strict) == (
        {"t": "call", "id": 4, "name": "echo", "args": []},
        framing.NOT_UTF8,
    )
    message = parse_worker_message(payload)
    assert message == CallMessage(4, "echo", [], framing.NOT_UTF8)
    surrogate = raw_payload({"t": "done"}, b'["\xed\xa0\x80"]')  # an encoded lone surrogate
    done = parse_worker_message(surrogate)
    assert isinstance(done, DoneMessage) and done.problem == framing.NOT_UTF8


# -- the runtime's frame reader ---------------------------------------------------------------

LIMITS = FrameLimits(output_bytes=4 << 20, call_bytes=2 << 20, memory_bytes=256 << 20)


def test_the_reader_takes_a_raw_frame_cut_anywhere_and_the_frames_around_it() -> None:
    body = LARGE.encode()
    raw = framed(raw_payload({"t": "call", "id": 2, "name": "echo"}, body))
    before = framing.pack({"t": "log", "text": "before"})
    after = framing.pack({"t": "call", "id": 3, "name": "echo", "args": [1]})
    stream = before + raw + after
    for piece in (1, 3, 4096, 1 << 16, len(stream)):
        reader = FrameReader(LIMITS)
        events = []
        for at in range(0, len(stream), piece):
            events += reader.feed(stream[at : at + piece])
        assert events == [before[4:], raw[4:], after[4:]], piece
        assert reader.between_frames


def test_the_reader_gives_up_on_a_raw_call_over_its_bound_and_reads_on() -> None:
    limits = FrameLimits(output_bytes=4 << 20, call_bytes=SMALL_FRAME_BYTES, memory_bytes=1 << 30)
    body = b"[" + b",".join(b'"%d"' % i for i in range(200_000)) + b"]"  # ~1.5 MB of text
    raw = framed(raw_payload({"t": "call", "id": 5, "name": "echo"}, body))
    after = framing.pack({"t": "call", "id": 6, "name": "echo", "args": [1]})
    reader = FrameReader(limits)
    events = []
    for at in range(0, len(raw + after), 1 << 16):
        events += reader.feed((raw + after)[at : at + (1 << 16)])
    assert events == [Oversized("call", 5), after[4:]]
    assert reader.between_frames


def test_the_reader_stops_at_a_raw_completion_over_the_output_budget() -> None:
    limits = FrameLimits(output_bytes=SMALL_FRAME_BYTES, call_bytes=1 << 20, memory_bytes=1 << 30)
    raw = framed(raw_payload({"t": "done"}, LARGE.encode()))
    reader = FrameReader(limits)
    events = reader.feed(raw)
    assert [type(event) for event in events] == [Oversized]
    assert isinstance(events[0], Oversized) and events[0].kind == "output" and reader.stopped


def test_the_reader_skips_a_large_raw_frame_whose_message_length_lies() -> None:
    after = framing.pack({"t": "call", "id": 8, "name": "echo", "args": [1]})
    for head in (len(LARGE) + 100, (1 << 20) + 1):  # past the frame's end; past any message
        lying = framed(
            raw_payload({"t": "call", "id": 7, "name": "echo"}, LARGE.encode(), head=head)
        )
        reader = FrameReader(LIMITS)
        assert reader.feed(lying + after) == [after[4:]]
    log = framed(raw_payload({"t": "log", "text": "x"}, LARGE.encode()))  # no raw type
    reader = FrameReader(LIMITS)
    assert reader.feed(log + after) == [after[4:]]


# -- end to end, hostile fake workers ---------------------------------------------------------

RELAYED = [f'{{"a":[1,2.50,-3e-2],"pad":{PAD}}}', f'["\\u0041\\/","caf\u00e9",{PAD}]', LARGE]
REFUSED = [
    f"[NaN,{PAD}]",
    f'{{"a":1,"a":2,"p":{PAD}}}',
    f"[-0,{PAD}]",
    "[" * 101 + PAD + "]" * 101,
    f"[1,{PAD}",
    "[" + "1" * 4301 + "]",
    LARGE[:-1] + ",NaN]",
    "not json at all " + PAD,
]

# Raw calls 1..N (every text above, then one that is not UTF-8), written in pieces with a plain
# log between two of them and a frame whose message length lies ahead of them all.
CALLS = f"""\
def raw_call(call_id, body):
    message = json.dumps({{'t': 'call', 'id': call_id, 'name': 'echo'}}).encode()
    return raw_frame(b'\\0' + struct.pack('>I', len(message)) + message + body)
ready()
TEXTS = {RELAYED + REFUSED!r}
lying = raw_frame(b'\\0' + struct.pack('>I', 99999) + b'{{"t":"call","id":1,"name":"echo"}}[1]')
frames = [lying] + [raw_call(i, text.encode()) for i, text in enumerate(TEXTS, 1)]
frames.insert(2, frame({{'t': 'log', 'text': 'between'}}))
frames.append(raw_call(len(TEXTS) + 1, b'["\\xff"]'))
stream = b''.join(frames)
for at in range(0, len(stream), 7777):
    sock.sendall(stream[at:at + 7777])
replies = {{}}
while len(replies) < len(TEXTS) + 1:
    reply = recv()
    replies[reply['id']] = reply
finish([replies[i] for i in range(1, len(TEXTS) + 2)])
"""


async def echo(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
    return pb.CallResult(call_id=call.call_id, value_json=call.arguments_json)


async def drive_echo(host: Host) -> tuple[list[runtime_pb2.RunResponse], runtime_pb2.RunTerminal]:
    return await drive(host.stub, host.start("return 1", "echo", wall_ms=60_000), echo)


async def test_raw_calls_are_relayed_as_their_text_or_refused_as_plain_ones(
    tmp_path: Path,
) -> None:
    async with hosting(tmp_path) as host:
        host.fake_workers(CALLS)
        seen, terminal = await drive_echo(host)
        await assert_no_worker_left(host)
    relayed = binding_calls(seen)
    # In order, the lying frame dropped (no call numbered for it), the log where it was sent.
    assert [(seq, text) for seq, _, text in relayed] == list(enumerate(RELAYED, 1))
    kinds = [m.WhichOneof("kind") for m in seen]
    assert kinds[:3] == ["binding_call", "log", "binding_call"]
    replies = seen_by_worker(terminal)
    assert len(replies) == len(RELAYED) + len(REFUSED) + 1
    answered = replies[: len(RELAYED)]
    # The runtime's replies went back raw too: the worker read each as a lone json token.
    assert [reply["value"] for reply in answered] == [
        [{"kind": "json", "text": text}] for text in RELAYED[:2]
    ] + [[{"kind": "json", "text": LARGE}]]
    assert [(reply["ok"], reply["message"]) for reply in replies[len(RELAYED) : -1]] == [
        (False, LOSSY)
    ] * len(REFUSED)
    assert (replies[-1]["ok"], replies[-1]["message"]) == (False, f"{LOSSY}: {framing.NOT_UTF8}")


async def test_a_raw_call_over_the_call_limit_fails_unread_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    body = "[" + ",".join(['"' + "x" * 1000 + '"'] * 3000) + "]"  # ~3 MB, over 2 MB
    limits = {
        "max_message_bytes": 2 << 20,
        "max_output_bytes": 1 << 20,
        "default_max_output_bytes": 1 << 20,
    }
    async with frames_hosting(tmp_path, **limits) as host:
        host.fake_workers(
            "ready()\n"
            f"body = {body!r}.encode()\n"
            "message = json.dumps({'t': 'call', 'id': 1, 'name': 'echo'}).encode()\n"
            "sock.sendall(raw_frame(b'\\0' + struct.pack('>I', len(message)) + message + body))\n"
            "send({'t': 'call', 'id': 2, 'name': 'echo', 'args': [5]})\n"
            "first, second = recv(), recv()\n"
            "finish([first, second])\n"
        )
        seen, terminal = await drive_echo(host)
        await assert_no_worker_left(host)
    assert [(seq, text) for seq, _, text in binding_calls(seen)] == [(1, "5")]
    first, second = seen_by_worker(terminal)
    assert first["id"] == 1 and first["ok"] is False
    assert "binding arguments are too large to send" in first["message"]
    assert (second["id"], second["ok"]) == (2, True)


@pytest.mark.parametrize("text", [RELAYED[0], LARGE], ids=["small", "large"])
async def test_a_raw_completion_is_the_run_value(tmp_path: Path, text: str) -> None:
    async with hosting(tmp_path) as host:
        host.fake_workers(
            "ready()\n"
            "message = json.dumps({'t': 'done'}).encode()\n"
            f"body = {text!r}.encode()\n"
            "sock.sendall(raw_frame(b'\\0' + struct.pack('>I', len(message)) + message + body))\n"
            "time.sleep(60)\n"
        )
        _, terminal = await drive_echo(host)
        await assert_no_worker_left(host)
    assert success(terminal) == json.loads(text)
    assert terminal.success.value_json == text


@pytest.mark.parametrize("body", [b"[NaN]", b'["\xff"]', b"[" * 101 + b"]" * 101])
async def test_a_raw_completion_that_is_not_lossless_is_invalid_output(
    tmp_path: Path, body: bytes
) -> None:
    async with hosting(tmp_path) as host:
        host.fake_workers(
            "ready()\n"
            "message = json.dumps({'t': 'done'}).encode()\n"
            f"body = {body!r}\n"
            "sock.sendall(raw_frame(b'\\0' + struct.pack('>I', len(message)) + message + body))\n"
            "time.sleep(60)\n"
        )
        _, terminal = await drive_echo(host)
        await assert_no_worker_left(host)
    kind, message = failure(terminal)
    assert kind == pb.FAILURE_KIND_INVALID_OUTPUT
    assert message.startswith("program completion must be lossless JSON")
