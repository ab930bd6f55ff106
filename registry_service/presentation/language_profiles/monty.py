"""Monty: a Python subset run by Pydantic's Monty interpreter, an opt-in runtime language.

An agent chooses it as its own program language (`code_language: monty`), the name a runtime
serves it by (`runtime_service/languages/monty.py`) and a `Run` carries, so the registry has
no second switch for it. Programs are Python async function bodies, presented with the Python
stub under Monty's own instructions (`registry_service/presentation/sdk_monty.py`), which say
what the subset leaves out. A Monty agent's plugin host halves are Python ones
(`host_language`), checked and run as a Python agent's: Monty's bridge runs programs, not
plugin hosts.
"""

from __future__ import annotations

from typing import Final

from registry_service.presentation.language_profiles import python
from registry_service.presentation.language_profiles.profile import LanguageProfile, RunCodeFlavour
from registry_service.presentation.sdk_monty import render_monty_sdk

# Model-facing text is observable behaviour: kept verbatim.
_RUN_CODE: Final = RunCodeFlavour(
    description=(
        "Execute a program in Monty, a fast sandboxed SUBSET of Python, against the available "
        "tools. Takes two required arguments: `code`, the BODY of an async function (top-level "
        "`await` and `return` work), and `description`, a short summary of what the program "
        "does. Call tools as `await tools.name(args)` per the declarations in the system "
        "prompt, which also list what Monty does not support (class inheritance, generators, "
        "`del`, most imports, files and network). Use `print(...)` and/or `return <value>` for "
        "program output — curate it. Image-bearing subtool results are attached after the run."
    ),
    code_parameter="The program: the body of an async function in Monty (a Python subset).",
)

PROFILE: Final = LanguageProfile(
    name="monty",
    title="Monty (Python subset)",
    render_sdk=render_monty_sdk,
    run_code=_RUN_CODE,
    cordis_host_half=python.PROFILE.cordis_host_half,
    facade=python.PROFILE.facade,
    host_language=python.PROFILE.name,
)
