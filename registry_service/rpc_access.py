"""The one table of RegistryService methods → the permission each needs, and the guard that
applies it before any method runs (installed by `add_service(..., guard=...)`). A tool call
(ExecuteToolCall) is admitted by the tool rule instead (`domain.tool_access`), the one that
also admits the nested calls of its runs and of plugin hosts.

A method missing from the table is refused to everyone once authentication is on (and the
tests check every method is listed), so a new RPC cannot ship open by accident. Streams
(Connect, Approve) need their permission over something to attach; each message naming a
scope or an agent is then checked by the stream itself (`registry_service.streams`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from codemode_common.peer import bearer_token, certificate_names
from codemode_common.principals import Authenticator, Principal
from registry_service._errors import DOMAIN
from registry_service.domain.access import Permission, denied, resource_of
from registry_service.domain.tool_access import ToolAuthority

__all__ = ["RULES", "RegistryGuard", "Rule"]

M, E, R, A, C = (
    Permission.MANAGE,
    Permission.EXECUTE,
    Permission.REGISTER,
    Permission.APPROVE,
    Permission.CORDIS,
)


@dataclass(frozen=True, slots=True)
class Rule:
    permissions: tuple[Permission, ...]
    """Any one of them, over the resource, admits the call."""
    resource: Callable[[Any], str] | None
    """The resource a request names; None: a stream, checked per message (or an approver
    unary, checked per approval)."""


def _name(request: Any) -> str:
    return str(request.name)


def _scope(request: Any) -> str:
    return resource_of(request.scope)


def _agent(request: Any) -> str:
    return resource_of(request.agent)


RULES: dict[str, Rule] = {
    "CreatePreset": Rule((M,), lambda r: f"presets/{r.preset_id}"),
    "GetPreset": Rule((M, E), _name),
    "ListPresets": Rule((M,), lambda _r: "presets/*"),
    "DeletePreset": Rule((M,), _name),
    "CreateAgent": Rule((M,), lambda r: f"agents/{r.agent_id}"),
    "GetAgent": Rule((M, E), _name),
    "ListAgents": Rule((M,), lambda _r: "agents/*"),
    "DeleteAgent": Rule((M,), _name),
    "SetPresentationMode": Rule((M,), _scope),
    "AddRestriction": Rule((M,), _scope),
    "RemoveRestriction": Rule((M,), _scope),
    "ListVisibleTools": Rule((E, M), _scope),
    "GetWireSchemas": Rule((E, M), _scope),
    "GetSystemPrompt": Rule((E, M), _scope),
    "GetSdk": Rule((E, M), _scope),
    # What `domain.tool_access` asks of every tool call (`cordis` too for a `cordis_*` tool).
    "ExecuteToolCall": Rule((E,), _agent),
    # The empty agent's history is the audit log: manage on `global` instead (see below).
    "ListHistory": Rule((E,), _agent),
    "WatchHistory": Rule((E,), _agent),
    "GetRecordContent": Rule((E,), _agent),
    "ResolvePluginReferences": Rule((C,), _agent),
    "Connect": Rule((R,), None),
    "Approve": Rule((A,), None),
    # Like the stream: `approve` over something to ask at all; each approval is then shown or
    # answered only for an agent the caller may approve for (the servicer asks the policy).
    "ListPendingApprovals": Rule((A,), None),
    "ResolveApproval": Rule((A,), None),
    # PageRunnerService: attach with `cordis` over something; the agent the `open` message
    # names is checked by the stream (`page_runner_servicer`).
    "Attach": Rule((C,), None),
}


# The empty agent: the audit log, or (with `agent_id`) a deleted agent's history read by its
# id -- both for operators: `manage` on `global`.
_AUDIT_READS = frozenset({"ListHistory", "WatchHistory", "GetRecordContent"})


class RegistryGuard:
    """Authenticates every RegistryService call, then applies `RULES`."""

    domain = DOMAIN

    def __init__(self, authenticator: Authenticator, tools: ToolAuthority) -> None:
        self._authenticator = authenticator
        self._tools = tools
        self.policy = tools.policy

    async def __call__(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, request: Any | None
    ) -> Principal:
        principal = self._authenticator.authenticate(
            certificate_names(context), bearer_token(context)
        )
        rule = RULES.get(method)
        if rule is None:
            if self.policy.enforced:
                raise denied(principal, Permission.MANAGE, f"method {method}")
            return principal
        if request is None or rule.resource is None:
            # A stream attaches with its permission over something; a request that could
            # not be parsed is refused by the method (after authentication, above).
            if rule.resource is None and not self.policy.holds(principal, rule.permissions[0]):
                raise denied(principal, rule.permissions[0], "any scope")
            return principal
        if method == "ExecuteToolCall":
            # The rule every nested call is held to as well; a refusal is audited.
            await self._tools.authorize(
                principal, request.agent, request.tool_name, call_id=request.call_id, via="direct"
            )
            return principal
        resource = rule.resource(request)
        if method in _AUDIT_READS and request.agent == "":
            self.policy.require(principal, M, resource)
            return principal
        if not any(self.policy.allows(principal, p, resource) for p in rule.permissions):
            raise denied(principal, rule.permissions[0], resource)
        return principal
