"""Admission control: how much one agent, and the whole registry, may run at once.

Three limits, each per agent and global (every agent together):
- `max_concurrent_runs`: `run_code` runs in flight;
- `max_nested_in_flight`: nested tool calls of programs in flight (queued or running);
- `calls_per_second` (with `burst`): model-direct tool calls started, a token bucket.

Over a limit a call is refused before anything of it starts (no history record, no run):
RESOURCE_EXHAUSTED with RetryInfo, the delay being when a token is due (rate) or
`retry_delay_s` (concurrency). A nested call over its limit is answered to the program as a
failed call instead (the run goes on; it may catch it and retry).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

from codemode_wire.errors import CodemodeError, resource_exhausted

__all__ = ["Admission", "Limits", "Slot"]


@dataclass(frozen=True, slots=True)
class Limits:
    """None: unlimited (or, merged over another, inherited)."""

    max_concurrent_runs: int | None = None
    max_nested_in_flight: int | None = None
    calls_per_second: float | None = None
    burst: int | None = None
    """Calls that may start at once after a quiet spell; none: the rate rounded up (≥ 1)."""

    def over(self, base: Limits) -> Limits:
        """These limits, each unset one taken from `base`."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return Limits(**{k: getattr(base, k) if v is None else v for k, v in values.items()})


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


_GLOBAL = "\x00global"  # a key no agent name can take


@dataclass
class Admission:
    global_limits: Limits = field(default_factory=Limits)
    limits_for: Callable[[str], Limits] = lambda _agent: Limits()
    """Each agent's own limits (its declaration, else its preset's, else the default)."""
    retry_delay_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _runs: dict[str, int] = field(default_factory=dict)
    _nested: dict[str, int] = field(default_factory=dict)
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
        """Holds one `run_code` slot of the agent and of the registry while the run lasts."""
        slot = self._acquire(self._runs, "max_concurrent_runs", agent)
        try:
            yield
        finally:
            slot.release()

    def nested(self, agent: str) -> Slot:
        """One nested-call slot (raises when over); the caller releases it when it settles."""
        return self._acquire(self._nested, "max_nested_in_flight", agent)

    def _acquire(self, counter: dict[str, int], limit: str, agent: str) -> Slot:
        for key, limits, what in (
            (_GLOBAL, self.global_limits, "global"),
            (agent, self.limits_for(agent), "agent"),
        ):
            bound = getattr(limits, limit)
            if bound is not None and counter.get(key, 0) >= bound:
                raise _over(what, limit, agent, self.retry_delay_s)
        for key in (_GLOBAL, agent):
            counter[key] = counter.get(key, 0) + 1
        return Slot([counter, counter], [_GLOBAL, agent])

    def in_flight(self, agent: str | None = None) -> tuple[int, int]:
        """(runs, nested calls) in flight for `agent`, or for everyone."""
        key = _GLOBAL if agent is None else agent
        return self._runs.get(key, 0), self._nested.get(key, 0)


def _over(what: str, limit: str, agent: str, delay: float) -> CodemodeError:
    whose = "the registry's" if what == "global" else f"{agent or 'the global scope'}'s"
    return resource_exhausted(
        "ADMISSION_LIMIT",
        f"over {whose} {limit}: nothing was started; retry after {delay:.3g} s",
        retry_delay=delay,
        limit=limit,
        scope=what,
        agent=agent,
    )
