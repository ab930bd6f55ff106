"""Run budgets: defaults, deployment maxima, and per-run overrides that may only lower them."""

from __future__ import annotations

from dataclasses import dataclass, fields

from runtime_service.errors import RunRequestError
from runtime_service.worker.ledger import MIN_OUTPUT_BYTES

__all__ = ["MAX_WALL_MS", "MIN_MEMORY_BYTES", "BudgetError", "Budgets", "resolve_budgets"]

MAX_WALL_MS = 2_147_483_647  # JavaScript's timer ceiling (2^31 - 1 ms); longer is rejected
MIN_MEMORY_BYTES = 64 << 20  # below this an idle interpreter with asyncio cannot run
_MIN_VALUES = {
    "compute_ms": 1,
    "wall_ms": 1,
    "max_output_bytes": MIN_OUTPUT_BYTES,
    "memory_bytes": MIN_MEMORY_BYTES,
    "max_outstanding_calls": 1,
}
_MAX_VALUES = {"wall_ms": MAX_WALL_MS}


class BudgetError(RunRequestError):
    """A budget is not a usable value, or exceeds the deployment maximum."""


@dataclass(frozen=True, slots=True)
class Budgets:
    """Limits of one run."""

    compute_ms: int = 60_000
    """Busy CPU time of every process of the run together (its cgroup; where the host has no
    run cgroup, of the worker process alone), counted from the moment the program is handed
    over; time spent awaiting binding calls is free (nothing runs)."""
    wall_ms: int = 600_000
    """Wall-clock ceiling from the moment the program is handed to the worker."""
    max_output_bytes: int = 64 << 20
    """Output ledger cap (logs plus completion value or failure message)."""
    memory_bytes: int = 512 << 20
    """Memory of every process of the run together, with its shared-memory, memfd and
    ``/tmp`` pages and no swap (the run's cgroup: ``memory.max`` or v1
    ``memory.limit_in_bytes``); also each process's address-space limit (``RLIMIT_AS``), the
    only bound where the host has no run cgroup."""
    max_outstanding_calls: int = 256
    """Binding calls awaiting a reply at once; further calls fail immediately."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if type(value) is not int:
                raise BudgetError(f"{item.name} must be an integer, got {value!r}")
            low = _MIN_VALUES[item.name]
            if value < low:
                raise BudgetError(f"{item.name} must be at least {low}, got {value}")
            high = _MAX_VALUES.get(item.name)
            if high is not None and value > high:
                raise BudgetError(f"{item.name} must be at most {high}, got {value}")


def resolve_budgets(
    maxima: Budgets,
    defaults: Budgets,
    requested: dict[str, int | None] | None = None,
) -> Budgets:
    """The budgets of one run: ``defaults`` lowered by ``requested`` (0 or None = default).

    A requested value above the deployment maximum is rejected, not clamped: a caller asking
    for more than the deployment allows should learn it.
    """
    values: dict[str, int] = {}
    unknown = set(requested or {}) - {item.name for item in fields(Budgets)}
    if unknown:
        raise BudgetError(f"unknown budget {sorted(unknown)[0]!r}")
    for item in fields(Budgets):
        ceiling = getattr(maxima, item.name)
        value = (requested or {}).get(item.name)
        if value is None or value == 0:
            value = min(getattr(defaults, item.name), ceiling)
        elif type(value) is not int or value < 0:
            raise BudgetError(f"{item.name} must be a non-negative integer, got {value!r}")
        elif value > ceiling:
            raise BudgetError(f"{item.name} {value} exceeds the deployment maximum {ceiling}")
        values[item.name] = value
    return Budgets(**values)
