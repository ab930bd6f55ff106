"""Choosing the history store is a setting: `sqlite` (the default) in `history_path`; an
unknown store, or a path that cannot be opened, stops the start with exit status 2 and one line
naming the setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from registry_service.config import ConfigError, RegistrySettings, load_settings
from registry_service.history.sqlite import SqliteHistory
from registry_service.registry import build_registry
from tests.cli._processes import service_env


def _registry(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "registry_service", "--listen", "127.0.0.1:0"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("registry: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_an_unknown_store_stops_the_start_with_one_line(tmp_path: Path) -> None:
    env = {**service_env(tmp_path), "CODEMODE_REGISTRY_HISTORY_STORE": "nope"}
    done = _registry(env, tmp_path)
    assert done.returncode == 2
    # Found with the settings, before anything else is set up: the only line.
    assert done.stderr.strip().splitlines() == [
        "registry: history_store 'nope' is not a known store (known: postgres, sqlite)"
    ]


def test_a_history_path_that_cannot_be_created_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    env = {**service_env(tmp_path), "CODEMODE_REGISTRY_HISTORY_PATH": str(tmp_path / "a-file/h")}
    done = _registry(env, tmp_path)
    assert done.returncode == 2
    assert _last_line(done.stderr).startswith("registry: cannot create the directory of history")


async def test_sqlite_is_the_default_store(tmp_path: Path) -> None:
    settings = load_settings(history_path=str(tmp_path / "h.sqlite3"))
    assert settings.history_store == "sqlite"
    registry = build_registry(settings)
    assert isinstance(registry.history, SqliteHistory)
    await registry.close()
    with pytest.raises(ConfigError, match="history_store 'nope' is not a known store"):
        build_registry(RegistrySettings(history_store="nope"))
