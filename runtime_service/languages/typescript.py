"""The TypeScript backend: isolated like a Python worker, then ``node worker.js``.

The launcher isolates itself by the same steps as the Python worker, then execs Node
(``worker/exec_launch.py``) with ``runtime_service/worker_ts/worker.js``, whose pinned type
stripper (amaro) turns the program into JavaScript. What the exec keeps and resets is
described in ``worker/exec_launch.py``, how Node's heap exhaustion shows in
``worker/typescript.py``.

Node options: ``--max-old-space-size`` from the memory budget the worker is booted for (V8
reads it only at start: pooled workers are booted for the default budget, and a run with
another budget gets a worker started for its own, ``WorkerPool.launcher``; the run's cgroup
bounds all its memory besides) and ``--disallow-code-generation-from-strings`` (``eval`` and
``new Function`` refuse; the harness compiles the program with ``vm.Script``, which is not
affected). No ``RLIMIT_AS``: V8 and WebAssembly reserve far more address space than they use.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

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
from runtime_service.worker.typescript import HEAP_EXHAUSTED

__all__ = ["BACKEND", "NAME", "WORKER_DIR", "TypeScriptBackend", "find_node"]

NAME = "typescript"
WORKER_DIR = str(Path(__file__).resolve().parent.parent / "worker_ts")
"""The TypeScript worker's code (``npm ci`` there installs its type stripper)."""
_NODE_FLAGS = ("--disallow-code-generation-from-strings",)
_MIB = 1 << 20
_MIN_HEAP_MIB = 16

_CAPABILITY = Capability(
    interpreter=(
        "interpreter: Node 20 with the runtime's options only (no NODE_* variables: the "
        "environment is empty); the program sees no require or import, eval and new Function "
        "refuse (--disallow-code-generation-from-strings); V8's heap limit is the run's memory "
        "budget"
    ),
    installation=(
        "the Python installation (its site-packages and the runtime's own paths masked), "
        "Node's installation and the TypeScript worker's own code with its pinned type "
        "stripper, read-only"
    ),
)


@functools.cache
def find_node() -> str | None:
    """``node`` on the runtime's PATH, resolved to its real path (None: not installed)."""
    found = shutil.which("node")
    return os.path.realpath(found) if found else None


_EXITS = ExitSigns(out_of_memory_status=EXIT_OUT_OF_MEMORY, heap_limit_line=HEAP_EXHAUSTED)


async def _check(parse: Parse, kind: SourceKind, source: str) -> list[Problem]:
    """A program or a host half: types stripped as the worker strips them, then compiled; a
    client half (JavaScript for the browser, which Node parses too): compiled as it is."""
    problems = await parse(kind, source)
    return hinted(problems, source, _javascript_hint if kind == "client" else _hint, kind)


def _hint(kind: SourceKind, text: str) -> str:
    what = "program" if kind == "program" else "Host half"
    returns = "" if kind == "program" else " that returns the plugin"
    if re.search(r"^\s*(def|class|async def|import|from)\s.*|:\s*$", text):
        return f"Hint: the {what} is TypeScript (an async function body{returns}), not Python."
    return (
        "Hint: check that brackets and quotes balance; line numbers count from the first line "
        "of the body (the async function wrapper adds none). Types are stripped, not checked: "
        "enums, namespaces and parameter properties are not supported."
    )


def _javascript_hint(_kind: SourceKind, text: str) -> str:
    if " as " in text:
        return (
            "Hint: the Client half is plain JavaScript; remove TypeScript syntax such as `as` "
            "casts, type annotations and interfaces."
        )
    return (
        "Hint: check that brackets and quotes balance; line numbers count from the first line "
        "of the body (the one-line `(async () => {` wrapper is not counted)."
    )


_SOURCE_CHECK = SourceCheck(("program", "host", "client"), _check)


@dataclass(frozen=True, slots=True)
class TypeScriptBackend:
    name: str = NAME
    capability: Capability = _CAPABILITY
    # Node aborts (SIGABRT) after V8 writes its heap-limit line: the budget, not a crash.
    exits: ExitSigns = _EXITS
    memory_at_boot: bool = True
    threaded: bool = True
    # Node's boot takes a hundred ms and more of CPU on its threads: a refill's must not slow
    # the programs running meanwhile.
    nice_boot: bool = True
    source_check: SourceCheck | None = _SOURCE_CHECK
    keeps_host: bool = False  # a Node worker's heap and modules outlive a program: used once

    def node(self, settings: WorkerSettings) -> str | None:
        """The Node executable: the configured one, else ``node`` on the PATH."""
        if self.name in settings.executables:
            return settings.executables[self.name]
        return find_node()

    def unavailable(self, settings: WorkerSettings) -> str | None:
        if settings.loader is not None:
            return "a test's stand-in worker replaces the real ones"
        if self.node(settings) is None:
            return "no Node executable (worker_node, or node on the runtime's PATH)"
        if not os.path.isfile(os.path.join(WORKER_DIR, "worker.js")) or not os.path.isdir(
            os.path.join(WORKER_DIR, "node_modules", "amaro")
        ):
            return "the TypeScript worker is not installed (npm ci in runtime_service/worker_ts)"
        return None

    def launch(self, settings: WorkerSettings) -> ExecLaunch | None:
        node = self.node(settings) or "node"
        heap_mib = max(settings.boot_memory_bytes // _MIB, _MIN_HEAP_MIB)
        return ExecLaunch(
            argv=(
                node,
                f"--max-old-space-size={heap_mib}",
                *_NODE_FLAGS,
                os.path.join(WORKER_DIR, "worker.js"),
            ),
            # Its code (amaro included) and Node's install (already there when under /usr).
            expose=(WORKER_DIR, os.path.dirname(os.path.dirname(node))),
        )


BACKEND = TypeScriptBackend()
