"""The registry composed: catalog, approvals, providers, executor and configured policy."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from codemode_common.jsonvalue import JsonValue
from registry_service.config import ConfigError, RegistrySettings
from registry_service.domain.approvals import ApprovalBroker
from registry_service.domain.catalog import Catalog
from registry_service.domain.execution import Executor, ToolCallFailure
from registry_service.domain.policy import RulesError, load_rules, rules_hook
from registry_service.domain.providers import ProviderHub
from registry_service.domain.scopes import GLOBAL
from registry_service.domain.tools import (
    RUN_CODE,
    Classifier,
    Invocation,
    ToolDefinition,
)

RUN_CODE_INPUT_SCHEMA: JsonValue = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "The program: the body of an async function."},
        "description": {
            "type": "string",
            "description": "Clear, concise description of what this program does, 5-10 words.",
        },
    },
    "required": ["code", "description"],
}
RUN_CODE_OUTPUT_SCHEMA: JsonValue = {
    "type": "object",
    "properties": {"logs": {"type": "array", "items": {"type": "string"}}, "result": {}},
    "required": ["logs"],
    "additionalProperties": False,
}


async def _no_runtime(invocation: Invocation) -> JsonValue:
    raise ToolCallFailure(
        "run_code requires a code runtime, and none is configured for this registry",
        "CODE_RUNTIME_UNAVAILABLE",
    )


@dataclass
class Registry:
    settings: RegistrySettings
    catalog: Catalog
    approvals: ApprovalBroker
    providers: ProviderHub
    executor: Executor

    def register_tool(
        self,
        name: str,
        body: Callable[[Invocation], Awaitable[JsonValue]],
        *,
        description: str = "",
        input_schema: JsonValue = None,
        output_schema: JsonValue = None,
        concurrency_safe: bool | Classifier = False,
        guidance: str = "",
        scope: str = GLOBAL,
    ) -> ToolDefinition:
        """Registers an in-process tool; it runs through the same pipeline as remote ones."""
        classifier: Classifier | None
        if callable(concurrency_safe):
            classifier = concurrency_safe
        else:
            classifier = (lambda _a: True) if concurrency_safe else None
        defn = ToolDefinition(
            name=name,
            description=description,
            input_schema=input_schema if input_schema is not None else {"type": "object"},
            output_schema=output_schema if output_schema is not None else {},
            body=body,
            is_concurrency_safe=classifier,
            guidance=guidance,
        )
        self.catalog.register(scope, [defn])
        return defn


def build_registry(settings: RegistrySettings) -> Registry:
    run_code = ToolDefinition(
        name=RUN_CODE,
        description="Execute a program against the available tools.",
        input_schema=RUN_CODE_INPUT_SCHEMA,
        output_schema=RUN_CODE_OUTPUT_SCHEMA,
        body=_no_runtime,
    )
    catalog = Catalog(settings.default_mode, run_code)
    approvals = ApprovalBroker()
    registry = Registry(
        settings=settings,
        catalog=catalog,
        approvals=approvals,
        providers=ProviderHub(catalog),
        executor=Executor(catalog, approvals),
    )
    if settings.policy_rules is not None:
        try:
            rules = load_rules(settings.policy_rules)
        except RulesError as exc:
            raise ConfigError(str(exc)) from exc
        catalog.hooks(GLOBAL).pre_execute.append(rules_hook(rules))
    for entry in settings.plugins:
        _load_plugin(entry)(registry)
    return registry


def _load_plugin(entry: str) -> Callable[[Registry], None]:
    module_name, sep, attr = entry.partition(":")
    if not sep:
        raise ConfigError(f"plugin {entry!r} must be written `module:function`")
    try:
        plugin = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load plugin {entry!r}: {exc}") from exc
    if not callable(plugin):
        raise ConfigError(f"plugin {entry!r} is not callable")
    return plugin  # type: ignore[no-any-return]
