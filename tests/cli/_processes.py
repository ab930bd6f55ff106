"""Helpers for driving the real `codemode` CLI as child processes over loopback."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.procfs import alive, descendants

CLI = [sys.executable, "-m", "codemode_cli"]


def service_env(tmp: Path) -> dict[str, str]:
    """Environment for services under test: history and traces in `tmp`, nothing in `var/`."""
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "CODEMODE_REGISTRY_HISTORY_PATH": str(tmp / "history.sqlite3"),
        "CODEMODE_REGISTRY_TRACE_FILE": str(tmp / "traces.jsonl"),
        "CODEMODE_RUNTIME_TRACE_FILE": str(tmp / "traces.jsonl"),
    }


def cli(
    *args: str,
    env: Mapping[str, str],
    cwd: Path,
    stdin: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


class Lines:
    """A child's stdout read line by line on a thread, so tests can wait with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self._queue.put(line.rstrip("\n"))
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def expect(self, predicate: Callable[[str], bool], timeout: float = 30) -> str:
        """The first new line matching `predicate`; fails on EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no matching line within {timeout} s: {self.seen}") from None
            if line is None:
                raise AssertionError(f"output ended (status {self.proc.poll()}): {self.seen}")
            self.seen.append(line)
            if predicate(line):
                return line

    def rest(self, timeout: float = 10) -> list[str]:
        """Every remaining line until EOF."""
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while (line := self._queue.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            out.append(line)
        self.seen.extend(out)
        return out


def spawn(
    args: list[str], env: Mapping[str, str], cwd: Path, stderr: Path
) -> tuple[subprocess.Popen[str], Lines]:
    """Starts a child with stdout read by `Lines` and stderr appended to a file."""
    with stderr.open("a") as err:
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
        )
    return proc, Lines(proc)


def listening_port(line: str) -> int:
    match = re.search(r"listening on (?:port |\S+:)(\d+)$", line)
    assert match, line
    return int(match.group(1))


def free_port() -> int:
    """A loopback port nothing listens on (bound and released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command_line(pid: int) -> str:
    """The process's arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def wait_gone(pids: set[int], timeout: float = 3) -> set[int]:
    """The pids still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def piped_to_head(
    args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """`codemode ARGS | head -c 10` under pipefail: the status is codemode's."""
    command = " ".join(shlex.quote(a) for a in [*CLI, *args])
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -c 10"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def stop(proc: subprocess.Popen[str], sig: signal.Signals = signal.SIGTERM) -> int:
    """Sends `sig` to a child still running and waits for it (its whole tree SIGKILLed after
    30 s)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        return kill_tree(proc)


def kill_tree(proc: subprocess.Popen[str]) -> int:
    """SIGKILLs a child and every process below it, and waits for the child.

    A command that did not stop when told leaves nothing behind: the services it started
    would be adopted by the test process (a subreaper) and read as leaked children in every
    later test that checks for them. The tree is taken before the child dies (its orphans
    move to the test process, out of reach of a walk from the child)."""
    below = descendants(proc.pid)
    proc.kill()
    for pid in below:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return proc.wait()
