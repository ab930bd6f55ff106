"""The registry's description of the plugin host façade names exactly the façade that
``codemode_wire/host_facade.json`` specifies (the harnesses are held to the same file by
tests/runtime/test_host_facade.py): what `Builtin.listBuiltins` shows an agent of each
language, with the signatures, the timer's methods in `Service.listService`, the events in
`Event.listEvents`, and every façade name the `tool:cordis` prompt section mentions."""

from __future__ import annotations

import re

import pytest

from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.host_facade import HostFacade, load
from tests.registry.cordis.conftest import CordisHarness

FACADE: HostFacade = load()
# A dotted façade name in prose: `harness.define_tool`, `ctx.timer.timeout`.
_REFERENCE = re.compile(r"\b(?:harness|ctx)(?:\.[A-Za-z_]\w*)+")


def _reachable_names(language: str) -> set[str]:
    """Every dotted name a host half of ``language`` can write: members, their methods, the
    objects that hold them."""
    names = {m.spelled(language) for m in FACADE.members_for(language)}
    for member in FACADE.members_for(language):
        path = member.spelled(language) if member.owner == "global" else f"ctx.{member.name}"
        names.update(f"{path}.{method.name}" for method in member.methods)
    names.update(o.path for o in FACADE.objects)
    return names


@pytest.mark.parametrize("language", FACADE.languages)
async def test_the_registry_describes_exactly_the_specified_facade(
    cordis: CordisHarness, language: str
) -> None:
    agent = await cordis.agent("maker", language=language)
    listed = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {"platform": "host", "provider": "Builtin", "method": "listBuiltins"},
    )
    described = {b["name"]: b["signature"] for b in listed["data"]["builtins"]}
    assert len(described) == len(listed["data"]["builtins"])  # each named once
    specified = {m.spelled(language): m.signature[language] for m in FACADE.members_for(language)}
    assert set(described) == set(specified)  # no more, no fewer
    assert described == specified  # and with the specified signatures

    timer = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {
            "platform": "host",
            "provider": "Service",
            "method": "listService",
            "input": {"service": "timer"},
        },
    )
    specified_methods = [m.name for m in FACADE.member("timer").methods]
    assert sorted(timer["data"]["service"]["methods"]) == sorted(specified_methods)

    events = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {"platform": "host", "provider": "Event", "method": "listEvents"},
    )
    assert set(FACADE.events) <= {e["name"] for e in events["data"]["events"]}

    prompt = await cordis.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=agent))
    mentioned = set(_REFERENCE.findall(prompt.text))
    assert mentioned, "the prompt names no façade member"
    assert mentioned <= _reachable_names(language), mentioned - _reachable_names(language)
    # The members a host half cannot do without are taught by name.
    for name in ("harness.define_tool", "harness.register_tool", "ctx.effect", "ctx.provide"):
        assert FACADE.member(name).spelled(language) in mentioned
