"""Source checks: parse a program, a Cordis host half or a client half without running it
(no grpc).

The parse happens inside the sandbox, never in the runtime's process: each check takes a
never-used worker of its language (the same pools, uids and cgroups as a run), hands it one
``check`` frame instead of a program (``worker/source_check.py``, ``worker_ts/source_check.js``),
reads the one answer under a small budget (``CHECK_BUDGET``) and kills the worker. Checks are
bounded (``RuntimeOptions.max_concurrent_checks`` at once) and, like runs, need a free sandbox:
either refusal is ``RuntimeExhaustedError`` (RESOURCE_EXHAUSTED RUNTIME_AT_CAPACITY).

What each language checks, and the hints it gives, is its backend's ``source_check``
(``languages/``); a language without one is not checked. A client half is JavaScript for the
browser: it is checked by a served language whose check takes client halves (TypeScript's,
whose workers run Node).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from codemode_wire.text import utf8_exceeds
from runtime_service.budgets import Budgets
from runtime_service.errors import RuntimeDisposedError
from runtime_service.exit_classification import ExitSigns, WorkerExit
from runtime_service.frame_reader import FrameEvent, FrameLimits
from runtime_service.languages import Parse, Problem, SourceCheck, SourceKind, backend, backends
from runtime_service.log_budget import LineBudget
from runtime_service.pool import WorkerPool
from runtime_service.runtime import Runtime
from runtime_service.supervisor import WorkerSupervisor
from runtime_service.worker_process import WorkerCapacityError, WorkerProcess

__all__ = [
    "CHECK_BUDGET",
    "KINDS",
    "CheckBudget",
    "CheckOutcome",
    "Problem",
    "SourceCheckRefused",
    "SourceChecker",
]

Kind = SourceKind
KINDS: tuple[Kind, ...] = ("program", "host", "client")
CLIENT_LANGUAGE = "javascript"
"""What a client half is written in (a request may name it, or leave the language empty)."""
_MAX_PROBLEMS = 16
_MAX_MESSAGE_CHARS = 4096
_ANSWER_BYTES = 256 * 1024  # the most an answer frame may take (problems are short)


@dataclass(frozen=True, slots=True)
class CheckBudget:
    """What one check's worker may use: CPU, wall-clock time and memory."""

    compute_s: float = 2.0
    wall_s: float = 10.0
    memory_bytes: int = 256 << 20


CHECK_BUDGET = CheckBudget()


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    checked_by: str
    """The language whose worker parsed it."""
    problems: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


class SourceCheckRefused(ValueError):
    """A check that is not one (unknown language or kind, oversized source): nothing ran.
    ``reason`` is the ErrorInfo reason; ``served`` is True when the language is known but not
    served here (FAILED_PRECONDITION rather than INVALID_ARGUMENT)."""

    def __init__(self, reason: str, message: str, *, served: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.served = served


# -- the sandboxed parse -------------------------------------------------------------------


class SourceChecker:
    """Runs checks for a runtime: validates the request, bounds concurrency, parses in a
    sandboxed worker of the checking language."""

    def __init__(self, runtime: Runtime, budget: CheckBudget = CHECK_BUDGET) -> None:
        self._runtime = runtime
        maxima = runtime.options.maxima
        self._budget = CheckBudget(
            budget.compute_s, budget.wall_s, min(budget.memory_bytes, maxima.memory_bytes)
        )
        self._in_flight = 0
        self.checks_started = 0
        """Checks that got past validation and admission (for tests and metrics)."""

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def kinds(self, language: str) -> tuple[Kind, ...]:
        """What CheckSource checks for ``language`` here (empty: not served)."""
        found = backend(language)
        check = found.source_check if found is not None else None
        if check is None or language not in self._runtime.languages:
            return ()
        return check.kinds

    @staticmethod
    def _source_check(language: str) -> SourceCheck:
        found = backend(language)
        assert found is not None and found.source_check is not None  # resolve() saw to it
        return found.source_check

    def resolve(self, language: str, kind: str, source: str) -> tuple[str, Kind]:
        """The checking language and the kind, or ``SourceCheckRefused``."""
        if kind not in KINDS:
            raise SourceCheckRefused(
                "UNKNOWN_SOURCE_KIND", f"unknown source kind {kind!r} (known: {', '.join(KINDS)})"
            )
        checked: Kind = kind
        served = self._runtime.languages
        if checked == "client":
            if language not in ("", CLIENT_LANGUAGE):
                raise SourceCheckRefused(
                    "INVALID_SOURCE_LANGUAGE",
                    f"a client half is {CLIENT_LANGUAGE}, not {language!r} (leave it empty)",
                )
            by = next((name for name in served if "client" in self.kinds(name)), None)
            if by is None:
                raise SourceCheckRefused(
                    "LANGUAGE_NOT_SERVED",
                    "no language served here checks client halves (JavaScript needs the "
                    f"typescript language's Node workers; served: {', '.join(served) or 'none'})",
                    served=False,
                )
            language = by
        elif backend(language) is None:
            known = ", ".join(b.name for b in backends())
            raise SourceCheckRefused(
                "UNKNOWN_LANGUAGE", f"unknown language {language!r} (known: {known})"
            )
        elif language not in served:
            raise SourceCheckRefused(
                "LANGUAGE_NOT_SERVED",
                f"language {language!r} is not served by this runtime "
                f"(served: {', '.join(served) or 'none'})",
                served=False,
            )
        elif not self.kinds(language):
            raise SourceCheckRefused(
                "LANGUAGE_NOT_CHECKED",
                f"language {language!r} offers no source check",
                served=False,
            )
        elif checked not in self.kinds(language):
            raise SourceCheckRefused(
                "UNKNOWN_SOURCE_KIND", f"{language} checks {', '.join(self.kinds(language))}"
            )
        limit = self._runtime.options.max_program_bytes
        if type(source) is not str or utf8_exceeds(source, limit):
            raise SourceCheckRefused("SOURCE_TOO_LARGE", f"source exceeds {limit} bytes")
        return language, checked

    async def check(self, language: str, kind: str, source: str) -> CheckOutcome:
        """Check ``source``. Raises ``SourceCheckRefused`` (bad request),
        ``RuntimeDisposedError`` (shutting down) or ``RuntimeExhaustedError`` (no room)."""
        by, checked = self.resolve(language, kind, source)
        if self._runtime.disposed:
            raise RuntimeDisposedError("runtime disposed")
        limit = self._runtime.options.max_concurrent_checks
        if self._in_flight >= limit:
            raise self._runtime.exhausted(f"{limit} source checks already in flight")
        self._in_flight += 1
        self.checks_started += 1
        try:
            pool = self._runtime.pools[by]
            parse: Parse = lambda k, s: self._parse(pool, k, s)  # noqa: E731
            check = self._source_check(by)
            problems = await check.check(parse, checked, source)
        finally:
            self._in_flight -= 1
        return CheckOutcome(by, tuple(problems))

    async def _parse(self, pool: WorkerPool, kind: Kind, source: str) -> list[Problem]:
        budget = self._budget
        acquire, _ = pool.launcher(budget.memory_bytes)
        try:
            worker = await acquire()
        except WorkerCapacityError as exc:
            raise self._runtime.exhausted(str(exc)) from exc
        try:
            return await _parse_in(worker, pool.spec.backend.exits, kind, source, budget)
        finally:
            await worker.kill()


async def _parse_in(
    worker: WorkerProcess, signs: ExitSigns, kind: Kind, source: str, budget: CheckBudget
) -> list[Problem]:
    """Hand ``worker`` the check and read its answer; a worker that fails to answer within
    the budget (or dies: out of memory) is a source that could not be parsed. The worker is
    supervised as a run's is (``supervisor.WorkerSupervisor``: its memory budget on the run's
    cgroup, its CPU metered over every process of it, its end classified once)."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bytes | None] = loop.create_future()
    ended: asyncio.Future[str] = loop.create_future()

    def end(why: str) -> None:
        if not ended.done():
            ended.set_result(why)

    def on_frame(event: FrameEvent) -> None:
        if not answer.done():
            answer.set_result(event if isinstance(event, bytes) else None)

    def on_eof() -> None:
        # The channel closed without an answer: the worker's exit says why (out of memory,
        # or not), once the supervisor has classified it.
        pass

    def on_exit(verdict: WorkerExit) -> None:
        if verdict.out_of_memory:
            end(f"the parser ran out of memory ({budget.memory_bytes >> 20} MiB)")
        else:
            end(_NO_ANSWER)

    def cpu_left(spent_s: float) -> float | None:
        left = budget.compute_s - spent_s
        if left > 0:
            return left
        end(f"the parser did not finish within the check's CPU budget ({budget.compute_s:g} s)")
        return None

    supervisor = WorkerSupervisor(
        worker,
        Budgets(
            compute_ms=int(budget.compute_s * 1000),
            wall_ms=int(budget.wall_s * 1000),
            max_output_bytes=_ANSWER_BYTES,
            memory_bytes=budget.memory_bytes,
        ),
        signs,
        logs=LineBudget(0),  # a parser logs nothing: its raw output is dropped
        on_exit=on_exit,
        on_output_exceeded=lambda: None,
    )
    supervisor.hand_off()  # a budget it could not apply still has the worker's own rlimits
    supervisor.listen(
        on_frame, on_eof, FrameLimits(_ANSWER_BYTES, _ANSWER_BYTES, budget.memory_bytes)
    )
    supervisor.meter_cpu(cpu_left, budget.compute_s)
    worker.activate()
    worker.send(
        {
            "t": "check",
            "kind": kind,
            "source": source,
            "memory_bytes": budget.memory_bytes,
            "cpu_seconds": budget.compute_s,
        }
    )
    try:
        waited: list[asyncio.Future[Any]] = [answer, ended]
        done, _ = await asyncio.wait(waited, timeout=budget.wall_s, return_when="FIRST_COMPLETED")
    finally:
        supervisor.stop()
    if answer in done and answer.result() is not None:
        return _problems(answer.result() or b"", budget)
    if ended in done:
        return [Problem(0, 0, ended.result())]
    if answer in done:
        return [Problem(0, 0, _NO_ANSWER)]
    return [
        Problem(0, 0, f"the parser did not finish within the check's budget ({budget.wall_s:g} s)")
    ]


_NO_ANSWER = "the parser's worker ended without an answer"


def _problems(payload: bytes, budget: CheckBudget) -> list[Problem]:
    """The worker's answer, shape-checked (the worker is a hostile peer)."""
    try:
        message = json.loads(payload)
    except ValueError:
        message = None
    if type(message) is not dict or message.get("t") != "checked":
        return [Problem(0, 0, "the parser's worker answered out of protocol")]
    if "error" in message:
        text = message["error"]
        return [Problem(0, 0, f"the check failed: {text if type(text) is str else 'unknown'}")]
    raw = message.get("problems")
    if type(raw) is not list:
        return [Problem(0, 0, "the parser's worker answered out of protocol")]
    problems: list[Problem] = []
    for item in raw[:_MAX_PROBLEMS]:
        if type(item) is not dict:
            continue
        line, column, text = item.get("line"), item.get("column"), item.get("message")
        if type(line) is not int or type(column) is not int or type(text) is not str:
            continue
        problems.append(Problem(max(0, line), max(0, column), text[:_MAX_MESSAGE_CHARS]))
    if raw and not problems:
        return [Problem(0, 0, "the parser's worker answered out of protocol")]
    return problems
