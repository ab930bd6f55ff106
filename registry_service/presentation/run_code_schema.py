"""The wire schema of the reserved `run_code` transport, one flavour per runtime language."""

from __future__ import annotations

from typing import Any, Final

RUN_CODE: Final = "run_code"

_DESCRIPTION_PARAM: Final = (
    "Clear, concise description of what this program does in active voice, 5-10 words "
    '(shown in the UI). Examples: "Count TODO markers across packages"; '
    '"Read failing test and its fixture"; "Rename config key in every cordis.yml".'
)

# Model-facing text is observable behaviour: change it only on purpose.
_FLAVORS: Final[dict[str, tuple[str, str]]] = {
    "typescript": (
        "Execute a TypeScript program against the available tools. Takes two required "
        "arguments: `code`, the BODY of an async function (erasable syntax only; top-level "
        "`await` and `return` work), and `description`, a short summary of what the program "
        "does. Call tools as `await tools.name(args)` per the declarations in the system "
        "prompt. Only what you print or return is program output — curate it. Image-bearing "
        "subtool results are attached after the run.",
        "The program: the body of an async TypeScript function.",
    ),
    "python": (
        "Execute a Python program against the available tools. Takes two required "
        "arguments: `code`, the BODY of an async function (top-level `await` and `return` "
        "work), and `description`, a short summary of what the program does. Call tools as "
        "`await tools.name(args)` per the declarations in the system prompt. Use "
        "`print(...)` and/or `return <value>` for program output — curate it. Image-bearing "
        "subtool results are attached after the run.",
        "The program: the body of an async Python function.",
    ),
}


def run_code_tool_schema(language: str) -> dict[str, Any]:
    """`{name, description, parameters}` of `run_code` for a runtime language.

    Returns a fresh object on every call, so callers may mutate it. The parameter root is left
    open (no `additionalProperties`): extra keys are not rejected.

    Raises:
        ValueError: no flavour exists for `language`.
    """
    flavor = _FLAVORS.get(language)
    if flavor is None:
        known = ", ".join(f'"{name}"' for name in sorted(_FLAVORS))
        raise ValueError(
            f'no run_code schema flavor registered for runtime language "{language}" '
            f"(known: {known})"
        )
    description, code_param = flavor
    return {
        "name": RUN_CODE,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": code_param},
                "description": {"type": "string", "description": _DESCRIPTION_PARAM},
            },
            "required": ["code", "description"],
        },
    }
