"""The Monty backend (``runtime_service/languages/monty.py``): opt-in, served through the real
``RuntimeService.Run`` API on loopback, its ``monty`` process inside the run's sandbox.

- off by default: a runtime left at its defaults does not serve it; naming it in ``languages``
  does;
- the language corpus, less the cases listed under ``[skip]`` in ``language_corpus/monty.toml``
  (what Monty cannot express);
- the contract: ``asyncio.gather`` fan-out over bindings, big integers both ways, line:column
  of what Monty refuses, nothing of one run in the next;
- hostile programs (``open``, ``os``, imports, deep recursion, a huge allocation, an infinite
  loop): each ends only its own run, and the next run on the same runtime succeeds.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import tomllib
from collections.abc import AsyncIterator, Iterator

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from runtime_service.config import RuntimeSettings
from runtime_service.languages import backends, register
from runtime_service.languages import monty as monty_backend
from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.worker_process import WorkerSpec
from tests.runtime.conftest import (
    can_isolate,
    connected,
    drive,
    echo_answer,
    grpc_settings,
    serving,
    start_message_in,
)
from tests.runtime.language_corpus import corpus

NAME = monty_backend.NAME

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pydantic_monty") is None,
    reason="the pydantic-monty package is not installed (scripts/bootstrap installs it)",
)


@pytest.fixture
def monty_registered() -> Iterator[None]:
    why = monty_backend.BACKEND.unavailable(WorkerSpec())
    assert why is None, why  # installed (the module-level skip), so it must be servable
    unregister = register(monty_backend.BACKEND)
    try:
        yield
    finally:
        unregister()


@pytest.fixture
async def stub(monty_registered: None) -> AsyncIterator[corpus.Stub]:
    async with serving(grpc_settings()) as running, connected(running) as client:
        yield client


def _skips() -> dict[str, str]:
    path = corpus.HERE / f"{NAME}.toml"
    table: dict[str, str] = tomllib.loads(path.read_text())["skip"]
    return table


async def _run(
    stub: corpus.Stub, source: str, expect: dict[str, object], **budgets: int
) -> corpus.Seen:
    case = corpus.Case("monty", dict(expect), dict(budgets))
    seen = await corpus.run_case(stub, NAME, case, source)
    assert corpus.check(case, seen) == [], (seen.outcome, seen.message, seen.value_json)
    return seen


def test_monty_is_not_served_by_default() -> None:
    assert NAME not in [item.name for item in backends()]


async def test_monty_is_served_where_languages_names_it(monty_registered: None) -> None:
    runtime = Runtime(RuntimeOptions(languages=("python", NAME)))
    try:
        assert NAME in runtime.languages
    finally:
        await runtime.dispose()


def test_every_corpus_case_has_a_source_or_a_stated_skip() -> None:
    ids = [case.id for case in corpus.cases()]
    sources, skips = set(corpus.sources(NAME)), _skips()
    assert not sources & set(skips)
    assert sources | set(skips) == set(ids)
    assert all(reason.strip() for reason in skips.values())


@pytest.mark.exclusive  # its compute-budget case races a 2 s feed time limit
async def test_monty_passes_the_corpus_less_its_skips(stub: corpus.Stub) -> None:
    ran, failures = await corpus.conformance(stub, NAME)
    assert failures == {}
    skips = _skips()
    assert ran == [case.id for case in corpus.cases() if case.id not in skips]


async def test_gather_fans_out_and_big_integers_are_lossless(stub: corpus.Stub) -> None:
    source = """
import asyncio
big = 2 ** 100 + 1
a, b, c = await asyncio.gather(tools.echo({'n': big}), tools.echo({'n': 2}), tools.echo({}))
print('got', a['echo']['n'] - big)
return [a, b, c, -big]
"""
    seen = await _run(stub, source, {"outcome": "success", "logs": ["got 0"]})
    big = 2**100 + 1
    assert json.loads(seen.value_json) == [
        {"echo": {"n": big}},
        {"echo": {"n": 2}},
        {"echo": {}},
        -big,
    ]
    assert [name for name, _ in seen.calls] == ["echo", "echo", "echo"]
    assert json.loads(seen.calls[0][1]) == {"n": big}


async def test_gathered_calls_are_all_out_before_any_is_answered(stub: corpus.Stub) -> None:
    """Nothing is answered until the third call arrives: sequential calls would never get
    there (the run would end at its wall budget instead)."""
    source = (
        "import asyncio\n"
        "return await asyncio.gather(tools.echo({'i': 0}), tools.echo({'i': 1}), "
        "tools.echo({'i': 2}))"
    )
    call = stub.Run()
    await call.write(start_message_in(NAME, source, "echo", wall_ms=20_000))
    held: list[pb.BindingCall] = []
    terminal = None
    async for message in call:
        kind = message.WhichOneof("kind")
        if kind == "binding_call":
            held.append(message.binding_call)
            if len(held) == 3:
                for waiting in reversed(held):  # answered out of order, too
                    result = await echo_answer(waiting)
                    await call.write(pb.RunRequest(call_result=result))
        elif kind == "terminal":
            terminal = message.terminal
            await call.done_writing()
    assert terminal is not None and terminal.WhichOneof("outcome") == "success", terminal
    expected = [{"echo": {"i": i}} for i in range(3)]
    assert json.loads(terminal.success.value_json) == expected


async def test_what_monty_refuses_ends_exception_at_its_line_and_column(
    stub: corpus.Stub,
) -> None:
    source = "x = 1\n\ndef g():\n    yield x\nreturn list(g())"
    seen = await _run(stub, source, {"outcome": "exception"})
    assert "yield" in seen.message and "line 4:" in seen.message, seen.message


async def test_a_program_that_never_names_tools_keeps_its_lines(stub: corpus.Stub) -> None:
    """Such a program's prelude leaves out the import of ``tools`` (the bridge's
    ``wrap_program``) on an empty line: its problems are still at its own line:column."""
    seen = await _run(stub, "x = 1\n\nreturn x // 0", {"outcome": "exception"})
    assert "ZeroDivisionError" in seen.message and "line 3:" in seen.message, seen.message


TOOLS_SPELLED = [
    pytest.param("return await tools.echo({'i': 1})", id="plain"),
    pytest.param("return f\"{await tools.echo({'i': 1})}\"", id="f-string-expression"),
    # NFKC: Python (and Monty) read fullwidth letters in an identifier as their ASCII ones.
    pytest.param("return await \uff54\uff4f\uff4f\uff4c\uff53.echo({'i': 1})", id="fullwidth"),
]


@pytest.mark.parametrize("source", TOOLS_SPELLED)
async def test_every_spelling_of_tools_reaches_the_bindings(stub: corpus.Stub, source: str) -> None:
    seen = await _run(stub, source, {"outcome": "success"})
    assert [name for name, _ in seen.calls] == ["echo"]
    assert json.loads(seen.calls[0][1]) == {"i": 1}


async def test_nothing_of_one_run_is_seen_by_the_next(stub: corpus.Stub) -> None:
    await _run(
        stub,
        "global leaked\nleaked = 41\nreturn leaked",
        {"outcome": "success", "value_json": "41"},
    )
    seen = await _run(
        stub,
        "try:\n    return leaked\nexcept NameError:\n    return 'fresh'",
        {"outcome": "success", "value_json": '"fresh"'},
    )
    assert seen.logs == []


HOSTILE = [
    pytest.param("return open('/etc/passwd').read()", "PermissionError", id="open"),
    pytest.param("import os\nreturn os.listdir('/')", "", id="os-listdir"),
    pytest.param("import os\nreturn os.getenv('HOME')", "", id="os-getenv"),
    pytest.param("import subprocess\nreturn 1", "ModuleNotFoundError", id="import-subprocess"),
    pytest.param("import socket\nreturn 1", "ModuleNotFoundError", id="import-socket"),
    pytest.param(
        "def f(n):\n    return f(n + 1)\nreturn f(0)", "RecursionError", id="deep-recursion"
    ),
]


@pytest.mark.parametrize(("source", "named"), HOSTILE)
async def test_a_hostile_program_ends_only_its_run(
    stub: corpus.Stub, source: str, named: str
) -> None:
    seen = await _run(stub, source, {"outcome": "exception"})
    assert named in seen.message, seen.message
    await _run(stub, "return 1", {"outcome": "success", "value_json": "1"})


async def test_a_huge_allocation_ends_only_its_run(stub: corpus.Stub) -> None:
    source = "x = []\nwhile True:\n    x.append('y' * 1000000)"
    seen = await corpus.run_case(
        stub, NAME, corpus.Case("alloc", {}, {"memory_bytes": 64 << 20}), source
    )
    assert seen.outcome in ("abort", "worker-exit", "exception"), seen
    assert "memory" in seen.message.lower(), seen.message
    await _run(stub, "return 1", {"outcome": "success", "value_json": "1"})


async def test_an_infinite_loop_ends_as_timeout(stub: corpus.Stub) -> None:
    seen = await corpus.run_case(
        stub, NAME, corpus.Case("spin", {}, {"compute_ms": 300}), "while True:\n    pass"
    )
    assert seen.outcome == "timeout", seen
    await _run(stub, "return 1", {"outcome": "success", "value_json": "1"})


def test_montys_own_clock_bounds_a_program_only_where_no_cgroup_meters_the_host() -> None:
    """Monty's feed clock is wall time while the program runs: where the run cgroup meters
    the bridge and the monty process (the runtime's compute budget ends the run ``timeout``),
    no such limit is set, or a busy machine would end a program ``exception`` early."""
    from runtime_service.worker.core import Channel
    from runtime_service.worker_monty import bridge

    start = {"program": "", "bindings": [], "max_output_bytes": 100, "cpu_seconds": 0.5}
    mine, theirs = socket.socketpair()
    with mine, theirs:
        channel = Channel(mine)
        metered = bridge.MontyRun(channel, start, iter(()), metered=True).limits()
        alone = bridge.MontyRun(channel, start, iter(()), metered=False).limits()
    assert "max_feed_duration_secs" not in metered
    assert alone["max_feed_duration_secs"] == 2.0


def test_the_settings_accept_monty_only_by_name() -> None:
    assert RuntimeSettings().runtime_options().languages == ()
    named = RuntimeSettings(languages=["python", NAME]).runtime_options()
    assert named.languages == ("python", NAME)
    with pytest.raises(ValueError, match="unknown"):
        RuntimeSettings(languages=["cobol"])


async def test_multi_line_strings_keep_their_text_and_lines_stay_the_programs(
    stub: corpus.Stub,
) -> None:
    text = "s = '''a\n  b'''\nreturn s"
    await _run(stub, text, {"outcome": "success", "value_json": '"a\\n  b"'})
    seen = await _run(stub, "s = '''a\nb'''\nx = 1\nreturn 1 / 0", {"outcome": "exception"})
    assert "ZeroDivisionError" in seen.message and "line 4:" in seen.message, seen.message
    # A quoted string continued by a backslash spans lines too; its second line is its own.
    text = "s = 'a\\\n  b'\nreturn s"
    await _run(stub, text, {"outcome": "success", "value_json": '"a  b"'})
    seen = await _run(stub, 'return "a" + \\\n  "b" + 1', {"outcome": "exception"})
    assert "TypeError" in seen.message and "line 1:" in seen.message, seen.message


async def test_an_explicit_none_is_a_value_and_a_fall_off_is_none(stub: corpus.Stub) -> None:
    await _run(stub, "return None", {"outcome": "success", "value_json": "null"})
    await _run(stub, "x = 1", {"outcome": "success", "value_json": ""})


async def test_capabilities_describe_monty_isolated_like_every_worker(stub: corpus.Stub) -> None:
    caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert NAME in caps.languages
    isolation = caps.language_isolation[NAME]
    assert monty_backend.BACKEND.capability.interpreter in isolation.enforced
    mechanisms = [(item.name, item.enforced) for item in isolation.mechanisms]
    python = [(item.name, item.enforced) for item in caps.language_isolation["python"].mechanisms]
    assert mechanisms == python  # the same sandbox steps, measured from a real worker
    if can_isolate():
        assert all(enforced for _, enforced in mechanisms), mechanisms


async def test_a_failed_call_is_caught_as_tool_call_error(stub: corpus.Stub) -> None:
    """``ToolCallError`` is ``RuntimeError`` in a Monty program (the bridge binds it): the
    failure is caught by that name, and its text says the reason."""
    source = """
try:
    await tools.fail({})
except ToolCallError as e:
    caught = [str(e), ToolCallError is RuntimeError]
try:
    await tools.fail({})
except ValueError:
    return 'not a ValueError'
except RuntimeError as e:
    return caught + [str(e) == caught[0]]
"""
    seen = await _run(stub, source, {"outcome": "success"})
    assert json.loads(seen.value_json) == ["ToolCallError: fail failed", True, True]
    # An uncaught one is named by the same name, at the program's own line.
    seen = await _run(stub, "x = 1\nawait tools.fail({})", {"outcome": "exception"})
    assert "ToolCallError: fail failed" in seen.message and "line 2:" in seen.message, seen


def _nest(depth: int) -> str:
    """A program line that builds a value ``depth`` lists deep around ``1``."""
    return f"v = 1\nfor _ in range({depth}):\n    v = [v]\n"


def _depth_of(text: str) -> int:
    """How many lists deep a JSON text of nested one-element lists is (iterative)."""
    depth = len(text) - len(text.lstrip("["))
    assert text == "[" * depth + "1" + "]" * depth, text[:40]
    return depth


async def test_a_value_nested_too_deep_is_refused_never_cut(stub: corpus.Stub) -> None:
    """pydantic_monty replaces whatever sits deeper than the recursion budget left (200 at
    the top level) by the string ``<deeply nested>`` as a value leaves Monty: the bridge
    refuses such a value instead of passing the cut one on."""
    why = "nested too deep for Monty (its conversion left '<deeply nested>' in the value)"
    # A completion: 199 deep arrives whole, 200 ends the run invalid-output, with why.
    seen = await _run(stub, _nest(199) + "return v", {"outcome": "success"})
    assert _depth_of(seen.value_json) == 199
    seen = await _run(stub, _nest(200) + "return v", {"outcome": "invalid-output"})
    assert seen.message == f"program completion must be lossless JSON: {why}"
    # Deep in a dict, beside shallow members: the same rule.
    dict_source = "v = 1\nfor _ in range(200):\n    v = {'k': v}\nreturn [1, {'a': v}]"
    seen = await _run(stub, dict_source, {"outcome": "invalid-output"})
    assert why in seen.message
    # Call arguments (cut shallower inside the program's frames): the call fails as
    # ToolCallError and nothing goes out.
    source = _nest(200) + (
        "try:\n    await tools.echo(v)\nexcept ToolCallError as e:\n    return str(e)"
    )
    seen = await _run(stub, source, {"outcome": "success"})
    assert json.loads(seen.value_json) == (
        f"ToolCallError: tool arguments must be lossless JSON: {why}"
    )
    assert seen.calls == []
    # Shallower goes out whole, and a far deeper result comes in whole (only values leaving
    # Monty are cut by the conversion): the binding's answer is 3000 deep.
    source = _nest(150) + (
        "r = await tools.echo(v)\nn = 0\nwhile type(r) is list or type(r) is dict:\n"
        "    r = r[0] if type(r) is list else r['echo']\n    n += 1\nreturn [n, r]"
    )

    async def deep_answer(call: pb.BindingCall) -> pb.CallResult:
        assert _depth_of(call.arguments_json) == 150
        return pb.CallResult(call_id=call.call_id, value_json="[" * 3000 + "1" + "]" * 3000)

    _, terminal = await drive(stub, start_message_in(NAME, source, "echo"), deep_answer)
    assert terminal.WhichOneof("outcome") == "success", terminal
    assert json.loads(terminal.success.value_json) == [3000, 1]


async def test_bindings_monty_cannot_name_leave_the_others_callable(stub: corpus.Stub) -> None:
    """A binding named ``odd-name`` or ``class`` is no attribute of the ``tools`` module (no
    Monty program could spell it), and never stops the run or the other bindings."""
    source = "return await tools.echo({'n': 1})"
    start = start_message_in(NAME, source, "odd-name", "class", "echo")
    _, terminal = await drive(stub, start)
    assert terminal.WhichOneof("outcome") == "success", terminal
    assert json.loads(terminal.success.value_json) == {"echo": {"n": 1}}
    start = start_message_in(NAME, "return await tools.odd({})", "odd-name", "echo")
    _, terminal = await drive(stub, start)
    assert terminal.WhichOneof("outcome") == "failure", terminal
    assert terminal.failure.kind == pb.FAILURE_KIND_EXCEPTION
    assert "bindings: echo, odd-name" in terminal.failure.message, terminal
