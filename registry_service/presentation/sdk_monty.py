"""The Monty `tools:sdk` section: the Python stub (`sdk_python.py`) under instructions that say
what Monty, a Python subset, runs and what it does not.

The stub is the Python one, byte for byte, but for `ToolCallError`: Monty programs cannot
subclass an exception or give one attributes, so the runtime's Monty bridge binds
`ToolCallError` to `RuntimeError` (`runtime_service/worker_monty/bridge.py`), and the stub
declares exactly that. The limits listed here are the ones the bridge and the interpreter
enforce (`tests/runtime/test_monty_backend.py` runs each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from registry_service.presentation.sdk_model import SdkTool
from registry_service.presentation.sdk_python import render_python_sdk

# Model-facing text is observable behaviour: kept verbatim.
INSTRUCTIONS: Final = """\
## Writing code for run_code

`run_code` takes two required arguments: `code`, the body of an async function written in \
Monty, a SUBSET of Python run by a fast sandboxed interpreter (top-level `await` and `return` \
work), and `description`, a short summary of what the program does. When the program runs, \
exactly two of the names declared below exist: `tools` and `ToolCallError`. Everything else is \
a static stub that only describes shapes; in particular the `TypedDict` classes do NOT exist \
at run time, so build arguments as plain `dict`/`list` JSON values — \
`await tools.name({"field": 1})` — and never `FooArgs(field=1)`, which raises `NameError`. In \
the program:

- Call a tool with `await tools.name(args)`, one arguments dict. Each call resolves to that \
tool's canonical JSON value, typed by the method's return annotation below. Arguments must be \
lossless JSON. A tool shown only as a `tools["..."]` comment cannot be called from Monty (no \
subscript access on `tools`).
- A call that fails raises `ToolCallError`, which in Monty is another name for `RuntimeError`: \
catch it with `except ToolCallError as e`; `str(e)` is `ToolCallError: ` and the reason in \
plain words (there is no `toolName` attribute). Wrap calls in `try`/`except` to handle a \
failure and carry on.
- Independent read-only calls MAY overlap under `asyncio.gather`: calls that are safe to \
overlap run concurrently, while a mutating call runs on its own, in the order it was \
submitted. Use `await` to sequence work that depends on an earlier result.
- Produce output with `print(...)` and/or a top-level `return <value>`; the returned value must \
be lossless JSON (dicts, lists, strings, numbers, booleans, None; no tuples or sets). Only \
what the program prints or returns is its output; tool results you do not pass on never reach \
the conversation, so keep just what you need. Images from successful tool calls are attached \
after the run.

What Monty does NOT support (each ends the run with an exception at its line and column): \
class inheritance (so no custom exception classes), generators and `yield`, `del`, \
`async with`, imports other than `tools` and Monty's own partial modules (`asyncio`, `json`, \
`re`, `math`, `datetime`, `collections`, `itertools`, `functools`, `dataclasses`, `typing`, \
`copy`, `decimal`, `base64`, `hashlib`, `bisect`, `random`, `time`), files, processes, \
environment and network (`PermissionError`), recursion deeper than 200 calls, and values \
nested about 200 levels deep or more (fewer inside deep recursion: a call with such arguments \
fails, such a returned value ends the run as invalid output). Plain functions, simple \
classes, comprehensions, f-strings, `try`/`except`/`finally`, `match` and big integers work \
as in Python.

The available tools:"""

ERROR_CLASS: Final = "ToolCallError = RuntimeError  # Monty: no exception subclasses"


def render_monty_sdk(tools: Sequence[SdkTool]) -> str:
    """The complete `tools:sdk` section for a Monty runtime. Byte-stable for equal input."""
    return render_python_sdk(tools, instructions=INSTRUCTIONS, error_class=ERROR_CLASS)
