"""Policy from configuration: the rules file and `module:function` plugins, seen through gRPC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from registry_service.config import ConfigError, RegistrySettings
from registry_service.registry import build_registry
from tests.registry.conftest import Harness, echo_tool

RULES = """
rules:
  - tool: "write_*"
    agent: "agents/ci-*"
    action: deny
    reason: CI agents never write
  - tool: write_file
    action: allow
  - tool: "write_*"
    action: deny
  - tool: "*"
    agent: "agents/ci-*"
    action: deny
"""


def _rules(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return path


async def _outcome(h: Harness, tool: str, agent: str) -> tuple[bool, str, str]:
    _, result = await h.execute(tool, agent=agent)
    return result.is_error, result.error.code, result.error.message


async def test_rules_match_agent_globs_and_the_first_match_wins(
    make_registry: Any, tmp_path: Path
) -> None:
    async with make_registry(policy_rules=_rules(tmp_path, RULES)) as h:
        for name in ("write_file", "write_log", "read_file"):
            echo_tool(h.registry, name)
        ci, dev = await h.agent("ci-nightly"), await h.agent("dev")
        # The agent-specific deny comes first, so CI is refused even the allowed write_file.
        assert await _outcome(h, "write_file", ci) == (True, "DENIED", "CI agents never write")
        # A later rule that also matches never overrides an earlier one.
        assert await _outcome(h, "write_file", dev) == (False, "", "")
        assert await _outcome(h, "write_log", dev) == (
            True,
            "DENIED",
            'tool "write_log" is denied by policy',
        )
        # Agent globs match `agents/{id}` names; no matching rule leaves the call allowed.
        assert (await _outcome(h, "read_file", ci))[:2] == (True, "DENIED")
        assert await _outcome(h, "read_file", dev) == (False, "", "")
        # Model-direct calls without an agent match only rules whose agent glob is "*".
        assert await _outcome(h, "read_file", "") == (False, "", "")


async def test_an_ask_rule_needs_an_approver(make_registry: Any, tmp_path: Path) -> None:
    rules = _rules(tmp_path, "rules:\n  - tool: deploy\n    action: ask\n    reason: prod\n")
    async with make_registry(policy_rules=rules) as h:
        echo_tool(h.registry, "deploy")
        events, result = await h.execute("deploy", agent=await h.agent("ops"))
        assert result.is_error
        kinds = [e.WhichOneof("event") for e in events]
        assert "approval_pending" in kinds and "approval_resolved" in kinds
        pending = next(e.approval_pending for e in events if e.HasField("approval_pending"))
        assert pending.reason == "prod"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: {}", "expected a mapping with a `rules` list"),
        ("rules:\n  - action: deny\n", "rule 1: needs a string `tool`"),
        ("rules:\n  - tool: x\n    action: block\n", "`action` must be allow, deny or ask"),
        ("rules:\n  - tool: x\n    action: deny\n    who: me\n", "unknown field(s) who"),
        ("rules: [", "cannot read policy rules"),
    ],
)
def test_a_malformed_rules_file_fails_at_start(tmp_path: Path, text: str, message: str) -> None:
    settings = RegistrySettings(history_path=":memory:", policy_rules=_rules(tmp_path, text))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_registry(settings)


def test_a_missing_rules_file_fails_at_start(tmp_path: Path) -> None:
    settings = RegistrySettings(history_path=":memory:", policy_rules=tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="cannot read policy rules"):
        build_registry(settings)


async def test_a_configured_plugin_adds_tools_and_hooks(make_registry: Any) -> None:
    async with make_registry(plugins=["tests.registry.policy_plugin:install"]) as h:
        assert "clock" in await h.visible()
        guest, staff = await h.agent("guest"), await h.agent("staff")
        assert await _outcome(h, "clock", guest) == (True, "DENIED", "guests have no clock")
        _, result = await h.execute("clock", agent=staff)
        assert not result.is_error and result.value_json == '{"now":"12:00"}'


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("tests.registry.policy_plugin", "must be written `module:function`"),
        ("tests.registry.no_such_module:install", "cannot load plugin"),
        ("tests.registry.policy_plugin:absent", "cannot load plugin"),
        ("tests.registry.policy_plugin:NOT_CALLABLE", "is not callable"),
    ],
)
def test_a_bad_plugin_entry_fails_at_start(entry: str, message: str) -> None:
    settings = RegistrySettings(history_path=":memory:", plugins=[entry])
    with pytest.raises(ConfigError, match=message):
        build_registry(settings)
