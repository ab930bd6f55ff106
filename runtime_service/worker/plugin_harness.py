"""A Cordis plugin host inside a worker: evaluate a host half, apply its plugin, serve its tools.

Entered from ``bootstrap.serve`` when the first message is ``{"t": "host", ...}`` instead of a
program's ``start``: the same fresh, sandboxed, never-used worker, which then lives until the
runtime retracts the plugin (or kills it). Reference §9.6 in Python's style:

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
  (``timeout``/``interval``, each disposed on retract). A plugin that injects any other service
  parks ``waiting`` (services between plugin hosts are not routed yet: it never starts);
- retract cancels running invocations and timers, then runs the disposers in reverse order.

Frames, runtime -> worker: ``host`` (once), ``invoke {id, name, args}`` (a tool) or ``invoke
{id, handler, args}`` (a ``harness.handle`` handler, a page's ``invoke``), ``cancel {id}``,
``retract``. Worker -> runtime: ``log``, ``started {regs}`` or ``failed {phase, message,
stack}``, ``regs {regs}`` (a change), ``result {id, ok, value | message [, stack, notFound]}``,
``retracted``.
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
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from runtime_service.worker import flatwire, framing, ledger
from runtime_service.worker.bootstrap import (
    PROGRAM_FILENAME,
    Channel,
    compile_program,
    finish,
    render_exception,
)

__all__ = ["serve_host"]

LOSSY = (
    "must be lossless JSON data (dicts with str keys, lists, str, int, float, bool, None) -- "
    "not a class instance, function, set, tuple, bytes, NaN or infinity"
)
NOT_A_DEFINITION = "dynamic tool registration must use a tool returned by harness.define_tool(...)"
MISSING_RETURN = "the Host half returned `None` -- did you forget `return`?"
WRONG_RETURN = "the Host half must return a Plugin function or an object with apply(ctx)"


class _ToolDefinition:
    """What ``harness.define_tool`` returns; only these may be registered (the marker)."""

    __slots__ = ("description", "execute", "input_schema", "name", "output_schema")

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: object,
        output_schema: object,
        execute: Callable[..., Any],
    ) -> None:
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
        self.waiting_for: list[str] = []
        self.disposers: list[Callable[[], Any]] = []
        self.invocations: dict[int, asyncio.Task[None]] = {}
        self.started = False
        self.retracting = False

    # -- output ------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        text = ledger.valid_text(f"[cordis:{self.plugin_id}] {text}")
        if ledger.json_string_size(text) > self.max_output:
            text = ledger.fit_prefix(text, self.max_output)
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
    ) -> _ToolDefinition:
        if type(name) is not str or not name:
            raise TypeError("harness.define_tool needs a non-empty str `name`")
        if type(description) is not str:
            raise TypeError("harness.define_tool `description` must be a str")
        if not callable(execute):
            raise TypeError("harness.define_tool needs a callable `execute(args)`")
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
        self.provides[name] = value
        self.disposers.append(lambda: self.provides.pop(name, None))
        self.changed()

    def timeout(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        handle = self.loop.call_later(max(0.0, float(ms)) / 1000, self._guarded, fn)
        self.disposers.append(handle.cancel)
        return handle.cancel

    def interval(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
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
        missing = [name for name in inject if name != "timer"]
        if missing:
            self.waiting_for = missing  # parked: counts as a successful activation
            return
        ctx = _Context(self, frozenset(inject))
        apply = getattr(plugin, "apply", plugin)
        assert callable(apply)  # evaluate() checked it
        outcome = apply(ctx)
        if inspect.isawaitable(outcome):
            await outcome

    async def start(self) -> bool:
        try:
            plugin = await asyncio.wait_for(self.evaluate(), self.start_timeout_s)
        except TimeoutError:
            self.fail(
                "host-load", f"the Host half did not finish within {self.start_timeout_s:g} s"
            )
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
            await asyncio.wait_for(self.apply(plugin), self.start_timeout_s)
        except TimeoutError:
            await self.dispose()
            self.fail("host-apply", f"the Plugin did not start within {self.start_timeout_s:g} s")
            return False
        except Exception as exc:
            await self.dispose()  # a plugin whose start throws is disposed first
            self.fail("host-apply", str(exc) or type(exc).__name__, render_exception(exc))
            return False
        self.started = True
        self.channel.send({"t": "started", "regs": self.registrations()})
        return True

    def fail(self, phase: str, message: str, stack: str = "") -> None:
        message = ledger.fit_prefix(ledger.valid_text(message), self.max_output)
        stack = ledger.fit_prefix(ledger.valid_text(stack), self.max_output)
        finish(self.channel, {"t": "failed", "phase": phase, "message": message, "stack": stack})

    # -- serving -----------------------------------------------------------------------------
    def on_readable(self) -> None:
        data = self.channel.sock.recv(1 << 16)
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
                else:
                    self.invoke(message["id"], message.get("name"), message.get("args"))
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
        task = self.loop.create_task(self.run_tool(invocation, tool, args))
        self.invocations[invocation] = task
        task.add_done_callback(lambda _: self.invocations.pop(invocation, None))

    def invoke_handler(self, invocation: int, method: str, tokens: object) -> None:
        """A page's `invoke` of a `harness.handle` handler (reference §9.6)."""
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
        task = self.loop.create_task(self.run_handler(invocation, method, handler, args))
        self.invocations[invocation] = task
        task.add_done_callback(lambda _: self.invocations.pop(invocation, None))

    async def run_handler(
        self, invocation: int, method: str, handler: Callable[..., Any], args: object
    ) -> None:
        try:
            value = handler(args)
            if inspect.isawaitable(value):
                value = await value
        except asyncio.CancelledError:
            self.reply(invocation, False, "the call was cancelled")
            return
        except MemoryError:
            os._exit(framing.EXIT_OUT_OF_MEMORY)
        except Exception as exc:
            message = ledger.fit_prefix(
                ledger.valid_text(str(exc) or type(exc).__name__), self.max_output
            )
            stack = ledger.fit_prefix(ledger.valid_text(render_exception(exc)), self.max_output)
            self.channel.send(
                {"t": "result", "id": invocation, "ok": False, "message": message, "stack": stack}
            )
            return
        self.send_value(invocation, f'handler "{method}"', value)

    async def run_tool(self, invocation: int, tool: _ToolDefinition, args: object) -> None:
        try:
            value = tool.execute(args)
            if inspect.isawaitable(value):
                value = await value
        except asyncio.CancelledError:
            self.reply(invocation, False, "the call was cancelled")
            return
        except MemoryError:
            # As for a program: the host's state cannot be trusted after it, the host ends.
            os._exit(framing.EXIT_OUT_OF_MEMORY)
        except Exception as exc:
            self.reply(invocation, False, str(exc) or type(exc).__name__)
            return
        self.send_value(invocation, f'tool "{tool.name}"', value)

    def send_value(self, invocation: int, what: str, value: object) -> None:
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
        self.channel.send({"t": "result", "id": invocation, "ok": True, "value": tokens})

    def reply(self, invocation: int, ok: bool, message: str) -> None:
        message = ledger.fit_prefix(ledger.valid_text(message), self.max_output)
        self.channel.send({"t": "result", "id": invocation, "ok": ok, "message": message})

    async def dispose(self) -> None:
        for task in list(self.invocations.values()):
            task.cancel()
        if self.invocations:
            await asyncio.gather(*self.invocations.values(), return_exceptions=True)
        while self.disposers:  # reverse order of registration
            disposer = self.disposers.pop()
            try:
                outcome = disposer()
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception as exc:
                self.log(f"a disposer failed: {render_exception(exc)}")

    async def retract(self) -> None:
        await self.dispose()
        finish(self.channel, {"t": "retracted"})


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
    __slots__ = ()
    _what = "the timer service"

    def timeout(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        return self._host.timeout(fn, ms)

    def interval(self, fn: Callable[[], Any], ms: float) -> Callable[[], None]:
        return self._host.interval(fn, ms)


class _Context(_ReadOnly):
    """The plugin's ``ctx``: read-only, exposing only the façade (reference §9.6)."""

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
        return self._host.provides.get(name)

    def effect(self, fn: object) -> None:
        self._host.effect(fn)

    def provide(self, name: object, value: object) -> None:
        self._host.provide(name, value)

    def __getattr__(self, name: str) -> object:
        if name == "timer":
            if "timer" in self._injected:
                return _Timer(self._host)
            raise AttributeError(
                'service "timer" is not injected. Declare it: inject = ["timer"] on the plugin'
            )
        raise AttributeError(f'sandbox ctx does not expose "{name}"')


def _syntax_text(exc: SyntaxError, source: str) -> str:
    """The parse error with the offending line and a caret (reference §9.6)."""
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
    with contextlib.suppress(KeyError):
        loop.remove_reader(channel.sock.fileno())  # the program worker's reader, if any
    loop.add_reader(channel.sock.fileno(), host.on_readable)
    try:
        if loop.run_until_complete(host.start()):
            loop.run_forever()  # until retract finishes (finish() never returns)
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
