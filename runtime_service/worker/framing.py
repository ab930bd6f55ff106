"""Message framing on the runtime <-> worker channel (a Unix socketpair).

Each frame is a 4-byte big-endian payload length followed by that many bytes of compact ASCII
JSON: one object with a ``"t"`` type tag. Values inside messages are flat-wire token lists, so
the JSON text is at most a few levels deep whatever the value's depth.

A **raw frame** carries a message's value as its JSON text unescaped, beside the message
instead of inside it: its payload is a NUL byte (no JSON text starts so), the 4-byte big-endian
length of the message's JSON (``HEADER``), that JSON without the value's field, then the value's
JSON text in UTF-8 to the end of the frame (the *body*). It means the plain frame whose field
(``RAW_FIELDS``: a call's ``args``, a completion's or a reply's ``value``) is the lone json token
``[{"kind": "json", "text": <body>}]``, and is read as exactly that (``unpack``), so the same
checks hold; only the escaping of the text into a JSON string, and its reading back, are gone.
``pack(message, raw=field)`` sends a lone json token so; a large plain value (``flatwire_fast``)
is one.

Stdlib only (imported by the worker under ``python -I -S``).
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime_service.worker.flatwire import MAX_INT_DIGITS, IntegerTooLong

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "EXIT_OUT_OF_MEMORY",
    "HEADER",
    "LOSSY_ARGUMENTS",
    "LOSSY_COMPLETION",
    "MAX_FRAME_BYTES",
    "NOT_UTF8",
    "RAW",
    "RAW_FIELDS",
    "FrameBuffer",
    "TurnBatch",
    "pack",
    "unpack",
]

HEADER = struct.Struct(">I")
# Exit status of a worker whose program exhausted its memory budget (uncaught MemoryError).
EXIT_OUT_OF_MEMORY = 86
# The largest frame either side accepts: ``pack`` refuses a larger one and ``FrameBuffer``
# discards it unread, so a hostile worker makes the runtime buffer at most this much per run.
# A frame's content (a log line, a value, binding arguments) is relayed in one gRPC message of
# at most ``max_message_bytes`` (96 MiB by default), and its ASCII flat-wire spelling costs at
# most 3x that content's JSON text for strings (an astral character escapes to 12 bytes for 4)
# and about 2x for records with real keys and values. Hence 3x the default message limit.
# Containers of tiny or no members cost more (nested empty arrays up to 14x) and are refused
# beyond it; no genuine worker builds a frame this large within the default 512 MiB memory
# budget anyway. Following a configured limit needs it passed to each ``FrameBuffer``.
MAX_FRAME_BYTES = 3 * (96 << 20)
# What the channel refuses, in the words both sides use: the worker raises them to the program
# before sending, the runtime answers (or ends the run) with them for frames a modified worker
# sent anyway. The registry's bridge uses the same arguments text.
LOSSY_ARGUMENTS = "tool arguments must be lossless JSON"
LOSSY_COMPLETION = "program completion must be lossless JSON"

# The first byte of a raw frame's payload, and the field its body stands for, by message type.
RAW = 0
RAW_FIELDS = {"call": "args", "done": "value", "reply": "value"}
_RAW_HEAD = 1 + HEADER.size

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def pack(message: dict[str, object], raw: str | None = None) -> bytes:
    """Serialize one message as a frame (raises ``ValueError`` for NaN/oversized payloads, and
    ``flatwire.IntegerTooLong`` for an integer the other side would not read).

    ``raw``: the message's value field (``RAW_FIELDS``); where it holds a lone json token, the
    frame is a raw one, its body that token's text (a text UTF-8 cannot spell, which no JSON
    text holds, keeps the plain spelling: its escapes)."""
    if raw is not None:
        body = _raw_body(message.get(raw))
        if body is not None:
            return _pack_raw({key: item for key, item in message.items() if key != raw}, body)
    limit = sys.get_int_max_str_digits()
    lifted = not 0 < limit <= MAX_INT_DIGITS  # the program lifted it: keep the runtime's
    if lifted:
        sys.set_int_max_str_digits(MAX_INT_DIGITS)
    try:
        text = _dumps(message)
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise IntegerTooLong from None
        raise
    finally:
        if lifted:
            sys.set_int_max_str_digits(limit)
    payload = text.encode("ascii")
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError("frame too large")
    return HEADER.pack(len(payload)) + payload


def _raw_body(tokens: object) -> bytes | None:
    """The UTF-8 text of a lone json token, or None (any other value, or a surrogate in it)."""
    if type(tokens) is not list or len(tokens) != 1:
        return None
    token = tokens[0]
    if type(token) is not dict or len(token) != 2 or token.get("kind") != "json":
        return None
    text = token.get("text")
    if type(text) is not str:
        return None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _pack_raw(header: dict[str, object], body: bytes) -> bytes:
    head = _dumps(header).encode("ascii")
    length = _RAW_HEAD + len(head) + len(body)
    if length > MAX_FRAME_BYTES:
        raise ValueError("frame too large")
    return b"".join((HEADER.pack(length), b"\0", HEADER.pack(len(head)), head, body))


NOT_UTF8 = "its JSON text is not UTF-8"


def unpack(payload: bytes, loads: Callable[[bytes], object]) -> tuple[object, str | None]:
    """The message a frame's payload holds, parsed by ``loads``, and why its value cannot be
    read (None: it can). A raw frame's message is the plain frame's it stands for: its body a
    lone json token in the field ``RAW_FIELDS`` names, or, for a body that is not UTF-8, an
    empty token list, with ``NOT_UTF8`` (the message still counts: a call is answered).

    Raises what ``loads`` raises, and ``ValueError`` for a raw frame that is not one: a header
    length that lies, a message that is no object, of no raw type, or holds the field itself."""
    if payload[:1] != b"\0":
        return loads(payload), None
    if len(payload) < _RAW_HEAD:
        raise ValueError("raw frame too short")
    (length,) = HEADER.unpack_from(payload, 1)
    end = _RAW_HEAD + length
    if end > len(payload):
        raise ValueError("raw frame header overruns the frame")
    message = loads(payload[_RAW_HEAD:end])
    if type(message) is not dict:
        raise ValueError("raw frame message is not an object")
    field = RAW_FIELDS.get(message.get("t"))  # type: ignore[arg-type]
    if field is None or field in message:
        raise ValueError("not a raw frame's message")
    try:
        text = payload[end:].decode("utf-8")
    except UnicodeDecodeError:
        message[field] = []
        return message, NOT_UTF8
    message[field] = [{"kind": "json", "text": text}]
    return message, None


class FrameBuffer:
    """Incremental frame splitter: ``feed`` bytes, then take complete payloads.

    Frames over ``max_frame_bytes`` are skipped without buffering them (``skipped`` counts
    them), so at most one frame's worth of bytes is ever held.
    """

    __slots__ = ("_buf", "_max", "_skip", "skipped")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes
        self._skip = 0
        self.skipped = 0

    def feed(self, data: bytes) -> list[bytes]:
        frames: list[bytes] = []
        view = memoryview(data)
        if self._skip:
            dropped = min(self._skip, len(view))
            self._skip -= dropped
            view = view[dropped:]
        self._buf += view
        buf = self._buf
        pos = 0
        size = HEADER.size
        while len(buf) - pos >= size:
            (length,) = HEADER.unpack_from(buf, pos)
            if length > self._max:
                self.skipped += 1
                available = len(buf) - pos - size
                self._skip = max(length - available, 0)
                pos = min(pos + size + length, len(buf))
                continue
            end = pos + size + length
            if end > len(buf):
                break
            frames.append(bytes(buf[pos + size : end]))
            pos = end
        if pos:
            del buf[:pos]
        return frames

    def leftover(self) -> tuple[bytes, int]:
        """The bytes buffered past the last frame taken, and how many more are to be skipped
        (a frame over the cap in progress): where another reader takes over."""
        return bytes(self._buf), self._skip


class TurnBatch:
    """Frames of one event-loop turn in as few writes as possible, without delaying any.

    The first frame of a turn is written at once (a lone frame waits for nothing, not even for
    the turn to end: a call made just before a long computation is out while it runs); the
    frames that follow it in the same turn are held and written together when the turn ends
    (a callback queued on the loop by the first). So N frames ready together cost two writes,
    and one turn's frames are the most ever held. A frame that must leave at once (``now``)
    takes the held ones with it, ahead of it, in one write: the order on the wire is the order
    the frames were made. Both ends of the worker channel use it: the worker for its binding
    calls, the runtime for its replies.
    """

    __slots__ = ("_held", "_open", "_write")

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self._write = write
        self._held: list[bytes] = []
        self._open = False  # a turn's first frame went out: the rest of the turn is held

    def add(self, frame: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """Send ``frame`` now if it is the first of this turn, else when the turn ends."""
        if self._open:
            self._held.append(frame)
            return
        self._open = True
        loop.call_soon(self._end_turn)
        self._write(frame)

    def now(self, frame: bytes) -> None:
        """Send ``frame`` at once, behind the frames held in this turn (one write)."""
        if self._held:
            self._held.append(frame)
            self.flush()
        else:
            self._write(frame)

    def flush(self) -> None:
        """Write the held frames (if any) in one write."""
        held = self._held
        if held:
            self._held = []
            self._write(held[0] if len(held) == 1 else b"".join(held))

    def clear(self) -> None:
        """Drop the held frames (the channel is closed)."""
        self._held.clear()

    def _end_turn(self) -> None:
        self._open = False
        self.flush()
