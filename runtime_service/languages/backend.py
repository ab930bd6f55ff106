"""What the runtime needs to know of one program language: the ``LanguageBackend`` contract.

The runtime itself is language-neutral: every worker isolates itself by the same steps
(``worker/sandbox_child.py``), speaks the same channel protocol (``worker/framing.py``, the
messages in ``protocol.py``) and is supervised alike. What differs between languages is here,
one backend per language (``python.py``, ``typescript.py``), registered in one table
(``registry.py``):

- launch and boot: whether the worker runs in the launcher's own interpreter
  (``worker/bootstrap.py``, in the fork server's child or a spawned ``python -I -S``), or the
  launcher isolates and then execs another interpreter (``worker/exec_launch.py``): its command
  line, the trees it needs read-only in the private root, whether it runs threads of its own
  and whether a background boot is reniced;
- heap and memory: whether the interpreter reads the memory budget only when it starts (V8's
  heap limit), so that a pooled worker fits only the budget it was booted for, or the limits
  are applied when the program is handed over (Python's rlimits), so that any pooled worker
  fits;
- readiness: every backend's worker reports ``{"t": "ready", "sandbox": {...}}`` on its
  channel once it can take a program (an exec'd interpreter gets the sandbox report as its
  last argument and sends it back); nothing else counts as ready;
- what an exit means: which exit statuses, and which stderr line followed by which status,
  say that the program exhausted its memory budget (``ExitSigns``, the one
  input of the worker supervisor's exit classification, ``exit_classification``);
- capability text: how ``GetCapabilities`` describes the interpreter and what its private
  root holds;
- reuse: whether a worker may serve one tenant's runs one after the other (``keeps_host``);
- source check: what ``CheckSource`` parses for it (programs, host halves, and for a language
  whose workers can parse JavaScript, client halves) and the hints its problems carry; the
  parse itself always happens in one of its sandboxed workers, which the runtime provides
  (``SourceCheck.check`` gets it as ``parse``).

Nothing here imports the rest of the runtime: a backend reads the worker settings it needs
through ``WorkerSettings`` (``worker_process.WorkerSpec`` is one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "Capability",
    "ExecLaunch",
    "ExitSigns",
    "LanguageBackend",
    "Parse",
    "Problem",
    "SourceCheck",
    "SourceKind",
    "WorkerSettings",
    "hinted",
]


class WorkerSettings(Protocol):
    """The worker settings a backend reads (``worker_process.WorkerSpec`` has them)."""

    @property
    def loader(self) -> str | None:
        """A test's stand-in worker (``python -c`` code), or None for the real workers."""
        ...

    @property
    def boot_memory_bytes(self) -> int:
        """The memory budget the worker is booted for."""
        ...

    @property
    def executables(self) -> Mapping[str, str | None]:
        """Interpreters configured per language name (None: configured as absent)."""
        ...


@dataclass(frozen=True, slots=True)
class ExecLaunch:
    """An interpreter the worker becomes once its sandbox is in place (``execve`` in
    ``worker/exec_launch.py``, with an empty environment and the channel on fd 3)."""

    argv: tuple[str, ...]
    """Its command line, the executable (an absolute path) first; the launcher appends the
    sandbox report (JSON), which the worker sends back in its ready message."""
    expose: tuple[str, ...] = ()
    """Directories it needs, mounted read-only at the same path in the private root."""


@dataclass(frozen=True, slots=True)
class ExitSigns:
    """How one language's worker says, as it ends, that it ran out of memory.

    The only part of an exit's meaning that depends on the language: each language's backend
    provides one (the runtime passes it with every run and plugin host it creates). Plain
    data, so that a language without either sign simply leaves it out.
    """

    out_of_memory_status: int | None = None
    """The exit status the worker uses for "out of memory" (the Python worker's uncaught
    ``MemoryError``: ``framing.EXIT_OUT_OF_MEMORY``), or None."""
    crashed_status: int | None = None
    """The exit status the worker uses for "my interpreter process crashed" (the Monty
    bridge's, when its ``monty`` process died mid-run), or None."""
    heap_limit_line: str = ""
    """Text the worker's interpreter writes to stderr when it reaches its heap limit, right
    before it aborts with SIGABRT (Node's ``worker/typescript.HEAP_EXHAUSTED``), or ""."""


@dataclass(frozen=True, slots=True)
class Capability:
    """How ``GetCapabilities`` describes a language's workers (the rest of the sandbox is
    the same for every language, and measured from a real worker)."""

    interpreter: str
    """The ``interpreter:`` line of the enforced list."""
    installation: str
    """What the private root holds besides the system trees, in the ``filesystem:`` line."""


SourceKind = Literal["program", "host", "client"]
"""What a source is: a program, a plugin's host half, or a plugin's client half (JavaScript
for the browser)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Where a source does not parse, in its own coordinates (line 1-based, column 0-based;
    line 0: it could not be parsed at all, and ``message`` says why)."""

    line: int
    column: int
    message: str
    hint: str = ""


Parse = Callable[[SourceKind, str], Awaitable[list[Problem]]]
"""Parses a source in one of the language's sandboxed workers: its problems, without hints."""


@dataclass(frozen=True, slots=True)
class SourceCheck:
    """One language's syntax check: the kinds of source it takes, and ``check``, which gets
    the runtime's sandboxed ``parse`` and returns the problems with the language's hints."""

    kinds: tuple[SourceKind, ...]
    check: Callable[[Parse, SourceKind, str], Awaitable[list[Problem]]]


def hinted(
    problems: list[Problem], source: str, hint: Callable[[SourceKind, str], str], kind: SourceKind
) -> list[Problem]:
    """``problems`` with the hint for the text of each one's line (none where the source could
    not be parsed at all: line 0)."""
    lines = source.splitlines()
    return [
        Problem(
            p.line,
            p.column,
            p.message,
            hint(kind, lines[p.line - 1] if p.line <= len(lines) else "") if p.line > 0 else "",
        )
        for p in problems
    ]


class LanguageBackend(Protocol):
    """One program language, as the runtime sees it. Implementations are frozen dataclasses
    (one module each); ``registry.register`` makes one served."""

    @property
    def name(self) -> str:
        """What ``RunStart.language`` and ``HostStart.language`` say (also the key of its
        pool, its capabilities and its configured interpreter)."""
        ...

    @property
    def capability(self) -> Capability: ...

    @property
    def exits(self) -> ExitSigns: ...

    @property
    def memory_at_boot(self) -> bool:
        """True when the interpreter reads the memory budget only when it starts (a heap
        limit flag): a pooled worker then fits only runs with the budget it was booted for,
        and a run with another gets a worker booted for its own. False when the limits are
        applied at the hand-off (any pooled worker fits)."""
        ...

    @property
    def threaded(self) -> bool:
        """Whether the worker runs threads of its own (each is reniced at the hand-off)."""
        ...

    @property
    def nice_boot(self) -> bool:
        """Whether a background boot (a pool refill) starts at the lowest CPU priority: for
        an interpreter whose boot costs far more CPU than the fork (applied before the exec,
        so every thread inherits it)."""
        ...

    @property
    def source_check(self) -> SourceCheck | None:
        """The language's syntax check (None: the runtime offers none for it)."""
        ...

    @property
    def keeps_host(self) -> bool:
        """Whether one worker may serve one tenant's runs one after the other (its worker
        starts each run on a fresh interpreter state, and takes the next ``start`` after
        its completion): the runtime then keeps it between that tenant's clean runs
        (``kept_hosts.py``). False: every run gets a never-used worker."""
        ...

    def unavailable(self, settings: WorkerSettings) -> str | None:
        """None when this host can run the language's workers, else why not."""
        ...

    def launch(self, settings: WorkerSettings) -> ExecLaunch | None:
        """How its worker starts: None to run in the launcher's own interpreter
        (``worker/bootstrap.py``), else the interpreter it execs once isolated."""
        ...
