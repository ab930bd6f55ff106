"""Services between one owner's plugins, as a plugin host sees them (``host_facade.json``).

Plugin hosts are separate processes, so a provided service cannot be shared as a Python object.
``ctx.provide(name, value)`` publishes a *contract* instead, which the registry hands to the
owner's other plugin hosts:

- a **data service**: ``value`` is lossless JSON data; a consumer reads a fresh copy of it;
- a **service of methods**: ``value`` is an object (or a dict) with callable public members;
  a consumer gets a proxy whose methods are coroutines, each call routed consumer host ->
  runtime -> registry -> runtime -> provider host and back, arguments and results as lossless
  JSON (the same rule as a dynamic tool's).

Whatever a method returns crosses as data, so no provider object (least of all its Cordis
``ctx``) ever reaches another plugin: returning the ``ctx`` is refused.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from runtime_service.worker import flatwire

__all__ = [
    "NOT_A_SERVICE",
    "ServiceProxy",
    "context_returned",
    "describe",
    "method_of",
    "not_injected",
]

NOT_A_SERVICE = (
    "ctx.provide needs lossless JSON data, or an object (or dict) with public methods, as the "
    "service: it crosses to the owner's other plugins, which run in other processes"
)


def context_returned(service: str) -> str:
    return (
        f'service "{service}" returned a cordis Context, which the sandbox does not expose; '
        "return data instead"
    )


def not_injected(name: str) -> str:
    return (
        f'service "{name}" is not injected. Declare it: inject = ["{name}", ...] on the '
        "plugin (or look it up with ctx.get)"
    )


def describe(name: str, value: object) -> dict[str, Any]:
    """The contract of a provided service: ``{name, methods, data}`` (data: JSON text or "")."""
    try:
        tokens = flatwire.encode(value)
    except (flatwire.WireError, ValueError, TypeError):
        tokens = None
    if tokens is not None:
        data = flatwire.decode(tokens)
        return {"name": name, "methods": [], "data": json.dumps(data, separators=(",", ":"))}
    if type(value) is dict:
        methods = [key for key, member in value.items() if type(key) is str and callable(member)]
    else:
        methods = [
            key
            for key in dir(value)
            if not key.startswith("_") and callable(getattr(value, key, None))
        ]
    if not methods:
        raise TypeError(NOT_A_SERVICE)
    return {"name": name, "methods": sorted(methods), "data": ""}


def method_of(value: object, method: str) -> Callable[..., Any] | None:
    """The callable a consumer's call of ``method`` reaches (public members only)."""
    if method.startswith("_"):
        return None
    member = value.get(method) if type(value) is dict else getattr(value, method, None)
    return member if callable(member) else None


class ServiceProxy:
    """An injected service of methods: ``await ctx.<service>.<method>(*args)``."""

    __slots__ = ("_call", "_methods", "_name")
    _call: Callable[[str, str, list[object]], Awaitable[object]]
    _methods: frozenset[str]
    _name: str

    def __init__(
        self,
        name: str,
        methods: frozenset[str],
        call: Callable[[str, str, list[object]], Awaitable[object]],
    ) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_methods", methods)
        object.__setattr__(self, "_call", call)

    def __getattr__(self, method: str) -> Callable[..., Awaitable[object]]:
        if method not in self._methods:
            raise AttributeError(f'service "{self._name}" has no method "{method}"')

        async def call(*args: object) -> object:
            return await self._call(self._name, method, list(args))

        return call

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f'service "{self._name}" is read-only; cannot assign "{name}"')

    def __repr__(self) -> str:
        return f"<service {self._name!r} methods={sorted(self._methods)}>"
