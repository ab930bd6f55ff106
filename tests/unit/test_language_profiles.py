"""The registry's program languages have one home: `presentation/language_profiles/`.

No other registry module names a language (a settings default may), so following a language
from an agent definition to what the registry renders and checks for it means reading its
profile; and every profile is complete."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import registry_service
from registry_service.presentation import language_profiles
from registry_service.presentation.language_profiles import (
    HOST_LANGUAGES,
    LANGUAGES,
    PROFILES,
    host_profile,
)
from registry_service.presentation.run_code_schema import run_code_tool_schema
from registry_service.presentation.sdk_model import SdkTool

ROOT = Path(registry_service.__file__).parent
PROFILES_DIR = Path(language_profiles.__file__).parent
# Settings fields whose default names a language: (file, class, field).
SETTINGS_DEFAULTS = {
    ("config.py", "RegistrySettings", "runtime_languages"),
    ("presentation/assembly.py", "PresentationConfig", "runtime_languages"),
}


def language_literals(source: str, relative: str) -> list[str]:
    """`line: literal` of every string constant naming a program language, outside the
    settings defaults allowed above."""
    names = {name.casefold() for name in LANGUAGES}
    found: list[str] = []

    def visit(node: ast.AST, owner: str) -> None:
        if isinstance(node, ast.ClassDef):
            owner = node.name
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and (relative, owner, node.target.id) in SETTINGS_DEFAULTS
        ):
            return
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.casefold() in names
        ):
            found.append(f"{node.lineno}: {node.value!r}")
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    visit(ast.parse(source), "")
    return found


def test_no_registry_module_outside_the_profiles_names_a_language() -> None:
    offenders: dict[str, list[str]] = {}
    scanned = 0
    for path in sorted(ROOT.rglob("*.py")):
        if path.is_relative_to(PROFILES_DIR):
            continue
        relative = path.relative_to(ROOT).as_posix()
        scanned += 1
        found = language_literals(path.read_text(encoding="utf-8"), relative)
        if found:
            offenders[relative] = found
    assert scanned > 50  # the walk sees the registry, domain and presentation alike
    assert offenders == {}


def test_the_scan_finds_a_language_wherever_it_is_spelled() -> None:
    source = (
        "class Runner:\n"
        "    language: str = 'python'\n"
        "    def check(self, language):\n"
        "        if language == 'TypeScript':\n"
        "            return {'python': 1}\n"
    )
    assert language_literals(source, "domain/cordis/runner.py") == [
        "2: 'python'",
        "4: 'TypeScript'",
        "5: 'python'",
    ]
    # The allowance is the named settings field only, not its file or class.
    settings = (
        "class RegistrySettings:\n    runtime_languages: list = ['python']\n    x = 'python'\n"
    )
    assert language_literals(settings, "config.py") == ["3: 'python'"]
    assert language_literals(settings, "servicer.py") == ["2: 'python'", "3: 'python'"]


def test_the_table_is_keyed_by_each_profiles_own_name() -> None:
    # Table order: the declared-language errors.
    assert LANGUAGES == ("python", "typescript", "monty")
    assert all(PROFILES[name].name == name for name in LANGUAGES)
    assert host_profile("cobol") is PROFILES["python"]  # an unknown language's host guidance


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_profile_is_complete(language: str) -> None:
    profile = PROFILES[language]
    rendered = profile.render_sdk([SdkTool("read", "Reads.", {"type": "object"}, {})])
    assert "run_code" in rendered and "read" in rendered
    schema = run_code_tool_schema(language)
    assert schema["description"] == profile.run_code.description
    assert schema["parameters"]["properties"]["code"]["description"] == (
        profile.run_code.code_parameter
    )
    assert profile.cordis_host_half.opening and profile.cordis_host_half.closing
    names = [name for name, _signature, _description in profile.facade]
    assert len(names) == len(set(names)) and {"harness.handle", "ctx.on", "inject"} <= set(names)
    assert all(signature and description for _name, signature, description in profile.facade)
    assert HOST_LANGUAGES.facade(language) == profile.facade


def test_host_languages_title_each_language_and_an_unknown_one_by_its_name() -> None:
    assert [HOST_LANGUAGES.title(language) for language in LANGUAGES] == [
        PROFILES[language].title for language in LANGUAGES
    ]
    assert all(PROFILES[language].title for language in LANGUAGES)
    assert HOST_LANGUAGES.title("cobol") == "cobol"


def test_host_halves_are_in_the_host_language_of_the_program_language() -> None:
    """A subset's agents write host halves in the full language (Monty's bridge runs no
    plugin hosts); every other language's are its own; an unknown one stays as named."""
    assert HOST_LANGUAGES.host_language("monty") == "python"
    assert HOST_LANGUAGES.facade("monty") == PROFILES["python"].facade
    assert [HOST_LANGUAGES.host_language(name) for name in ("python", "typescript")] == [
        "python",
        "typescript",
    ]
    assert HOST_LANGUAGES.host_language("cobol") == "cobol"
