"""The TypeScript worker's contract at its channel: real ``node`` processes started with the
channel on fd 3, the runtime's real start frame, every frame read by the runtime's own parser.

The texts are the Python worker's (``bootstrap.py``, ``framing.py``), so the runtime handles
both workers with the same code."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest

from runtime_service.frame_decoding import LARGE_FRAME_BYTES, decode_frame
from runtime_service.protocol import DoneMessage
from runtime_service.worker import flatwire, framing
from runtime_service.worker.framing import LOSSY_ARGUMENTS, LOSSY_COMPLETION
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from runtime_service.worker.program import NO_ARGUMENTS
from tests.runtime.ts_worker import TsWorker, echo_reply, run_ts


def test_ready_reports_boot_cpu_and_echoes_the_launcher_report() -> None:
    worker = TsWorker({"filesystem": "private-root", "setup-us": "12"})
    try:
        report = worker.ready()["sandbox"]
    finally:
        worker.close()
    assert report["filesystem"] == "private-root"
    assert report["setup-us"] == "12"
    assert float(report["cpu-s"]) > 0


def test_erasable_typescript_runs_with_logs_in_order() -> None:
    program = (
        "interface Point { x: number; y: number }\n"
        "const p: Point = { x: 1, y: 2 };\n"
        "console.log('point', p);\n"
        "process.stdout.write('raw-out\\n');\n"
        "console.warn('careful');\n"
        "const sum = (a: number, b: number): number => a + b;\n"
        "return sum(p.x, p.y) as number;\n"
    )
    outcome = run_ts(program)
    assert outcome.logs == ["point { x: 1, y: 2 }", "raw-out\n", "careful"]
    assert outcome.value == 3
    assert outcome.returncode is None  # it waited to be killed


def test_console_methods_format_like_util_format() -> None:
    program = (
        "console.log('%s=%d', 'a', 5);\nconsole.info([1, 'x']);\n"
        "console.error(new Map([[1, 2]]));\n"
        "console.debug('%o', { a: 1 });\nconsole.log();\nprocess.stderr.write(Buffer.from('b'));\n"
        "globalThis.console.log('global');\n"
    )
    outcome = run_ts(program)
    assert outcome.logs == [
        "a=5",
        "[ 1, 'x' ]",
        "Map(1) { 1 => 2 }",
        "{ a: 1 }",
        "",
        "b",
        "global\n",
    ]
    assert outcome.last == {"t": "done"}


def test_binding_calls_round_trip_with_increasing_ids() -> None:
    program = (
        "const a = await tools.echo({ n: 1, s: 'é' });\n"
        "const [b, c] = await Promise.all([tools.echo([1, 2]), tools['my-tool']({ k: null })]);\n"
        "return { a, b, c };\n"
    )
    outcome = run_ts(program)
    assert [(call["id"], call["name"]) for call in outcome.calls] == [
        (1, "echo"),
        (2, "echo"),
        (3, "my-tool"),
    ]
    assert flatwire.decode(outcome.calls[0]["args"]) == {"n": 1, "s": "é"}
    assert outcome.value == {"a": {"n": 1, "s": "é"}, "b": [1, 2], "c": {"k": None}}


def test_large_integers_reach_the_program_as_bigint_and_go_back_exact() -> None:
    big = 2**70 + 1

    def reply(call: dict[str, Any]) -> dict[str, Any]:
        value = {"big": big, "safe": 2**53 - 1, "unsafe": 2**53, "float": 2.0**60}
        return {"t": "reply", "id": call["id"], "ok": True, "value": flatwire.encode(value)}

    program = (
        "const v = await tools.echo({});\n"
        "return [typeof v.big, v.big + 1n, typeof v.safe, typeof v.unsafe, typeof v.float,"
        " v.float, 2 ** 60, 2n ** 64n];\n"
    )
    outcome = run_ts(program, reply)
    assert outcome.value == [
        "bigint",
        big + 1,
        "number",
        "bigint",
        "number",
        2.0**60,
        2.0**60,
        2**64,
    ]
    value = outcome.value
    assert isinstance(value, list)
    assert type(value[5]) is float and type(value[6]) is float and type(value[7]) is int


def test_tool_failures_are_tool_call_errors() -> None:
    program = (
        "try {\n  await tools.fail({});\n} catch (e) {\n"
        "  return [e instanceof ToolCallError, e instanceof Error, e.name, e.toolName, e.message,"
        " Object.keys(e)];\n}\n"
    )
    outcome = run_ts(program)
    assert outcome.value == [
        True,
        True,
        "ToolCallError",
        "fail",
        "fail refused",
        ["name", "toolName"],
    ]


def test_an_uncaught_tool_failure_names_the_programs_line() -> None:
    outcome = run_ts("const x: number = 1;\nawait tools.fail({});\n")
    assert outcome.error == (
        "exception",
        "ToolCallError: fail refused\n    at async program.ts:2:1",
    )


def test_tools_is_own_properties_only() -> None:
    # A name that is no own binding, inherited ones included, is refused when read (the Python
    # worker's AttributeError); only `then` and `toJSON`, probed by the language itself, and
    # symbols read as undefined.
    program = (
        "const read = (name: string) => { try { return typeof (tools as any)[name]; }"
        " catch (e) { return (e as Error).message; } };\n"
        "return [read('constructor'), read('hasOwnProperty'), read('toString'), read('then'),"
        " read('toJSON'), typeof (tools as any)[Symbol.iterator],"
        " Object.getPrototypeOf(tools), Object.keys(tools), Object.isFrozen(tools),"
        " 'constructor' in tools, JSON.stringify(tools) === '{}',"
        " await tools.__proto__({ p: 1 }), tools['my-tool'].name];\n"
    )
    outcome = run_ts(program)
    listed = "bindings: __proto__, echo, fail, my-tool, never"
    assert outcome.value == [
        f"tools has no binding 'constructor'; {listed}",
        f"tools has no binding 'hasOwnProperty'; {listed}",
        f"tools has no binding 'toString'; {listed}",
        "undefined",
        "undefined",
        "undefined",
        None,
        ["__proto__", "echo", "fail", "my-tool", "never"],
        True,
        False,
        True,
        {"p": 1},
        "my-tool",
    ]
    assert [call["name"] for call in outcome.calls] == ["__proto__"]


def test_the_parameters_are_exactly_tools_tool_call_error_and_console() -> None:
    program = (
        "const own = [typeof tools, typeof ToolCallError, typeof console.log, typeof require,"
        " typeof module, typeof exports, JSON.stringify(process.env), Object.keys(console)];\n"
        "let escaped = 'no';\ntry { await import('node:fs'); escaped = 'yes'; } catch { }\n"
        "return [...own, escaped];\n"
    )
    outcome = run_ts(program)
    assert outcome.value == [
        "object",
        "function",
        "function",
        "undefined",
        "undefined",
        "undefined",
        "{}",
        ["log", "info", "warn", "error", "debug"],
        "no",
    ]


@pytest.mark.parametrize(
    ("program", "message"),
    [
        ("tools.echo()", NO_ARGUMENTS),
        ("tools.echo(undefined)", NO_ARGUMENTS),
        ("tools.echo({ when: new Date(0) })", f"{LOSSY_ARGUMENTS}: Date is not a JSON value"),
        ("tools.echo([NaN])", f"{LOSSY_ARGUMENTS}: nan is not a finite number"),
        ("tools.echo({ f() {} })", f"{LOSSY_ARGUMENTS}: function is not a JSON value"),
        (
            "tools.echo({ get g() { throw new Error('no'); } })",
            f'{LOSSY_ARGUMENTS}: reading property "g" threw: no',
        ),
        (
            "tools.echo((() => { const a: any[] = []; a.push(a); return a; })())",
            f"{LOSSY_ARGUMENTS}: value contains a cycle",
        ),
        (
            "tools.echo(10n ** 4300n)",
            f"{LOSSY_ARGUMENTS}: an integer has more than 4300 digits, the most the runtime's "
            "channel carries (send it as a string)",
        ),
    ],
    ids=["no-args", "undefined", "date", "nan", "function", "getter", "cycle", "long-int"],
)
def test_lossy_arguments_are_refused_before_anything_is_sent(program: str, message: str) -> None:
    outcome = run_ts(
        f"try {{ await {program}; }} catch (e) {{ console.log(e.name, e.toolName, e.message); }}\n"
        "return await tools.echo({ next: true });\n"
    )
    assert outcome.logs == [f"ToolCallError echo {message}"]
    # The refused call took no id: the next call is the first.
    assert [call["id"] for call in outcome.calls] == [1]
    assert outcome.value == {"next": True}


@pytest.mark.parametrize(
    ("program", "where", "what"),
    [
        ("console.log('ran');\nenum Color { Red }\n", "program.ts:2:1", "TypeScript enum"),
        (
            "console.log('ran');\nconst a = 1;\n  namespace N { export const x = 1; }\n",
            "program.ts:3:3",
            "namespace",
        ),
        (
            "console.log('ran');\nclass P { constructor(private x: number) {} }\n",
            "program.ts:2:31",
            "parameter property",
        ),
        ("console.log('ran');\nlet y = <any>1;\n", "program.ts:2:9", "angle-bracket"),
        ("console.log('ran');\nlet z = ;\n", "program.ts:2:9", "Expression expected"),
    ],
    ids=["enum", "namespace", "parameter-property", "angle-bracket", "syntax"],
)
def test_non_erasable_syntax_is_an_exception_before_any_code_runs(
    program: str, where: str, what: str
) -> None:
    outcome = run_ts(program)
    assert outcome.logs == []  # no program code ran
    assert outcome.error is not None
    kind, message = outcome.error
    assert kind == "exception"
    first, second = message.split("\n")
    assert first.startswith("SyntaxError: ") and what in first, message
    assert second == f"    at {where}"


def test_compile_errors_of_v8_name_their_line_and_column() -> None:
    # Strict-mode errors the type stripper lets through: V8 finds them when it compiles.
    outcome = run_ts("const a = 1;\n\n  function f(a: number, a: number) {}\n")
    assert outcome.error == (
        "exception",
        "SyntaxError: Duplicate parameter name not allowed in this context\n    at program.ts:3:25",
    )


def test_stack_traces_name_the_programs_own_lines_and_columns() -> None:
    program = (
        "type Pair<T> = [T, T];\n"
        "interface Shape {\n  area(): number;\n}\n"
        "function explode(p: Pair<number>): never {\n"
        "  const total: number = p[0] + p[1]; throw new RangeError(`bad ${total}`);\n"
        "}\n"
        "explode([1, 2] as Pair<number>);\n"
    )
    outcome = run_ts(program)
    column = program.split("\n")[5].index("throw new") + 1 + len("throw ")
    assert outcome.error == (
        "exception",
        f"RangeError: bad 3\n    at explode (program.ts:6:{column})\n    at program.ts:8:1",
    )


@pytest.mark.parametrize(
    ("program", "message"),
    [
        ("throw 'plain text';", "plain text"),
        ("throw { toString() { return 'custom'; } };", "custom"),
        ("throw { toString() { throw new Error('x'); } };", "program threw an unrenderable value"),
        ("throw Symbol('s');", "Symbol(s)"),
        (
            "setTimeout(() => { throw new TypeError('late'); }, 0);\nawait new Promise(() => {});",
            "TypeError: late\n    at Timeout._onTimeout (program.ts:1:26)",
        ),
    ],
    ids=["string", "custom", "unrenderable", "symbol", "timer"],
)
def test_thrown_values_are_exceptions(program: str, message: str) -> None:
    assert run_ts(program).error == ("exception", message)


def test_completion_values() -> None:
    assert run_ts("const x = 1;").last == {"t": "done"}
    assert run_ts("return undefined;").last == {"t": "done"}
    assert run_ts("return null;").value is None
    for lossy in ("() => 1", "new Map()", "[1, , 2]", "NaN", "-0", "{ a: undefined }"):
        outcome = run_ts(f"console.log('kept');\nreturn {lossy};")
        assert outcome.error == ("invalid-output", LOSSY_COMPLETION), lossy
        assert outcome.logs == ["kept"]
    outcome = run_ts("return 10n ** 4300n;")
    assert outcome.error == (
        "invalid-output",
        f"{LOSSY_COMPLETION}: an integer has more than 4300 digits, the most the runtime's "
        "channel carries (send it as a string)",
    )


def test_a_100000_deep_completion_round_trips() -> None:
    program = "let v: unknown[] = [];\nfor (let i = 0; i < 100000; i++) v = [v];\nreturn v;\n"
    outcome = run_ts(program)
    value = outcome.value
    depth = 0
    while value != []:
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
        depth += 1
    assert depth == 100000


# -- the output ledger (the same boundaries as the Python worker's) --------------------------


@pytest.mark.parametrize(
    ("program", "logs", "last"),
    [
        ("console.log('x'.repeat(60));", ["x" * 60], {"t": "done"}),
        ("console.log('x'.repeat(61));", ["x" * 60], {"t": "output-limit"}),
        ("process.stdout.write('x'.repeat(61));", ["x" * 60], {"t": "output-limit"}),
        ("return 'x'.repeat(92);", [], "value"),
        (
            "return 'x'.repeat(93);",
            [],
            {"t": "done", "error": {"kind": "output-limit", "message": ""}},
        ),
        ("console.log('é'.repeat(30));", ["é" * 30], {"t": "done"}),
        ("console.log('é'.repeat(31));", ["é" * 30], {"t": "output-limit"}),
        (
            "console.log('ab');\nconsole.log('x'.repeat(60));",
            ["ab", "x" * 23],
            {"t": "output-limit"},
        ),
        (
            "throw new Error('x'.repeat(100));",
            [],
            {"t": "done", "error": {"kind": "output-limit", "message": ""}},
        ),
    ],
    ids=[
        "log-fits",
        "log-over",
        "stdout-over",
        "value-fits",
        "value-over",
        "utf8-fits",
        "utf8-over",
        "combined",
        "giant-message",
    ],
)
def test_output_ledger_is_exact(program: str, logs: list[str], last: object) -> None:
    # A 96-byte cap: '["x...x"]' with 60 characters and the line's overhead (32) fill it, as
    # does the value '"x...x"' with 92 beside the empty logs array.
    assert LOG_LINE_OVERHEAD == 32
    outcome = run_ts(program, max_output_bytes=96)
    assert outcome.logs == logs
    if last == "value":
        assert outcome.value == "x" * 92
    else:
        assert outcome.last == last


def test_lone_surrogates_in_logs_become_replacement_characters() -> None:
    outcome = run_ts("console.log('a\\ud800b');\nreturn 'a\\ud800b';")
    assert outcome.logs == ["a\ufffdb"]
    assert outcome.value == "a\ud800b"  # values are lossless JSON: the escape stays


def test_writes_bypassing_the_streams_reach_the_pipes() -> None:
    program = (
        "const fs = process.getBuiltinModule?.('node:fs');\n"
        "if (fs) fs.writeSync(1, 'direct');\nreturn fs ? 'written' : 'no fs';\n"
    )
    outcome = run_ts(program)
    if outcome.value == "written":
        assert outcome.stdout == b"direct"


# -- exits and the channel -------------------------------------------------------------------


def test_process_exit_is_a_real_exit_with_its_code() -> None:
    outcome = run_ts("console.log('x');\nprocess.exit(7);\nconsole.log('never');")
    assert outcome.logs == ["x"]
    assert outcome.last is not None and outcome.last["t"] == "log"
    # The runtime reports this as "worker exited with code 7 before completing".
    assert outcome.returncode == 7


def test_a_call_leaves_before_a_busy_loop() -> None:
    worker = TsWorker()
    try:
        worker.ready()
        worker.start("tools.echo({ first: true });\nwhile (true) {}\n")
        outcome = worker.drive(until=1)
    finally:
        worker.close()
    assert [call["name"] for call in outcome.calls] == ["echo"]


def test_replies_for_unknown_ids_and_junk_frames_are_ignored() -> None:
    def reply(call: dict[str, Any]) -> dict[str, Any] | None:
        return None

    worker = TsWorker()
    try:
        worker.ready()
        worker.start("return await tools.echo({ n: 1 });")
        outcome = worker.drive(reply, until=1)
        worker.sock.sendall(b"\x00\x00\x00\x05junk!")
        worker.send({"t": "reply", "id": 99, "ok": True, "value": [1]})
        worker.send({"t": "mystery"})
        worker.send({"t": "reply", "id": 1, "ok": True, "value": [{"kind": "bogus"}]})
        worker.send({"t": "reply", "id": 1, "ok": True, "value": ["second answer ignored"]})
        final = worker.drive()
    finally:
        worker.close()
    assert outcome.calls[0]["id"] == 1
    assert final.error == (
        "exception",
        "ToolCallError: binding resolution must be lossless JSON\n    at async program.ts:1:8",
    )


def test_the_worker_exits_when_the_channel_closes() -> None:
    worker = TsWorker()
    worker.ready()
    worker.sock.close()
    assert worker.process.wait(30) == 0
    worker.process.communicate()


def test_a_large_completion_is_spelled_as_the_runtime_reads_large_frames() -> None:
    program = "return Array.from({ length: 60000 }, (_, i) => ({ i, s: 'é' + i }));"
    outcome = run_ts(program, max_output_bytes=64 << 20)
    payload = outcome.payloads[-1]
    assert len(payload) > LARGE_FRAME_BYTES
    decoded = decode_frame(payload, 64 << 20)
    assert isinstance(decoded.message, DoneMessage)
    assert decoded.problem is None
    assert decoded.value == [{"i": i, "s": f"é{i}"} for i in range(60000)]
    assert decoded.value_json == json.dumps(
        decoded.value, separators=(",", ":"), ensure_ascii=False
    )


def test_echo_reply_helper_is_the_default() -> None:
    assert echo_reply({"t": "call", "id": 1, "name": "never", "args": [1]}) is None


def _unanswered(call: dict[str, Any]) -> None:
    return None


def _reply_frame(call_id: int, value: object) -> bytes:
    return framing.pack({"t": "reply", "id": call_id, "ok": True, "value": flatwire.encode(value)})


def test_replies_cut_anywhere_or_batched_arrive_whole_and_in_order() -> None:
    """The worker reads its channel into one reused buffer: a reply cut across reads, several
    replies in one read followed by the start of the next, and a reply larger than one read
    (64 KiB) must each reach the program whole -- bytes held back from one read must not be
    overwritten by the next. (Pauses between writes give the worker time to read each piece
    on its own; without them the pieces may merge, which the worker must handle too.)"""
    long_text = "é" * 3000  # its reply spans ~18 KB: the next read overwrites the buffer's start
    huge_text = "z" * 300_000  # read in several 64 KiB pieces
    program = (
        "const a = await tools.echo(1);\n"
        "const [b, c, d] = await Promise.all([tools.echo(2), tools.echo(3), tools.echo(4)]);\n"
        "const e = await tools.echo(5);\n"
        "return { a, b, c, d, e: [e.length, e.slice(0, 3), e.slice(-3)] };\n"
    )
    worker = TsWorker()
    try:
        worker.ready()
        worker.start(program)
        [first] = worker.drive(_unanswered, until=1).calls
        reply = _reply_frame(first["id"], "one")
        # Cut inside the header, inside the payload, and before the last byte.
        cuts = [0, 2, 7, len(reply) - 1, len(reply)]
        for start, end in itertools.pairwise(cuts):
            worker.sock.sendall(reply[start:end])
            time.sleep(0.05)
        batch = worker.drive(_unanswered, until=3).calls
        assert [call["id"] for call in batch] == [2, 3, 4]
        held = _reply_frame(4, long_text)
        worker.sock.sendall(_reply_frame(2, "two") + _reply_frame(3, ["three"]) + held[:9])
        time.sleep(0.05)
        worker.sock.sendall(held[9:])
        [last] = worker.drive(_unanswered, until=1).calls
        worker.sock.sendall(_reply_frame(last["id"], huge_text))
        outcome = worker.drive()
    finally:
        worker.close()
    assert outcome.value == {
        "a": "one",
        "b": "two",
        "c": ["three"],
        "d": long_text,
        "e": [300_000, "zzz", "zzz"],
    }


def test_the_warm_up_rehearsal_leaves_no_trace_in_the_run() -> None:
    """The worker rehearses binding calls before ready (to warm the call path): none of it
    reaches the channel, and the program's own calls are numbered from 1."""
    worker = TsWorker()
    try:
        worker.ready()
        worker.start("await tools.echo(1);\nreturn await tools.echo({ k: 2 });")
        outcome = worker.drive()
    finally:
        worker.close()
    assert [frame["t"] for frame in outcome.frames] == ["call", "call", "done"]
    assert [(call["id"], call["name"]) for call in outcome.calls] == [(1, "echo"), (2, "echo")]
    assert outcome.value == {"k": 2}
