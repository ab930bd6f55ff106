"""The `run_code` wire schema per runtime language: its flavour rules."""

from __future__ import annotations

import pytest

from registry_service.presentation.run_code_schema import RUN_CODE, run_code_tool_schema


@pytest.mark.parametrize(
    ("language", "word", "code_description"),
    [
        ("typescript", "TypeScript", "The program: the body of an async TypeScript function."),
        ("python", "Python", "The program: the body of an async Python function."),
    ],
)
def test_flavors(language: str, word: str, code_description: str) -> None:
    schema = run_code_tool_schema(language)
    assert schema["name"] == RUN_CODE == "run_code"
    assert schema["description"].startswith(
        f"Execute a {word} program against the available tools."
    )
    assert "Image-bearing subtool results are attached after the run." in schema["description"]
    parameters = schema["parameters"]
    assert parameters["type"] == "object"
    assert parameters["required"] == ["code", "description"]
    assert "additionalProperties" not in parameters  # the root stays open
    properties = parameters["properties"]
    assert list(properties) == ["code", "description"]
    assert properties["code"] == {"type": "string", "description": code_description}
    assert properties["description"]["type"] == "string"
    assert properties["description"]["description"].startswith(
        "Clear, concise description of what this program does in active voice, 5-10 words"
    )


def test_language_specific_wording() -> None:
    typescript = run_code_tool_schema("typescript")["description"]
    python = run_code_tool_schema("python")["description"]
    assert "erasable syntax only" in typescript and "console" not in typescript
    assert "Only what you print or return is program output" in typescript
    assert "Use `print(...)` and/or `return <value>` for program output" in python
    assert "erasable" not in python


def test_each_call_returns_a_fresh_object() -> None:
    first = run_code_tool_schema("python")
    first["parameters"]["required"].append("mutated")
    assert run_code_tool_schema("python")["parameters"]["required"] == ["code", "description"]


@pytest.mark.parametrize("language", ["ruby", "", "Python", "TypeScript"])
def test_unknown_language_fails_loud(language: str) -> None:
    expected = (
        f'no run_code schema flavor registered for runtime language "{language}" '
        '(known: "monty", "python", "typescript")'
    )
    with pytest.raises(ValueError, match=r"^no run_code schema flavor") as raised:
        run_code_tool_schema(language)
    assert str(raised.value) == expected


@pytest.mark.parametrize("language", ["python", "typescript"])
def test_the_description_examples_name_no_file_of_this_project(language: str) -> None:
    """A model reads these examples as what programs are for: they must be about the model's
    own workspace, not about this project's internals (a `cordis.yml` once slipped in)."""
    text = run_code_tool_schema(language)["parameters"]["properties"]["description"]["description"]
    assert "Examples:" in text
    assert not any(word in text.lower() for word in ("cordis", "codemode", ".yml", ".yaml"))
