"""The inspect registry: read-only providers a model queries before it writes a
package. Host providers are local; an agent's client manifest is whatever a page runner of that
agent last synced (replaced wholesale), and client queries are answered by its pages. Manifests
are validated when registered; queries validate their input against the method's input schema
and their output against its output schema."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.jsonschema import SchemaError, check_schema, validate
from registry_service.domain.signals import AbortSignal

Query = Callable[[JsonValue, str], Awaitable[JsonValue]]  # (input, owner agent) -> data


class ClientQuery(Protocol):
    """Asks the owner's page runners; returns the first valid successful answer's data."""

    async def __call__(
        self,
        owner: str,
        provider: str,
        method: Method,
        input_value: JsonValue,
        signal: AbortSignal,
        *,
        here_only: bool = False,
        deadline: float | None = None,
    ) -> JsonValue:
        """`here_only`: answered by this registry's pages, never carried to another's;
        `deadline` (event-loop time): the caller's, carried with the query when it goes to
        another registry."""
        ...


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    description: str
    input_schema: JsonValue
    output_schema: JsonValue
    query: Query | None = None  # None for client methods (answered by a page)

    def manifest(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "outputSchema": self.output_schema,
        }


@dataclass(frozen=True, slots=True)
class Provider:
    id: str
    description: str
    methods: tuple[Method, ...]

    def manifest(self, platform: str) -> dict[str, JsonValue]:
        return {
            "platform": platform,
            "id": self.id,
            "description": self.description,
            "methods": [m.manifest() for m in self.methods],
        }


def validate_provider(provider: Provider) -> None:
    """Non-empty id and description; methods with unique non-empty names and descriptions and
    supported JSON Schemas. Raises ValueError naming the first problem."""
    if not provider.id.strip():
        raise ValueError("an Inspect Provider needs a non-empty id")
    if not provider.description.strip():
        raise ValueError(f'Inspect Provider "{provider.id}" needs a non-empty description')
    seen: set[str] = set()
    for method in provider.methods:
        where = f'Inspect Provider "{provider.id}" method "{method.name}"'
        if not method.name.strip():
            raise ValueError(f'Inspect Provider "{provider.id}" has a method without a name')
        if method.name in seen:
            raise ValueError(f"{where} is declared twice")
        seen.add(method.name)
        if not method.description.strip():
            raise ValueError(f"{where} needs a non-empty description")
        for label, schema in (("input", method.input_schema), ("output", method.output_schema)):
            try:
                check_schema(schema)
            except SchemaError as exc:
                raise ValueError(f"{where} {label} schema is not supported: {exc}") from None


def client_providers(raw: JsonValue) -> list[Provider]:
    """A page's manifest (a JSON array of `{id, description, methods: [{name, description,
    inputSchema, outputSchema}]}`) as providers; raises ValueError naming the first problem
    (validated further by `sync_client_manifest`)."""
    if not isinstance(raw, list):
        raise ValueError("a client inspect manifest is a JSON array of providers")
    out: list[Provider] = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("methods", []), list):
            raise ValueError("each client Inspect Provider is an object with `methods`")
        methods: list[Method] = []
        for m in item.get("methods", []):  # type: ignore[union-attr]
            if not isinstance(m, dict):
                raise ValueError("each Inspect method is an object")
            methods.append(
                Method(
                    str(m.get("name", "")),
                    str(m.get("description", "")),
                    m.get("inputSchema", {}),
                    m.get("outputSchema", {}),
                )
            )
        out.append(
            Provider(str(item.get("id", "")), str(item.get("description", "")), tuple(methods))
        )
    return out


class InspectRegistry:
    def __init__(self) -> None:
        self._host: dict[str, Provider] = {}
        self._client: dict[str, dict[str, Provider]] = {}  # per agent
        self.client_query: ClientQuery | None = None  # set when page runners exist
        # The manifest of an agent's pages on another registry sharing the store (when none
        # of its pages synced one here), set when such registries are followed.
        self.client_elsewhere: Callable[[str], Mapping[str, Provider]] | None = None

    def _client_of(self, owner: str) -> Mapping[str, Provider]:
        here = self._client.get(owner)
        if here or self.client_elsewhere is None:
            return here or {}
        return self.client_elsewhere(owner)

    def register_host(self, provider: Provider) -> None:
        validate_provider(provider)
        if provider.id in self._host:
            raise ValueError(f'host Inspect Provider "{provider.id}" is already registered')
        self._host[provider.id] = provider

    def sync_client_manifest(self, owner: str, providers: Sequence[Provider]) -> None:
        """Replaces the agent's client manifest wholesale (a page runner's sync)."""
        fresh: dict[str, Provider] = {}
        for provider in providers:
            validate_provider(provider)
            if provider.id in fresh:
                raise ValueError(f'client Inspect Provider "{provider.id}" appears twice')
            fresh[provider.id] = provider
        self._client[owner] = fresh

    def list(self, owner: str) -> list[JsonValue]:
        return [
            *(p.manifest("host") for p in self._host.values()),
            *(p.manifest("client") for p in self._client_of(owner).values()),
        ]

    async def query(
        self,
        platform: str,
        provider_id: str,
        method_name: str,
        *,
        input_value: JsonValue,
        owner: str,
        signal: AbortSignal,
        here_only: bool = False,
        deadline: float | None = None,
    ) -> JsonValue:
        """`here_only`: a client method is answered by this registry's pages only (a query
        another registry carried here); `deadline`: the caller's (event-loop time)."""
        providers: Mapping[str, Provider]
        if platform == "host":
            providers = self._host
        elif here_only:
            providers = self._client.get(owner, {})
        else:
            providers = self._client_of(owner)
        provider = providers.get(provider_id)
        if provider is None:
            known = ", ".join(f'"{p}"' for p in providers) or "(none)"
            raise CordisError(
                f'no {platform} Inspect Provider "{provider_id}"; known: {known}. '
                "Call cordis_inspect_list first.",
                "provider-missing",
            )
        method = next((m for m in provider.methods if m.name == method_name), None)
        if method is None:
            known = ", ".join(f'"{m.name}"' for m in provider.methods)
            raise CordisError(
                f'{platform} Inspect Provider "{provider_id}" has no method "{method_name}"; '
                f"known: {known}",
                "method-missing",
            )
        value = {} if input_value is None else input_value
        violations = validate(method.input_schema, value, root="input")
        if violations:
            raise CordisError(
                f"cordis_inspect_query input for {provider_id}.{method_name} is invalid: "
                + "; ".join(violations),
                "invalid-input",
            )
        if signal.aborted:
            raise CordisError("cordis_inspect_query was cancelled", "cancelled")
        if method.query is None:  # a client method: the first valid page answer (validated)
            if self.client_query is None:
                raise CordisError(
                    "client Inspect queries are answered by a page runner, which this "
                    "registry does not have",
                    "client-unavailable",
                )
            return await self.client_query(
                owner, provider_id, method, value, signal, here_only=here_only, deadline=deadline
            )
        data = jsonvalue.snapshot(await method.query(value, owner))
        if signal.aborted:
            raise CordisError("cordis_inspect_query was cancelled", "cancelled")
        violations = validate(method.output_schema, data, root="output")
        if violations:
            raise CordisError(
                f"{provider_id}.{method_name} returned output that does not match its schema: "
                + "; ".join(violations),
                "invalid-output",
            )
        return data
