"""CheckSource over real gRPC: a program or a Cordis half is parsed in a sandboxed worker of its
language, never run; syntax errors are the answer (in the source's own lines and columns, with a
hint), bad requests are INVALID_ARGUMENT, an unserved language FAILED_PRECONDITION naming the
served ones, and no free slot RESOURCE_EXHAUSTED RUNTIME_AT_CAPACITY. GetCapabilities says, per
language, whether it is served and what it checks."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from codemode_wire import host_facade
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from runtime_service.languages import typescript
from runtime_service.source_check import CheckBudget, SourceChecker
from runtime_service.worker_process import WorkerSpec
from tests.registry.conftest import error_info_of
from tests.runtime.conftest import connected, grpc_settings, serving

NEEDS_NODE = pytest.mark.skipif(
    typescript.BACKEND.unavailable(WorkerSpec()) is not None, reason="no Node 20+ on this host"
)
PROGRAM, HOST, CLIENT = pb.SOURCE_KIND_PROGRAM, pb.SOURCE_KIND_HOST_HALF, pb.SOURCE_KIND_CLIENT_HALF


def _check(language: str, kind: Any, source: str) -> pb.CheckSourceRequest:
    return pb.CheckSourceRequest(language=language, kind=kind, source=source)


async def _refused(call: Any) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    assert info is not None, caught.value
    assert info.domain == "codemode.runtime"
    return caught.value.code(), info.reason, caught.value.details() or ""


async def test_python_sources_are_parsed_in_a_worker_and_never_run() -> None:
    async with serving(grpc_settings()) as running, connected(running) as stub:
        # A side effect the check would show if it ran the source: it never does.
        good = await stub.CheckSource(_check("python", HOST, "raise SystemExit(3)\nreturn 1"))
        assert good.ok and list(good.problems) == [] and good.checked_by == "python"
        bad = await stub.CheckSource(_check("python", HOST, "x = (1,\n\nreturn x"))
        assert not bad.ok
        (problem,) = bad.problems
        assert (problem.line, problem.column, problem.message) == (1, 4, "'(' was never closed")
        assert problem.hint.startswith("Hint: check that brackets, quotes and indentation")
        js = await stub.CheckSource(_check("python", HOST, "const tool = 1;\nreturn tool"))
        assert js.problems[0].line == 1
        assert js.problems[0].hint == (
            "Hint: the Host half is Python (an async function body that returns the plugin), "
            "not JavaScript or TypeScript."
        )
        program = await stub.CheckSource(_check("python", PROGRAM, "yield 1"))
        assert not program.ok and program.problems[0].message == "'yield' outside function"
        assert (
            "program is Python"
            in (await stub.CheckSource(_check("python", PROGRAM, "let x = 1;"))).problems[0].hint
        )
        deep = await stub.CheckSource(_check("python", PROGRAM, "(" * 300 + ")" * 300))
        assert not deep.ok and deep.problems[0].message  # too deeply nested: still an answer
        assert running.runtime.live_runs == 0


async def test_bad_requests_are_refused_and_run_nothing() -> None:
    settings = grpc_settings(languages=["python"], max_program_bytes=64)
    async with serving(settings) as running, connected(running) as stub:
        cases = [
            (_check("cobol", HOST, "x"), grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_LANGUAGE"),
            (
                _check("python", pb.SOURCE_KIND_UNSPECIFIED, "x"),
                grpc.StatusCode.INVALID_ARGUMENT,
                "UNKNOWN_SOURCE_KIND",
            ),
            (
                _check("python", HOST, "x" * 65),
                grpc.StatusCode.INVALID_ARGUMENT,
                "SOURCE_TOO_LARGE",
            ),
            (
                _check("python", CLIENT, "x"),
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_SOURCE_LANGUAGE",
            ),
            (
                _check("typescript", HOST, "x"),
                grpc.StatusCode.FAILED_PRECONDITION,
                "LANGUAGE_NOT_SERVED",
            ),
            (_check("", CLIENT, "x"), grpc.StatusCode.FAILED_PRECONDITION, "LANGUAGE_NOT_SERVED"),
        ]
        for request, code, reason in cases:
            got_code, got_reason, details = await _refused(stub.CheckSource(request))
            assert (got_code, got_reason) == (code, reason), (request, details)
            if code is grpc.StatusCode.FAILED_PRECONDITION:
                assert "served: python" in details, details
        assert running.runtime.live_runs == 0


async def test_checks_beyond_the_bound_are_at_capacity() -> None:
    async with (
        serving(grpc_settings(max_concurrent_checks=1)) as running,
        connected(running) as stub,
    ):
        # The one slot is held by a check whose worker is not handed over until released.
        pool = running.runtime.pools["python"]
        entered, gate = asyncio.Event(), asyncio.Event()
        original = pool.acquire

        async def held() -> Any:
            entered.set()
            await gate.wait()
            return await original()

        pool.acquire = held  # type: ignore[method-assign]
        first = asyncio.ensure_future(stub.CheckSource(_check("python", HOST, "return 1")))
        await entered.wait()
        code, reason, _ = await _refused(stub.CheckSource(_check("python", HOST, "return 2")))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "RUNTIME_AT_CAPACITY")
        gate.set()
        assert (await first).ok
        # The slot is free again once the first check ended.
        assert (await stub.CheckSource(_check("python", HOST, "return 3"))).ok


async def test_capabilities_say_per_language_what_is_served() -> None:
    async with serving(grpc_settings(languages=["python"])) as running, connected(running) as stub:
        caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
        assert list(caps.languages) == ["python"]
        entries = {entry.name: entry for entry in caps.language_capabilities}
        assert set(entries) == {"python", "typescript"}
        python, ts = entries["python"], entries["typescript"]
        assert python.served and python.reason == ""
        assert list(python.checked_kinds) == [PROGRAM, HOST]
        assert python.program_wire_version >= 1
        assert python.host_facade_version == str(host_facade.load().version)
        assert python.max_budgets.memory_bytes == caps.max_budgets.memory_bytes
        assert python.max_source_bytes > 0
        assert not ts.served and "languages" in ts.reason
        assert list(ts.checked_kinds) == []
        assert "typescript" not in running.runtime.pools
        # A run of the unserved language is refused, naming the served one.
        start = pb.RunStart(program="return 1", language="typescript")
        code, _reason, details = await _refused(stub.Run(iter([pb.RunRequest(start=start)])).read())
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "supported: python" in details


@NEEDS_NODE
async def test_typescript_and_client_halves_are_parsed_by_node_workers() -> None:
    async with serving(grpc_settings()) as running, connected(running) as stub:
        typed = "const unit: string = 'utc';\nreturn (ctx: any): void => {};"
        assert (await stub.CheckSource(_check("typescript", HOST, typed))).ok
        # A side effect would show if the check ran it: the answer is still just "ok".
        assert (await stub.CheckSource(_check("typescript", PROGRAM, "while (true) {}"))).ok
        cases = [
            ("const a: number = 1;\nconst b = (a +;\nreturn 1;", 2, ""),
            ("let x: number = 1;\ndelete x;\nreturn 1;", 2, "Delete of an unqualified"),
            ("enum Zone { Utc }\nreturn 1;", 1, "enum"),
        ]
        for source, line, needle in cases:
            answer = await stub.CheckSource(_check("typescript", HOST, source))
            assert not answer.ok and answer.checked_by == "typescript", source
            (problem,) = answer.problems
            assert problem.line == line, (source, problem)
            assert needle.lower() in problem.message.lower(), (source, problem)
            assert problem.column <= len(source.split("\n")[line - 1])
        python = await stub.CheckSource(_check("typescript", HOST, "def apply(ctx):\n    pass"))
        assert python.problems[0].hint == (
            "Hint: the Host half is TypeScript (an async function body that returns the plugin), "
            "not Python."
        )
        client = await stub.CheckSource(
            _check("", CLIENT, "const size = (props.size as number)\nreturn {}")
        )
        assert not client.ok and client.checked_by == "typescript"
        assert client.problems[0].line == 1
        assert "remove TypeScript syntax such as `as` casts" in client.problems[0].hint
        ok = await stub.CheckSource(_check("javascript", CLIENT, "return { apply() {} }"))
        assert ok.ok
        assert running.runtime.live_runs == 0


async def test_a_check_over_its_cpu_budget_is_ended_by_the_supervisor() -> None:
    """A source that takes longer to compile than the check's CPU budget: the worker is
    metered like a run's (every process of its cgroup) and ended, with an answer saying so,
    and nothing of it is left behind."""
    source = "x = 1 + 2\n" * 90_000  # about 0.9 MB: compiling it costs far more than 10 ms
    async with serving(grpc_settings()) as running:
        checker = SourceChecker(running.runtime, CheckBudget(compute_s=0.01))
        outcome = await checker.check("python", "program", source)
        (problem,) = outcome.problems
        assert problem.line == 0
        assert problem.message == (
            "the parser did not finish within the check's CPU budget (0.01 s)"
        ), problem.message
        assert checker.in_flight == 0 and running.runtime.live_runs == 0
