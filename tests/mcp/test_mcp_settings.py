"""The MCP settings are checked at start: a bad entry stops it with a clear message."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from registry_service.config import RegistrySettings


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"mcp_servers": {"x": {}}}, "exactly one of `command` or `url`"),
        (
            {"mcp_servers": {"x": {"command": "/bin/true", "url": "http://h/"}}},
            "exactly one of `command` or `url`",
        ),
        ({"mcp_servers": {"x": {"command": "/bin/true", "headers": {"a": "b"}}}}, "go with `url`"),
        ({"mcp_servers": {"x": {"url": "http://h/", "args": ["a"]}}}, "go with `command`"),
        ({"mcp_servers": {"x": {"url": "ftp://h/"}}}, "not http"),
        ({"mcp_http_allow": ["http://"]}, "URL prefix with a host"),
        ({"agents": [{"id": "a", "mcp_servers": ["nope"]}]}, "not declared"),
        ({"mcp_user": ""}, "at least 1 character"),
    ],
)
def test_bad_mcp_settings_stop_the_start(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RegistrySettings(**settings)
    assert says in str(caught.value)


def test_declared_servers_become_the_policy() -> None:
    settings = RegistrySettings(
        mcp_servers={
            "local": {"command": "/bin/srv", "args": ["-v"], "env": {"A": "1"}},
            "remote": {"url": "https://h/mcp", "headers": {"X": "y"}},
        },
        mcp_http_allow=["https://tools.example/"],
    )
    policy = settings.mcp_policy()
    assert policy.http_allow == ("https://tools.example/",)
    assert set(policy.servers) == {"local", "remote"}
