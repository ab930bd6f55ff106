"""Policy hooks: the in-process extension points of the pipeline, and the declarative rules.

Hooks are registered into a scope's layer (global, a preset or an agent) and observe the calls of
agents under that scope; deleting the scope drops them with it. Stages, in order:
pre-execute (allow / deny / ask) → approval → guards → around → body → post-execute
(accept with replacement / block) → result observers.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import Execution
from registry_service.domain.results import AdditionalContext, ContentBlock, ToolResult
from registry_service.domain.sections import Section


@dataclass(frozen=True, slots=True)
class Allow:
    kind: Literal["allow"] = "allow"


@dataclass(frozen=True, slots=True)
class Deny:
    reason: str
    kind: Literal["deny"] = "deny"


@dataclass(frozen=True, slots=True)
class Ask:
    reason: str | None = None
    kind: Literal["ask"] = "ask"
    expires_in_s: float | None = None
    """How long the approval waits for an answer (None: the `approval_expiry_s` setting)."""


PreDecision = Allow | Deny | Ask


@dataclass(frozen=True, slots=True)
class Accept:
    """Accept the result, optionally replacing its content or (for successes) its value."""

    content: tuple[ContentBlock, ...] | None = None
    value: JsonValue = None
    replace_value: bool = False
    contexts: tuple[AdditionalContext, ...] = ()
    kind: Literal["accept"] = "accept"


@dataclass(frozen=True, slots=True)
class Block:
    """Turn the result into an error whose content is `feedback`."""

    feedback: tuple[ContentBlock, ...]
    contexts: tuple[AdditionalContext, ...] = ()
    kind: Literal["block"] = "block"


PostDecision = Accept | Block

# A waterfall stage: each hook receives the decision so far and returns the next one.
PreExecuteHook = Callable[["Execution", PreDecision], Awaitable[PreDecision]]
# Guards are synchronous and monotonic: a reason denies, None passes.
Guard = Callable[["Execution"], "str | None"]
# Around wraps dispatch: call `proceed()` to run the rest (inner wrappers, then the body).
AroundHook = Callable[["Execution", Callable[[], Awaitable[ToolResult]]], Awaitable[ToolResult]]
PostExecuteHook = Callable[["Execution", ToolResult, PostDecision], Awaitable[PostDecision]]
ResultObserver = Callable[["Execution", ToolResult], None]
# The system-prompt assemble step: receives the scope and the filtered, ordered sections and
# returns the sections to use. Its output is authoritative (nothing is restored afterwards).
# Install these at start (plugins): assembled prompts are cached per catalog version.
PromptHook = Callable[[str, list["Section"]], list["Section"]]


@dataclass
class PolicyHooks:
    """The hooks registered in one scope."""

    pre_execute: list[PreExecuteHook] = field(default_factory=list)
    guards: list[Guard] = field(default_factory=list)
    around: list[AroundHook] = field(default_factory=list)
    post_execute: list[PostExecuteHook] = field(default_factory=list)
    observers: list[ResultObserver] = field(default_factory=list)
    prompt: list[PromptHook] = field(default_factory=list)


# -- declarative rules --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of the rules file. `tool` is a glob; `agent` a glob over `agents/{id}` names."""

    tool: str
    action: Literal["allow", "deny", "ask"]
    agent: str = "*"
    reason: str = ""

    def matches(self, execution: Execution) -> bool:
        agent = execution.agent or ""
        return fnmatch.fnmatchcase(execution.name, self.tool) and fnmatch.fnmatchcase(
            agent, self.agent
        )


class RulesError(ValueError):
    pass


def load_rules(path: Path) -> list[Rule]:
    """Parses a rules file: `rules: [{tool, action, agent?, reason?}, ...]`, first match wins."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RulesError(f"cannot read policy rules {path}: {exc}") from exc
    entries = (document or {}).get("rules", []) if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise RulesError(f"policy rules {path}: expected a mapping with a `rules` list")
    rules = []
    for index, entry in enumerate(entries):
        where = f"policy rules {path}: rule {index + 1}"
        if not isinstance(entry, dict) or not isinstance(entry.get("tool"), str):
            raise RulesError(f"{where}: needs a string `tool`")
        unknown = set(entry) - {"tool", "action", "agent", "reason"}
        if unknown:
            raise RulesError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        action = entry.get("action")
        if action not in ("allow", "deny", "ask"):
            raise RulesError(f"{where}: `action` must be allow, deny or ask")
        agent, reason = entry.get("agent", "*"), entry.get("reason", "")
        if not isinstance(agent, str) or not isinstance(reason, str):
            raise RulesError(f"{where}: `agent` and `reason` must be strings")
        rules.append(Rule(tool=entry["tool"], action=action, agent=agent, reason=reason))
    return rules


def rules_hook(rules: list[Rule]) -> PreExecuteHook:
    """A pre-execute hook applying the first matching rule (no match: leave the decision)."""

    async def hook(execution: Execution, decision: PreDecision) -> PreDecision:
        for rule in rules:
            if rule.matches(execution):
                if rule.action == "deny":
                    return Deny(rule.reason or f'tool "{execution.name}" is denied by policy')
                if rule.action == "ask":
                    return Ask(rule.reason or None)
                return Allow()
        return decision

    return hook
