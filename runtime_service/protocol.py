"""Worker -> runtime messages, shape-checked and rebuilt field by field.

The worker runs model code and can write anything to its channel, so ``parse_worker_message``
never trusts a payload: it returns a freshly built message object or ``None`` for junk, and it
never raises. Flat-wire values stay encoded here; the run decodes them where it needs them.
Text (log lines, failure messages) is made valid UTF-8 here, before anything charges or relays
it (``ledger.valid_text``).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime_service.worker import flatwire
from runtime_service.worker.ledger import valid_text

__all__ = [
    "WORKER_ERROR_KINDS",
    "CallMessage",
    "DoneMessage",
    "LogMessage",
    "OutputLimitMessage",
    "WorkerMessage",
    "parse_worker_message",
]

WORKER_ERROR_KINDS = frozenset({"exception", "invalid-output", "output-limit"})


@dataclass(frozen=True, slots=True)
class CallMessage:
    call_id: int
    name: str
    args: list[object]


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


WorkerMessage = CallMessage | LogMessage | OutputLimitMessage | DoneMessage


def parse_worker_message(payload: bytes) -> WorkerMessage | None:
    try:
        raw = flatwire.loads_strict(payload)
    except Exception:
        return None
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
        return CallMessage(call_id, name, args)
    if kind == "done":
        return _parse_done(raw)
    if kind == "output-limit":
        return OutputLimitMessage()
    return None


def _parse_done(raw: dict[str, object]) -> DoneMessage | None:
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
    return DoneMessage("value" in raw, value if "value" in raw else None, error)  # type: ignore[arg-type]
