"""The backend of "tiny", the test-only language (its interpreter: ``worker.py`` here).

Everything the runtime needs to serve it is in this module; registering it
(``runtime_service.languages.register``) is the only other step. Its worker is isolated by the
same steps as every worker, then execs this directory's interpreter under the runtime's own
Python (``python -I -S``: no site-packages, no environment).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from runtime_service.languages import (
    Capability,
    ExecLaunch,
    ExitSigns,
    SourceCheck,
    WorkerSettings,
)
from runtime_service.worker.framing import EXIT_OUT_OF_MEMORY

__all__ = ["BACKEND", "NAME", "TinyBackend"]

NAME = "tiny"
HERE = str(Path(__file__).resolve().parent)
INTERPRETER = os.path.join(HERE, "worker.py")


_CAPABILITY = Capability(
    interpreter="interpreter: tiny, line by line (tests/runtime/tiny_language/worker.py, "
    "python -I -S)",
    installation="the Python installation and the tiny interpreter, read-only",
)

_EXITS = ExitSigns(out_of_memory_status=EXIT_OUT_OF_MEMORY)


@dataclass(frozen=True, slots=True)
class TinyBackend:
    name: str = NAME
    capability: Capability = _CAPABILITY
    exits: ExitSigns = _EXITS
    memory_at_boot: bool = False  # it sets RLIMIT_AS from the start message
    threaded: bool = False
    nice_boot: bool = False
    source_check: SourceCheck | None = None
    keeps_host: bool = False

    def unavailable(self, settings: WorkerSettings) -> str | None:
        if settings.loader is not None:
            return "a test's stand-in worker replaces the real ones"
        return None

    def launch(self, settings: WorkerSettings) -> ExecLaunch | None:
        python = settings.executables.get(self.name) or os.path.realpath(sys.executable)
        return ExecLaunch(argv=(python, "-I", "-S", INTERPRETER), expose=(HERE,))


BACKEND = TinyBackend()
