"""The wire schema of the reserved `run_code` transport, in the flavour of a program language
(its texts are the language profile's `run_code`)."""

from __future__ import annotations

from typing import Any, Final

from registry_service.domain.tools import RUN_CODE
from registry_service.presentation.language_profiles import PROFILES

__all__ = ["RUN_CODE", "run_code_tool_schema"]

_DESCRIPTION_PARAM: Final = (
    "Clear, concise description of what this program does in active voice, 5-10 words "
    '(shown in the UI). Examples: "Count TODO markers across packages"; '
    '"Read failing test and its fixture"; "Rename config key in every settings file".'
)


def run_code_tool_schema(language: str) -> dict[str, Any]:
    """`{name, description, parameters}` of `run_code` for a runtime language.

    Returns a fresh object on every call, so callers may mutate it. The parameter root is left
    open (no `additionalProperties`): extra keys are not rejected.

    Raises:
        ValueError: no flavour exists for `language`.
    """
    profile = PROFILES.get(language)
    if profile is None:
        known = ", ".join(f'"{name}"' for name in sorted(PROFILES))
        raise ValueError(
            f'no run_code schema flavor registered for runtime language "{language}" '
            f"(known: {known})"
        )
    return {
        "name": RUN_CODE,
        "description": profile.run_code.description,
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": profile.run_code.code_parameter},
                "description": {"type": "string", "description": _DESCRIPTION_PARAM},
            },
            "required": ["code", "description"],
        },
    }
