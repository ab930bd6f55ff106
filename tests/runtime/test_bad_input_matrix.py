"""Bad input of every kind on the RuntimeService gets a clear answer, never a hang or a leak.

One case per kind of bad input. A case is refused with a canonical status carrying an
`ErrorInfo` (domain `codemode.runtime`, a stable UPPER_SNAKE reason, a bounded message) or,
where the contract makes the problem a per-call or per-run outcome, it ends with exactly that
terminal. Every case must finish within `HANG_S`; after each one the runtime must still serve a
trivial run, and only its idle pooled workers may be left alive.

Messages go out over real gRPC as serialized bytes (a pass-through request serializer), so
the matrix can also send what protobuf clients refuse to build: invalid UTF-8, unknown fields
and message kinds, truncated messages. Client messages travel through a request iterator, as
the registry sends them, so nothing written after the run's end races the client library.

Every case that reaches a worker runs once per language (`LANGUAGES`): the program texts are
written per language where they differ (`Lang`), the expectation is one. The cases about the
first message and the language field itself reach no worker and run once (`any:`).

Inputs the contract tolerates on purpose (unset and unknown fields, late or unmatched call
results, a second cancel, junk trace context) are cases too: they end as the contract says.
RunRequest has no enum fields; its analogue of an unknown enum value, a message kind from a
newer schema (an unknown oneof field), is covered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_status import rpc_status
from opentelemetry.sdk.trace import TracerProvider

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from codemode_wire.grpc_status import MAX_MESSAGE_BYTES, error_info
from runtime_service.run import EXPIRED_MESSAGE
from runtime_service.server import RunningRuntime, start
from tests.runtime.conftest import (
    child_pids,
    drive,
    grpc_settings,
    start_message,
    start_message_in,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

pb = runtime_pb2
INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXCEPTION = pb.FAILURE_KIND_EXCEPTION
TIMEOUT = pb.FAILURE_KIND_TIMEOUT
ABORT = pb.FAILURE_KIND_ABORT
OUTPUT_LIMIT = pb.FAILURE_KIND_OUTPUT_LIMIT
REASON = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*")
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
HANG_S = 5.0
LONG = "a" * 10_000
RUN_PATH = "/codemode.runtime.v1.RuntimeService/Run"
CAPABILITIES_PATH = "/codemode.runtime.v1.RuntimeService/GetCapabilities"
# The deployment maxima of the module's server (the settings' defaults).
MAXIMA = {
    "compute_ms": 60_000,
    "wall_ms": 600_000,
    "max_output_bytes": 64 << 20,
    "memory_bytes": 512 << 20,
    "max_outstanding_calls": 256,
}
MAX_PROGRAM_BYTES = 1 << 20
MAX_BINDINGS = 4096
LOSSY = "binding resolution must be lossless JSON"


@dataclass(frozen=True)
class Lang:
    """The program texts of one language where they differ (the rest is valid in both)."""

    name: str
    catch: str
    """Returns the message of the ToolCallError its one binding call raises, else the value."""
    two_calls: str
    waits: str
    """Logs, then waits on a call (the caller cancels or half-closes)."""
    comment: str
    """What starts a comment line."""
    nul_byte: str
    """What the compiler says of a NUL byte after `return 1` (Python refuses any NUL byte;
    in TypeScript one is valid only in strings and comments: the error names its place)."""
    two_calls_after_half_close: str
    first_binding_twice: str
    """Calls its only binding (found without naming it) with 30,000 and 10 characters."""


PYTHON_LANG = Lang(
    name="python",
    catch="try:\n    return await tools.t(1)\nexcept ToolCallError as e:\n    return str(e)",
    two_calls="a = await tools.t(1)\nb = await tools.t(2)\nreturn [a, b]",
    waits="print('waiting')\nawait tools.t(1)\nreturn 'not reached'",
    comment="#",
    nul_byte="null",
    two_calls_after_half_close=(
        "out = []\nfor i in range(2):\n    try:\n        await tools.t(i)\n"
        "    except ToolCallError as e:\n        out.append(str(e))\nreturn out"
    ),
    first_binding_twice=(
        "out = []\nfor n in (30_000, 10):\n    try:\n"
        "        out.append(await tools[dir(tools)[0]]('x' * n))\n"
        "    except ToolCallError as e:\n        out.append(str(e))\nreturn out"
    ),
)
TYPESCRIPT_LANG = Lang(
    name="typescript",
    catch=(
        "try {\n  return await tools.t(1);\n} catch (e) {\n"
        "  if (e instanceof ToolCallError) return e.message;\n  throw e;\n}"
    ),
    two_calls="const a = await tools.t(1);\nconst b = await tools.t(2);\nreturn [a, b];",
    waits="console.log('waiting');\nawait tools.t(1);\nreturn 'not reached';",
    comment="//",
    nul_byte="SyntaxError: Expected ';', got '<lexing error>'\n    at program.ts:1:9",
    two_calls_after_half_close=(
        "const out: string[] = [];\nfor (let i = 0; i < 2; i++) {\n  try {\n"
        "    await tools.t(i);\n  } catch (e) {\n    out.push((e as ToolCallError).message);\n"
        "  }\n}\nreturn out;"
    ),
    first_binding_twice=(
        "const out: unknown[] = [];\nfor (const n of [30000, 10]) {\n  try {\n"
        "    out.push(await tools[Object.keys(tools)[0]]('x'.repeat(n)));\n"
        "  } catch (e) {\n    out.push((e as ToolCallError).message);\n  }\n}\nreturn out;"
    ),
)
LANGUAGES = (PYTHON_LANG, TYPESCRIPT_LANG)

Message = pb.RunRequest | bytes


# -- raw protobuf, for what the generated classes refuse to build ------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def length_delimited(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def raw_start(*fields: bytes) -> bytes:
    """A RunRequest whose `start` (field 1) holds the given encoded RunStart fields."""
    return length_delimited(1, b"".join(fields))


PROGRAM_ONE = length_delimited(1, b"return 1")
PYTHON = length_delimited(2, b"python")
BAD_UTF8 = b"\xff\xfe"


# -- talking to the server ---------------------------------------------------------------------


@dataclass
class Client:
    stub: runtime_pb2_grpc.RuntimeServiceStub
    run: grpc.aio.StreamStreamMultiCallable  # bytes in, RunResponse out
    capabilities: grpc.aio.UnaryUnaryMultiCallable  # bytes in


def connect(channel: grpc.aio.Channel) -> Client:
    return Client(
        runtime_pb2_grpc.RuntimeServiceStub(channel),
        channel.stream_stream(RUN_PATH, response_deserializer=pb.RunResponse.FromString),
        channel.unary_unary(
            CAPABILITIES_PATH, response_deserializer=pb.GetCapabilitiesResponse.FromString
        ),
    )


@dataclass
class Exchange:
    seen: list[pb.RunResponse]
    error: grpc.aio.AioRpcError | None

    @property
    def calls(self) -> list[pb.BindingCall]:
        return [m.binding_call for m in self.seen if m.WhichOneof("kind") == "binding_call"]


OnCall = Callable[[pb.BindingCall], Sequence[Message | None]]  # None: half-close
Script = Callable[[Client], Awaitable[Exchange]]


def value(call_id: int, value_json: str) -> pb.RunRequest:
    return pb.RunRequest(call_result=pb.CallResult(call_id=call_id, value_json=value_json))


def cancel(reason: str) -> pb.RunRequest:
    return pb.RunRequest(cancel=pb.RunCancel(reason=reason))


def echo(call: pb.BindingCall) -> list[Message | None]:
    return [value(call.call_id, call.arguments_json)]


def silent(call: pb.BindingCall) -> list[Message | None]:
    return []


def _wire(message: Message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _late_send_lost(exc: grpc.aio.AioRpcError, seen: list[pb.RunResponse]) -> bool:
    """Whether `exc` is only this client failing to send a message after the terminal: the
    runtime ends the RPC right after it, so a late message can race the server's OK status,
    and gRPC core then fails the send locally (INTERNAL, "Internal error from Core", no status
    details from the server). What the runtime decided, the terminal, has arrived already."""
    after_terminal = any(m.WhichOneof("kind") == "terminal" for m in seen)
    from_server = any(key == "grpc-status-details-bin" for key, _ in exc.trailing_metadata() or ())
    return after_terminal and exc.code() == grpc.StatusCode.INTERNAL and not from_server


def talk(
    *opening: Message,
    on_call: OnCall = echo,
    half_close: bool = False,
    after_terminal: Sequence[Message] = (),
) -> Script:
    """Send `opening` (then half-close, if asked), answer each binding call with `on_call`,
    and after the terminal send `after_terminal` and half-close."""

    async def script(client: Client) -> Exchange:
        outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        for message in opening:
            outbox.put_nowait(_wire(message))
        if half_close:
            outbox.put_nowait(None)

        async def requests() -> AsyncIterator[bytes]:
            while (item := await outbox.get()) is not None:
                yield item

        call = client.run(requests())
        seen: list[pb.RunResponse] = []
        try:
            async for response in call:
                seen.append(response)
                kind = response.WhichOneof("kind")
                if kind == "binding_call":
                    for answer in on_call(response.binding_call):
                        outbox.put_nowait(None if answer is None else _wire(answer))
                elif kind == "terminal":
                    for message in after_terminal:
                        outbox.put_nowait(_wire(message))
                    outbox.put_nowait(None)
        except grpc.aio.AioRpcError as exc:
            if _late_send_lost(exc, seen):
                return Exchange(seen, None)
            return Exchange(seen, exc)
        finally:
            outbox.put_nowait(None)
        assert await call.code() == grpc.StatusCode.OK
        return Exchange(seen, None)

    return script


# -- what a case expects -------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """The RPC fails with `code` and an ErrorInfo with `reason`; `mentions` is in the message."""

    reason: str
    mentions: str = ""
    code: grpc.StatusCode = INVALID
    midway: bool = False  # the run had started (messages may precede the status)

    def check(self, exchange: Exchange) -> None:
        error = exchange.error
        assert error is not None, f"not refused: {[str(m) for m in exchange.seen]}"
        assert error.code() == self.code, f"{error.code()}: {error.details()}"
        status = rpc_status.from_call(error)
        assert status is not None, f"no rich status: {error.code()}: {error.details()}"
        info = error_info(status)
        assert info is not None, f"no ErrorInfo: {error.code()}: {error.details()}"
        assert info.domain == "codemode.runtime"
        assert REASON.fullmatch(info.reason), info.reason
        assert info.reason == self.reason, f"{info.reason}: {error.details()}"
        details = error.details() or ""
        assert details, "an empty message"
        assert len(details.encode()) <= MAX_MESSAGE_BYTES, "an unbounded message"
        assert self.mentions in details, details
        kinds = [m.WhichOneof("kind") for m in exchange.seen]
        assert "terminal" not in kinds, kinds
        if not self.midway:
            assert kinds == [], kinds


@dataclass(frozen=True)
class Ends:
    """The stream ends OK with exactly one terminal, last: a success with `value_json` (None:
    without a value), or a failure of `failure` kind whose message contains `message`."""

    value_json: str | None = None
    failure: int | None = None
    message: str = ""
    also: Callable[[Exchange], None] | None = None

    def check(self, exchange: Exchange) -> None:
        error = exchange.error
        assert error is None, f"refused: {error.code()}: {error.details()}"
        kinds = [m.WhichOneof("kind") for m in exchange.seen]
        assert kinds.count("terminal") == 1 and kinds[-1] == "terminal", kinds
        terminal = exchange.seen[-1].terminal
        if self.failure is None:
            assert terminal.WhichOneof("outcome") == "success", str(terminal)
            if self.value_json is None:
                assert not terminal.success.HasField("value_json"), str(terminal)
            else:
                assert terminal.success.value_json == self.value_json, str(terminal)
        else:
            assert terminal.WhichOneof("outcome") == "failure", str(terminal)
            assert terminal.failure.kind == self.failure, str(terminal)
            assert self.message in terminal.failure.message, str(terminal)
        if self.also is not None:
            self.also(exchange)


@dataclass(frozen=True)
class Case:
    id: str
    script: Script
    expect: Refused | Ends = field(default_factory=Ends)


def ok(value_json: str | None = "1", also: Callable[[Exchange], None] | None = None) -> Ends:
    return Ends(value_json=value_json, also=also)


def failed(kind: int, message: str = "") -> Ends:
    return Ends(failure=kind, message=message)


def start_with(**fields: object) -> pb.RunRequest:
    """A start running `return 1` in python, with `fields` of RunStart replaced."""
    values: dict[str, object] = {"program": "return 1", "language": "python", **fields}
    return pb.RunRequest(start=pb.RunStart(**values))  # type: ignore[arg-type]


def with_timeout(start: Callable[..., pb.RunRequest], seconds: int, nanos: int) -> pb.RunRequest:
    message = start("return 1")
    message.start.timeout.seconds = seconds
    message.start.timeout.nanos = nanos
    return message


def traced(
    start: Callable[..., pb.RunRequest], traceparent: str, tracestate: str = ""
) -> pb.RunRequest:
    message = start("return await tools.t(1)", "t")
    message.start.trace_context.traceparent = traceparent
    message.start.trace_context.tracestate = tracestate
    return message


def _fresh_trace(exchange: Exchange) -> None:
    """Junk trace context is not passed on: the call names the run's own span, a new trace."""
    (call,) = exchange.calls
    match = TRACEPARENT.fullmatch(call.trace_context.traceparent)
    assert match is not None, call.trace_context.traceparent
    assert int(match[1], 16) and int(match[2], 16)


def _continues(trace_id: str) -> Callable[[Exchange], None]:
    def check(exchange: Exchange) -> None:
        (call,) = exchange.calls
        match = TRACEPARENT.fullmatch(call.trace_context.traceparent)
        assert match is not None and match[1] == trace_id, call.trace_context.traceparent

    return check


def _calls_named(*names: str) -> Callable[[Exchange], None]:
    def check(exchange: Exchange) -> None:
        assert [c.binding_name for c in exchange.calls] == list(names)

    return check


def _token_echoed(token: bytes) -> Callable[[Exchange], None]:
    def check(exchange: Exchange) -> None:
        assert [c.token for c in exchange.calls] == [token]

    return check


def _on_first_call(*messages: Message) -> OnCall:
    """Answer call 1 with `messages`, every later call with its arguments."""

    def answer(call: pb.BindingCall) -> list[Message | None]:
        return list(messages) if call.call_id == 1 else echo(call)

    return answer


# -- the matrix ----------------------------------------------------------------------------------


def _neutral_cases() -> list[Case]:
    """Cases decided before any worker is chosen: the first message, the language field."""
    cases: list[Case] = []
    add = cases.append

    # The first message must be `start`.
    start_required = Refused("START_REQUIRED", "first Run message must be a start")
    add(Case("first:none-half-close-at-once", talk(half_close=True), start_required))
    add(Case("first:call-result", talk(value(1, "1")), start_required))
    add(Case("first:cancel", talk(cancel("x")), start_required))
    add(Case("first:empty-message", talk(pb.RunRequest()), start_required))
    # Proto3 keeps unknown fields: a message kind from a newer schema is no start either.
    add(Case("first:unknown-kind-field-9", talk(length_delimited(9, b"")), start_required))

    # Bytes that are no RunRequest at all.
    malformed = Refused("MALFORMED_MESSAGE", "RunRequest")
    for kind, data in (
        ("truncated", b"\x0a\x05ab"),
        ("bad-wire-type", b"\x0f"),
        ("program-invalid-utf8", raw_start(length_delimited(1, BAD_UTF8), PYTHON)),
        ("language-invalid-utf8", raw_start(PROGRAM_ONE, length_delimited(2, BAD_UTF8))),
        ("binding-invalid-utf8", raw_start(PROGRAM_ONE, PYTHON, length_delimited(3, BAD_UTF8))),
        (
            "traceparent-invalid-utf8",
            raw_start(PROGRAM_ONE, PYTHON, length_delimited(7, length_delimited(1, BAD_UTF8))),
        ),
    ):
        add(Case(f"first:malformed-{kind}", talk(data), malformed))

    # The language: "python" or "typescript", exactly; unset (empty) means python.
    unsupported = Refused("INVALID_RUN", "unsupported language")
    for kind, language in (
        ("unknown", "cobol"),
        ("wrong-case", "Python"),
        ("wrong-case-typescript", "TypeScript"),
        ("padded", " python"),
        ("nul-suffix", "python\x00"),
        ("10000-chars", LONG),
    ):
        add(Case(f"language:{kind}", talk(start_with(language=language)), unsupported))
    add(Case("language:empty-means-python", talk(start_with(language="")), ok()))
    return [dataclasses.replace(case, id=f"any:{case.id}") for case in cases]


def _cases(lang: Lang) -> list[Case]:
    """Cases that reach a worker of `lang` (or would, but for the refusal)."""
    cases: list[Case] = []
    add = cases.append
    catch, two_calls, waits = lang.catch, lang.two_calls, lang.waits

    def start(program: str, *names: str, **fields: Any) -> pb.RunRequest:
        return start_message_in(lang.name, program, *names, **fields)

    def run(program: str, *names: str, **budgets: int) -> Script:
        """Start `program` with bindings `names` and `budgets`; echo binding calls."""
        return talk(start(program, *names, **budgets))

    # Unknown fields (a newer client's) are ignored, as proto3 intends.
    language = length_delimited(2, lang.name.encode())
    unknown = raw_start(PROGRAM_ONE, language, length_delimited(99, b"future"))
    add(Case("start:unknown-field-ignored", talk(unknown), ok()))

    # The program: empty and comment-only bodies are valid (no value); broken ones fail the
    # run as an exception, like any program error; oversized ones are refused.
    add(Case("program:empty-is-a-valid-body", run(""), ok(None)))
    add(Case("program:comment-only", run(f"{lang.comment} nothing"), ok(None)))
    add(Case("program:nul-byte", run("return 1\x00"), failed(EXCEPTION, lang.nul_byte)))
    add(Case("program:syntax-error", run("return ("), failed(EXCEPTION)))
    add(Case("program:top-level-yield", run("yield 1"), failed(EXCEPTION)))
    at_limit = lang.comment + "#" * (MAX_PROGRAM_BYTES - len(lang.comment))
    add(Case("program:at-the-byte-limit", run(at_limit), ok(None)))
    too_big = Refused("INVALID_RUN", f"program exceeds {MAX_PROGRAM_BYTES} bytes")
    add(Case("program:one-byte-over-the-limit", run(at_limit + "#"), too_big))
    # Half as many characters as the limit, but two bytes each: the limit is in bytes.
    wide = lang.comment + "é" * (MAX_PROGRAM_BYTES // 2)
    add(Case("program:over-the-limit-in-utf8-bytes", run(wide), too_big))

    # Budgets (uint64; 0 = the default). A negative int64 on the wire reads as 2^64 - 1.
    over = Refused("INVALID_RUN", "exceeds the deployment maximum")
    for name, ceiling in MAXIMA.items():
        add(Case(f"budget:{name}-zero-means-default", run("return 1", **{name: 0}), ok()))
        add(Case(f"budget:{name}-at-maximum", run("return 1", **{name: ceiling}), ok()))
        add(Case(f"budget:{name}-over-maximum", run("return 1", **{name: ceiling + 1}), over))
        huge = run("return 1", **{name: 2**64 - 1})
        add(Case(f"budget:{name}-max-uint64-or-negative-int64", huge, over))
    below = Refused("INVALID_RUN", "must be at least")
    add(Case("budget:max_output_bytes-1", run("return 1", max_output_bytes=1), below))
    add(Case("budget:max_output_bytes-3", run("return 1", max_output_bytes=3), below))
    add(Case("budget:memory_bytes-1", run("return 1", memory_bytes=1), below))

    # The caller's time left (a Duration): spent or under a millisecond times out without a
    # worker; a Duration outside the well-known type's range or with mixed signs is malformed.
    expired = failed(TIMEOUT, EXPIRED_MESSAGE)
    add(Case("timeout:negative", talk(with_timeout(start, -5, 0)), expired))
    add(Case("timeout:zero", talk(with_timeout(start, 0, 0)), expired))
    add(Case("timeout:one-nanosecond", talk(with_timeout(start, 0, 1)), expired))
    largest = with_timeout(start, 315_576_000_000, 999_999_999)
    add(Case("timeout:largest-valid", talk(largest), ok()))
    bad_timeout = Refused("INVALID_RUN", "timeout")
    for kind, seconds, nanos in (
        ("seconds-over-range", 315_576_000_001, 0),
        ("seconds-min-int64", -(2**63), 0),
        ("nanos-one-second", 0, 1_000_000_000),
        ("nanos-negative-with-positive-seconds", 1, -1),
        ("nanos-positive-with-negative-seconds", -1, 1),
    ):
        add(Case(f"timeout:{kind}", talk(with_timeout(start, seconds, nanos)), bad_timeout))

    # Trace context is advisory: junk starts a new trace, it never fails the run.
    for kind, traceparent in (
        ("garbage", "not a traceparent"),
        ("truncated", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71"),
        ("zero-trace-id", f"00-{'0' * 32}-b7ad6b7169203331-01"),
        ("version-ff", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("uppercase-hex", "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"),
        ("10000-chars", LONG),
    ):
        script = talk(traced(start, traceparent))
        add(Case(f"trace:traceparent-{kind}", script, ok(also=_fresh_trace)))
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    parent = f"00-{trace_id}-b7ad6b7169203331-01"
    for kind, tracestate in (("garbage", "=,=,==="), ("10000-chars", LONG)):
        add(
            Case(
                f"trace:tracestate-{kind}",
                talk(traced(start, parent, tracestate)),
                ok(also=_continues(trace_id)),
            )
        )

    # Binding names: any non-empty string, reached by subscript; no duplicates; a bounded count.
    add(
        Case(
            "bindings:duplicate",
            run("return 1", "t", "u", "t"),
            Refused("INVALID_RUN", "duplicate binding name 't'"),
        )
    )
    add(Case("bindings:empty-name", run("return 1", ""), Refused("INVALID_RUN", "non-empty")))
    many = [f"b{i}" for i in range(MAX_BINDINGS + 1)]
    add(Case("bindings:one-too-many", run("return 1", *many), Refused("INVALID_RUN", "more than")))
    add(Case("bindings:at-the-count-limit", run("return 1", *many[:MAX_BINDINGS]), ok()))
    for kind, name in (
        ("dashed", "my-tool"),
        ("spaced", "a b"),
        ("leading-digit", "1st"),
        ("non-ascii", "ünï"),
        ("dunder", "__class__"),
        ("named-tools", "tools"),
        ("control-character", "\x00"),
        ("10000-chars", LONG),
    ):
        program = f"return await tools[{name!r}](1)"
        add(Case(f"bindings:name-{kind}", run(program, name), ok(also=_calls_named(name))))

    # The token is opaque: any bytes, echoed unchanged.
    for kind, token in (("empty", b""), ("binary", bytes(range(256))), ("1-mib", b"k" * (1 << 20))):
        message = start("return await tools.t(1)", "t")
        message.start.token = token
        add(Case(f"token:{kind}", talk(message), ok(also=_token_echoed(token))))

    # After `start`: only call results and cancels may follow.
    # Anything else aborts the run (its worker is killed) and the status replaces the terminal.
    restart = Refused("UNEXPECTED_MESSAGE", "a second start message", midway=True)
    kindless = Refused("UNEXPECTED_MESSAGE", "no known kind", midway=True)
    second = start("return 2")
    add(Case("after-start:second-start-at-once", talk(start(waits, "t"), second), restart))
    add(
        Case(
            "after-start:second-start-midway",
            talk(start(waits, "t"), on_call=lambda _: [second]),
            restart,
        )
    )
    add(
        Case(
            "after-start:empty-message",
            talk(start(waits, "t"), on_call=lambda _: [pb.RunRequest()]),
            kindless,
        )
    )
    add(
        Case(
            "after-start:unknown-kind-field-9",
            talk(start(waits, "t"), on_call=lambda _: [length_delimited(9, b"")]),
            kindless,
        )
    )
    add(
        Case(
            "after-start:malformed-bytes",
            talk(start(waits, "t"), on_call=lambda _: [b"\x0a\x05ab"]),
            Refused("MALFORMED_MESSAGE", "RunRequest", midway=True),
        )
    )

    # Call results that match no waiting call are the end of a race or a slip: ignored, and
    # never applied to a later call with that id.
    for kind, call_id in (("zero", 0), ("never-issued", 999), ("max-uint64", 2**64 - 1)):
        add(
            Case(
                f"reply:id-{kind}",
                talk(
                    start(two_calls, "t"),
                    on_call=_on_first_call(value(call_id, '"stray"'), value(1, '"real"')),
                ),
                ok('["real",2]'),
            )
        )
    add(
        Case(
            "reply:before-its-call-was-issued",
            talk(start(two_calls, "t"), value(2, '"early"')),
            ok("[1,2]"),
        )
    )
    add(
        Case(
            "reply:twice",
            talk(
                start(two_calls, "t"),
                on_call=_on_first_call(value(1, '"first"'), value(1, '"again"')),
            ),
            ok('["first",2]'),
        )
    )
    add(
        Case(
            "reply:after-the-run-ended",
            talk(
                start("tools.t(1)\nreturn 'done'", "t"),
                on_call=silent,
                after_terminal=[value(1, "1")],
            ),
            ok('"done"'),
        )
    )
    # A value that is not lossless JSON fails that call in the program, not the run.
    for kind, value_json in (
        ("unclosed-object", "{"),
        ("nan", "NaN"),
        ("infinity", "Infinity"),
        ("overflow-1e999", "1e999"),
        ("negative-zero", "-0"),
        ("negative-zero-float", "-0.0"),
        ("duplicate-keys", '{"a": 1, "a": 2}'),
        ("empty-text", ""),
        ("trailing-comma", "[1,]"),
        ("two-values", "1 2"),
    ):
        answer = _on_first_call(value(1, value_json))
        script = talk(start(catch, "t"), on_call=answer)
        add(Case(f"reply:value-{kind}", script, ok(json.dumps(LOSSY))))
    no_outcome = pb.RunRequest(call_result=pb.CallResult(call_id=1))
    add(
        Case(
            "reply:neither-value-nor-error",
            talk(start(catch, "t"), on_call=_on_first_call(no_outcome)),
            ok(json.dumps("the call result carried neither value_json nor error_message")),
        )
    )

    # Cancels: the first one wins; its reason is the abort message (checked by the ledger).
    add(
        Case(
            "cancel:twice",
            talk(start(waits, "t"), on_call=lambda _: [cancel("first"), cancel("second")]),
            failed(ABORT, "first"),
        )
    )
    add(
        Case(
            "cancel:empty-reason",
            talk(start(waits, "t"), on_call=lambda _: [cancel("")]),
            failed(ABORT, "run cancelled by the caller"),
        )
    )
    add(
        Case(
            "cancel:then-a-reply",
            talk(start(waits, "t"), on_call=lambda c: [cancel("stop"), *echo(c)]),
            failed(ABORT, "stop"),
        )
    )
    add(
        Case(
            "cancel:after-the-run-ended",
            talk(start("return 1"), after_terminal=[cancel("late")]),
            ok(),
        )
    )
    add(
        Case(
            "cancel:10000-char-reason",
            talk(start(waits, "t"), on_call=lambda _: [cancel(LONG)]),
            failed(ABORT, LONG),
        )
    )
    # A reason that does not fit the output ledger becomes `output-limit`.
    add(
        Case(
            "cancel:reason-over-the-output-cap",
            talk(start(waits, "t", max_output_bytes=64), on_call=lambda _: [cancel(LONG)]),
            failed(OUTPUT_LIMIT, "outer output exceeded 64 bytes"),
        )
    )

    # Half-close: the caller sends nothing more. A run without calls is unaffected; a call
    # can never be answered, so it fails in the program instead of waiting out the wall clock.
    add(Case("half-close:right-after-start", talk(start("return 1"), half_close=True), ok()))
    closed = "no result can arrive: the caller half-closed the Run stream"
    add(
        Case(
            "half-close:with-a-call-pending",
            talk(start(catch, "t"), on_call=lambda _: [None]),
            ok(json.dumps(closed)),
        )
    )
    add(
        Case(
            "half-close:before-a-call",
            talk(start(catch, "t"), half_close=True),
            ok(json.dumps(closed)),
        )
    )
    add(
        Case(
            "half-close:then-two-calls",
            talk(
                start(lang.two_calls_after_half_close, "t"),
                half_close=True,
            ),
            ok(json.dumps([closed, closed], separators=(",", ":"))),
        )
    )
    return cases


CASES = _neutral_cases() + [
    dataclasses.replace(case, id=f"{lang.name}:{case.id}")
    for lang in LANGUAGES
    for case in _cases(lang)
]


def _ids_are_unique() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"


_ids_are_unique()


# -- the server ----------------------------------------------------------------------------------


@dataclass
class World:
    running: RunningRuntime
    client: Client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world() -> AsyncIterator[World]:
    # Tracing on, as deployed with telemetry: junk trace context meets the real parser.
    settings = grpc_settings(pool_size=2, typescript_pool_size=1)
    running = await start(settings, tracer_provider=TracerProvider())
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            yield World(running, connect(channel))
    finally:
        await running.stop(0)
    assert child_pids(fork_servers=True) == [], "a worker outlived the runtime"


async def still_serving(world: World, language: str = "python") -> None:
    """A trivial run in `language` still works, and no worker but the pools' idle ones is
    alive."""
    _, terminal = await asyncio.wait_for(
        drive(world.client.stub, start_message_in(language, "return 1")), HANG_S
    )
    assert terminal.success.value_json == "1", str(terminal)
    runtime = world.running.runtime
    pools = list(runtime.pools.values())
    assert [pool.spec.language for pool in pools] == [lang.name for lang in LANGUAGES]
    state: tuple[int, int, int, list[int]] = (0, 0, 0, [])
    try:
        async with asyncio.timeout(HANG_S):
            while True:
                for pool in pools:
                    await pool.wait_filled()
                idle = sum(pool.idle_count for pool in pools)
                workers = sum(pool.live_workers for pool in pools)
                state = (runtime.live_runs, idle, workers, child_pids())
                if state[0] == 0 and state[2] == idle and len(state[3]) == idle:
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        live, idle, workers, children = state
        left = f"{live} live runs, {workers} workers for {idle} idle, children {children}"
        pytest.fail(f"left behind: {left}")


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_bad_input_gets_a_clear_answer(world: World, case: Case) -> None:
    try:
        exchange = await asyncio.wait_for(case.script(world.client), HANG_S)
    except TimeoutError:
        pytest.fail(f"{case.id} hung")
    case.expect.check(exchange)
    await still_serving(world, case.id.partition(":")[0].replace("any", "python"))


async def test_writes_after_half_close_are_refused_by_the_client(world: World) -> None:
    """The client library refuses them locally; the server never sees them, the run ends."""
    call = world.client.stub.Run()
    await call.write(start_message("return 1"))
    await call.done_writing()
    with pytest.raises(asyncio.InvalidStateError):
        await call.write(cancel("too late"))
    responses = await asyncio.wait_for(_read_all(call), HANG_S)
    assert [r.terminal.success.value_json for r in responses] == ["1"]
    await still_serving(world)


async def _read_all(call: grpc.aio.StreamStreamCall) -> list[pb.RunResponse]:
    return [response async for response in call]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        length_delimited(1, b"junk"),
        length_delimited(7, BAD_UTF8),  # invalid UTF-8 in an unknown field is kept unread
        varint(5 << 3) + varint(2**64 - 1),
        length_delimited(12, b"x" * (1 << 20)),
    ],
    ids=["empty", "unknown-string", "unknown-bad-utf8", "unknown-varint", "unknown-1-mib"],
)
async def test_capabilities_ignore_unknown_fields(world: World, data: bytes) -> None:
    caps = await asyncio.wait_for(world.client.capabilities(data), HANG_S)
    assert list(caps.languages) == ["python", "typescript"]


@pytest.mark.parametrize(
    "data", [b"\x0a\x05ab", b"\x0f", b"\xff\xff\xff"], ids=["truncated", "bad-wire-type", "junk"]
)
async def test_capabilities_refuse_bytes_that_are_no_request(world: World, data: bytes) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(world.client.capabilities(data), HANG_S)
    Refused("MALFORMED_MESSAGE", "GetCapabilitiesRequest").check(Exchange([], caught.value))
    await still_serving(world)


# -- limits of one stream message ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def small_messages() -> AsyncIterator[tuple[RunningRuntime, Client]]:
    """A runtime whose stream messages are at most 64 KiB."""
    before = child_pids()  # the module's runtime may be serving too
    settings = grpc_settings(
        max_output_bytes=16 << 10, default_max_output_bytes=16 << 10, max_message_bytes=64 << 10
    )
    running = await start(settings)
    big = [("grpc.max_send_message_length", 1 << 24), ("grpc.max_receive_message_length", 1 << 24)]
    try:
        async with grpc.aio.insecure_channel(running.address, options=big) as channel:
            yield running, connect(channel)
    finally:
        await running.stop(0)
    assert child_pids() == before, "a worker outlived the runtime"


@pytest.mark.parametrize("lang", LANGUAGES, ids=[lang.name for lang in LANGUAGES])
@pytest.mark.parametrize(
    ("token", "name", "traceparent"),
    [(b"k" * 40_000, "t", ""), (b"", "n" * 40_000, ""), (b"", "t", "x" * 40_000)],
    ids=["40kb-token", "40kb-binding-name", "40kb-traceparent"],
)
async def test_large_start_fields_leave_less_room_for_arguments(
    token: bytes, name: str, traceparent: str, lang: Lang
) -> None:
    """A binding call carries the token, the binding name and the trace context (as the
    caller sent it, when tracing is off) besides its arguments: arguments that fit alone but
    not beside 40 KB of those fail that call, naming the limit, instead of breaking the stream
    with a message over the 64 KiB limit (RESOURCE_EXHAUSTED, no ErrorInfo, no terminal)."""
    message = start_message_in(lang.name, lang.first_binding_twice, name)
    message.start.token = token
    message.start.trace_context.traceparent = traceparent
    async with small_messages() as (_running, client):
        exchange = await asyncio.wait_for(
            talk(message, on_call=lambda c: [value(c.call_id, "12")])(client), HANG_S
        )
    assert exchange.error is None, f"{exchange.error.code()}: {exchange.error.details()}"
    terminal = exchange.seen[-1].terminal
    first, second = json.loads(terminal.success.value_json)
    assert first.startswith("binding arguments are too large to send"), first
    assert f"max_message_bytes {64 << 10}" in first, first
    assert second == 12
    assert [c.arguments_json for c in exchange.calls] == ['"xxxxxxxxxx"']
