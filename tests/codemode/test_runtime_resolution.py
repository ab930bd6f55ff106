"""Resolving a runtime target that may name several runtimes to one address per runtime."""

from __future__ import annotations

import asyncio
import socket

import pytest

from registry_service import runtime_resolution
from registry_service.runtime_resolution import (
    ResolvedTarget,
    authority_of,
    listed_addresses,
    resolve,
)
from registry_service.runtime_targets import RuntimeTarget


@pytest.mark.parametrize(
    ("target", "addresses"),
    [
        ("ipv4:10.0.0.1:50052,10.0.0.2:50052", ["ipv4:10.0.0.1:50052", "ipv4:10.0.0.2:50052"]),
        ("ipv4:10.0.0.1,10.0.0.1:443", ["ipv4:10.0.0.1:443"]),  # gRPC's default port, deduped
        ("ipv6:[::1]:50052,[fe80::1]:7", ["ipv6:[::1]:50052", "ipv6:[fe80::1]:7"]),
        ("ipv6:::1", ["ipv6:[::1]:443"]),
        ("dns:///runtime:50052", None),
        ("runtime:50052", None),
    ],
)
def test_address_lists_are_parsed(target: str, addresses: list[str] | None) -> None:
    assert listed_addresses(target) == addresses


@pytest.mark.parametrize(
    "target", ["ipv4:10.0.0.1:50052,::1", "ipv4:runtime:50052", "ipv6:1.2.3.4"]
)
def test_a_malformed_address_list_is_refused(target: str) -> None:
    with pytest.raises(ValueError, match="address"):
        listed_addresses(target)


@pytest.mark.parametrize(
    ("target", "authority"),
    [
        ("dns:///runtime.ns.svc:50052", "runtime.ns.svc:50052"),
        ("dns://8.8.8.8/runtime:50052", "runtime:50052"),
        ("dns:runtime", "runtime:443"),
        ("ipv4:10.0.0.1:50052,10.0.0.2:50052", None),
    ],
)
def test_a_dns_targets_backends_present_its_name(target: str, authority: str | None) -> None:
    assert authority_of(target) == authority


async def test_a_dns_name_resolves_through_the_system_resolver() -> None:
    expected = {
        f"ipv4:{info[4][0]}:50052" if info[0] == socket.AF_INET else f"ipv6:[{info[4][0]}]:50052"
        for info in socket.getaddrinfo("localhost", 50052, type=socket.SOCK_STREAM)
    }
    assert set(await resolve("dns:///localhost:50052")) == expected
    assert "ipv4:127.0.0.1:50052" in expected
    with pytest.raises(socket.gaierror):
        await resolve("dns:///no-such-host.invalid:50052")


class _Closed(RuntimeTarget):
    def __init__(self, address: str) -> None:
        self.address = address


async def test_lookups_are_shared_and_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers at once share one lookup; the next is due after the interval, or after
    RERESOLVE_MIN_S once a runtime is reported away; a failed lookup keeps what is known."""
    answers: list[list[str] | OSError] = [["ipv4:10.0.0.1:1"], OSError("lookup failed")]
    lookups = 0
    release = asyncio.Event()

    async def lookup(target: str) -> list[str]:
        nonlocal lookups
        lookups += 1
        await release.wait()
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    monkeypatch.setattr(runtime_resolution, "resolve", lookup)
    now = [1000.0]
    monkeypatch.setattr(runtime_resolution, "monotonic", lambda: now[0])
    resolved = ResolvedTarget("dns:///runtimes:1", _Closed)
    assert resolved.due()
    waiting = [asyncio.ensure_future(resolved.refresh()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not resolved.due()  # under way
    release.set()
    results = await asyncio.gather(*waiting)
    assert lookups == 1
    added = [a for a, _ in results if a]
    assert len(added) == 1 and [t.address for t in added[0]] == ["ipv4:10.0.0.1:1"]
    assert list(resolved.backends) == ["ipv4:10.0.0.1:1"]

    assert not resolved.due()
    resolved.soon()
    now[0] += runtime_resolution.RERESOLVE_MIN_S / 2
    assert not resolved.due()  # not more often than RERESOLVE_MIN_S
    now[0] += runtime_resolution.RERESOLVE_MIN_S
    assert resolved.due()
    assert await resolved.refresh() == ([], [])  # it failed: nothing changes
    assert lookups == 2 and list(resolved.backends) == ["ipv4:10.0.0.1:1"]
    now[0] += runtime_resolution.RERESOLVE_MIN_S
    assert resolved.due()  # a failed lookup is tried again soon


async def test_a_name_answering_with_too_many_addresses_gets_a_bounded_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = runtime_resolution.MAX_BACKENDS + 50

    async def lookup(target: str) -> list[str]:
        return sorted(f"ipv4:10.0.{n // 250}.{n % 250 + 1}:1" for n in range(count))

    monkeypatch.setattr(runtime_resolution, "resolve", lookup)
    resolved = ResolvedTarget("dns:///many:1", _Closed)
    added, _ = await resolved.refresh()
    assert len(added) == len(resolved.backends) == runtime_resolution.MAX_BACKENDS
    assert list(resolved.backends) == (await lookup(""))[: runtime_resolution.MAX_BACKENDS]
