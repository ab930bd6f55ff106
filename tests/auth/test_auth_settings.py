"""Authentication and authorization settings that cannot work stop the start, naming why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from registry_service.config import ConfigError, load_settings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"auth": {"tokens": [{"principal": "ci", "sha256": "secret"}]}}, "64 hex digits"),
        ({"auth": {"tokens": [{"principal": "", "sha256": "a" * 64}]}}, "principal"),
        (
            {
                "auth": {
                    "jwt": {"jwks_file": "/nonexistent/jwks.json", "issuer": "i", "audience": "a"}
                }
            },
            "cannot read /nonexistent/jwks.json",
        ),
        (
            {"grants": [{"principals": ["token:ci"], "permissions": ["own"], "resources": ["*"]}]},
            "permissions",
        ),
        (
            {"grants": [{"principals": [], "permissions": ["manage"], "resources": ["*"]}]},
            "principals",
        ),
        ({"limits": {"calls_per_second": 0}}, "calls_per_second"),
        ({"agent_limits": {"max_concurrent_runs": -1}}, "max_concurrent_runs"),
    ],
)
def test_unworkable_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(None, history_path=":memory:", **settings)


@pytest.mark.parametrize("algorithm", ["HS256", "none"])
def test_jwt_algorithms_must_be_asymmetric(tmp_path: Path, algorithm: str) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    jwt = {"jwks_file": jwks, "issuer": "i", "audience": "a", "algorithms": [algorithm]}
    with pytest.raises(ConfigError, match="asymmetric"):
        load_settings(None, history_path=":memory:", auth={"jwt": jwt})
