"""The Monty backend: Python-subset programs run by Pydantic's Monty interpreter (the
``pydantic-monty`` package), served only where the runtime's ``languages`` setting names it.

The worker is isolated by the same steps as every worker (``worker/sandbox_child.py``), then
execs the runtime's own interpreter as ``python -I -S worker_monty/bridge.py <monty binary>``:
a small bridge that speaks the channel protocol (``worker/core.py``, ``worker/framing.py``)
and hands the program to a ``monty`` worker process it starts as its own child. So the Monty
binary runs inside the run's sandbox too (its pid namespace, cgroup, seccomp filter, uid, empty
environment, no network), and serves one tenant only: kept between that tenant's clean runs
(``runtime_service/kept_hosts.py``), each run on a fresh Monty session.

Why a bridge rather than exec'ing the binary itself: the binary speaks its own pool protocol
to the ``pydantic_monty`` client, not the runtime's channel; the bridge is that client, and
maps the program's ``tools.<name>(...)`` calls (Monty suspends on each) to binding calls on the
channel, its ``print`` output to logs and its outcome to the completion message.

Read-only in the private root besides the Python installation: the bridge's directory, the
worker package (``runtime_service/worker``, stdlib-only code the Python worker runs too), the
wire package's directory (``codemode_wire``, for its stdlib-only ``json_shape``), the
``pydantic_monty`` package and the directory of the ``monty`` binary.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from runtime_service.languages.backend import (
    Capability,
    ExecLaunch,
    ExitSigns,
    SourceCheck,
    WorkerSettings,
)
from runtime_service.worker.framing import EXIT_OUT_OF_MEMORY

__all__ = ["BACKEND", "NAME", "MontyBackend", "monty_binary", "monty_package"]

NAME = "monty"
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
WORKER_DIR = str(_PACKAGE_ROOT / "worker")
BRIDGE_DIR = str(_PACKAGE_ROOT / "worker_monty")
# The worker package reads JSON shapes with ``codemode_wire/json_shape.py`` (stdlib only, one
# copy for the servers' codec and the workers'); the bridge imports it from here.
WIRE_DIR = str(_PACKAGE_ROOT.parent / "codemode_wire")
BRIDGE = os.path.join(BRIDGE_DIR, "bridge.py")

_CAPABILITY = Capability(
    interpreter=(
        "interpreter: Monty (pydantic-monty), a Python subset in Rust, behind a python -I -S "
        "bridge in the same sandbox"
    ),
    installation=(
        "the Python installation, the runtime's worker and wire packages, pydantic_monty and "
        "the monty binary, read-only"
    ),
)

# A MemoryError from Monty's heap limit ends the bridge with the protocol's status; a crash
# of its monty process with the bridge's own (``worker_monty/bridge.py``).
EXIT_CRASHED = 71
_EXITS = ExitSigns(out_of_memory_status=EXIT_OUT_OF_MEMORY, crashed_status=EXIT_CRASHED)


def monty_package() -> str | None:
    """The directory of the ``pydantic_monty`` package, or None when it is not installed."""
    spec = importlib.util.find_spec("pydantic_monty")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).resolve().parent)


def monty_binary(settings: WorkerSettings) -> str | None:
    """The ``monty`` worker binary: configured, beside this interpreter's scripts, or on PATH."""
    configured = settings.executables.get(NAME)
    if configured:
        return configured
    scripts = sysconfig.get_path("scripts")
    for directory in (scripts, os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, "monty")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("monty")


@dataclass(frozen=True, slots=True)
class MontyBackend:
    name: str = NAME
    capability: Capability = _CAPABILITY
    exits: ExitSigns = _EXITS
    memory_at_boot: bool = False  # the bridge applies the budget from the start message
    threaded: bool = True  # the pydantic_monty client runs threads of its own
    nice_boot: bool = False
    source_check: SourceCheck | None = None
    # Each run is a fresh Monty session of the same monty process (the bridge takes one
    # ``start`` after another): the runtime keeps the host for its tenant's next run.
    keeps_host: bool = True

    def unavailable(self, settings: WorkerSettings) -> str | None:
        if settings.loader is not None:
            return "a test's stand-in worker replaces the real ones"
        if monty_package() is None:
            return "the pydantic-monty package is not installed"
        if monty_binary(settings) is None:
            return "the monty binary (pydantic-monty-runtime) is not installed"
        return None

    def launch(self, settings: WorkerSettings) -> ExecLaunch | None:
        binary = monty_binary(settings)
        package = monty_package()
        assert binary is not None and package is not None  # unavailable() said so
        binary = os.path.realpath(binary)
        python = os.path.realpath(sys.executable)
        return ExecLaunch(
            argv=(python, "-I", "-S", BRIDGE, binary, os.path.dirname(package)),
            expose=(WORKER_DIR, BRIDGE_DIR, WIRE_DIR, package, os.path.dirname(binary)),
        )


BACKEND = MontyBackend()
