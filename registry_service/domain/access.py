"""Who may do what: permissions granted to principals over scopes and agents.

A grant names principals (`cert:…`, `token:…`, `jwt:…`), permissions and resources, each
exactly or by glob pattern (`fnmatch`: `*`, `?`, `[…]`; `*` also crosses `/`). Resources are
scope names: `agents/{id}`, `presets/{id}`, and `global` for the global scope. Listing all
presets or agents asks for `presets/*` / `agents/*` literally, which only a pattern covering
every one of them (`*`, `agents/*`) grants.

With no authentication configured the policy is open: every caller may do everything (the
loopback default). Otherwise nothing is allowed that no grant allows.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from codemode_common.principals import Principal
from codemode_wire.errors import CodemodeError, permission_denied
from registry_service.domain.scopes import GLOBAL

__all__ = ["AccessPolicy", "Grant", "Permission", "resource_of"]

GLOBAL_RESOURCE = "global"


class Permission(enum.Enum):
    MANAGE = "manage"
    """Presets, agents, modes, restrictions, scope declarations."""
    EXECUTE = "execute"
    """Tool calls, prompts and SDKs, history (list, watch, record content) as an agent."""
    REGISTER = "register"
    """Register tools into a scope (a provider's Connect stream)."""
    APPROVE = "approve"
    """Receive and answer an agent's approval requests."""
    CORDIS = "cordis"
    """Cordis: plugin references and the `cordis_*` tools of an agent."""


def resource_of(scope: str) -> str:
    """The resource name grants match for a scope key (`""` is `global`)."""
    return GLOBAL_RESOURCE if scope == GLOBAL else scope


@dataclass(frozen=True, slots=True)
class Grant:
    principals: tuple[str, ...]
    permissions: frozenset[Permission]
    resources: tuple[str, ...]

    def covers(self, principal: Principal, permission: Permission) -> bool:
        return permission in self.permissions and _any_match(principal.qualified, self.principals)


def _any_match(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


class AccessPolicy:
    def __init__(self, grants: Iterable[Grant], *, enforced: bool) -> None:
        self._grants = tuple(grants)
        self.enforced = enforced

    def allows(self, principal: Principal, permission: Permission, resource: str) -> bool:
        if not self.enforced:
            return True
        return any(
            grant.covers(principal, permission) and _any_match(resource, grant.resources)
            for grant in self._grants
        )

    def holds(self, principal: Principal, permission: Permission) -> bool:
        """Whether some grant gives `permission` over anything (a stream may attach; each
        message it sends is then checked against its own resource)."""
        return not self.enforced or any(g.covers(principal, permission) for g in self._grants)

    def require(self, principal: Principal, permission: Permission, resource: str) -> None:
        if not self.allows(principal, permission, resource):
            raise denied(principal, permission, resource)


def denied(principal: Principal, permission: Permission, resource: str) -> CodemodeError:
    """PERMISSION_DENIED naming what was missing (never what exists: the same refusal for a
    resource that does not exist)."""
    return permission_denied(
        "PERMISSION_DENIED",
        f"{principal} may not {permission.value} {resource}",
        permission=permission.value,
        resource=resource,
        principal=principal.qualified,
    )
