"""Admission control: how much one agent, and the whole registry, may run at once.

Limits, each per agent and global (every agent together):
- `max_concurrent_runs`: `run_code` runs in flight. Globally it bounds the registry's
  *sandboxes*: runs in flight plus live plugin hosts, since each holds one worker (and one
  sandbox uid) on a runtime until it ends;
- `max_plugin_hosts`: live plugin hosts (Cordis host halves), from the start of their
  activation until their processes are gone;
- `max_mcp_servers`: MCP servers attached to a scope and running for it (a stdio server's
  process, or an HTTP server's connection), held from its start until its process is gone;
  a preset's servers count against the preset, an agent's against the agent;
- `max_nested_in_flight`: nested tool calls of programs in flight (queued or running);
- `calls_per_second` (with `burst`): model-direct tool calls started, a token bucket.

Fair share of the global sandbox limit: when an agent was refused because the registry's
sandboxes were all taken, it counts as waiting for `fair_share_window_s` (a client retrying
after the RetryInfo delay keeps waiting). While another agent waits, no agent gets a new
sandbox once it holds its fair share: the global limit divided by the agents holding or
waiting for one (at least 1). What frees up then goes to the agents below their share;
nobody is preempted, and with nobody waiting an agent may use all that is free.

Over a limit a call is refused before anything of it starts (no history record, no run, no
plugin host): RESOURCE_EXHAUSTED with RetryInfo, the delay being when a token is due (rate)
or `retry_delay_s` (concurrency). A nested call over its limit is answered to the program as a
failed call instead (the run goes on; it may catch it and retry).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

from codemode_wire.errors import CodemodeError, resource_exhausted

__all__ = ["DEFAULT_AGENT_LIMITS", "DEFAULT_GLOBAL_LIMITS", "Admission", "Limits", "Slot"]


@dataclass(frozen=True, slots=True)
class Limits:
    """None: unlimited (or, merged over another, inherited)."""

    max_concurrent_runs: int | None = None
    max_nested_in_flight: int | None = None
    calls_per_second: float | None = None
    burst: int | None = None
    """Calls that may start at once after a quiet spell; none: the rate rounded up (≥ 1)."""
    max_plugin_hosts: int | None = None
    max_mcp_servers: int | None = None

    def over(self, base: Limits) -> Limits:
        """These limits, each unset one taken from `base`."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return Limits(**{k: getattr(base, k) if v is None else v for k, v in values.items()})


# The defaults keep a bystander working on a small machine (2 cores): one agent holds at most
# 8 runs and 4 plugin hosts of the registry's 32 sandboxes, and plugin hosts (long-lived)
# never take more than half of them. Nested calls are bounded per run (the runtime's outstanding
# calls, `max_parallel_sub_calls`) and model-direct calls hold no sandbox: unlimited.
# MCP servers run on the registry's host, not in a runtime sandbox: they have their own bound.
DEFAULT_GLOBAL_LIMITS = Limits(max_concurrent_runs=32, max_plugin_hosts=16, max_mcp_servers=64)
DEFAULT_AGENT_LIMITS = Limits(max_concurrent_runs=8, max_plugin_hosts=4, max_mcp_servers=4)


@dataclass(slots=True)
class _Bucket:
    rate: float
    capacity: float
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one is due."""
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate

    def give_back(self) -> None:
        self.tokens = min(self.capacity, self.tokens + 1)


@dataclass(slots=True)
class Slot:
    """A held unit of a concurrency limit; `release` is idempotent."""

    _counters: list[dict[str, int]]
    _keys: list[str]
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        for counter, key in zip(self._counters, self._keys, strict=True):
            counter[key] -= 1
            if not counter[key]:  # an agent holding nothing is not kept
                del counter[key]


_GLOBAL = "\x00global"  # a key no agent name can take


@dataclass
class Admission:
    global_limits: Limits = field(default_factory=Limits)
    limits_for: Callable[[str], Limits] = lambda _agent: Limits()
    """Each agent's own limits (its declaration, else its preset's, else the default)."""
    retry_delay_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    fair_share_window_s: float | None = None
    """How long an agent refused for want of a global sandbox counts as waiting for one;
    None: twice `retry_delay_s`, at least 1 s (a client retrying on RetryInfo stays waiting)."""
    _runs: dict[str, int] = field(default_factory=dict)
    _hosts: dict[str, int] = field(default_factory=dict)
    _nested: dict[str, int] = field(default_factory=dict)
    _mcp: dict[str, int] = field(default_factory=dict)
    _waiting: dict[str, float] = field(default_factory=dict)
    _buckets: dict[tuple[str, float, float], _Bucket] = field(default_factory=dict)

    def admit_call(self, agent: str) -> None:
        """A model-direct call starting: a token from the global and the agent's bucket."""
        own = self.limits_for(agent)
        now = self.clock()
        taken: list[_Bucket] = []
        for key, limits, what in ((_GLOBAL, self.global_limits, "global"), (agent, own, "agent")):
            bucket = self._bucket(key, limits, now)
            if bucket is None:
                continue
            wait = bucket.take(now)
            if wait > 0:
                for earlier in taken:  # refused: the other bucket's token is not spent
                    earlier.give_back()
                raise _over(what, "calls_per_second", agent, wait)
            taken.append(bucket)

    def _bucket(self, key: str, limits: Limits, now: float) -> _Bucket | None:
        rate = limits.calls_per_second
        if rate is None or rate <= 0:
            return None
        capacity = float(limits.burst or max(1, math.ceil(rate)))
        # Keyed by the limits too: a changed configuration starts a fresh bucket.
        bucket_key = (key, rate, capacity)
        bucket = self._buckets.get(bucket_key)
        if bucket is None:
            bucket = self._buckets[bucket_key] = _Bucket(rate, capacity, capacity, now)
        return bucket

    @contextlib.contextmanager
    def run(self, agent: str) -> Iterator[None]:
        """Holds one `run_code` slot of the agent and one sandbox of the registry while the
        run lasts."""
        slot = self._sandbox(self._runs, "max_concurrent_runs", agent)
        try:
            yield
        finally:
            slot.release()

    def plugin_host(self, agent: str) -> Slot:
        """One live plugin host of the agent and one sandbox of the registry (raises when
        over); the caller releases it once the host's processes are gone."""
        return self._sandbox(self._hosts, "max_plugin_hosts", agent)

    def mcp_servers(self, scope: str, count: int) -> list[Slot]:
        """`count` MCP servers of `scope` at once, or none (raises when over the scope's or the
        registry's `max_mcp_servers`); each is released once its server has stopped."""
        limit = "max_mcp_servers"
        for key, limits, what in (
            (scope, self.limits_for(scope), "agent"),
            (_GLOBAL, self.global_limits, "global"),
        ):
            bound = limits.max_mcp_servers
            if bound is not None and self._mcp.get(key, 0) + count > bound:
                nothing = "nothing was stored"
                raise _over(what, limit, scope, self.retry_delay_s, bound=bound, nothing=nothing)
        return [_take(self._mcp, scope) for _ in range(count)]

    def live_mcp_servers(self, scope: str | None = None) -> int:
        return self._mcp.get(_GLOBAL if scope is None else scope, 0)

    def nested(self, agent: str) -> Slot:
        """One nested-call slot (raises when over); the caller releases it when it settles."""
        limit = "max_nested_in_flight"
        for key, limits, what in (
            (agent, self.limits_for(agent), "agent"),
            (_GLOBAL, self.global_limits, "global"),
        ):
            bound = getattr(limits, limit)
            if bound is not None and self._nested.get(key, 0) >= bound:
                raise _over(what, limit, agent, self.retry_delay_s, bound=bound)
        return _take(self._nested, agent)

    def _sandbox(self, counter: dict[str, int], limit: str, agent: str) -> Slot:
        """A run or a plugin host: the agent's own limit of its kind, the registry's limit of
        its kind (hosts), then the registry's sandboxes (runs and hosts together), shared
        fairly among the agents that want one."""
        nothing = "no plugin host was started" if counter is self._hosts else "nothing was started"

        def over(what: str, name: str, bound: int) -> CodemodeError:
            return _over(what, name, agent, self.retry_delay_s, bound=bound, nothing=nothing)

        bound = getattr(self.limits_for(agent), limit)
        if bound is not None and counter.get(agent, 0) >= bound:
            raise over("agent", limit, bound)
        if limit != "max_concurrent_runs":
            bound = getattr(self.global_limits, limit)
            if bound is not None and counter.get(_GLOBAL, 0) >= bound:
                raise over("global", limit, bound)
        sandboxes = self.global_limits.max_concurrent_runs
        if sandboxes is not None:
            now = self.clock()
            if self._held(_GLOBAL) >= sandboxes:
                self._waiting[agent] = now
                raise over("global", "max_concurrent_runs", sandboxes)
            share = self._fair_share(agent, sandboxes, now)
            if share is not None and self._held(agent) >= share:
                raise over("global", "fair_share", share)
            self._waiting.pop(agent, None)
        return _take(counter, agent)

    def _held(self, key: str) -> int:
        return self._runs.get(key, 0) + self._hosts.get(key, 0)

    def _fair_share(self, agent: str, sandboxes: int, now: float) -> int | None:
        """The sandboxes `agent` may hold while another agent waits for one; None: nobody
        else waits."""
        window = self.fair_share_window_s
        if window is None:
            window = max(1.0, 2 * self.retry_delay_s)
        for waiting, since in list(self._waiting.items()):
            if now - since > window:
                del self._waiting[waiting]
        if not self._waiting.keys() - {agent}:
            return None
        holders = {key for key in (*self._runs, *self._hosts) if key != _GLOBAL and self._held(key)}
        wanting = holders | self._waiting.keys() | {agent}
        return max(1, sandboxes // len(wanting))

    def in_flight(self, agent: str | None = None) -> tuple[int, int]:
        """(runs, nested calls) in flight for `agent`, or for everyone."""
        key = _GLOBAL if agent is None else agent
        return self._runs.get(key, 0), self._nested.get(key, 0)

    def live_hosts(self, agent: str | None = None) -> int:
        """Plugin hosts holding a slot, of `agent` or of everyone."""
        return self._hosts.get(_GLOBAL if agent is None else agent, 0)


def _take(counter: dict[str, int], agent: str) -> Slot:
    for key in (_GLOBAL, agent):
        counter[key] = counter.get(key, 0) + 1
    return Slot([counter, counter], [_GLOBAL, agent])


def _over(
    what: str,
    limit: str,
    agent: str,
    delay: float,
    *,
    bound: float | None = None,
    nothing: str = "nothing was started",
) -> CodemodeError:
    owner = agent or "the global scope"
    if limit == "fair_share":
        why = (
            f"{owner} holds its fair share ({bound}) of the registry's sandboxes while another "
            "agent waits for one"
        )
    else:
        whose = "the registry's" if what == "global" else f"{owner}'s"
        why = f"over {whose} {limit}" + ("" if bound is None else f" ({bound:g})")
    return resource_exhausted(
        "ADMISSION_LIMIT",
        f"{why}: {nothing}; retry after {delay:.3g} s",
        retry_delay=delay,
        limit=limit,
        scope=what,
        agent=agent,
    )
