"""TypeScript: how the registry presents and checks a program in TypeScript.

Programs and host halves are bodies of an async function, type-stripped (erasable syntax only)
before they run; the SDK is a set of declarations
(`registry_service/presentation/sdk_typescript.py`); the host façade is the Node plugin
harness's (`runtime_service/worker_ts/plugin_harness.js`).
"""

from __future__ import annotations

from typing import Final

from registry_service.domain.cordis.host_languages import Facade
from registry_service.domain.cordis.prompt import HostHalfGuidance
from registry_service.presentation.language_profiles.profile import LanguageProfile, RunCodeFlavour
from registry_service.presentation.sdk_typescript import render_typescript_sdk

# Model-facing text is observable behaviour: kept verbatim.
_RUN_CODE: Final = RunCodeFlavour(
    description=(
        "Execute a TypeScript program against the available tools. Takes two required "
        "arguments: `code`, the BODY of an async function (erasable syntax only; top-level "
        "`await` and `return` work), and `description`, a short summary of what the program "
        "does. Call tools as `await tools.name(args)` per the declarations in the system "
        "prompt. Only what you print or return is program output — curate it. Image-bearing "
        "subtool results are attached after the run."
    ),
    code_parameter="The program: the body of an async TypeScript function.",
)

_HOST_HALF: Final = HostHalfGuidance(
    opening="""\
The Host half is the body of a TypeScript async function (types are stripped, not checked; \
no imports or require, no network, no files outside its temporary directory) that returns \
the plugin: a function `(ctx) => ...` or an object with an `apply(ctx)` method and \
optionally `inject`, the services it needs. Tools are made with \
harness.defineTool({ name, description, parameters, execute }) and registered with \
harness.registerTool(tool)""",
    closing="""\
() => dispose) (disposers run in reverse order when the plugin stops); timers come from the \
`timer` service (ctx.timer.timeout / interval) and only when `inject` lists it.""",
)

# The Python façade in TypeScript spelling: camelCase names, options objects for keyword
# arguments, undefined for None (runtime_service/worker_ts/plugin_harness.js).
_FACADE: Facade = (
    (
        "harness.defineTool",
        "harness.defineTool(options: { name: string; description?: string; parameters?: "
        "JsonSchema; execute(args: any, call: { signal: AbortSignal }): Json | Promise<Json>; "
        "outputSchema?: JsonSchema; presentationMeta?(args: any, result: Json): object }): "
        "ToolDefinition",
        "Defines a dynamic tool; parameters and results must be lossless JSON (a BigInt for an "
        "integer beyond 2^53). Only its result may be registered. `signal` aborts when the call "
        "is cancelled. presentationMeta(args, result) gives each call's card metadata (never "
        "shown to the model).",
    ),
    (
        "harness.registerTool",
        "harness.registerTool(tool: ToolDefinition): () => void",
        "Registers a tool made by harness.defineTool into the owning agent's scope until the "
        "plugin stops (or the returned function is called); its calls go through the "
        "registry's policy pipeline.",
    ),
    (
        "harness.handle",
        "harness.handle(method: string, fn: (args: any) => Json | Promise<Json>): () => void",
        "Answers calls from the plugin's client half (host.call) for the current run.",
    ),
    (
        "ctx.tools.schemas",
        "ctx.tools.schemas(): object[]",
        "Schemas of the tools the owning agent can see (read-only; nothing executes).",
    ),
    (
        "ctx.tools.get",
        "ctx.tools.get(name: string): object | undefined",
        "One visible tool's schema view, or undefined; never an executable definition.",
    ),
    (
        "ctx.tools.register",
        "ctx.tools.register(tool: ToolDefinition): () => void",
        "The same as harness.registerTool.",
    ),
    (
        "ctx.get",
        "ctx.get(name: string): unknown",
        "Optional lookup of a service by name, without declaring it in inject (undefined "
        "when none).",
    ),
    (
        "ctx.effect",
        "ctx.effect(fn: () => (() => void) | void): void",
        "Runs fn now; its returned disposer runs on stop, in reverse order of registration.",
    ),
    (
        "ctx.on",
        "ctx.on(event: string, listener: (payload: any) => void | Promise<void>): () => void",
        "Observes an event (see Event.listEvents) until the plugin stops or the returned "
        "function is called.",
    ),
    (
        "ctx.once",
        "ctx.once(event: string, listener: (payload: any) => void | Promise<void>): () => void",
        "Like ctx.on, for the next occurrence only.",
    ),
    (
        "ctx.provide",
        "ctx.provide(name: string, service: Json | object): void",
        "Provides a named service to the owning agent's other plugins while this one runs: "
        "lossless JSON data (consumers read a copy) or an object whose public methods "
        "consumers call as `await ctx.<name>.<method>(...args)` (JSON in and out; the calls "
        "cross processes through the registry).",
    ),
    (
        "inject",
        "inject: string[]  // a property of the returned plugin function or object",
        "Services the plugin needs; it parks as waiting until every one exists, and reaches "
        "them as properties of ctx (ctx.timer).",
    ),
    (
        "timer",
        "ctx.timer.timeout(fn, ms) / ctx.timer.interval(fn, ms): () => void; "
        "ctx.timer.throttle(fn, ms) / ctx.timer.debounce(fn, ms): (...args) => void",
        "The built-in timer service, only when inject lists 'timer'; every timer is disposed "
        "on stop (the global setTimeout family is a trap in a host half).",
    ),
    (
        "console",
        "console.log / info / warn / error / debug(...args): void",
        "One log line each, tagged [cordis:<pluginId>].",
    ),
)

PROFILE: Final = LanguageProfile(
    name="typescript",
    title="TypeScript",
    render_sdk=render_typescript_sdk,
    run_code=_RUN_CODE,
    cordis_host_half=_HOST_HALF,
    facade=_FACADE,
)
