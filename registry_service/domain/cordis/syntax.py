"""Define-time syntax checks: a half is compiled, never run.

A Python host half is an async function body: it is compiled wrapped as
`async def __cordis_host__():` with the body indented one level, and errors are reported in the
body's own coordinates (line and column as the model wrote them). A JavaScript client half is
checked with `node --check` on `(async () => {\\n<code>\\n})()` — node parses the file without
evaluating it — and node's line is mapped back past the one-line wrapper. Without node the
client half is accepted unchecked (the page runner parses it again before running it).

A TypeScript host half goes the way the plugin host compiles it: the runtime's type stripper
(amaro, `runtime_service/worker_ts/strip_types.js`) wraps it in a strict async function (a
one-line head) and blanks its types in place, then `node --check` parses the result; both
report in the body's own coordinates. Without node or the stripper (a registry installed
without the runtime's TypeScript worker) it is accepted unchecked: the plugin host reports a
parse error at activation (`host-load`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

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
    stderr = await _node_check(node, f"(async () => {{\n{code}\n}})()\n", "cordis-client-")
    if stderr is None:
        return True
    raise CordisError(_node_message(field, code, stderr), "syntax-error")


async def check_typescript_host(code: str, field: str = "code.host") -> bool:
    """True when it parsed; False when node or the type stripper is missing (unchecked).
    Raises CordisError (`syntax-error`) with the line, a caret and a hint."""
    node, stripper = shutil.which("node"), _type_stripper()
    if node is None or stripper is None:
        return False
    status, stripped, stderr = await _run_node(node, [stripper], code.encode("utf-8"))
    what = "TypeScript async function body"
    if status != 0:
        try:
            where = json.loads(stderr)
            error, line_no = str(where["message"]), int(where["line"])
            column = int(where["column"])
        except (ValueError, KeyError, TypeError):
            error, line_no, column = stderr.strip() or "the type stripper failed", 1, 0
        lines = code.splitlines()
        text = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
        message = _message(
            field, what, error, line_no=line_no, text=text, column=column, hint=_ts_hint(text)
        )
        raise CordisError(message, "syntax-error")
    failure = await _node_check(node, stripped, "cordis-host-")
    if failure is None:
        return True
    raise CordisError(_node_message(field, code, failure, what=what, hint=_ts_hint), "syntax-error")


def _type_stripper() -> str | None:
    """The runtime's type stripper command, located without importing the runtime (the same
    installation carries both services; a registry alone has none)."""
    spec = importlib.util.find_spec("runtime_service")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        script = Path(root) / "worker_ts" / "strip_types.js"
        if script.is_file() and (script.parent / "node_modules" / "amaro").is_dir():
            return str(script)
    return None


async def _node_check(node: str, source: str, prefix: str) -> str | None:
    """`node --check` of `source` (parsed, never evaluated): None, or what node said."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".js")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(source)
        status, _, stderr = await _run_node(node, ["--check", path], None)
        return None if status == 0 else stderr
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


async def _run_node(node: str, args: list[str], stdin: bytes | None) -> tuple[int, str, str]:
    """Runs node with an empty environment but PATH; (status, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        node,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "")},
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(stdin), NODE_CHECK_TIMEOUT_S)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    status = process.returncode if process.returncode is not None else -1
    return status, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")


def _node_message(
    field: str,
    code: str,
    stderr: str,
    *,
    what: str = "JavaScript async function body",
    hint: Callable[[str], str] | None = None,
) -> str:
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
        what,
        message,
        line_no=max(1, line_no),
        text=text,
        column=column,
        hint=(hint or _javascript_hint)(text),
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


def _ts_hint(text: str) -> str:
    if re.search(r"^\s*(def|class|async def|import|from)\s.*|:\s*$", text):
        return (
            "Hint: the Host half is TypeScript (an async function body that returns the plugin), "
            "not Python."
        )
    return (
        "Hint: check that brackets and quotes balance; line numbers count from the first line "
        "of the body (the async function wrapper adds none). Types are stripped, not checked: "
        "enums, namespaces and parameter properties are not supported."
    )
