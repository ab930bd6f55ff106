"""The `tool:cordis` system-prompt section (order 115): the long-form guidance for the seven
tools. Under `code` it is filtered out like every `tool:*` section; the SDK carries the
bindings and their descriptions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

SECTION_ID: Final = "tool:cordis"
SECTION_ORDER: Final = 115

_HEAD: Final = """\
# Dynamic Cordis plugins

You can extend yourself while you work with dynamic Cordis plugins: a plugin's Host half runs \
in a sandboxed plugin host and can register tools that you then call like any other tool. \
Plugins live in this registry's memory only; nothing is written to a repository, a \
configuration or a disk, and nothing survives a registry restart.

Workflow:
1. Discover before you write: cordis_inspect_list shows the Inspect Providers; \
cordis_inspect_query reads one method's data (Builtin.listBuiltins for the façade, \
Tool.listTools for the tools you can see, Service.listService, Event.listEvents). Never guess \
a name.
2. cordis_define records an immutable Package: `plugin` is {"kind": "new", "idPrefix": \
"<3-6 lowercase letters>"} for a new Plugin or {"kind": "existing", "pluginId": "<id>"} to \
append a version to one you own. Define only checks syntax and records the source: it never \
runs code, never asks for approval and never changes which version is current.
3. cordis_run activates one exact Package: mode "run" for the first activation, to restart \
the current Package or to roll back to it; mode "update" to switch from the current Package to \
another. currentPackageId changes only after a fully successful activation; after a failure \
the old current stays and nextPackageId names the failed target.
4. cordis_stop retracts a running Plugin and keeps its Packages and pointers; cordis_undefine \
removes it with every Package.
5. cordis_inspect_self shows your Plugins; with pluginId and packageId it returns that \
Package's exact source and diagnostics. Read it before you repair a failure, then define the \
corrected Package on the same Plugin and run it again.

Identities: a Plugin id is `<prefix>-<n>` (you choose the prefix, the registry adds the \
number), a Package id `pkg-<n>`, an activation attempt `run-<n>`. Ids are never reused.

"""

# The Host half, in the agent's program language (its host halves' language too): the façade's
# names differ, what it does is one text. A language's profile says its own sentences
# (`HostHalfGuidance`); the shared middle and the budget sentence are the same for every one.
_SHARED: Final = """\
; they appear in your tool list from the next prompt, and in the next run_code program. \
ctx.tools.schemas() and ctx.tools.get(name) only describe tools — a plugin cannot execute \
another tool. Use ctx.get(name) for an optional service and `inject` for a required one (the \
plugin waits until it exists, and waits again if it goes); ctx.provide(name, service) shares a \
service with your other plugins, which run in other processes: provide JSON data, or an object \
whose methods they call as `await ctx.<name>.<method>(...)` with JSON arguments and results. \
ctx.on(event, fn) and ctx.once(event, fn) observe your tool calls as they are recorded \
(Event.listEvents). Make every side effect reversible with ctx.effect("""
_BUDGET: Final = """\
 Each tool call into a plugin has a CPU budget: a busy loop ends the call and stops the \
plugin.

"""


@dataclass(frozen=True, slots=True)
class HostHalfGuidance:
    """One language's sentences of the Host-half paragraph."""

    opening: str  # what a host half is, up to the name of the tool registration call
    closing: str  # from ctx.effect's argument on: disposers and timers, in that language


_TAIL: Final = """\
Outcomes that arrive after a tool call has returned are reported to you as steering \
messages; a user message naming `@<pluginId>` comes with that Plugin's current facts: inspect \
it and append a Package to the same Plugin instead of creating a new one."""


def prompt(host_half: HostHalfGuidance) -> str:
    """The section's text for an agent whose program language's guidance is `host_half`."""
    return _HEAD + host_half.opening + _SHARED + host_half.closing + _BUDGET + _TAIL
