"""codemode_common/process_env.py: which CODEMODE_* variables are unknown, the closest known
name, another service's prefix left to that service, and the log level's sources."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

from codemode_common import process_env
from registry_service.config import RegistrySettings
from runtime_service.config import RuntimeSettings

BOTH: dict[str, type[BaseModel]] = {
    "CODEMODE_REGISTRY_": RegistrySettings,
    "CODEMODE_RUNTIME_": RuntimeSettings,
}


def test_unknown_variables_name_the_closest_known_one() -> None:
    environ = {
        "CODEMODE_REGISTRY_HISTORY_PATH": "ok",
        "CODEMODE_RUNTIME_POOL_SIZE": "2",
        "CODEMODE_LOG_LEVEL": "info",
        "CODEMODE_REGISTRY_LISTN": "x",
        "CODEMODE_SOMETHING_ELSE_ENTIRELY": "x",
        "HOME": "/root",
    }
    assert process_env.unknown_variables(environ, BOTH) == [
        ("CODEMODE_REGISTRY_LISTN", "CODEMODE_REGISTRY_LISTEN"),
        ("CODEMODE_SOMETHING_ELSE_ENTIRELY", None),
    ]


def test_a_service_leaves_the_other_services_prefix_to_it() -> None:
    environ = {"CODEMODE_RUNTIME_POOL_SIZ": "2", "CODEMODE_REGISTRY_LISTN": "x"}
    only_registry: dict[str, type[BaseModel]] = {"CODEMODE_REGISTRY_": RegistrySettings}
    assert process_env.unknown_variables(environ, only_registry) == [
        ("CODEMODE_REGISTRY_LISTN", "CODEMODE_REGISTRY_LISTEN")
    ]


def test_the_log_level_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CODEMODE_LOG_LEVEL", raising=False)
    assert process_env.log_level() == logging.INFO
    assert process_env.log_level(default="warning") == logging.WARNING
    monkeypatch.setenv("CODEMODE_LOG_LEVEL", "ERROR")
    assert process_env.log_level() == logging.ERROR
    assert process_env.log_level("debug") == logging.DEBUG
    monkeypatch.setenv("CODEMODE_LOG_LEVEL", "chatty")
    with pytest.raises(ValueError, match="CODEMODE_LOG_LEVEL: expected one of debug, info"):
        process_env.log_level()
