"""Reading the whole-state snapshot an older registry kept with `cordis_durable` (one JSON
body: counters and plugins). The first registry that starts on such a database imports it as
records (`CordisRunner.load`) and the snapshot is gone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from codemode_wire import jsonvalue
from registry_service.domain.cordis.model import Package
from registry_service.domain.cordis.state import PluginRow

VERSION = 1


@dataclass(frozen=True, slots=True)
class LegacyPlugin:
    row: PluginRow
    packages: list[Package]
    grants: list[str]


def read(body: str, owner_id_of: Callable[[str], str]) -> tuple[dict[str, int], list[LegacyPlugin]]:
    """The counters and plugins of a snapshot; `owner_id_of` names the stable id of an owner
    saved before agents had ids (its agent now)."""
    data = cast("dict[str, object]", jsonvalue.loads(body))
    if data.get("version") != VERSION:
        raise ValueError(f"unknown Cordis state version {data.get('version')!r}")
    counters = {str(k): int(v) for k, v in cast("dict[str, int]", data.get("counters", {})).items()}
    plugins: list[LegacyPlugin] = []
    for raw in cast("list[dict[str, object]]", data.get("plugins", [])):
        owner = str(raw["owner"])
        packages = [
            Package(
                str(pkg["packageId"]),
                str(pkg["name"]),
                str(pkg["purpose"]),
                cast("str | None", pkg.get("host")),
                cast("str | None", pkg.get("client")),
            )
            for pkg in cast("list[dict[str, object]]", raw.get("packages", []))
        ]
        if not packages:
            continue
        row = PluginRow(
            str(raw["pluginId"]),
            owner,
            str(raw.get("ownerId", "")) or owner_id_of(owner),
            cast("str | None", raw.get("current")),
            cast("str | None", raw.get("next")),
            bool(raw.get("clientVersionUpdatesApproved")),
        )
        grants = sorted(cast("list[str]", raw.get("approvedClientPackages", [])))
        plugins.append(LegacyPlugin(row, packages, grants))
    return counters, plugins
