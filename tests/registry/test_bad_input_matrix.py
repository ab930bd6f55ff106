"""Bad input of every kind on every registry RPC gets a clear error and changes nothing.

One case per (rpc, kind of bad input). Each asserts the canonical status code, an `ErrorInfo`
in the `codemode.registry` domain with the expected stable UPPER_SNAKE reason, a message, and
that the registry's state (presets, agents, the tools the global scope and an agent see, that
agent's history, open provider and approver streams, the catalog version) is the same before
and after. A hang fails the case. One registry serves the module: nothing is meant to change
it, and each case compares against its own `before`.

Inputs the contract tolerates on purpose (oversized page sizes, late answers, tool failures,
which are results) are pinned at the end of the file.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import pytest
import pytest_asyncio

from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2, tool_pb2
from codemode_wire.grpc_status import error_info
from registry_service.config import RegistrySettings
from registry_service.server import start
from tests.registry.conftest import CODE, NATIVE, Harness, echo_tool, error_info_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXISTS = grpc.StatusCode.ALREADY_EXISTS
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
REASON = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*")
HANG_S = 5.0

ALICE = "agents/alice"  # parented under TEAM, restricted, with history
CODER = "agents/coder"  # declares `code`, for the runtime-language cases
TEAM = "presets/team"  # declares `native`
LONG = "a" * 10_000
WIDE = "\U0001f600" * 10_000  # 4 bytes of UTF-8 each, 12 once percent-encoded in a trailer

OPEN_PROVIDER = rpb.ConnectRequest(open=rpb.OpenProvider(provider_name="bad-input"))
OPEN_APPROVER = rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="bad-input"))


@dataclass
class World:
    harness: Harness
    restriction_id: str  # ALICE's restriction

    @property
    def stub(self) -> Any:
        return self.harness.stub


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world() -> AsyncIterator[World]:
    config = RegistrySettings(listen="127.0.0.1:0", history_path=":memory:")
    running = await start(config)
    channel = grpc.aio.insecure_channel(running.address)
    harness = Harness(running, channel)
    try:
        echo_tool(harness.registry, "echo")
        echo_tool(harness.registry, "hidden")
        await harness.preset("team", mode=NATIVE)
        await harness.agent("alice", preset=TEAM)
        await harness.agent("coder", mode=CODE)
        added = await harness.stub.AddRestriction(
            rpb.AddRestrictionRequest(scope=ALICE, deny=["hidden"])
        )
        await harness.execute("echo", {"x": 1}, agent=ALICE, call_id="seed")
        yield World(harness, added.restriction_id)
    finally:
        await channel.close()
        await running.stop(0)


# -- state ------------------------------------------------------------------------------------


async def snapshot(w: World) -> dict[str, Any]:
    """Everything a bad request must leave as it was."""
    stub = w.stub

    async def tools(scope: str) -> tuple[Any, ...]:
        listed = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=scope))
        return listed.effective_mode, [(t.name, t.scope, t.owner) for t in listed.tools]

    presets = await stub.ListPresets(rpb.ListPresetsRequest(page_size=1000))
    agents = await stub.ListAgents(rpb.ListAgentsRequest(page_size=1000))
    history = await stub.ListHistory(rpb.ListHistoryRequest(agent=ALICE, page_size=1000))
    registry = w.harness.registry
    return {
        "presets": [(p.name, p.mode) for p in presets.presets],
        "agents": [(a.name, a.preset, a.mode, a.effective_mode) for a in agents.agents],
        "global tools": await tools(""),
        "alice tools": await tools(ALICE),
        "alice history": [(r.seq, r.kind, r.call_id) for r in history.records],
        "catalog version": registry.catalog.version,
        "providers": len(registry.providers.sessions),
        "approvers": registry.approvals.connected,
    }


async def settled(w: World, expected: dict[str, Any] | None = None) -> dict[str, Any]:
    """The snapshot once no provider or approver stream is open (a stream's server side ends
    just after its client has seen the status), or once it equals `expected`."""
    for _ in range(100):
        state = await snapshot(w)
        if (expected is None and not state["providers"] and not state["approvers"]) or (
            state == expected
        ):
            break
        await asyncio.sleep(0.01)
    return state


def assert_clear(error: grpc.aio.AioRpcError, code: grpc.StatusCode, reason: str) -> None:
    assert error.code() == code, f"{error.code()}: {error.details()}"
    info = error_info_of(error)
    assert info is not None, f"no ErrorInfo: {error.code()}: {error.details()}"
    assert info.domain == "codemode.registry"
    assert REASON.fullmatch(info.reason), info.reason
    assert info.reason == reason, f"{info.reason}: {error.details()}"
    assert error.details(), "an empty message"


# -- how a case talks to the registry ------------------------------------------------------------


async def drain(call: Any) -> list[Any]:
    """Reads a server stream to its end (its error, for the cases here)."""
    try:
        return [m async for m in call]
    finally:
        call.cancel()


async def converse(call: Any, messages: Sequence[Any]) -> list[Any]:
    """Writes `messages` on a bidi stream, half-closes, reads to the end."""
    try:
        for message in messages:
            await call.write(message)
        await call.done_writing()
        return [r async for r in call]
    finally:
        call.cancel()


Send = Callable[[World], Awaitable[Any]]
# Server-streaming RPCs: a case reads them to their end.
SERVER_STREAMS = frozenset({"ExecuteToolCall", "WatchHistory"})


@dataclass(frozen=True)
class Case:
    rpc: str
    kind: str
    request: Any  # the request message, or a `Send` for what needs the world or a bidi stream
    code: grpc.StatusCode
    reason: str

    @property
    def id(self) -> str:
        return f"{self.rpc}:{self.kind}:{self.code.name}"

    def send(self, w: World) -> Awaitable[Any]:
        if callable(self.request):
            sent: Awaitable[Any] = self.request(w)
            return sent
        call = getattr(w.stub, self.rpc)(self.request)
        return drain(call) if self.rpc in SERVER_STREAMS else call


def malformed(collection: str, existing: str) -> list[tuple[str, str]]:
    """(kind, name) pairs that are not a valid `collection/{id}` name, built around an id that
    exists, so that lax parsing would find something."""
    return [
        ("no-id", f"{collection}/"),
        ("nested", f"{collection}/{existing}/b"),
        ("unknown-collection", f"foo/{existing}"),
        ("no-collection", existing),
        ("space", f"{collection}/{existing} x"),
        ("10k-chars", f"{collection}/{LONG}"),
        ("10k-non-ascii", f"{collection}/{WIDE}"),
        ("uppercase", f"{collection}/{existing.upper()}"),
        ("fullwidth", f"{collection}/" + "".join(chr(ord(c) + 0xFEE0) for c in existing)),
        ("zero-width-space", f"{collection}/{existing}\u200b"),
        ("astral-emoji", f"{collection}/{existing}\U0001f600"),
        ("trailing-newline", f"{collection}/{existing}\n"),
        ("nul", f"{collection}/{existing}\x00"),
    ]


AGENT_NAMES = [("empty", ""), *malformed("agents", "alice"), ("preset-name", TEAM)]
# History reads take the empty agent as the audit log (administrative changes).
HISTORY_AGENT_NAMES = AGENT_NAMES[1:]
PRESET_NAMES = [("empty", ""), *malformed("presets", "team"), ("agent-name", ALICE)]
# Scope fields take either collection (empty is the global scope, or SCOPE_REQUIRED).
SCOPES = [*malformed("agents", "alice"), ("preset-trailing-newline", f"{TEAM}\n")]
UNKNOWN_SCOPES = [
    ("unknown-agent", "agents/ghost", "AGENT_NOT_FOUND"),
    ("unknown-preset", "presets/ghost", "PRESET_NOT_FOUND"),
]
BAD_IDS = [
    ("empty", ""),
    ("uppercase", "Bob"),
    ("space", "bob x"),
    ("starts-with-digit", "1bob"),
    ("starts-with-dash", "-bob"),
    ("64-chars", "b" * 64),
    ("10k-chars", LONG),
    ("10k-non-ascii", WIDE),
    ("slash", "bob/x"),
    ("full-name", "agents/bob"),
    ("fullwidth", "ｂｏｂ"),
    ("accented", "bób"),
    ("zero-width-space", "bob\u200b"),
    ("trailing-newline", "bob\n"),
    ("nul", "bob\x00"),
]


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


# Page tokens the registry never issued. A preset token is the base64 of the last name seen.
BOGUS_NAME_TOKENS = [
    ("garbage", "garbage"),
    ("not-base64", "!!!"),
    ("base64-of-non-utf8", base64.urlsafe_b64encode(b"\xff\xfe").decode()),
    ("unicode", "ｔｏｋｅｎ"),
    ("10k-chars", "A" * 10_000),
    ("raw-name", "presets/team"),
]
# History tokens are a decimal seq.
BOGUS_SEQ_TOKENS = [
    ("letters", "abc"),
    ("negative", "-1"),
    ("fraction", "1.5"),
    ("leading-space", " 1"),
    ("hex", "0x10"),
    ("fullwidth-digits", "１２"),
    ("superscript-digit", "²"),
    ("arabic-indic-digits", "١٢"),
    ("over-int64", str(2**63)),
    ("over-uint64", str(2**64)),
    ("10k-digits", "9" * 10_000),
]

# JSON texts that are not lossless JSON (for arguments_json and the tool schemas).
BAD_JSON = [
    ("unterminated", "{"),
    ("nan", '{"x": NaN}'),
    ("bare-nan", "NaN"),
    ("infinity", '{"x": Infinity}'),
    ("overflow-1e999", '{"x": 1e999}'),
    ("underflow-1e-400", '{"x": -1e-400}'),
    ("negative-zero", '{"x": -0}'),
    ("bare-negative-zero", "-0"),
    ("negative-zero-float", '{"x": -0.0}'),
    ("duplicate-keys", '{"a": 1, "a": 2}'),
    ("nested-duplicate-keys", '{"a": {"b": 1, "b": 1}}'),
    ("trailing-garbage", "{} x"),
    ("two-documents", "{}{}"),
    ("single-quotes", "{'a': 1}"),
    ("trailing-comma", '{"a": 1,}'),
    ("comment", '{"a": 1 /* c */}'),
    ("raw-control-char", '{"a": "\x01"}'),
    ("bad-escape", '{"a": "\\x41"}'),
    ("byte-order-mark", "\ufeff{}"),
    ("deep-unterminated", "[" * 100_000),
]


def execute(**fields: Any) -> rpb.ExecuteToolCallRequest:
    return rpb.ExecuteToolCallRequest(**{"call_id": "c", "tool_name": "echo", **fields})


def connect(*messages: rpb.ConnectRequest) -> Send:
    return lambda w: converse(w.stub.Connect(), messages)


def approve(*messages: rpb.ApproveRequest) -> Send:
    return lambda w: converse(w.stub.Approve(), messages)


def remove_restriction(scope: str) -> Send:
    """Removes ALICE's restriction, named by its real id, from `scope`."""
    return lambda w: w.stub.RemoveRestriction(
        rpb.RemoveRestrictionRequest(scope=scope, restriction_id=w.restriction_id)
    )


def decision(outcome: int, approval_id: str = "approval-1") -> rpb.ApproveRequest:
    return rpb.ApproveRequest(
        decision=rpb.ApprovalDecision(
            approval_id=approval_id, outcome=rpb.ApprovalOutcome.ValueType(outcome)
        )
    )


def _mode(value: int) -> scope_pb2.PresentationMode.ValueType:
    return scope_pb2.PresentationMode.ValueType(value)


# Fields that name one collection: (rpc, request for a name, names refused, unknown name).
BY_NAME: list[tuple[str, Callable[[str], Any], list[tuple[str, str]], str]] = [
    ("GetPreset", lambda n: rpb.GetPresetRequest(name=n), PRESET_NAMES, "presets/ghost"),
    (
        "DeletePreset",
        lambda n: rpb.DeletePresetRequest(name=n, force=True),
        PRESET_NAMES,
        "presets/ghost",
    ),
    ("GetAgent", lambda n: rpb.GetAgentRequest(name=n), AGENT_NAMES, "agents/ghost"),
    ("DeleteAgent", lambda n: rpb.DeleteAgentRequest(name=n), AGENT_NAMES, "agents/ghost"),
    (
        "ListHistory",
        lambda n: rpb.ListHistoryRequest(agent=n),
        HISTORY_AGENT_NAMES,
        "agents/ghost",
    ),
    (
        "WatchHistory",
        lambda n: rpb.WatchHistoryRequest(agent=n),
        HISTORY_AGENT_NAMES,
        "agents/ghost",
    ),
    (
        "GetRecordContent",
        lambda n: rpb.GetRecordContentRequest(agent=n, seq=1),
        AGENT_NAMES,
        "agents/ghost",
    ),
    # An empty agent is the global scope here, and an empty preset no parent: not bad input.
    ("ExecuteToolCall", lambda n: execute(agent=n), AGENT_NAMES[1:], "agents/ghost"),
    (
        "CreateAgent",
        lambda n: rpb.CreateAgentRequest(agent_id="bob", agent=scope_pb2.Agent(preset=n)),
        PRESET_NAMES[1:],
        "presets/ghost",
    ),
]
# Scope fields: (rpc, request for a scope or a Send, whether empty, the global scope, is fine).
BY_SCOPE: list[tuple[str, Callable[[str], Any], bool]] = [
    ("SetPresentationMode", lambda s: rpb.SetPresentationModeRequest(scope=s, mode=CODE), False),
    ("AddRestriction", lambda s: rpb.AddRestrictionRequest(scope=s, deny=["echo"]), False),
    ("RemoveRestriction", remove_restriction, False),
    ("ListVisibleTools", lambda s: rpb.ListVisibleToolsRequest(scope=s), True),
    ("GetWireSchemas", lambda s: ppb.GetWireSchemasRequest(scope=s), True),
    ("GetSystemPrompt", lambda s: ppb.GetSystemPromptRequest(scope=s), True),
    ("GetSdk", lambda s: ppb.GetSdkRequest(scope=s), True),
]
PAGED: list[tuple[str, Callable[..., Any], list[tuple[str, str]]]] = [
    ("ListPresets", rpb.ListPresetsRequest, BOGUS_NAME_TOKENS),
    ("ListAgents", rpb.ListAgentsRequest, BOGUS_NAME_TOKENS),
    ("ListHistory", partial(rpb.ListHistoryRequest, agent=ALICE), BOGUS_SEQ_TOKENS),
]
LANGUAGES = [
    ("unknown-language", "cobol"),
    ("language-wrong-case", "Python"),
    ("language-unicode", "pythön"),
    ("language-10k-chars", LONG),
]


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(rpc: str, kind: str, request: Any, code: grpc.StatusCode, reason: str) -> None:
        cases.append(Case(rpc, kind, request, code, reason))

    for rpc, make, names, unknown in BY_NAME:
        field = "preset-" if rpc == "CreateAgent" else ""
        for kind, name in names:
            add(rpc, field + kind, make(name), INVALID, "INVALID_RESOURCE_NAME")
        missing = "PRESET_NOT_FOUND" if unknown.startswith("presets/") else "AGENT_NOT_FOUND"
        add(rpc, field + "unknown", make(unknown), NOT_FOUND, missing)
    for rpc, make, global_ok in BY_SCOPE:
        if not global_ok:
            add(rpc, "empty-scope", make(""), INVALID, "SCOPE_REQUIRED")
        for kind, scope in SCOPES:
            add(rpc, kind, make(scope), INVALID, "INVALID_RESOURCE_NAME")
        for kind, scope, reason in UNKNOWN_SCOPES:
            add(rpc, kind, make(scope), NOT_FOUND, reason)

    # Ids of new resources.
    for kind, bad in BAD_IDS:
        preset = rpb.CreatePresetRequest(preset_id=bad)
        add("CreatePreset", kind, preset, INVALID, "INVALID_RESOURCE_ID")
        add(
            "CreateAgent",
            kind,
            rpb.CreateAgentRequest(agent_id=bad),
            INVALID,
            "INVALID_RESOURCE_ID",
        )
    add(
        "CreatePreset", "exists", rpb.CreatePresetRequest(preset_id="team"), EXISTS, "PRESET_EXISTS"
    )
    add("CreateAgent", "exists", rpb.CreateAgentRequest(agent_id="alice"), EXISTS, "AGENT_EXISTS")

    # Unknown enum values (proto3 keeps them as ints), and UNSPECIFIED where it is refused.
    for value in (99, -1):
        preset = rpb.CreatePresetRequest(
            preset_id="fresh", preset=scope_pb2.Preset(mode=_mode(value))
        )
        agent = rpb.CreateAgentRequest(agent_id="fresh", agent=scope_pb2.Agent(mode=_mode(value)))
        progress = execute(progress_events=rpb.ProgressEvents.ValueType(value))
        add("CreatePreset", f"mode-{value}", preset, INVALID, "INVALID_MODE")
        add("CreateAgent", f"mode-{value}", agent, INVALID, "INVALID_MODE")
        add(
            "ExecuteToolCall",
            f"progress-events-{value}",
            progress,
            INVALID,
            "INVALID_PROGRESS_EVENTS",
        )
    for value in (0, 99, -1):
        # ALICE declares no mode: only validation stands between the request and a change.
        set_mode = rpb.SetPresentationModeRequest(scope=ALICE, mode=_mode(value))
        add("SetPresentationMode", f"mode-{value}", set_mode, INVALID, "INVALID_MODE")
    declared = rpb.SetPresentationModeRequest(scope=TEAM, mode=CODE)
    add("SetPresentationMode", "already-declared", declared, PRECONDITION, "MODE_ALREADY_DECLARED")
    in_use = rpb.DeletePresetRequest(name=TEAM)
    add("DeletePreset", "in-use-without-force", in_use, PRECONDITION, "PRESET_IN_USE")

    # Pagination. Oversized page sizes are coerced, as documented (see the end of the file).
    for rpc, make, tokens in PAGED:
        for size in (-1, -(2**31)):
            add(rpc, f"page-size{size}", make(page_size=size), INVALID, "INVALID_PAGE_SIZE")
        for kind, token in tokens:
            add(rpc, f"page-token-{kind}", make(page_token=token), INVALID, "INVALID_PAGE_TOKEN")
    # A token of the other collection would silently restart the listing.
    add(
        "ListPresets",
        "page-token-of-agents",
        rpb.ListPresetsRequest(page_token=_b64(ALICE)),
        INVALID,
        "INVALID_PAGE_TOKEN",
    )
    add(
        "ListAgents",
        "page-token-of-presets",
        rpb.ListAgentsRequest(page_token=_b64(TEAM)),
        INVALID,
        "INVALID_PAGE_TOKEN",
    )

    # Restrictions.
    restrictions: list[tuple[str, rpb.AddRestrictionRequest, str]] = [
        ("neither-allow-nor-deny", rpb.AddRestrictionRequest(), "EMPTY_RESTRICTION"),
        ("run_code", rpb.AddRestrictionRequest(deny=["run_code"]), "RESERVED_TOOL_NAME"),
        ("unknown-target", rpb.AddRestrictionRequest(deny=["ghost"]), "UNKNOWN_RESTRICTION_TARGET"),
        ("empty-target", rpb.AddRestrictionRequest(allow=[""]), "UNKNOWN_RESTRICTION_TARGET"),
        ("10k-char-target", rpb.AddRestrictionRequest(deny=[LONG]), "UNKNOWN_RESTRICTION_TARGET"),
        (
            "allow-none-with-allow",
            rpb.AddRestrictionRequest(allow=["ghost"], allow_none=True),
            "CONFLICTING_ALLOW",
        ),
    ]
    for kind, request, reason in restrictions:
        request.scope = ALICE
        add("AddRestriction", kind, request, INVALID, reason)
    missing_id = rpb.RemoveRestrictionRequest(scope=ALICE)
    add("RemoveRestriction", "missing-id", missing_id, INVALID, "MISSING_RESTRICTION_ID")
    for kind, rid in (("unknown-id", "r999"), ("10k-char-id", LONG), ("unicode-id", "ｒ1")):
        remove = rpb.RemoveRestrictionRequest(scope=ALICE, restriction_id=rid)
        add("RemoveRestriction", kind, remove, NOT_FOUND, "RESTRICTION_NOT_FOUND")
    other = remove_restriction(TEAM)
    add("RemoveRestriction", "id-of-another-scope", other, NOT_FOUND, "RESTRICTION_NOT_FOUND")

    # Presentation: a language the runtime does not serve is a fact of the deployment, not of
    # the request's form, hence FAILED_PRECONDITION (as the proto documents).
    for kind, language in LANGUAGES:
        presentation: tuple[tuple[str, Any], ...] = (
            ("GetWireSchemas", ppb.GetWireSchemasRequest(scope=CODER, language=language)),
            ("GetSystemPrompt", ppb.GetSystemPromptRequest(scope=CODER, language=language)),
            ("GetSdk", ppb.GetSdkRequest(scope=CODER, language=language)),
        )
        for rpc, request in presentation:
            add(rpc, kind, request, PRECONDITION, "RUNTIME_LANGUAGE_NOT_CONFIGURED")

    # Execution (ALICE's calls are recorded: only a refused request leaves history alone).
    no_id = execute(agent=ALICE, call_id="")
    add("ExecuteToolCall", "missing-call-id", no_id, INVALID, "MISSING_CALL_ID")
    no_tool = execute(agent=ALICE, tool_name="")
    add("ExecuteToolCall", "missing-tool-name", no_tool, INVALID, "MISSING_TOOL_NAME")
    for kind, text in BAD_JSON:
        arguments = execute(agent=ALICE, arguments_json=text)
        add("ExecuteToolCall", f"arguments-{kind}", arguments, INVALID, "INVALID_JSON")

    # History.
    for kind, after in (("negative-after-seq", -1), ("min-int64-after-seq", -(2**63))):
        watch = rpb.WatchHistoryRequest(agent=ALICE, after_seq=after)
        add("WatchHistory", kind, watch, INVALID, "INVALID_AFTER_SEQ")
    # No record has a seq <= 0: asking for one is asking for a record that does not exist.
    for kind, seq in (
        ("seq-0", 0),
        ("seq-negative", -1),
        ("seq-min-int64", -(2**63)),
        ("seq-max-int64", 2**63 - 1),
        ("seq-unknown", 999),
    ):
        record = rpb.GetRecordContentRequest(agent=ALICE, seq=seq)
        add("GetRecordContent", kind, record, NOT_FOUND, "RECORD_NOT_FOUND")

    # Provider streams: the first message must be `open`; only register/result follow it.
    register = rpb.ConnectRequest(register=rpb.RegisterTools(request_id="r"))
    result = rpb.ConnectRequest(result=rpb.InvocationResult(invocation_id="inv-1"))
    unopened: list[tuple[str, tuple[rpb.ConnectRequest, ...]]] = [
        ("no-messages", ()),
        ("register-first", (register,)),
        ("result-first", (result,)),
        ("empty-message-first", (rpb.ConnectRequest(),)),
    ]
    for kind, messages in unopened:
        add("Connect", kind, connect(*messages), INVALID, "STREAM_NOT_OPENED")
    twice = connect(OPEN_PROVIDER, OPEN_PROVIDER)
    add("Connect", "open-twice", twice, INVALID, "UNEXPECTED_MESSAGE")
    empty = connect(OPEN_PROVIDER, rpb.ConnectRequest())
    add("Connect", "empty-message-after-open", empty, INVALID, "UNEXPECTED_MESSAGE")

    # Approver streams: the same rule, and only ALLOWED_ONCE or REJECTED are answers.
    unopened_approver: list[tuple[str, tuple[rpb.ApproveRequest, ...]]] = [
        ("no-messages", ()),
        ("decision-first", (decision(1),)),
        ("empty-message-first", (rpb.ApproveRequest(),)),
    ]
    for kind, approver_messages in unopened_approver:
        add("Approve", kind, approve(*approver_messages), INVALID, "STREAM_NOT_OPENED")
    twice = approve(OPEN_APPROVER, OPEN_APPROVER)
    add("Approve", "open-twice", twice, INVALID, "UNEXPECTED_MESSAGE")
    empty = approve(OPEN_APPROVER, rpb.ApproveRequest())
    add("Approve", "empty-message-after-open", empty, INVALID, "UNEXPECTED_MESSAGE")
    for kind, outcome in (
        ("unspecified", 0),
        ("cancelled", 3),
        ("unavailable", 4),
        ("unknown-99", 99),
        ("unknown-negative", -1),
    ):
        answer = approve(OPEN_APPROVER, decision(outcome))
        add("Approve", f"outcome-{kind}", answer, INVALID, "INVALID_DECISION")
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_bad_request_is_refused_clearly_and_changes_nothing(world: World, case: Case) -> None:
    before = await settled(world)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(case.send(world), HANG_S)
    except TimeoutError:
        pytest.fail(f"{case.rpc} hung on {case.kind} input")
    assert_clear(caught.value, case.code, case.reason)
    assert await settled(world, before) == before


# -- registrations: refused in the acknowledgement; the stream stays open -------------------


def _tool(**fields: Any) -> tool_pb2.Tool:
    return tool_pb2.Tool(**{"name": "fresh", **fields})


REGISTRATIONS: list[tuple[str, dict[str, Any], grpc.StatusCode, str]] = [
    *[
        (f"scope-{k}", {"scope": s, "tools": [_tool()]}, INVALID, "INVALID_RESOURCE_NAME")
        for k, s in SCOPES
    ],
    *[(f"scope-{k}", {"scope": s, "tools": [_tool()]}, NOT_FOUND, r) for k, s, r in UNKNOWN_SCOPES],
    ("name-empty", {"tools": [_tool(name="")]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-space", {"tools": [_tool(name="a b")]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-tab", {"tools": [_tool(name="a\tb")]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-trailing-newline", {"tools": [_tool(name="fresh\n")]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-nul", {"tools": [_tool(name="fresh\x00")]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-ideographic-space", {"tools": [_tool(name="a\u3000b")]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-129-chars", {"tools": [_tool(name="t" * 129)]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-10k-chars", {"tools": [_tool(name=LONG)]}, INVALID, "INVALID_TOOL_NAME"),
    ("name-run_code", {"tools": [_tool(name="run_code")]}, INVALID, "RESERVED_TOOL_NAME"),
    *[
        (f"input-schema-{k}", {"tools": [_tool(input_schema_json=t)]}, INVALID, "INVALID_JSON")
        for k, t in BAD_JSON
    ],
    (
        "output-schema-unterminated",
        {"tools": [_tool(output_schema_json="{")]},
        INVALID,
        "INVALID_JSON",
    ),
    ("input-schema-array", {"tools": [_tool(input_schema_json="[]")]}, INVALID, "INVALID_SCHEMA"),
    (
        "input-schema-string-root",
        {"tools": [_tool(input_schema_json='{"type":"string"}')]},
        INVALID,
        "INVALID_SCHEMA",
    ),
    (
        "input-schema-bad-ref",
        {"tools": [_tool(input_schema_json='{"$ref":"#/nowhere"}')]},
        INVALID,
        "INVALID_SCHEMA",
    ),
    # Atomic: the valid first tool is not registered either.
    ("second-tool-invalid", {"tools": [_tool(), _tool(name="a b")]}, INVALID, "INVALID_TOOL_NAME"),
    ("duplicate-in-batch", {"tools": [_tool(), _tool()]}, EXISTS, "TOOL_ALREADY_REGISTERED"),
    ("already-registered", {"tools": [_tool(name="echo")]}, EXISTS, "TOOL_ALREADY_REGISTERED"),
]


# Both conflicts share a reason; the message tells them apart.
MESSAGE_SAYS = {
    "duplicate-in-batch": 'tool "fresh" is named twice in this registration',
    "already-registered": 'tool "echo" is already registered',
}


@pytest.mark.parametrize(
    ("kind", "fields", "code", "reason"),
    REGISTRATIONS,
    ids=[f"RegisterTools:{r[0]}:{r[2].name}" for r in REGISTRATIONS],
)
async def test_bad_registration_is_refused_clearly_and_changes_nothing(
    world: World, kind: str, fields: dict[str, Any], code: grpc.StatusCode, reason: str
) -> None:
    await settled(world)
    call = world.stub.Connect()
    try:
        await call.write(OPEN_PROVIDER)
        assert (await call.read()).WhichOneof("message") == "opened"
        before = await snapshot(world)  # with this provider open
        await call.write(rpb.ConnectRequest(register=rpb.RegisterTools(request_id="r", **fields)))
        reply = await asyncio.wait_for(call.read(), HANG_S)
        ack = reply.registered
        assert ack.request_id == "r"
        assert ack.status.code == code.value[0], ack.status.message
        info = error_info(ack.status)
        assert info is not None and info.domain == "codemode.registry"
        assert info.reason == reason, ack.status.message
        assert MESSAGE_SAYS.get(kind, "") in ack.status.message
        assert await snapshot(world) == before
    finally:
        call.cancel()


# -- refused while busy, and tolerated on purpose ----------------------------------------


async def test_busy_call_id_is_refused_and_changes_nothing(world: World) -> None:
    """A second call with the id of one still running (ALREADY_EXISTS) leaves the first alone."""
    release = asyncio.Event()

    async def gate(_invocation: Any) -> Any:
        await release.wait()
        return "released"

    definition = world.harness.registry.register_tool("gate", gate)
    try:
        running = world.stub.ExecuteToolCall(
            rpb.ExecuteToolCallRequest(call_id="busy", tool_name="gate")
        )
        assert (await running.read()).WhichOneof("event") == "started"
        before = await settled(world)
        busy = world.stub.ExecuteToolCall(execute(call_id="busy", tool_name="gate"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(drain(busy), HANG_S)
        assert_clear(caught.value, EXISTS, "CALL_IN_PROGRESS")
        assert await settled(world, before) == before
        release.set()
        while (last := await asyncio.wait_for(running.read(), HANG_S)).WhichOneof("event") != (
            "result"
        ):
            pass
        assert last.result.value_json == '"released"'
    finally:
        release.set()
        world.harness.registry.catalog.unregister("", definition)


@pytest.mark.parametrize(
    ("arguments", "tool", "code"),
    [
        ("[1]", "echo", "INVALID_ARGS"),
        ("1", "echo", "INVALID_ARGS"),
        ('"text"', "echo", "INVALID_ARGS"),
        ("null", "echo", "INVALID_ARGS"),
        ("{}", "ghost", "UNKNOWN_TOOL"),
        ("{}", LONG, "UNKNOWN_TOOL"),
    ],
    ids=["array", "number", "string", "null", "unknown-tool", "10k-char-tool"],
)
async def test_tool_failures_are_results_not_rpc_errors(
    world: World, arguments: str, tool: str, code: str
) -> None:
    """Lossless JSON that the tool refuses, or a tool the scope lacks, is the model's mistake:
    it fails as a tool result (for an agent it is recorded), not as an RPC error. In the
    global scope nothing is recorded, so nothing changes."""
    before = await settled(world)
    messages = await asyncio.wait_for(
        drain(world.stub.ExecuteToolCall(execute(tool_name=tool, arguments_json=arguments))), HANG_S
    )
    result = messages[-1].result
    assert result.is_error and result.error.code == code, result.error.message
    assert await settled(world, before) == before


@pytest.mark.parametrize(
    "send",
    [
        lambda w: w.stub.ListPresets(rpb.ListPresetsRequest(page_size=2**31 - 1)),
        lambda w: w.stub.ListAgents(rpb.ListAgentsRequest(page_size=2**31 - 1)),
        lambda w: w.stub.ListHistory(rpb.ListHistoryRequest(agent=ALICE, page_size=2**31 - 1)),
        # Native scopes consult no runtime language.
        lambda w: w.stub.GetSdk(ppb.GetSdkRequest(scope=ALICE, language="cobol")),
    ],
    ids=[
        "ListPresets:huge-page-size",
        "ListAgents:huge-page-size",
        "ListHistory:huge-page-size",
        "GetSdk:native-scope-ignores-language",
    ],
)
async def test_documented_coercions_succeed_and_change_nothing(world: World, send: Send) -> None:
    before = await settled(world)
    await asyncio.wait_for(send(world), HANG_S)
    assert await settled(world, before) == before


async def test_late_provider_result_and_late_decision_are_ignored(world: World) -> None:
    """A result for an invocation that is gone, or an answer to a closed approval request, is
    the normal end of a race (the caller went away first): ignored, and the stream goes on."""
    before = await settled(world)
    provider = world.stub.Connect()
    approver = world.stub.Approve()
    try:
        await provider.write(OPEN_PROVIDER)
        await provider.write(rpb.ConnectRequest(result=rpb.InvocationResult(invocation_id="x")))
        # An ack (of a refused registration) shows the stream went on past the late result.
        await provider.write(
            rpb.ConnectRequest(register=rpb.RegisterTools(request_id="after", scope="foo/x"))
        )
        replies = [await asyncio.wait_for(provider.read(), HANG_S) for _ in range(2)]
        assert replies[1].registered.request_id == "after"
        await approver.write(OPEN_APPROVER)
        await approver.write(decision(1, "approval-999"))
        await approver.write(decision(0))  # only this one is refused
        assert (await approver.read()).WhichOneof("message") == "opened"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(approver.read(), HANG_S)
        assert_clear(caught.value, INVALID, "INVALID_DECISION")
    finally:
        provider.cancel()
        approver.cancel()
    assert await settled(world, before) == before
