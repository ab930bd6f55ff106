"""The runtime: validates run requests, hands each run a never-used worker, disposes cleanly."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from codemode_wire.text import utf8_exceeds
from runtime_service.budgets import Budgets, resolve_budgets
from runtime_service.errors import RunRequestError, RuntimeDisposedError, RuntimeExhaustedError
from runtime_service.kept_hosts import KeptHostLimits, KeptHosts
from runtime_service.languages import DEFAULT_LANGUAGE, backends, enable
from runtime_service.outcome import BindingHandler, LogListener, RunResult
from runtime_service.plugin_host import HostEvent, PluginHost, PluginHostRequest
from runtime_service.pool import WorkerPool
from runtime_service.run import DEFAULT_MAX_CALL_BYTES, Run, RunRequest
from runtime_service.sandbox_uids import UidLeases
from runtime_service.worker_process import WorkerCapacityError, WorkerSpec

__all__ = ["Runtime", "RuntimeOptions"]

DISPOSED_REASON = "runtime disposed"
_MAX_TENANT_BYTES = 1024


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    pool_size: int = 2
    """Pre-spawned idle workers of the default language (0 = spawn each worker on demand)."""
    pool_sizes: Mapping[str, int] = field(default_factory=dict)
    """Pre-spawned idle workers of the other languages, by name (0 when not named: each
    worker on demand; the service's setting keeps one TypeScript worker)."""
    defaults: Budgets = field(default_factory=Budgets)
    maxima: Budgets = field(default_factory=Budgets)
    worker: WorkerSpec = field(default_factory=WorkerSpec)
    max_program_bytes: int = 1 << 20
    max_bindings: int = 4096
    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES
    """The most JSON bytes of one binding call's arguments the caller can be sent (the gRPC
    message limit): a worker's call frame beyond it fails that call without being read."""
    capacity_retry_delay_s: float = 1.0
    """The RetryInfo delay of a run or plugin host refused because no sandbox was free."""
    languages: tuple[str, ...] = ()
    """The languages to serve, registered names (empty: every one installed here)."""
    max_concurrent_checks: int = 4
    """Source checks (``source_check``) in flight at once; more are refused as at capacity."""
    kept_hosts: KeptHostLimits = field(default_factory=KeptHostLimits)
    """Hosts kept between one tenant's runs, for languages that keep one (``kept_hosts``)."""


class Runtime:
    def __init__(self, options: RuntimeOptions | None = None) -> None:
        self.options = options or RuntimeOptions()
        options = self.options
        enable(options.languages)  # an opt-in language is served only where it is named
        known = tuple(language.name for language in backends())
        wanted = options.languages or known
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            raise ValueError(f"unknown languages {unknown} (known: {', '.join(known)})")
        self.pools: dict[str, WorkerPool] = {}
        """One pool per registered language this host can run, the default language's first:
        it owns the fork server the others borrow, so it exists even where its language is not
        served (then it keeps no idle workers)."""
        self.unserved: dict[str, str] = {}
        """Registered languages not served, and why."""
        for backend in backends():
            spec = dataclasses.replace(
                options.worker, backend=backend, boot_memory_bytes=options.defaults.memory_bytes
            )
            if backend.name not in wanted:
                self.unserved[backend.name] = "not in this runtime's `languages` setting"
            if backend.name == DEFAULT_LANGUAGE:
                size = options.pool_size if backend.name in wanted else 0
                self.pools[backend.name] = WorkerPool(spec, size)
                continue
            if backend.name not in wanted:
                continue
            why = backend.unavailable(spec)
            if why is not None:
                self.unserved[backend.name] = why
                continue
            size = options.pool_sizes.get(backend.name, 0)
            self.pools[backend.name] = WorkerPool(spec, size, self.pool.fork_server)
        self.kept = KeptHosts(options.kept_hosts)
        """Hosts kept between one tenant's runs (languages whose backend ``keeps_host``)."""
        self._live: set[Run] = set()
        self._hosts: set[PluginHost] = set()
        self._executions: set[asyncio.Task[RunResult]] = set()
        self._disposed = False
        self._accepting = True
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        # What a runtime killed outright left in the uid range dies before any of its uids
        # is leased again (only root can switch uids, or kill what holds them).
        if os.geteuid() == 0:
            spec = self.options.worker
            await UidLeases.reclaim_range(spec.uid_base, spec.uid_count)
        for pool in self.pools.values():
            pool.start()

    @property
    def pool(self) -> WorkerPool:
        """The default language's pool (it owns the fork server)."""
        return self.pools[DEFAULT_LANGUAGE]

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages this runtime serves, the default first (TypeScript needs Node on
        the host)."""
        return tuple(language for language in self.pools if language not in self.unserved)

    def served_pool(self, language: str) -> WorkerPool:
        """The pool of a served language; RunRequestError naming the served ones otherwise."""
        pool = self.pools.get(language)
        if pool is None or language in self.unserved:
            supported = ", ".join(self.languages)
            raise RunRequestError(f"unsupported language {language!r} (supported: {supported})")
        return pool

    @property
    def disposed(self) -> bool:
        """Whether new work is refused (shutting down, or disposed)."""
        return self._disposed or not self._accepting

    def exhausted(self, why: str) -> RuntimeExhaustedError:
        """The refusal of work that found no sandbox free (nothing ran)."""
        return self._exhausted(WorkerCapacityError(why))

    @property
    def live_runs(self) -> int:
        return len(self._live)

    @property
    def live_hosts(self) -> int:
        """Plugin hosts being driven (starting, running or ending)."""
        return len(self._hosts)

    def create_run(
        self,
        *,
        program: str,
        bindings: list[str] | tuple[str, ...],
        handler: BindingHandler,
        language: str = DEFAULT_LANGUAGE,
        budgets: dict[str, int | None] | None = None,
        deadline_ms: int | None = None,
        on_log: LogListener | None = None,
        tenant: str = "",
    ) -> Run:
        """Validate a request and return its (not yet started) run.

        ``tenant``: whom the run acts for (an opaque key): a language that keeps a host per
        tenant serves it on one of that tenant's kept hosts, never another's ("": a worker
        used once).

        ``deadline_ms`` is the caller's time left. One already spent (<= 0) is no error: like
        any deadline reached it ends the run as a ``timeout``, before it takes a worker.
        """
        if self._disposed or not self._accepting:
            raise RuntimeDisposedError("runtime disposed")
        pool = self.served_pool(language)
        if type(program) is not str:
            raise RunRequestError("program must be a string")
        if utf8_exceeds(program, self.options.max_program_bytes):
            raise RunRequestError(f"program exceeds {self.options.max_program_bytes} bytes")
        names = frozenset(bindings)
        if len(names) != len(bindings):
            counts = collections.Counter(bindings)
            duplicate = next(name for name in bindings if counts[name] > 1)
            raise RunRequestError(f"duplicate binding name {duplicate!r}")
        if len(names) > self.options.max_bindings:
            raise RunRequestError(f"more than {self.options.max_bindings} bindings")
        for name in names:
            if type(name) is not str or not name:
                raise RunRequestError("binding names must be non-empty strings")
        resolved = resolve_budgets(self.options.maxima, self.options.defaults, budgets)
        wall_ms = resolved.wall_ms
        if deadline_ms is not None:
            wall_ms = min(wall_ms, max(deadline_ms, 0))
        request = RunRequest(program, names, resolved, wall_ms, self.options.max_call_bytes)
        if type(tenant) is not str or utf8_exceeds(tenant, _MAX_TENANT_BYTES):
            raise RunRequestError(f"tenant must be a string of at most {_MAX_TENANT_BYTES} bytes")
        acquire, take_idle = pool.launcher(resolved.memory_bytes)
        backend = pool.spec.backend
        keeper = self.kept.keeper(language, tenant) if backend.keeps_host else None
        # Kept hosts never take a sandbox a run needs: a launch at capacity ends idle ones.
        acquire = self.kept.acquiring(acquire)
        return Run(
            request,
            acquire,
            handler,
            on_log,
            take_idle=take_idle,
            exit_signs=backend.exits,
            keeper=keeper,
        )

    async def execute(self, run: Run) -> RunResult:
        """Execute ``run``; disposal aborts it with "runtime disposed"."""
        if self._disposed:
            run.abort(DISPOSED_REASON)
        self._live.add(run)
        self._idle.clear()
        task = asyncio.ensure_future(run.execute())
        self._executions.add(task)
        try:
            return await asyncio.shield(task)
        except WorkerCapacityError as exc:
            raise self._exhausted(exc) from exc
        except asyncio.CancelledError:
            # The caller went away: the run ends as an abort and its worker still dies.
            run.abort("run cancelled")
            await asyncio.gather(task, return_exceptions=True)
            await run.worker_gone()
            raise
        finally:
            self._executions.discard(task)
            self._live.discard(run)
            if not self._live:
                self._idle.set()

    def create_plugin_host(
        self,
        *,
        source: str,
        plugin_id: str,
        package_id: str,
        run_id: str,
        emit: Callable[[HostEvent], None],
        language: str = DEFAULT_LANGUAGE,
        budgets: dict[str, int | None] | None = None,
        start_timeout_s: float = 5.0,
        visible_tools: Sequence[object] | None = None,
        services: Sequence[object] | None = None,
    ) -> PluginHost:
        """Validate a plugin host request; ``run_host`` drives it."""
        if self._disposed or not self._accepting:
            raise RuntimeDisposedError("runtime disposed")
        pool = self.served_pool(language)  # host halves run in the language's own workers
        if utf8_exceeds(source, self.options.max_program_bytes):
            raise RunRequestError(f"source exceeds {self.options.max_program_bytes} bytes")
        if not 0 < start_timeout_s <= 600:
            raise RunRequestError("start_timeout must be above 0 and at most 600 s")
        resolved = resolve_budgets(self.options.maxima, self.options.defaults, budgets)
        request = PluginHostRequest(
            source, plugin_id, package_id, run_id, resolved, start_timeout_s,
            list(visible_tools or ()), list(services or ()),
        )  # fmt: skip
        # A host's heap limit is its memory budget, as a program's (``memory_at_boot``).
        acquire, _ = pool.launcher(resolved.memory_bytes)
        return PluginHost(request, acquire, emit, exit_signs=pool.spec.backend.exits)

    async def run_host(self, host: PluginHost) -> None:
        """Drive ``host`` until it ends; disposal ends it too."""
        if self._disposed:
            host.kill()
        self._hosts.add(host)
        try:
            await host.run()
        finally:
            self._hosts.discard(host)
        if host.exhausted is not None:
            raise self._exhausted(WorkerCapacityError(host.exhausted))

    def _exhausted(self, exc: WorkerCapacityError) -> RuntimeExhaustedError:
        delay = self.options.capacity_retry_delay_s
        return RuntimeExhaustedError(
            f"no sandbox is free on this runtime ({exc}): nothing ran; retry after {delay:.3g} s",
            delay,
        )

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no run is live (or the timeout passes); True when idle."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def refuse_new_runs(self) -> None:
        """Later ``create_run`` calls fail with ``RuntimeDisposedError``; live runs go on."""
        self._accepting = False

    async def dispose(self) -> None:
        """Abort every live run, wait for every worker to exit, refuse later runs."""
        self._disposed = True
        for run in list(self._live):
            run.abort(DISPOSED_REASON)
        hosts = list(self._hosts)
        for host in hosts:
            host.kill()
        await asyncio.gather(*(host.closed for host in hosts), return_exceptions=True)
        await asyncio.gather(*list(self._executions), return_exceptions=True)
        await self.kept.close()
        # The default language's pool last: it owns the fork server the others borrow.
        await asyncio.gather(
            *(pool.close() for pool in self.pools.values() if pool is not self.pool)
        )
        await self.pool.close()
