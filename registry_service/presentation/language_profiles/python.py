"""Python: how the registry presents and checks a program in Python.

Programs and host halves are bodies of an async function; the SDK is a typed stub
(`registry_service/presentation/sdk_python.py`); the host façade is the Python plugin harness's
(`runtime_service/worker/plugin_harness.py`).
"""

from __future__ import annotations

from typing import Final

from registry_service.domain.cordis.host_languages import Facade
from registry_service.domain.cordis.prompt import HostHalfGuidance
from registry_service.presentation.language_profiles.profile import LanguageProfile, RunCodeFlavour
from registry_service.presentation.sdk_python import render_python_sdk

# Model-facing text is observable behaviour: kept verbatim.
_RUN_CODE: Final = RunCodeFlavour(
    description=(
        "Execute a Python program against the available tools. Takes two required "
        "arguments: `code`, the BODY of an async function (top-level `await` and `return` "
        "work), and `description`, a short summary of what the program does. Call tools as "
        "`await tools.name(args)` per the declarations in the system prompt. Use "
        "`print(...)` and/or `return <value>` for program output — curate it. Image-bearing "
        "subtool results are attached after the run."
    ),
    code_parameter="The program: the body of an async Python function.",
)

_HOST_HALF: Final = HostHalfGuidance(
    opening="""\
The Host half is the body of a Python async function (no imports of the registry, no \
network, no files outside its temporary directory) that returns the plugin: an async \
function `apply(ctx)` or an object with an `apply(ctx)` method and optionally `inject`, the \
services it needs. Tools are made with harness.define_tool(...) and registered with \
harness.register_tool(tool)""",
    closing="""\
...) (disposers run in reverse order when the plugin stops); timers come from the `timer` \
service and only when `inject` lists it.""",
)

# (name, signature, description): what a Python host half can reach, and nothing else.
_FACADE: Facade = (
    (
        "harness.define_tool",
        "harness.define_tool(*, name: str, description: str, parameters: dict, "
        "execute: Callable[[dict], Awaitable[JsonValue]], output_schema: dict | None = None, "
        "presentation_meta: Callable[[dict, JsonValue], dict] | None = None) -> ToolDefinition",
        "Defines a dynamic tool; parameters and results must be lossless JSON. Only its "
        "result may be registered. presentation_meta(args, result) gives each call's card "
        "metadata (never shown to the model).",
    ),
    (
        "harness.register_tool",
        "harness.register_tool(tool: ToolDefinition) -> Callable[[], None]",
        "Registers a tool made by harness.define_tool into the owning agent's scope until the "
        "plugin stops (or the returned function is called); its calls go through the "
        "registry's policy pipeline.",
    ),
    (
        "harness.handle",
        "harness.handle(method: str, fn: Callable[[JsonValue], Awaitable[JsonValue]]) -> "
        "Callable[[], None]",
        "Answers calls from the plugin's client half (host.call) for the current run.",
    ),
    (
        "ctx.tools.schemas",
        "ctx.tools.schemas() -> list[dict]",
        "Schemas of the tools the owning agent can see (read-only; nothing executes).",
    ),
    (
        "ctx.tools.get",
        "ctx.tools.get(name: str) -> dict | None",
        "One visible tool's schema view, or None; never an executable definition.",
    ),
    (
        "ctx.tools.register",
        "ctx.tools.register(tool: ToolDefinition) -> Callable[[], None]",
        "The same as harness.register_tool.",
    ),
    (
        "ctx.get",
        "ctx.get(name: str) -> object | None",
        "Optional lookup of a service by name, without declaring it in inject.",
    ),
    (
        "ctx.effect",
        "ctx.effect(fn: Callable[[], Callable[[], None] | None]) -> None",
        "Runs fn now; its returned disposer runs on stop, in reverse order of registration.",
    ),
    (
        "ctx.on",
        "ctx.on(event: str, listener: Callable[[dict], Awaitable[None] | None]) -> "
        "Callable[[], None]",
        "Observes an event (see Event.listEvents) until the plugin stops or the returned "
        "function is called.",
    ),
    (
        "ctx.once",
        "ctx.once(event: str, listener: Callable[[dict], Awaitable[None] | None]) -> "
        "Callable[[], None]",
        "Like ctx.on, for the next occurrence only.",
    ),
    (
        "ctx.provide",
        "ctx.provide(name: str, service: JsonValue | object) -> None",
        "Provides a named service to the owning agent's other plugins while this one runs: "
        "lossless JSON data (consumers read a copy) or an object/dict whose public methods "
        "consumers call as `await ctx.<name>.<method>(*args)` (JSON in and out; the calls "
        "cross processes through the registry).",
    ),
    (
        "inject",
        "inject: list[str]  # attribute of the returned plugin object",
        "Services the plugin needs; it parks as waiting until every one exists, and reaches "
        "them as attributes of ctx (ctx.timer).",
    ),
    (
        "timer",
        "ctx.timer.timeout(fn, ms) / interval(fn, ms) / throttle(fn, ms) / debounce(fn, ms)",
        "The built-in timer service, only when inject lists 'timer'; every timer is disposed "
        "on stop. throttle and debounce return the function to call.",
    ),
    (
        "print",
        "print(*args, sep: str = ' ', end: str = '\\n') -> None",
        "One log line each, tagged [cordis:<pluginId>].",
    ),
)


PROFILE: Final = LanguageProfile(
    name="python",
    title="Python",
    render_sdk=render_python_sdk,
    run_code=_RUN_CODE,
    cordis_host_half=_HOST_HALF,
    facade=_FACADE,
)
