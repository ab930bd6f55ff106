"""The Monty worker: a small bridge between the runtime's channel and one ``monty`` process.

Exec'd by the worker launch (``exec_launch.py``) once the sandbox is in place, as
``python -I -S bridge.py <monty binary> <pydantic_monty's parent> <sandbox report>``
with the channel on fd 3 (``runtime_service/languages/monty.py`` says why a bridge). Before it
reports ready it starts one ``monty`` process (a ``pydantic_monty.Monty`` pool of one, its
child, inside the same sandbox); then it takes one ``start`` after another (the runtime keeps
the host for one tenant's runs, ``runtime_service/kept_hosts.py``), each on a fresh Monty
session:

- the program is the body of an async function, as for the Python worker: it is wrapped in
  ``async def`` (lines inside multi-line strings left as they are) and its problems are
  reported at the program's own line and column;
- ``tools`` is a module of the run's bindings: each call suspends Monty, goes out as a binding
  call and is answered as a future, so ``asyncio.gather`` fans calls out; a failed call raises
  ``RuntimeError('ToolCallError: ...')`` in the program, where ``ToolCallError`` is bound to
  ``RuntimeError`` (Monty cannot subclass an exception or give one attributes), so
  ``except ToolCallError`` catches it;
- a value nested too deep is refused, never cut: ``pydantic_monty`` replaces whatever sits
  deeper than the recursion budget left by a ``"<deeply nested>"`` string on its way out of
  Monty, so such call arguments fail the call and such a completion ends the run
  ``invalid-output``;
- ``print`` output becomes log lines (``program.LogSink``: the same output budget);
- imports other than ``tools`` and every OS call (``open``, ``os``...) are refused inside the
  program, which ends ``exception`` unless it catches them;
- the memory budget is Monty's heap limit (and the run's cgroup); the bridge's own address
  space is limited to what it held when ready plus the run's budget (``RLIMIT_AS``, a soft
  limit reset at each run, which binds where no run cgroup does); a ``MemoryError`` in Monty
  or in the bridge ends the worker with the protocol's out-of-memory status, a crash of the
  ``monty`` process with another status (``worker-exit``).

Nothing of the runtime besides this directory and the worker package's stdlib-only modules is
in the sandbox (outside ``runtime_service/worker``, whose rule is the standard library only,
because this bridge imports ``pydantic_monty``).
"""

from __future__ import annotations

import io
import itertools
import json
import keyword
import os
import re
import resource
import socket
import sys
import tokenize
import typing
import unicodedata
from collections.abc import Iterator
from typing import Any, NoReturn

_HERE = os.path.dirname(os.path.abspath(__file__))


def _import_paths() -> None:
    """Make ``runtime_service.worker`` (beside this directory), ``codemode_wire.json_shape`` (which
    the worker package reads JSON shapes with) and ``pydantic_monty`` importable in a root that
    holds only them: bare ``runtime_service`` and ``codemode_wire`` packages pointing at their
    directories, and ``typing_extensions`` served by ``typing`` (Python >= 3.11 has
    every name pydantic_monty takes from it)."""
    import types

    root = os.path.dirname(os.path.dirname(_HERE))
    for name in ("runtime_service", "codemode_wire"):  # bare: neither package's __init__ runs
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, name)]
            sys.modules[name] = package
    if __name__ == "__main__" and len(sys.argv) > 2:
        sys.path.append(sys.argv[2])
    try:
        import typing_extensions  # noqa: F401
    except ImportError:
        sys.modules["typing_extensions"] = typing
    # The pydantic_monty client drives its monty process from a tokio runtime of its own, by
    # default one thread per CPU; its one session at a time gains nothing from more than one,
    # and each extra thread is woken to look for work at every round trip to the monty process
    # (two per binding call): one thread costs measurably less CPU per program. Read when the
    # client's runtime is built (the sandbox's environment is empty: nothing else sets it).
    os.environ.setdefault("TOKIO_WORKER_THREADS", "1")
    # pydantic_monty looks ``opentelemetry.context`` and ``opentelemetry.trace`` up at every
    # feed and every import it answers (its telemetry hooks). The root does not hold them, and
    # a failed import searches each directory of ``sys.path`` again every time: recorded
    # absent once, each look-up fails at once. The submodules too: a dotted name not in
    # ``sys.modules`` takes the import machinery's module lock before it finds its parent
    # absent (about five times the cost of the failure itself).
    try:
        import opentelemetry  # noqa: F401
    except ImportError:
        for name in ("opentelemetry", "opentelemetry.context", "opentelemetry.trace"):
            sys.modules[name] = None  # type: ignore[assignment]  # "absent" to import


_import_paths()

import pydantic_monty as pm  # noqa: E402

from runtime_service.worker import flatwire, framing  # noqa: E402
from runtime_service.worker.core import Channel  # noqa: E402
from runtime_service.worker.program import LogSink, missing_binding  # noqa: E402

__all__ = ["MontyRun", "wrap_program"]

PRELUDE_LINES = 3  # ``import tools``, ``ToolCallError = ...`` and the ``async def`` line
PRELUDE = "import tools\nToolCallError = RuntimeError\nasync def __program__():\n"
# A program whose text never spells ``tools`` cannot reach the module, and its import is one
# more round trip to the monty process per run (the bridge answers it): such a program gets
# this prelude instead, the import's line left empty so that its lines keep their numbers.
PRELUDE_WITHOUT_TOOLS = "\n" + PRELUDE.split("\n", 1)[1]
INDENT = "    "
_NO_VALUE = "__codemode_no_value__"
# The completion in place of a value without a JSON form. The completion is the value itself,
# not a pair with the check's verdict, so that the value leaves Monty at its own depth.
_NOT_PLAIN = "__codemode_not_plain__"
_RECURSION_DEPTH = 200
_FAILED_CALL: typing.Final = "RuntimeError"  # what ToolCallError is bound to (PRELUDE)
# pydantic_monty's conversion of a value leaving Monty spends the interpreter's recursion
# budget: whatever sits as deep as what is left of it (the limit less the frames of the
# program at that point; the whole limit for the completion) is replaced by this string. The
# bridge refuses a value that holds it instead. Values entering Monty are not cut.
CUT = "<deeply nested>"
TOO_DEEP = f"nested too deep for Monty (its conversion left {CUT!r} in the value)"
CHANNEL_FD = 3  # where the worker launch leaves the channel (exec_launch.CHANNEL_FD)
EXIT_CRASHED = 71  # the monty process died mid-run (languages/monty.py: ExitSigns)


# Monty hands a function (or any object without a JSON form) to the host as its repr, a plain
# string: so whether the program's value is plain JSON data is decided inside Monty, by this
# function defined after the program (its lines do not shift the program's). Iterative: a
# deep value needs no recursion.
_PLAIN_CHECK = """def __codemode_plain__(value):
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is list:
            stack.extend(item)
        elif kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
        elif not (item is None or kind is bool or kind is int or kind is float or kind is str):
            return False
    return True
"""


def wrap_program(program: str) -> str:
    """The program as the body of ``async def __program__()``, awaited at the top level.

    Every line is indented except those that begin inside a multi-line string (their text
    is the string's). A fall-off returns the ``_NO_VALUE`` input (no value), distinct from
    an explicit ``return None``. ``tools`` is imported only where the text names it.
    """
    prelude = PRELUDE if _names_tools(program) else PRELUDE_WITHOUT_TOOLS
    lines = program.splitlines(True)
    inside = _lines_inside_strings(program)
    body = "".join(
        line if number in inside else INDENT + line for number, line in enumerate(lines, 1)
    )
    if body and not body.endswith("\n"):
        body += "\n"
    return (
        f"{prelude}{body}{INDENT}return {_NO_VALUE}\n"
        f"{_PLAIN_CHECK}"
        "__codemode_value__ = await __program__()\n"
        f"__codemode_value__ if __codemode_plain__(__codemode_value__) else {_NOT_PLAIN}\n"
    )


class MontyRun:
    """One program on one Monty session, its binding calls on the channel."""

    def __init__(
        self,
        channel: Channel,
        start: dict[str, Any],
        ids: Iterator[int],
        *,
        metered: bool = False,
    ) -> None:
        """``ids``: the channel's call ids, shared by every run of this host: a reply to an
        earlier run's call (sent before the runtime saw that run end) never matches a call of
        a later one. ``metered``: the host is in its run's cgroup (the sandbox report says it
        joined one), whose CPU account holds the bridge and the ``monty`` process together."""
        self.metered = metered
        self.channel = channel
        self.ids = ids
        self.program = str(start["program"])
        self.names = [str(name) for name in start["bindings"]]
        self.sink = LogSink(channel, int(start["max_output_bytes"]))
        self.memory = int(start.get("memory_bytes") or 0)
        self.cpu_seconds = float(start.get("cpu_seconds") or 0)
        self.pending: dict[int, int] = {}  # channel call id -> Monty call id
        self.settled: dict[int, pm.ExternalSettledResult] = {}  # by Monty call id
        self.partial = ""

    # -- output ---------------------------------------------------------------------------
    def on_print(self, stream: str, text: str) -> None:
        """Monty's output arrives in chunks: each complete line is one log entry."""
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self.sink.emit(line)

    def flush_output(self) -> None:
        if self.partial:
            text, self.partial = self.partial, ""
            self.sink.emit(text)

    # -- binding calls --------------------------------------------------------------------
    def call(self, snapshot: pm.FunctionSnapshot) -> pm.ExternalResult:
        name = str(snapshot.function_name).removeprefix("tools.")
        if snapshot.kwargs or len(snapshot.args) != 1:
            return {
                "exc_type": "TypeError",
                "message": f"tools.{name} takes one arguments object, e.g. `{{}}`",
            }
        if too_deep(snapshot.args[0]):
            return _failed_call(f"{framing.LOSSY_ARGUMENTS}: {TOO_DEEP}")
        try:
            tokens = flatwire.encode(snapshot.args[0])
        except (flatwire.WireError, ValueError) as exc:
            return _failed_call(f"{framing.LOSSY_ARGUMENTS}: {exc}")
        call_id = next(self.ids)
        try:
            frame = framing.pack({"t": "call", "id": call_id, "name": name, "args": tokens})
        except ValueError as exc:
            return _failed_call(f"{framing.LOSSY_ARGUMENTS}: {exc}")
        self.pending[call_id] = snapshot.call_id
        self.channel.send_frame(frame)
        if len(self.pending) > 1:
            # Calls fanned out: read the replies already here, so that the runtime, which
            # stops reading a worker that leaves too many replies unread, never waits on this
            # bridge while it sends more calls. A lone call has no reply before its own (one
            # read of the channel per call saved: most programs await each call).
            self.take_replies(block=False)
        return {"future": ...}

    def take_replies(self, *, block: bool) -> None:
        """Read the replies that have arrived (at least one when ``block``)."""
        while True:
            data = self.channel.sock.recv(1 << 16) if block else self.channel.receive()
            if data is None:
                return
            if not data:
                os._exit(0)  # the runtime closed the channel: the run is over
            got = False
            for payload in self.channel.frames.feed(data):
                message, _ = framing.unpack(payload, json.loads)
                if type(message) is dict and message.get("t") == "reply":
                    got = self.on_reply(message) or got
            if got and block:
                return

    def on_reply(self, message: dict[str, Any]) -> bool:
        call_id = message.get("id")
        monty_id = self.pending.pop(call_id, None) if type(call_id) is int else None
        if monty_id is None:
            return False
        if message.get("ok") is True:
            try:
                self.settled[monty_id] = {"return_value": flatwire.decode(message.get("value"))}
            except flatwire.WireError:
                lossy = "binding resolution must be lossless JSON"
                self.settled[monty_id] = _failed_call(lossy)
        else:
            text = message.get("message")
            self.settled[monty_id] = _failed_call(text if type(text) is str else "failed")
        return True

    # -- the program ------------------------------------------------------------------------
    def limits(self) -> pm.ResourceLimits:
        limits: pm.ResourceLimits = {
            "max_recursion_depth": _RECURSION_DEPTH,
            "max_suspensions": 1 << 30,
        }
        if self.memory > 0:
            limits["max_memory"] = self.memory
        if self.cpu_seconds > 0 and not self.metered:
            # Without a run cgroup the runtime's CPU meter sees the bridge, not the monty
            # process: Monty's own clock bounds the program then. Not where the cgroup meters
            # both: that clock is wall time while the program runs, waiting for a CPU
            # included, so on a busy machine it would end a program ``exception`` long before
            # its compute budget is spent (the runtime ends it ``timeout`` at the budget).
            limits["max_feed_duration_secs"] = self.cpu_seconds * 2 + 1
        return limits

    def run(self, pool: pm.Monty) -> dict[str, object] | bytes:
        # Only names ``tools.<name>`` can spell are attributes (Monty refuses the others, and
        # a program could not reach them: no subscript on a module); the rest stay listed.
        callable_names = [name for name in self.names if _attribute_name(name)]
        module = pm.ExternalModule(dict.fromkeys(callable_names, _unreachable))
        try:
            with pool.checkout(
                script_name="program.py",
                limits=self.limits(),
                external_modules={"tools": module},
                print_flush_interval=0,
            ) as session:
                snapshot = session.feed_start(
                    wrap_program(self.program),
                    inputs={_NO_VALUE: _NO_VALUE, _NOT_PLAIN: _NOT_PLAIN},
                    print_callback=self.on_print,
                )
                output = self.drive(snapshot)
        except pm.MontyCrashedError:
            # The monty process died (killed, an allocator abort, a stack overflow): the host
            # ends with it, and the runtime recycles it. A death by the out-of-memory killer
            # is the run cgroup's to say (it wins over this status).
            os._exit(EXIT_CRASHED)
        except (pm.MontySyntaxError, pm.MontyRuntimeError) as exc:
            self.flush_output()
            if "MemoryError" in exc.display("type-msg").split(":", 1)[0]:
                os._exit(framing.EXIT_OUT_OF_MEMORY)
            return self.failure(render(exc, self.names))
        self.flush_output()
        if output == _NO_VALUE:
            return {"t": "done"}
        if output == _NOT_PLAIN:
            return self.invalid(framing.LOSSY_COMPLETION)
        if too_deep(output):
            return self.invalid(f"{framing.LOSSY_COMPLETION}: {TOO_DEEP}")
        if not self.sink.ledger.fits_value(output):
            return {"t": "done", "error": {"kind": "output-limit", "message": ""}}
        try:
            return framing.pack({"t": "done", "value": flatwire.encode(output)})
        except flatwire.IntegerTooLong as exc:
            return self.invalid(f"{framing.LOSSY_COMPLETION}: {exc}")
        except (flatwire.WireError, ValueError):
            return self.invalid(framing.LOSSY_COMPLETION)

    def invalid(self, message: str) -> dict[str, object]:
        return {"t": "done", "error": {"kind": "invalid-output", "message": message}}

    def drive(self, snapshot: pm.SyncSnapshot) -> Any:
        while not isinstance(snapshot, pm.MontyComplete):
            if isinstance(snapshot, pm.FunctionSnapshot):
                snapshot = self.resume_function(snapshot)
            elif isinstance(snapshot, pm.FutureSnapshot):
                wanted = set(snapshot.pending_call_ids)
                while not wanted & set(self.settled):
                    self.take_replies(block=True)
                ready = {i: self.settled.pop(i) for i in wanted & set(self.settled)}
                snapshot = snapshot.resume(ready)
            else:
                # A name the program never defined: NameError in the program.
                snapshot = snapshot.resume_auto()
        return snapshot.output

    def resume_function(self, snapshot: pm.FunctionSnapshot) -> pm.SyncSnapshot:
        name = snapshot.function_name
        if snapshot.is_os_function:
            if name == "import" and snapshot.args == ("tools",):
                return snapshot.resume_auto()
            if name == "import":
                what = f"No module named {snapshot.args[0]!r}"
                return snapshot.resume({"exc_type": "ModuleNotFoundError", "message": what})
            what = f"{name}: no files, processes or network in this sandbox"
            return snapshot.resume({"exc_type": "PermissionError", "message": what})
        if type(name) is str and name.startswith("tools."):
            return snapshot.resume(self.call(snapshot))
        message = f"{name!s} is not defined"
        return snapshot.resume({"exc_type": "NameError", "message": message})

    def failure(self, message: str) -> dict[str, object]:
        return {"t": "done", "error": {"kind": "exception", "message": message}}


def _failed_call(reason: str) -> pm.ExternalExceptionData:
    """A failed binding call as the program sees it: ``ToolCallError`` (``RuntimeError``)
    whose text starts with the name it is caught by."""
    return {"exc_type": _FAILED_CALL, "message": f"ToolCallError: {reason}"}


def _lines_inside_strings(program: str) -> set[int]:
    """The numbers of the lines that begin inside a multi-line string.

    Only a triple quote or a backslash before a line break can make a string span lines:
    without either there is none, and the pure-Python tokenizer (whose cost grows with every
    token, and for a short program exceeds the rest of its run in the bridge) is not run."""
    markers = ('"""', "'''", "\\\n", "\\\r")
    if not any(marker in program for marker in markers):
        return set()
    inside: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(program).readline):
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                inside.update(range(token.start[0] + 1, token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass  # Monty reports the problem itself
    return inside


def _names_tools(program: str) -> bool:
    """Whether the text can name ``tools``: anywhere in it (a string, a comment, an f-string's
    expression), after the NFKC normalization Python gives identifiers (``ｔｏｏｌｓ`` is
    ``tools``). Erring towards the import: it costs a round trip, never a behaviour."""
    if not program.isascii():
        program = unicodedata.normalize("NFKC", program)
    return "tools" in program


def too_deep(value: object) -> bool:
    """Whether ``pydantic_monty`` cut ``value`` (a ``CUT`` string in it). A string the program
    made with that text cannot be told apart, and is refused too. Without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is str:
            if item == CUT:
                return True
        elif type(item) is list:
            stack.extend(item)
        elif type(item) is dict:
            stack.extend(item.values())
    return False


def _attribute_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _unreachable(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError("bindings are answered by the runtime, never called here")


_NO_ATTRIBUTE = re.compile(r"AttributeError: module 'tools' has no attribute '(.*)'")


def render(exc: pm.MontySyntaxError | pm.MontyRuntimeError, names: list[str]) -> str:
    """``Type: message`` and where, in the program's own lines and columns (``line L:C``);
    a missing binding named as the Python worker names it."""
    text = exc.display("type-msg")
    missing = _NO_ATTRIBUTE.fullmatch(text)
    if missing:
        text = f"AttributeError: {missing_binding(missing.group(1), names)}"
    frames = exc.traceback() if hasattr(exc, "traceback") else []
    if frames:
        frame = frames[-1]
        line = frame.line - PRELUDE_LINES
        column = max(frame.column - len(INDENT), 0)
        if line >= 1:
            return f"{text} (line {line}:{column})"
    return text


class AddressSpace:
    """The bridge's ``RLIMIT_AS``: what it held once ready, plus each run's memory budget.

    A soft limit, set again at every run (a kept host serves runs of different budgets), so
    the bridge can lift it for the next run; what it bounds is this process, the one that
    receives Monty's values and the runtime's replies, beside Monty's own heap limit on the
    ``monty`` process and the run cgroup on both."""

    def __init__(self) -> None:
        self.hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        self.baseline = _address_space()

    def limit(self, memory_bytes: int) -> None:
        soft = self.hard
        if memory_bytes > 0 and self.baseline > 0:
            soft = self.baseline + memory_bytes
            if self.hard != resource.RLIM_INFINITY:
                soft = min(soft, self.hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, self.hard))


def _address_space() -> int:
    """This process's address space in bytes (0 when ``/proc`` cannot say)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def next_start(channel: Channel) -> dict[str, Any]:
    """Wait for the next run's ``start``; what arrives before it is an earlier run's (a reply
    sent before the runtime saw that run end) and is dropped. A closed channel ends the host."""
    while True:
        data = channel.receive() if channel.inbox else channel.sock.recv(1 << 16)
        if not data:
            os._exit(0)
        for payload in channel.frames.feed(data):
            message = json.loads(payload)
            if type(message) is dict and message.get("t") == "start":
                return message


def main() -> None:
    """Serve runs one after the other, each on a fresh Monty session, until the runtime ends
    the host (it keeps a host for one tenant's runs only, and kills it after any run that
    did not end cleanly: ``runtime_service/kept_hosts.py``)."""
    channel = Channel(socket.socket(fileno=CHANNEL_FD))
    report = json.loads(sys.argv[-1])
    metered = type(report) is dict and report.get("cgroup") == "joined"
    ids = itertools.count(1)
    with pm.Monty(binary_path=sys.argv[1], min_processes=1, max_processes=1) as pool:
        address_space = AddressSpace()
        channel.send({"t": "ready", "sandbox": report})
        while True:
            start = next_start(channel)
            run = MontyRun(channel, start, ids, metered=metered)
            address_space.limit(run.memory)
            try:
                outcome = run.run(pool)
                if isinstance(outcome, bytes):
                    channel.send_frame(outcome)
                else:
                    channel.send(outcome)
            except MemoryError:
                os._exit(framing.EXIT_OUT_OF_MEMORY)


if __name__ == "__main__":
    main()
