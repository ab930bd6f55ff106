"""The interpreter of "tiny", the runtime's test-only language: one instruction per line.

Not a product language: it exists to prove that a language is a backend and nothing more
(``backend.py`` beside it, registered by ``tests/runtime/test_language_seam.py``). The runtime
execs it once the worker is isolated (``runtime_service/worker/exec_launch.py``), as
``python -I -S worker.py <sandbox report JSON>`` with the channel on fd 3, and it speaks the
worker protocol on its own (framing and flat-wire values written out here, as Node's worker
does): ready, one ``start``, binding calls, logs, one completion.

Instructions (blank lines and ``#`` comments are skipped; the whole program is read before
anything runs, so a line that is not one of these fails it as a ``SyntaxError`` first):

- ``print <text>``: a log line;
- ``call <binding> <JSON arguments>``: call a binding and wait for its result (a failed call
  ends the program as an uncaught ``ToolCallError``);
- ``return <JSON>``, ``return $`` (the last call's result), ``return $all`` (every result);
- ``fail <message>``: an uncaught ``Error``;
- ``spin``: compute forever; ``alloc``: allocate memory forever; ``exit <code>``: exit.

Stdlib only (nothing of the runtime's tree is in its sandbox).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import struct
import sys
from typing import Any, NoReturn

CHANNEL_FD = 3
EXIT_OUT_OF_MEMORY = 86  # the protocol's status for an exhausted memory budget
_HEADER = struct.Struct(">I")
_VALUE_FORMS = ("$", "$all")


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, message: dict[str, object]) -> None:
        payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("ascii")
        self.sock.sendall(_HEADER.pack(len(payload)) + payload)

    def recv(self) -> dict[str, Any] | None:
        header = self._exactly(_HEADER.size)
        if header is None:
            return None
        body = self._exactly(_HEADER.unpack(header)[0])
        if body is None:
            return None
        if body[:1] != b"\0":
            return dict(json.loads(body))
        # A raw frame (docs/wire.md): the reply's message, then its value's JSON text.
        (size,) = _HEADER.unpack_from(body, 1)
        message = dict(json.loads(body[1 + _HEADER.size : 1 + _HEADER.size + size]))
        message["value"] = [{"kind": "json", "text": body[1 + _HEADER.size + size :].decode()}]
        return message

    def _exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data


def encode(value: object) -> list[object]:
    """A JSON value as flat-wire tokens (pre-order; containers as markers)."""
    if isinstance(value, list):
        tokens: list[object] = [{"kind": "array", "length": len(value)}]
        for item in value:
            tokens += encode(item)
        return tokens
    if isinstance(value, dict):
        tokens = [{"kind": "object", "keys": list(value)}]
        for item in value.values():
            tokens += encode(item)
        return tokens
    return [value]


def decode(tokens: list[Any]) -> object:
    """Flat-wire tokens back to a JSON value (the runtime's replies)."""
    position = 0

    def take() -> object:
        nonlocal position
        token = tokens[position]
        position += 1
        if type(token) is not dict:
            return token
        if token["kind"] == "json":
            return json.loads(token["text"])
        if token["kind"] == "array":
            return [take() for _ in range(token["length"])]
        return {key: take() for key in token["keys"]}

    return take()


class ToolCallError(Exception):
    pass


def parse(program: str) -> list[tuple[str, str, object]]:
    """Each instruction as (word, argument text, parsed JSON or None)."""
    steps: list[tuple[str, str, object]] = []
    for number, line in enumerate(program.splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        word, _, rest = text.partition(" ")
        try:
            if word in ("print", "fail"):
                steps.append((word, rest, None))
            elif word == "call":
                name, _, arguments = rest.partition(" ")
                steps.append((word, name, json.loads(arguments)))
            elif word == "return":
                value = None if rest in _VALUE_FORMS else json.loads(rest)
                steps.append((word, rest, value))
            elif word == "exit":
                steps.append((word, rest, int(rest)))
            elif word in ("spin", "alloc") and not rest:
                steps.append((word, "", None))
            else:
                raise ValueError(f"unknown instruction {word!r}")
        except ValueError as exc:
            raise SyntaxError(f"line {number}: {exc}") from None
    return steps


def run(channel: Channel, start: dict[str, Any]) -> dict[str, object]:
    """The program's completion message."""
    try:
        steps = parse(str(start["program"]))
    except SyntaxError as exc:
        return {"t": "done", "error": {"kind": "exception", "message": f"SyntaxError: {exc}"}}
    results: list[object] = []
    next_id = 1
    hoard: list[bytes] = []
    for word, text, value in steps:
        if word == "print":
            channel.send({"t": "log", "text": text})
        elif word == "call":
            channel.send({"t": "call", "id": next_id, "name": text, "args": encode(value)})
            next_id += 1
            reply = channel.recv()
            if reply is None:
                os._exit(0)  # the runtime closed the channel: the run is over
            if reply.get("ok") is not True:
                message = f"ToolCallError: {reply.get('message')}"
                return {"t": "done", "error": {"kind": "exception", "message": message}}
            results.append(decode(reply["value"]))
        elif word == "return":
            returned = value
            if text == "$":
                returned = results[-1] if results else None
            elif text == "$all":
                returned = results
            return {"t": "done", "value": encode(returned)}
        elif word == "fail":
            return {"t": "done", "error": {"kind": "exception", "message": f"Error: {text}"}}
        elif word == "spin":
            while True:
                pass
        elif word == "alloc":
            try:
                while True:
                    hoard.append(b"x" * (1 << 20))  # written, so every page is resident
            except MemoryError:
                os._exit(EXIT_OUT_OF_MEMORY)
        elif word == "exit":
            assert isinstance(value, int)
            os._exit(value)
    return {"t": "done"}


def finish(channel: Channel, message: dict[str, object]) -> NoReturn:
    """Close the output pipes, send the completion, wait to be killed (as every worker)."""
    for fd in (1, 2):
        os.close(fd)
    try:
        channel.send(message)
        while channel.sock.recv(1 << 16):
            pass
    finally:
        os._exit(0)


def main() -> None:
    channel = Channel(socket.socket(fileno=CHANNEL_FD))
    report = json.loads(sys.argv[-1])
    channel.send({"t": "ready", "sandbox": report})
    start = channel.recv()
    if start is None or start.get("t") != "start":
        os._exit(0)
    memory = int(start["memory_bytes"])
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    finish(channel, run(channel, start))


if __name__ == "__main__":
    main()
