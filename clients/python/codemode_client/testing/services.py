"""A real registry and runtime for tests: `codemode up` on free loopback ports, stopped by pid.

The client does not ship the servers, so the services come from the `codemode` command of an
environment that has them: `CODEMODE_TESTING_COMMAND` (e.g. `/path/to/.venv/bin/codemode`, or
`python -m codemode_cli`), else `python -m codemode_cli` when this interpreter has the servers'
package, else `codemode` on PATH. `codemode up` wires the registry to its runtime and offers the
languages the runtime serves; port 0 lets each service bind a free port itself (no race with
other tests picking ports). History and traces go to the working directory given.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_VARIABLE = "CODEMODE_TESTING_COMMAND"
START_TIMEOUT_S = 120.0
# `codemode up` stops the registry (its shutdown grace is 5 s), then the runtimes.
STOP_TIMEOUT_S = 45.0
_REGISTRY_LINE = "registry listening on "
_LISTENING = " listening on "  # `runtime listening on ADDR`, `runtime-2 listening on ADDR`


class ServicesError(RuntimeError):
    """The services could not be started (no `codemode` command, or it failed to start)."""


def codemode_command(command: str | Sequence[str] | None = None) -> list[str]:
    """The command that runs `codemode` here: `command` (a shell-style string or argv), else
    `$CODEMODE_TESTING_COMMAND`, else this interpreter's `codemode_cli`, else PATH's `codemode`."""
    if command is None:
        command = os.environ.get(COMMAND_VARIABLE) or None
    if isinstance(command, str):
        return shlex.split(command)
    if command is not None:
        return list(command)
    if importlib.util.find_spec("codemode_cli") is not None:
        return [sys.executable, "-m", "codemode_cli"]
    found = shutil.which("codemode")
    if found is not None:
        return [found]
    raise ServicesError(
        "the testing kit starts the services with the `codemode` command, which is not "
        f"installed here: install the `codemode` package, or set {COMMAND_VARIABLE} to a "
        "command that runs it (e.g. /path/to/venv/bin/codemode)"
    )


@dataclass
class CodemodeServices:
    """A running `codemode up`: one registry (`address`) wired to its runtimes."""

    address: str
    runtimes: list[str]
    workdir: Path
    env: dict[str, str]
    """The environment the services run with (pass it to `codemode` commands of a test)."""
    command: list[str]
    process: subprocess.Popen[str] = field(repr=False)
    service_pids: tuple[int, ...] = ()
    """The registry's and runtimes' pids (children of `codemode up`), checked gone on stop."""
    output: list[str] = field(default_factory=list, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        """SIGTERM to `codemode up` (it stops the registry, then the runtimes); SIGKILL to it
        and to each service pid still alive after the grace. Idempotent."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.service_pids:
            if _alive(pid):  # `up` was killed before it could stop them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> CodemodeServices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_services(
    workdir: Path,
    *,
    command: str | Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    runtimes: int = 1,
    timeout: float = START_TIMEOUT_S,
) -> CodemodeServices:
    """Starts `codemode up` in `workdir` (history and traces there) and returns once the
    registry serves. `env` adds settings (`CODEMODE_REGISTRY_*`, `CODEMODE_RUNTIME_*`).
    Raises `ServicesError`, with the tail of the output, if it exits or is not ready in time."""
    argv = codemode_command(command)
    workdir.mkdir(parents=True, exist_ok=True)
    service_env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "CODEMODE_REGISTRY_HISTORY_PATH": str(workdir / "history.sqlite3"),
        "CODEMODE_REGISTRY_TRACE_FILE": str(workdir / "traces.jsonl"),
        "CODEMODE_RUNTIME_TRACE_FILE": str(workdir / "traces.jsonl"),
        **(env or {}),
    }
    up = [
        *argv,
        "up",
        "--registry-listen",
        "127.0.0.1:0",
        "--runtime-listen",
        "127.0.0.1:0",
        "--runtimes",
        str(runtimes),
    ]
    try:
        process = subprocess.Popen(
            up,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=service_env,
            cwd=workdir,
        )
    except OSError as exc:
        raise ServicesError(f"cannot run {shlex.join(up)}: {exc}") from exc
    services = CodemodeServices("", [], workdir, service_env, argv, process)
    ready = threading.Event()
    threading.Thread(
        target=_pump, args=(process, services, ready), name="codemode-up", daemon=True
    ).start()
    if not ready.wait(timeout) or not services.address:
        problem = f"was not ready after {timeout:g} s"
        with contextlib.suppress(subprocess.TimeoutExpired):
            problem = f"exited with status {process.wait(5)} before it was ready"
        services.stop()
        tail = "\n  ".join(services.output[-20:])
        raise ServicesError(f"{shlex.join(up)} {problem}:\n  {tail}")
    services.service_pids = _children(process.pid)
    return services


def _pump(
    process: subprocess.Popen[str], services: CodemodeServices, ready: threading.Event
) -> None:
    """Reads `codemode up`'s output to its end (a full pipe would stall it), keeping the last
    lines and learning the addresses from its start-up lines."""
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.rstrip("\n")
        services.output.append(line)
        del services.output[:-200]
        if line.startswith("runtime") and _LISTENING in line:
            services.runtimes.append(line.rsplit(" ", 1)[-1])
        elif line.startswith(_REGISTRY_LINE) and not services.address:
            # `up` prints it once its runtimes and the registry all serve.
            services.address = line.removeprefix(_REGISTRY_LINE)
            ready.set()
    ready.set()  # ended: the waiter sees the exit


def _children(pid: int) -> tuple[int, ...]:
    """The direct children of `pid` (Linux; none elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return ()
    return tuple(int(child) for child in text.split())


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie is not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 0)
            return True
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: Sequence[int], timeout: float = 10.0) -> list[int]:
    """The pids still running after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
