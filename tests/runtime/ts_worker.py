"""Drives the TypeScript worker (``runtime_service/worker_ts/worker.js``) at its channel: a real
``node`` process with a socketpair on fd 3, the real start frame, and the runtime's own frame
parser (``protocol.parse_worker_message``) reading everything it sends."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from runtime_service.protocol import parse_worker_message
from runtime_service.worker import flatwire, framing

WORKER_DIR = Path(__file__).resolve().parents[2] / "runtime_service" / "worker_ts"
WORKER_JS = WORKER_DIR / "worker.js"
NODE = shutil.which("node") or "node"
CHANNEL_FD = 3
TIMEOUT_S = 30.0

Reply = Callable[[dict[str, Any]], dict[str, Any] | None]


def echo_reply(call: dict[str, Any]) -> dict[str, Any] | None:
    """Echo the arguments back; ``fail`` fails; ``never`` is never answered."""
    if call["name"] == "fail":
        return {"t": "reply", "id": call["id"], "ok": False, "message": "fail refused"}
    if call["name"] == "never":
        return None
    return {"t": "reply", "id": call["id"], "ok": True, "value": call["args"]}


@dataclass
class Outcome:
    frames: list[dict[str, Any]] = field(default_factory=list)
    """Everything the worker sent after ready, parsed (strictly, as the runtime parses)."""
    payloads: list[bytes] = field(default_factory=list)
    returncode: int | None = None
    """Set when the worker exited by itself (None: it waited for the kill, as it should)."""
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def logs(self) -> list[str]:
        return [frame["text"] for frame in self.frames if frame["t"] == "log"]

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [frame for frame in self.frames if frame["t"] == "call"]

    @property
    def last(self) -> dict[str, Any] | None:
        return self.frames[-1] if self.frames else None

    @property
    def error(self) -> tuple[str, str] | None:
        last = self.last
        if last is None or last["t"] != "done" or "error" not in last:
            return None
        return last["error"]["kind"], last["error"]["message"]

    @property
    def value(self) -> object:
        last = self.last
        assert last is not None and last["t"] == "done" and "value" in last, self.frames
        return flatwire.decode(last["value"])


class TsWorker:
    """One node worker process on a socketpair."""

    def __init__(
        self, argv_report: dict[str, str] | None = None, wrapper: list[str] | None = None
    ) -> None:
        """``wrapper``: a command that runs node (``strace ...``), if any."""
        self.sock, child = socket.socketpair()
        child_fd = child.fileno()
        argv = [*(wrapper or ()), NODE, str(WORKER_JS)]
        if argv_report is not None:
            argv.append(json.dumps(argv_report))
        # bash (dash takes one-digit fds only) moves the channel to fd 3 and execs node (no
        # preexec_fn in a threaded test process); the zygote does so with dup2 before execve.
        shell = f'exec "$@" {CHANNEL_FD}<&{child_fd} {child_fd}<&-'
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", shell, "bash", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            cwd="/",
            pass_fds=(child_fd,),
        )
        child.close()
        self.sock.settimeout(TIMEOUT_S)
        self.frames = framing.FrameBuffer()
        self.queue: list[bytes] = []

    def recv_payload(self) -> bytes | None:
        while not self.queue:
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.queue.extend(self.frames.feed(data))
        return self.queue.pop(0)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(framing.pack(message))

    def ready(self) -> dict[str, Any]:
        payload = self.recv_payload()
        assert payload is not None, self.stderr_now()
        message = flatwire.loads_strict(payload)
        assert message["t"] == "ready", message
        return dict(message)

    def start(
        self,
        program: str,
        bindings: tuple[str, ...] = ("echo", "fail", "never", "my-tool", "__proto__"),
        max_output_bytes: int = 1 << 20,
    ) -> None:
        self.send(
            {
                "t": "start",
                "program": program,
                "bindings": sorted(bindings),
                "max_output_bytes": max_output_bytes,
                "memory_bytes": 256 << 20,
                "cpu_seconds": 10.0,
            }
        )

    def drive(self, reply: Reply = echo_reply, until: int | None = None) -> Outcome:
        """Answer calls until the last message, then kill the worker (or return after
        ``until`` frames, the worker still running)."""
        outcome = Outcome()
        while True:
            payload = self.recv_payload()
            if payload is None:
                outcome.returncode = self.process.wait(TIMEOUT_S)
                break
            # The runtime must accept every frame the worker sends.
            assert parse_worker_message(payload) is not None, payload[:200]
            message = dict(cast(dict[str, Any], framing.unpack(payload, flatwire.loads_strict)[0]))
            outcome.payloads.append(payload)
            outcome.frames.append(message)
            if message["t"] == "call":
                answer = reply(message)
                if answer is not None:
                    self.send(answer)
            if message["t"] in ("done", "output-limit"):
                break
            if until is not None and len(outcome.frames) >= until:
                return outcome  # the run goes on: the caller drives it further
        self.close(outcome)
        return outcome

    def close(self, outcome: Outcome | None = None) -> None:
        if self.process.poll() is None:
            self.process.kill()
        stdout, stderr = self.process.communicate(timeout=TIMEOUT_S)
        self.sock.close()
        if outcome is not None:
            outcome.stdout, outcome.stderr = stdout, stderr

    def stderr_now(self) -> str:
        if self.process.poll() is None:
            return "(running)"
        return self.process.stderr.read().decode() if self.process.stderr else ""


def run_ts(program: str, reply: Reply = echo_reply, **start: Any) -> Outcome:
    """Run one program in a fresh worker and return everything it sent."""
    worker = TsWorker()
    try:
        worker.ready()
        worker.start(program, **start)
        return worker.drive(reply)
    finally:
        if worker.process.poll() is None:
            worker.close()
