"""Tool definitions and the invocation a tool body receives."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final, cast

from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire import jsonvalue
from codemode_wire.errors import invalid_argument
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.events import ProgressReporter, ToolProgress
from registry_service.domain.jsonschema import SchemaError, check_schema, ref_name, validate
from registry_service.domain.results import ToolResult
from registry_service.domain.signals import AbortSignal
from registry_service.domain.telemetry import NO_TRACE, CallTrace

RUN_CODE = "run_code"
_UNDECODED: Final = object()
# Names are what the model emits: printable, no whitespace, bounded. Exotic names (`my-tool`,
# `__proto__`, unicode) are legal; the SDK renderers quote them.
# Matched with `fullmatch`: `$` would also accept a trailing newline.
_NAME_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,128}")


@dataclass(frozen=True)
class Invocation:
    """What a tool body is given for one call."""

    call_id: str
    root_call_id: str
    agent: str | None
    tool_name: str
    arguments_json: str  # the call's argument snapshot, canonical JSON text
    signal: AbortSignal
    deadline: float | None  # event-loop time, or None
    # The caller's W3C context, and the call's own span: what a body passes on is the span's
    # context (`traceparent`), spelled only if the body asks (an in-process body rarely does).
    caller_traceparent: str = ""
    caller_tracestate: str = ""
    trace: CallTrace = NO_TRACE
    agent_id: str = ""  # the agent's stable identity (the key of its history)
    # Progress events for the caller's stream (used by run_code for nested-call events).
    emit: Callable[[Any], None] = lambda _event: None
    # The call's observers (`Observers.tell`): a body's own progress reaches them too.
    observe: Callable[[Any], None] = lambda _event: None
    # Who the call acts for (`ExecutionInput.principal`): a run_code run's nested calls act as
    # it, and the plugin host a `cordis_run` starts acts as it.
    principal: Principal = ANONYMOUS
    # The value admission decoded from `arguments_json`, handed over as is (the pipeline
    # keeps none of it: `calls.Arguments`). Unset: decoded from the text on first use.
    decoded_arguments: object = field(default=_UNDECODED, repr=False, compare=False)

    @cached_property
    def arguments(self) -> JsonValue:
        """The body's own copy of the arguments, never decoded twice: a remote provider only
        forwards the text, an in-process body gets the value admission decoded and may do
        with it what it likes (what anyone else sees of the call is its text)."""
        if self.decoded_arguments is not _UNDECODED:
            return cast(JsonValue, self.decoded_arguments)
        return jsonvalue.loads(self.arguments_json)

    @cached_property
    def progress(self) -> ProgressReporter:
        """Reports the body's own progress (`progress(value, total, message)`): a
        `ToolProgress` event of this call to its observers and the caller's stream, bounded by
        `ProgressReporter`. Made on first use: a body that reports nothing costs nothing."""
        return ProgressReporter(self.call_id, self.tool_name, self._progress_event)

    def _progress_event(self, event: ToolProgress) -> None:
        self.trace.progressed(event.progress, event.total)
        self.observe(event)
        self.emit(event)

    def end_progress(self) -> None:
        """The body returned: a value still waiting in `progress` goes out now (before the
        call's result), later ones never."""
        reporter = self.__dict__.get("progress")
        if reporter is not None:
            reporter.close()

    @cached_property
    def _propagation(self) -> tuple[str, str]:
        return self.trace.propagation(self.caller_traceparent, self.caller_tracestate)

    @property
    def traceparent(self) -> str:
        """The W3C context naming the call's span: a provider's work continues from it."""
        return self._propagation[0]

    @property
    def tracestate(self) -> str:
        return self._propagation[1]


# A body returns a canonical value (or raises). It may return a full ToolResult when it needs to
# control content, contexts or concludes-turn (remote providers do).
ToolBody = Callable[[Invocation], Awaitable["JsonValue | ToolResult"]]
Classifier = Callable[[JsonValue], object]


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    name: str
    description: str
    input_schema: JsonValue
    output_schema: JsonValue
    body: ToolBody
    # Exactly `True` from the classifier means parallel; anything else, raising included, is
    # exclusive, and so are arguments that fail the input schema.
    is_concurrency_safe: Classifier | None = None
    guidance: str = ""
    owner: str = "in-process"
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def declared_safe(self) -> bool:
        """The static declaration as shown to clients (a classifier may still vary per call)."""
        return self.is_concurrency_safe is not None and _classify(self, {}) is True


def _classify(defn: ToolDefinition, arguments: JsonValue) -> object:
    try:
        return defn.is_concurrency_safe(arguments) if defn.is_concurrency_safe else False
    except Exception:
        return False


def is_parallel(defn: ToolDefinition | None, arguments: JsonValue) -> bool:
    """Whether a call may overlap others. Schema-invalid arguments make it exclusive: the call
    only fails, and a classifier is never asked about arguments its tool would refuse."""
    if defn is None or defn.is_concurrency_safe is None:
        return False
    try:
        if validate(defn.input_schema, arguments, limit=1):
            return False
    except Exception:  # arguments that are not JSON at all
        return False
    return _classify(defn, arguments) is True


def always_safe(_arguments: JsonValue) -> bool:
    return True


def validate_definition(defn: ToolDefinition) -> None:
    """Refuses a definition the registry could not present or enforce."""
    if not isinstance(defn.name, str) or not _NAME_RE.fullmatch(defn.name):
        raise invalid_argument(
            "INVALID_TOOL_NAME",
            f"tool name {defn.name!r} is invalid: 1-128 printable characters without whitespace",
        )
    if defn.name == RUN_CODE:
        raise invalid_argument(
            "RESERVED_TOOL_NAME",
            'tool name "run_code" is reserved for the Code Mode presentation transport and '
            "cannot be registered or shadowed",
        )
    for label, schema in (("input", defn.input_schema), ("output", defn.output_schema)):
        try:
            check_schema(schema)
        except SchemaError as exc:
            raise invalid_argument(
                "INVALID_SCHEMA", f'tool "{defn.name}" {label} schema is not supported: {exc}'
            ) from exc
    if isinstance(defn.input_schema, dict):
        declared = _root_type(defn.input_schema)
        if declared is not None and declared != "object":
            raise invalid_argument(
                "INVALID_SCHEMA", f'tool "{defn.name}" input schema must describe an object'
            )


def _root_type(schema: dict[str, JsonValue]) -> JsonValue:
    """The root's `type`, or that of the definition a bare root `$ref` names (pydantic emits
    `{"$defs": {...}, "$ref": "#/$defs/Tree"}` for a recursive type). `check_schema` has
    already refused refs that go nowhere and in-place cycles, so following them ends."""
    seen: set[str] = set()
    node: JsonValue = schema
    while isinstance(node, dict) and "type" not in node:
        name = ref_name(node.get("$ref"))
        defs = schema.get("$defs")
        if name is None or name in seen or not isinstance(defs, dict):
            return None
        seen.add(name)
        node = defs.get(name)
    return node.get("type") if isinstance(node, dict) else None
