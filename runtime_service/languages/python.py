"""The Python backend: the worker is the launcher's own interpreter (``worker/bootstrap.py``).

Forked from the fork server (or spawned as ``python -I -S``), it isolates itself and runs the
program in the same process. Its memory and CPU limits (``RLIMIT_AS``, ``RLIMIT_CPU``) are
applied when the program is handed over, so any pooled worker fits any budget; an uncaught
``MemoryError`` exits with the protocol's out-of-memory status.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime_service.languages.backend import (
    Capability,
    ExecLaunch,
    ExitSigns,
    SourceCheck,
    WorkerSettings,
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
    source_check: SourceCheck | None = None

    def unavailable(self, settings: WorkerSettings) -> str | None:
        return None  # the runtime's own interpreter

    def launch(self, settings: WorkerSettings) -> ExecLaunch | None:
        return None


BACKEND = PythonBackend()
