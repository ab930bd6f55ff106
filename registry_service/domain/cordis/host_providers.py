"""The host Inspect Providers of this product: the façade's builtins with their signatures in
the owner's program language (its language profile's), the events a plugin may observe, the
owner's visible tools, and the services the owner's plugins provide (plus the built-in
`timer`)."""

from __future__ import annotations

from collections.abc import Callable

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain import records
from registry_service.domain.cordis.host_languages import Facade
from registry_service.domain.cordis.inspect import Method, Provider
from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.plugin_hosts import ServiceSpec
from registry_service.domain.tools import ToolDefinition

# What `ctx.on` may observe: the owner's history records as they are written, and the plugin's
# own lifecycle. `cordis/*` events stay hidden as in the original.
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
    facade_for: Callable[[str], Facade],
) -> list[Provider]:
    """`visible_tools(owner)`: what the owner sees (run_code excluded);
    `provided_services(owner)`: (service, providing plugin id, contract) of the owner's running
    plugins; `facade_for(owner)`: the façade of the owner's program language, its host
    halves'."""

    async def list_builtins(_input: JsonValue, owner: str) -> JsonValue:
        builtins = facade_for(owner)
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
