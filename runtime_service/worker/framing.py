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

from runtime_service.worker.flatwire import MAX_INT_DIGITS, IntegerTooLong

__all__ = [
    "EXIT_OUT_OF_MEMORY",
    "HEADER",
    "LOSSY_ARGUMENTS",
    "LOSSY_COMPLETION",
    "MAX_FRAME_BYTES",
    "FrameBuffer",
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
