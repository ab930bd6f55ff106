"""`codemode demo --cordis`: a code agent defines, runs, calls, updates (broken) and stops a
dynamic plugin on a real runtime's plugin host, and the steering record is printed."""

from __future__ import annotations

import os
import subprocess
import sys


def test_cordis_demo_prints_the_trajectory_and_the_steering_records() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "codemode_cli", "demo", "--cordis"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # 1: defined and activated; 2: a second program calls the plugin's tool.
    assert "log: defined clock-1/pkg-1" in out
    assert 'result: {"status":"running","pluginRunId":"run-1","currentPackageId":"pkg-1"}' in out
    assert "cordis-2:code:1    clock_now            ok" in out
    assert 'result: {"time":"12:00","zone":"cet"}' in out
    # 3: the plugin host dies; WatchHistory delivers one steering record.
    assert "WatchHistory delivered agent/steer from cordis-host-runner:" in out
    assert (
        "Cordis run clock-1/pkg-1 (run-1) failed after cordis_run returned running: "
        "plugin-host-lost"
    ) in out
    # 4: a broken update fails and keeps current.
    assert "cordis-4:code:3    cordis_run           error host-half-failed" in out
    assert "log: update failed: clock face missing" in out
    assert 'result: {"state":"failed","currentPackageId":"pkg-1","nextPackageId":"pkg-2"}' in out
    # 5-6: rollback, then stop removes the tool.
    assert '"pluginRunId":"run-4"' in out
    assert "cordis-6:code:3    clock_now            error UNKNOWN_TOOL" in out
    assert 'log: after stop: unknown tool "clock_now"' in out
    after = out.split("tools behind the SDK now: ", 1)[1].splitlines()[0]
    assert "clock_now" not in after and "cordis_run" in after
    assert "steering records in agents/cordis-agent's history: 1" in out
    # A second agent's client-bearing plugin, answered by a scripted page runner.
    page = out.split("agents/page-agent: a client-bearing plugin", 1)[1]
    assert '"status":"awaiting-approval","pluginId":"greet-2"' in page
    assert "approval required: True" in page
    assert 'page: host.call(\'greet\') -> {"greeting":"hello, console"}' in page
    assert "page: settled (accepted: True); request approved" in page
    assert "Cordis run greet-2/pkg-3 (run-5) completed successfully." in page
    assert "page: request rejected" in page
    assert "The user rejected Cordis update greet-2/pkg-4 (run-6)." in page
