"""How a worker's log lines are charged against its output budget.

Two accounts, one price per line (``ledger.log_entry_cost``: its JSON text plus
``ledger.LOG_LINE_OVERHEAD``):

- a program run's logs are part of its one result: its ``ledger.OutputLedger`` charges them
  as entries of the result's ``logs`` array (and keeps them for it);
- a plugin host's lines are sent one by one as they happen: ``LineBudget`` charges each as a
  message of its own and keeps none; the budget is renewed whenever a call begins.

``supervisor.WorkerSupervisor.admit_log`` charges either and ends the worker's output at the
first line that does not fit.
"""

from __future__ import annotations

from typing import Protocol

from runtime_service.worker import ledger

__all__ = ["LineBudget", "LogAccount"]


class LogAccount(Protocol):
    def admit_log(self, text: str) -> bool:
        """Charge one log line; False once the budget is exceeded."""
        ...


class LineBudget:
    """Log lines sent one at a time, against a budget renewed by ``renew``."""

    __slots__ = ("_left", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._left = max_bytes

    def renew(self) -> None:
        self._left = self.max_bytes

    def admit_log(self, text: str) -> bool:
        self._left -= ledger.log_entry_cost(text, first=True)
        return self._left >= 0
