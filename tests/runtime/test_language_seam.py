"""A language is a backend and nothing more: "tiny", a test-only language whose backend and
interpreter live under ``tests/runtime/tiny_language/``, registered here and nowhere else, is
served by a real runtime -- its workers forked, isolated and supervised like every other --
and passes every case of the language corpus it has a source for."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2
from runtime_service.languages import register
from runtime_service.runtime import Runtime
from tests.runtime.conftest import (
    can_isolate,
    connected,
    drive,
    grpc_settings,
    serving,
    start_message_in,
)
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


async def test_a_large_result_reaches_a_registered_language_as_a_raw_frame(
    tiny_registered: None,
) -> None:
    # The runtime forwards a large result unread, beside the reply's message (docs/wire.md):
    # a language's own worker reads it as the json token it stands for.
    value = {"items": [{"id": i, "name": f"caf\u00e9 {i}"} for i in range(2000)]}
    program = "call echo {}\nreturn $".format(json.dumps({"v": 1}))
    async with serving(grpc_settings()) as running, connected(running) as stub:
        seen, terminal = await drive(
            stub,
            start_message_in(tiny.NAME, program, "echo"),
            lambda call: _answer(call, value),
        )
    assert [m.WhichOneof("kind") for m in seen].count("binding_call") == 1
    assert terminal.WhichOneof("outcome") == "success", terminal
    assert json.loads(terminal.success.value_json) == value


async def _answer(call: runtime_pb2.BindingCall, value: object) -> runtime_pb2.CallResult:
    return pb.CallResult(call_id=call.call_id, value_json=json.dumps(value, ensure_ascii=False))
