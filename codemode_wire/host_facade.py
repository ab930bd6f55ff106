"""The plugin host façade, as ``host_facade.json`` (beside this module) specifies it.

A Cordis host half reaches nothing but this façade. Both host harnesses
(``runtime_service/worker/plugin_harness.py``, ``runtime_service/worker_ts/plugin_harness.js``)
implement it and the registry describes it; the JSON is the one statement of it that they are
all held to (``tests/runtime/test_host_facade.py``). This module reads it into typed objects,
so that code and tests never walk the raw JSON.

A field that differs per language is written in the JSON either as one string (the same in
every language) or as an object keyed by language; ``Spelled`` is the resolved form.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = [
    "FacadeError",
    "FacadeObject",
    "HostFacade",
    "Member",
    "Method",
    "Parameter",
    "Spelled",
    "load",
]

Spelled = Mapping[str, str]  # language -> text


def _spelled(raw: object, languages: tuple[str, ...], what: str) -> dict[str, str]:
    if isinstance(raw, str):
        return dict.fromkeys(languages, raw)
    if isinstance(raw, dict) and all(
        isinstance(k, str) and k in languages and isinstance(v, str) for k, v in raw.items()
    ):
        return dict(raw)
    raise ValueError(f"host_facade.json: {what} must be a string or an object keyed by language")


def _str(raw: Mapping[str, Any], key: str, what: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"host_facade.json: {what}.{key} must be a string")
    return value


def _languages(raw: Mapping[str, Any], all_languages: tuple[str, ...]) -> tuple[str, ...]:
    value = raw.get("languages", list(all_languages))
    if not isinstance(value, list) or not all(v in all_languages for v in value):
        raise ValueError("host_facade.json: `languages` must list known languages")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class FacadeError:
    """One failure a façade member reports: ``text`` is the exact message (``{name}``-style
    placeholders filled by the caller), ``type`` what is raised (``result``: a failed result)."""

    id: str
    when: str
    type: Spelled
    text: Spelled
    languages: tuple[str, ...]
    same_as: str = ""  # the member whose error of this id this is

    def text_for(self, language: str, **fill: str) -> str:
        """The text in ``language`` with each ``{key}`` of ``fill`` replaced (other braces, as
        in ``{ name, description }``, are the text's own)."""
        text = self.text[language]
        for key, value in fill.items():
            text = text.replace("{" + key + "}", value)
        return text


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    type: str
    required: bool
    semantics: str
    spelling: Spelled

    def spelled(self, language: str) -> str:
        return self.spelling.get(language, self.name)


@dataclass(frozen=True, slots=True)
class Method:
    """A method of a member that is an object (``timer``, ``console``)."""

    name: str
    parameters: tuple[Parameter, ...]
    returns: str
    semantics: str


@dataclass(frozen=True, slots=True)
class Member:
    """One façade member. ``name`` is its catalogue name in Python's spelling; ``owner`` is the
    object that holds it (``global``, ``plugin``, or an object's path such as ``ctx.tools``)."""

    name: str
    spelling: Spelled
    owner: str
    kind: str
    languages: tuple[str, ...]
    parameters: tuple[Parameter, ...]
    returns: str
    semantics: str
    signature: Spelled
    errors: tuple[FacadeError, ...]
    methods: tuple[Method, ...]
    injected_only: bool  # reachable only when the plugin's inject lists it

    def spelled(self, language: str) -> str:
        """The catalogue name in ``language`` (``harness.defineTool``)."""
        return self.spelling.get(language, self.name)

    def attribute(self, language: str) -> str:
        """The name under which its owner holds it in ``language`` (``defineTool``)."""
        return self.spelled(language).rsplit(".", 1)[-1]

    def error(self, error_id: str) -> FacadeError:
        for item in self.errors:
            if item.id == error_id:
                return item
        raise KeyError(f"{self.name} has no error {error_id!r}")


@dataclass(frozen=True, slots=True)
class FacadeObject:
    """An object of the façade that holds members (``harness``, ``ctx``, ``ctx.tools``)."""

    path: str
    owner: str
    semantics: str
    errors: tuple[FacadeError, ...]

    @property
    def attribute(self) -> str:
        return self.path.rsplit(".", 1)[-1]


@dataclass(frozen=True, slots=True)
class HostFacade:
    version: int
    languages: tuple[str, ...]
    members: tuple[Member, ...]
    objects: tuple[FacadeObject, ...]
    globals: Mapping[str, tuple[str, ...]]  # language -> the host half's own names
    withheld: Mapping[str, tuple[str, ...]]  # language -> names that are traps or undefined
    host_half_errors: tuple[FacadeError, ...]
    invocation_errors: tuple[FacadeError, ...]
    events: tuple[str, ...]

    def members_for(self, language: str) -> tuple[Member, ...]:
        return tuple(m for m in self.members if language in m.languages)

    def member(self, name: str) -> Member:
        for item in self.members:
            if item.name == name:
                return item
        raise KeyError(name)

    def object(self, path: str) -> FacadeObject:
        for item in self.objects:
            if item.path == path:
                return item
        raise KeyError(path)

    def attributes(self, owner: str, language: str) -> frozenset[str]:
        """What the object ``owner`` exposes in ``language``: its members (those reached only
        when injected excepted) and the façade objects it holds."""
        names = {
            m.attribute(language)
            for m in self.members_for(language)
            if m.owner == owner and not m.injected_only
        }
        names.update(o.attribute for o in self.objects if o.owner == owner)
        return frozenset(names)


def _errors(raw: object, languages: tuple[str, ...], what: str) -> tuple[FacadeError, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"host_facade.json: {what}.errors must be a list")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError(f"host_facade.json: {what}.errors holds a non-object")
        own = _languages(item, languages)
        error_id = _str(item, "id", what)
        same_as = item.get("same_as", "")
        if not isinstance(same_as, str):
            raise ValueError(f"host_facade.json: {what}.errors.same_as must be a string")
        out.append(
            FacadeError(
                id=error_id,
                when=_str(item, "when", f"{what}.{error_id}", ""),
                type=_spelled(item.get("type", "Error"), own, f"{what}.{error_id}.type"),
                text=_spelled(item.get("text", ""), own, f"{what}.{error_id}.text"),
                languages=own,
                same_as=same_as,
            )
        )
    return tuple(out)


def _parameters(raw: object, languages: tuple[str, ...], what: str) -> tuple[Parameter, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"host_facade.json: {what}.parameters must be a list")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("required"), bool):
            raise ValueError(f"host_facade.json: {what}.parameters holds a malformed entry")
        out.append(
            Parameter(
                name=_str(item, "name", what),
                type=_str(item, "type", what),
                required=item["required"],
                semantics=_str(item, "semantics", what),
                spelling=_spelled(item.get("spelling", {}), languages, f"{what}.spelling"),
            )
        )
    return tuple(out)


def _member(raw: Mapping[str, Any], languages: tuple[str, ...]) -> Member:
    name = _str(raw, "name", "member")
    own = _languages(raw, languages)
    methods = raw.get("methods", [])
    if not isinstance(methods, list) or not all(isinstance(m, dict) for m in methods):
        raise ValueError(f"host_facade.json: {name}.methods must be a list of objects")
    return Member(
        name=name,
        spelling=_spelled(raw.get("spelling", {}), own, f"{name}.spelling"),
        owner=_str(raw, "owner", name),
        kind=_str(raw, "kind", name),
        languages=own,
        parameters=_parameters(raw.get("parameters", []), own, name),
        returns=_str(raw, "returns", name),
        semantics=_str(raw, "semantics", name),
        signature=_spelled(raw.get("signature", {}), own, f"{name}.signature"),
        errors=_errors(raw.get("errors", []), own, name),
        methods=tuple(
            Method(
                name=_str(m, "name", f"{name}.methods"),
                parameters=_parameters(m.get("parameters", []), own, f"{name}.methods"),
                returns=_str(m, "returns", f"{name}.methods"),
                semantics=_str(m, "semantics", f"{name}.methods"),
            )
            for m in methods
        ),
        injected_only=raw.get("injected_only", False) is True,
    )


def _names(raw: object, languages: tuple[str, ...], what: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict) or set(raw) != set(languages):
        raise ValueError(f"host_facade.json: {what} must be keyed by every language")
    out = {}
    for language, names in raw.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"host_facade.json: {what}.{language} must be a list of names")
        out[language] = tuple(names)
    return out


def parse(raw: object) -> HostFacade:
    """The façade of a parsed ``host_facade.json`` (``ValueError`` naming what is malformed)."""
    if not isinstance(raw, dict):
        raise ValueError("host_facade.json must hold an object")
    version = raw.get("version")
    languages = raw.get("languages")
    if type(version) is not int or version < 1:
        raise ValueError("host_facade.json: `version` must be a positive integer")
    if not isinstance(languages, list) or not all(isinstance(x, str) for x in languages):
        raise ValueError("host_facade.json: `languages` must be a list of names")
    langs = tuple(languages)
    host_half = raw.get("host_half")
    members = raw.get("members")
    objects = raw.get("objects")
    invocations = raw.get("invocations")
    events = raw.get("events")
    if not (
        isinstance(host_half, dict)
        and isinstance(members, list)
        and isinstance(objects, list)
        and isinstance(invocations, dict)
        and isinstance(events, list)
    ):
        raise ValueError("host_facade.json: host_half, members, objects, invocations, events")
    parsed = tuple(_member(m, langs) for m in members if isinstance(m, dict))
    if len(parsed) != len(members) or len({m.name for m in parsed}) != len(parsed):
        raise ValueError("host_facade.json: members must be objects with distinct names")
    return HostFacade(
        version=version,
        languages=langs,
        members=parsed,
        objects=tuple(
            FacadeObject(
                path=_str(o, "path", "object"),
                owner=_str(o, "owner", "object"),
                semantics=_str(o, "semantics", "object"),
                errors=_errors(o.get("errors", []), langs, str(o.get("path"))),
            )
            for o in objects
            if isinstance(o, dict)
        ),
        globals=_names(host_half.get("globals"), langs, "host_half.globals"),
        withheld=_names(host_half.get("withheld"), langs, "host_half.withheld"),
        host_half_errors=_errors(host_half.get("errors", []), langs, "host_half"),
        invocation_errors=_errors(invocations.get("errors", []), langs, "invocations"),
        events=tuple(_str(e, "name", "event") for e in events if isinstance(e, dict)),
    )


@functools.cache
def load() -> HostFacade:
    """The façade this package ships (read once)."""
    text = resources.files(__package__ or "codemode_wire").joinpath("host_facade.json")
    return parse(json.loads(text.read_text(encoding="utf-8")))
