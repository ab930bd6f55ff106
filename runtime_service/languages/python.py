"""The Python backend: the worker is the launcher's own interpreter (``worker/bootstrap.py``).

Forked from the fork server (or spawned as ``python -I -S``), it isolates itself and runs the
program in the same process. Its memory and CPU limits (``RLIMIT_AS``, ``RLIMIT_CPU``) are
applied when the program is handed over, so any pooled worker fits any budget; an uncaught
``MemoryError`` exits with the protocol's out-of-memory status.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runtime_service.languages.backend import (
    Capability,
    ExecLaunch,
    ExitSigns,
    Parse,
    Problem,
    SourceCheck,
    SourceKind,
    WorkerSettings,
    hinted,
)
from runtime_service.worker.framing import EXIT_OUT_OF_MEMORY

__all__ = ["BACKEND", "NAME", "PythonBackend"]

NAME = "python"

_CAPABILITY = Capability(
    interpreter=(
        "interpreter: isolated (-I -S): no site-packages, no user paths, no PYTHON* variables"
    ),
    installation="the Python installation (its site-packages and the runtime's own paths masked)",
)

_EXITS = ExitSigns(out_of_memory_status=EXIT_OUT_OF_MEMORY)


async def _check(parse: Parse, kind: SourceKind, source: str) -> list[Problem]:
    """A program or a host half, compiled as the body of an async function."""
    return hinted(await parse(kind, source), source, _hint, kind)


def _hint(kind: SourceKind, text: str) -> str:
    what = "program" if kind == "program" else "Host half"
    returns = "" if kind == "program" else " that returns the plugin"
    if re.search(r"=>|\b(const|let|var|function)\s|;\s*$|\binterface\s", text):
        return (
            f"Hint: the {what} is Python (an async function body{returns}), not JavaScript or "
            "TypeScript."
        )
    return (
        "Hint: check that brackets, quotes and indentation balance; line numbers count from "
        "the first line of the body (the async function wrapper adds none)."
    )


_SOURCE_CHECK = SourceCheck(("program", "host"), _check)


@dataclass(frozen=True, slots=True)
class PythonBackend:
    name: str = NAME
    capability: Capability = _CAPABILITY
    # An uncaught MemoryError ends the worker with the protocol's out-of-memory status.
    exits: ExitSigns = _EXITS
    memory_at_boot: bool = False
    threaded: bool = False
    # A forked Python worker boots in a few ms of CPU: not worth a renice.
    nice_boot: bool = False
    source_check: SourceCheck | None = _SOURCE_CHECK
    keeps_host: bool = False  # the program runs in the worker's own interpreter: used once

    def unavailable(self, settings: WorkerSettings) -> str | None:
        return None  # the runtime's own interpreter

    def launch(self, settings: WorkerSettings) -> ExecLaunch | None:
        return None


BACKEND = PythonBackend()
