"""Message framing on the runtime <-> worker channel (a Unix socketpair).

Each frame is a 4-byte big-endian payload length followed by that many bytes of compact ASCII
JSON: one object with a ``"t"`` type tag. Values inside messages are flat-wire token lists, so
the JSON text is at most a few levels deep whatever the value's depth.

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
    "FrameBuffer",
    "TurnBatch",
    "pack",
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

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def pack(message: dict[str, object]) -> bytes:
    """Serialize one message as a frame (raises ``ValueError`` for NaN/oversized payloads, and
    ``flatwire.IntegerTooLong`` for an integer the other side would not read)."""
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
