"""The README's main job: `codemode demo` runs both services and a real program."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_prints_the_nested_trajectory_and_outer_result() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "schemas the model sees: ['run_code']" in out
    assert "a direct read_file call is refused: UNKNOWN_TOOL" in out
    assert "5 nested calls" in out
    assert "call-1:code:5" in out and "error ENOENT" in out
    assert '"total": 3' in out
    assert "'tool/code-dispatch': 5" in out


def test_help_lists_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "demo" in done.stdout
