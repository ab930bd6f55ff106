"""Child Python processes that say on stdout when they are ready: start, wait, stop.

The demo, the load test, the benchmarks and some tests run the services (and providers) in
their own processes. Each prints a line such as `runtime listening on port 41234` once it
serves; `running()` starts `python <args>`, waits for the first stdout line starting with a
given prefix and yields the process with the rest of that line. A process that exits or stays
silent past the timeout raises `StartError`, quoting the tail of its stderr when that goes to a
file. On leaving, a process still running gets SIGTERM (a graceful stop), then SIGKILL.

The services themselves must not import this module: it belongs to the tools around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0


class StartError(RuntimeError):
    """A child process exited, or was not ready in time, before it printed its ready line."""


@dataclass(frozen=True)
class Started:
    """A child process that has printed its ready line."""

    proc: asyncio.subprocess.Process
    rest: str  # what follows the ready prefix on that line, stripped (e.g. a port)


async def start(
    *args: str,
    ready: str,
    env: Mapping[str, str] | None = None,
    stderr: Path | None = None,
    interpreter: Sequence[str] = (),
    label: str | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
) -> Started:
    """Starts `python [interpreter] <args>` and returns once a stdout line starts with `ready`.

    `stderr` is a file for the child's stderr (truncated first; DEVNULL without one);
    `interpreter` goes before `args` (e.g. `-m cProfile -o FILE`); `label` names the process in
    a `StartError` (default: its command line). A process that does not become ready is stopped
    before the error is raised; the caller stops one that did (see `stop`, or use `running`).
    """
    command = (sys.executable, *interpreter, *args)
    if stderr is None:
        proc = await _spawn(command, env, asyncio.subprocess.DEVNULL)
    else:
        with stderr.open("wb") as log:
            proc = await _spawn(command, env, log.fileno())
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(ready_timeout):
            while line := (await proc.stdout.readline()).decode():
                if line.startswith(ready):
                    return Started(proc, line[len(ready) :].strip())
        problem = "exited before it was ready"
    except TimeoutError:
        problem = f"was not ready after {ready_timeout:g}s"
    except BaseException:
        await stop(proc)
        raise
    await stop(proc)
    name = label or " ".join(["python", *command[1:]])
    raise StartError(f"{name} {problem}{_tail(stderr)}")


async def stop(proc: asyncio.subprocess.Process, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM, up to `grace` seconds for the process to exit, then SIGKILL."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def running(
    *args: str,
    ready: str,
    env: Mapping[str, str] | None = None,
    stderr: Path | None = None,
    interpreter: Sequence[str] = (),
    label: str | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
    stop_grace: float = STOP_GRACE_S,
) -> AsyncIterator[Started]:
    """`start` on entry, `stop` on exit (a process that has exited already is left alone)."""
    started = await start(
        *args,
        ready=ready,
        env=env,
        stderr=stderr,
        interpreter=interpreter,
        label=label,
        ready_timeout=ready_timeout,
    )
    try:
        yield started
    finally:
        await stop(started.proc, stop_grace)


async def _spawn(
    command: Sequence[str], env: Mapping[str, str] | None, stderr: int
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env
    )


def _tail(path: Path | None, lines: int = 8) -> str:
    """The last lines of a stderr file, indented after a colon ("" without any)."""
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return (":\n  " + "\n  ".join(text)) if text else ""
