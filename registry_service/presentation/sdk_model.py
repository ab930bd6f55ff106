"""Input rows for the SDK renderers."""

from __future__ import annotations

from dataclasses import dataclass

from codemode_wire.jsonvalue import JsonValue

__all__ = ["JsonValue", "SdkTool"]


@dataclass(frozen=True, slots=True)
class SdkTool:
    """One tool as the SDK projection sees it.

    The schemas are plain parsed JSON and are not trusted: they may be malformed, use keywords
    outside the supported subset, or be thousands of levels deep. Renderers never recurse on
    them and never raise because of them.
    """

    name: str
    description: str
    input_schema: JsonValue
    output_schema: JsonValue
