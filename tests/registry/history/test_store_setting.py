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


def test_postgres_without_a_dsn_stops_the_start_with_one_line(tmp_path: Path) -> None:
    env = {**service_env(tmp_path), "CODEMODE_REGISTRY_HISTORY_STORE": "postgres"}
    done = _registry(env, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "registry: history_store 'postgres' needs history_dsn (or CODEMODE_REGISTRY_HISTORY_DSN),"
        " e.g. postgresql://user@host:5432/codemode"
    ]


def test_an_unreadable_dsn_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="history_dsn is not a PostgreSQL connection string"):
        load_settings(history_store="postgres", history_dsn="host=127.0.0.1 nonsense")


def test_a_registry_process_serves_history_from_postgres(tmp_path: Path, pg_database: str) -> None:
    """The DSN from the environment (as a secret would be given); the history is in the
    database, not in a file."""
    env = {
        **service_env(tmp_path),
        "CODEMODE_REGISTRY_HISTORY_STORE": "postgres",
        "CODEMODE_REGISTRY_HISTORY_DSN": pg_database,
        "CODEMODE_REGISTRY_AGENTS": '[{"id": "a"}]',
    }
    script = (
        "import asyncio, sys\n"
        "from registry_service.config import load_settings\n"
        "from registry_service.registry import build_registry\n"
        "from registry_service.history.postgres.store import PostgresHistory\n"
        "from registry_service.domain.records import Record\n"
        "async def main():\n"
        "    registry = build_registry(load_settings())\n"
        "    assert isinstance(registry.history, PostgresHistory), registry.history\n"
        "    await registry.history.append(\n"
        "        Record('tool/call', 'agents/a', 'c1', 'c1', '', 't', agent_id='id-a'))\n"
        "    await registry.close()\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("*.sqlite3"))
    import psycopg

    with psycopg.connect(pg_database) as conn:
        rows = conn.execute("SELECT agent_id, seq, agent, call_id FROM history_records").fetchall()
    assert rows == [("id-a", 1, "agents/a", "c1")]
