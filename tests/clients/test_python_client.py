"""The Python client against the real services: async and sync, providers with hinted schemas,
approvals, history, typed errors."""

from __future__ import annotations

import asyncio
from typing import (
    Any,
    NotRequired,  # pydantic needs these on 3.11
)

import pytest
from typing_extensions import TypedDict

from codemode_client import (
    AlreadyExists,
    Approver,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RegistryClient,
    SyncRegistryClient,
    ToolProvider,
    open_channel,
)
from codemode_wire import jsonvalue
from registry_service.domain.execution import ProgramLog
from registry_service.domain.policy import Ask, PreDecision
from tests.codemode.conftest import Stack
from tests.registry.conftest import echo_tool


class AddArgs(TypedDict):
    a: int
    b: int
    note: NotRequired[str]


class Sum(TypedDict):
    total: int


async def test_async_client_end_to_end_with_a_hinted_provider(stack: Stack) -> None:
    provider = ToolProvider(stack.channel, "math")

    @provider.tool(concurrency_safe=True)
    async def add(args: AddArgs, ctx: Any) -> Sum:
        """Add two integers."""
        return {"total": args["a"] + args["b"]}

    async with provider, RegistryClient(stack.running.address) as client:
        tools = {t.name: t for t in await client.list_tools()}
        assert tools["add"].description == "Add two integers."
        schema = jsonvalue.loads(tools["add"].input_schema_json)
        assert isinstance(schema, dict) and schema["required"] == ["a", "b"]
        agent = await client.create_agent("calc", mode="code")
        assert "class AddArgs(TypedDict):" in await client.sdk(agent.name)
        result = await client.run_code(
            "r = await tools.add({'a': 2, 'b': 3})\nreturn r['total']",
            "add numbers",
            agent=agent.name,
        )
        assert result.value == {"logs": [], "result": 5}
        kinds = [e.WhichOneof("event") for e in result.events]
        assert "nested_started" in kinds and "nested_settled" in kinds
        invalid = await client.run_code(
            "try:\n"
            "    await tools.add({'a': 'x', 'b': 1})\n"
            "except ToolCallError as e:\n"
            "    return str(e)",
            "bad args",
            agent=agent.name,
        )
        assert isinstance(invalid.value, dict)
        assert '"a" must be an integer' in str(invalid.value["result"])
        history = await client.history(agent.name)
        assert [r.kind for r in history].count("tool/code-dispatch") == 2
        assert [a.name for a in await client.list_agents()] == ["agents/calc"]
        # Deleted and re-created: an empty history; the old one stays readable by its id.
        await client.delete_agent(agent.name)
        again = await client.create_agent("calc", mode="code")
        assert len(agent.agent_id) == 32 and again.agent_id != agent.agent_id
        assert await client.history(again.name) == []
        assert await client.history(agent_id=agent.agent_id) == history
        content = await client.record_content("", history[-1].seq, agent_id=agent.agent_id)
        assert content


async def test_batched_progress_arrives_one_event_at_a_time(stack: Stack) -> None:
    async def chatty(invocation: Any) -> Any:
        for text in ("a", "b", "c"):  # queued in one step: the registry sends them as a batch
            invocation.emit(ProgramLog(text))
        return "done"

    stack.registry.register_tool("chatty", chatty, description="emits three logs")
    async with RegistryClient(stack.running.address) as client:
        agent = await client.create_agent("chat", mode="native")  # the stack defaults to code
        result = await client.call("chatty", agent=agent.name)
        assert result.value == "done"
        assert [e.WhichOneof("event") for e in result.events] == ["started", "log", "log", "log"]
        assert [e.log.text for e in result.events[1:]] == ["a", "b", "c"]


async def test_errors_carry_reason_domain_and_metadata(stack: Stack) -> None:
    async with RegistryClient(stack.running.address) as client:
        with pytest.raises(NotFound) as missing:
            await client.get_agent("agents/ghost")
        assert missing.value.reason == "AGENT_NOT_FOUND"
        assert missing.value.domain == "codemode.registry"
        assert missing.value.metadata == {"agent": "agents/ghost"}
        await client.create_agent("dup")
        with pytest.raises(AlreadyExists):
            await client.create_agent("dup")
        with pytest.raises(InvalidArgument) as bad:
            await client.create_agent("Not Valid")
        assert bad.value.reason == "INVALID_RESOURCE_ID"


async def test_add_restriction_with_an_empty_allow_list_hides_inherited_tools(
    make_registry: Any,
) -> None:
    async with make_registry() as h, RegistryClient(h.running.address) as client:
        echo_tool(h.registry, "a")
        echo_tool(h.registry, "b")
        agent = (await client.create_agent("narrow", mode="native")).name
        echo_tool(h.registry, "own", scope=agent)
        denied = await client.add_restriction(agent, deny=["a"])  # allow=None: no allow list
        assert [t.name for t in await client.list_tools(agent)] == ["b", "own"]
        await client.remove_restriction(agent, denied)
        none = await client.add_restriction(agent, allow=[])
        assert [t.name for t in await client.list_tools(agent)] == ["own"]
        await client.remove_restriction(agent, none)
        assert [t.name for t in await client.list_tools(agent)] == ["a", "b", "own"]


async def test_approver_answers_from_a_function(stack: Stack) -> None:
    async def pre(e: Any, d: PreDecision) -> PreDecision:
        return Ask("deletes are risky") if e.name.startswith("delete") else d

    stack.registry.catalog.hooks("").pre_execute.append(pre)

    async def delete_file(inv: Any) -> Any:
        return "deleted"

    async def delete_all(inv: Any) -> Any:
        return "everything deleted"

    stack.registry.register_tool("delete_file", delete_file)
    stack.registry.register_tool("delete_all", delete_all)
    seen: list[str] = []

    async def decide(request: Any) -> bool:
        seen.append(request.tool_name)
        return bool(request.tool_name == "delete_file")

    async with (
        RegistryClient(stack.running.address) as client,
        Approver(stack.channel, "ops", decide),
    ):
        agent = await client.create_agent("ops-agent", mode="native")
        ok = await client.call("delete_file", {}, agent=agent.name)
        no = await client.call("delete_all", {}, agent=agent.name)
    assert ok.value == "deleted" and not ok.is_error
    assert no.is_error and no.error_message == 'the user rejected tool "delete_all"'
    assert seen == ["delete_file", "delete_all"]


async def test_a_pending_approval_is_listed_and_resolved_without_a_stream(stack: Stack) -> None:
    """`pending_approvals` / `resolve_approval`: an abstaining stream keeps the request open
    (without a store a request waits only while an approver is connected)."""

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        return Ask("deploys need a ticket") if e.name == "deploy" else d

    stack.registry.catalog.hooks("").pre_execute.append(pre)
    echo_tool(stack.registry, "deploy")
    async with (
        RegistryClient(stack.running.address) as client,
        Approver(stack.channel, "abstains", lambda _request: None),
    ):
        agent = await client.create_agent("ticketed", mode="native")
        call = asyncio.create_task(client.call("deploy", {"env": "prod"}, agent=agent.name))
        pending: list[Any] = []
        for _ in range(1500):  # a latch: the call is waiting once its request is listed
            pending = await client.pending_approvals()
            if pending:
                break
            await asyncio.sleep(0.02)
        [request] = pending
        assert (request.agent, request.tool_name) == (agent.name, "deploy")
        await client.resolve_approval(request.approval_id, allowed=True)
        result = await call
        assert not result.is_error
        with pytest.raises(FailedPrecondition) as late:
            await client.resolve_approval(request.approval_id, allowed=False)
        assert late.value.reason == "APPROVAL_NOT_PENDING"
        with pytest.raises(NotFound):
            await client.resolve_approval("approval-nope", allowed=True)
        assert await client.pending_approvals() == []


async def test_sync_client_from_a_thread(stack: Stack) -> None:
    def work() -> Any:
        with SyncRegistryClient(stack.running.address) as client:
            agent = client.create_agent("sync-agent", mode="code")
            result = client.run_code("print('hi')\nreturn [1, 2]", "sync run", agent=agent.name)
            return result.value, len(client.history(agent.name))

    value, records = await asyncio.to_thread(work)
    assert value == {"logs": ["hi"], "result": [1, 2]}
    assert records == 2


async def test_list_calls_follow_every_page(stack: Stack) -> None:
    async with RegistryClient(stack.running.address) as client:
        for i in range(230):  # the default page holds 100
            await client.create_agent(f"a{i:03d}")
        names = [a.name for a in await client.list_agents()]
        assert names == sorted(names) and len(set(names)) == 230


async def test_default_channels_carry_arguments_and_results_up_to_the_registry_limit(
    stack: Stack,
) -> None:
    """gRPC's 4 MiB receive default broke a provider's stream on a 5 MB argument (revoking all
    its tools) and failed valid 4-16 MiB results in the client: the client's channels take
    what the registry takes (16 MiB by default)."""
    text = "x" * (5 * 1024 * 1024)
    async with open_channel(stack.running.address) as channel:
        provider = ToolProvider(channel, "big")

        @provider.tool(input_schema={"type": "object"}, output_schema={"type": "object"})
        async def echo_big(args: Any, ctx: Any) -> Any:
            return {"size": len(args["text"]), "text": args["text"]}

        async with provider, RegistryClient(stack.running.address) as client:
            agent = (await client.create_agent("big-calls", mode="native")).name
            result = await client.call("echo_big", {"text": text}, agent=agent)
            assert not result.is_error, result.error_message
            assert isinstance(result.value, dict) and result.value["size"] == len(text)
            assert result.value["text"] == text
            again = await client.call("echo_big", {"text": "small"}, agent=agent)  # stream kept
            assert isinstance(again.value, dict) and again.value["size"] == 5


async def test_agents_and_presets_declare_their_code_language(stack: Stack) -> None:
    async with RegistryClient(stack.running.address) as client:
        preset = await client.create_preset("py-preset", language="python")
        agent = await client.create_agent("py-member", preset=preset.name)
        assert (preset.code_language, agent.code_language) == ("python", "")
        assert agent.effective_code_language == "python"
        with pytest.raises(InvalidArgument) as refused:
            await client.create_agent("ts-bad", language="cobol")  # type: ignore[arg-type]
        assert refused.value.reason == "UNKNOWN_CODE_LANGUAGE"
