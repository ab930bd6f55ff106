"""One Cordis plugin host: a never-used, sandboxed worker that runs one host half until retract.

The worker is taken from the same pool as programs' workers of its language (the same fork
server, pid namespace, cgroup, uid and seccomp) and told ``host`` instead of ``start``
(``worker/plugin_harness.py``, or ``worker_ts/plugin_harness.js`` for TypeScript: one
protocol, so nothing here depends on the language). Unlike a run it lives on: it answers
invocations of the tools its plugin registered until the caller retracts it, the caller goes
away, the runtime is disposed, or it dies. Whatever happens, the worker is killed and reaped
before ``closed`` resolves, so nothing of a plugin host outlives it either.

Transport-free: the servicer turns the events (``HostEvent``) into stream messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from codemode_wire import jsonvalue
from runtime_service.budgets import Budgets
from runtime_service.exit_classification import ExitSigns, WorkerExit
from runtime_service.frame_reader import FrameEvent, FrameLimits, Oversized
from runtime_service.log_budget import LineBudget
from runtime_service.supervisor import WorkerSupervisor
from runtime_service.worker import flatwire, ledger
from runtime_service.worker_process import WorkerCapacityError, WorkerLaunchError, WorkerProcess

__all__ = [
    "HostEvent",
    "HostFailed",
    "HostLog",
    "HostRegistrations",
    "HostResult",
    "HostRetracted",
    "HostServiceCall",
    "HostServiceCallCancel",
    "PluginHost",
    "PluginHostRequest",
]

_log = logging.getLogger(__name__)
_RETRACT_TIMEOUT_S = 10.0  # disposers that hang this long are cut short by the kill
_EXIT_AFTER_EOF_S = 1.0
_MAX_SERVICE_CALLS = 256  # a plugin's service calls awaiting an answer at once
# Work between invocations (timers, tasks the plugin started) may keep a plugin host busy for
# this share of one CPU on average, in bursts of up to its compute budget.
BACKGROUND_CPU_SHARE = 0.1
# The worker bounds its own start (start_timeout_s); this much later the runtime ends a start
# the worker could not interrupt (a Node host half busy after an `await`, a Python one stuck in
# native code).
_START_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class PluginHostRequest:
    source: str
    plugin_id: str
    package_id: str
    run_id: str
    budgets: Budgets
    start_timeout_s: float = 5.0
    visible_tools: list[object] = field(default_factory=list)
    # What the owner's other plugins provide: [{"name", "methods", "data"}] (worker format).
    services: list[object] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ServiceContract:
    name: str
    methods: tuple[str, ...]
    data_json: str  # "" for a service of methods


@dataclass(frozen=True, slots=True)
class DynamicTool:
    name: str
    description: str
    input_schema_json: str
    output_schema_json: str


@dataclass(frozen=True, slots=True)
class HostRegistrations:
    tools: tuple[DynamicTool, ...]
    handlers: tuple[str, ...]
    provides: tuple[str, ...]
    waiting_for: tuple[str, ...]
    changed: bool = False  # a change after the start (else: the start's registrations)
    services: tuple[ServiceContract, ...] = ()
    events: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HostFailed:
    phase: str  # host-load | host-apply | host-lost
    message: str
    stack: str = ""


@dataclass(frozen=True, slots=True)
class HostResult:
    invocation_id: int
    value_json: str | None  # None: failed with error_message
    error_message: str = ""
    presentation_meta_json: str = ""  # with a value: the tool's presentation metadata
    error_stack: str = ""  # a handler's traceback
    method_not_found: bool = False  # a handler invocation named no handler
    cancelled: bool = False  # cut short by a cancel or the retract


@dataclass(frozen=True, slots=True)
class HostLog:
    text: str


@dataclass(frozen=True, slots=True)
class HostRetracted:
    pass


@dataclass(frozen=True, slots=True)
class HostServiceCall:
    """The plugin calls a method of a service it injected; answer with ``service_result``."""

    call_id: int
    service: str
    method: str
    arguments_json: str  # a JSON array


@dataclass(frozen=True, slots=True)
class HostServiceCallCancel:
    """The plugin stopped waiting for its service call ``call_id``."""

    call_id: int


HostEvent = (
    HostRegistrations
    | HostFailed
    | HostResult
    | HostLog
    | HostRetracted
    | HostServiceCall
    | HostServiceCallCancel
)


class PluginHost:
    """Drives one plugin host from start to retract; reports through ``emit``."""

    def __init__(
        self,
        request: PluginHostRequest,
        acquire: Callable[[], Awaitable[WorkerProcess]],
        emit: Callable[[HostEvent], None],
        *,
        exit_signs: ExitSigns,
    ) -> None:
        """``exit_signs``: what the worker's language says as it dies (``ExitSigns``)."""
        self.request = request
        self._acquire = acquire
        self._emit = emit
        self._exit_signs = exit_signs
        self._worker: WorkerProcess | None = None
        self._supervisor: WorkerSupervisor | None = None
        self._started = False
        self._ended = False  # a failed/lost/retracted event was emitted: nothing more is
        self._retracting = False
        # In-flight invocations (tool calls, service method calls, event deliveries), each
        # with the plugin host's CPU seconds when it began: its compute budget counts from there.
        self._pending: dict[int, float] = {}
        self._service_calls: set[int] = set()
        # The background meter: busy CPU while no invocation is in flight draws on a credit of
        # at most the compute budget that refills at BACKGROUND_CPU_SHARE of wall time.
        self._credit_ms = float(request.budgets.compute_ms)
        self._metered_cpu = 0.0  # CPU seconds and loop time the meter last accounted up to
        self._metered_at = 0.0
        self._start_timer: asyncio.TimerHandle | None = None
        # Log lines draw on the output budget, renewed whenever a call begins: a print flood
        # ends the host instead of growing what the runtime and the registry hold.
        self._lines = LineBudget(request.budgets.max_output_bytes)
        self._final: HostEvent | None = None
        self.exhausted: str | None = None
        """Set when no sandbox was free for the host: it never started, and sent nothing."""
        self._done = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolves once the worker is reaped (after the last event)."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Start the host and keep it until it ends; returns once its worker is gone."""
        try:
            try:
                worker = await self._acquire()
            except WorkerCapacityError as exc:
                # Not the plugin's failure and nothing started: no event, the stream's status
                # says so instead (RESOURCE_EXHAUSTED).
                self.exhausted = str(exc)
                self._ended = True
                return
            except WorkerLaunchError as exc:
                self._end(HostFailed("host-load", f"no plugin host could be started: {exc}"))
                return
            self._worker = worker
            budgets = self.request.budgets
            supervisor = self._supervisor = WorkerSupervisor(
                worker,
                budgets,
                self._exit_signs,
                logs=self._lines,
                on_exit=self._on_exit,
                on_output_exceeded=self._output_exceeded,
            )
            problem = supervisor.hand_off()
            if problem is not None:
                self._end(HostFailed("host-load", f"cannot apply the memory budget: {problem}"))
                return
            supervisor.listen(
                self._on_frame,
                self._on_eof,
                FrameLimits(budgets.max_output_bytes * 2 + 4096, 1 << 30, budgets.memory_bytes),
            )
            worker.send(
                {
                    "t": "host",
                    "source": self.request.source,
                    "plugin_id": self.request.plugin_id,
                    "package_id": self.request.package_id,
                    "run_id": self.request.run_id,
                    "start_timeout_s": self.request.start_timeout_s,
                    "max_output_bytes": budgets.max_output_bytes,
                    "memory_bytes": budgets.memory_bytes,
                    "tools": flatwire.encode(self.request.visible_tools),
                    "services": flatwire.encode(self.request.services),
                }
            )
            self._start_timer = asyncio.get_running_loop().call_later(
                self.request.start_timeout_s + _START_GRACE_S, self._start_overdue
            )
            await self._done
        finally:
            if self._start_timer is not None:
                self._start_timer.cancel()
            if self._supervisor is not None:
                self._supervisor.stop()
            if self._worker is not None:
                await self._worker.kill()
                await self._worker.closed
            if not self._ended:
                self._end(HostFailed("host-lost", "the plugin host was stopped"))
            # The last word, only now: whoever hears "retracted" (or "lost") may rely on the
            # host's processes being gone (quiescence).
            if self._final is not None:  # None: refused for want of a sandbox (`exhausted`)
                self._emit(self._final)
            if not self.closed.done():
                self.closed.set_result(None)

    def invoke(
        self,
        invocation_id: int,
        tool_name: str,
        arguments_json: str,
        *,
        service: str = "",
        event: str = "",
        handler_method: str = "",
    ) -> None:
        """Calls a tool the plugin registered; with ``service``: the method ``tool_name`` of a
        service it provides; with ``event``: delivers that event to its listeners; with
        ``handler_method``: the ``harness.handle`` handler of that method (a page's invoke)."""
        worker = self._worker
        if (
            worker is None
            or not self._started
            or self._ended
            or self._retracting
            or invocation_id in self._pending
        ):
            why = (
                "an invocation with this id is already running"
                if (invocation_id in self._pending)
                else "the plugin is not running"
            )
            self._emit(HostResult(invocation_id, None, why))
            return
        try:
            arguments = jsonvalue.loads(arguments_json)
            tokens = flatwire.encode(arguments)
        except (ValueError, flatwire.WireError):
            self._emit(HostResult(invocation_id, None, "tool arguments must be lossless JSON"))
            return
        if service and type(arguments) is not list:
            self._emit(HostResult(invocation_id, None, "service arguments must be a JSON array"))
            return
        now = self._cpu_now()
        self._pending[invocation_id] = now
        self._lines.renew()
        if len(self._pending) == 1 and not self._charge_background(now):
            return  # over its background budget: the host ended, failing this invocation too
        frame: dict[str, object] = {"t": "invoke", "id": invocation_id}
        if handler_method:
            frame["handler"] = handler_method
        else:
            frame["name"] = tool_name
        if service:
            frame["service"] = service
        if event:
            frame["event"] = event
        frame["args"] = tokens
        worker.send(frame)

    def update_services(self, services: list[object]) -> None:
        """The services the owner's other plugins provide changed (the full set)."""
        if self._worker is not None and self._started and not self._ended:
            self._worker.send({"t": "services", "services": flatwire.encode(services)})

    def service_result(self, call_id: int, value_json: str | None, error_message: str) -> None:
        """Answers one of the plugin's service calls (unknown or repeated answers: ignored)."""
        worker = self._worker
        if worker is None or self._ended or call_id not in self._service_calls:
            return
        self._service_calls.discard(call_id)
        if value_json is not None:
            try:
                tokens = flatwire.encode(jsonvalue.loads(value_json))
            except (ValueError, flatwire.WireError):
                worker.send(
                    {
                        "t": "call_result",
                        "id": call_id,
                        "ok": False,
                        "message": "the service's result was not lossless JSON",
                    }
                )
                return
            worker.send({"t": "call_result", "id": call_id, "ok": True, "value": tokens})
        else:
            worker.send({"t": "call_result", "id": call_id, "ok": False, "message": error_message})

    # -- the compute budget of each invocation ----------------------------------------------
    def _cpu_now(self) -> float:
        """Busy CPU seconds of the host (every process of its run) since its hand-off."""
        return self._supervisor.cpu.spent_s() if self._supervisor is not None else 0.0

    def _start_metering(self) -> None:
        """From the start on, the host's CPU is always metered: by invocation while one is in
        flight, as background work otherwise."""
        assert self._supervisor is not None
        self._meter_from_now()
        self._supervisor.meter_cpu(self._check_cpu, self._credit_ms / 1000)

    def _meter_from_now(self) -> None:
        """The background meter accounts from here: what ran before is not background work."""
        self._metered_cpu = self._cpu_now()
        self._metered_at = asyncio.get_running_loop().time()

    def _charge_background(self, now: float) -> bool:
        """Charges the busy CPU since the meter's last reading to the background credit; False
        (and the host ends) once the credit is spent: a timer or task that loops would
        otherwise keep a core busy until the plugin is stopped."""
        budget_ms = self.request.budgets.compute_ms
        at = asyncio.get_running_loop().time()
        refill = (at - self._metered_at) * 1000 * BACKGROUND_CPU_SHARE
        used = (now - self._metered_cpu) * 1000
        self._credit_ms = min(float(budget_ms), self._credit_ms + refill) - used
        self._metered_cpu, self._metered_at = now, at
        if self._credit_ms >= 0:
            return True
        share = round(BACKGROUND_CPU_SHARE * 100)
        self._end(
            HostFailed(
                "host-lost",
                f"its background work (timers, tasks) was busy past its compute budget "
                f"({budget_ms}ms beyond {share}% of a CPU); the plugin host was stopped",
            )
        )
        return False

    def _check_cpu(self, now: float) -> float | None:
        """The host's busy CPU time, read (``WorkerSupervisor.meter_cpu``). While invocations
        are in flight it is theirs: one that ran past its budget ends with the budget's text,
        and so does the host -- as a program's worker, a plugin host busy in a loop cannot
        be interrupted from inside, so it is killed (the registry then steers the owner).
        Another invocation's busy time counts for every one in flight at that moment: they
        share one process. Otherwise it is background work (``_charge_background``). Returns
        the seconds of budget left."""
        if self._ended:
            return None
        budget_ms = self.request.budgets.compute_ms
        if not self._pending:
            return self._credit_ms / 1000 if self._charge_background(now) else None
        over = [i for i, began in self._pending.items() if (now - began) * 1000 > budget_ms]
        if over:
            text = f"compute budget exhausted ({budget_ms}ms busy)"
            for invocation in over:
                del self._pending[invocation]
                self._emit(HostResult(invocation, None, text))
            self._end(
                HostFailed(
                    "host-lost",
                    f"a call ran past its compute budget ({budget_ms}ms busy); the plugin "
                    "host was stopped",
                )
            )
            return None
        spent = max(now - began for began in self._pending.values())
        return budget_ms / 1000 - spent

    def cancel(self, invocation_id: int) -> None:
        if self._worker is not None and invocation_id in self._pending and not self._ended:
            self._worker.send({"t": "cancel", "id": invocation_id})

    async def retract(self) -> None:
        """Dispose the plugin (its disposers run in reverse), then end; idempotent."""
        if self._retracting or self._ended:
            await asyncio.shield(self.closed)
            return
        self._retracting = True
        if self._worker is None or not self._started:
            self._end(HostRetracted())  # nothing started: killing it is the whole retract
        else:
            self._worker.send({"t": "retract"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._done), _RETRACT_TIMEOUT_S)
            if not self._ended:
                self._end(HostRetracted())  # disposers hung: the kill ends them
        await asyncio.shield(self.closed)

    def kill(self) -> None:
        """End now (the caller went away, or the runtime is disposed)."""
        if not self._ended:
            self._end(HostFailed("host-lost", "the plugin host was stopped"))

    def _start_overdue(self) -> None:
        if not self._started and not self._ended:
            late = f"the Plugin did not start within {self.request.start_timeout_s:g} s"
            self._end(HostFailed("host-apply", late))

    # -- worker messages ---------------------------------------------------------------------
    def _on_frame(self, event: FrameEvent) -> None:
        if self._ended:
            return
        if isinstance(event, Oversized):
            self._end(HostFailed(self._phase(), "the plugin host sent a message over its budget"))
            return
        try:
            message = flatwire.loads_strict(event)
        except (ValueError, flatwire.WireError):
            return  # junk from a hostile worker: ignored
        if type(message) is not dict:
            return
        try:
            self._dispatch(message)
        except (KeyError, TypeError, ValueError, flatwire.WireError) as exc:
            _log.info("plugin host %s sent a malformed frame: %s", self.request.plugin_id, exc)

    def _dispatch(self, message: dict[str, object]) -> None:
        kind = message.get("t")
        if kind == "log" and type(message.get("text")) is str:
            line = str(message["text"])
            if self._supervisor is not None and self._supervisor.admit_log(line):
                self._emit(HostLog(line))
        elif kind in ("started", "regs"):
            regs = _registrations(flatwire.decode(message.get("regs")), changed=kind == "regs")
            if kind == "started" and not self._started:
                self._started = True
                self._start_metering()
                self._emit(regs)
            elif kind == "regs" and self._started:
                self._emit(regs)
        elif kind == "failed":
            phase = message.get("phase")
            if self._started:
                phase = "host-lost"  # e.g. a parked plugin whose start failed once unparked
            elif phase not in ("host-load", "host-apply"):
                phase = "host-apply"
            self._end(
                HostFailed(
                    str(phase), str(message.get("message", "")), str(message.get("stack", ""))
                )
            )
        elif kind == "call" and self._started and not self._retracting:
            self._service_call(message)
        elif kind == "call_cancel":
            call_id = message.get("id")
            if type(call_id) is int and call_id in self._service_calls:
                self._service_calls.discard(call_id)  # a late answer is ignored
                self._emit(HostServiceCallCancel(call_id))
        elif kind == "result":
            invocation = message.get("id")
            if type(invocation) is not int or invocation not in self._pending:
                return  # unknown or repeated: ignored
            del self._pending[invocation]
            if not self._pending:  # what the invocations used is not background work
                self._meter_from_now()
            if message.get("ok") is True:
                value = flatwire.decode(message.get("value"))
                meta = flatwire.decode(message["meta"]) if "meta" in message else None
                meta_json = jsonvalue.dumps(meta) if type(meta) is dict else ""
                self._emit(
                    HostResult(invocation, jsonvalue.dumps(value), presentation_meta_json=meta_json)
                )
            else:
                text, stack = message.get("message"), message.get("stack")
                self._emit(
                    HostResult(
                        invocation,
                        None,
                        text if type(text) is str else "failed",
                        error_stack=stack if type(stack) is str else "",
                        method_not_found=message.get("notFound") is True,
                        cancelled=message.get("cancelled") is True,
                    )
                )
        elif kind == "retracted" and self._retracting:
            self._end(HostRetracted())

    def _service_call(self, message: dict[str, object]) -> None:
        call_id, service, method = message.get("id"), message.get("service"), message.get("method")
        if type(call_id) is not int or type(service) is not str or type(method) is not str:
            return
        worker = self._worker
        assert worker is not None
        if call_id in self._service_calls or len(self._service_calls) >= _MAX_SERVICE_CALLS:
            why = (
                "a service call with this id is already running"
                if call_id in self._service_calls
                else f"more than {_MAX_SERVICE_CALLS} service calls at once"
            )
            worker.send({"t": "call_result", "id": call_id, "ok": False, "message": why})
            return
        arguments = flatwire.decode(message.get("args"))
        if type(arguments) is not list:
            return
        self._service_calls.add(call_id)
        self._emit(HostServiceCall(call_id, service, method, jsonvalue.dumps(arguments)))

    def _on_eof(self) -> None:
        # A worker that dies closes its channel first: its exit, which says how it ended, is
        # about to follow. One that only closed the channel is ended (and killed) shortly.
        def closed_only() -> None:
            if not self._ended:
                self._end(HostFailed(self._phase(), "the plugin host closed its channel"))

        asyncio.get_running_loop().call_later(_EXIT_AFTER_EOF_S, closed_only)

    def _on_exit(self, verdict: WorkerExit) -> None:
        if self._ended:
            return
        if verdict.out_of_memory:
            text = (
                f"the plugin host exceeded its memory budget "
                f"({self.request.budgets.memory_bytes >> 20} MiB)"
            )
        else:
            text = f"the plugin host exited (status {verdict.status})"
        self._end(HostFailed(self._phase(), text))

    def _output_exceeded(self) -> None:
        """A line over the output budget (``WorkerSupervisor.admit_log``) ends the host."""
        budget = self.request.budgets.max_output_bytes
        self._end(
            HostFailed(
                self._phase(),
                f"the plugin host's output exceeded its budget ({budget} bytes of logs since "
                f"its last call began, each line also costing {ledger.LOG_LINE_OVERHEAD}); the "
                "plugin host was stopped",
            )
        )

    def _phase(self) -> str:
        return "host-lost" if self._started else "host-apply"

    def _end(self, event: HostEvent) -> None:
        """The host is over: fail what is in flight now; ``event`` goes out once it is reaped."""
        self._ended = True
        for invocation in sorted(self._pending):
            self._emit(HostResult(invocation, None, "the plugin host ended before the call did"))
        self._pending.clear()
        self._service_calls.clear()
        self._final = event
        if not self._done.done():
            self._done.set_result(None)


def _registrations(raw: object, *, changed: bool) -> HostRegistrations:
    """The worker's registrations, rebuilt field by field (it is a hostile peer)."""
    if type(raw) is not dict:
        raise ValueError("registrations must be an object")

    def names(key: str) -> tuple[str, ...]:
        items = raw.get(key, [])
        return tuple(item for item in items if type(item) is str) if type(items) is list else ()

    tools: list[DynamicTool] = []
    seen: set[str] = set()
    raw_tools = raw.get("tools", [])
    for item in raw_tools if type(raw_tools) is list else []:
        if type(item) is not dict or type(item.get("name")) is not str or item["name"] in seen:
            continue
        seen.add(item["name"])
        description, schema, output = item.get("description"), item.get("input"), item.get("output")
        tools.append(
            DynamicTool(
                item["name"],
                description if type(description) is str else "",
                schema if type(schema) is str else "{}",
                output if type(output) is str else "",
            )
        )
    services: list[ServiceContract] = []
    raw_services = raw.get("services", [])
    for item in raw_services if type(raw_services) is list else []:
        if type(item) is not dict or type(item.get("name")) is not str:
            continue
        methods, data = item.get("methods"), item.get("data")
        services.append(
            ServiceContract(
                item["name"],
                tuple(m for m in methods if type(m) is str) if type(methods) is list else (),
                data if type(data) is str else "",
            )
        )
    return HostRegistrations(
        tuple(tools),
        names("handlers"),
        names("provides"),
        names("waiting_for"),
        changed,
        tuple(services),
        names("events"),
    )
