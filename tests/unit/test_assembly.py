"""The presentation assembler over a bare catalog: sections, ordering, errors and caching."""

from __future__ import annotations

from typing import Any

import pytest

from codemode_wire.errors import CodemodeError, Status
from codemode_wire.jsonvalue import JsonValue
from registry_service.config import RegistrySettings
from registry_service.domain.catalog import Catalog
from registry_service.domain.scopes import Mode
from registry_service.domain.tools import RUN_CODE, Invocation, ToolDefinition
from registry_service.presentation.assembly import (
    CODE_ONLY_ID,
    CODE_ONLY_TEXT,
    SDK_ID,
    Assembler,
    PresentationConfig,
    Section,
    assemble,
    ordered_names,
)
from registry_service.presentation.lru import Lru


async def _body(invocation: Invocation) -> JsonValue:
    return None


def _tool(name: str, guidance: str = "") -> ToolDefinition:
    return ToolDefinition(name, f"{name} tool", {"type": "object"}, {}, _body, guidance=guidance)


def _assembler(mode: Mode = Mode.CODE, **config: Any) -> tuple[Catalog, Assembler]:
    # As the registry composes it: the default program language is the first runtime language.
    languages = config.get("runtime_languages", ("python",))
    run_code = ToolDefinition(RUN_CODE, "run", {"type": "object"}, {}, _body)
    catalog = Catalog(mode, run_code, languages[0] if languages else "typescript")
    catalog.register("", [_tool("read", "Read first."), _tool("write", "Write last.")])
    return catalog, Assembler(catalog, PresentationConfig(**config))


def _error(call: Any) -> CodemodeError:
    with pytest.raises(CodemodeError) as caught:
        call()
    assert caught.value.status is Status.FAILED_PRECONDITION
    return caught.value


def test_assemble_filters_guidance_only_under_code() -> None:
    sections = [
        Section("tool:b", 120, "B"),
        Section("tool:a", 120, "A"),
        Section(SDK_ID, 150, "SDK\n\n"),
        Section(CODE_ONLY_ID, 99, "rule"),
        Section("deploy", 120, "D"),
        Section("blank", 1, "  \n"),
    ]
    code = assemble(sections, Mode.CODE)
    assert [(s.id, s.text) for s in code] == [
        (CODE_ONLY_ID, "rule"),
        ("deploy", "D"),
        (SDK_ID, "SDK"),
    ]
    both = assemble(sections, Mode.BOTH, tool_order=["b"])
    # Same order: tool_order position first, then id; sections not in tool_order follow.
    assert [s.id for s in both] == [CODE_ONLY_ID, "tool:b", "deploy", "tool:a", SDK_ID]
    assert [s.id for s in assemble(sections, Mode.NATIVE)][1:4] == ["deploy", "tool:a", "tool:b"]


def test_ordered_names_puts_run_code_last_unless_placed() -> None:
    assert ordered_names(["b", RUN_CODE, "a", "Z"], []) == ["Z", "a", "b", RUN_CODE]
    assert ordered_names(["b", RUN_CODE, "a"], ["b", RUN_CODE]) == ["b", RUN_CODE, "a"]


def test_prompt_per_mode() -> None:
    _, code = _assembler(Mode.CODE)
    assert [s.id for s in code.system_prompt("").sections] == [CODE_ONLY_ID, SDK_ID]
    assert code.system_prompt("").text.startswith(CODE_ONLY_TEXT + "\n\n## Writing code")
    _, native = _assembler(Mode.NATIVE)
    got = native.system_prompt("")
    assert [s.id for s in got.sections] == ["tool:read", "tool:write"]
    assert got.text == "Read first.\n\nWrite last." and got.language == ""


def test_wire_schema_run_code_flavour_per_language() -> None:
    _, assembler = _assembler(Mode.BOTH, runtime_languages=("typescript", "python"))
    ts = assembler.wire_schemas("")
    assert ts.language == "typescript"
    assert [s.name for s in ts.schemas] == ["read", "write", RUN_CODE]
    assert "TypeScript" in ts.schemas[-1].description
    assert "Python" in assembler.wire_schemas("", "python").schemas[-1].description


def test_errors_name_mode_and_language() -> None:
    _, none = _assembler(Mode.CODE, runtime_languages=())
    assert _error(lambda: none.sdk("")).message == (
        'mode "code" requires a code runtime — configure runtime_languages or set the mode to '
        '"native"'
    )
    _, cobol = _assembler(Mode.BOTH, runtime_languages=("cobol",))
    error = _error(lambda: cobol.system_prompt(""))
    assert error.reason == "UNKNOWN_RUNTIME_LANGUAGE"
    assert error.metadata == {"mode": "both", "language": "cobol"}
    _, native = _assembler(Mode.NATIVE, runtime_languages=())
    assert native.sdk("", "cobol").text == ""  # native never consults the language


def test_tool_order_known_sets() -> None:
    _, code = _assembler(Mode.CODE, tool_order=("read",))
    assert 'known tools: "run_code"' in _error(lambda: code.wire_schemas("")).message
    _, both = _assembler(Mode.BOTH, tool_order=(RUN_CODE, "write"))
    assert [s.name for s in both.wire_schemas("").schemas] == [RUN_CODE, "write", "read"]
    _, native = _assembler(Mode.NATIVE, tool_order=("ghost",))
    error = _error(lambda: native.system_prompt(""))
    assert error.message == (
        'mode "native": tool_order lists tool(s) unknown to the global scope: "ghost"; '
        'known tools: "read", "write"'
    )


def test_version_keyed_cache_and_shared_text() -> None:
    catalog, assembler = _assembler(Mode.CODE)
    first = assembler.sdk("")
    assert assembler.sdk("") is first and assembler.renders == 1
    catalog.declare_agent("a", "", None)  # a change that leaves the global tool set alone
    again = assembler.sdk("")
    assert again is not first and again.text is first.text and assembler.renders == 1
    catalog.register("", [_tool("zeta")])
    assert "zeta" in assembler.sdk("").text and assembler.renders == 2


def test_lru_is_bounded() -> None:
    lru: Lru[int, str] = Lru(2)
    lru.put(1, "a")
    lru.put(2, "b")
    assert lru.get(1) == "a"  # 1 is now the most recent
    lru.put(3, "c")
    assert len(lru) == 2 and lru.get(2) is None and lru.get(1) == "a"
    with pytest.raises(ValueError, match="capacity"):
        Lru(0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"prompt_sections": [{"id": "tools:sdk", "order": 1, "text": "x"}]}, "reserved"),
        ({"prompt_sections": [{"id": "tool:read", "order": 1, "text": "x"}]}, "reserved"),
        ({"prompt_sections": [{"id": "a", "order": 1, "text": "x"}] * 2}, "appears twice"),
        ({"tool_order": ["a", "a"]}, "tool_order lists a name twice"),
        ({"runtime_languages": [""]}, "runtime_languages entries must be non-empty"),
    ],
)
def test_settings_validation(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RegistrySettings(**settings)
