"""`codemode demo --model`: a model drives the demo agent through the client's model SDK
adapters. The scripted model works offline without a key; a real one needs its key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from codemode_cli.demo import PROGRAMS
from codemode_cli.demo_model import DEFAULT_MODEL_NAMES, script
from codemode_cli.scripted_model import ScriptedModel

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The demo with no model key or base URL from this environment (plus `env`)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    return subprocess.run(
        [sys.executable, "-m", "codemode_cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**base, **(env or {}), "PYTHONUNBUFFERED": "1"},
        check=False,
    )


@pytest.mark.parametrize("language", ["python", "typescript"])
def test_the_scripted_model_runs_the_demo_program_through_run_code(language: str) -> None:
    done = _demo("--model", "scripted", "--language", language)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"agents/demo-agent (mode code, {language}) · model: scripted (demo)" in out
    assert "schemas the model sees: ['run_code']" in out
    assert "tool call run_code [call_" in out and "]: ok" in out
    assert "model answer (2 turns, answered):" in out
    answer = out.split("model answer", 1)[1]
    assert "The program reported:" in answer and '"total": 3' in answer  # it read the result
    assert "'tool/code-dispatch': 5" in out and "'tool/call': 1" in out
    assert "execute_tool read_file" in out  # the run's trace, under the model's call id


@pytest.mark.parametrize(("model", "key"), [("openai", KEYS[0]), ("anthropic", KEYS[1])])
def test_a_real_model_without_its_key_is_a_usage_error(model: str, key: str) -> None:
    done = _demo("--model", model)
    assert done.returncode == 2
    assert f"--model {model} needs {key}" in done.stderr
    cordis = _demo("--model", "scripted", "--cordis")
    assert cordis.returncode == 2 and "not --cordis" in cordis.stderr


@pytest.mark.parametrize(
    ("model", "env_prefix", "base"),
    [("openai", "OPENAI", "/v1"), ("anthropic", "ANTHROPIC", "")],
)
def test_the_real_model_paths_speak_the_vendor_apis(model: str, env_prefix: str, base: str) -> None:
    """`--model openai|anthropic` through the vendor SDK's own base-URL setting, answered by
    the scripted model under the default model name: the path a real key takes, offline."""
    name = DEFAULT_MODEL_NAMES[model]
    turns = script(PROGRAMS["python"])["demo"]
    with ScriptedModel({name: turns}) as server:
        env = {f"{env_prefix}_API_KEY": "test-key", f"{env_prefix}_BASE_URL": server.url + base}
        done = _demo("--model", model, env=env)
        bodies = server.recorded()
    assert done.returncode == 0, done.stderr
    assert f"model: {model} ({name})" in done.stdout
    assert '"total": 3' in done.stdout.split("model answer", 1)[1]
    first, second = bodies
    prompt = first["instructions"] if model == "openai" else first["system"]
    assert "tools.list_files" in prompt or "list_files" in prompt  # the agent's SDK prompt
    assert "3 files in the workspace" in json.dumps(second)  # the model got the result

    with ScriptedModel({"another-model": turns}) as server:
        env = {f"{env_prefix}_API_KEY": "test-key", f"{env_prefix}_BASE_URL": server.url + base}
        failed = _demo("--model", model, env=env)
    assert failed.returncode == 1
    assert f"codemode demo: the {model} model {name!r} failed: " in failed.stderr
    assert "no script for model" in failed.stderr
