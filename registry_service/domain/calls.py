"""One tool call as the pipeline's stages and hooks see it: what a caller asks for
(`ExecutionInput`), the admitted call (`Execution`), and the failure a body raises with a code.

A module of its own so that policy (whose hooks receive an `Execution`) and the execution
pipeline (which runs those hooks) do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.scopes import GLOBAL
from registry_service.domain.signals import AbortSignal
from registry_service.domain.telemetry import NO_TRACE, CallTrace


class ToolCallFailure(Exception):
    """Raised by a tool body to fail with a stable code (anything else fails without one)."""

    def __init__(self, message: str, code: str = "", name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name


@dataclass(frozen=True, slots=True)
class ExecutionInput:
    call_id: str
    name: str
    arguments: object
    signal: AbortSignal
    agent: str | None = None
    agent_id: str = ""  # the agent's stable identity (its history's key); "" without an agent
    root_call_id: str | None = None
    parent: object | None = None  # the run_code parent token; set only for nested calls
    deadline: float | None = None
    traceparent: str = ""  # W3C context of the caller (the parent of this call's span)
    tracestate: str = ""
    trace: CallTrace = NO_TRACE  # the call's span when the caller started it (nested calls)
    # `dumps(arguments)`, from a caller that has just decoded `arguments` and shares it with no
    # one (a wire message): the pipeline then takes the pair as its snapshot without copying.
    arguments_json: str | None = None
    # Who the call acts for: the principal the RPC guard authenticated, which a run_code run
    # keeps for its nested calls (the registry's record; nothing a runtime sends can set it).
    principal: Principal = ANONYMOUS


class Arguments:
    """A call's argument value, decoded once at admission, until the body takes it.

    Hooks before the body read the value admission decoded. The body then takes that very
    value (`hand_off`: no copy, no second decode; an in-process body owns it and may mutate
    it). From then on the value read here is decoded afresh from the call's canonical text on
    first use, so nothing after the body (post-execute hooks, result observers, wrappers on
    their way out) ever sees what the body did to its copy."""

    __slots__ = ("_handed_off", "_value")

    def __init__(self, value: JsonValue) -> None:
        self._value = value
        self._handed_off = False

    def read(self, text: str) -> JsonValue:
        if self._handed_off:
            self._value = jsonvalue.loads(text)  # text the pipeline wrote: lossless JSON
            self._handed_off = False
        return self._value

    def hand_off(self) -> JsonValue:
        value = self._value
        self._handed_off = True
        self._value = None  # the body's now: not kept alive by the pipeline
        return value


@dataclass(frozen=True, slots=True)
class Execution:
    """One admitted call. `token` identifies it; `arguments_json` is the call's record, its
    canonical argument text, immutable; `arguments` its value (see `Arguments`)."""

    token: object
    call_id: str
    root_call_id: str
    name: str
    held: Arguments = field(repr=False, compare=False)
    arguments_json: str
    agent: str | None
    parent: object | None
    signal: AbortSignal
    deadline: float | None
    traceparent: str
    tracestate: str
    trace: CallTrace = NO_TRACE
    agent_id: str = ""
    principal: Principal = ANONYMOUS

    @property
    def arguments(self) -> JsonValue:
        """The arguments' value: admission's before the body runs, the text's after."""
        return self.held.read(self.arguments_json)

    @property
    def scope(self) -> str:
        return self.agent or GLOBAL

    @property
    def nested(self) -> bool:
        return self.parent is not None
