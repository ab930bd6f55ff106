"""Presentation RPCs of RegistryService: wire schemas, system prompt, SDK (translation only)."""

from __future__ import annotations

from typing import Any, TypeAlias

from codemode_common.peer import current_principal
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from registry_service import convert
from registry_service._errors import unary
from registry_service.domain.tool_access import ToolAccess
from registry_service.registry import Registry

# grpc is untyped (see pyproject); the alias documents intent.
Context: TypeAlias = Any


class PresentationRpcs:
    """Mixed into `RegistryServicer`, which provides `_registry`."""

    _registry: Registry

    def _access(self, scope: str) -> ToolAccess:
        """What the caller may call in `scope`: it is shown those tools and no others."""
        return self._registry.authority.access(current_principal(), scope)

    @unary
    async def GetWireSchemas(
        self, request: ppb.GetWireSchemasRequest, context: Context
    ) -> ppb.GetWireSchemasResponse:
        await self._registry.languages.ensure_known()
        wire = self._registry.assembler.wire_schemas(
            request.scope, request.language, self._access(request.scope)
        )
        return ppb.GetWireSchemasResponse(
            schemas=[
                ppb.WireSchema(
                    name=s.name, description=s.description, parameters_json=s.parameters_json
                )
                for s in wire.schemas
            ],
            effective_mode=convert.mode_to_proto(wire.mode),
            language=wire.language,
        )

    @unary
    async def GetSystemPrompt(
        self, request: ppb.GetSystemPromptRequest, context: Context
    ) -> ppb.GetSystemPromptResponse:
        await self._registry.languages.ensure_known()
        prompt = self._registry.assembler.system_prompt(
            request.scope, request.language, self._access(request.scope)
        )
        return ppb.GetSystemPromptResponse(
            sections=[
                ppb.PromptSection(id=s.id, order=s.order, text=s.text) for s in prompt.sections
            ],
            text=prompt.text,
            effective_mode=convert.mode_to_proto(prompt.mode),
            language=prompt.language,
        )

    @unary
    async def GetSdk(self, request: ppb.GetSdkRequest, context: Context) -> ppb.GetSdkResponse:
        await self._registry.languages.ensure_known()
        sdk = self._registry.assembler.sdk(
            request.scope, request.language, self._access(request.scope)
        )
        return ppb.GetSdkResponse(
            language=sdk.language, text=sdk.text, effective_mode=convert.mode_to_proto(sdk.mode)
        )
