"""What a preset or agent attaches as MCP servers, and its stored form (see
`registry_service.domain.mcp_servers` for what may be attached)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["McpAttachment", "attachments_from_json", "attachments_to_json"]


@dataclass(frozen=True, slots=True)
class McpAttachment:
    """What a scope asked for: a settings name (`server`) or a `url` with `headers`."""

    server: str = ""
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """How the server is named in logs, errors and tool owners."""
        return self.server or self.url


def attachments_to_json(attachments: Iterable[McpAttachment]) -> str:
    """The stored form ("" for none)."""
    items = [
        {"server": a.server} if a.server else {"url": a.url, "headers": dict(a.headers)}
        for a in attachments
    ]
    return json.dumps(items, sort_keys=True) if items else ""


def attachments_from_json(text: str) -> tuple[McpAttachment, ...]:
    if not text:
        return ()
    return tuple(
        McpAttachment(
            server=str(item.get("server", "")),
            url=str(item.get("url", "")),
            headers=tuple(sorted((str(k), str(v)) for k, v in item.get("headers", {}).items())),
        )
        for item in json.loads(text)
    )
