"""The workload: flag parsing, the latency distribution, and the programs the load runs.

Every decision (which tool each nested call names, how long its body sleeps) is drawn up front
from a seeded RNG, so a run is reproducible and the expected counts (exclusive calls, approvals)
are known exactly rather than estimated.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_PROGRAMS = 100_000
MAX_CONCURRENCY = 1_000
MAX_CALLS = 1_000
MAX_NESTED_TOTAL = 1_000_000  # every nested sample is kept in memory for exact percentiles
MAX_FANOUT = 256  # the runtime's default cap on a run's outstanding binding calls
MAX_DURATION_S = 3_600.0
MAX_LATENCY_S = 60.0
EXP_TRUNCATION = 20.0  # exponential samples are cut at 20x the mean: one run stays bounded

SAFE, EXCLUSIVE = "work_safe", "work_exclusive"
SAFE_APPROVE, EXCLUSIVE_APPROVE = "work_safe_approve", "work_exclusive_approve"
TOOLS = (SAFE, EXCLUSIVE, SAFE_APPROVE, EXCLUSIVE_APPROVE)
APPROVE_GLOB = "work_*_approve"  # the policy rule that makes the approval share ask

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|ms|s)\s*$")


@dataclass(frozen=True)
class Latency:
    """A tool-body latency distribution, in seconds."""

    kind: str  # fixed | uniform | exp
    low: float
    high: float = 0.0  # uniform: the upper bound; exp: unused

    def sample(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high)
        return min(rng.expovariate(1.0 / self.low), self.low * EXP_TRUNCATION)

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.low + self.high) / 2
        return self.low

    def describe(self) -> str:
        if self.kind == "uniform":
            return f"uniform:{_fmt(self.low)}-{_fmt(self.high)}"
        return f"{self.kind}:{_fmt(self.low)}"


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:g}ms"


def parse_duration(text: str) -> float:
    """`5ms`, `1.5s`, `250us` -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (use a number with us, ms or s: 5ms)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_latency(text: str) -> Latency:
    """`fixed:5ms`, `uniform:1ms-20ms` or `exp:10ms` (exponential with that mean)."""
    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in ("fixed", "uniform", "exp"):
        raise ValueError(f"{text!r}: expected fixed:5ms, uniform:1ms-20ms or exp:10ms")
    if kind == "uniform":
        low_text, dash, high_text = rest.partition("-")
        if not dash:
            raise ValueError(f"{text!r}: uniform needs a range, e.g. uniform:1ms-20ms")
        low, high = parse_duration(low_text), parse_duration(high_text)
        if low > high:
            raise ValueError(f"{text!r}: the lower bound is above the upper bound")
    else:
        low = high = parse_duration(rest)
        if kind == "exp" and low <= 0:
            raise ValueError(f"{text!r}: the exponential mean must be positive")
    if high > MAX_LATENCY_S:
        raise ValueError(f"{text!r}: latencies above {MAX_LATENCY_S:g}s are not allowed")
    return Latency(kind, low, high if kind == "uniform" else 0.0)


def parse_loopback(text: str) -> str:
    """`HOST:PORT` of a loopback registry; anything else is refused (this is a load generator)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:50051")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare != "localhost":
        try:
            loopback = ipaddress.ip_address(bare).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"{text!r} is not a loopback address: the load test only targets "
                "127.0.0.0/8, ::1 or localhost"
            )
    return text


# -- argparse types -------------------------------------------------------------------------------


def int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range ({low}..{high})")
        return value

    return parse


def share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction between 0 and 1")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"{text} is out of range (0 < seconds <= 3600)")
    return value


def latency_arg(text: str) -> Latency:
    try:
        return parse_latency(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def loopback_arg(text: str) -> str:
    try:
        return parse_loopback(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def loopback_list_arg(text: str) -> list[str]:
    """`HOST:PORT[,HOST:PORT...]`: registry replicas, each on loopback."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: an empty address in the list")
    return [loopback_arg(part) for part in parts]


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    programs: int
    concurrency: int
    calls: int
    fanout: int
    exclusive_share: float
    approval_share: float
    latency: Latency
    duration_limit: float
    seed: int

    def settings(self) -> dict[str, object]:
        return {
            "programs": self.programs,
            "concurrency": self.concurrency,
            "calls": self.calls,
            "fanout": self.fanout,
            "exclusive_share": self.exclusive_share,
            "approval_share": self.approval_share,
            "latency": self.latency.describe(),
            "duration_limit_s": self.duration_limit,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Plan:
    """One program: the tool of each nested call and its body's sleep, in milliseconds."""

    index: int
    tools: tuple[str, ...]
    sleep_ms: tuple[float, ...]

    @property
    def approvals(self) -> int:
        return sum(1 for t in self.tools if t.endswith("_approve"))

    @property
    def exclusive(self) -> int:
        return sum(1 for t in self.tools if t.startswith(EXCLUSIVE))


def _quota(index: int, calls: int, fraction: float) -> int:
    """This program's share of a fraction, carried across programs so the total is exact."""
    return math.floor((index + 1) * calls * fraction) - math.floor(index * calls * fraction)


def plan(spec: Spec, index: int) -> Plan:
    rng = random.Random(f"{spec.seed}:{index}")  # independent of the order programs are made
    positions = range(spec.calls)
    exclusive = set(rng.sample(positions, _quota(index, spec.calls, spec.exclusive_share)))
    approve = set(rng.sample(positions, _quota(index, spec.calls, spec.approval_share)))
    tools = []
    for i in positions:
        base = EXCLUSIVE if i in exclusive else SAFE
        tools.append(base + "_approve" if i in approve else base)
    sleeps = tuple(round(spec.latency.sample(rng) * 1e3, 3) for _ in positions)
    return Plan(index, tuple(tools), sleeps)


# The program each outer call runs. It counts the calls it makes itself and stamps each one's
# submission with the wall clock (same host as the registry) so a queue wait from the program
# (relay included) can be derived from the dispatch-start records. A failing nested call is
# counted, never fatal.
_PROGRAM = """\
import asyncio, time
PLAN = {plan}
gate = asyncio.Semaphore({fanout})
submitted = [0.0] * len(PLAN)
made = []
failed = []

async def one(i):
    name, ms = PLAN[i]
    async with gate:
        submitted[i] = time.time()
        made.append(i)
        try:
            await tools[name]({{"p": {index}, "i": i, "sleep_ms": ms}})
        except ToolCallError as e:
            failed.append(str(e)[:200])

await asyncio.gather(*(one(i) for i in range(len(PLAN))))
return {{"made": len(made), "failed": len(failed), "errors": failed[:3], "submitted": submitted}}
"""


def program(spec: Spec, p: Plan) -> str:
    pairs = json.dumps([[t, ms] for t, ms in zip(p.tools, p.sleep_ms, strict=True)])
    return _PROGRAM.format(plan=pairs, fanout=spec.fanout, index=p.index)
