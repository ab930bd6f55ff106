"""Terminal outcomes, budgets and the ledger through real workers (one outcome, first wins)."""

from __future__ import annotations

import asyncio

import pytest

from runtime_service.budgets import BudgetError, Budgets, resolve_budgets
from runtime_service.errors import RunRequestError
from runtime_service.outcome import BindingCall, BindingResult, PendingCall, RunFailure
from runtime_service.runtime import Runtime
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from tests.runtime.conftest import ProgramRunner, echo_handler


async def test_hot_loop_dies_at_the_compute_budget(run_program: ProgramRunner) -> None:
    program = (
        "import asyncio\n"
        "decoy = asyncio.ensure_future(tools.never({}))\n"
        "print('before')\n"
        "while True:\n    pass\n"
    )
    result = await run_program(program, compute_ms=300)
    assert result.error == RunFailure("timeout", "compute budget exhausted (300ms busy)")
    assert result.logs == ["before"]


async def test_pending_binding_call_does_not_consume_compute(run_program: ProgramRunner) -> None:
    result = await run_program("return await tools.slow({'s': 0.6})", compute_ms=300)
    assert result.error is None
    assert result.value == {"s": 0.6}


async def test_never_resolving_await_dies_at_the_wall_ceiling(run_program: ProgramRunner) -> None:
    result = await run_program("import asyncio\nawait asyncio.Event().wait()", wall_ms=300)
    assert result.error == RunFailure("timeout", "wall-clock ceiling reached (300ms)")


async def test_deadline_lowers_the_wall_ceiling(runtime: Runtime) -> None:
    run = runtime.create_run(
        program="await tools.never({})", bindings=["never"], handler=echo_handler, deadline_ms=200
    )
    result = await runtime.execute(run)
    assert result.error == RunFailure("timeout", "wall-clock ceiling reached (200ms)")


async def test_out_of_memory_is_worker_exit_and_host_stays_healthy(
    run_program: ProgramRunner,
) -> None:
    for program in ("x = b'x' * (1 << 30)", "x = []\nwhile True:\n    x.append(' ' * 100000)"):
        result = await run_program(program, memory_bytes=96 << 20)
        assert result.error == RunFailure(
            "worker-exit", "worker exceeded its memory budget (96 MiB)"
        ), program
    assert (await run_program("return 1")).value == 1


async def test_exit_code_is_reported_exactly(run_program: ProgramRunner) -> None:
    result = await run_program("print('x')\nimport os\nos._exit(7)")
    assert result.error == RunFailure("worker-exit", "worker exited with code 7 before completing")
    assert result.logs == ["x"]


async def test_signal_death_is_worker_exit(run_program: ProgramRunner) -> None:
    result = await run_program("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert result.error == RunFailure(
        "worker-exit", "worker killed by signal SIGSEGV before completing"
    )


async def test_abort_mid_run(runtime: Runtime) -> None:
    started = asyncio.Event()

    async def handler(call: BindingCall) -> BindingResult:
        started.set()
        await asyncio.Event().wait()
        return BindingResult.success(None)

    run = runtime.create_run(
        program="print('waiting')\nawait tools.never({})", bindings=["never"], handler=handler
    )
    execution = asyncio.create_task(runtime.execute(run))
    await started.wait()
    run.abort("user-cancel")
    result = await execution
    assert result.error == RunFailure("abort", "user-cancel")
    assert result.logs == ["waiting"]


async def test_first_outcome_wins(runtime: Runtime) -> None:
    run = runtime.create_run(program="return 1", bindings=[], handler=echo_handler)
    result = await runtime.execute(run)
    run.abort("too late")
    assert result.value == 1 and result.error is None


async def test_pre_aborted_run_spawns_nothing(runtime: Runtime) -> None:
    await runtime.pool.wait_filled()
    idle = runtime.pool.idle_count
    run = runtime.create_run(program="return 1", bindings=[], handler=echo_handler)
    run.abort("never mind")
    result = await runtime.execute(run)
    assert result.error == RunFailure("abort", "never mind")
    assert not run.spawned
    assert runtime.pool.idle_count == idle


async def test_failure_before_a_worker_passes_the_ledger(runtime: Runtime) -> None:
    run = runtime.create_run(
        program="", bindings=[], handler=echo_handler, budgets={"max_output_bytes": 64}
    )
    run.abort("r" * 1000)
    result = await runtime.execute(run)
    assert result.error == RunFailure("output-limit", "outer output exceeded 64 bytes")


# -- ledger through the worker ---------------------------------------------------------------


async def test_exact_success_at_the_cap_and_one_byte_over(run_program: ProgramRunner) -> None:
    ok = await run_program("return 'x' * 60", max_output_bytes=64)
    assert ok.error is None and ok.value == "x" * 60
    over = await run_program("return 'x' * 61", max_output_bytes=64)
    assert over.error == RunFailure("output-limit", "outer output exceeded 64 bytes")


async def test_combined_logs_and_value_at_the_cap(run_program: ProgramRunner) -> None:
    # ["ab"] is 6 bytes and its line's overhead, the value "é"*28 is 2 + 56 = 58 bytes.
    cap = 64 + LOG_LINE_OVERHEAD
    ok = await run_program("print('ab')\nreturn 'é' * 28", max_output_bytes=cap)
    assert ok.error is None
    over = await run_program("print('abc')\nreturn 'é' * 28", max_output_bytes=cap)
    assert over.error is not None and over.error.kind == "output-limit"
    assert over.logs == ["abc"]


async def test_utf8_log_boundary(run_program: ProgramRunner) -> None:
    # A 96-byte cap, the message "outer output exceeded 96 bytes" takes 32: logs get 64 bytes,
    # the line's overhead 32 of them.
    assert LOG_LINE_OVERHEAD == 32
    result = await run_program("print('€' * 40)", max_output_bytes=96)
    assert result.error == RunFailure("output-limit", "outer output exceeded 96 bytes")
    assert result.logs == ["€" * 9]  # 2 + 2 + 27 = 31 <= 32, one more would be 34


async def test_runaway_logs_are_cut(run_program: ProgramRunner) -> None:
    result = await run_program("for i in range(1000):\n    print(i)", max_output_bytes=300)
    assert result.error == RunFailure("output-limit", "outer output exceeded 300 bytes")
    assert result.logs[:3] == ["0", "1", "2"]
    assert len(result.logs) < 100


async def test_raw_fd_writes_are_charged(run_program: ProgramRunner) -> None:
    program = "import os\nos.write(1, b'y' * 500)\nreturn 1"
    result = await run_program(program, max_output_bytes=96)
    assert result.error == RunFailure("output-limit", "outer output exceeded 96 bytes")
    assert result.logs and set(result.logs[0]) == {"y"}


async def test_giant_exception_becomes_output_limit(run_program: ProgramRunner) -> None:
    result = await run_program("raise ValueError('v' * 10000)", max_output_bytes=200)
    assert result.error == RunFailure("output-limit", "outer output exceeded 200 bytes")


async def test_exact_success_at_four_mebibytes(run_program: ProgramRunner) -> None:
    cap = 4 << 20
    ok = await run_program(f"return 'z' * {cap - 4}", max_output_bytes=cap)
    assert ok.error is None and isinstance(ok.value, str) and len(ok.value) == cap - 4
    over = await run_program(f"return 'z' * {cap - 3}", max_output_bytes=cap)
    assert over.error == RunFailure("output-limit", f"outer output exceeded {cap} bytes")


async def test_outstanding_call_cap(run_program: ProgramRunner) -> None:
    program = (
        "import asyncio\n"
        "results = await asyncio.gather(*(tools.slow({'s': 0.2}) for _ in range(3)),"
        " return_exceptions=True)\n"
        "return [str(r) if isinstance(r, ToolCallError) else 'ok' for r in results]"
    )
    result = await run_program(program, max_outstanding_calls=2)
    assert result.value == ["ok", "ok", "too many outstanding binding calls (limit 2)"]


# -- budgets and requests --------------------------------------------------------------------


def test_budgets_may_lower_but_not_raise() -> None:
    maxima = Budgets()
    assert resolve_budgets(maxima, maxima, {"compute_ms": 100}).compute_ms == 100
    assert resolve_budgets(maxima, maxima, {"compute_ms": 0}).compute_ms == 60_000
    with pytest.raises(BudgetError, match="exceeds the deployment maximum"):
        resolve_budgets(maxima, maxima, {"compute_ms": 60_001})


@pytest.mark.parametrize(
    "requested",
    [
        {"compute_ms": -1},
        {"max_output_bytes": 3},
        {"memory_bytes": 1 << 20},
        {"wall_ms": 1.5},
        {"nonsense": 1},
    ],
)
def test_invalid_budgets_are_rejected(requested: dict[str, int | None]) -> None:
    with pytest.raises(BudgetError):
        resolve_budgets(Budgets(), Budgets(), requested)


def test_budget_defaults_are_the_reference_ones() -> None:
    budgets = Budgets()
    assert (
        budgets.compute_ms,
        budgets.wall_ms,
        budgets.max_output_bytes,
        budgets.memory_bytes,
    ) == (
        60_000,
        600_000,
        64 << 20,
        512 << 20,
    )
    with pytest.raises(BudgetError):
        Budgets(wall_ms=2_147_483_648)


async def test_invalid_requests_are_rejected(runtime: Runtime) -> None:
    with pytest.raises(RunRequestError, match="language"):
        runtime.create_run(program="", bindings=[], handler=echo_handler, language="cobol")
    with pytest.raises(RunRequestError, match="duplicate"):
        runtime.create_run(program="", bindings=["a", "a"], handler=echo_handler)
    with pytest.raises(RunRequestError, match="non-empty"):
        runtime.create_run(program="", bindings=[""], handler=echo_handler)


async def test_descendants_holding_the_pipes_die_with_the_run(run_program: ProgramRunner) -> None:
    # A child keeps stdout open and would write later: the run ends at once anyway (its whole
    # group is killed, so the pipes end) and nothing written after the outcome is charged.
    program = (
        "import subprocess\n"
        "subprocess.Popen(['sh', '-c', 'sleep 0.5; echo late'])\n"
        "print('early')\nreturn 1"
    )
    result = await run_program(program)
    # Had the run waited for the program's child, its "late" line would be among the logs.
    assert result.value == 1 and result.logs == ["early"]


async def test_boot_cpu_is_not_charged_to_the_program(run_program: ProgramRunner) -> None:
    # Booting a worker takes far more than 30 ms of CPU; the budget counts from the hand-off.
    result = await run_program("import time\ntime.sleep(0.1)\nreturn 1", compute_ms=30)
    assert result.error is None, result.error


def test_pending_call_resolves_once_and_cancel_drops_the_answer() -> None:
    answers: list[BindingResult] = []
    pending = PendingCall()
    pending.on_result(answers.append)
    assert pending.resolve(BindingResult.success(1))
    assert not pending.resolve(BindingResult.success(2))
    assert answers == [BindingResult.success(1)]
    late = PendingCall()
    late.on_result(answers.append)
    late.cancel()
    assert not late.resolve(BindingResult.success(3))
    assert answers == [BindingResult.success(1)]
