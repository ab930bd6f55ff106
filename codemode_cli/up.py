"""`codemode up`: a local stack — N runtimes and one registry wired to them, and with `--console`
the web console (`codemode console`) for one agent — as child processes.

Children run in their own process group, so a terminal's Ctrl-C reaches only this supervisor,
which then stops them in order: the registry first (it stops taking calls and lets in-flight
runs finish while the runtimes still serve them), then the runtimes. Each child's output is
forwarded with a `[name]` prefix. Real ports are learnt from the `… listening on port N` line
each service prints, so port 0 works.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from codemode_cli.arguments import host_port, positive_int
from codemode_cli.exit_codes import ExitCode

START_TIMEOUT_S = 60.0
# Longer than the services' default shutdown grace (5 s) plus the runtime's worker teardown.
STOP_TIMEOUT_S = 20.0
_WILDCARD_HOSTS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start N runtimes and one registry wired to them, print their addresses, and run "
        "until Ctrl-C/SIGTERM (then the registry stops first, the runtimes after it)."
    )
    parser.add_argument(
        "--registry-listen",
        type=host_port,
        default=host_port("127.0.0.1:50051"),
        metavar="HOST:PORT",
        help="registry address (default 127.0.0.1:50051; port 0 picks a free one)",
    )
    parser.add_argument(
        "--runtime-listen",
        type=host_port,
        default=host_port("127.0.0.1:50052"),
        metavar="HOST:PORT",
        help="first runtime's address; runtime i binds PORT+i (default 127.0.0.1:50052; "
        "port 0: each picks a free one)",
    )
    parser.add_argument(
        "--runtimes",
        type=positive_int,
        default=1,
        metavar="N",
        help="runtimes to start (default 1)",
    )
    parser.add_argument(
        "--config-registry", type=Path, metavar="FILE", help="registry YAML settings file"
    )
    parser.add_argument(
        "--config-runtime", type=Path, metavar="FILE", help="runtime YAML settings file (all)"
    )
    parser.add_argument(
        "--console",
        action="store_true",
        help="also serve the web console (`codemode console`) for --console-agent",
    )
    parser.add_argument(
        "--console-agent",
        default="console",
        metavar="AGENT",
        help="the console's agent, created if missing (default %(default)s)",
    )
    parser.add_argument(
        "--console-port",
        type=int,
        default=0,
        metavar="N",
        help="the console's port on 127.0.0.1 (default 0: a free one)",
    )


def run(args: argparse.Namespace) -> int:
    return asyncio.run(Stack(args).main())


def _connect_host(host: str) -> str:
    """Where a local client reaches a server bound to `host` (wildcards mean loopback)."""
    return _WILDCARD_HOSTS.get(host, host)


def _status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"status {code}"


@dataclass(eq=False)
class Child:
    name: str
    host: str
    proc: asyncio.subprocess.Process
    ready: asyncio.Future[int]
    exited: asyncio.Task[int]
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    port: int = 0
    url: str = ""
    """The console's URL to open (it carries the console's key); `opened` is set with it."""
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class Stack:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.registry: Child | None = None
        self.console: Child | None = None
        self.runtimes: list[Child] = []
        self.stop = asyncio.Event()
        self.failed = False
        self.interrupted = False  # stopped by SIGINT (exit 130), not SIGTERM

    @property
    def children(self) -> list[Child]:
        extra = [c for c in (self.registry, self.console) if c is not None]
        return [*self.runtimes, *extra]

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self._up()
        finally:
            clean = await self._down()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if self.failed or not clean:
            return ExitCode.FAILED
        return ExitCode.INTERRUPTED if self.interrupted else ExitCode.OK

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self.stop.is_set():
            self.interrupted = sig == signal.SIGINT
        if self.stop.is_set():  # a second Ctrl-C: stop waiting for a graceful exit
            for child in self.children:
                if child.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()
        self.stop.set()

    def _fail(self, message: str) -> None:
        self.failed = True
        print(f"codemode up: {message}", file=sys.stderr, flush=True)

    async def _up(self) -> None:
        args = self.args
        host, first_port = args.runtime_listen
        runtime_config = ["--config", str(args.config_runtime)] if args.config_runtime else []
        for i in range(args.runtimes):
            port = first_port + i if first_port else 0
            name = f"runtime-{i + 1}" if args.runtimes > 1 else "runtime"
            argv = ["runtime_service", "--listen", f"{host}:{port}", *runtime_config]
            self.runtimes.append(
                await self._spawn(name, host, argv, "runtime listening on port ", None)
            )
        if not await self._ready(self.runtimes):
            return
        targets = [f"{_connect_host(r.host)}:{r.port}" for r in self.runtimes]
        env = {**os.environ, "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps(targets)}
        if _LANGUAGES_VARIABLE not in env and not args.config_registry:
            # Unless told otherwise, the registry offers the languages every runtime serves
            # (TypeScript where Node is installed), so `codemode run PROGRAM.ts` works as is.
            languages = await _served_languages(targets)
            if languages:
                env[_LANGUAGES_VARIABLE] = json.dumps(languages)
        reg_host, reg_port = args.registry_listen
        argv = ["registry_service", "--listen", f"{reg_host}:{reg_port}"]
        if args.config_registry:
            argv += ["--config", str(args.config_registry)]
        self.registry = await self._spawn(
            "registry", reg_host, argv, "registry listening on port ", env
        )
        if not await self._ready([self.registry]):
            return
        connect = f"{_connect_host(reg_host)}:{self.registry.port}"
        if args.console:
            argv = ["codemode_cli", "console", "--registry", connect, "--create-agent"]
            argv += ["--agent", args.console_agent, "--port", str(args.console_port)]
            self.console = await self._spawn(
                "console", "127.0.0.1", argv, "console listening on port ", None
            )
            if not await self._ready([self.console]):
                return
            # It prints the URL right after its port; a console that dies first is reported
            # as any child's exit.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.console.opened.wait(), START_TIMEOUT_S)
        for runtime in self.runtimes:
            print(f"{runtime.name} listening on {runtime.address}")
        print(f"registry listening on {self.registry.address}")
        if self.console:
            # The URL with the key: the console serves nothing to a browser without it.
            print(f"console listening on {self.console.url or self.console.address}")
        print(
            f"connect: codemode run PROGRAM.py --agent NAME --create-agent --registry {connect}"
            " (Ctrl-C stops everything)",
            flush=True,
        )
        await self._until_stop_or_exit()

    async def _spawn(
        self, name: str, host: str, argv: list[str], ready: str, env: dict[str, str] | None
    ) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            process_group=0,  # out of the terminal's Ctrl-C: we stop children in order
            preexec_fn=_parent_death_signal(),
        )
        loop = asyncio.get_running_loop()
        child = Child(name, host, proc, loop.create_future(), asyncio.create_task(proc.wait()))
        assert proc.stdout is not None and proc.stderr is not None
        child.pumps = [
            asyncio.create_task(_pump(proc.stdout, child, sys.stdout, ready)),
            asyncio.create_task(_pump(proc.stderr, child, sys.stderr, None)),
        ]
        return child

    async def _ready(self, children: list[Child]) -> bool:
        """Waits until every child printed its port; False (after saying why) if one exits
        first, start-up takes too long, or a stop was requested."""
        pending: set[asyncio.Future[Any]] = {c.ready for c in children}
        stop = asyncio.create_task(self.stop.wait())
        exits: set[asyncio.Future[Any]] = {c.exited for c in self.children}
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        try:
            while pending:
                timeout = deadline - asyncio.get_running_loop().time()
                done, _ = await asyncio.wait(
                    pending | exits | {stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if stop in done:
                    return False
                for child in self.children:
                    if child.exited in done:
                        status = _status(child.proc.returncode)
                        self._fail(f"{child.name} exited during start-up ({status})")
                        return False
                if not done:
                    late = ", ".join(c.name for c in children if not c.ready.done())
                    self._fail(f"{late} not ready within {START_TIMEOUT_S:.0f} s")
                    return False
                pending -= done
        finally:
            stop.cancel()
        for child in children:
            child.port = child.ready.result()
        return True

    async def _until_stop_or_exit(self) -> None:
        stop = asyncio.create_task(self.stop.wait())
        watched: set[asyncio.Future[Any]] = {stop, *(c.exited for c in self.children)}
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if stop in done:
            return
        for child in self.children:
            if child.exited in done:
                self._fail(
                    f"{child.name} on {child.address} exited unexpectedly "
                    f"({_status(child.proc.returncode)}); stopping the rest"
                )

    async def _down(self) -> bool:
        """Stops the registry, then the runtimes; True when each one exited cleanly."""
        live = [c for c in self.children if not c.exited.done()]  # the rest were reported
        if live:
            order = "the console, then the registry" if self.console else "registry first"
            print(f"stopping: {order}, then the runtimes", flush=True)
        clean = True
        # The console is a client of the registry: it goes first.
        first = [self.console] if self.console else []
        for group in (first, [self.registry] if self.registry else [], self.runtimes):
            stopping = [c for c in group if c in live]
            for child in stopping:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.terminate()
            for child in stopping:
                clean = await _reap(child) and clean
        for child in self.children:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*child.pumps), 5)
        return clean


_LANGUAGES_VARIABLE = "CODEMODE_REGISTRY_RUNTIME_LANGUAGES"


async def _served_languages(targets: list[str]) -> list[str]:
    """The program languages every runtime reports, Python first (the registry's default is
    the first); empty if one cannot say (the registry keeps its own default then)."""
    import grpc

    from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc

    served: list[set[str]] = []
    for target in targets:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = runtime_pb2_grpc.RuntimeServiceStub(channel)
            try:
                caps = await stub.GetCapabilities(runtime_pb2.GetCapabilitiesRequest(), timeout=30)
            except grpc.aio.AioRpcError:
                return []
            served.append(set(caps.languages))
    common = set.intersection(*served) if served else set()
    return sorted(common, key=lambda language: (language != "python", language))


async def _reap(child: Child) -> bool:
    """Waits for a terminated child (killing it after STOP_TIMEOUT_S); True on a clean exit."""
    try:
        code = await asyncio.wait_for(asyncio.shield(child.exited), STOP_TIMEOUT_S)
    except TimeoutError:
        print(
            f"codemode up: {child.name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it",
            file=sys.stderr,
        )
        with contextlib.suppress(ProcessLookupError):
            child.proc.kill()
        code = await child.exited
    if code != 0:
        print(f"codemode up: {child.name} stopped with {_status(code)}", file=sys.stderr)
        return False
    print(f"{child.name} stopped", flush=True)
    return True


_CONSOLE_URL = "console: open "


async def _pump(stream: asyncio.StreamReader, child: Child, out: TextIO, ready: str | None) -> None:
    """Forwards a child's output line by line with its name; the first line starting with
    `ready` carries the port instead."""
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip("\n")
        port = text[len(ready) :].strip() if ready and text.startswith(ready) else ""
        if port.isdigit() and not child.ready.done():
            child.ready.set_result(int(port))
            continue
        if text.startswith(_CONSOLE_URL) and not child.url:
            child.url = text[len(_CONSOLE_URL) :].split(" ", 1)[0]
            child.opened.set()
        out.write(f"[{child.name}] {text}\n")
        out.flush()


def _parent_death_signal() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGTERM the child when this supervisor dies (even by
    SIGKILL), so a killed `codemode up` leaves no servers behind. Resolved before the fork:
    the hook itself only makes the system call."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)
