"""Registry settings: environment variables (`CODEMODE_REGISTRY_*`) over an optional YAML file.

Every default works with no setup. Invalid settings fail at start with a clear message.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from codemode_common.principals import Authenticator, AuthSettings
from codemode_common.settings import ConfigError, ServiceSettings, load_settings_file
from codemode_common.tls import ClientTls, TlsFileError, client_tls
from codemode_wire.errors import CodemodeError
from registry_service.codemode.runtime_port import RuntimeChannel
from registry_service.domain.access import AccessPolicy, Grant, Permission
from registry_service.domain.admission import (
    DEFAULT_AGENT_LIMITS,
    DEFAULT_GLOBAL_LIMITS,
    Limits,
)
from registry_service.domain.json_admission import DEFAULT_LIMITS, JsonLimits
from registry_service.domain.mcp_attachments import McpAttachment
from registry_service.domain.mcp_servers import (
    HttpServer,
    McpPolicy,
    ServerSpec,
    StdioServer,
)
from registry_service.domain.scopes import Mode
from registry_service.history.store import StoreOpenError
from registry_service.history.stores import check_options
from registry_service.presentation.assembly import Section, check_config
from registry_service.presentation.language_profiles import LANGUAGES, NO_RUNTIME_LANGUAGE

__all__ = [
    "AgentSetting",
    "ConfigError",
    "GrantSetting",
    "LimitsSetting",
    "McpServerSetting",
    "PresetSetting",
    "PromptSectionSetting",
    "RegistrySettings",
    "load_settings",
]

# The runtime accepts pings no closer together than this on a connection without data
# (runtime_service/server.py MIN_PING_INTERVAL_MS); closer ones earn a GOAWAY that also ends the
# runs on the connection.
RUNTIME_MIN_PING_INTERVAL_S = 20
# gRPC takes durations as int32 milliseconds: the longest one it can hold, in seconds.
_GRPC_MAX_S = (2**31 - 1) // 1000


class LimitsSetting(BaseModel):
    """Admission limits (see `registry_service.domain.admission`). On `limits` and
    `agent_limits` an unset field takes its default and `null` means unlimited; on a preset or
    agent an unset (or `null`) field is inherited."""

    model_config = ConfigDict(extra="forbid")

    max_concurrent_runs: int | None = Field(default=None, ge=0)
    """`run_code` runs in flight; on `limits`, runs in flight plus live plugin hosts (each holds
    a sandbox on a runtime)."""
    max_plugin_hosts: int | None = Field(default=None, ge=0)
    """Live plugin hosts (Cordis host halves), from activation until their processes are gone."""
    max_nested_in_flight: int | None = Field(default=None, ge=0)
    """Nested tool calls of programs in flight (queued or running)."""
    calls_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Model-direct tool calls started per second (token bucket)."""
    burst: int | None = Field(default=None, ge=1)
    """Calls that may start at once after a quiet spell; unset: the rate rounded up."""
    max_mcp_servers: int | None = Field(default=None, ge=0)
    """MCP servers attached to a scope and running (a stdio server's process, an HTTP
    server's connection); on `limits`, every scope's together."""

    def to_limits(self) -> Limits:
        """The declared limits (unset: None, inherited when merged over others)."""
        return Limits(
            max_concurrent_runs=self.max_concurrent_runs,
            max_nested_in_flight=self.max_nested_in_flight,
            calls_per_second=self.calls_per_second,
            burst=self.burst,
            max_plugin_hosts=self.max_plugin_hosts,
            max_mcp_servers=self.max_mcp_servers,
        )

    def over_defaults(self, defaults: Limits) -> Limits:
        """The limits in force: each field set here (`null`: unlimited), else the default."""
        declared = self.to_limits()
        return Limits(
            **{
                name: getattr(declared if name in self.model_fields_set else defaults, name)
                for name in type(self).model_fields
            }
        )


class PromptSectionSetting(BaseModel):
    """A deployment system-prompt section, placed among the registry's own by `order`."""

    model_config = ConfigDict(extra="forbid")

    id: str
    order: int = Field(ge=-(2**31), lt=2**31)
    text: str

    def to_section(self) -> Section:
        return Section(self.id, self.order, self.text)


class PresetSetting(BaseModel):
    """A preset the registry creates at start (`presets/{id}`)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    mode: Mode | None = None
    code_language: str | None = None
    """The program language this preset declares (`python` or `typescript`); none: inherit."""
    self_modification: bool | None = None
    """Whether its agents get the dynamic Cordis tools; none: inherit the deployment default."""
    limits: LimitsSetting | None = None
    """Each of its agents' admission limits (over `agent_limits`)."""
    mcp_servers: list[str] = Field(default_factory=list)
    """Names of `mcp_servers` whose tools this preset's scope gets."""


class AgentSetting(BaseModel):
    """An agent the registry creates at start (`agents/{id}`), after the presets."""

    model_config = ConfigDict(extra="forbid")

    id: str
    preset: str = ""
    """`presets/{id}` or just the id; empty: unparented."""
    mode: Mode | None = None
    code_language: str | None = None
    """The program language this agent declares (`python` or `typescript`); none: inherit."""
    self_modification: bool | None = None
    """Whether this agent gets the dynamic Cordis tools; none: inherit (preset, else default)."""
    limits: LimitsSetting | None = None
    """This agent's admission limits (over its preset's, then `agent_limits`)."""
    mcp_servers: list[str] = Field(default_factory=list)
    """Names of `mcp_servers` whose tools this agent's scope gets."""


class McpServerSetting(BaseModel):
    """An MCP server the operator declares (`mcp_servers.<name>`): a stdio `command` or a
    streamable-HTTP `url`, exactly one. Scopes attach it by name (docs/mcp.md)."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(default=None, min_length=1)
    """The executable (an absolute path, or one found on the `PATH` of `env`)."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """The server's whole environment: nothing of the registry's is inherited (give `PATH`,
    `HOME`... when it needs them)."""
    cwd: Path | None = None
    url: str | None = Field(default=None, min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request to `url`."""
    bearer_token_file: Path | None = None
    """A file holding a token sent as `Authorization: Bearer <token>` (read at each connect)."""

    @model_validator(mode="after")
    def _one_kind(self) -> McpServerSetting:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server declares exactly one of `command` or `url`")
        if self.command is not None and (self.headers or self.bearer_token_file):
            raise ValueError("`headers` and `bearer_token_file` go with `url`")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("`args`, `env` and `cwd` go with `command`")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not http:// or https://")
        return self

    def to_spec(self) -> ServerSpec:
        if self.command is not None:
            return StdioServer(
                self.command,
                tuple(self.args),
                dict(self.env),
                None if self.cwd is None else str(self.cwd),
            )
        assert self.url is not None
        token = None if self.bearer_token_file is None else str(self.bearer_token_file)
        return HttpServer(self.url, dict(self.headers), token)


class GrantSetting(BaseModel):
    """Permissions given to principals over resources, each exactly or by glob pattern."""

    model_config = ConfigDict(extra="forbid")

    principals: list[str] = Field(min_length=1)
    """`cert:<SAN>`, `token:<name>`, `jwt:<sub>` (patterns allowed: `cert:spiffe://acme/*`)."""
    permissions: list[Permission] = Field(min_length=1)
    """`manage`, `execute`, `register`, `approve`, `cordis`."""
    resources: list[str] = Field(min_length=1)
    """`agents/{id}`, `presets/{id}`, `global` (patterns allowed: `agents/team-a-*`, `*`)."""

    def to_grant(self) -> Grant:
        return Grant(tuple(self.principals), frozenset(self.permissions), tuple(self.resources))


class RegistrySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CODEMODE_REGISTRY_", extra="forbid")

    listen: str = "127.0.0.1:50051"
    """Address the gRPC server binds, `host:port` (port 0 picks a free one)."""
    default_mode: Mode = Mode.NATIVE
    """Deployment default presentation mode: native, code or both."""
    self_modification: bool = False
    """Deployment default for dynamic Cordis (self-modification): when on, every agent without
    its own or its preset's declaration gets the seven `cordis_*` tools and the `tool:cordis`
    prompt section. Off by default."""
    max_parallel_sub_calls: int = Field(default=10, ge=1)
    """Per-run cap on overlapping concurrency-safe nested calls (used by run_code)."""
    policy_rules: Path | None = None
    """Optional YAML rules file applied as the embedded pre-execute policy."""
    presets: list[PresetSetting] = Field(default_factory=list)
    """Presets declared at start. Presets and agents created over the API are stored with the
    history and come back after a restart too; one declared here and stored keeps its stored
    identity and restrictions, and what it declares here (parent, mode, code_language,
    self_modification, where given) wins over what is stored. Removing an entry does not
    delete the stored scope (DeletePreset/DeleteAgent does)."""
    agents: list[AgentSetting] = Field(default_factory=list)
    """Agents declared at start, after `presets` (merged with the stored ones as presets)."""
    delete_history_with_agent: bool = False
    """Delete an agent's history with the agent (DeleteAgent). Off: the history stays,
    readable by the agent's `agent_id` only (a re-created name starts an empty history)."""
    plugins: list[str] = Field(default_factory=list)
    """`module:function` entries called with the Registry at start (in-process tools, hooks)."""
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    """Largest gRPC message accepted or sent. It also sizes `run_code`: a run's output budget,
    and the largest arguments or value one nested call can exchange with the program, are just
    under it (the registry accepts larger messages from a runtime, bounded by the runtime's own
    limit, only to refuse such a call instead of failing the run)."""
    max_json_depth: int = Field(default=DEFAULT_LIMITS.max_depth, ge=0)
    """Deepest nesting of tool-call arguments (model-direct and from `run_code` programs) and
    of provider results: a container may sit inside at most this many others (`[[]]` is 1
    deep). Deeper ones are refused as soon as the parser reaches the level past the bound
    (ARGUMENTS_TOO_DEEP; a provider's result fails the call as INVALID_TOOL_OUTPUT). The
    default is what the runtime's wire carries for program values; JSON itself has no limit."""
    max_argument_bytes: int = Field(default=DEFAULT_LIMITS.max_argument_bytes, ge=1024)
    """Largest tool-call arguments text in UTF-8 bytes, model-direct or nested; larger ones are
    refused (ARGUMENTS_TOO_LARGE) whatever `max_message_bytes` allows."""
    offload_json_bytes: int = Field(default=DEFAULT_LIMITS.offload_bytes, ge=0)
    """Arguments and provider results longer than this (characters of JSON) are parsed,
    encoded and validated in a worker thread, so one large request cannot stall the RPCs of
    others; smaller ones stay on the event loop, where they cost less than a thread hop."""
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    """How long in-flight RPCs may finish on shutdown."""
    runtime_targets: list[str] = Field(default_factory=list)
    """Runtime service addresses (`host:port`, or one `dns:///name:port`); runs are spread over
    them with round_robin. Empty: `run_code` fails with CODE_RUNTIME_UNAVAILABLE."""
    runtime_keepalive_s: float | None = Field(
        default=None, ge=RUNTIME_MIN_PING_INTERVAL_S, le=_GRPC_MAX_S, allow_inf_nan=False
    )
    """Ping each runtime connection this often, with or without runs, and drop it when a ping
    goes unanswered for 10 s, so a vanished runtime is noticed without waiting for TCP; none:
    no pings. At least 20 (the runtime refuses closer pings)."""
    runtime_start_timeout_s: float = Field(default=1.0, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False)
    """How long a run waits for a runtime to take it: connected (a runtime restarting within
    this time is used, not failed) and accepting runs (one shutting down refuses; the next in
    the rotation is tried). Past it, `run_code` fails with UNAVAILABLE CODE_RUNTIME_UNAVAILABLE
    (phase `connect`: nothing ran, retry after `runtime_retry_delay_s`)."""
    runtime_reconnect_backoff_max_s: float = Field(
        default=0.5, ge=0.001, le=_GRPC_MAX_S, allow_inf_nan=False
    )
    """Longest pause between attempts to reconnect to a runtime that went away (gRPC's
    reconnect backoff, which starts at 0.1 s; 20 % jitter): a restarted runtime is used at
    most about this long after it listens again. Keep it below `runtime_start_timeout_s`."""
    runtime_channel: RuntimeChannel = "multiplexed"
    """How runs reach a runtime: `multiplexed`, every run to a runtime target over that
    target's one `Multiplex` stream, frames ready together sent as one message (docs/wire.md);
    `per-run` (deprecated, kept for one release as the baseline), a `Run` stream each.
    Outcomes, errors and the outage contract are the same."""
    runtime_retry_delay_s: float = Field(default=1.0, ge=0, le=_GRPC_MAX_S, allow_inf_nan=False)
    """The retry delay (`google.rpc.RetryInfo`) sent with a `run_code` that no runtime took."""
    runtime_tls_ca_file: Path | None = None
    """PEM CA bundle the runtimes' certificates must chain to; set: runs go over TLS (none:
    plaintext)."""
    runtime_tls_cert_file: Path | None = None
    """PEM client certificate presented to runtimes that require mutual TLS."""
    runtime_tls_key_file: Path | None = None
    """PEM private key of `runtime_tls_cert_file`."""
    runtime_tls_server_name: str = ""
    """Name the runtimes' certificates must carry, when it is not the targets' host name."""
    history_store: str = "sqlite"
    """Where history and the catalog (presets, agents, their declarations and restrictions) are
    kept: `sqlite`, the embedded default, in `history_path`; or `postgres`, a PostgreSQL
    database at `history_dsn` that several registries may share. An unknown name stops the
    start."""
    history_path: str = "var/registry-history.sqlite3"
    """SQLite history file (WAL), also holding the catalog; `:memory:` keeps both in memory
    only."""
    history_dsn: SecretStr = SecretStr("")
    """PostgreSQL connection string of `history_store: postgres`
    (`postgresql://user:password@host:5432/db`, or libpq `key=value` form); best given as the
    CODEMODE_REGISTRY_HISTORY_DSN environment variable, since it holds a password. Its schema is
    created and migrated at start; a server that cannot be reached at start stops the start,
    one lost later makes history UNAVAILABLE until it is back."""
    history_writer_lease_s: float = Field(default=15.0, gt=0, le=3600, allow_inf_nan=False)
    """PostgreSQL: how long a registry that stopped renewing its writer lease (renewed every
    third of it) is still taken for alive. Calls a crashed registry left open are closed as
    interrupted once its lease expired, by whichever registry sweeps first."""
    history_statement_timeout_s: float = Field(default=30.0, gt=0, le=86_400, allow_inf_nan=False)
    """PostgreSQL: the `statement_timeout` of every connection to `history_dsn`. A statement
    that runs, or waits for a lock another session holds, longer than this is ended by the
    server, and the call that needed it fails with `HISTORY_UNAVAILABLE` saying so, instead
    of waiting for good. A `-c statement_timeout=...` in the DSN's `options` wins."""
    history_retention_days: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Delete whole calls (outer and nested records, spilled content) once their newest record
    is older than this; none: keep everything."""
    cordis_durable: bool | None = None
    """Where dynamic Cordis plugins, their packages, grants, pointers and id counters are kept.
    Unset: in the history database when it outlives the process (`history_path` a file, or
    `history_store: postgres`, where every registry on the database shares them), else in
    process memory. `true`: always in the history database (refused when `history_path` is
    `:memory:`). `false`: process memory only (after a restart `@pluginId` references answer
    unavailable; with several registries each has its own). Runs are not restarted: after a
    restart a plugin is `stopped` (or `defined`) and `cordis_run` reactivates it."""
    approvals_in_store: bool | None = None
    """Where pending tool approvals wait. Unset: as records in the history database when it
    outlives the process (the `cordis_durable` rule), so every registry sharing it shows them
    to its approvers, the first answer on any registry wins, and a request waits even with no
    approver connected (until answered, expired or its caller goes away). `true`: always
    (refused when `history_path` is `:memory:`). `false`: in this process only; with no approver
    connected here a request is UNAVAILABLE at once."""
    approval_poll_s: float = Field(default=2.0, gt=0, le=3600, allow_inf_nan=False)
    """With approvals in the store: how often a registry reads the pending approvals besides
    PostgreSQL's notifications, so a missed notification only delays an approval this long."""
    approval_expiry_s: float = Field(default=0.0, ge=0, le=31_536_000, allow_inf_nan=False)
    """How long an approval request waits for an answer before it expires and its call is
    DENIED (a policy's `Ask` may set its own); 0: until answered or its caller goes away."""
    cordis_start_timeout_s: float = Field(default=5.0, gt=0, le=600, allow_inf_nan=False)
    """Bounds a Cordis host half's start in its plugin host: evaluating the source and the
    plugin's synchronous start (its `apply`) must end within this, else the activation fails
    (`host-load` or `host-apply`). The reference's `vmTimeoutMs` (5000). At most 600 s."""
    cordis_compute_ms_per_call: int = Field(default=10_000, ge=1)
    """Busy CPU time in milliseconds each invocation of a plugin host may use: a dynamic
    tool's call, a call of a service it provides, an event delivery. One that runs past it
    ends with `compute budget exhausted (<n>ms busy)`, the plugin host is stopped (a busy
    loop cannot be interrupted from inside) and the owning agent is steered. At most the
    runtime's `max_compute_ms`."""
    cordis_host_lease_s: float = Field(default=15.0, gt=0, le=3600, allow_inf_nan=False)
    """Registries sharing a PostgreSQL store run each running plugin's host in one of them,
    under a lease in the store renewed every third of this: when that registry is lost, its
    plugins stop until the lease expires, then a survivor reactivates their current package
    (and the agent is steered). Like `history_writer_lease_s`."""
    cordis_peer_secret: SecretStr = SecretStr("")
    """The secret registries sharing a store authenticate each other's Cordis peer channel with
    (the same on every registry; best given as CODEMODE_REGISTRY_CORDIS_PEER_SECRET). Empty:
    derived from `token_key`, which such registries already share. With neither, every
    registry runs the hosts it activates itself (no peer channel is served)."""
    cordis_peer_address: str = ""
    """`host:port` at which the other registries reach this one's peer channel (its own gRPC
    server). Empty: `listen` when it names a host, else this machine's host name with the
    port it listens on (a pod's name resolves in Kubernetes only with a headless service:
    set it to the pod IP there, e.g. from `status.podIP`)."""
    cordis_peer_tls_ca_file: Path | None = None
    """PEM CA bundle the other registries' server certificates (`tls_cert_file`) must chain to:
    with the registry serving TLS, the peer channel dials the others over TLS trusting only
    this, so the peer token never travels in clear. Unset while the registry serves TLS: the
    peer channel is off (each registry runs the plugin hosts it activates). Set while it
    serves plaintext: refused at start."""
    cordis_peer_tls_cert_file: Path | None = None
    """PEM client certificate the peer channel presents: needed when the registries require
    client certificates (`tls_client_ca_file`), refused at start without it then."""
    cordis_peer_tls_key_file: Path | None = None
    """PEM private key of `cordis_peer_tls_cert_file`."""
    cordis_peer_tls_server_name: str = ""
    """Name the other registries' certificates must carry, when it is not the host of their
    peer address (`cordis_peer_address`)."""
    cordis_activation_poll_s: float = Field(default=2.0, gt=0, le=3600, allow_inf_nan=False)
    """With Cordis records in the store: how often a registry reads the pending activation
    requests (`cordis_run` of a package with a Client half) besides PostgreSQL's
    notifications, so a missed notification only delays a page's view or answer this long."""
    history_max_inline_bytes: int = Field(default=64 * 1024, ge=256)
    """Content larger than this is stored once aside; the record keeps a preview + locator."""
    token_key: str = ""
    """Hex key for parent-token HMACs; empty: a random key per process (set it when several
    registry replicas must accept each other's tokens)."""
    runtime_languages: list[str] | None = None
    """Restricts the languages served to these, first = default. Unset: what the connected
    runtimes report (GetCapabilities); with no `runtime_targets`, `["python"]`. Empty: no
    runtime, native only."""
    code_language: str = ""
    """Deployment default program language of `run_code` (`python` or `typescript`), for
    scopes that declare none; empty: the first of `runtime_languages` (TypeScript, the
    reference's, when that list is empty). A scope whose language no runtime serves fails
    prompt assembly and `run_code` with FAILED_PRECONDITION."""
    prompt_sections: list[PromptSectionSetting] = Field(default_factory=list)
    """Deployment system-prompt sections `{id, order, text}` (ids `tool:*`, `tools:sdk` and
    `tools:code-only` are reserved)."""
    tool_order: list[str] = Field(default_factory=list)
    """Tool names whose guidance sections and wire schemas come first, in this order; a name a
    scope does not know fails that scope's assembly."""
    service_name: str = Field(default="codemode-registry", min_length=1)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """Bearer tokens (static, stored as SHA-256; JWTs against a JWKS file). With these or
    with `tls_client_ca_file` set, every call needs a principal and a grant; with neither,
    the registry is open to every caller (warned about when it binds a non-loopback address)."""
    grants: list[GrantSetting] = Field(default_factory=list)
    """What each principal may do (see `registry_service.domain.access`)."""
    limits: LimitsSetting = Field(default_factory=LimitsSetting)
    """Admission limits of the whole registry (every agent together). Unset fields take the
    defaults (`max_concurrent_runs` 32 sandboxes: runs plus live plugin hosts;
    `max_plugin_hosts` 16); `null` lifts a limit."""
    agent_limits: LimitsSetting = Field(default_factory=LimitsSetting)
    """Each agent's own admission limits (the global scope's calls count as one agent),
    unless its preset or itself declares others (`presets[].limits`, `agents[].limits`).
    Unset fields take the defaults (`max_concurrent_runs` 8, `max_plugin_hosts` 4); `null`
    lifts a limit."""
    mcp_servers: dict[str, McpServerSetting] = Field(default_factory=dict)
    """MCP servers by name, whose tools the presets and agents that attach them get
    (`presets[].mcp_servers`, `agents[].mcp_servers`, or `mcp_servers` in CreatePreset and
    CreateAgent). Only these may be stdio commands: the API never names a command."""
    mcp_http_allow: list[str] = Field(default_factory=list)
    """URL prefixes (`https://tools.example.com/mcp/`) within which CreatePreset and
    CreateAgent may attach a streamable-HTTP MCP server by URL; empty: none (only the servers
    named above)."""
    mcp_user: str = Field(default="nobody", min_length=1)
    """The user (name or uid) stdio MCP servers run as when the registry runs as root (its
    primary group, no supplementary groups). A registry not run as root runs them as itself."""
    mcp_initialize_timeout_s: float = Field(default=10.0, gt=0, le=600, allow_inf_nan=False)
    """How long a server has to answer `initialize` (and each `tools/list`); past it the
    connection is given up (a stdio server is stopped) and retried after the backoff."""
    mcp_restart_backoff_max_s: float = Field(default=30.0, ge=0.01, le=3600, allow_inf_nan=False)
    """Longest pause before reconnecting to a server that went down (restarting a stdio one);
    the pause starts at 0.2 s and doubles."""
    mcp_messages_per_second: float = Field(default=2000.0, gt=0, allow_inf_nan=False)
    """Messages taken per second from one MCP server at most (stdio or HTTP); past it the
    registry reads more slowly (a stdio server waits on its own pipe)."""
    admission_retry_delay_s: float = Field(default=1.0, ge=0, le=_GRPC_MAX_S, allow_inf_nan=False)
    """The RetryInfo delay sent with a refusal over a concurrency limit (a rate limit sends
    when its next token is due)."""

    def mcp_policy(self) -> McpPolicy:
        return McpPolicy(
            {name: server.to_spec() for name, server in self.mcp_servers.items()},
            tuple(self.mcp_http_allow),
        )

    @model_validator(mode="after")
    def _check_mcp(self) -> RegistrySettings:
        for prefix in self.mcp_http_allow:
            if not prefix.startswith(("http://", "https://")) or prefix.count("/") < 3:
                raise ValueError(
                    f"mcp_http_allow entry {prefix!r} must be a URL prefix with a host and a "
                    "path (`https://host/` at least)"
                )
        scopes = [(f"presets/{p.id}", p.mcp_servers) for p in self.presets]
        scopes += [(f"agents/{a.id}", a.mcp_servers) for a in self.agents]
        policy = self.mcp_policy()
        for scope, names in scopes:
            try:
                policy.check(McpAttachment(server=name) for name in names)
            except CodemodeError as exc:
                raise ValueError(f"{scope}: {exc.message}") from None
        return self

    def global_limits(self) -> Limits:
        return self.limits.over_defaults(DEFAULT_GLOBAL_LIMITS)

    def default_agent_limits(self) -> Limits:
        return self.agent_limits.over_defaults(DEFAULT_AGENT_LIMITS)

    def json_limits(self) -> JsonLimits:
        return JsonLimits(
            max_depth=self.max_json_depth,
            max_argument_bytes=self.max_argument_bytes,
            offload_bytes=self.offload_json_bytes,
        )

    def runtime_tls(self) -> ClientTls | None:
        """TLS of the channel to the runtimes, read from its files (None: plaintext)."""
        return client_tls(
            self.runtime_tls_ca_file,
            self.runtime_tls_cert_file,
            self.runtime_tls_key_file,
            self.runtime_tls_server_name,
            names=(
                "runtime_tls_ca_file",
                "runtime_tls_cert_file",
                "runtime_tls_key_file",
                "runtime_tls_server_name",
            ),
        )

    @model_validator(mode="after")
    def _check_runtime_tls(self) -> RegistrySettings:
        self.runtime_tls()
        return self

    def cordis_peer_tls(self) -> ClientTls | None:
        """TLS of the peer channel to the other registries, read from its files (None:
        plaintext), checked against how this registry serves: registries sharing a store share
        their settings, so what this one serves is what it dials."""
        tls = client_tls(
            self.cordis_peer_tls_ca_file,
            self.cordis_peer_tls_cert_file,
            self.cordis_peer_tls_key_file,
            self.cordis_peer_tls_server_name,
            names=(
                "cordis_peer_tls_ca_file",
                "cordis_peer_tls_cert_file",
                "cordis_peer_tls_key_file",
                "cordis_peer_tls_server_name",
            ),
        )
        if tls is not None and self.tls_cert_file is None:
            raise TlsFileError(
                "cordis_peer_tls_ca_file: the peer channel dials TLS but this registry serves "
                "plaintext (set tls_cert_file and tls_key_file, or unset it)"
            )
        if tls is not None and self.tls_client_ca_file is not None and not tls.private_key:
            raise TlsFileError(
                "cordis_peer_tls_cert_file and cordis_peer_tls_key_file: the registries "
                "require client certificates (tls_client_ca_file), so the peer channel needs one"
            )
        return tls

    @model_validator(mode="after")
    def _check_cordis_peer_tls(self) -> RegistrySettings:
        self.cordis_peer_tls()
        return self

    def cordis_peer_token(self) -> str | None:
        """The token registries sharing a store present on the Cordis peer channel, derived
        from `cordis_peer_secret` (else `token_key`); None: no shared secret, no channel."""
        secret = self.cordis_peer_secret.get_secret_value().encode()
        if not secret and self.token_key:
            secret = b"token_key:" + self.token_key.encode()
        if not secret:
            return None
        return hmac.new(secret, b"codemode cordis peer v1", hashlib.sha256).hexdigest()

    def authenticator(self) -> Authenticator:
        """Reads the JWKS file (a missing or invalid one stops the start)."""
        return Authenticator(self.auth, certificates=self.tls_client_ca_file is not None)

    def access_policy(self) -> AccessPolicy:
        enforced = self.tls_client_ca_file is not None or self.auth.bearer_configured
        return AccessPolicy([g.to_grant() for g in self.grants], enforced=enforced)

    @model_validator(mode="after")
    def _check_auth(self) -> RegistrySettings:
        try:
            self.authenticator()
        except ValueError as exc:  # the JWKS file
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _check_code_language(self) -> RegistrySettings:
        if self.code_language and self.code_language not in LANGUAGES:
            known = ", ".join(LANGUAGES)
            raise ValueError(f"code_language {self.code_language!r} is not one of {known}")
        return self

    def default_code_language(self) -> str:
        """`code_language`, else the first configured runtime language
        (TypeScript when none is configured)."""
        if self.code_language:
            return self.code_language
        if self.runtime_languages is None:
            return LANGUAGES[0]
        return self.runtime_languages[0] if self.runtime_languages else NO_RUNTIME_LANGUAGE

    @model_validator(mode="after")
    def _check_presentation(self) -> RegistrySettings:
        check_config(
            self.runtime_languages or (),
            [section.to_section() for section in self.prompt_sections],
            self.tool_order,
        )
        return self


def load_settings(path: Path | None = None, **overrides: Any) -> RegistrySettings:
    """Reads the optional YAML file, then environment variables, then explicit overrides."""
    settings = load_settings_file(RegistrySettings, path, what="registry", overrides=overrides)
    # Checked here, not by pydantic: the error is then one line, and found before serving.
    try:
        check_options(settings.history_store, settings.history_dsn.get_secret_value())
    except StoreOpenError as exc:
        raise ConfigError(str(exc)) from exc
    return settings
