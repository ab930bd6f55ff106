"""When the runtime reads a run's CPU time: as late as the budget allows, never later."""

from __future__ import annotations

import os

import pytest

from runtime_service.cpu_meter import CPU_POLL_INTERVAL_S, CPU_POLL_MAX_S, next_cpu_poll_s


@pytest.mark.parametrize("remaining_s", [0.0, -1.0, 1e-4, CPU_POLL_INTERVAL_S / 2])
def test_near_or_past_the_budget_it_polls_at_the_shortest_interval(remaining_s: float) -> None:
    assert next_cpu_poll_s(remaining_s) == CPU_POLL_INTERVAL_S


def test_far_from_the_budget_it_polls_at_the_longest_interval() -> None:
    assert next_cpu_poll_s(60.0) == CPU_POLL_MAX_S


def test_between_it_waits_no_longer_than_all_cpus_need_to_spend_the_rest() -> None:
    cpus = os.cpu_count() or 1
    remaining = 0.1 * cpus  # all CPUs busy spend it in 0.1 s
    delay = next_cpu_poll_s(remaining)
    assert CPU_POLL_INTERVAL_S <= delay <= CPU_POLL_MAX_S
    assert delay * cpus <= remaining + 1e-9
