"""Parent tokens: unforgeable proof that a call comes from inside a registry-run program.

A token is an HMAC over (execution id, agent, expiry) with a deployment key. Only the registry
mints and verifies it; the runtime echoes it as opaque bytes and programs never see it. A nested
call whose token does not verify (forged, for another agent, or expired) is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

_VERSION = 1
_MAC_BYTES = 32


@dataclass(frozen=True, slots=True)
class ParentToken:
    """A verified token: the run it belongs to."""

    execution_id: str
    agent: str
    expires_at: float


class TokenError(ValueError):
    pass


class TokenMinter:
    def __init__(self, key: bytes | None = None, clock: Callable[[], float] = time.time) -> None:
        # A random key per process is right for one registry replica; replicas that must accept
        # each other's tokens share `token_key` through configuration.
        self._key = key or os.urandom(32)
        self.clock = clock  # wall-clock seconds: expiries must mean the same to every replica

    def mint(self, execution_id: str, agent: str, ttl_s: float) -> bytes:
        expires = self.clock() + ttl_s
        body = _encode(execution_id, agent, expires)
        return body + hmac.new(self._key, body, hashlib.sha256).digest()

    def verify(self, token: bytes, *, agent: str | None = None) -> ParentToken:
        body, mac = token[:-_MAC_BYTES], token[-_MAC_BYTES:]
        if len(token) <= _MAC_BYTES or not hmac.compare_digest(
            mac, hmac.new(self._key, body, hashlib.sha256).digest()
        ):
            raise TokenError("parent token does not verify")
        parsed = _decode(body)
        if agent is not None and parsed.agent != agent:
            raise TokenError("parent token belongs to another agent")
        if parsed.expires_at < self.clock():
            raise TokenError("parent token expired")
        return parsed


def _encode(execution_id: str, agent: str, expires: float) -> bytes:
    ident, who = execution_id.encode(), agent.encode()
    return struct.pack(">BdHH", _VERSION, expires, len(ident), len(who)) + ident + who


def _decode(body: bytes) -> ParentToken:
    header = struct.calcsize(">BdHH")
    try:
        version, expires, n_ident, n_who = struct.unpack(">BdHH", body[:header])
        if version != _VERSION or len(body) != header + n_ident + n_who:
            raise TokenError("parent token is malformed")
        ident = body[header : header + n_ident].decode()
        who = body[header + n_ident :].decode()
    except (struct.error, UnicodeDecodeError) as exc:
        raise TokenError("parent token is malformed") from exc
    return ParentToken(ident, who, expires)
