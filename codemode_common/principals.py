"""Who is calling: principals from verified client certificates and bearer tokens.

A principal is named `<kind>:<name>`, so that one authority cannot mint another's names (a JWT
whose `sub` is `spiffe://…` is `jwt:spiffe://…`, never the certificate `cert:spiffe://…`):

- `cert:<SAN>`: the client certificate's first URI SAN (a SPIFFE id, say), else its first DNS
  SAN. The TLS handshake has already checked it against `tls_client_ca_file`.
- `token:<principal>`: a static bearer token; settings hold only its SHA-256, never the token.
- `jwt:<claim>`: a JWT signed by a key of the JWKS file, with the configured issuer and
  audience, not expired; the principal is its `principal_claim` (default `sub`).
- `anonymous`: no credentials, on a service with no authentication configured (the loopback
  default: everything stays open).

A bearer token that is present is always checked (an invalid one is refused even when a
certificate would have identified the caller). No grpc import: the transport collects the
certificate names and the token (`codemode_common.peer`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from codemode_wire.errors import CodemodeError, unauthenticated

__all__ = [
    "ANONYMOUS",
    "AuthSettings",
    "Authenticator",
    "JwtSetting",
    "Principal",
    "StaticTokenSetting",
    "is_loopback",
]

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Principal:
    kind: str
    """`cert`, `token`, `jwt` or `anonymous`."""
    name: str

    @property
    def qualified(self) -> str:
        """`kind:name` (just `anonymous` for the anonymous principal): what grants match."""
        return self.kind if self.kind == "anonymous" else f"{self.kind}:{self.name}"

    def __str__(self) -> str:
        return self.qualified


ANONYMOUS = Principal("anonymous", "")


class StaticTokenSetting(BaseModel):
    """A static bearer token, stored as the hex SHA-256 of its text."""

    model_config = ConfigDict(extra="forbid")

    principal: str = Field(min_length=1)
    """The caller's name: the principal is `token:<principal>`."""
    sha256: str
    """`printf %s "$TOKEN" | sha256sum`: 64 lowercase hex digits."""

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        value = value.strip().lower()
        if not _SHA256_HEX.fullmatch(value):
            raise ValueError("sha256 must be 64 hex digits (the token's SHA-256, not the token)")
        return value


class JwtSetting(BaseModel):
    """JWTs verified against a JWKS file (read at start)."""

    model_config = ConfigDict(extra="forbid")

    jwks_file: Path
    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256", "EdDSA"])
    """Accepted signature algorithms (never `none`, never HMAC: the keys are public)."""
    principal_claim: str = "sub"
    leeway_s: float = Field(default=30.0, ge=0, le=600)
    """Clock skew allowed on `exp` and `nbf`."""

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        bad = [a for a in value if a.lower() == "none" or a.upper().startswith("HS")]
        if bad or not value:
            raise ValueError(f"algorithms must be non-empty and asymmetric, not {bad}")
        return value


class AuthSettings(BaseModel):
    """Bearer-token authentication (certificates come with `tls_client_ca_file`)."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[StaticTokenSetting] = Field(default_factory=list)
    jwt: JwtSetting | None = None

    @property
    def bearer_configured(self) -> bool:
        return bool(self.tokens) or self.jwt is not None


class Authenticator:
    """Turns the transport's credentials into a principal, or UNAUTHENTICATED."""

    def __init__(self, settings: AuthSettings, *, certificates: bool) -> None:
        """`certificates`: the server verifies client certificates (mutual TLS)."""
        self._tokens = {t.sha256: t.principal for t in settings.tokens}
        self._jwt = settings.jwt
        self._keys = _read_jwks(settings.jwt.jwks_file) if settings.jwt is not None else {}
        self._certificates = certificates
        self.enforced = certificates or settings.bearer_configured
        """False: no authentication configured; every caller is `anonymous`."""

    def authenticate(self, certificate_names: Sequence[str], bearer: str | None) -> Principal:
        if bearer is not None:
            return self._bearer(bearer)
        if self._certificates and certificate_names:
            return Principal("cert", certificate_names[0])
        if self.enforced:
            raise unauthenticated(
                "CREDENTIALS_REQUIRED",
                "this service requires a client certificate naming a URI or DNS SAN, or an "
                "`authorization: Bearer` token",
            )
        return ANONYMOUS

    def _bearer(self, token: str) -> Principal:
        # The stored value is a hash: a lookup by it reveals nothing usable about the secret.
        name = self._tokens.get(hashlib.sha256(token.encode("utf-8", "replace")).hexdigest())
        if name is not None:
            return Principal("token", name)
        if self._jwt is not None and token.count(".") == 2:
            return Principal("jwt", self._verify_jwt(token, self._jwt))
        raise _invalid("the bearer token is not one this service knows")

    def _verify_jwt(self, token: str, config: JwtSetting) -> str:
        import jwt  # imported when JWTs are configured: see _read_jwks

        try:
            header = jwt.get_unverified_header(token)
            kid = header.get("kid")
            key = self._keys.get(kid) if kid else _only(self._keys)
            if key is None:
                raise _invalid("the token's signing key is not in the JWKS file")
            claims = jwt.decode(
                token,
                key,
                algorithms=config.algorithms,
                audience=config.audience,
                issuer=config.issuer,
                leeway=config.leeway_s,
                options={"require": ["exp", "iss", "aud", config.principal_claim]},
            )
        except jwt.PyJWTError as exc:
            raise _invalid(f"the JWT does not verify: {exc}") from exc
        subject = claims.get(config.principal_claim)
        if not isinstance(subject, str) or not subject:
            raise _invalid(f"the JWT's {config.principal_claim!r} claim is not a name")
        return subject


def _invalid(message: str) -> CodemodeError:
    return unauthenticated("INVALID_CREDENTIALS", message)


def _only(keys: dict[str, Any]) -> Any:
    """A token without `kid` may use the JWKS's only key, never pick among several."""
    return next(iter(keys.values())) if len(keys) == 1 else None


def _read_jwks(path: Path) -> dict[str, Any]:
    """The JWKS file's public keys by `kid` (a key without one: by its position)."""
    # PyJWT brings cryptography (~12 MiB of every service's idle memory): imported only by a
    # service configured with JWTs.
    import jwt

    try:
        keys = jwt.PyJWKSet.from_json(path.read_text())
    except (OSError, jwt.PyJWTError, ValueError) as exc:
        raise ValueError(f"auth.jwt.jwks_file: cannot read {path}: {exc}") from exc
    return {key.key_id or f"#{i}": key for i, key in enumerate(keys.keys)}


def is_loopback(listen: str) -> bool:
    """Whether `host:port` binds only the loopback interface (`localhost`, 127/8, ::1)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"
