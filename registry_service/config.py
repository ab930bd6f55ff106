"""Registry settings: environment variables (`CODEMODE_REGISTRY_*`) over an optional YAML file.

Every default works with no setup. Invalid settings fail at start with a clear message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from registry_service.domain.scopes import Mode


class ConfigError(ValueError):
    pass


class RegistrySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CODEMODE_REGISTRY_", extra="forbid")

    listen: str = "127.0.0.1:50051"
    """Address the gRPC server binds, `host:port` (port 0 picks a free one)."""
    default_mode: Mode = Mode.NATIVE
    """Deployment default presentation mode: native, code or both."""
    max_parallel_sub_calls: int = Field(default=10, ge=1)
    """Per-run cap on overlapping concurrency-safe nested calls (used by run_code)."""
    policy_rules: Path | None = None
    """Optional YAML rules file applied as the embedded pre-execute policy."""
    plugins: list[str] = Field(default_factory=list)
    """`module:function` entries called with the Registry at start (in-process tools, hooks)."""
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    """Largest gRPC message accepted or sent."""
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    """How long in-flight RPCs may finish on shutdown."""


def load_settings(path: Path | None = None, **overrides: Any) -> RegistrySettings:
    """Reads the optional YAML file, then environment variables, then explicit overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read registry config {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"registry config {path}: expected a mapping")
        data.update(loaded)
    data.update(overrides)
    try:
        # Environment variables take precedence over the file: init values are the lowest
        # priority only when passed through a settings source, so merge explicitly.
        from_env = RegistrySettings().model_dump(exclude_unset=True)
        return RegistrySettings(**{**data, **from_env, **overrides})
    except ValidationError as exc:
        raise ConfigError(f"invalid registry settings: {exc}") from exc
