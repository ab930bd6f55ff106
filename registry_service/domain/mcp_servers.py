"""MCP servers as tool providers: what a scope may attach, and the port to an MCP client.

A preset or agent may use MCP servers. Commands are the operator's: only the settings declare
a stdio command (`mcp_servers` there); the API attaches a server the settings name, or a
streamable-HTTP URL within the operator's allow-list (`mcp_http_allow`), never a new command
(anything else would be remote code execution for whoever may create a scope). The registry
is the MCP client, through the `McpConnector` port (the SDK lives in `registry_service/mcp/`);
each attached server feeds its scope's catalog exactly as a tool provider stream does
(`providers.ProviderSession`), so its tools pass the one pipeline. See docs/mcp.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import unquote, urlsplit

from codemode_wire.errors import invalid_argument, permission_denied
from registry_service.domain.mcp_attachments import McpAttachment
from registry_service.domain.providers import ToolSpec
from registry_service.domain.results import ToolResult

__all__ = [
    "MAX_SERVERS_PER_SCOPE",
    "MCP_TOOL_ERROR",
    "ConnectionEvents",
    "HttpServer",
    "McpAttachment",
    "McpConnection",
    "McpConnector",
    "McpPolicy",
    "Progress",
    "ServerSpec",
    "StdioServer",
]

MCP_TOOL_ERROR = "MCP_TOOL_ERROR"
"""The code of a call whose MCP server answered `isError: true` (its content is kept)."""
MAX_SERVERS_PER_SCOPE = 16
_MAX_HEADERS = 32
_MAX_HEADER_BYTES = 8 * 1024


@dataclass(frozen=True, slots=True)
class StdioServer:
    """A command the settings declare: run as a supervised child of the registry."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    """The child's whole environment: nothing of the registry's is inherited."""
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class HttpServer:
    """A streamable-HTTP endpoint."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    bearer_token_file: str | None = None
    """Read at every connect; sent as `Authorization: Bearer <token>`."""


ServerSpec = StdioServer | HttpServer


@dataclass(frozen=True, slots=True)
class McpPolicy:
    """The operator's MCP settings: the servers declared by name, and the URL prefixes the API
    may attach."""

    servers: Mapping[str, ServerSpec] = field(default_factory=dict)
    http_allow: tuple[str, ...] = ()

    def check(self, attachments: Iterable[McpAttachment]) -> tuple[McpAttachment, ...]:
        """The attachments of a scope being created, each resolvable (raises: nothing is
        stored)."""
        checked = tuple(attachments)
        if len(checked) > MAX_SERVERS_PER_SCOPE:
            raise invalid_argument(
                "TOO_MANY_MCP_SERVERS",
                f"a scope attaches at most {MAX_SERVERS_PER_SCOPE} MCP servers, not {len(checked)}",
                field="mcp_servers",
            )
        seen: set[str] = set()
        for attachment in checked:
            self.resolve(attachment)
            if attachment.label in seen:
                raise invalid_argument(
                    "DUPLICATE_MCP_SERVER",
                    f"MCP server {attachment.label!r} is attached twice",
                    field="mcp_servers",
                )
            seen.add(attachment.label)
        return checked

    def resolve(self, attachment: McpAttachment) -> ServerSpec:
        """What to connect to for `attachment` (raises INVALID_ARGUMENT or PERMISSION_DENIED)."""
        if bool(attachment.server) == bool(attachment.url):
            raise invalid_argument(
                "INVALID_MCP_SERVER",
                "an MCP server names exactly one of `server` (declared in the registry "
                "settings) or `url`",
                field="mcp_servers",
            )
        if attachment.server:
            if attachment.headers:
                raise invalid_argument(
                    "INVALID_MCP_SERVER",
                    f"MCP server {attachment.server!r}: headers go with `url` only (a settings "
                    "server has the headers the settings give it)",
                    field="mcp_servers",
                )
            spec = self.servers.get(attachment.server)
            if spec is None:
                known = ", ".join(sorted(self.servers)) or "(none)"
                raise invalid_argument(
                    "UNKNOWN_MCP_SERVER",
                    f"MCP server {attachment.server!r} is not declared in the registry "
                    f"settings (declared: {known})",
                    field="mcp_servers",
                    server=attachment.server,
                )
            return spec
        url = attachment.url
        if (
            not url.startswith(("http://", "https://"))
            or any(c.isspace() or c == "\\" for c in url)
            or _dot_segments(url)
        ):
            raise invalid_argument(
                "INVALID_MCP_URL",
                f"MCP server url {url!r} is not an http:// or https:// URL without dot "
                "segments or backslashes",
                field="mcp_servers",
            )
        if not any(url.startswith(prefix) for prefix in self.http_allow):
            raise permission_denied(
                "MCP_URL_NOT_ALLOWED",
                f"MCP server url {url!r} is not within the registry's `mcp_http_allow` "
                "prefixes: an operator must allow it",
                url=url,
            )
        _check_headers(attachment.headers)
        return HttpServer(url, dict(attachment.headers))


def _dot_segments(url: str) -> bool:
    """Whether the URL's path has `.` or `..` segments (percent-encoded too): the HTTP client
    would resolve them, reaching a path outside the allow-listed prefix it was checked against."""
    path = urlsplit(url).path
    return any(unquote(segment) in {".", ".."} for segment in path.split("/"))


# Headers the HTTP client owns: set over the API they could reach another virtual host behind
# the allow-listed address, or break the request's framing.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
)


def _check_headers(headers: tuple[tuple[str, str], ...]) -> None:
    if len(headers) > _MAX_HEADERS or sum(len(k) + len(v) for k, v in headers) > (
        _MAX_HEADER_BYTES
    ):
        raise invalid_argument(
            "INVALID_MCP_HEADERS",
            f"MCP server headers: at most {_MAX_HEADERS} of {_MAX_HEADER_BYTES} bytes together",
            field="mcp_servers",
        )
    for name, value in headers:
        # A token (RFC 9110 field name) and a value without line breaks: no header injection.
        if not name or not all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name):
            raise invalid_argument(
                "INVALID_MCP_HEADERS", f"header name {name!r} is not valid", field="mcp_servers"
            )
        if name.lower() in _RESERVED_HEADERS or name.lower().startswith("mcp-"):
            raise invalid_argument(
                "INVALID_MCP_HEADERS",
                f"header {name!r} is the HTTP client's own and cannot be set",
                field="mcp_servers",
            )
        if any(c in value for c in "\r\n\x00"):
            raise invalid_argument(
                "INVALID_MCP_HEADERS",
                f"header {name!r} has a line break or NUL in its value",
                field="mcp_servers",
            )


@dataclass(frozen=True, slots=True)
class ConnectionEvents:
    """What a connection tells its supervisor."""

    tools_changed: Callable[[], None]
    """The server sent `notifications/tools/list_changed` (coalesced: re-list once)."""


Progress = Callable[[float, float | None, str | None], None]


class McpConnection(Protocol):
    """One initialized MCP session with one server."""

    async def list_tools(self) -> tuple[list[ToolSpec], list[str]]:
        """The server's tools as the catalog takes them, and `name: reason` for each it
        cannot take (an annotation or schema that does not map)."""
        ...

    async def call(
        self,
        name: str,
        arguments_json: str,
        deadline_s: float | None,
        progress: Progress | None = None,
    ) -> ToolResult:
        """One `tools/call`; cancelling the awaiting task sends `notifications/cancelled`.
        A tool error (`isError`) is a result with MCP_TOOL_ERROR; a lost connection raises.
        With `progress`, the call asks for the server's progress notifications and gives each
        to it (`progress(value, total, message)`, e.g. `Invocation.progress`)."""
        ...

    async def closed(self) -> str:
        """Returns once the connection has ended, with why (a process exit, a protocol
        violation, a transport error)."""
        ...

    async def close(self) -> None:
        """Ends the session; a stdio server's process group is gone when this returns."""
        ...


class McpConnector(Protocol):
    async def connect(
        self, spec: ServerSpec, label: str, events: ConnectionEvents
    ) -> McpConnection:
        """Starts (stdio) or reaches (HTTP) the server and initializes the session; a server
        that does not answer `initialize` in time fails here, its process stopped."""
        ...


class McpCallFailed(Exception):
    """A call the server answered with a failure of its own (an error response, a result that
    does not match the tool's declared output schema): that call fails with `code`."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class McpConnectionLost(Exception):
    """The connection ended while the call was in flight (the call fails
    PROVIDER_UNAVAILABLE with `str(exc)` as why)."""
