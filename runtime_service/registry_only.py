"""Only registries may run programs: `Run`, `Multiplex` (many runs on one stream) and `Host`
are accepted from a client whose verified certificate names one of `registry_identities`
(`cert:<SAN>`, exactly or by glob pattern). The NetworkPolicy of deploy/ narrows who can
connect; this decides who may run.

With no identities configured the runtime stays open (the loopback default; a non-loopback
address then gets a loud warning at start). `GetCapabilities` stays open: it only describes.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import grpc

from codemode_common.peer import certificate_names
from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire.errors import permission_denied, unauthenticated
from runtime_service.servicer import DOMAIN

__all__ = ["GUARDED", "RegistryOnly"]

GUARDED = frozenset({"Run", "Multiplex", "Host"})


class RegistryOnly:
    domain = DOMAIN

    def __init__(self, identities: list[str]) -> None:
        self._identities = tuple(identities)

    @property
    def enforced(self) -> bool:
        return bool(self._identities)

    async def __call__(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, request: Any | None
    ) -> Principal:
        if not self._identities or method not in GUARDED:
            return ANONYMOUS
        principals = [Principal("cert", name) for name in certificate_names(context)]
        if not principals:
            raise unauthenticated(
                "CREDENTIALS_REQUIRED",
                f"{method} needs a client certificate naming a registry (URI or DNS SAN)",
            )
        for principal in principals:
            if any(fnmatch.fnmatchcase(principal.qualified, p) for p in self._identities):
                return principal
        raise permission_denied(
            "NOT_A_REGISTRY",
            f"{principals[0]} is not a registry this runtime accepts {method} from",
            permission="registry",
            resource=method,
            principal=principals[0].qualified,
        )
