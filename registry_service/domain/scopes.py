"""Scope names, presentation modes and program languages.

A scope key is `""` (global), `presets/{id}` or `agents/{id}`. Presets and agents are resources;
an agent may be parented under one preset, giving the chain agent → preset → global.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection

from codemode_wire.errors import invalid_argument

GLOBAL = ""
# Matched with `fullmatch`: `$` would also accept a trailing newline (`agents/bob\n`).
_ID_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")


class Mode(enum.Enum):
    NATIVE = "native"
    CODE = "code"
    BOTH = "both"


def check_language(
    language: str, known_languages: Collection[str], *, field: str = "code_language"
) -> str:
    """`language` if it is one of the program languages a scope may declare (the registry's
    language profiles), else INVALID_ARGUMENT naming the known ones. Whether a runtime serves
    it is the deployment's concern (`runtime_languages`)."""
    if language not in known_languages:
        known = ", ".join(f'"{name}"' for name in known_languages)
        raise invalid_argument(
            "UNKNOWN_CODE_LANGUAGE",
            f"code language {language[:64]!r} is not a program language (known: {known})",
            field=field,
        )
    return language


def check_id(kind: str, resource_id: str) -> None:
    if not _ID_RE.fullmatch(resource_id):
        raise invalid_argument(
            "INVALID_RESOURCE_ID",
            f"{kind} id {resource_id!r} is invalid: 1-63 characters of [a-z0-9-], "
            "starting with a letter",
            field=f"{kind}_id",
        )


def parse_name(name: str, *, allow: tuple[str, ...] = ("presets", "agents")) -> tuple[str, str]:
    """Splits `collection/id`, refusing anything else with INVALID_ARGUMENT."""
    collection, sep, resource_id = name.partition("/")
    if not sep or collection not in allow or not _ID_RE.fullmatch(resource_id):
        wanted = " or ".join(f"`{c}/{{id}}`" for c in allow)
        raise invalid_argument(
            "INVALID_RESOURCE_NAME", f"resource name {name!r} is invalid: expected {wanted}"
        )
    return collection, resource_id


def parse_scope(scope: str, *, allow_global: bool = True) -> str:
    """Validates a scope key and returns it."""
    if scope == GLOBAL:
        if not allow_global:
            raise invalid_argument(
                "SCOPE_REQUIRED", "this operation needs a `presets/{id}` or `agents/{id}` scope"
            )
        return scope
    parse_name(scope)
    return scope
