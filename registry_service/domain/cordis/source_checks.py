"""Define-time syntax checks: a half is parsed by a code runtime, never run by the registry.

The registry runs nothing of a plugin: `cordis_define` hands its host half (in the owner's
program language) and its client half (JavaScript for the browser) to a runtime's source check
(`CheckSource`), which parses each in a fresh sandboxed worker of that language and answers with
the problems in the half's own coordinates, each with the language's hint. This module is the
port the runner asks through (`SourceChecks`; the gRPC runtime client implements it) and the
refusal the model reads: the line, the line's text, a caret under the column, the hint.

Nothing is stored unless both halves were checked and parse. When no runtime can check a half
(none reachable, none serving the language, all busy) the define is refused with a reason that
says so (`CheckUnavailable`): storing an unchecked half would only move the error to an
activation. A registry composed without any runtime has no plugin hosts either; there the
halves are recorded unchecked (`source_checks=None`), as nothing could run them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from registry_service.domain.cordis.refusals import CordisError

__all__ = [
    "CheckUnavailable",
    "HalfKind",
    "SourceChecks",
    "SourceProblem",
    "check_half",
]

HalfKind = Literal["host", "client"]
CLIENT_TITLE = "JavaScript"  # a client half runs in a browser page: always JavaScript


@dataclass(frozen=True, slots=True)
class SourceProblem:
    """Where a half does not parse (line 1-based, column 0-based, in the half's own lines;
    line 0: it could not be parsed at all, and `message` says why)."""

    line: int
    column: int
    message: str
    hint: str = ""


class CheckUnavailable(Exception):
    """No runtime could check the half; `reason` is the Cordis reason the model sees."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class SourceChecks(Protocol):
    async def check_source(
        self, language: str, kind: HalfKind, source: str
    ) -> Sequence[SourceProblem]:
        """The problems of `source` as a `kind` half in `language` (empty: it parses; the
        language of a client half is ""). Raises `CheckUnavailable`."""
        ...


async def check_half(
    checks: SourceChecks, kind: HalfKind, language: str, title: str, source: str
) -> None:
    """Raises `CordisError` (`syntax-error`, or the reason no runtime could check it) unless
    `source` parses as a `kind` half; `title` names its language to the model."""
    field = f"code.{kind}"
    try:
        problems = await checks.check_source("" if kind == "client" else language, kind, source)
    except CheckUnavailable as exc:
        raise CordisError(
            f"cordis_define could not check {field}: {exc}; nothing was stored", exc.reason
        ) from None
    if not problems:
        return
    first = problems[0]
    what = f"{CLIENT_TITLE if kind == 'client' else title} async function body"
    if first.line <= 0:
        raise CordisError(
            f"cordis_define {field} cannot be parsed as a {what}: {first.message}",
            "syntax-error",
        )
    lines = source.splitlines()
    text = lines[first.line - 1] if first.line <= len(lines) else ""
    caret = " " * min(first.column, len(text)) + "^"
    raise CordisError(
        f"cordis_define {field} does not parse as a {what}: {first.message} "
        f"(line {first.line})\n{text}\n{caret}\n{first.hint}",
        "syntax-error",
    )
