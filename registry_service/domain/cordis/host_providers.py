"""The host Inspect Providers of this product: the façade's builtins with their
signatures in the owner's program language (Python or TypeScript), the events a plugin may
observe, the owner's visible tools, and the services the owner's plugins provide (plus the
built-in `timer`)."""

from __future__ import annotations

from collections.abc import Callable

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.cordis.inspect import Method, Provider
from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.plugin_hosts import ServiceSpec
from registry_service.domain.tools import ToolDefinition
from registry_service.history import records

# (name, signature, description): what a Python host half can reach, and nothing else.
BUILTINS: tuple[tuple[str, str, str], ...] = (
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
        "harness.register_tool(tool: ToolDefinition) -> None",
        "Registers a tool made by harness.define_tool into the owning agent's scope until the "
        "plugin stops; its calls go through the registry's policy pipeline.",
    ),
    (
        "harness.handle",
        "harness.handle(method: str, fn: Callable[[JsonValue], Awaitable[JsonValue]]) -> None",
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
        "on stop.",
    ),
)

# The same façade in a TypeScript host half: the Python names in camelCase, options objects for
# keyword arguments, undefined for None (runtime_service/worker_ts/plugin_harness.js).
TYPESCRIPT_BUILTINS: tuple[tuple[str, str, str], ...] = (
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
        "ctx.timer.timeout(fn, ms) / ctx.timer.interval(fn, ms): () => void",
        "The built-in timer service, only when inject lists 'timer'; every timer is disposed "
        "on stop (the global setTimeout family is a trap in a host half).",
    ),
    (
        "console",
        "console.log / info / warn / error / debug(...args): void",
        "One log line each, tagged [cordis:<pluginId>].",
    ),
)
BUILTINS_BY_LANGUAGE = {"python": BUILTINS, "typescript": TYPESCRIPT_BUILTINS}

# What `ctx.on` may observe: the owner's history records as they are written, and the plugin's
# own lifecycle. `cordis/*` events stay hidden.
EVENTS: tuple[tuple[str, str], ...] = (
    (records.TOOL_CALL, "The owning agent's model-direct tool call started (name, arguments)."),
    (records.TOOL_RESULT, "The owning agent's model-direct tool call ended (content, error)."),
    (records.DISPATCH_START, "A run_code program of the owning agent called a tool."),
    (records.DISPATCH, "A run_code program's nested tool call settled."),
    ("plugin/dispose", "This plugin is being stopped (before its effects are disposed)."),
)

TIMER_METHODS = ("timeout", "interval", "setTimeout", "setInterval", "throttle", "debounce")

_OPTIONAL_NAME: dict[str, JsonValue] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}


def _named_input(key: str) -> JsonValue:
    return {
        "type": "object",
        "properties": {key: {"type": "string"}},
        "additionalProperties": False,
    }


_ANY: JsonValue = {}


def host_providers(
    visible_tools: Callable[[str], list[ToolDefinition]],
    provided_services: Callable[[str], list[tuple[str, str, ServiceSpec | None]]],
    language_for: Callable[[str], str] = lambda _owner: "python",
) -> list[Provider]:
    """`visible_tools(owner)`: what the owner sees (run_code excluded);
    `provided_services(owner)`: (service, providing plugin id, contract) of the owner's running
    plugins; `language_for(owner)`: the owner's program language, its host halves'."""

    async def list_builtins(_input: JsonValue, owner: str) -> JsonValue:
        builtins = BUILTINS_BY_LANGUAGE.get(language_for(owner), BUILTINS)
        return {"builtins": [{"name": n, "signature": s, "description": d} for n, s, d in builtins]}

    async def list_tools(input_value: JsonValue, owner: str) -> JsonValue:
        wanted = input_value.get("tool") if isinstance(input_value, dict) else None
        rows: list[JsonValue] = []
        for defn in visible_tools(owner):
            if wanted is not None and defn.name != wanted:
                continue
            rows.append(
                {
                    "name": defn.name,
                    "description": defn.description,
                    "inputSchema": defn.input_schema,
                    "outputSchema": defn.output_schema,
                }
            )
        if wanted is not None and not rows:
            raise CordisError(f'no visible tool "{wanted}"', "not-found")
        return {"tools": rows}

    async def list_service(input_value: JsonValue, owner: str) -> JsonValue:
        services: dict[str, dict[str, JsonValue]] = {
            "timer": {
                "name": "timer",
                "providedBy": "builtin",
                "methods": list(TIMER_METHODS),
                "description": "Timeouts, intervals, throttle and debounce (inject: ['timer']).",
            }
        }
        for name, plugin_id, contract in provided_services(owner):
            entry: dict[str, JsonValue] = {
                "name": name,
                "providedBy": plugin_id,
                "description": f"Provided by dynamic plugin {plugin_id} while it runs.",
            }
            if contract is not None and contract.data_json:
                entry["kind"] = "data"  # ctx.<name> is a copy of the value
            elif contract is not None:
                entry["kind"] = "methods"  # `await ctx.<name>.<method>(*args)`, JSON in and out
                entry["methods"] = list(contract.methods)
            services.setdefault(name, entry)
        wanted = input_value.get("service") if isinstance(input_value, dict) else None
        if wanted is None:
            return {
                "services": [
                    {"name": s["name"], "providedBy": s["providedBy"]} for s in services.values()
                ]
            }
        if not isinstance(wanted, str) or wanted not in services:
            raise CordisError(f'no service "{wanted}"', "not-found")
        return {"service": services[wanted]}

    async def list_events(input_value: JsonValue, _owner: str) -> JsonValue:
        wanted = input_value.get("event") if isinstance(input_value, dict) else None
        if wanted is None:
            return {"events": [{"name": n, "description": d} for n, d in EVENTS]}
        for name, description in EVENTS:
            if name == wanted:
                return {"event": {"name": name, "description": description}}
        raise CordisError(f'no observable event "{wanted}"', "not-found")

    return [
        Provider(
            "Service",
            "Services a plugin may inject: the built-in timer and those the owning agent's "
            "running plugins provide.",
            (
                Method(
                    "listService",
                    "Without input: the compact directory; with `service`: its contract.",
                    _named_input("service"),
                    _ANY,
                    list_service,
                ),
            ),
        ),
        Provider(
            "Event",
            "Events a plugin may observe with ctx.on / ctx.once.",
            (
                Method(
                    "listEvents",
                    "Without input: every observable event; with `event`: that one.",
                    _named_input("event"),
                    _ANY,
                    list_events,
                ),
            ),
        ),
        Provider(
            "Builtin",
            "The symbols a host half can use (its façade), with signatures.",
            (
                Method(
                    "listBuiltins",
                    "Every façade symbol with its signature in the agent's program language.",
                    dict(_OPTIONAL_NAME),
                    {
                        "type": "object",
                        "properties": {"builtins": {"type": "array"}},
                        "required": ["builtins"],
                    },
                    list_builtins,
                ),
            ),
        ),
        Provider(
            "Tool",
            "Schemas of the tools visible to the requesting agent.",
            (
                Method(
                    "listTools",
                    "Every visible tool's schemas; with `tool`: only that one.",
                    _named_input("tool"),
                    {
                        "type": "object",
                        "properties": {"tools": {"type": "array"}},
                        "required": ["tools"],
                    },
                    list_tools,
                ),
            ),
        ),
    ]
