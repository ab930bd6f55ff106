"""`codemode demo --model`: a model drives the demo agent through the client's model SDK
adapters. The scripted model works offline without a key; a real one needs its key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    return subprocess.run(
        [sys.executable, "-m", "codemode_cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**env, "PYTHONUNBUFFERED": "1"},
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
