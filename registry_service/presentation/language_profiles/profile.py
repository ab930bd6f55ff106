"""`LanguageProfile`: everything the registry says or checks that depends on a program language."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from registry_service.domain.cordis.host_languages import Facade
from registry_service.domain.cordis.prompt import HostHalfGuidance
from registry_service.presentation.sdk_model import SdkTool

SdkRenderer: TypeAlias = Callable[[Sequence[SdkTool]], str]


@dataclass(frozen=True, slots=True)
class RunCodeFlavour:
    """The language's texts in the `run_code` wire schema (model-facing, kept verbatim)."""

    description: str  # the tool's description
    code_parameter: str  # the description of its `code` argument


@dataclass(frozen=True, slots=True)
class LanguageProfile:
    """One program language as the registry knows it.

    The `name` is what a scope declares (`code_language`), what a `Run` carries to the runtime
    and what a runtime says it serves. The rest is what the registry renders or checks for an
    agent in that language: its `run_code` schema, its `tools:sdk` section, the Host-half
    paragraph of the `tool:cordis` section, the host façade it describes to the model
    (`Builtin.listBuiltins`), and the title the model reads it by.
    """

    name: str
    title: str  # the language's name in text the model reads ("Python")
    render_sdk: SdkRenderer  # the `tools:sdk` section for the agent's visible tools
    run_code: RunCodeFlavour
    cordis_host_half: HostHalfGuidance
    # The plugin host façade as the registry describes it: (name, signature, description) per
    # symbol, in this language's spelling; what the runtime's host harness of the language
    # implements.
    facade: Facade
    # The language this language's agents write their plugins' host halves in, when it is
    # another (a subset's host halves run on the full language's host harness).
    host_language: str = ""
