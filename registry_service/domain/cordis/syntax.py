"""Define-time syntax checks: a half is compiled, never run (reference §9.2, §9.6).

A Python host half is an async function body: it is compiled wrapped as
`async def __cordis_host__():` with the body indented one level, and errors are reported in the
body's own coordinates (line and column as the model wrote them). A JavaScript client half is
checked with `node --check` on `(async () => {\\n<code>\\n})()` — node parses the file without
evaluating it — and node's line is mapped back past the one-line wrapper. Without node the
client half is accepted unchecked (the page runner parses it again before running it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile

from registry_service.domain.cordis.refusals import CordisError

_WRAPPER = "async def __cordis_host__():\n"
_INDENT = "    "
_NODE_LOCATION = re.compile(r":(\d+)\s*$")
NODE_CHECK_TIMEOUT_S = 10.0


def check_python_host(code: str, field: str = "code.host") -> None:
    """Raises CordisError (`syntax-error`) with the line, a caret and a hint."""
    wrapped = _WRAPPER + "".join(_INDENT + line for line in code.splitlines(keepends=True))
    if not wrapped.endswith("\n"):
        wrapped += "\n"
    wrapped += _INDENT + "pass\n"  # an empty body is still a function
    try:
        compile(wrapped, "<cordis-host>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        line_no = max(1, (exc.lineno or 2) - 1)
        column = max(0, (exc.offset or 1) - 1 - len(_INDENT))
        lines = code.splitlines()
        text = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
        raise CordisError(
            _message(
                field,
                "Python async function body",
                exc.msg,
                line_no=line_no,
                text=text,
                column=column,
                hint=_python_hint(text),
            ),
            "syntax-error",
        ) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        # Pathological nesting or NUL bytes: still a refusal, never a crash of the registry.
        raise CordisError(
            f"cordis_define {field} cannot be compiled: {type(exc).__name__}: {exc}",
            "syntax-error",
        ) from None


async def check_javascript_client(code: str, field: str = "code.client") -> bool:
    """True when node parsed it; False when no node is available (accepted unchecked)."""
    node = shutil.which("node")
    if node is None:
        return False
    fd, path = tempfile.mkstemp(prefix="cordis-client-", suffix=".js")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(f"(async () => {{\n{code}\n}})()\n")
        process = await asyncio.create_subprocess_exec(
            node,
            "--check",
            path,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", "")},
        )
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), NODE_CHECK_TIMEOUT_S)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        if process.returncode == 0:
            return True
        raise CordisError(
            _node_message(field, code, stderr.decode("utf-8", "replace")), "syntax-error"
        )
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _node_message(field: str, code: str, stderr: str) -> str:
    # node --check prints `<file>:<line>`, the line, a caret line, a blank, `SyntaxError: …`.
    lines = stderr.splitlines()
    line_no = 0
    column = 0
    for index, line in enumerate(lines):
        match = _NODE_LOCATION.search(line)
        if match and line.startswith(os.sep):
            line_no = int(match.group(1)) - 1  # past the one-line wrapper
            if index + 2 < len(lines) and "^" in lines[index + 2]:
                column = lines[index + 2].index("^")
            break
    message = next((ln for ln in lines if re.match(r"\w*Error:", ln)), "SyntaxError")
    message = message.split(":", 1)[1].strip() if ":" in message else message
    source = code.splitlines()
    text = source[line_no - 1] if 0 < line_no <= len(source) else ""
    return _message(
        field,
        "JavaScript async function body",
        message,
        line_no=max(1, line_no),
        text=text,
        column=column,
        hint=_javascript_hint(text),
    )


def _message(
    field: str, what: str, error: str, *, line_no: int, text: str, column: int, hint: str
) -> str:
    caret = " " * min(column, len(text)) + "^"
    return (
        f"cordis_define {field} does not parse as a {what}: {error} (line {line_no})\n"
        f"{text}\n{caret}\n{hint}"
    )


def _python_hint(text: str) -> str:
    if re.search(r"=>|\b(const|let|var|function)\s|;\s*$|\binterface\s", text):
        return (
            "Hint: the Host half is Python (an async function body that returns the plugin), "
            "not JavaScript or TypeScript."
        )
    return (
        "Hint: check that brackets, quotes and indentation balance; line numbers count from "
        "the first line of the body (the async function wrapper adds none)."
    )


def _javascript_hint(text: str) -> str:
    if " as " in text:
        return (
            "Hint: the Client half is plain JavaScript; remove TypeScript syntax such as `as` "
            "casts, type annotations and interfaces."
        )
    return (
        "Hint: check that brackets and quotes balance; line numbers count from the first line "
        "of the body (the one-line `(async () => {` wrapper is not counted)."
    )
