"""A Python worker's source check: parse a program or a Cordis host half, never run it.

Asked by the runtime (``runtime_service/source_check.py``) with one ``check`` frame instead of a
program: ``{"t": "check", "kind": "program" | "host", "source", "memory_bytes", "cpu_seconds"}``;
answered with ``{"t": "checked", "problems": [{"line", "column", "message"}]}`` (no problems:
it parses), then the worker waits to be killed like after a program.

Both kinds are the body of an async function: the source is compiled wrapped as ``async def``
with the body indented one level, so errors are reported in the body's own coordinates (line
and column as the author wrote them). Only ``compile`` runs; nothing of the source is executed.
The standard library and the worker's own tree only: it is imported before the worker's
private root hides the runtime.
"""

from __future__ import annotations

from types import CodeType
from typing import Any, NoReturn

from runtime_service.worker import sandbox_child
from runtime_service.worker.core import finish

__all__ = ["check", "serve_check"]

_WRAPPER = "async def __cordis_host__():\n"
_INDENT = "    "
_ASYNC_GENERATOR = 0x200  # CO_ASYNC_GENERATOR: the body used `yield`
KINDS = ("program", "host")


def check(kind: str, source: str) -> list[dict[str, object]]:
    """The problems of ``source`` as a ``kind`` (empty: it parses). Line 0 means the source
    could not be compiled at all (too deeply nested, a NUL byte): the message says why."""
    if kind not in KINDS:
        raise ValueError(f"a Python worker checks {', '.join(KINDS)}, not {kind!r}")
    wrapped = _WRAPPER + "".join(_INDENT + line for line in source.splitlines(keepends=True))
    if not wrapped.endswith("\n"):
        wrapped += "\n"
    wrapped += _INDENT + "pass\n"  # an empty body is still a function
    try:
        code = compile(wrapped, "<source>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = max(1, (exc.lineno or 2) - 1)
        column = max(0, (exc.offset or 1) - 1 - len(_INDENT))
        return [{"line": line, "column": column, "message": exc.msg}]
    except (RecursionError, MemoryError, ValueError) as exc:
        return [{"line": 0, "column": 0, "message": f"{type(exc).__name__}: {exc}"}]
    if kind == "program" and _is_generator(code):
        # A program's body is the function the worker awaits: `yield` makes it a generator.
        return [{"line": 1, "column": 0, "message": "'yield' outside function"}]
    return []


def _is_generator(code: CodeType) -> bool:
    return any(
        isinstance(const, CodeType) and const.co_flags & _ASYNC_GENERATOR
        for const in code.co_consts
    )


def serve_check(channel: Any, start: dict[str, Any]) -> NoReturn:
    """Answer one ``check`` frame under the check's limits, then wait to be killed.
    ``channel`` is the worker's (``bootstrap.Channel``: ``send`` and ``sock``)."""
    try:
        sandbox_child.apply_run_limits(
            memory_bytes=int(start["memory_bytes"]), cpu_seconds=float(start["cpu_seconds"])
        )
        source, kind = start["source"], start["kind"]
        if type(source) is not str or type(kind) is not str:
            raise ValueError("a check needs a source and a kind")
        problems = check(kind, source)
    except (OSError, ValueError, KeyError) as exc:
        finish(channel, {"t": "checked", "error": str(exc)})
    finish(channel, {"t": "checked", "problems": problems})
