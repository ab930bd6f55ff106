"""`cordis_define`: parameters, ownership, syntax checks, identities (invariant 1: it never runs
code, never asks approval, never moves a pointer; ids are never reused).

Syntax checks are a runtime's (`CheckSource`, a sandboxed worker of the half's language): those
tests run against a registry wired to a real runtime on loopback."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.registry.conftest import result_text
from tests.registry.cordis.conftest import CLOCK, CordisHarness
from tests.registry.cordis.real_stack import NEEDS_NODE, real_stack


@pytest.fixture
async def checked() -> AsyncIterator[CordisHarness]:
    """A registry whose defines are checked by a real runtime."""
    async with real_stack() as harness:
        yield harness


async def _define_call(
    cordis: CordisHarness, agent: str, host: str | None, client: str | None = None
) -> Any:
    """The raw result of a `cordis_define` of these halves (for refusals: `cordis.define`
    wants ok)."""
    code = {k: v for k, v in (("host", host), ("client", client)) if v is not None}
    return await cordis.call(
        agent,
        "cordis_define",
        {
            "plugin": {"kind": "new", "idPrefix": "clock" if host is not None else "panel"},
            "name": "n",
            "purpose": "p",
            "code": code,
        },
    )


async def test_define_records_a_package_and_runs_nothing(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    result = await cordis.call(
        agent,
        "cordis_define",
        {
            "plugin": {"kind": "new", "idPrefix": "  clock "},
            "name": " Clock ",
            "purpose": "Tell the time.",
            "code": {"host": CLOCK},
        },
    )
    assert not result.is_error, result.error.message
    assert result_text(result) == (
        "Defined clock-1/pkg-1 (Clock); it is not running yet. Use cordis_run to activate "
        "this Package."
    )
    assert cordis.hosts is not None and cordis.hosts.log == []  # nothing ran
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin == {
        "mode": "plugin",
        "pluginId": "clock-1",
        "name": "Clock",
        "packageCount": 1,
        "state": "defined",
        "packages": plugin["packages"],
    }
    assert plugin["packages"] == [
        {
            "packageId": "pkg-1",
            "name": "Clock",
            "purpose": "Tell the time.",
            "hasHostHalf": True,
            "hasClientHalf": False,
            "isCurrent": False,
            "isNext": False,
        }
    ]


async def test_ids_share_one_counter_and_are_never_reused(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    first = await cordis.define(agent, prefix="clock")
    second = await cordis.define(agent, prefix="panel")
    assert (first["pluginId"], first["packageId"]) == ("clock-1", "pkg-1")
    assert (second["pluginId"], second["packageId"]) == ("panel-2", "pkg-2")
    appended = await cordis.define(agent, existing="clock-1", name="Clock v2")
    assert (appended["pluginId"], appended["packageId"]) == ("clock-1", "pkg-3")
    await cordis.ok(agent, "cordis_undefine", {"pluginId": "clock-1"})
    again = await cordis.define(agent, prefix="clock")
    assert (again["pluginId"], again["packageId"]) == ("clock-3", "pkg-4")
    # Old packages are immutable: the first version's source is still exactly what was sent.
    view = await cordis.ok(
        agent, "cordis_inspect_self", {"pluginId": "panel-2", "packageId": "pkg-2"}
    )
    assert view["code"] == {"host": CLOCK}
    assert cordis.hosts is not None and cordis.hosts.log == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {
                "plugin": {"kind": "new", "idPrefix": "Clock"},
                "name": "n",
                "purpose": "p",
                "code": {"host": "return 1"},
            },
            "cordis_define `plugin.idPrefix` must contain 3–6 lowercase English letters",
        ),
        (
            {
                "plugin": {"kind": "new", "idPrefix": "ab"},
                "name": "n",
                "purpose": "p",
                "code": {"host": "return 1"},
            },
            "cordis_define `plugin.idPrefix` must contain 3–6 lowercase English letters",
        ),
        (
            {
                "plugin": {"kind": "new", "idPrefix": "clock"},
                "name": "  ",
                "purpose": "p",
                "code": {"host": "return 1"},
            },
            "cordis_define needs a non-empty `name`",
        ),
        (
            {
                "plugin": {"kind": "new", "idPrefix": "clock"},
                "name": "n",
                "purpose": "",
                "code": {"host": "return 1"},
            },
            "cordis_define needs a non-empty `purpose`",
        ),
        (
            {
                "plugin": {"kind": "new", "idPrefix": "clock"},
                "name": "n",
                "purpose": "p",
                "code": {},
            },
            "cordis_define needs `code.host`, `code.client`, or both",
        ),
    ],
)
async def test_incomplete_defines_are_refused(
    cordis: CordisHarness, arguments: object, message: str
) -> None:
    agent = await cordis.agent("maker")
    result = await cordis.call(agent, "cordis_define", arguments)
    assert result.is_error
    assert result.error.message == message
    listed = await cordis.ok(agent, "cordis_inspect_self", {})
    assert listed == {"mode": "plugins", "plugins": []}


async def test_schema_closes_the_plugin_union(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    result = await cordis.call(
        agent,
        "cordis_define",
        {
            "plugin": {"kind": "new", "idPrefix": "clock", "pluginId": "x-1"},
            "name": "n",
            "purpose": "p",
            "code": {"host": "return 1"},
        },
    )
    assert result.is_error and result.error.code == "INVALID_ARGS"


async def test_python_parse_errors_carry_line_caret_and_hint(checked: CordisHarness) -> None:
    cordis = checked
    agent = await cordis.agent("maker")
    result = await _define_call(cordis, agent, "async def apply(ctx):\n    x = (1,\n\nreturn apply")
    assert result.is_error and result.error.code == "syntax-error"
    assert result.error.message == (
        "cordis_define code.host does not parse as a Python async function body: '(' was "
        "never closed (line 2)\n"
        "    x = (1,\n"
        "        ^\n"
        "Hint: check that brackets, quotes and indentation balance; line numbers count from "
        "the first line of the body (the async function wrapper adds none)."
    )
    js = await _define_call(cordis, agent, "const tool = harness.define_tool({})\nreturn tool")
    assert js.error.message.endswith(
        "Hint: the Host half is Python (an async function body that returns the plugin), "
        "not JavaScript or TypeScript."
    )
    assert "(line 1)\nconst tool = harness.define_tool({})\n      ^\n" in js.error.message
    assert (await cordis.ok(agent, "cordis_inspect_self", {}))["plugins"] == []


@NEEDS_NODE
async def test_a_typescript_host_half_is_checked_as_typescript(checked: CordisHarness) -> None:
    cordis = checked
    # The agent's program language is its host halves' language: types are fine, and a parse
    # error is named in the body's own lines, with the line, a caret and a hint.
    agent = await cordis.agent("maker", language="typescript")
    good = await cordis.define(
        agent,
        "const unit: string = 'utc';\n"
        "return (ctx: any): void => {\n"
        "  const now = harness.defineTool({ name: 'now', execute: () => unit as string });\n"
        "  harness.registerTool(now);\n"
        "};",
    )
    assert good["hasHostHalf"] is True
    for code, line, text, error in [
        # The type stripper stops here (amaro's parser).
        ("const a: number = 1;\nconst b = (a +;\nreturn () => {};", 2, "const b = (a +;", ""),
        # Types stripped, then node stops here (the body is a strict function).
        (
            "let x: number = 1;\ndelete x;\nreturn () => {};",
            2,
            "delete x;",
            "Delete of an unqualified identifier in strict mode",
        ),
        # Strip-only cannot erase an enum.
        ("enum Zone { Utc }\nreturn () => {};", 1, "enum Zone { Utc }", "enum"),
    ]:
        bad = await _define_call(cordis, agent, code)
        assert bad.is_error and bad.error.code == "syntax-error", code
        message = bad.error.message
        assert message.startswith(
            "cordis_define code.host does not parse as a TypeScript async function body: "
        ), message
        assert f"(line {line})\n{text}\n" in message, message
        assert error.lower() in message.lower(), message
        caret = message.split("\n")[2]
        assert caret.strip() == "^" and len(caret) <= len(text) + 1
    python = await _define_call(cordis, agent, "def apply(ctx):\n    pass\nreturn apply")
    assert python.error.message.endswith(
        "Hint: the Host half is TypeScript (an async function body that returns the plugin), "
        "not Python."
    )
    listed = (await cordis.ok(agent, "cordis_inspect_self", {}))["plugins"]
    assert [p["pluginId"] for p in listed] == [good["pluginId"]]


@NEEDS_NODE
async def test_client_half_is_checked_as_javascript(checked: CordisHarness) -> None:
    cordis = checked
    agent = await cordis.agent("maker")
    bad = await _define_call(
        cordis, agent, None, "const size = (props.size as number)\nreturn {apply() {}}"
    )
    assert bad.is_error and bad.error.code == "syntax-error"
    assert "(line 1)\nconst size = (props.size as number)\n" in bad.error.message
    assert "remove TypeScript syntax such as `as` casts" in bad.error.message
    good = await cordis.define(
        agent, None, prefix="panel", client="return { apply(ctx) { console.log('hi') } }"
    )
    assert good["hasClientHalf"] is True and good["hasHostHalf"] is False


async def test_a_define_no_runtime_can_check_is_refused_and_stores_nothing(
    make_cordis: Any,
) -> None:
    # The registry is wired to a runtime that is not there: the halves cannot be parsed, so
    # nothing is recorded (an unchecked half would only fail later, at an activation).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"  # closed once the block ends
    async with make_cordis(runtime_targets=[dead], runtime_start_timeout_s=0.2) as cordis:
        agent = await cordis.agent("maker")
        refused = await _define_call(cordis, agent, "return {'apply': None}")
        assert refused.is_error and refused.error.code == "runtime-unavailable"
        assert refused.error.message.startswith(
            "cordis_define could not check code.host: no code runtime took the check within 0.2 s"
        ), refused.error.message
        assert refused.error.message.endswith("; try again; nothing was stored")
        assert (await cordis.ok(agent, "cordis_inspect_self", {}))["plugins"] == []


async def test_a_half_in_a_language_no_runtime_serves_is_refused() -> None:
    # The runtime serves Python only: a TypeScript agent's host half, and any client half
    # (JavaScript: checked by Node workers), cannot be checked there.
    async with real_stack({"languages": ["python"]}, runtime_languages=None) as cordis:
        agent = await cordis.agent("maker", language="typescript")
        refused = await _define_call(cordis, agent, "return () => {};")
        assert refused.is_error and refused.error.code == "language-not-served"
        assert "no code runtime here checks typescript" in refused.error.message
        python = await cordis.agent("other")
        client = await _define_call(cordis, python, None, "return {apply() {}}")
        assert client.is_error and client.error.code == "language-not-served"
        assert "no code runtime here checks JavaScript" in client.error.message
        for owner in (agent, python):
            assert (await cordis.ok(owner, "cordis_inspect_self", {}))["plugins"] == []


async def test_another_agents_plugin_reads_as_absent(cordis: CordisHarness) -> None:
    owner = await cordis.agent("owner")
    other = await cordis.agent("other")
    await cordis.define(owner)
    absent = (
        'no dynamic plugin "clock-1" in this process — it may have been removed or lost on '
        "registry restart"
    )
    for name, arguments in [
        (
            "cordis_define",
            {
                "plugin": {"kind": "existing", "pluginId": "clock-1"},
                "name": "n",
                "purpose": "p",
                "code": {"host": "return 1"},
            },
        ),
        ("cordis_inspect_self", {"pluginId": "clock-1"}),
        ("cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}),
        ("cordis_stop", {"pluginId": "clock-1"}),
        ("cordis_undefine", {"pluginId": "clock-1"}),
    ]:
        result = await cordis.call(other, name, arguments)
        assert result.is_error, name
        assert (result.error.message, result.error.code) == (absent, "plugin-missing"), name
    assert (await cordis.ok(other, "cordis_inspect_self", {}))["plugins"] == []
    assert len((await cordis.ok(owner, "cordis_inspect_self", {}))["plugins"]) == 1


async def test_package_id_alone_is_refused(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    result = await cordis.call(agent, "cordis_inspect_self", {"packageId": "pkg-1"})
    assert result.error.message == "cordis_inspect_self packageId requires pluginId"
