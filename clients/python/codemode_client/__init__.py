"""Python client for Codemode: call the registry, serve tools, answer approvals.

- `RegistryClient` (async) / `SyncRegistryClient` (blocking): agents and presets, tool calls,
  `run_code`, wire schemas, prompt and SDK, history (`watch_agent_messages`: the `agent/steer`
  and `agent/inject` records as typed `AgentMessage`s).
- `ToolProvider`: serve tools from async functions over the `Connect` stream; a handler returns a
  JSON value or a `ToolOutput` (content blocks `TextContent`, `ImageContent`, `JsonContent`,
  `AdditionalContext`s, `concludes_turn`) or a model, and raises `ToolError` (alias
  `ToolFailed`) to fail the call with its own text; arguments arrive parsed into the hint.
- `Approver`: answer approval requests from a function.
- `PageRunner`: a Cordis page runner (activation requests, settlement, `invoke`, render
  failures, client inspect manifests and queries) over `PageRunnerService.Attach`.
- `open_channel`: a channel whose message limits match the registry's (use it for
  `ToolProvider` and `Approver`: gRPC's 4 MiB default breaks on large arguments).
- Errors: `CodemodeError` and one subclass per status code, with `reason`, `domain`, `metadata`.
"""

from codemode_client.agent_messages import AgentMessage, agent_message
from codemode_client.approver import Approver
from codemode_client.channel import open_channel
from codemode_client.client import Progress, RegistryClient, ToolCallResult, unbatched
from codemode_client.errors import (
    AlreadyExists,
    CodemodeError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ToolError,
    Unavailable,
)
from codemode_client.page_runner import PageRunner
from codemode_client.provider import InvocationContext, ProviderError, ToolFailed, ToolProvider
from codemode_client.replicas import ReplicaSet
from codemode_client.results import (
    AdditionalContext,
    ContentBlock,
    ImageContent,
    JsonContent,
    TextContent,
    ToolOutput,
)
from codemode_client.sync import SyncRegistryClient

__all__ = [
    "AdditionalContext",
    "AgentMessage",
    "AlreadyExists",
    "Approver",
    "CodemodeError",
    "ContentBlock",
    "DeadlineExceeded",
    "FailedPrecondition",
    "ImageContent",
    "InvalidArgument",
    "InvocationContext",
    "JsonContent",
    "NotFound",
    "PageRunner",
    "Progress",
    "ProviderError",
    "RegistryClient",
    "ReplicaSet",
    "SyncRegistryClient",
    "TextContent",
    "ToolCallResult",
    "ToolError",
    "ToolFailed",
    "ToolOutput",
    "ToolProvider",
    "Unavailable",
    "agent_message",
    "open_channel",
    "unbatched",
]
