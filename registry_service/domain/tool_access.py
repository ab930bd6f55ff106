"""Who may call which tool of an agent: the one rule, for every path a call can take.

A call on an agent (resource `agents/{id}`; `global` without one) needs `execute` there; a
`cordis_*` tool also needs `cordis` (self-modification is its own permission beyond calling
the agent's tools). The same rule admits
- a model-direct `ExecuteToolCall` (the RPC guard, `registry_service.rpc_access`);
- every nested call of a `run_code` program, Python and TypeScript alike, as the principal of
  that `run_code` call (`registry_service.codemode.bridge`): the run keeps the principal the
  guard authenticated in the registry's memory, and nothing on the runtime's `Run` stream can
  name or change it;
- the calls a plugin host makes (the service methods of its owner's other plugins), as the
  principal that started the host -- the caller of its `cordis_run`, or the page runner whose
  panel started it (`registry_service.domain.cordis.runner`): the host is that principal's
  act, and lives no longer than its activation;
and it decides what a principal is shown: the bindings of its runs, its SDK, prompt, wire
schemas and tool list, a plugin host's `ctx.tools.schemas()`. A tool it may not call is absent.

A refusal is PERMISSION_DENIED naming the missing permission (`access.denied`), whichever path
the call came by, and each one leaves an `access/denied` record in the audit log.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from codemode_common.principals import Principal
from codemode_wire import jsonvalue
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain import records
from registry_service.domain.access import AccessPolicy, Permission, denied, resource_of
from registry_service.domain.catalog import View
from registry_service.domain.cordis.names import NAMES as CORDIS_TOOLS
from registry_service.domain.records import Record
from registry_service.domain.results import error_result

__all__ = ["CallKind", "Denial", "ToolAccess", "ToolAuthority", "Via", "kind_of"]

log = logging.getLogger(__name__)

PERMISSION_DENIED = "PERMISSION_DENIED"


class CallKind(enum.Enum):
    TOOL = "tool"
    """Any tool of the agent (run_code, providers' tools, dynamic plugins' tools)."""
    CORDIS = "cordis"
    """Self-modification: the `cordis_*` tools."""
    HOST = "host"
    """What a plugin host does for its owner (its calls of the owner's other plugins'
    services): Cordis acting for the owner, as the principal that started the host."""


# THE table: what each kind of call needs over the agent's resource, in the order a refusal
# names the first one missing.
REQUIRED: dict[CallKind, tuple[Permission, ...]] = {
    CallKind.TOOL: (Permission.EXECUTE,),
    CallKind.CORDIS: (Permission.EXECUTE, Permission.CORDIS),
    # A host is started by `cordis_run` (execute and cordis) or from a plugin panel (a page
    # runner attaches with cordis): what it does needs the permission common to both.
    CallKind.HOST: (Permission.CORDIS,),
}
_ASKED = frozenset(p for needs in REQUIRED.values() for p in needs)

# How a call reached the registry: from the backend, from a run_code program (either language:
# the program's binding calls all come back over the same Run stream), or from a plugin host.
Via = Literal["direct", "run_code", "plugin-host"]


def kind_of(tool: str) -> CallKind:
    return CallKind.CORDIS if tool in CORDIS_TOOLS else CallKind.TOOL


@dataclass(frozen=True, slots=True)
class ToolAccess:
    """What one principal holds of the rule's permissions over one scope (asked once each)."""

    principal: Principal
    resource: str
    held: frozenset[Permission]

    def missing(self, kind: CallKind) -> Permission | None:
        return next((p for p in REQUIRED[kind] if p not in self.held), None)

    def may(self, kind: CallKind) -> bool:
        return self.missing(kind) is None

    def may_call(self, tool: str) -> bool:
        return self.may(kind_of(tool))

    def callable(self, names: Iterable[str]) -> list[str]:
        if self.held == _ASKED:  # every tool (authorization off, or a principal holding all)
            return list(names)
        return [name for name in names if self.may_call(name)]

    @property
    def key(self) -> frozenset[Permission]:
        """What tells two principals' views of one scope apart (presentation caches on it)."""
        return self.held

    def restrict(self, view: View) -> View:
        """The scope's view as this principal may use it: without the tools it may not call
        (and without the Cordis prompt when it may not use Cordis)."""
        if self.held == _ASKED:
            return view
        visible = {n: d for n, d in view.visible.items() if self.may_call(n)}
        return dataclasses.replace(
            view,
            visible=visible,
            registered_in={n: s for n, s in view.registered_in.items() if n in visible},
            self_modification=view.self_modification and self.may(CallKind.CORDIS),
        )


@dataclass(frozen=True, slots=True)
class Denial:
    """One refused call: the error its caller gets and the audit record it leaves."""

    principal: Principal
    permission: Permission
    resource: str
    agent: str
    tool: str
    call_id: str
    via: Via
    parent_call_id: str = ""

    def error(self) -> CodemodeError:
        return denied(self.principal, self.permission, self.resource)

    def record(self) -> Record:
        """An `access/denied` record in the audit log: who, what was missing, over what, for
        which call and how it came (never the call's arguments: they may hold secrets)."""
        error = self.error()
        details: dict[str, JsonValue] = {
            "principal": self.principal.qualified,
            "permission": self.permission.value,
            "resource": self.resource,
            "agent": self.agent,
            "tool": self.tool,
            "call_id": self.call_id,
            "parent_call_id": self.parent_call_id,
            "via": self.via,
        }
        return records.record(
            records.ACCESS_DENIED,
            agent=records.AUDIT_LOG,
            agent_id=records.AUDIT_LOG,  # the global scope's history, as every audit record
            call_id=f"denied-{uuid.uuid4().hex[:16]}",
            root_call_id="",
            parent_call_id="",
            name=self.tool,
            arguments_json=jsonvalue.dumps(details),
            result=error_result(error.message, PERMISSION_DENIED, "PermissionDeniedError"),
        )


Audit = Callable[[Record], Awaitable[object]]


class ToolAuthority:
    """The rule over the deployment's grants, and the audit log its refusals go to."""

    def __init__(self, policy: AccessPolicy, audit: Audit | None = None) -> None:
        self.policy = policy
        self._audit = audit

    def access(self, principal: Principal, scope: str) -> ToolAccess:
        resource = resource_of(scope)
        if not self.policy.enforced:
            return ToolAccess(principal, resource, _ASKED)
        held = frozenset(p for p in _ASKED if self.policy.allows(principal, p, resource))
        return ToolAccess(principal, resource, held)

    async def authorize(
        self,
        principal: Principal,
        agent: str,
        tool: str,
        *,
        call_id: str,
        via: Via,
        parent_call_id: str = "",
        kind: CallKind | None = None,
    ) -> None:
        """Returns when `principal` may make the call on `agent` ("": the global scope); else
        writes the refusal's audit record and raises its PERMISSION_DENIED."""
        await self.check(
            self.access(principal, agent),
            agent,
            tool,
            call_id=call_id,
            via=via,
            parent_call_id=parent_call_id,
            kind=kind,
        )

    async def check(
        self,
        access: ToolAccess,
        agent: str,
        tool: str,
        *,
        call_id: str,
        via: Via,
        parent_call_id: str = "",
        kind: CallKind | None = None,
    ) -> None:
        """`authorize` with the principal's access to `agent` already known (a run asks once:
        grants do not change while the registry runs). `kind` defaults to the tool's own."""
        missing = access.missing(kind or kind_of(tool))
        if missing is None:
            return
        denial = Denial(
            access.principal, missing, access.resource, agent, tool, call_id, via, parent_call_id
        )
        if self._audit is not None:
            try:
                await self._audit(denial.record())
            except CodemodeError as error:
                # The refusal stands either way; the lost record is logged, as for the
                # administrative audit records (registry_service/servicer.py `_audit`).
                log.error(
                    "audit record of a refused %s by %s lost: %s", tool, access.principal, error
                )
        raise denial.error()
