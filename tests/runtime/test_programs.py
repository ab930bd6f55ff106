"""Python programs in real workers: bootstrap semantics, logs, bindings, completion values."""

from __future__ import annotations

import asyncio

from runtime_service.outcome import BindingCall, BindingResult, RunFailure
from tests.runtime.conftest import ProgramRunner
from tests.runtime.deep import list_depth


async def test_top_level_await_return_and_print(run_program: ProgramRunner) -> None:
    result = await run_program(
        "print('saw', 1)\nvalue = await tools.echo({'a': [1, 2.5, None]})\nreturn value"
    )
    assert result.error is None
    assert result.logs == ["saw 1"]
    assert result.has_value
    assert result.value == {"a": [1, 2.5, None]}


async def test_no_return_means_no_value_but_return_none_is_null(
    run_program: ProgramRunner,
) -> None:
    for program in ("x = 1", "return", "if True:\n    return"):
        result = await run_program(program)
        assert (result.error, result.has_value) == (None, False), program
    result = await run_program("return None")
    assert (result.has_value, result.value) == (True, None)


async def test_nested_function_returns_are_untouched(run_program: ProgramRunner) -> None:
    result = await run_program("def f():\n    return 3\nreturn [f(), (lambda: 4)()]")
    assert result.value == [3, 4]


async def test_stdout_writes_and_raw_fd_writes_are_logs(run_program: ProgramRunner) -> None:
    program = (
        "import sys, os\n"
        "print('a', 'b', sep='-')\n"
        "sys.stdout.write('raw-out\\n')\n"
        "print('err', file=sys.stderr)\n"
        "print('no newline', end='')\n"
        "os.write(1, b'fd1')\n"
        "os.write(2, b'fd2')\n"
        "return 3"
    )
    result = await run_program(program)
    assert result.error is None
    assert result.logs[:4] == ["a-b", "raw-out\n", "err", "no newline"]
    assert sorted(result.logs[4:]) == ["fd1", "fd2"]
    assert result.value == 3


async def test_exactly_two_injected_names(run_program: ProgramRunner) -> None:
    program = (
        "import builtins\n"
        "names = sorted(n for n in globals() if not n.startswith('__'))\n"
        "return names"
    )
    result = await run_program(program)
    assert result.value == ["ToolCallError", "tools"]


async def test_tools_namespace_lookup(run_program: ProgramRunner) -> None:
    program = (
        "out = [await tools['my-tool'](1)]\n"
        "try:\n    tools.missing\nexcept AttributeError:\n    out.append('attr')\n"
        "try:\n    tools['missing']\nexcept KeyError:\n    out.append('key')\n"
        "try:\n    tools.__class__.__mro__[1].__subclasses__\nexcept AttributeError:\n"
        "    out.append('no')\n"
        "out.append(sorted(dir(tools)))\n"
        "return out"
    )
    result = await run_program(program, bindings=("echo", "my-tool"))
    assert result.error is None, result.error
    assert result.value == [1, "attr", "key", ["echo", "my-tool"]]


async def test_tool_call_error_is_typed(run_program: ProgramRunner) -> None:
    program = (
        "try:\n"
        "    await tools.fail({'x': 1})\n"
        "except ToolCallError as exc:\n"
        "    return [exc.toolName, str(exc), exc.message, isinstance(exc, Exception)]"
    )
    result = await run_program(program)
    assert result.value == ["fail", "fail refused", "fail refused", True]


async def test_uncaught_tool_call_error_is_an_exception(run_program: ProgramRunner) -> None:
    result = await run_program("await tools.fail({})")
    assert result.error is not None
    assert result.error.kind == "exception"
    assert result.error.message.endswith("ToolCallError: fail refused")


async def test_lossy_arguments_raise_before_anything_is_sent(run_program: ProgramRunner) -> None:
    calls: list[BindingCall] = []

    async def handler(call: BindingCall) -> BindingResult:
        calls.append(call)
        return BindingResult.success(None)

    program = (
        "out = []\n"
        "for bad in [float('nan'), -0.0, (1, 2), {1: 2}, object(), print, {'a': {1}}]:\n"
        "    try:\n        tools.echo(bad)\n"
        "    except ToolCallError as exc:\n        out.append(exc.toolName)\n"
        "return out"
    )
    result = await run_program(program, handler=handler)
    assert result.value == ["echo"] * 7
    assert calls == []


async def test_lossy_resolution_is_a_typed_failure(run_program: ProgramRunner) -> None:
    async def handler(call: BindingCall) -> BindingResult:
        return BindingResult.success(float("nan"))

    program = "try:\n    await tools.echo(1)\nexcept ToolCallError as exc:\n    return str(exc)"
    result = await run_program(program, handler=handler)
    assert result.value == "binding resolution must be lossless JSON"


async def test_failing_handler_becomes_failed_call(run_program: ProgramRunner) -> None:
    async def handler(call: BindingCall) -> BindingResult:
        raise RuntimeError("backend down")

    program = "try:\n    await tools.echo(1)\nexcept ToolCallError as exc:\n    return str(exc)"
    assert (await run_program(program, handler=handler)).value == "backend down"


async def test_parallel_calls_with_gather(run_program: ProgramRunner) -> None:
    program = (
        "import asyncio\n"
        "results = await asyncio.gather(*(tools.echo(i) for i in range(20)))\n"
        "return results"
    )
    result = await run_program(program)
    assert result.value == list(range(20))


async def test_hundred_thousand_deep_round_trip_through_the_bridge(
    run_program: ProgramRunner,
) -> None:
    program = (
        "value = []\ncursor = value\n"
        "for _ in range(100000):\n    child = []\n    cursor.append(child)\n    cursor = child\n"
        "return await tools.echo(value)"
    )
    seen: list[int] = []

    async def handler(call: BindingCall) -> BindingResult:
        seen.append(list_depth(call.arguments))
        return BindingResult.success(call.arguments)

    result = await run_program(program, handler=handler)
    assert result.error is None
    assert seen == [100_000]
    assert list_depth(result.value) == 100_000


async def test_exception_traceback_lines_match_the_program(run_program: ProgramRunner) -> None:
    program = "x = 1\n\ndef inner():\n    raise ValueError('boom')\n\ninner()\n"
    result = await run_program(program)
    assert result.error is not None
    assert result.error.kind == "exception"
    message = result.error.message
    assert 'File "<program>", line 6, in __program__' in message
    assert 'File "<program>", line 4, in inner' in message
    assert "raise ValueError('boom')" in message
    assert message.endswith("ValueError: boom")
    assert "bootstrap" not in message


async def test_syntax_error_reports_the_program_line(run_program: ProgramRunner) -> None:
    result = await run_program("x = 1\ny = (\n")
    assert result.error is not None
    assert result.error.kind == "exception"
    assert 'File "<program>", line 2' in result.error.message
    assert "SyntaxError" in result.error.message


async def test_yield_in_body_is_rejected(run_program: ProgramRunner) -> None:
    result = await run_program("yield 1")
    assert result.error is not None
    assert "SyntaxError" in result.error.message


async def test_function_completion_is_invalid_output(run_program: ProgramRunner) -> None:
    for program in ("return print", "return (1, 2)", "return float('inf')", "return {1: 2}"):
        result = await run_program(program)
        assert result.error == RunFailure(
            "invalid-output", "program completion must be lossless JSON"
        ), program


async def test_logs_before_failure_are_kept(run_program: ProgramRunner) -> None:
    result = await run_program("print('one')\nprint('two')\nraise KeyError('k')")
    assert result.logs == ["one", "two"]
    assert result.error is not None and result.error.kind == "exception"


async def test_big_integers_survive(run_program: ProgramRunner) -> None:
    result = await run_program("return [2**200, -(10**40), await tools.echo(2**70)]")
    assert result.value == [2**200, -(10**40), 2**70]


async def test_logs_stream_as_they_happen(run_program: ProgramRunner) -> None:
    streamed: list[str] = []
    result = await run_program("print('a')\nawait tools.echo(1)\nprint('b')", logs=streamed)
    assert streamed == ["a", "b"] == result.logs


async def test_unknown_id_replies_and_late_resolutions_are_dropped(
    run_program: ProgramRunner,
) -> None:
    release = asyncio.Event()

    async def handler(call: BindingCall) -> BindingResult:
        await release.wait()
        return BindingResult.success(1)

    result = await run_program(
        "import asyncio\nasyncio.ensure_future(tools.echo(1))\nreturn 'early'", handler=handler
    )
    release.set()
    assert result.value == "early"
