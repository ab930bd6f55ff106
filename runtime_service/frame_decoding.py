"""Worker messages decoded whole -- parsed, their flat-wire value rebuilt, measured and spelled
as JSON -- for small frames on the event loop, for large ones on a decoding thread.

A 60 MB completion costs seconds of codec work (parse, rebuild, ledger size, JSON text for the
terminal message); on the event loop that froze every other run for as long. Frames over
``LARGE_FRAME_BYTES`` go to a small dedicated thread pool instead (the decoding itself is
unchanged, so a thread sees exactly what the loop would); each run hands them over one at a
time, in channel order (``Run``), so a later small frame never overtakes an earlier large one.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from codemode_common import jsonvalue
from runtime_service.protocol import CallMessage, DoneMessage, WorkerMessage, parse_worker_message
from runtime_service.worker import flatwire
from runtime_service.worker.ledger import json_value_size

__all__ = ["LARGE_FRAME_BYTES", "Decoded", "decode", "decode_frame", "decoding_pool"]

LARGE_FRAME_BYTES = 1 << 20
"""Frames over this size are decoded off the event loop."""
_THREADS = 2  # one per core here: decoding is CPU work, more threads only contend

# Its threads start on the first large frame (an executor starts them on demand).
_POOL = ThreadPoolExecutor(_THREADS, thread_name_prefix="codemode-frame-decode")


def decoding_pool() -> ThreadPoolExecutor:
    """The process's frame-decoding threads."""
    return _POOL


@dataclass(frozen=True, slots=True)
class Decoded:
    """A worker message with the value it carries (call arguments, a completion) rebuilt."""

    message: WorkerMessage | None
    value: object = None
    problem: str | None = None
    """The value is not lossless JSON: why ("" when there is nothing to add to the base text),
    or None."""
    value_size: int = 0
    """A completion's output-ledger size, capped at the budget plus one."""
    value_json: str | None = None
    """The value's JSON text, when it was made here (large frames: off the loop)."""


def decode(message: WorkerMessage | None, max_output_bytes: int, *, spell: bool) -> Decoded:
    """Rebuild the value ``message`` carries; ``spell``: also make its JSON text (and, for a
    completion, its ledger size), the costly parts of a large value."""
    if isinstance(message, CallMessage):
        tokens: object = message.args
        problem = message.problem
    elif isinstance(message, DoneMessage) and message.has_value and message.error is None:
        tokens = message.value
        problem = message.problem
    else:
        return Decoded(message)
    if problem is not None:
        return Decoded(message, problem=problem)
    try:
        value = flatwire.decode(tokens)
    except flatwire.WireError:
        return Decoded(message, problem="")
    if not spell:
        return Decoded(message, value)
    size = 0
    if isinstance(message, DoneMessage):
        size = json_value_size(value, max_output_bytes)
        if size > max_output_bytes:
            return Decoded(message, value, value_size=size)  # output-limit: no text needed
    try:
        text = jsonvalue.dumps(value)
    except jsonvalue.JsonValueError:
        return Decoded(message, problem="")
    return Decoded(message, value, value_size=size, value_json=text)


def decode_frame(payload: bytes, max_output_bytes: int) -> Decoded:
    """Parse and decode one large frame (runs on a decoding thread)."""
    return decode(parse_worker_message(payload), max_output_bytes, spell=True)
