"""A Cordis plugin host inside a worker: evaluate a host half, apply its plugin, serve its tools.

Entered from ``bootstrap.serve`` when the first message is ``{"t": "host", ...}`` instead of a
program's ``start``: the same fresh, sandboxed, never-used worker, which then lives until the
runtime retracts the plugin (or kills it). The façade it gives the host half is specified in
``codemode_wire/host_facade.json`` (tests/runtime/test_host_facade.py holds both harnesses to
it); in Python's style:

- the host half is an async function body (top-level ``await``/``return``, like a program) that
  returns the plugin: a function ``plugin(ctx)`` or an object with ``apply(ctx)``; either may be
  async, and may carry ``inject`` (a list of service names). Evaluation and the plugin's start
  together are bounded by the start timeout;
- its globals: ``harness`` (``define_tool``, ``register_tool``, ``handle``) and ``print``, whose
  lines become logs tagged ``[cordis:<plugin id>]``. Nothing else: no bindings, no way to run
  another tool;
- ``ctx`` is read-only: ``ctx.tools`` (``schemas()``, ``get(name)`` -- schema views only --
  and ``register``), ``ctx.get(name)``, ``ctx.effect(fn)`` (``fn()`` runs now; a callable it
  returns is the disposer), ``ctx.provide(name, value)``, and ``ctx.timer`` when injected
  (``timeout``/``interval``, ``throttle``/``debounce``, each disposed on retract),
  ``ctx.on``/``ctx.once`` (events the runtime delivers: the owner's history records as they
  are written, and ``plugin/dispose``);
- services between the owner's plugins (``plugin_services``): a plugin whose ``inject`` names a
  service no other running plugin of the owner provides parks ``waiting`` (a successful start)
  and is applied when the runtime says the service appeared; when one of its services goes, it
  is disposed and parks again. Injected services are attributes of ``ctx``;
- retract cancels running invocations and timers, then runs the disposers in reverse order.

Frames, runtime -> worker: ``host`` (once), ``invoke {id, name, args}`` (a tool) or ``invoke
{id, handler, args}`` (a ``harness.handle`` handler, a page's ``invoke``), ``cancel {id}``,
``retract``, ``services {services}`` (what the plugin may inject now), ``call_result {id, ok,
value | message}``; ``invoke`` with ``service`` calls a provided service's method, with
``event`` delivers an event. Worker -> runtime: ``log``, ``started {regs}`` or ``failed
{phase, message, stack}`` (after the start: the plugin cannot go on, the host ends), ``regs
{regs}`` (a change), ``result {id, ok, value | message [, stack, notFound]}``, ``call {id,
service, method, args}`` (a call of an injected service), ``call_cancel {id}`` (the invocation
awaiting that call was cancelled), ``retracted``.
Values travel as flat-wire tokens, as a program's do.

Not a security boundary by itself: the worker's sandbox is (``sandbox_child``).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import inspect
import io
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from runtime_service.worker import flatwire, framing, ledger
from runtime_service.worker.core import (
    PROGRAM_FILENAME,
    Channel,
    compile_program,
    finish,
    render_exception,
)
from runtime_service.worker.plugin_services import (
    ServiceProxy,
    context_returned,
    describe,
    method_of,
    not_injected,
)

__all__ = ["serve_host"]

LOSSY = (
    "must be lossless JSON data (dicts with str keys, lists, str, int, float, bool, None) -- "
    "not a class instance, function, set, tuple, bytes, NaN or infinity"
)
NOT_A_DEFINITION = "dynamic tool registration must use a tool returned by harness.define_tool(...)"
MISSING_RETURN = "the Host half returned `None` -- did you forget `return`?"
WRONG_RETURN = "the Host half must return a Plugin function or an object with apply(ctx)"


_NO_META = object()  # a result without presentation metadata (not even None)


class _ToolDefinition:
    """What ``harness.define_tool`` returns; only these may be registered (the marker)."""

    __slots__ = (
        "description",
        "execute",
        "input_schema",
        "name",
        "output_schema",
        "presentation_meta",
    )

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: object,
        output_schema: object,
        execute: Callable[..., Any],
        *,
        presentation_meta: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self.presentation_meta = presentation_meta
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self.output_schema = output_schema
        self.execute = execute

    def __repr__(self) -> str:
        return f"<tool definition {self.name!r}>"


def _lossless(value: object, what: str) -> object:
    """``value`` itself when it is lossless JSON, else a ``ValueError`` naming ``what``."""
    try:
        flatwire.encode(value)
    except (flatwire.WireError, ValueError, TypeError):
        raise ValueError(f"{what} {LOSSY}") from None
    return value


class _Host:
    def __init__(self, channel: Channel, loop: asyncio.AbstractEventLoop, start: dict[str, Any]):
        self.channel = channel
        self.loop = loop
        self.plugin_id = str(start.get("plugin_id", ""))
        self.source = str(start.get("source", ""))
        self.start_timeout_s = float(start.get("start_timeout_s", 5.0))
        self.max_output = max(4, int(start.get("max_output_bytes", 1 << 20)))
        visible = flatwire.decode(start.get("tools", []))
        self.visible: list[dict[str, Any]] = [
            item for item in (visible if type(visible) is list else []) if type(item) is dict
        ]
        self.tools: dict[str, _ToolDefinition] = {}
        self.handlers: dict[str, Callable[..., Any]] = {}
        self.provides: dict[str, object] = {}
        self.contracts: dict[str, dict[str, Any]] = {}  # of `provides`, as others see them
        # What the owner's other plugins provide (``inject``, ``ctx.get``); changes arrive.
        self.available = _services(flatwire.decode(start.get("services", [])))
        self.plugin: object = None
        self.inject: tuple[str, ...] = ()
        self.applied = False  # the plugin's apply ran (it is not parked)
        self.transition = asyncio.Lock()  # apply / park, one at a time
        self.listeners: dict[str, list[_Listener]] = {}
        self.calls: dict[int, asyncio.Future[object]] = {}  # service calls awaiting a result
        self.next_call = 1
        self.waiting_for: list[str] = []
        self.disposers: list[Callable[[], Any]] = []
        self.invocations: dict[int, asyncio.Task[None]] = {}
        self.started = False
        self.retracting = False

    # -- output ------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        text = ledger.valid_text(f"[cordis:{self.plugin_id}] {text}")
        # Cut so that the line, with its overhead, fits the output budget the runtime
        # charges it to (plugin_host.py: a call's lines past it stop the host).
        room = self.max_output - ledger.LOG_LINE_OVERHEAD
        if ledger.json_string_size(text) > room:
            text = ledger.fit_prefix(text, room)
        self.channel.send({"t": "log", "text": text})

    def registrations(self) -> list[object]:
        tools = [
            {
                "name": tool.name,
                "description": tool.description,
                "input": json.dumps(tool.input_schema, separators=(",", ":")),
                "output": (
                    ""
                    if tool.output_schema is None
                    else json.dumps(tool.output_schema, separators=(",", ":"))
                ),
            }
            for tool in self.tools.values()
        ]
        regs = {
            "tools": tools,
            "handlers": sorted(self.handlers),
            "provides": sorted(self.provides),
            "services": [self.contracts[name] for name in sorted(self.contracts)],
            "events": sorted(name for name, items in self.listeners.items() if items),
            "waiting_for": list(self.waiting_for),
        }
        return flatwire.encode(regs)

    def changed(self) -> None:
        if self.started and not self.retracting:
            self.channel.send({"t": "regs", "regs": self.registrations()})

    # -- the façade --------------------------------------------------------------------------
    def define_tool(
        self,
        name: object = None,
        description: object = "",
        parameters: object = None,
        execute: object = None,
        output_schema: object = None,
        *,
        presentation_meta: object = None,
    ) -> _ToolDefinition:
        if type(name) is not str or not name:
            raise TypeError("harness.define_tool needs a non-empty str `name`")
        if type(description) is not str:
            raise TypeError("harness.define_tool `description` must be a str")
        if not callable(execute):
            raise TypeError("harness.define_tool needs a callable `execute(args)`")
        if presentation_meta is not None and not callable(presentation_meta):
            raise TypeError(
                "harness.define_tool `presentation_meta` must be a callable (args, result) -> dict"
            )
        schema = {"type": "object", "properties": {}} if parameters is None else parameters
        if type(schema) is not dict:
            raise TypeError("harness.define_tool `parameters` must be a JSON Schema object (dict)")
        _lossless(schema, "harness.define_tool `parameters`")
        if output_schema is not None:
            if type(output_schema) is not dict:
                raise TypeError("harness.define_tool `output_schema` must be a dict")
            _lossless(output_schema, "harness.define_tool `output_schema`")
        # Snapshots: later changes to the caller's dicts change nothing registered.
        return _ToolDefinition(
            name,
            description,
            flatwire.decode(flatwire.encode(schema)),
            None if output_schema is None else flatwire.decode(flatwire.encode(output_schema)),
            execute,
            presentation_meta=presentation_meta,
        )

    def register_tool(self, tool: object) -> Callable[[], None]:
        if type(tool) is not _ToolDefinition:
            raise TypeError(NOT_A_DEFINITION)
        if tool.name in self.tools:
            raise ValueError(
                f'tool "{tool.name}" is already registered by this plugin; to replace it, '
                "keep the disposer register_tool returned and call it first"
            )
        self.tools[tool.name] = tool

        def unregister() -> None:
            if self.tools.get(tool.name) is tool:
                del self.tools[tool.name]
                self.changed()

        self.disposers.append(unregister)
        self.changed()
        return unregister

    def handle(self, method: object, fn: object) -> Callable[[], None]:
        if type(method) is not str or not method:
            raise TypeError("harness.handle needs a non-empty str method name")
        if not callable(fn):
            raise TypeError("harness.handle needs a callable handler")
        self.handlers[method] = fn

        def remove() -> None:
            if self.handlers.get(method) is fn:
                del self.handlers[method]
                self.changed()

        self.disposers.append(remove)
        self.changed()
        return remove

    def effect(self, fn: object) -> None:
        if not callable(fn):
            raise TypeError("ctx.effect needs a callable")
        disposer = fn()
        if inspect.isawaitable(disposer):
            raise TypeError("ctx.effect runs its function synchronously: it may not be async")
        if callable(disposer):
            self.disposers.append(disposer)

    def provide(self, name: object, value: object) -> None:
        if type(name) is not str or not name:
            raise TypeError("ctx.provide needs a non-empty str service name")
        if name == "timer":
            raise ValueError('service "timer" is built in; provide it under another name')
        self.contracts[name] = describe(name, value)
        self.provides[name] = value

        def withdraw() -> None:
            if self.provides.get(name) is value:
                del self.provides[name]
                del self.contracts[name]
                self.changed()

        self.disposers.append(withdraw)
        self.changed()

    def on(self, event: object, fn: object, *, once: bool) -> Callable[[], None]:
        verb = "ctx.once" if once else "ctx.on"
        if type(event) is not str or not event:
            raise TypeError(f"{verb} needs a non-empty str event name")
        if not callable(fn):
            raise TypeError(f"{verb} needs a callable listener")
        listener = _Listener(fn, once)
        self.listeners.setdefault(event, []).append(listener)

        def off() -> None:
            items = self.listeners.get(event, [])
            if listener in items:
                items.remove(listener)
                if not items:
                    self.changed()  # no longer observed: the runtime stops delivering it

        self.disposers.append(off)
        if len(self.listeners[event]) == 1:
            self.changed()
        return off

    async def emit(self, event: str, payload: object) -> None:
        """Runs the listeners of ``event`` in registration order; a failing one is logged."""
        for listener in list(self.listeners.get(event, [])):
            if listener.once:
                items = self.listeners.get(event, [])
                if listener not in items:
                    continue  # fired already by an earlier delivery
                items.remove(listener)
                if not items:
                    self.changed()
            try:
                outcome = listener.fn(flatwire.decode(flatwire.encode(payload)))
                if inspect.isawaitable(outcome):
                    await outcome
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log(f'a listener of "{event}" failed: {render_exception(exc)}')

    # -- services of the owner's other plugins ------------------------------------------------
    def service(self, name: str) -> object:
        """What a consumer reaches as ``ctx.<name>`` / ``ctx.get(name)``: a copy of a data
        service, a proxy of a service of methods; None when no other plugin provides it."""
        contract = self.available.get(name)
        if contract is None:
            return None
        if contract["data"]:
            return json.loads(contract["data"])
        return ServiceProxy(name, frozenset(contract["methods"]), self.call_service)

    async def call_service(self, service: str, method: str, args: list[object]) -> object:
        if self.retracting:
            raise RuntimeError(f'service "{service}" cannot be called: the plugin is stopping')
        try:
            tokens = flatwire.encode(args)
        except (flatwire.WireError, ValueError, TypeError):
            raise ValueError(f'the arguments of service "{service}".{method} {LOSSY}') from None
        call_id = self.next_call
        self.next_call += 1
        future: asyncio.Future[object] = self.loop.create_future()
        self.calls[call_id] = future
        self.channel.send(
            {"t": "call", "id": call_id, "service": service, "method": method, "args": tokens}
        )
        try:
            return await future
        except asyncio.CancelledError:
            # The invocation awaiting it was cancelled: so is the provider's (the future is
            # cancelled with the task, and a late answer finds no call any more).
            with contextlib.suppress(OSError):
                self.channel.send({"t": "call_cancel", "id": call_id})
            raise
        finally:
            self.calls.pop(call_id, None)

    def call_answered(self, message: dict[str, Any]) -> None:
        future = self.calls.get(message.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return
        if message.get("ok") is True:
            try:
                future.set_result(flatwire.decode(message.get("value")))
            except flatwire.WireError:
                future.set_exception(RuntimeError("the service's result was not lossless JSON"))
        else:
            future.set_exception(RuntimeError(str(message.get("message", "the call failed"))))

    def missing(self) -> list[str]:
        return [name for name in self.inject if name != "timer" and name not in self.available]

    async def services_changed(self, raw: object) -> None:
        """The owner's other plugins' services changed: start a parked plugin whose services
        are all there now; dispose and park a running one that lost one."""
        self.available = _services(raw)
        async with self.transition:
            if self.plugin is None or self.retracting:
                return
            missing = self.missing()
            if self.applied and missing:
                await self.emit("plugin/dispose", {"reason": "waiting", "waitingFor": missing})
                await self.dispose()
                self.applied = False
                self.waiting_for = missing
                self.changed()
            elif not self.applied and not missing:
                late = f"the Plugin did not start within {self.start_timeout_s:g} s"
                try:
                    with _deadline(self.start_timeout_s, "host-apply", late):
                        await asyncio.wait_for(self.apply_now(), self.start_timeout_s)
                except (Exception, _StartTimeout) as exc:
                    # The plugin cannot run: the host ends, the registry steers the owner.
                    await self.dispose()
                    text = (
                        late
                        if isinstance(exc, (TimeoutError, _StartTimeout))
                        else str(exc) or type(exc).__name__
                    )
                    self.fail(
                        "host-apply",
                        f"its injected services appeared, but its start failed: {text}",
                        render_exception(exc),
                    )
                    return
                self.changed()
            elif not self.applied:
                self.waiting_for = missing
                self.changed()

    def timeout(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        if not callable(fn):
            raise TypeError("ctx.timer.timeout needs a callable")
        handle = self.loop.call_later(max(0.0, float(ms)) / 1000, self._guarded, fn)
        self.disposers.append(handle.cancel)
        return handle.cancel

    def interval(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        if not callable(fn):
            raise TypeError("ctx.timer.interval needs a callable")
        period = max(0.001, float(ms) / 1000)
        state: dict[str, asyncio.TimerHandle] = {}

        def tick() -> None:
            state["handle"] = self.loop.call_later(period, tick)
            self._guarded(fn)

        state["handle"] = self.loop.call_later(period, tick)

        def cancel() -> None:
            state["handle"].cancel()

        self.disposers.append(cancel)
        return cancel

    def throttle(self, fn: Callable[..., Any], ms: float) -> Callable[..., None]:
        """A function that calls ``fn`` at once, then at most once per ``ms``: calls inside a
        window are folded into one at its end, with the last call's arguments."""
        if not callable(fn):
            raise TypeError("ctx.timer.throttle needs a callable")
        period = max(0.0, float(ms)) / 1000
        window: list[asyncio.TimerHandle] = []  # the open window's end, if any
        pending: list[tuple[Any, ...]] = []  # the arguments of the call folded into its end
        stopped: list[bool] = []

        def window_ends() -> None:
            window.clear()
            if pending:
                throttled(*pending.pop())

        def throttled(*args: Any) -> None:
            if stopped:
                return
            if window:
                pending[:] = [args]
                return
            window.append(self.loop.call_later(period, window_ends))
            self._guarded(lambda: fn(*args))

        def cancel() -> None:
            stopped.append(True)
            pending.clear()
            for handle in window:
                handle.cancel()

        self.disposers.append(cancel)
        return throttled

    def debounce(self, fn: Callable[..., Any], ms: float) -> Callable[..., None]:
        """A function that calls ``fn`` once ``ms`` after the last of a burst of calls, with
        that call's arguments."""
        if not callable(fn):
            raise TypeError("ctx.timer.debounce needs a callable")
        delay = max(0.0, float(ms)) / 1000
        waiting: list[asyncio.TimerHandle] = []
        stopped: list[bool] = []

        def debounced(*args: Any) -> None:
            if stopped:
                return
            for handle in waiting:
                handle.cancel()
            waiting[:] = [self.loop.call_later(delay, self._guarded, lambda: fn(*args))]

        def cancel() -> None:
            stopped.append(True)
            for handle in waiting:
                handle.cancel()

        self.disposers.append(cancel)
        return debounced

    def _guarded(self, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
            if inspect.isawaitable(result):
                self.loop.create_task(self._awaited(result))
        except Exception as exc:
            self.log(f"timer callback failed: {render_exception(exc)}")

    async def _awaited(self, awaitable: Any) -> None:
        try:
            await awaitable
        except Exception as exc:
            self.log(f"timer callback failed: {render_exception(exc)}")

    # -- start -------------------------------------------------------------------------------
    async def evaluate(self) -> object:
        """The plugin the host half returns (``failed`` frames for what it cannot be)."""
        code = compile_program(self.source)
        namespace: dict[str, Any] = {
            "__builtins__": self.builtins(),
            "__name__": "__cordis__",
            "harness": _Harness(self),
        }
        exec(code, namespace)
        result = await namespace.pop("__program__")()
        if result is None:
            raise _LoadError(MISSING_RETURN)
        plugin = result[0]
        if plugin is None:
            raise _LoadError(MISSING_RETURN)
        if not (callable(plugin) or callable(getattr(plugin, "apply", None))):
            raise _LoadError(WRONG_RETURN)
        return plugin

    def builtins(self) -> dict[str, Any]:
        names = dict(vars(builtins))

        def host_print(
            *args: object, sep: str | None = " ", end: str | None = "\n", **_: object
        ) -> None:
            text = (" " if sep is None else sep).join(str(arg) for arg in args)
            self.log(text + ("\n" if end is None else end))

        names["print"] = host_print
        return names

    async def apply(self, plugin: object) -> None:
        inject = getattr(plugin, "inject", ())
        if type(inject) not in (list, tuple) or not all(type(name) is str for name in inject):
            raise TypeError("`inject` must be a list of service names")
        self.plugin = plugin
        self.inject = tuple(inject)
        async with self.transition:
            missing = self.missing()
            if missing:
                self.waiting_for = missing  # parked: counts as a successful activation
                return
            await self.apply_now()

    async def apply_now(self) -> None:
        self.waiting_for = []
        ctx = _Context(self, frozenset(self.inject))
        apply = getattr(self.plugin, "apply", self.plugin)
        assert callable(apply)  # evaluate() checked it
        self.applied = True
        outcome = apply(ctx)
        if inspect.isawaitable(outcome):
            await outcome

    async def start(self) -> bool:
        load_late = f"the Host half did not finish within {self.start_timeout_s:g} s"
        apply_late = f"the Plugin did not start within {self.start_timeout_s:g} s"
        try:
            with _deadline(self.start_timeout_s, "host-load", load_late):
                plugin = await asyncio.wait_for(self.evaluate(), self.start_timeout_s)
        except _StartTimeout as exc:
            self.fail(exc.phase, exc.text)
        except TimeoutError:
            self.fail("host-load", load_late)
            return False
        except _LoadError as exc:
            self.fail("host-load", str(exc))
            return False
        except SyntaxError as exc:
            self.fail("host-load", _syntax_text(exc, self.source))
            return False
        except Exception as exc:
            self.fail("host-load", str(exc) or type(exc).__name__, render_exception(exc))
            return False
        try:
            with _deadline(self.start_timeout_s, "host-apply", apply_late):
                await asyncio.wait_for(self.apply(plugin), self.start_timeout_s)
        except (TimeoutError, _StartTimeout):
            await self.dispose()
            self.fail("host-apply", apply_late)
            return False
        except Exception as exc:
            await self.dispose()  # a plugin whose start throws is disposed first
            self.fail("host-apply", str(exc) or type(exc).__name__, render_exception(exc))
            return False
        self.started = True
        self.channel.send({"t": "started", "regs": self.registrations()})
        return True

    def fail(self, phase: str, message: str, stack: str = "") -> NoReturn:
        message = ledger.fit_prefix(ledger.valid_text(message), self.max_output)
        stack = ledger.fit_prefix(ledger.valid_text(stack), self.max_output)
        finish(self.channel, {"t": "failed", "phase": phase, "message": message, "stack": stack})

    # -- serving -----------------------------------------------------------------------------
    def on_readable(self) -> None:
        data = self.channel.receive()
        if data is None:
            return
        if not data:
            os._exit(0)  # the runtime closed the channel: the plugin host is over
        for payload in self.channel.frames.feed(data):
            try:
                message = json.loads(payload)
            except ValueError:
                continue
            if type(message) is not dict:
                continue
            kind = message.get("t")
            if kind == "invoke" and type(message.get("id")) is int:
                handler = message.get("handler")
                if type(handler) is str and handler:
                    self.invoke_handler(message["id"], handler, message.get("args"))
                elif message.get("event"):
                    self.deliver(message["id"], str(message["event"]), message.get("args"))
                elif message.get("service"):
                    self.serve(
                        message["id"],
                        str(message["service"]),
                        message.get("name"),
                        message.get("args"),
                    )
                else:
                    self.invoke(message["id"], message.get("name"), message.get("args"))
            elif kind == "call_result":
                self.call_answered(message)
            elif kind == "services":
                try:
                    raw = flatwire.decode(message.get("services"))
                except flatwire.WireError:
                    continue
                self.loop.create_task(self.services_changed(raw))
            elif kind == "cancel":
                task = self.invocations.get(message.get("id"))  # type: ignore[arg-type]
                if task is not None:
                    task.cancel()
            elif kind == "retract" and not self.retracting:
                self.retracting = True
                self.loop.create_task(self.retract())

    def invoke(self, invocation: int, name: object, tokens: object) -> None:
        tool = self.tools.get(name) if type(name) is str else None
        if tool is None or self.retracting:
            self.reply(invocation, False, f'the plugin has no tool "{name}"')
            return
        try:
            args = flatwire.decode(tokens)
        except flatwire.WireError:
            self.reply(invocation, False, "tool arguments must be lossless JSON")
            return
        what = f'tool "{tool.name}"'
        work = self.run_tool(
            invocation, what, tool.execute, args, presentation_meta=tool.presentation_meta
        )
        self.track(invocation, work)

    def serve(self, invocation: int, service: str, method: object, tokens: object) -> None:
        """Another plugin of the owner calls a method of a service this one provides."""
        value = self.provides.get(service)
        fn = method_of(value, method) if value is not None and type(method) is str else None
        if fn is None or self.retracting:
            self.reply(invocation, False, f'service "{service}" has no method "{method}"')
            return
        try:
            args = flatwire.decode(tokens)
        except flatwire.WireError:
            args = None
        if type(args) is not list:
            self.reply(invocation, False, "service arguments must be a JSON array")
            return
        label = f'service "{service}".{method}'
        work = self.run_tool(invocation, label, lambda a: fn(*a), args, service=service)
        self.track(invocation, work)

    def deliver(self, invocation: int, event: str, tokens: object) -> None:
        try:
            payload = flatwire.decode(tokens)
        except flatwire.WireError:
            self.reply(invocation, False, "event payloads must be lossless JSON")
            return
        if self.retracting:
            self.reply(invocation, False, "the plugin is stopping")
            return

        async def listeners(_payload: object) -> None:
            await self.emit(event, payload)

        self.track(invocation, self.run_tool(invocation, f'event "{event}"', listeners, None))

    def track(self, invocation: int, work: Any) -> None:
        task = self.loop.create_task(work)
        self.invocations[invocation] = task
        task.add_done_callback(lambda _: self.invocations.pop(invocation, None))

    def invoke_handler(self, invocation: int, method: str, tokens: object) -> None:
        """A page's `invoke` of a `harness.handle` handler."""
        handler = self.handlers.get(method)
        if handler is None or self.retracting:
            self.channel.send(
                {
                    "t": "result",
                    "id": invocation,
                    "ok": False,
                    "message": f'the plugin has no handler "{method}"',
                    "notFound": True,
                }
            )
            return
        try:
            args = flatwire.decode(tokens)
        except flatwire.WireError:
            self.reply(invocation, False, "handler arguments must be lossless JSON")
            return
        what = f'handler "{method}"'
        self.track(invocation, self.run_tool(invocation, what, handler, args, with_stack=True))

    async def run_tool(
        self,
        invocation: int,
        what: str,
        execute: Callable[[Any], Any],
        args: object,
        *,
        service: str = "",
        presentation_meta: Callable[[Any, Any], Any] | None = None,
        with_stack: bool = False,
    ) -> None:
        """Runs a tool, a service method, an event's listeners or (`with_stack`: its failure
        carries the traceback, for the page) a `harness.handle` handler, and sends the result."""
        meta: object = _NO_META
        try:
            value = execute(args)
            if inspect.isawaitable(value):
                value = await value
            if presentation_meta is not None:
                # Given a copy: the card's metadata cannot change the value sent.
                meta = presentation_meta(args, flatwire.decode(flatwire.encode(value)))
                if inspect.isawaitable(meta):
                    meta = await meta
        except asyncio.CancelledError:
            self.reply(invocation, False, "the call was cancelled", cancelled=True)
            return
        except MemoryError:
            # As for a program: the host's state cannot be trusted after it, the host ends.
            os._exit(framing.EXIT_OUT_OF_MEMORY)
        except Exception as exc:
            if not with_stack:
                self.reply(invocation, False, str(exc) or type(exc).__name__)
                return
            message = ledger.fit_prefix(
                ledger.valid_text(str(exc) or type(exc).__name__), self.max_output
            )
            stack = ledger.fit_prefix(ledger.valid_text(render_exception(exc)), self.max_output)
            self.channel.send(
                {"t": "result", "id": invocation, "ok": False, "message": message, "stack": stack}
            )
            return
        if service and isinstance(value, _Context):
            self.reply(invocation, False, context_returned(service))
            return
        self.send_value(invocation, what, value, meta)

    def send_value(
        self, invocation: int, what: str, value: object, meta: object = _NO_META
    ) -> None:
        """The successful result frame; `meta` (unless `_NO_META`) is the tool's presentation
        metadata, which must be a lossless dict."""
        try:
            tokens = flatwire.encode(value)
        except (flatwire.WireError, ValueError, TypeError):
            self.reply(invocation, False, f"the result of {what} {LOSSY}")
            return
        if not ledger.OutputLedger(self.max_output).fits_value(value):
            self.reply(
                invocation,
                False,
                f"the result exceeds the output budget of {self.max_output} bytes",
            )
            return
        frame: dict[str, object] = {"t": "result", "id": invocation, "ok": True, "value": tokens}
        if meta is not _NO_META:
            try:
                if type(meta) is not dict:
                    raise TypeError
                frame["meta"] = flatwire.encode(meta)
            except (flatwire.WireError, ValueError, TypeError):
                self.reply(
                    invocation,
                    False,
                    f"the presentation_meta of {what} must return a dict that {LOSSY}",
                )
                return
        self.channel.send(frame)

    def reply(self, invocation: int, ok: bool, message: str, *, cancelled: bool = False) -> None:
        message = ledger.fit_prefix(ledger.valid_text(message), self.max_output)
        frame: dict[str, object] = {"t": "result", "id": invocation, "ok": ok, "message": message}
        if cancelled:
            frame["cancelled"] = True
        self.channel.send(frame)

    async def dispose(self) -> None:
        for task in list(self.invocations.values()):
            if task is not asyncio.current_task():
                task.cancel()
        others = [t for t in self.invocations.values() if t is not asyncio.current_task()]
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        for future in self.calls.values():  # its own calls of other plugins' services
            if not future.done():
                future.set_exception(RuntimeError("the plugin was disposed"))
        while self.disposers:  # reverse order of registration
            disposer = self.disposers.pop()
            try:
                outcome = disposer()
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception as exc:
                self.log(f"a disposer failed: {render_exception(exc)}")

    async def retract(self) -> None:
        async with self.transition:
            if self.applied:
                await self.emit("plugin/dispose", {"reason": "stop"})
            await self.dispose()
        finish(self.channel, {"t": "retracted"})


class _Listener:
    """One ``ctx.on``/``ctx.once`` registration (compared by identity)."""

    __slots__ = ("fn", "once")

    def __init__(self, fn: Callable[[Any], Any], once: bool) -> None:
        self.fn = fn
        self.once = once


def _services(raw: object) -> dict[str, dict[str, Any]]:
    """The services the runtime says other plugins provide, by name (rebuilt field by field)."""
    out: dict[str, dict[str, Any]] = {}
    for item in raw if type(raw) is list else []:
        if type(item) is not dict or type(item.get("name")) is not str or item["name"] in out:
            continue
        methods = item.get("methods")
        data = item.get("data")
        out[item["name"]] = {
            "methods": [m for m in methods if type(m) is str] if type(methods) is list else [],
            "data": data if type(data) is str else "",
        }
    return out


class _StartTimeout(BaseException):
    """The start ran past its time while busy (a loop that never awaits): raised by SIGALRM
    between two bytecodes, which ``asyncio.wait_for`` cannot do. A BaseException, so the host
    half's own ``except Exception`` does not swallow it."""

    def __init__(self, phase: str, text: str) -> None:
        super().__init__(text)
        self.phase = phase
        self.text = text


@contextlib.contextmanager
def _deadline(seconds: float, phase: str, text: str) -> Iterator[None]:
    """Interrupts the code inside after ``seconds`` of wall time, busy or not."""

    def expired(_signum: int, _frame: object) -> None:
        raise _StartTimeout(phase, text)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _LoadError(Exception):
    """The host half evaluated to something that is not a plugin."""


class _ReadOnly:
    """A façade object of the host half's: holds the host, refuses every assignment."""

    __slots__ = ("_host",)
    _host: _Host
    _what = "the object"  # how the refusal names it

    def __init__(self, host: _Host) -> None:
        object.__setattr__(self, "_host", host)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f'{self._what} is read-only; cannot assign "{name}"')


class _Harness(_ReadOnly):
    """``harness`` in the host half's globals."""

    __slots__ = ()
    _what = "harness"

    def define_tool(self, *args: Any, **kwargs: Any) -> _ToolDefinition:
        return self._host.define_tool(*args, **kwargs)

    def register_tool(self, tool: object) -> Callable[[], None]:
        return self._host.register_tool(tool)

    def handle(self, method: object, fn: object) -> Callable[[], None]:
        return self._host.handle(method, fn)


class _Tools(_ReadOnly):
    """``ctx.tools``: schema views of the owner's tools, and registration. Never executable."""

    __slots__ = ()
    _what = "ctx.tools"

    def schemas(self) -> list[dict[str, Any]]:
        return flatwire.decode(flatwire.encode(self._host.visible))  # type: ignore[return-value]

    def get(self, name: str) -> dict[str, Any] | None:
        for item in self._host.visible:
            if item.get("name") == name:
                return flatwire.decode(flatwire.encode(item))  # type: ignore[return-value]
        return None

    def register(self, tool: object) -> Callable[[], None]:
        return self._host.register_tool(tool)


class _Timer(_ReadOnly):
    """``ctx.timer``, the built-in injectable service: everything it schedules is disposed with
    the plugin. ``setTimeout``/``setInterval`` are the same as ``timeout``/``interval``."""

    __slots__ = ()
    _what = "the timer service"

    def timeout(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        return self._host.timeout(fn, ms)

    def interval(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        return self._host.interval(fn, ms)

    def setTimeout(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        return self._host.timeout(fn, ms)

    def setInterval(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        return self._host.interval(fn, ms)

    def throttle(self, fn: Callable[..., Any], ms: float) -> Callable[..., None]:
        return self._host.throttle(fn, ms)

    def debounce(self, fn: Callable[..., Any], ms: float) -> Callable[..., None]:
        return self._host.debounce(fn, ms)


class _Context(_ReadOnly):
    """The plugin's ``ctx``: read-only, exposing only the façade (``host_facade.json``)."""

    __slots__ = ("_injected", "_tools")
    _what = "sandbox ctx"
    _injected: frozenset[str]
    _tools: _Tools

    def __init__(self, host: _Host, injected: frozenset[str]) -> None:
        super().__init__(host)
        object.__setattr__(self, "_injected", injected)
        object.__setattr__(self, "_tools", _Tools(host))

    @property
    def tools(self) -> _Tools:
        return self._tools

    def get(self, name: str) -> object:
        """A service by name without declaring it: its own, else another plugin's, else None."""
        if name in self._host.provides:
            return self._host.provides[name]
        return self._host.service(name)

    def effect(self, fn: object) -> None:
        self._host.effect(fn)

    def provide(self, name: object, value: object) -> None:
        self._host.provide(name, value)

    def on(self, event: object, listener: object) -> Callable[[], None]:
        return self._host.on(event, listener, once=False)

    def once(self, event: object, listener: object) -> Callable[[], None]:
        return self._host.on(event, listener, once=True)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)  # protocols (copy, pickle) probe these: not services
        if name == "timer":
            if "timer" in self._injected:
                return _Timer(self._host)
            raise AttributeError(not_injected("timer"))
        if name in self._injected:
            service = self._host.service(name)
            if service is not None:
                return service
            raise AttributeError(f'service "{name}" is not available right now')
        if name in self._host.available or name in self._host.provides:
            raise AttributeError(not_injected(name))
        raise AttributeError(f'sandbox ctx does not expose "{name}"')


def _syntax_text(exc: SyntaxError, source: str) -> str:
    """The parse error with the offending line and a caret."""
    line_no = exc.lineno or 1
    lines = source.splitlines()
    line = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
    caret = " " * max(0, (exc.offset or 1) - 1) + "^"
    text = f"SyntaxError: {exc.msg} (line {line_no})\n{line}\n{caret}"
    if " as " in line or (": " in line and "=" in line):
        text += (
            "\nHint: write plain Python; type annotations on assignments are fine, casts are not."
        )
    return text


def serve_host(
    channel: Channel, loop: asyncio.AbstractEventLoop, start: dict[str, Any]
) -> NoReturn:
    """Run the plugin host until it is retracted (then wait to be killed)."""
    host = _Host(channel, loop, start)
    sys.stdout = sys.stderr = _LogWriter(host)
    channel.watch(loop, host.on_readable)  # instead of the program worker's reader
    try:
        if loop.run_until_complete(host.start()):
            loop.run_forever()  # until retract finishes (finish() never returns)
    except _StartTimeout as exc:  # it struck inside the event loop's own code
        host.fail(exc.phase, exc.text)
    except MemoryError:
        os._exit(framing.EXIT_OUT_OF_MEMORY)
    os._exit(0)


class _LogWriter(io.TextIOBase):
    """Raw writes to sys.stdout/stderr become logs, like print."""

    def __init__(self, host: _Host) -> None:
        super().__init__()
        self.host = host

    def write(self, text: str) -> int:
        if text:
            self.host.log(text)
        return len(text)


_ = PROGRAM_FILENAME  # tracebacks show the host half's frames under the program's file name
