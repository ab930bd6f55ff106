"""Runtime settings: environment variables (``CODEMODE_RUNTIME_*``) over an optional YAML file.

Every default works with no setup. Invalid settings fail at start with a clear message.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from codemode_common.settings import ConfigError, ServiceSettings, load_settings_file
from runtime_service.budgets import BudgetError, Budgets
from runtime_service.kept_hosts import KeptHostLimits
from runtime_service.languages import OPTIONAL, backends, typescript
from runtime_service.runtime import RuntimeOptions
from runtime_service.worker_process import WorkerSpec

__all__ = ["ConfigError", "RuntimeSettings", "load_settings", "terminal_headroom"]


# gRPC takes durations as int32 milliseconds: the longest one it can hold, in seconds.
_GRPC_MAX_S = (2**31 - 1) // 1000


def terminal_headroom(max_output_bytes: int) -> int:
    """Bytes a run's terminal message may need beyond ``max_output_bytes``.

    The output ledger charges logs and value as JSON; the terminal message carries them as
    protobuf, which costs at most the ledger's bytes plus a byte or two per log entry of 16 KiB
    or more (a longer length prefix than the JSON quotes and comma) and a few dozen bytes of
    field tags and lengths. Rounded up generously.
    """
    return max_output_bytes // 8192 + 1024


class RuntimeSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CODEMODE_RUNTIME_", extra="forbid")

    listen: str = "127.0.0.1:50052"
    """Address the gRPC server binds, ``host:port`` (port 0 picks a free one)."""
    health_listen: str = ""
    """Also serve grpc.health (only) in plaintext on this ``host:port``, for probes that
    cannot speak TLS (the kubelet's gRPC probes) when the main port requires it; empty: no."""
    registry_identities: list[str] = Field(default_factory=list)
    """Principals allowed to be a registry: ``Run`` and ``Host`` are accepted only from a
    client certificate naming one (``cert:<URI or DNS SAN>``, glob patterns allowed, e.g.
    ``cert:spiffe://codemode/registry``). Needs ``tls_client_ca_file``. Empty: open."""
    pool_size: int = Field(default=2, ge=0, le=256)
    """Pre-spawned never-used Python workers kept ready (0 = spawn each worker on demand)."""
    typescript_pool_size: int = Field(default=1, ge=0, le=256)
    """Pre-spawned never-used TypeScript workers kept ready (0 = on demand). TypeScript is
    served where Node 20+ is installed (``worker_node``, else ``node`` on the PATH)."""
    default_compute_ms: int = 60_000
    """Busy-CPU budget (every process of the run) of a run that does not set one."""
    default_wall_ms: int = 600_000
    """Wall-clock ceiling of a run that does not set one."""
    default_max_output_bytes: int = 64 << 20
    """Output ledger cap of a run that does not set one."""
    default_memory_bytes: int = 512 << 20
    """Memory budget (every process of the run, shmem and /tmp included) of a run that does
    not set one."""
    default_max_outstanding_calls: int = 256
    """Concurrent pending binding calls of a run that does not set a cap."""
    max_compute_ms: int = 60_000
    """Largest compute budget a run may ask for."""
    max_wall_ms: int = 600_000
    """Largest wall-clock ceiling a run may ask for."""
    max_output_bytes: int = 64 << 20
    """Largest output cap a run may ask for."""
    max_memory_bytes: int = 512 << 20
    """Largest memory budget a run may ask for."""
    max_outstanding_calls: int = 256
    """Largest outstanding-call cap a run may ask for."""
    max_program_bytes: int = Field(default=1 << 20, ge=1)
    """Largest accepted program text (UTF-8 bytes)."""
    languages: list[str] = Field(default_factory=list)
    """The program languages to serve (runs, plugin hosts, source checks): names from the
    runtime's language table (``python``, ``typescript``, and the opt-in ``monty``); empty:
    every built-in one installed here (TypeScript needs Node; never ``monty``, served only
    where named); an unknown name is refused at start.
    GetCapabilities lists the others as not served, with the reason."""
    max_concurrent_checks: int = Field(default=4, ge=1, le=256)
    """CheckSource calls parsed at once (each in a sandboxed worker); more are refused with
    RESOURCE_EXHAUSTED RUNTIME_AT_CAPACITY."""
    kept_host_runs: int = Field(default=100, ge=1, le=1_000_000)
    """Runs one kept host serves before it is recycled, for engines that keep a sandboxed host
    per tenant (``monty``); 1: never reused. A host is also recycled after any run that did
    not end cleanly (timeout, out of memory, crash, protocol error, abort, output limit)."""
    kept_host_idle_s: float = Field(default=30.0, gt=0, le=86_400, allow_inf_nan=False)
    """How long a kept host waits for its tenant's next run before it is ended."""
    kept_hosts_per_tenant: int = Field(default=4, ge=0, le=256)
    """Kept hosts one tenant (agent x principal) may hold at once, busy or idle; its runs
    beyond them get a host used once. 0: none kept."""
    kept_host_wait_s: float = Field(default=0.5, ge=0, le=60, allow_inf_nan=False)
    """A run that finds all its tenant's kept hosts busy waits for one of them while one is
    given back at least every this many seconds (to any of its waiting runs), and gets a host
    used once when none was for that long (0: it never waits)."""
    max_idle_kept_hosts: int = Field(default=64, ge=0, le=100_000)
    """Idle kept hosts over all tenants (the least recently used is ended beyond it). Kept
    hosts hold sandboxes (uids of ``worker_uid_count``): a run that finds none free ends the
    least recently used idle one instead of being refused."""
    worker_launch: Literal["fork-server", "spawn"] = "fork-server"
    """How workers start: ``fork-server`` forks each from a pre-initialized, never-used fork
    server, as pid 1 of a pid namespace of its own (every process of a run dies with it, also
    when the runtime is killed; ~5 ms of CPU per worker); ``spawn`` boots a fresh interpreter
    per worker (~40-50 ms of CPU, no pid namespace: for comparison and for hosts where the
    fork server cannot run)."""
    worker_python: str | None = None
    """Interpreter for workers (default: the runtime's own, resolved to its real path)."""
    worker_node: str | None = None
    """The Node executable of TypeScript workers (default: ``node`` on the runtime's PATH;
    without one, TypeScript is not served)."""
    worker_uid_base: int = Field(default=60_000, ge=1, le=4_000_000_000)
    """First uid (and gid) of the range workers run as, one per live worker (root only)."""
    worker_uid_count: int = Field(default=1_000, ge=1, le=1_000_000)
    """Size of that range: the most workers alive at once. The range must belong to no other
    user on the host, and runtimes sharing a host need disjoint ranges."""
    capacity_retry_delay_s: float = Field(default=1.0, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False)
    """The RetryInfo delay sent with RESOURCE_EXHAUSTED when a run or plugin host finds no
    sandbox free (every uid of the range is held by a live worker): nothing ran."""
    worker_tmp_bytes: int = Field(default=64 << 20, ge=1 << 20)
    """Size cap of each worker's private ``/tmp`` (memory-backed), its working directory. With
    a run cgroup its pages also count against the run's memory budget; without one they come
    on top of it, so keep it small."""
    worker_pids_max: int = Field(default=64, ge=8, le=1_000_000)
    """Processes and threads one run may have at once (its cgroup's ``pids.max``)."""
    cgroups: Literal["auto", "v1", "v2", "off"] = "auto"
    """Run cgroups (memory incl. shmem/tmpfs, pids and CPU time of every process of a run):
    ``auto`` uses cgroup v2 where memory and pids are delegated to the runtime's cgroup, else
    the v1 hierarchies (memory, pids, cpuacct, freezer); ``v1``/``v2`` insist on one; ``off``
    disables them. Where none can be made, limits are per process and GetCapabilities says
    why."""
    cgroup_root: str = Field(default="/sys/fs/cgroup", min_length=1)
    """Where the cgroup filesystems are mounted: only cgroup mounts below it are used."""
    cgroup_remount: bool = False
    """Where the cgroup2 mount is read-only (as container runtimes mount it), mount a writable
    cgroup2 over it in the runtime's own mount namespace (needs CAP_SYS_ADMIN and a cgroup
    namespace of the container's own: the new mount shows only the container's subtree). The
    deploy/ manifests set it."""
    max_message_bytes: int = Field(default=96 * 1024 * 1024, ge=64 * 1024, lt=2**31)
    """Largest gRPC message accepted or sent: at least `max_output_bytes` plus
    `terminal_headroom` (checked at start), so that any run's terminal message can be sent."""
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    """How long in-flight runs may finish on shutdown before they are aborted."""
    max_connection_age_s: float | None = Field(
        default=None, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False
    )
    """Close each client connection after about this long (GOAWAY, gRPC adds +-10 % jitter), so
    clients re-resolve DNS and reach replicas added since; none: connections live on."""
    max_connection_age_grace_s: float | None = Field(
        default=None, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False
    )
    """After that GOAWAY, how long runs in flight keep their stream before the connection is
    closed (and they fail); none: as long as they last. Needs `max_connection_age_s`."""
    service_name: str = Field(default="codemode-runtime", min_length=1)

    @model_validator(mode="after")
    def _check_registry_identities(self) -> RuntimeSettings:
        if self.registry_identities and self.tls_client_ca_file is None:
            raise ValueError(
                "registry_identities needs tls_client_ca_file: identities come from verified "
                "client certificates"
            )
        return self

    @model_validator(mode="after")
    def _check_connection_age(self) -> RuntimeSettings:
        if self.max_connection_age_grace_s is not None and self.max_connection_age_s is None:
            raise ValueError(
                "max_connection_age_grace_s has no effect without max_connection_age_s"
            )
        return self

    @model_validator(mode="after")
    def _check_languages(self) -> RuntimeSettings:
        known = [language.name for language in backends()] + list(OPTIONAL)
        unknown = sorted(set(self.languages) - set(known))
        if unknown:
            raise ValueError(f"languages: unknown {unknown} (known: {', '.join(known)})")
        return self

    def runtime_options(self) -> RuntimeOptions:
        try:
            defaults = Budgets(
                compute_ms=self.default_compute_ms,
                wall_ms=self.default_wall_ms,
                max_output_bytes=self.default_max_output_bytes,
                memory_bytes=self.default_memory_bytes,
                max_outstanding_calls=self.default_max_outstanding_calls,
            )
            maxima = Budgets(
                compute_ms=self.max_compute_ms,
                wall_ms=self.max_wall_ms,
                max_output_bytes=self.max_output_bytes,
                memory_bytes=self.max_memory_bytes,
                max_outstanding_calls=self.max_outstanding_calls,
            )
        except BudgetError as exc:
            raise ConfigError(f"invalid runtime budgets: {exc}") from exc
        needed = self.max_output_bytes + terminal_headroom(self.max_output_bytes)
        if self.max_message_bytes < needed:
            raise ConfigError(
                f"max_message_bytes ({self.max_message_bytes}) must be at least "
                f"{needed}: max_output_bytes ({self.max_output_bytes}) plus "
                f"{needed - self.max_output_bytes} bytes of framing, or a run's terminal "
                "message could not be sent"
            )
        if self.worker_tmp_bytes > self.max_memory_bytes:
            # /tmp is memory: its pages count against the run's budget (cgroup), and without a
            # run cgroup its cap is all that bounds them.
            raise ConfigError(
                f"worker_tmp_bytes ({self.worker_tmp_bytes}) must not exceed max_memory_bytes "
                f"({self.max_memory_bytes}): /tmp is memory-backed"
            )
        spec = WorkerSpec(
            uid_base=self.worker_uid_base,
            uid_count=self.worker_uid_count,
            tmp_bytes=self.worker_tmp_bytes,
            cgroups=self.cgroups,
            cgroup_root=self.cgroup_root,
            cgroup_remount=self.cgroup_remount,
            pids_max=self.worker_pids_max,
            launch=self.worker_launch,
        )
        if self.worker_python:
            spec = dataclasses.replace(spec, python=self.worker_python)
        # The settings of the built-in languages other than the default (Python's are the
        # generic ones: its workers run in the launcher's interpreter, ``worker_python``).
        if self.worker_node:
            spec = dataclasses.replace(spec, executables={typescript.NAME: self.worker_node})
        return RuntimeOptions(
            pool_size=self.pool_size,
            pool_sizes={typescript.NAME: self.typescript_pool_size},
            defaults=defaults,
            maxima=maxima,
            worker=spec,
            max_program_bytes=self.max_program_bytes,
            max_call_bytes=self.max_message_bytes,
            capacity_retry_delay_s=self.capacity_retry_delay_s,
            languages=tuple(dict.fromkeys(self.languages)),
            max_concurrent_checks=self.max_concurrent_checks,
            kept_hosts=KeptHostLimits(
                runs_per_host=self.kept_host_runs,
                idle_s=self.kept_host_idle_s,
                hosts_per_tenant=self.kept_hosts_per_tenant,
                max_idle=self.max_idle_kept_hosts,
                wait_s=self.kept_host_wait_s,
            ),
        )


def load_settings(path: Path | None = None, **overrides: Any) -> RuntimeSettings:
    """Reads the optional YAML file, then environment variables, then explicit overrides."""
    settings = load_settings_file(RuntimeSettings, path, what="runtime", overrides=overrides)
    settings.runtime_options()  # budgets are validated here, at start
    return settings
