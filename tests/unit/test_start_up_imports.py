"""A service imports what its settings need: psycopg only for a PostgreSQL store, PyJWT (and
with it cryptography) only for JWT authentication. Each is ~12 MiB of idle memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHECK = """
import sys
import {module}
from {settings_module} import {settings}
{build}
print(",".join(name for name in ("psycopg", "jwt", "cryptography") if name in sys.modules))
"""


@pytest.mark.parametrize(
    ("module", "settings_module", "settings", "build"),
    [
        (
            "registry_service.server",
            "registry_service.config",
            "RegistrySettings",
            "from registry_service.registry import build_registry\n"
            "build_registry(RegistrySettings(history_path=':memory:'))",
        ),
        ("runtime_service.server", "runtime_service.config", "RuntimeSettings", ""),
    ],
)
def test_a_default_service_imports_neither_psycopg_nor_jwt(
    module: str, settings_module: str, settings: str, build: str
) -> None:
    code = _CHECK.format(
        module=module, settings_module=settings_module, settings=settings, build=build
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == ""
