"""The program runner of a worker: one program, its ``tools`` namespace, its output, its outcome.

Handed the worker by the entry point (``bootstrap.serve``) when the first message is a
program's ``start``; what it shares with the plugin harness (the channel, compilation,
rendering of exceptions, the last message) is in ``core.py``.

Stdlib only. It runs model code in its own process and trusts nothing it does; the runtime, in
turn, treats everything this process sends as hostile.
"""

from __future__ import annotations

import asyncio
import builtins
import difflib
import json
import linecache
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from runtime_service.worker import flatwire, framing, ledger
from runtime_service.worker.core import (
    PROGRAM_FILENAME,
    Channel,
    compile_program,
    finish,
    render_exception,
)

__all__ = [
    "EXIT_OUT_OF_MEMORY",
    "LOSSY_ARGUMENTS",
    "NO_ARGUMENTS",
    "ToolCallError",
    "Worker",
    "make_tools",
    "missing_binding",
    "prewarm",
    "prewarm_fork_server",
    "warm_loop",
]

EXIT_OUT_OF_MEMORY = framing.EXIT_OUT_OF_MEMORY
# The program's view of arguments it cannot send: the same texts as the registry's (bridge.py).
LOSSY_ARGUMENTS = framing.LOSSY_ARGUMENTS
NO_ARGUMENTS = f"{LOSSY_ARGUMENTS} (call the tool with an arguments object, e.g. `{{}}`)"
_NOTHING = object()  # a binding called without its arguments object


class ToolCallError(Exception):
    """A binding call failed: ``toolName`` names the binding, ``message`` says why."""

    def __init__(self, message: str, toolName: str) -> None:
        super().__init__(message)
        self.message = message
        self.toolName = toolName

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.toolName))


# Rendered as ``ToolCallError: ...`` in tracebacks, like a builtin.
ToolCallError.__module__ = "builtins"


class LogSink:
    """Turns program output into log messages, pre-checked against the output ledger."""

    def __init__(self, channel: Channel, max_bytes: int) -> None:
        self.channel = channel
        self.ledger = ledger.OutputLedger(max_bytes)

    def emit(self, text: str) -> None:
        text = ledger.valid_text(text)  # as the runtime will charge it (lone surrogates: U+FFFD)
        room = self.ledger.remaining_for_entry()
        if ledger.json_string_size(text) <= room:
            self.ledger.admit_log(text)
            self.channel.send({"t": "log", "text": text})
            return
        # Send only what can still fit, then let the runtime settle output-limit.
        prefix = ledger.fit_prefix(text, room)
        if prefix:
            self.channel.send({"t": "log", "text": prefix})
        finish(self.channel, {"t": "output-limit"})


class LogStream:
    """``sys.stdout``/``sys.stderr`` replacement: each ``write`` is one log entry."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, sink: LogSink, name: str) -> None:
        self._sink = sink
        self.name = name

    def write(self, text: str) -> int:
        if type(text) is not str:
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self._sink.emit(text)
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("log streams have no file descriptor")


def make_print(sink: LogSink, streams: tuple[LogStream, ...]) -> Callable[..., None]:
    original = builtins.print

    def print(*args: object, sep: str | None = " ", end: str | None = "\n", file: Any = None,
              flush: bool = False) -> None:  # fmt: skip
        if file is not None and file not in streams:
            original(*args, sep=sep, end=end, file=file, flush=flush)
            return
        sep = " " if sep is None else sep
        end = "\n" if end is None else end
        text = sep.join(str(arg) for arg in args)
        # One print call is one log line; a custom ``end`` is kept verbatim.
        sink.emit(text if end == "\n" else text + end)

    return print


def make_tools(names: list[str], call: Callable[[str, object], Any]) -> object:
    """The ``tools`` namespace: own bindings only, by attribute or by subscript."""
    bindings: dict[str, Callable[[object], Any]] = {}
    for name in names:
        bindings[name] = _binding(name, call)

    class Tools:
        __slots__ = ()

        def __getattr__(self, name: str) -> Callable[[object], Any]:
            try:
                return bindings[name]
            except KeyError:
                raise AttributeError(missing_binding(name, bindings)) from None

        def __getitem__(self, name: str) -> Callable[[object], Any]:
            if type(name) is not str or name not in bindings:
                shown = name if type(name) is str else repr(name)
                raise KeyError(missing_binding(shown, bindings)) from None
            return bindings[name]

        def __contains__(self, name: object) -> bool:
            return type(name) is str and name in bindings

        def __dir__(self) -> list[str]:
            return sorted(bindings)

        def __repr__(self) -> str:
            return f"<tools: {', '.join(sorted(bindings))}>"

    Tools.__name__ = Tools.__qualname__ = "Tools"
    return Tools()


# What a missing binding's message shows: the same rule and words as the TypeScript worker's
# (worker_ts/program.js), bounded however many bindings there are or however long the name.
_LISTED_BINDINGS = 20
_SHOWN_NAME_CHARS = 100
_COMPARED_NAME_CHARS = 200


def missing_binding(name: str, bindings: Iterable[str]) -> str:
    """``tools has no binding 'x' (did you mean 'y'?); bindings: a, b, y``"""
    names = sorted(bindings)
    shown = name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "…"
    text = f"tools has no binding '{shown}'"
    if not names:
        return text + "; this program has no bindings"
    if len(name) <= _COMPARED_NAME_CHARS:
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            text += f" (did you mean '{close[0]}'?)"
    text += "; bindings: " + ", ".join(names[:_LISTED_BINDINGS])
    if len(names) > _LISTED_BINDINGS:
        text += f" and {len(names) - _LISTED_BINDINGS} more"
    return text


def _binding(name: str, call: Callable[[str, object], Any]) -> Callable[[object], Any]:
    def binding(args: object = _NOTHING) -> Any:
        return call(name, args)

    binding.__name__ = binding.__qualname__ = name
    return binding


class Worker:
    """One program run inside this process.

    Built, and its channel reader registered with the loop, before the worker reports ready:
    those first uses cost far more in a process idle since boot than warm, so only what the
    start message decides (``begin``) is left for the program's own time.
    """

    sink: LogSink  # set by ``begin``

    def __init__(self, channel: Channel, loop: asyncio.AbstractEventLoop) -> None:
        self.channel = channel
        self.loop = loop
        self.program = ""
        self.names: list[str] = []
        self.pending: dict[int, tuple[asyncio.Future[Any], str]] = {}
        self.next_id = 1
        asyncio.set_event_loop(loop)
        channel.watch(loop, self.on_readable)

    def begin(self, start: dict[str, Any]) -> None:
        self.program = str(start["program"])
        self.names = [str(name) for name in start["bindings"]]
        self.sink = LogSink(self.channel, int(start["max_output_bytes"]))

    # -- bindings ---------------------------------------------------------------------------
    def call(self, name: str, args: object) -> asyncio.Future[Any]:
        # Refused before an id is allocated: a refused call takes no sub-call number.
        if args is _NOTHING:
            raise ToolCallError(NO_ARGUMENTS, name)
        call_id = self.next_id
        try:
            tokens = flatwire.encode(args)
            # Framed here, before the id is taken: framing refuses what the wire cannot carry
            # (an integer beyond int_max_str_digits, a frame over the size cap).
            frame = framing.pack(
                {"t": "call", "id": call_id, "name": name, "args": tokens}, raw="args"
            )
        except (flatwire.WireError, ValueError) as exc:
            raise ToolCallError(f"{LOSSY_ARGUMENTS}: {exc}", name) from None
        self.next_id += 1
        future: asyncio.Future[Any] = self.loop.create_future()
        self.pending[call_id] = (future, name)
        self.channel.queue(frame, self.loop)  # with the other calls of this loop turn
        return future

    def on_readable(self) -> None:
        data = self.channel.receive()
        if data is None:
            return
        if not data:
            os._exit(0)  # the runtime closed the channel: the run is over
        for payload in self.channel.frames.feed(data):
            # The runtime's own compact output: the plain C parser is enough here (values
            # inside are flat token lists, still decoded and validated below).
            try:
                message, _ = framing.unpack(payload, json.loads)
            except ValueError:
                continue
            if type(message) is dict and message.get("t") == "reply":
                self.on_reply(message)

    def on_reply(self, message: dict[str, Any]) -> None:
        call_id = message.get("id")
        entry = self.pending.pop(call_id, None) if type(call_id) is int else None
        if entry is None or entry[0].done():
            return
        future, name = entry
        if message.get("ok") is True:
            try:
                future.set_result(flatwire.decode(message.get("value")))
            except flatwire.WireError:
                future.set_exception(
                    ToolCallError("binding resolution must be lossless JSON", name)
                )
        else:
            text = message.get("message")
            future.set_exception(ToolCallError(text if type(text) is str else "failed", name))

    # -- the program ------------------------------------------------------------------------
    def run(self) -> NoReturn:
        out = LogStream(self.sink, "<stdout>")
        err = LogStream(self.sink, "<stderr>")
        sys.stdout = out
        sys.stderr = err
        program_builtins = dict(vars(builtins))
        program_builtins["print"] = make_print(self.sink, (out, err))
        try:
            outcome = self.loop.run_until_complete(self.execute(program_builtins))
        except MemoryError:
            os._exit(EXIT_OUT_OF_MEMORY)
        finish(self.channel, outcome)

    async def execute(self, program_builtins: dict[str, Any]) -> dict[str, object] | bytes:
        try:
            code = compile_program(self.program)
        except (SyntaxError, ValueError) as exc:
            return self.failure("exception", render_exception(exc))
        linecache.cache[PROGRAM_FILENAME] = (
            len(self.program),
            None,
            self.program.splitlines(True),
            PROGRAM_FILENAME,
        )
        namespace: dict[str, Any] = {
            "__builtins__": program_builtins,
            "__name__": "__program__",
            "tools": make_tools(self.names, self.call),
            "ToolCallError": ToolCallError,
        }
        try:
            exec(code, namespace)  # defines __program__ only
            main = namespace.pop("__program__")
            result = await main()
        except MemoryError:
            os._exit(EXIT_OUT_OF_MEMORY)
        except BaseException as exc:
            return self.failure("exception", render_exception(exc))
        if result is None:
            return {"t": "done"}
        value = result[0]
        try:
            tokens = flatwire.encode(value)
            fits = self.sink.ledger.fits_value(value)
        except (flatwire.WireError, ValueError, TypeError) as exc:
            if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
                # Measuring it hit the interpreter's digit limit: the channel's is the same.
                exc = flatwire.IntegerTooLong()
            if isinstance(exc, flatwire.IntegerTooLong):
                return self.failure("invalid-output", f"{framing.LOSSY_COMPLETION}: {exc}")
            return self.failure("invalid-output", framing.LOSSY_COMPLETION)
        if not fits:
            return self.failure("output-limit", "")
        try:
            # Framed here: framing refuses what the runtime would not read (an integer beyond
            # the channel's digit limit, even with the interpreter's limit lifted).
            return framing.pack({"t": "done", "value": tokens}, raw="value")
        except flatwire.IntegerTooLong as exc:
            return self.failure("invalid-output", f"{framing.LOSSY_COMPLETION}: {exc}")
        except ValueError:
            return self.failure("invalid-output", framing.LOSSY_COMPLETION)

    def failure(self, kind: str, message: str) -> dict[str, object]:
        message = ledger.valid_text(message)
        if kind != "output-limit" and not self.sink.ledger.fits_message(message):
            kind, message = "output-limit", ""
        return {"t": "done", "error": {"kind": kind, "message": message}}


def warm_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A new loop's first run (its selector's first wait, a task, a callback): what a forked
    worker still pays before ready, the fork server having paid the rest once."""
    loop.run_until_complete(asyncio.sleep(0))


def prewarm_fork_server() -> None:
    """First-use costs (the compiler, the codecs, tracebacks, and asyncio's: the code a loop
    runs is specialised on its first runs, its caches filled) paid once by the fork server,
    before it forks, so that a worker pays less of them again: the same warm-up as a
    worker's, on a loop of its own that is closed before any fork -- a child inherits no
    descriptor and no loop of it. Measured (``benchmarks/runtime_floor.py``): a forked worker
    takes ~50 fewer page faults before it is ready (~1,130 -> ~1,080), 0.2-0.5 ms of CPU."""
    loop = asyncio.new_event_loop()
    try:
        prewarm(loop)
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def prewarm(loop: asyncio.AbstractEventLoop) -> None:
    """Pay first-use costs (the compiler, the loop's first run, the codecs) before ready."""
    code = compile_program("x = [await tools.a(1)]\nreturn {'x': x}")
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__program__"}

    async def echo(value: object) -> object:
        await asyncio.sleep(0)
        return value

    namespace["tools"] = make_tools(["a"], lambda name, value: echo(value))
    exec(code, namespace)
    result = loop.run_until_complete(namespace["__program__"]())
    tokens = flatwire.encode(result[0])
    flatwire.decode(flatwire.loads_strict(framing.pack({"t": "x", "v": tokens})[4:])["v"])
    ledger.OutputLedger(64).fits_value(result[0])
    render_exception(ValueError("warm-up"))
