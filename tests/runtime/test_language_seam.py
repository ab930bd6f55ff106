"""A language is a backend and nothing more: "tiny", a test-only language whose backend and
interpreter live under ``tests/runtime/tiny_language/``, registered here and nowhere else, is
served by a real runtime -- its workers forked, isolated and supervised like every other --
and passes every case of the language corpus it has a source for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2
from runtime_service.languages import register
from runtime_service.runtime import Runtime
from tests.runtime.conftest import can_isolate, connected, grpc_settings, serving
from tests.runtime.language_corpus import corpus
from tests.runtime.tiny_language import backend as tiny

pb = runtime_pb2


@pytest.fixture
def tiny_registered() -> Iterator[None]:
    unregister = register(tiny.BACKEND)
    try:
        yield
    finally:
        unregister()


def _mechanisms(isolation: runtime_pb2.Isolation) -> list[tuple[str, bool, int]]:
    return [(item.name, item.enforced, item.scope) for item in isolation.mechanisms]


async def test_a_registered_language_is_served_and_passes_its_corpus(
    tiny_registered: None,
) -> None:
    async with serving(grpc_settings()) as running, connected(running) as stub:
        caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
        assert list(caps.languages)[-1] == tiny.NAME
        isolation = caps.language_isolation[tiny.NAME]
        assert tiny.BACKEND.capability.interpreter in isolation.enforced
        # Isolated by the same steps as every worker, and measured from a real one.
        assert _mechanisms(isolation) == _mechanisms(caps.language_isolation["python"])
        if can_isolate():
            assert all(item.enforced for item in isolation.mechanisms), isolation.mechanisms
        ran, failures = await corpus.conformance(stub, tiny.NAME)
    assert failures == {}
    expressible = set(corpus.sources(tiny.NAME))
    assert ran == [case.id for case in corpus.cases() if case.id in expressible]
    assert len(ran) >= 15, ran


async def test_a_language_is_served_only_while_registered(tiny_registered: None) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(tiny.BACKEND)
    runtime = Runtime()
    try:
        assert tiny.NAME in runtime.languages
    finally:
        await runtime.dispose()


async def test_an_unregistered_language_is_not_served() -> None:
    runtime = Runtime()
    try:
        assert tiny.NAME not in runtime.languages
    finally:
        await runtime.dispose()
