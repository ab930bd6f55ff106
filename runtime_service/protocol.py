"""Worker -> runtime messages, shape-checked and rebuilt field by field.

The worker runs model code and can write anything to its channel, so ``parse_worker_message``
never trusts a payload: it returns a freshly built message object or ``None`` for junk, and it
never raises. Flat-wire values stay encoded here; the run decodes them where it needs them.
Text (log lines, failure messages) is made valid UTF-8 here, before anything charges or relays
it (``ledger.valid_text``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import partial

from runtime_service.worker import flatwire, framing
from runtime_service.worker.ledger import valid_text

__all__ = [
    "WORKER_ERROR_KINDS",
    "CallMessage",
    "DoneMessage",
    "LogMessage",
    "OutputLimitMessage",
    "WorkerMessage",
    "build_worker_message",
    "parse_worker_message",
    "partial_log_text",
]

WORKER_ERROR_KINDS = frozenset({"exception", "invalid-output", "output-limit"})


@dataclass(frozen=True, slots=True)
class CallMessage:
    call_id: int
    name: str
    args: list[object]
    problem: str | None = None
    """Why the arguments cannot be read, when the frame held what the wire refuses."""


@dataclass(frozen=True, slots=True)
class LogMessage:
    text: str


@dataclass(frozen=True, slots=True)
class OutputLimitMessage:
    pass


@dataclass(frozen=True, slots=True)
class DoneMessage:
    """A completion. ``error`` wins over ``value`` when a (forged) message carries both."""

    has_value: bool
    value: list[object] | None
    error: tuple[str, str] | None
    problem: str | None = None
    """Why the value cannot be read, when the frame held what the wire refuses."""


WorkerMessage = CallMessage | LogMessage | OutputLimitMessage | DoneMessage


def parse_worker_message(payload: bytes) -> WorkerMessage | None:
    """The message of a plain or a raw frame (``framing.unpack``: a raw one is read as the
    plain frame it stands for, so every check below holds for both)."""
    try:
        raw, problem = framing.unpack(payload, flatwire.loads_strict)
    except flatwire.IntegerTooLong as exc:
        # A worker whose program lifted the digit limit sent such an integer anyway: the
        # message still counts (a call is answered, a completion settles), its value cannot.
        return _with_long_integers(payload, str(exc))
    except Exception:
        return None
    return build_worker_message(raw, problem)


def build_worker_message(raw: object, problem: str | None = None) -> WorkerMessage | None:
    """The message a parsed payload holds (``problem``: its value cannot be read, why)."""
    if type(raw) is not dict:
        return None
    kind = raw.get("t")
    if kind == "log":
        text = raw.get("text")
        return LogMessage(valid_text(text)) if type(text) is str else None
    if kind == "call":
        call_id, name, args = raw.get("id"), raw.get("name"), raw.get("args")
        if type(call_id) is not int or type(name) is not str or type(args) is not list:
            return None
        return CallMessage(call_id, name, args, problem)
    if kind == "done":
        return _parse_done(raw, problem)
    if kind == "output-limit":
        return OutputLimitMessage()
    return None


class _LongInteger:
    """Stands in for an integer too long to convert (never a valid token)."""

    __slots__ = ()


def _bounded_int(text: str) -> int | float | _LongInteger:
    if len(text) - text.startswith("-") > flatwire.MAX_INT_DIGITS:
        return _LongInteger()
    return -0.0 if text == "-0" else int(text)


def _with_long_integers(payload: bytes, problem: str) -> WorkerMessage | None:
    """The message of a frame that holds integers too long to read, each one a stand-in (in
    a raw frame, only its message can: a body is a json token's text, read later)."""
    try:
        raw, _ = framing.unpack(payload, partial(json.loads, parse_int=_bounded_int))
    except Exception:
        return None
    return build_worker_message(raw, problem)


def _parse_done(raw: dict[str, object], problem: str | None) -> DoneMessage | None:
    error: tuple[str, str] | None = None
    if "error" in raw:
        err = raw["error"]
        if type(err) is not dict:
            return None
        err_kind, message = err.get("kind"), err.get("message")
        if type(err_kind) is not str or err_kind not in WORKER_ERROR_KINDS:
            return None
        if type(message) is not str:
            return None
        error = (err_kind, valid_text(message))
    value = raw.get("value")
    if "value" in raw and type(value) is not list:
        # An undecodable value is still a completion: it resolves as invalid output.
        value = []
    return DoneMessage("value" in raw, value if "value" in raw else None, error, problem)  # type: ignore[arg-type]


_LOG_TEXT = re.compile(rb'\{\s*"t"\s*:\s*"log"\s*,\s*"text"\s*:\s*"')
_LONGEST_ESCAPE = 12  # an escaped surrogate pair


def partial_log_text(head: bytearray, spelled_limit: int) -> str | None:
    """The text at the start of a log frame read only in part (``head``, consumed: it is cut
    in place rather than copied), from at most its first ``spelled_limit`` spelled bytes;
    None if ``head`` is no such start."""
    match = _LOG_TEXT.match(head)
    if match is None:
        return None
    del head[match.end() + spelled_limit :]
    del head[: match.end() - 1]  # from the opening quote
    # The cut may fall inside an escape: drop up to one escape's bytes until the rest reads.
    for _ in range(min(_LONGEST_ESCAPE, len(head) - 1) + 1):
        head.append(0x22)
        try:
            text = json.loads(head)
        except ValueError:
            del head[-2:]
            continue
        return valid_text(text) if type(text) is str else None
    return None
