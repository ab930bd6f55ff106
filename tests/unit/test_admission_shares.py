"""The admission rules of sandboxes (runs and plugin hosts) on the domain object, with a
manual clock: how runs and hosts share the registry's limit, and the fair share of it while
another agent waits. (Through gRPC: tests/codemode/test_tenant_capacity.py and
tests/registry/cordis/test_host_admission.py.)"""

from __future__ import annotations

import contextlib

import pytest

from codemode_wire.errors import CodemodeError
from registry_service.config import RegistrySettings
from registry_service.domain.admission import (
    DEFAULT_AGENT_LIMITS,
    DEFAULT_GLOBAL_LIMITS,
    Admission,
    Limits,
)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _refused(admission: Admission, agent: str, what: str = "run") -> dict[str, str]:
    def take() -> None:
        if what == "run":
            with admission.run(agent):
                pass
        else:
            admission.plugin_host(agent)

    with pytest.raises(CodemodeError) as raised:
        take()
    assert raised.value.reason == "ADMISSION_LIMIT" and raised.value.retry_delay == 1.0
    return raised.value.metadata


def test_defaults_are_on_and_null_lifts_a_limit() -> None:
    settings = RegistrySettings()
    assert settings.global_limits() == DEFAULT_GLOBAL_LIMITS
    assert settings.default_agent_limits() == DEFAULT_AGENT_LIMITS
    assert DEFAULT_AGENT_LIMITS.max_concurrent_runs == 8
    assert DEFAULT_AGENT_LIMITS.max_plugin_hosts == 4
    lifted = RegistrySettings(agent_limits={"max_concurrent_runs": None, "burst": 3})
    assert lifted.default_agent_limits().max_concurrent_runs is None  # null: unlimited
    assert lifted.default_agent_limits().max_plugin_hosts == 4  # unset: the default
    assert lifted.default_agent_limits().burst == 3


def test_runs_and_hosts_share_the_registry_sandboxes() -> None:
    admission = Admission(
        Limits(max_concurrent_runs=3, max_plugin_hosts=2),
        lambda _agent: Limits(max_concurrent_runs=5, max_plugin_hosts=5),
    )
    hosts = [admission.plugin_host("a"), admission.plugin_host("b")]
    assert _refused(admission, "c", "host")["limit"] == "max_plugin_hosts"  # the global one
    with admission.run("c"):
        refusal = _refused(admission, "c")  # 2 hosts + 1 run: all 3 sandboxes taken
        assert (refusal["scope"], refusal["limit"]) == ("global", "max_concurrent_runs")
    hosts[0].release()
    hosts[0].release()  # idempotent
    with admission.run("c"), admission.run("c"):
        assert admission.in_flight() == (2, 0) and admission.live_hosts() == 1


def test_an_agent_over_its_fair_share_waits_while_another_does() -> None:
    clock = Clock()
    admission = Admission(
        Limits(max_concurrent_runs=4), lambda _agent: Limits(max_concurrent_runs=4), clock=clock
    )
    with contextlib.ExitStack() as held:
        for _ in range(4):
            held.enter_context(admission.run("a"))  # a alone may fill the registry
        assert _refused(admission, "b")["limit"] == "max_concurrent_runs"  # b now waits
        held.close()  # a's runs end
    with contextlib.ExitStack() as held:
        for _ in range(2):  # a gets its fair share: 4 sandboxes / 2 agents wanting them
            held.enter_context(admission.run("a"))
        refusal = _refused(admission, "a")
        assert (refusal["scope"], refusal["limit"]) == ("global", "fair_share")
        held.enter_context(admission.run("b"))  # the waiting agent gets what is left
        held.enter_context(admission.run("b"))
        assert admission.in_flight("b") == (2, 0)
    with contextlib.ExitStack() as held:
        for _ in range(4):
            held.enter_context(admission.run("a"))
        _refused(admission, "b")  # b waits again
    clock.now += 2.5  # b stopped asking: after the window (2 s), a may fill the registry again
    with contextlib.ExitStack() as held:
        for _ in range(4):
            held.enter_context(admission.run("a"))
