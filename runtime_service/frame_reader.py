"""The runtime's reader of a run's worker frames, bounded by what the run's budgets allow.

A worker may announce a frame of up to 4 GiB. A frame no genuine worker could send under the
run's budgets is never buffered: its size, its type tag and a running lower bound of what its
content would cost are judged while it arrives, and the reader gives up on it at the first
proof that it is over its bound --

* a log, a completion or an ``output-limit`` frame against the run's output budget (the run
  ends ``output-limit``; the reader reads nothing more);
* a binding call against the most argument bytes the runtime can relay (that call fails; the
  rest of the frame is skipped unread and the channel stays in step);
* any frame against the worker's memory budget (the worker could not have held it).

The lower bound is the output ledger's view of the flat-wire spelling: every
payload byte costs the ledger one byte, except whitespace (which may be between tokens), an
escape ``\\uXXXX`` (6 bytes, may cost only 2) and a container marker ``{"kind":...}`` (28 bytes
at least, may cost only 2). These are counted at C speed as bytes arrive (a string token cannot
hold ``"kind"`` or a raw line break, so nothing of a value is discounted twice), so text-like
content is refused after about one budget of bytes (a little more for text with many spaces)
and container-only content after at most 14 budgets, the most ``framing.pack`` ever spells one
ledger byte with: a frame announced larger than that is refused from its header. (Padding
counts: a forged frame padded beyond that is refused too.) Large frames must start with their
type tag, as any JSON encoder writes it first; one that does not is junk, skipped unread.

A raw frame (``framing.unpack``) is judged the same way once its message has arrived: a call's
arguments are its body, and the body's bytes are counted as any frame's are (compact JSON text
costs the ledger its UTF-8 bytes, less the same discounts).

Memory: one frame at a time, at most ``FrameLimits.max_buffered`` bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from runtime_service.worker.framing import HEADER, RAW

__all__ = ["SMALL_FRAME_BYTES", "FrameEvent", "FrameLimits", "FrameReader", "Oversized"]

SMALL_FRAME_BYTES = 64 << 10
"""Frames up to this size are buffered whole and parsed whatever they hold."""
# A container marker spells at least 28 bytes for a ledger cost of 2; nothing costs less.
_MARKER_RATIO = 14
_MARKER = b'"kind"'
_MARKER_EXCESS = 36  # a marker's bytes beyond its ledger cost (10 length digits, its comma)
_ESCAPE = b"\\u"
_ESCAPE_EXCESS = 4
_BLANKS = (b" ", b"\n", b"\t", b"\r")  # JSON whitespace: between tokens it costs nothing
_WRAPPER_BYTES = 64  # '{"t":"done","value":[' and its close, and the like
_HEAD_BYTES = 256  # where a large frame's type tag must be
_TAG = re.compile(rb'\{\s*"t"\s*:\s*"(log|done|output-limit|call)"')
_CALL_HEAD = re.compile(rb'\{\s*"t"\s*:\s*"call"\s*,\s*"id"\s*:\s*(\d{1,18})\s*,\s*"name"\s*:')
_ARGS = re.compile(rb'"args"\s*:')
_DONE = re.compile(rb'\{\s*"t"\s*:\s*"done"\s*[,}]')
_RAW_HEAD = 1 + HEADER.size  # a raw frame's NUL and the length of its message
_MAX_CALL_HEAD = 1 << 20  # where a call's arguments must have started (the name before them)


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """What a run's frames may cost: the ledger bytes of its output, the JSON bytes of one
    binding call's arguments, and (for any frame) the worker's memory."""

    output_bytes: int
    call_bytes: int
    memory_bytes: int

    @property
    def max_buffered(self) -> int:
        """The most payload bytes held for one frame of this run."""
        worst = _MARKER_RATIO * max(self.output_bytes, self.call_bytes) + _MAX_CALL_HEAD
        return max(min(self.memory_bytes, worst), SMALL_FRAME_BYTES)


@dataclass(frozen=True, slots=True)
class Oversized:
    """A frame over its bound, given up on before it was read to its end."""

    kind: Literal["output", "call"]
    call_id: int = 0
    """For a call: its id, from the frame's start."""
    head: bytearray = field(default_factory=bytearray)
    """For a log frame: its payload bytes read so far (a log's text is cut to the prefix
    that fits, as any overflowing log is)."""


FrameEvent = bytes | Oversized


class FrameReader:
    """Splits a run's channel bytes into payloads and ``Oversized`` verdicts, in order."""

    __slots__ = (
        "_args_at",
        "_blanks",
        "_bound",
        "_buf",
        "_call_id",
        "_escapes",
        "_kind",
        "_length",
        "_limits",
        "_log",
        "_markers",
        "_scanned",
        "_skip",
        "stopped",
    )

    def __init__(self, limits: FrameLimits, pending: bytes = b"", skip: int = 0) -> None:
        """``pending``/``skip``: where the boot-time reader left off (``FrameBuffer.leftover``)."""
        self._limits = limits
        self._buf = bytearray(pending)
        self._skip = skip
        self.stopped = False
        """An output frame was over its bound: the run is over, nothing more is read."""
        self._reset()

    @property
    def between_frames(self) -> bool:
        """Whether every byte read so far belonged to a whole frame (nothing is pending)."""
        return not self.stopped and not self._buf and not self._skip and self._length < 0

    def _reset(self) -> None:
        self._length = -1
        self._kind: Literal["output", "call", "small", ""] = ""
        self._bound = 0
        self._call_id = 0
        self._args_at = -1
        self._scanned = 0
        self._escapes = 0
        self._markers = 0
        self._blanks = 0
        self._log = False

    def feed(self, data: bytes) -> list[FrameEvent]:
        if self.stopped:
            return []
        view = memoryview(data)
        if self._skip:
            dropped = min(self._skip, len(view))
            self._skip -= dropped
            view = view[dropped:]
        self._buf += view
        events: list[FrameEvent] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[FrameEvent]) -> bool:
        """Advance over the buffered bytes; True while there may be more to do."""
        buf = self._buf
        if self._length < 0:
            if len(buf) < HEADER.size:
                return False
            (self._length,) = HEADER.unpack_from(buf)
            if self._length <= SMALL_FRAME_BYTES:
                self._kind = "small"
        have = min(len(buf) - HEADER.size, self._length)
        if self._kind != "small":
            verdict = self._judge(have)
            if verdict is None:
                return False  # more bytes needed to tell
            if verdict == "junk":
                self._drop(have)
                return True
            if verdict == "over":
                if self._kind == "output":
                    self.stopped = True
                    head = bytearray()
                    if self._log:  # handed over as it is, not copied
                        head, self._buf = buf, head
                        del head[HEADER.size + have :]
                        del head[: HEADER.size]
                    self._buf = bytearray()
                    events.append(Oversized("output", head=head))
                    return False
                events.append(Oversized("call", self._call_id))
                self._drop(have)
                return True
        if have < self._length:
            return False
        end = HEADER.size + self._length
        events.append(bytes(buf[HEADER.size : end]))
        del buf[:end]
        self._reset()
        return True

    def _drop(self, have: int) -> None:
        """Skip the current frame: what is buffered now, the rest as it arrives."""
        self._skip = self._length - have
        del self._buf[: HEADER.size + have]
        self._reset()

    def _judge(self, have: int) -> Literal["junk", "over", "ok"] | None:
        """Whether the current large frame is junk or over its bound, given ``have`` of its
        bytes; None while its start is too short to tell."""
        buf = self._buf
        start = HEADER.size
        if not self._kind:
            if have and buf[start] == RAW:
                return self._judge_raw_head(have)
            if have < min(_HEAD_BYTES, self._length):
                return None
            tag = _TAG.match(bytes(buf[start : start + _HEAD_BYTES]))
            if tag is None:
                return "junk"
            if tag.group(1) == b"call":
                self._kind = "call"
                self._bound = self._limits.call_bytes
            else:
                self._kind = "output"
                self._log = tag.group(1) == b"log"
                self._bound = self._limits.output_bytes
                self._args_at = 0
        if self._args_at < 0 and not self._read_call_head(have):
            return "junk" if have >= min(_MAX_CALL_HEAD, self._length) else None
        # From the announced size alone: more than the worker could hold, or a content that
        # costs more than its bound even if it were all container markers. (Not for a log:
        # its text is read on until it costs more than the budget, so that the prefix that
        # fits can be kept.)
        content = self._length - self._args_at - _WRAPPER_BYTES
        too_long = content > _MARKER_RATIO * self._bound
        if (self._length > self._limits.memory_bytes or too_long) and not self._log:
            return "over"
        # Count the patterns whose matches end in the bytes that arrived since last time (a
        # match straddling the previous end is found now; none is counted twice).
        end = start + have
        self._escapes += buf.count(_ESCAPE, start + max(self._scanned - 1, 0), end)
        self._markers += buf.count(_MARKER, start + max(self._scanned - len(_MARKER) + 1, 0), end)
        fresh = start + self._scanned
        self._blanks += sum(buf.count(blank, fresh, end) for blank in _BLANKS)
        self._scanned = have
        arrived = have - self._args_at - _WRAPPER_BYTES - self._blanks
        floor = max(
            arrived - _ESCAPE_EXCESS * self._escapes - _MARKER_EXCESS * self._markers,
            2 * self._markers - _WRAPPER_BYTES,
        )
        return "over" if floor > self._bound else "ok"

    def _judge_raw_head(self, have: int) -> Literal["junk", "over", "ok"] | None:
        """A large raw frame (``framing.unpack``): its message, before the body, must be a
        call or a completion of at most ``_MAX_CALL_HEAD`` bytes that ends inside the frame;
        then it is judged as any frame is, a call's arguments starting at the body."""
        start = HEADER.size
        if have < _RAW_HEAD:
            return None
        (head,) = HEADER.unpack_from(self._buf, start + 1)
        if head > _MAX_CALL_HEAD or _RAW_HEAD + head > self._length:
            return "junk"
        if have < _RAW_HEAD + head:
            return None
        message = bytes(self._buf[start + _RAW_HEAD : start + _RAW_HEAD + head])
        call = _CALL_HEAD.match(message)
        if call is not None:
            self._kind = "call"
            self._bound = self._limits.call_bytes
            self._call_id = int(call.group(1))
            self._args_at = _RAW_HEAD + head
        elif _DONE.match(message) is not None:
            self._kind = "output"
            self._bound = self._limits.output_bytes
            self._args_at = 0
        else:
            return "junk"  # no other message travels raw from a worker
        return self._judge(have)

    def _read_call_head(self, have: int) -> bool:
        """Read a call's id and where its arguments start; False while not yet there."""
        if self._args_at >= 0:
            return True
        start = HEADER.size
        window = bytes(self._buf[start : start + min(have, _MAX_CALL_HEAD)])
        match = _CALL_HEAD.match(window)
        args = _ARGS.search(window, match.end()) if match is not None else None
        if match is None or args is None:
            return False
        self._call_id = int(match.group(1))
        self._args_at = args.end()
        return True
