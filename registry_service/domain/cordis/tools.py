"""The seven Cordis model tools (docs/cordis.md) as registry tools: ordinary catalog entries,
run through the same pipeline as every other tool (rules, approvals, guards, around hooks,
post-execute), visible only where self-modification is in force."""

from __future__ import annotations

from typing import cast

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.cordis.inspect import InspectRegistry
from registry_service.domain.cordis.names import (
    DEFINE,
    INSPECT_LIST,
    INSPECT_QUERY,
    INSPECT_SELF,
    RUN,
    STOP,
    UNDEFINE,
)
from registry_service.domain.cordis.refusals import CordisError, require_agent
from registry_service.domain.cordis.runner import CordisRunner
from registry_service.domain.results import TextBlock, ToolResult
from registry_service.domain.tools import Invocation, ToolBody, ToolDefinition

_STRING: JsonValue = {"type": "string"}


def _object(
    properties: dict[str, JsonValue], required: tuple[str, ...] = ()
) -> dict[str, JsonValue]:
    schema: dict[str, JsonValue] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


def _described(description: str, schema: JsonValue = _STRING) -> JsonValue:
    return {**cast("dict[str, JsonValue]", schema), "description": description}


def _text(value: dict[str, JsonValue], text: str, meta_keys: tuple[str, ...] = ()) -> ToolResult:
    """The tool's value and text; `meta_keys` of the value are its presentation metadata."""
    meta: dict[str, JsonValue] | None = {k: value[k] for k in meta_keys} if meta_keys else None
    return ToolResult(
        content=(TextBlock(text),), value=value, has_value=True, presentation_meta=meta
    )


def cordis_tools(runner: CordisRunner, inspect: InspectRegistry) -> list[ToolDefinition]:
    async def inspect_list(inv: Invocation) -> JsonValue:
        agent = require_agent(inv.agent)
        return {"providers": inspect.list(agent)}

    async def inspect_query(inv: Invocation) -> JsonValue:
        agent = require_agent(inv.agent)
        args = cast("dict[str, JsonValue]", inv.arguments)
        platform, provider, method = (
            cast(str, args["platform"]),
            cast(str, args["provider"]),
            cast(str, args["method"]),
        )
        data = await inspect.query(
            platform,
            provider,
            method,
            input_value=args.get("input"),
            owner=agent,
            signal=inv.signal,
            deadline=inv.deadline,
        )
        return {"platform": platform, "provider": provider, "method": method, "data": data}

    async def inspect_self(inv: Invocation) -> JsonValue:
        agent = require_agent(inv.agent)
        args = cast("dict[str, JsonValue]", inv.arguments)
        plugin_id, package_id = args.get("pluginId"), args.get("packageId")
        if package_id is not None and plugin_id is None:
            raise CordisError("cordis_inspect_self packageId requires pluginId", "invalid-args")
        if plugin_id is None:
            return {"mode": "plugins", "plugins": runner.list_summaries(agent)}
        if package_id is None:
            return runner.inspect_plugin(agent, cast(str, plugin_id))
        return runner.inspect_package(agent, cast(str, plugin_id), cast(str, package_id))

    async def define(inv: Invocation) -> ToolResult:
        agent = require_agent(inv.agent)
        args = cast("dict[str, JsonValue]", inv.arguments)
        receipt = await runner.define(
            agent,
            cast("dict[str, JsonValue]", args["plugin"]),
            cast(str, args["name"]),
            cast(str, args["purpose"]),
            cast("dict[str, JsonValue]", args["code"]),
        )
        return _text(
            receipt,
            f"Defined {receipt['pluginId']}/{receipt['packageId']} ({receipt['name']}); it is "
            "not running yet. Use cordis_run to activate this Package.",
            ("pluginId", "packageId"),
        )

    async def run(inv: Invocation) -> ToolResult:
        agent = require_agent(inv.agent)
        args = cast("dict[str, JsonValue]", inv.arguments)
        out = await runner.run(
            agent,
            cast(str, args["pluginId"]),
            cast(str, args["packageId"]),
            cast(str, args["mode"]),
            inv.signal,
            principal=inv.principal,  # the host it starts acts as the caller
        )
        where = f"{out['pluginId']}/{out['packageId']}"
        status = out["status"]
        if status == "awaiting-approval":
            text = f"{where} is awaiting user approval ({out['pluginRunId']})."
        elif status == "starting":
            text = f"{where} is starting asynchronously ({out['pluginRunId']})."
        else:
            text = f"{where} is running ({out['pluginRunId']})."
        return _text(out, text, ("pluginId", "packageId", "pluginRunId"))

    async def stop(inv: Invocation) -> ToolResult:
        agent = require_agent(inv.agent)
        plugin_id = cast(str, cast("dict[str, JsonValue]", inv.arguments)["pluginId"])
        try:
            await runner.stop(agent, plugin_id)
        except CordisError as exc:
            if exc.reason != "not-running":  # stopping a stopped plugin is a success
                raise
        return _text(
            {"pluginId": plugin_id},
            f"Dynamic Plugin {plugin_id} is stopped; its definition and versions remain.",
        )

    async def undefine(inv: Invocation) -> ToolResult:
        agent = require_agent(inv.agent)
        plugin_id = cast(str, cast("dict[str, JsonValue]", inv.arguments)["pluginId"])
        out = await runner.undefine(agent, plugin_id)
        return _text(out, f"Removed dynamic Plugin {plugin_id} and all of its Packages.")

    plugin_id_param = _described("Stable Plugin ID returned by cordis_define.")
    return [
        _tool(
            INSPECT_LIST,
            "List every Cordis Inspect Provider currently known: the local Host Providers and "
            "the latest manifests synchronized from a Client page. Each entry includes its "
            "platform, purpose, read-only methods, and input/output schemas. Call this Tool "
            "before creating or modifying a Package, then select the provider and method for "
            "cordis_inspect_query from its result. Do not guess names or treat an Inspect "
            "method as a business Service that Plugin code can call.",
            _object({}),
            {},
            inspect_list,
        ),
        _tool(
            INSPECT_QUERY,
            "Run a read-only query explicitly declared by an Inspect Provider. platform, "
            "provider, and method must come from cordis_inspect_list, and input must satisfy "
            "that method's schema. Use this Tool before cordis_define to read exact Service "
            "contracts, Event names, Builtin signatures and Tool schemas. Host queries run "
            "locally. This Tool cannot invoke business Service methods or modify the runtime. "
            "For Service.listService and Event.listEvents, query without input to navigate the "
            "compact directory, then query the exact service or event.",
            _object(
                {
                    "platform": _described(
                        "Runtime platform that owns the Provider.",
                        {"type": "string", "enum": ["host", "client"]},
                    ),
                    "provider": _described("Exact Provider ID returned by cordis_inspect_list."),
                    "method": _described("Exact method name declared by the Provider manifest."),
                    "input": _described(
                        "Optional query input; it must satisfy the method input schema.", {}
                    ),
                },
                ("platform", "provider", "method"),
            ),
            {},
            inspect_query,
        ),
        _tool(
            INSPECT_SELF,
            "Inspect the dynamic Cordis objects you own at increasing levels of detail. With no "
            "IDs, list only Plugin summaries. With pluginId alone, return version pointers, the "
            "latest Run, and every Package summary. Only pluginId plus packageId returns that "
            "immutable Package's Host/Client source and runtime diagnostics. packageId cannot "
            "be supplied alone. Query an exact Package before handling @pluginId, repairing an "
            "asynchronous failure, or defining an updated version. This Tool is read-only: it "
            "neither executes code nor changes version pointers.",
            _object(
                {
                    "pluginId": _described(
                        "Stable Plugin ID returned by cordis_define or injected by @pluginId; "
                        "omit it to list every current Plugin."
                    ),
                    "packageId": _described(
                        "Exact immutable Package ID owned by pluginId; when specified, source "
                        "and diagnostics are returned."
                    ),
                }
            ),
            {},
            inspect_self,
        ),
        _tool(
            DEFINE,
            'Define an immutable Cordis Package. For a new Plugin, use kind:"new" and provide '
            "only a semantic prefix of 3–6 lowercase English letters; the registry returns the "
            'final pluginId and packageId. To modify an existing Plugin, use kind:"existing" '
            "with its exact pluginId to append a Package without overwriting older versions. "
            "Provide at least one of code.host and code.client. code.host is the body of a "
            "Python async function that returns the Host-half plugin; code.client is a plain "
            "JavaScript function body for the browser Client half. Query Inspect before "
            "depending on a Service, Event, Builtin or Tool. Define only validates parameters "
            "and syntax and records source: it does not request approval, run the plugin, or "
            "change currentPackageId. On success, call cordis_run with the returned IDs.",
            _object(
                {
                    "plugin": {
                        "oneOf": [
                            _object(
                                {
                                    "kind": {"type": "string", "const": "new"},
                                    "idPrefix": _described(
                                        "Suggested semantic prefix of 3–6 lowercase English "
                                        "letters; the registry adds a unique numeric suffix."
                                    ),
                                },
                                ("kind", "idPrefix"),
                            ),
                            _object(
                                {
                                    "kind": {"type": "string", "const": "existing"},
                                    "pluginId": _described(
                                        "Exact ID of an existing Plugin; the new Package is "
                                        "appended to that instance."
                                    ),
                                },
                                ("kind", "pluginId"),
                            ),
                        ]
                    },
                    "name": _described("Short, readable Package name."),
                    "purpose": _described(
                        "One-sentence, user-facing description of the Package purpose."
                    ),
                    "code": _object(
                        {
                            "host": _described(
                                "Body of a Python async function that returns the Host-half "
                                "plugin (a function apply(ctx) or an object with apply)."
                            ),
                            "client": _described(
                                "Plain JavaScript function body that returns the browser "
                                "Client-half plugin."
                            ),
                        }
                    ),
                },
                ("plugin", "name", "purpose", "code"),
            ),
            _object(
                {
                    "pluginId": _STRING,
                    "packageId": _STRING,
                    "name": _STRING,
                    "purpose": _STRING,
                    "hasHostHalf": {"type": "boolean"},
                    "hasClientHalf": {"type": "boolean"},
                },
                ("pluginId", "packageId", "name", "purpose", "hasHostHalf", "hasClientHalf"),
            ),
            define,
        ),
        _tool(
            RUN,
            'Activate one exact Package of a dynamic Plugin. Use mode:"run" for the first '
            "activation, restarting currentPackageId, or rollback. When current exists, use "
            'mode:"update" to switch to a different Package, even if the Plugin is currently '
            "stopped. A Host-only Package starts inside this call and returns running. "
            "currentPackageId changes only after complete success; on failure, the old current "
            "and target next remain. After a technical failure, read diagnostics with "
            "cordis_inspect_self, correct the same Plugin, and retry autonomously.",
            _object(
                {
                    "pluginId": plugin_id_param,
                    "packageId": _described(
                        "Exact immutable Package ID to activate under that Plugin."
                    ),
                    "mode": _described(
                        "Use run for the first activation, restarting current, or rollback; "
                        "use update to switch from current to a different Package.",
                        {"type": "string", "enum": ["run", "update"]},
                    ),
                },
                ("pluginId", "packageId", "mode"),
            ),
            {},
            run,
        ),
        _tool(
            STOP,
            "Stop the current Run of a dynamic Plugin and cancel unfinished activation "
            "requests. Retain the Plugin, every immutable Package, grants, currentPackageId, and "
            "nextPackageId so it can later run or update directly. Stopping an already stopped "
            "Plugin succeeds idempotently. Use this Tool to disable effects temporarily; use "
            "cordis_undefine for permanent removal.",
            _object({"pluginId": _described("Stable dynamic Plugin ID to stop.")}, ("pluginId",)),
            _object({"pluginId": _STRING}, ("pluginId",)),
            stop,
        ),
        _tool(
            UNDEFINE,
            "Permanently remove a dynamic Plugin you own. If it is running, first stop it, then "
            "delete every Package, grant, and version pointer. After this returns, its "
            "pluginId, packageIds and @ reference are invalid. Do not call this Tool when "
            "versions must remain available for restart or rollback; use cordis_stop instead.",
            _object(
                {"pluginId": _described("Stable dynamic Plugin ID to remove permanently.")},
                ("pluginId",),
            ),
            _object(
                {"pluginId": _STRING, "wasRunning": {"type": "boolean"}},
                ("pluginId", "wasRunning"),
            ),
            undefine,
        ),
    ]


def _tool(
    name: str,
    description: str,
    input_schema: JsonValue,
    output_schema: JsonValue,
    body: ToolBody,
) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        description=description,
        input_schema=input_schema,
        output_schema=output_schema,
        body=body,
        owner="cordis",
    )
