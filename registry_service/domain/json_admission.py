"""Bounds on the JSON that enters the registry from outside, so that no request can stall it.

Every RPC of every tenant shares one event loop. An 8 MB argument nested four million levels
deep once held it for seconds (the pure-Python parser ran, then the encoder, then validation)
and left the process hundreds of MB larger. Three rules apply to tool-call arguments, from a
model-direct `ExecuteToolCall` and from a `run_code` program's nested calls alike, and to the
values tool providers return:

- a depth bound (`max_json_depth`): a text nesting deeper is refused as soon as the parser
  reaches the level past the bound, having built nothing beyond it. It is an admission bound,
  not a property of the codec (architecture invariant 6 stays true of `codemode_wire.jsonvalue`
  and of the runtime, whose wire carries program values of any depth): a call over it fails
  with a clear error, nothing is cut or coerced;
- a size bound on arguments (`max_argument_bytes`), independent of the gRPC message limit;
- work on a large text (over `offload_bytes`: parsing, the canonical encoding, input and
  output validation, the pretty content) runs in a small pool of worker threads, so the loop
  keeps serving other RPCs. The threads share the interpreter lock with the loop: Python code
  hands it over every switch interval (5 ms), and the C codec, which would hold it for a
  whole text, is driven so that it lets go often (`jsonvalue.loads_canonical(yielding=True)`).

Not bounded here: one C call over a single huge string, and the output of a tool's own body
before it reaches the pipeline (its snapshot is taken on the loop, at C speed).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from codemode_wire import jsonvalue
from codemode_wire.errors import CodemodeError, invalid_argument
from codemode_wire.jsonvalue import JsonTooDeep, JsonValue, JsonValueError
from codemode_wire.text import utf8_exceeds

__all__ = [
    "ARGUMENTS_TOO_DEEP",
    "ARGUMENTS_TOO_LARGE",
    "DEFAULT_LIMITS",
    "INVALID_JSON",
    "VALUE_TOO_DEEP",
    "JsonLimits",
    "decode_arguments",
    "decode_text",
    "off_loop",
    "parse_text",
    "parse_text_canonical",
]

ARGUMENTS_TOO_DEEP = "ARGUMENTS_TOO_DEEP"
ARGUMENTS_TOO_LARGE = "ARGUMENTS_TOO_LARGE"
INVALID_JSON = "INVALID_JSON"
VALUE_TOO_DEEP = "VALUE_TOO_DEEP"  # a provider's result (reported as INVALID_TOOL_OUTPUT)

# Two threads: large texts are rare, and each one holds the GIL for most of its work anyway;
# more threads would only take more of it from the loop.
_POOL_THREADS = 2

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class JsonLimits:
    max_depth: int = 100_000
    """Deepest nesting of a JSON value entering the registry: a container may sit inside at
    most this many others. The default is what the runtime's wire carries for program
    values, so a program can pass any value it can build to a tool."""
    max_argument_bytes: int = 16 * 1024 * 1024
    """Largest tool-call arguments text, in UTF-8 bytes."""
    offload_bytes: int = 16 * 1024
    """Texts longer than this are parsed, encoded and validated off the event loop."""


DEFAULT_LIMITS = JsonLimits()


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="codemode-json")


async def off_loop(
    limits: JsonLimits, size: int, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`func(*args)`, in a worker thread when `size` (characters of the text the work is
    proportional to) is over `limits.offload_bytes`, else right here: a thread hop costs more
    than the work on a small text."""
    if size <= limits.offload_bytes:
        return func(*args, **kwargs)
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_pool(), functools.partial(func, *args, **kwargs))
    finally:
        if size > _RELEASE_AFTER_CHARS:
            _release_soon(loop)


# -- giving memory back ------------------------------------------------------------------------
# glibc keeps what a large request freed: the item arrays of big lists and big strings come
# from its heap (its mmap threshold rises after the first big free), so one 8 MB argument left
# the process about 100 MB larger for good. `malloc_trim` hands the free pages back. It runs in
# a pool thread (ctypes drops the GIL), once, a second after the last large piece of work, by
# when the request that did it has usually ended and dropped its values.

_RELEASE_AFTER_CHARS = 1024 * 1024
_RELEASE_DELAY_S = 1.0
_pending_release: list[asyncio.TimerHandle] = []


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    return trim


def _trim() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _release_soon(loop: asyncio.AbstractEventLoop) -> None:
    while _pending_release:
        _pending_release.pop().cancel()  # debounced: only the last large piece of work counts

    def release() -> None:
        _pending_release.clear()
        if not loop.is_closed():
            loop.run_in_executor(_pool(), _trim)

    _pending_release.append(loop.call_later(_RELEASE_DELAY_S, release))


def _refusal(exc: JsonValueError, field: str, too_deep: str) -> CodemodeError:
    if isinstance(exc, JsonTooDeep):
        return invalid_argument(
            too_deep,
            f"{field} nests deeper than {exc.max_depth} levels (max_json_depth; the level past "
            f"it opens at offset {exc.offset})",
            field=field,
            max_depth=str(exc.max_depth),
        )
    return invalid_argument(INVALID_JSON, f"{field} is not valid lossless JSON: {exc}", field=field)


def parse_text(
    text: str, field: str, *, max_depth: int | None = None, too_deep: str = ARGUMENTS_TOO_DEEP
) -> JsonValue:
    """A JSON text field's value. Raises CodemodeError INVALID_ARGUMENT: INVALID_JSON, or
    `too_deep` when the text nests deeper than `max_depth`."""
    try:
        return jsonvalue.loads(text, max_depth=max_depth)
    except JsonValueError as exc:
        raise _refusal(exc, field, too_deep) from exc


def parse_text_canonical(
    text: str, field: str, *, max_depth: int | None = None, too_deep: str = ARGUMENTS_TOO_DEEP
) -> tuple[JsonValue, str]:
    """`parse_text` and the value's canonical text, for less than parsing then `dumps`: a
    value the C decoder has just built needs no proof of its types before it is written."""
    try:
        return jsonvalue.loads_canonical(text, max_depth=max_depth)
    except JsonValueError as exc:
        raise _refusal(exc, field, too_deep) from exc


def decode_text(text: str, limits: JsonLimits) -> tuple[JsonValue, str]:
    """(value, canonical text) of a JSON text nesting at most `limits.max_depth` deep; raises
    the codec's JsonTooDeep or JsonValueError. Run it through `off_loop`: a text large enough
    to go to a worker thread is decoded so that the thread lets go of the interpreter lock
    often (the C codec alone would hold it for the whole text)."""
    yielding = len(text) > limits.offload_bytes
    return jsonvalue.loads_canonical(text, max_depth=limits.max_depth, yielding=yielding)


def _decode_field(text: str, limits: JsonLimits, field: str) -> tuple[JsonValue, str]:
    try:
        return decode_text(text, limits)
    except JsonValueError as exc:
        raise _refusal(exc, field, ARGUMENTS_TOO_DEEP) from exc


async def decode_arguments(
    text: str, limits: JsonLimits, field: str = "arguments_json", *, default: JsonValue = None
) -> tuple[JsonValue, str]:
    """Tool-call arguments text → (value, canonical text); empty text gives `default`.

    Raises CodemodeError INVALID_ARGUMENT: ARGUMENTS_TOO_LARGE, ARGUMENTS_TOO_DEEP or
    INVALID_JSON, the message naming the limit and `field`."""
    if not text:
        return default, jsonvalue.dumps(default)
    limit = limits.max_argument_bytes
    if utf8_exceeds(text, limit):
        raise invalid_argument(
            ARGUMENTS_TOO_LARGE,
            f"{field} is larger than {limit} bytes (max_argument_bytes)",
            field=field,
            max_bytes=str(limit),
        )
    return await off_loop(limits, len(text), _decode_field, text, limits, field)
