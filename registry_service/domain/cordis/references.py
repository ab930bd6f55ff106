"""`@pluginId` references: a user message naming `@clock-1` gets the plugin's
source-free reference and directions, or an unavailable notice, as a context block."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from codemode_wire.jsonvalue import JsonValue

OPEN = "<cordis_dynamic_plugin_context>"
CLOSE = "</cordis_dynamic_plugin_context>"
_REFERENCE = re.compile(r"(?:^|\s)@([a-z]{3,6}-\d+)(?=\s|$)")


@dataclass(frozen=True, slots=True)
class ReferenceContext:
    plugin_id: str
    available: bool
    text: str


def referenced_ids(text: str) -> list[str]:
    """Distinct ids in order of first mention."""
    return list(dict.fromkeys(_REFERENCE.findall(text)))


def render_reference(reference: dict[str, JsonValue]) -> str:
    plugin_id, package_id = reference["pluginId"], reference["packageId"]
    mode = "run" if "currentPackageId" not in reference else "update"
    return "\n".join(
        [
            OPEN,
            json.dumps(reference, indent=2, ensure_ascii=False),
            "",
            f"The user explicitly referenced @{plugin_id}. Use Package {package_id} as the base "
            "for this modification.",
            f'Before modifying it, call cordis_inspect_self with pluginId="{plugin_id}" and '
            f'packageId="{package_id}" to read the exact metadata and source.',
            f'Use cordis_define with plugin.kind="existing" and the original '
            f'pluginId="{plugin_id}" to append an immutable Package.',
            "Do not create a new Plugin for this request. After cordis_define succeeds, call "
            f'cordis_run mode="{mode}" with the returned packageId.',
            CLOSE,
        ]
    )


def render_unavailable(plugin_id: str) -> str:
    return "\n".join(
        [
            OPEN,
            f"The user explicitly referenced @{plugin_id}, but this Plugin is unavailable in the "
            "current Session.",
            "It may have been removed, belong to another Session, or have been lost when the "
            "registry process restarted.",
            "Do not claim that it was updated or silently create a replacement Plugin. Tell the "
            "user that the reference is currently unavailable.",
            CLOSE,
        ]
    )
