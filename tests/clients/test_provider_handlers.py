"""How a Python `ToolProvider` calls its handlers, through the real registry over gRPC: arguments
parsed into hinted pydantic models, dataclasses and TypedDicts (refusals are `INVALID_ARGS`
naming the field), returned models serialized, sync handlers in a bounded pool off the event
loop, `ctx` optional, signatures refused at declaration, unexpected exceptions hidden behind an
error id (and logged), explicit `ToolError`s shown as written, no registry a clear error."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from pydantic import BaseModel, field_validator
from typing_extensions import TypedDict

from codemode_client import (
    InvocationContext,
    RegistryClient,
    ToolCallResult,
    ToolError,
    ToolFailed,
    ToolProvider,
    Unavailable,
    open_channel,
)
from codemode_wire import jsonvalue
from tests.codemode.conftest import Stack


class Stop(BaseModel):
    name: str

    @field_validator("name")
    @classmethod
    def not_blank(cls, value: str) -> str:
        # A rule JSON Schema cannot carry: the registry lets it through, the provider refuses.
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class Trip(BaseModel):
    city: str
    stops: list[Stop] = []


class Temp(BaseModel):
    city: str
    celsius: float


@dataclasses.dataclass
class Box:
    width: int
    height: int


class Greeting(TypedDict):
    name: str


async def _call(client: RegistryClient, tool: str, args: Any, agent: str) -> ToolCallResult:
    return await asyncio.wait_for(client.call(tool, args, agent=agent), 30)


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[RegistryClient]:
    async with RegistryClient(stack.running.address) as client:
        yield client


async def _agent(client: RegistryClient, name: str) -> str:
    return (await client.create_agent(name, mode="native")).name


async def test_hinted_arguments_arrive_parsed_and_models_return_as_json(
    stack: Stack, client: RegistryClient
) -> None:
    provider = ToolProvider(stack.channel, "typed")
    seen: list[Any] = []

    @provider.tool()
    async def forecast(args: Trip) -> Temp:  # no ctx
        seen.append(args)
        return Temp(city=args.city, celsius=21.5 + len(args.stops))

    @provider.tool()
    def area(args: Box, ctx: InvocationContext) -> Box:  # sync, with ctx
        seen.append((args, ctx.tool_name))
        return Box(args.width * 2, args.height * 2)

    @provider.tool()
    async def greet(args: Greeting) -> dict[str, str]:
        seen.append(args)
        return {"text": f"hello {args['name']}"}

    @provider.tool(description="Ping")
    async def ping() -> str:
        return "pong"

    @provider.tool()
    async def untyped(args: Any, ctx: Any) -> Any:
        return Temp(city="unhinted", celsius=1)  # a model returned without a return hint

    @provider.tool()
    def untyped_dataclass(args: Any) -> Any:
        return Box(3, 4)

    @provider.tool()
    async def untyped_box(args: Any) -> Any:
        return [Box(1, 2)]  # inside a list, with no hint: nothing says how to serialize it

    async with provider:
        agent = await _agent(client, "typed")
        result = await _call(client, "forecast", {"city": "Oslo", "stops": [{"name": "a"}]}, agent)
        assert not result.is_error, result.error_message
        assert result.value == {"city": "Oslo", "celsius": 22.5}
        assert seen.pop() == Trip(city="Oslo", stops=[Stop(name="a")])

        result = await _call(client, "area", {"width": 2, "height": 3}, agent)
        assert result.value == {"width": 4, "height": 6}
        assert seen.pop() == (Box(2, 3), "area")

        result = await _call(client, "greet", {"name": "Ada"}, agent)
        assert result.value == {"text": "hello Ada"}
        assert seen.pop() == {"name": "Ada"}

        assert (await _call(client, "ping", {}, agent)).value == "pong"
        assert (await _call(client, "untyped", {}, agent)).value == {
            "city": "unhinted",
            "celsius": 1.0,
        }
        assert (await _call(client, "untyped_dataclass", {}, agent)).value == {
            "width": 3,
            "height": 4,
        }
        unserializable = await _call(client, "untyped_box", {}, agent)
        assert unserializable.error_code == "INVALID_TOOL_OUTPUT"

        # The hint is the input schema: the registry refuses a missing field before the call.
        tools = {tool.name: tool for tool in await client.list_tools()}
        schema = jsonvalue.loads(tools["forecast"].input_schema_json)
        assert isinstance(schema, dict) and schema["required"] == ["city"]
        refused = await _call(client, "forecast", {"stops": []}, agent)
        assert refused.error_code == "INVALID_ARGS"
        assert not seen

        # What only the model's validators know is refused by the provider, naming the field.
        bad = {"city": "Oslo", "stops": [{"name": "a"}, {"name": "  "}]}
        refused = await _call(client, "forecast", bad, agent)
        assert refused.is_error and refused.error_code == "INVALID_ARGS"
        assert refused.error_message == (
            'invalid arguments: "stops[1].name": Value error, must not be blank'
        )
        assert not seen


async def test_an_explicit_input_schema_still_parses_into_the_hint(
    stack: Stack, client: RegistryClient
) -> None:
    provider = ToolProvider(stack.channel, "loose")

    @provider.tool(input_schema={"type": "object"})  # the registry checks nothing
    async def sized(args: Box) -> int:
        return args.width * args.height

    async with provider:
        agent = await _agent(client, "loose")
        assert (await _call(client, "sized", {"width": 2, "height": 5}, agent)).value == 10
        refused = await _call(client, "sized", {"width": "wide", "depth": 1}, agent)
        assert refused.error_code == "INVALID_ARGS"
        assert refused.error_message == (
            'invalid arguments: "width": Input should be a valid integer, unable to parse '
            'string as an integer; "height": Field required'
        )


async def test_sync_handlers_run_off_the_loop_in_a_bounded_pool(
    stack: Stack, client: RegistryClient
) -> None:
    provider = ToolProvider(stack.channel, "blocking", max_threads=2)
    gate = threading.Event()
    lock = threading.Lock()
    running = [0]
    peak = [0]
    threads: set[str] = set()
    started = asyncio.Queue[None]()
    loop = asyncio.get_running_loop()

    @provider.tool(concurrency_safe=True)
    def block(args: dict[str, int]) -> int:
        threads.add(threading.current_thread().name)
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        loop.call_soon_threadsafe(started.put_nowait, None)
        # Blocks its thread; were it on the event loop, `release` below could never run.
        assert gate.wait(30)
        with lock:
            running[0] -= 1
        return args["n"]

    @provider.tool(concurrency_safe=True)
    async def release(args: Any) -> str:
        gate.set()
        return "released"

    async with provider:
        agent = await _agent(client, "blocking")
        calls = [asyncio.ensure_future(_call(client, "block", {"n": n}, agent)) for n in range(3)]
        for _ in range(2):
            await asyncio.wait_for(started.get(), 30)
        # Two threads are busy: the third call waits for one, the loop serves another tool.
        assert (await _call(client, "release", {}, agent)).value == "released"
        results = await asyncio.gather(*calls)
    assert sorted(result.value for result in results) == [0, 1, 2]  # type: ignore[type-var]
    assert peak[0] == 2
    assert threads and all(name.startswith("tool-provider-blocking") for name in threads)


async def test_unexpected_exceptions_reach_the_model_as_an_error_id_only(
    stack: Stack, client: RegistryClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "hunter2-db-password"
    provider = ToolProvider(stack.channel, "leaky")

    @provider.tool()
    async def connect(args: Any) -> Any:
        raise RuntimeError(f"cannot connect to postgres://admin:{secret}@db")

    @provider.tool()
    def sync_connect(args: Any) -> Any:
        raise KeyError(secret)

    @provider.tool()
    async def quota(args: Any) -> Any:
        raise ToolError("quota exceeded, try after 5pm", "QUOTA")

    caplog.set_level(logging.ERROR, logger="codemode_client.provider")
    async with provider:
        agent = await _agent(client, "leaky")
        failed = [await _call(client, tool, {}, agent) for tool in ("connect", "sync_connect")]
        explicit = await _call(client, "quota", {}, agent)
        history = await client.history(agent)

    ids = []
    for tool, result in zip(("connect", "sync_connect"), failed, strict=True):
        assert result.is_error and secret not in result.error_message and secret not in result.text
        match = re.fullmatch(
            rf"tool '{tool}' failed unexpectedly \(error id ([0-9a-f]{{12}})\); "
            "the provider logged the details",
            result.error_message,
        )
        assert match, result.error_message
        assert result.error_code == "TOOL_FAILED"  # the registry's code for a codeless failure
        ids.append(match.group(1))
    assert ids[0] != ids[1]
    assert (explicit.error_code, explicit.error_message) == (
        "QUOTA",
        "quota exceeded, try after 5pm",
    )
    assert history and all(secret not in str(record) for record in history)
    # The provider's log has each failure's id and traceback, secret included: it is theirs.
    logged = [r for r in caplog.records if r.name == "codemode_client.provider"]
    assert [error_id in r.getMessage() for r, error_id in zip(logged, ids, strict=True)] == [
        True,
        True,
    ]
    assert all(r.exc_info is not None and secret in str(r.exc_info[1]) for r in logged)


def _declare(handler: Callable[..., Any], name: str | None = None) -> None:
    ToolProvider(None, "p").tool(name)(handler)


async def _agen(args: Any) -> Any:
    yield 1


def _three(args: Any, ctx: Any, extra: Any) -> Any:
    return None


def _keyword(args: Any, *, flag: bool) -> Any:
    return None


def _forward(args: Nope) -> Any:  # type: ignore[name-defined]  # noqa: F821
    return None


def _socket(args: socket.socket) -> Any:
    return None


async def _ctx_only(ctx: InvocationContext) -> Any:
    return None


@pytest.mark.parametrize(
    ("handler", "problem"),
    [
        (_agen, "the handler is a generator"),
        (_three, "parameter 'extra' has no default"),
        (_keyword, "keyword-only parameter 'flag' has no default"),
        (_forward, "type hints cannot be resolved"),
        (_socket, "the arguments hint <class 'socket.socket'> is not a type pydantic can use"),
        ("not a function", "is not callable"),
        (_ctx_only, "first parameter is hinted InvocationContext, but it gets the arguments"),
    ],
)
def test_impossible_handlers_are_refused_at_declaration(handler: Any, problem: str) -> None:
    with pytest.raises(TypeError) as refused:
        _declare(handler, "the_tool")
    assert str(refused.value).startswith("tool 'the_tool': "), refused.value
    assert problem in str(refused.value)


def test_handlers_that_can_be_called_are_accepted() -> None:
    async def with_default(args: Any, ctx: Any, extra: int = 1) -> Any: ...
    async def star(*args: Any) -> Any: ...
    def keyword_default(args: Any, *, flag: bool = False) -> Any: ...

    class Callable_:
        async def __call__(self, args: Box) -> Box:
            return args

    for handler in (with_default, star, keyword_default):
        _declare(handler)
    _declare(Callable_(), "an_object")


def test_tool_failed_is_tool_error() -> None:
    assert ToolFailed is ToolError


async def test_no_registry_is_a_clear_error_naming_the_address() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    async with open_channel(address) as channel:
        provider = ToolProvider(channel, "lonely")

        @provider.tool()
        async def ping() -> str:
            return "pong"

        with pytest.raises(Unavailable) as refused:
            await provider.start()
    message = str(refused.value)
    assert message.startswith(f"tool provider 'lonely': no registry reachable at {address}")
    assert "serve() waits for one" in message
    # A channel made without open_channel names its address too.
    async with grpc.aio.insecure_channel(address) as plain:
        provider = ToolProvider(plain, "plain")
        with pytest.raises(
            Unavailable, match=f"^tool provider 'plain': no registry reachable at {address} "
        ):
            await provider.start()
