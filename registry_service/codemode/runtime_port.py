"""How the registry's code-mode bridge sees a runtime: open a run, exchange messages, cancel.

The gRPC adapter (`registry_service.runtime_client`) implements this over `RuntimeService.Run`;
tests can implement it in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

RuntimeChannel = Literal["per-run", "multiplexed"]
"""How runs reach a runtime: a stream each, or all of a target's over its one stream."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    program: str
    language: str
    binding_names: tuple[str, ...]
    token: bytes
    timeout: float | None
    traceparent: str = ""
    tracestate: str = ""
    max_output_bytes: int | None = None  # the run's output budget; None: the runtime's default
    tenant: str = ""
    """Whom the run acts for, opaque (`tenant_key`): a runtime may serve one tenant's runs
    on one kept host (the Monty engine), never another tenant's."""


def tenant_key(agent: str, principal: str) -> str:
    """The opaque key of the tenant (agent x principal) a run acts for: a digest, so that the
    runtime learns neither name, and two tenants never share a key."""
    digest = hashlib.sha256(f"{len(agent)}:{agent}\0{principal}".encode()).hexdigest()
    return f"t-{digest[:32]}"


@dataclass(frozen=True, slots=True)
class BindingCall:
    call_id: int
    name: str
    arguments_json: str
    token: bytes
    traceparent: str = ""  # the runtime's run span: the parent of the nested call's span
    tracestate: str = ""


@dataclass(frozen=True, slots=True)
class RunLog:
    text: str


@dataclass(frozen=True, slots=True)
class RunTerminal:
    """The run's one outcome. `kind` is "" on success."""

    logs: tuple[str, ...]
    kind: str = ""
    message: str = ""
    value_json: str | None = None

    @property
    def ok(self) -> bool:
        return not self.kind


RunEvent = BindingCall | RunLog | RunTerminal


class RunStream(Protocol):
    def events(self) -> AsyncIterator[RunEvent]:
        """Events until (and including) the terminal; raises `RuntimeLost` if the link breaks,
        `RunRefused` if the runtime ends the stream with an error status."""
        ...

    def reply(self, call_id: int, ok: bool, payload: str) -> None:
        """Answers a binding call: `payload` is JSON text when ok, else the error message.
        Queues the message and returns at once (never blocks the caller's step)."""
        ...

    def cancel(self, reason: str) -> None:
        """Asks the runtime to abort the run; queued like `reply`."""
        ...

    async def close(self) -> None: ...


class RuntimePort(Protocol):
    async def open_run(self, spec: RunSpec) -> RunStream:
        """A run the runtime has accepted. Raises `RuntimeUnreachable` when no runtime takes
        it in time (nothing ran), `RunRefused` when a runtime rejects it."""
        ...


@dataclass(frozen=True, slots=True)
class RuntimeLimits:
    """What the runtime lets one run use, as far as the port knows (None: unknown)."""

    max_wall_s: float | None = None
    """The longest wall-clock time any run may get (the runtime's wall ceiling)."""
    max_output_bytes: int | None = None
    """The output budget a run should ask for: the most the runtime grants a run by default,
    and that still fits in one message to the registry."""
    max_payload_bytes: int | None = None
    """The largest JSON text one run message can carry: a binding call's arguments, or the
    value that answers it."""


@runtime_checkable
class LimitedRuntime(Protocol):
    """A `RuntimePort` that knows the runtime's limits (the gRPC one asks the runtime);
    ports without it (in-memory test runtimes) are treated as unlimited."""

    async def limits(self) -> RuntimeLimits: ...


class RuntimeUnavailable(Exception):
    """No runtime could take the run, or the one that had it is gone: an outage of the code
    runtime, not a failure of the program. `phase` says whether the program was handed over."""

    phase = ""


class RuntimeUnreachable(RuntimeUnavailable):
    """No runtime took the run (none reachable in time, or each one refused it because it is
    shutting down): the program never ran, so the same call is safe to repeat."""

    phase = "connect"


class RuntimeLost(RuntimeUnavailable):
    """The connection to the runtime failed after the runtime accepted the run (the runtime
    process died, say): the program may have run, and made calls, before it was lost."""

    phase = "running"


class RuntimeExhausted(Exception):
    """The runtime had no sandbox free for the run (every worker slot in use): the program
    never ran, so the same call may succeed after `retry_delay_s` (the runtime's RetryInfo;
    None: it sent none). Capacity, not a failure of the program."""

    def __init__(self, message: str, retry_delay_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_delay_s = retry_delay_s


class RunRefused(Exception):
    """A reachable runtime ended the run with an error status of its own (a protocol or input
    error it reports with its ErrorInfo): not an outage, so the run just fails."""
